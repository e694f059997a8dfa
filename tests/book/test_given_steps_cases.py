"""`serve --prefill-step-s/--decode-step-s`: applied-inference.md's disaggregation arithmetic.

The book (Serving LLaMA 3-70B): a prefill of P=8192 tokens in 0.91 s and a decode step of 19 ms
at B=32 give prefill:decode servers ≈ 3:1 for G=512; evictions are B·(P+G)/G tokens per step
(96 for P=8192, G=4096, B=32: 32/4096 sequences finish each step).
"""

from __future__ import annotations

import json
import math

import pytest

from roofline.cli import main
from roofline.errors import SpecError
from roofline.serving.given import GivenSteps, explain, size_deployment
from roofline.specs.model_catalog import load_model

KV70_INT8 = 2 * 8 * 128 * 80  # 2·K·H·L bytes: "160 kB" per token in the book


def _given(**kw) -> GivenSteps:
    base = dict(prefill_step_s=0.91, decode_step_s=0.019, decode_batch=32, prompt=8192, gen=512)
    return GivenSteps(**(base | {"kv_bytes_per_token": KV70_INT8} | kw))


def test_disaggregation_ratio_three_to_one():
    s = size_deployment(_given())
    assert s.prefill_rate == pytest.approx(1 / 0.91)
    assert s.decode_rate == pytest.approx(32 / (0.019 * 512))
    assert s.ratio == pytest.approx(32 * 0.91 / (0.019 * 512))
    assert round(s.ratio) == 3


def test_evictions_per_step_96_tokens():
    s = size_deployment(_given(gen=4096))
    assert s.evicted_tokens_per_step == pytest.approx(96)
    assert s.completions_per_step == pytest.approx(32 / 4096)
    assert s.to_dict()["evicted_kv_bytes_per_step"] == pytest.approx(96 * KV70_INT8)


def test_prefill_batch_divides_the_prefill_pool():
    one, four = size_deployment(_given()), size_deployment(_given(prefill_batch=4))
    assert four.ratio == pytest.approx(one.ratio / 4)


def test_sizing_under_an_arrival_rate_is_littles_law():
    s = size_deployment(_given(rate=10.0))
    assert s.prefill_replicas == math.ceil(10 * 0.91) == 10
    assert s.decode_replicas == math.ceil(10 * 512 * 0.019 / 32) == 4
    assert s.batch_in_flight == pytest.approx(10 * 512 * 0.019 / 4)
    assert s.prefill_utilisation == pytest.approx(0.91)
    # each step λ·T_d sequences finish; at the balanced rate that is B/G per decode replica
    assert s.rate_completions_per_step == pytest.approx(10 * 0.019)
    assert s.rate_evicted_tokens_per_step == pytest.approx(10 * 0.019 * (8192 + 512))
    full = size_deployment(_given(rate=4 * s.decode_rate))
    assert full.rate_completions_per_step / full.decode_replicas == pytest.approx(
        s.completions_per_step
    )


def test_kv_per_token_is_the_ledgers():
    from roofline.core.ledger import kv_cache_bytes_per_token

    assert kv_cache_bytes_per_token(load_model("llama-3-70b"), "int8") == KV70_INT8


def test_explain_shows_formula_numbers_result():
    text = "\n".join(explain(size_deployment(_given(rate=10.0))))
    assert "(B/(G·T_d)) / (b_p/T_p) = 3.289 / 1.099 = 2.993 : 1" in text
    assert "⌈λ·G·T_d/B⌉ = ⌈10·512·19 ms/32⌉ = 4" in text


@pytest.mark.parametrize("field", ["prefill_step_s", "decode_step_s", "decode_batch"])
def test_non_positive_inputs_are_refused(field):
    with pytest.raises(SpecError, match="positive"):
        _given(**{field: 0.0})


ARGS = [
    "serve",
    "--model",
    "llama-3-70b",
    "--system",
    "tpu-v5e:4x4",
    "--prompt",
    "8192",
    "--gen",
    "512",
    "--kv-dtype",
    "int8",
]


def test_cli_text_and_json(capsys):
    given = ["--prefill-step-s", "0.91s", "--decode-step-s", "19ms", "--batch", "32"]
    assert main([*ARGS, *given, "--rate", "10"]) == 0
    out = capsys.readouterr().out
    assert "prefill : decode replicas" in out and "at λ = 10 requests/s:" in out
    assert main([*ARGS, *given, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["given_steps"]
    assert doc["ratio"] == pytest.approx(32 * 0.91 / (0.019 * 512))
    assert doc["prefill_replicas"] is None
    # the hand-off crosses the modelled view's link: DCN per chip on a TPU slice, 16 chips
    assert doc["handoff_bytes"] == pytest.approx(8192 * KV70_INT8)


def test_cli_needs_both_times_and_a_batch(capsys):
    assert main([*ARGS, "--prefill-step-s", "0.91s", "--batch", "32"]) == 2
    assert "--decode-step-s" in capsys.readouterr().err


def test_cli_takes_the_load_as_a_rate(capsys):
    given = ["--prefill-step-s", "0.91s", "--decode-step-s", "19ms", "--batch", "32"]
    assert main([*ARGS, *given, "--concurrency", "64"]) == 2
    assert "--rate" in capsys.readouterr().err


def test_a_step_times_file_gives_the_same_answer_and_flags_override_it(tmp_path, capsys):
    f = tmp_path / "steps.toml"
    f.write_text('prefill_step_s = 0.91\ndecode_step_s = 0.019\nbatch = 32\nsource = "book"\n')
    assert main([*ARGS, "--steps", str(f), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["given_steps"]
    assert doc["ratio"] == pytest.approx(32 * 0.91 / (0.019 * 512))
    assert main([*ARGS, "--steps", str(f), "--batch", "64", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["given_steps"]
    assert doc["given"]["decode_batch"] == 64


@pytest.mark.parametrize(
    "text,words",
    [
        ("decode_step = 0.019\n", "unknown keys"),
        ('decode_step_s = "fast"\n', "is a number"),
        ("decode_step_s = \n", "not TOML"),
    ],
)
def test_a_bad_step_times_file_is_one_paragraph(tmp_path, capsys, text, words):
    f = tmp_path / "steps.toml"
    f.write_text(text)
    assert main([*ARGS, "--steps", str(f)]) == 2
    assert words in capsys.readouterr().err
