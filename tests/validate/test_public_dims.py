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


def test_routing_groups_come_from_the_public_config_when_the_entry_lacks_them():
    """DeepSeek-V3 entries transcribe dims but not its device-limited routing (n_group 8,
    topk_group 4): the model gets them from public_dims.toml, cited; an entry's own win."""
    moe = {"experts": 256, "top_k": 8, "moe_d_ff": 2048, "shared_experts": 1}
    entry = {"name": "DeepSeek-V3", "layers": 61, "d_model": 7168, "heads": 128, "vocab": 129280}
    built = build_model({**entry, "moe": moe}, "x")
    assert (built.spec.moe.n_groups, built.spec.moe.topk_groups) == (8, 4)
    assert any("routing groups" in d and "config.json" in d for d in built.defaults)
    own = build_model({**entry, "moe": {**moe, "routing_groups": 1, "topk_routing_groups": 1}}, "x")
    assert (own.spec.moe.n_groups, own.spec.moe.topk_groups) == (1, 1)
    other = build_model({**entry, "name": "Some-MoE", "moe": moe}, "x")
    assert (other.spec.moe.n_groups, other.spec.moe.topk_groups) == (1, 1)


def test_public_config_fills_heads_and_ffn_an_entry_leaves_out():
    """Issue 19 item 6: the DGX Cloud Nemotron-4 340B rows give layers, d_model and vocab but
    not heads, query groups or d_ff; they were guessed (144 MHA heads: 0.93e9 more parameters
    per chip at tp=8,pp=8 than the recipe's 96 heads with 8 query groups). The recipe's own
    config fills them, cited; an entry without any of the three keeps its guesses' route."""
    entry = {"name": "Nemotron-4 340B", "layers": 96, "d_model": 18432, "vocab": 256000}
    built = build_model(entry, "x")
    s = built.spec
    assert (s.n_heads, s.n_kv_heads, s.d_ff) == (96, 8, 73728)
    assert any("nemotron4-340b-synth.yaml" in d for d in built.defaults)
    own = build_model({**entry, "heads": 144, "kv_heads": 144, "d_ff": 4 * 18432}, "x")
    assert own.spec.n_kv_heads == 144 and not any("public config" in d for d in own.defaults)
