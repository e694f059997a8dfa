"""Runs that name a public model without its dims take them from public_dims.toml, cited."""

from __future__ import annotations

from roofline.validate.dims import build_model, public_dims


def test_a_named_public_model_gets_its_cited_dims():
    built = build_model({"name": "GPT3-5B", "seq_len": 2048}, "x")
    assert built.spec is not None
    assert (built.spec.n_layers, built.spec.d_model, built.spec.d_ff, built.spec.vocab) == (
        24,
        4096,
        16384,
        50304,
    )
    assert any("gpt3/5b.yaml" in d for d in built.defaults)


def test_the_entrys_own_fields_win():
    built = build_model({"name": "Nemotron-8B", "layers": 16}, "x")
    assert built.spec is not None and built.spec.n_layers == 16 and built.spec.vocab == 256000


def test_unknown_models_are_still_skipped_with_the_reason():
    assert public_dims("GPT 530B") is None
    built = build_model({"name": "GPT 530B"}, "x")
    assert built.spec is None and "not published" in built.reason


def test_the_public_runs_cover_71_of_78(training_report):
    covered = sum(r.covered for r in training_report.results)
    assert covered >= 71
