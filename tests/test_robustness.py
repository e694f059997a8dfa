"""Issue 12's reproducers in the specs/units/JSON/foundation-CLI area, one regression test each:
bad input gives one paragraph (the input, the rule, a fix) and exit 2, never a traceback, a
hang or a non-finite number. The fuzz tier (tests/fuzz) generalises these."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

import roofline as rl
from roofline.cli import main
from roofline.errors import RooflineError, SpecError
from roofline.report.jsonout import dumps, to_jsonable
from roofline.specs.catalog import read_toml
from roofline.specs.efficiency import load_efficiency

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
from fuzz_harness import run_cli  # noqa: E402

BASE = (
    'name = "m"\nn_layers = 32\nd_model = 4096\nd_ff = 14336\nn_heads = 32\nn_kv_heads = 8\n'
    "vocab = 128256\n"
)


def one_paragraph(argv: list[str], *needles: str) -> str:
    """Run argv in-process (10 s hang guard); it must refuse with one paragraph and exit 2."""
    out = run_cli(argv, timeout_s=10.0)
    assert not out.crash and not out.timed_out, out.crash or "hang"
    assert out.rc == 2, (out.rc, out.out[-300:])
    err = out.err.strip()
    assert "\n" not in err and "Traceback" not in err and "Rule:" in err, err
    for n in needles:
        assert n in err, (n, err)
    return err


def _toml(tmp_path: Path, text: str, name: str = "m.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _with(base: str, extra: str) -> str:
    """BASE with the keys of `extra` replaced (top-level lines), then extra's tables appended."""
    top = [ln for ln in extra.splitlines() if "=" in ln and not ln.startswith("[")]
    keys = {ln.split("=")[0].strip() for ln in top if not extra.lstrip().startswith("[")}
    kept = [ln for ln in base.splitlines() if ln.split("=")[0].strip() not in keys]
    return "\n".join(kept) + "\n" + extra + "\n"


# -- files ------------------------------------------------------------------------------------


def test_utf16_model_toml(tmp_path):
    p = tmp_path / "m.toml"
    p.write_bytes(b"\xff\xfe")
    one_paragraph(["model", str(p)], "not UTF-8")
    p.write_bytes("name = 'm'".encode("utf-16"))
    one_paragraph(["model", str(p)], "UTF-8")


def test_efficiency_directory_is_one_paragraph(tmp_path):
    with pytest.raises(SpecError, match="is a directory"):
        load_efficiency(str(tmp_path))
    with pytest.raises(SpecError, match="is a directory"):
        read_toml(tmp_path, "efficiency profile")
    one_paragraph(["train", "--model", "tiny-llama", "--system", "h100:8", "--efficiency", "."])


@pytest.mark.parametrize("cmd", ["chip", "model", "system"])
def test_over_long_names(cmd):
    one_paragraph([cmd, "x" * 300], "too long")
    one_paragraph([cmd, "x" * 300 + ".toml"])  # ENAMETOOLONG as a path


def test_devices_and_directories_are_not_spec_files(tmp_path):
    one_paragraph(["model", "/dev/null"])
    one_paragraph(["model", str(tmp_path)], "directory")
    one_paragraph(["chip", str(tmp_path) + "/"])


@pytest.mark.parametrize(
    "content",
    ['{"model_type": []}', '{"model_type": {"a": 1}}', "[1, 2]", "{", "null", "[" * 100_000],
)
def test_bad_hf_json(tmp_path, content):
    one_paragraph(["model", _toml(tmp_path, content, "c.json")])


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("n_heads = 0", "n_heads"),
        ('d_model = "4096"', "d_model"),
        ("aliases = 1", "aliases"),
        ("moe = 5", "moe"),
        ('[moe]\nn_experts = 8\ntop_k = "2"\nd_ff_expert = 1024', "top_k"),
        ('sliding_window = "4096"', "sliding_window"),
        ("mla = 5", "mla"),
        ('norms_per_layer = "2"', "norms_per_layer"),
        ("[moe]\nn_experts = 8\ntop_k = 2\nd_ff_expert = []", "d_ff_expert"),
        ('[moe]\nn_experts = 8\ntop_k = 2\nd_ff_expert = 1024\nn_shared_experts = "plain"', "n_shared_experts"),
        ("[moe]\nn_experts = 8.0\ntop_k = 2\nd_ff_expert = 1024", "n_experts"),
        ("n_layers = 1000000000000", "n_layers"),
        ("n_heads = 1000000000000", "n_heads"),
        ("n_kv_heads = 7", "n_kv_heads"),
        ("vocab = -1", "vocab"),
        ("max_seq_len = 0", "max_seq_len"),
        ("tied_embeddings = 1", "tied_embeddings"),
        ('mlp = "swiglu"', "mlp"),
        ("[mla]\nkv_lora_rank = 512", "[mla] lacks 'qk_nope_head_dim'"),
        ("[moe]\nn_experts = 8\ntop_k = 9\nd_ff_expert = 1024", "top_k"),
        ("[moe]\nn_experts = 8\ntop_k = 2\nd_ff_expert = 1024\nbogus = 1", "bogus"),
    ],
)  # fmt: skip
def test_model_toml_values_are_checked_before_arithmetic(tmp_path, extra, needle):
    err = one_paragraph(["model", _toml(tmp_path, _with(BASE, extra))], needle)
    assert "m.toml" in err  # names the file


def test_model_toml_sizes_at_the_bound_still_work(tmp_path):
    # 10,000 layers is the bound: accepted, and counted without per-layer loops hanging
    out = run_cli(["model", _toml(tmp_path, _with(BASE, "n_layers = 10000")), "--json"], 10.0)
    assert out.rc == 0 and not out.problems()
    assert json.loads(out.out)["params"] > 1e12


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_hidden_layers", 10**12), ("num_attention_heads", 10**12), ("hidden_size", 10**15),
     ("vocab_size", 10**12), ("num_key_value_heads", 10**9), ("intermediate_size", 2**62)],
)  # fmt: skip
def test_huge_hf_sizes_are_refused_quickly(tmp_path, field, value):
    d = json.loads((Path(__file__).parent / "data" / "hf" / "llama-3-8b.json").read_text())
    d[field] = value
    one_paragraph(["model", _toml(tmp_path, json.dumps(d), "c.json")], field)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('name = "s"\nchip = "h100"\n[[dims]]\nname = "nvlink"\nkind = "nvlink"\nsize = 8\nbw_bytes_per_s = "fast"\n', "bw_bytes_per_s"),
        ('name = "s"\nchip = "h100"\n[[dims]]\nname = "nvlink"\nkind = "nvlink"\nsize = nan\nbw_bytes_per_s = 4e11\n', "size"),
        ('name = "s"\nbase = "h100:8"\nusd_per_chip_hour = "x"\n', "usd_per_chip_hour"),
        ('name = "s"\nbase = "h100:8"\nsharp = "yes"\n', "sharp"),
        ('name = "s"\nbase = "h100:1024"\n[tier_bw]\nspine = -1\n', "spine"),
        ('name = "s"\nbase = 5\n', "base"),
        ('name = "s"\nchip = "h100"\ndims = 3\n', "dims"),
    ],
)  # fmt: skip
def test_system_toml_values(tmp_path, text, needle):
    one_paragraph(["system", _toml(tmp_path, text, "s.toml")], needle)


@pytest.mark.parametrize(
    "line",
    ["aliases = 1.5", "aliases = [1, 2]", "pod_topology = 3", 'sm_count = "many"', "sm_count = 1.5",
     "gpus_per_tray = 0", "usd_per_hour = inf", 'name = 5'],
)  # fmt: skip
def test_chip_toml_values(tmp_path, line):
    text = (
        'name = "c"\nvendor = "nvidia"\ngeneration = "g"\nhbm_bytes = 8e10\n'
        "hbm_bw_bytes_per_s = 3e12\n"
    )
    key = line.split("=")[0].strip()
    text = "\n".join(ln for ln in text.splitlines() if not ln.startswith(key + " ")) + "\n"
    text += line + "\n[peak_flops_per_s]\nbf16 = 1e15\n"
    one_paragraph(["chip", _toml(tmp_path, text, "c.toml")], key)


# -- flags ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["model", "llama-3-8b", "--seq", "1e308"],
        ["model", "llama-3-8b", "--batch", "1e30"],
        ["model", "llama-3-8b", "--kv-seq", "inf"],
        ["model", "llama-3-8b", "--seq", "nan"],
        ["model", "llama-3-8b", "--batch", "1e7", "--seq", "1e6"],
        ["system", "h100:1e30"],
        ["system", "h100:8", "--price", "nan"],
        ["system", "h100:8", "--price", "-1"],
        ["system", "tpu-v5e:" + "9" * 5000],
        ["system", "9" * 5000 + "xtpu-v5e:4x4"],
        ["op", "bf16[B,D] @ bf16[D,F]", "--dims", "B=1e308,D=8,F=8"],
        ["collective", "AG", "--array", "bf16[2,1e308]", "--over", "X", "--system", "h100:1"],
        ["collective", "AG", "--bytes", "-5", "--over", "X", "--system", "h100:8"],
        [
            "collective",
            "A2A",
            "--bytes",
            "1M",
            "--over",
            "X",
            "--system",
            "h100:8",
            "--ragged",
            "nan",
        ],
        ["train", "--model", "tiny-llama", "--system", "h100:8", "--chips", "1e30"],
    ],
)
def test_numeric_flags_are_bounded(argv):
    one_paragraph(argv)


def test_a_huge_chip_range_is_clipped_not_searched():
    """--chips 1-1e9 on one node (which stands for the chip type) searches the node·2^k counts
    up to the planner's named cap (planner.systems.SubsetSearch.max_gpus_in_range), quickly."""
    from roofline.training.planner.systems import DEFAULT_SEARCH

    out = run_cli(
        ["train", "--model", "tiny-llama", "--system", "h100:8", "--chips", "1-1e9"], 30.0
    )
    assert out.rc == 0 and not out.crash and not out.timed_out and not out.problems()
    searched = out.out.split("chip counts searched (--chips): ")[1].split(";")[0]
    assert max(int(n) for n in searched.split(", ")) == DEFAULT_SEARCH.max_gpus_in_range


def test_model_seq_is_finite_at_the_bound():
    out = run_cli(["model", "tiny-llama", "--seq", str(2**30), "--json"], 10.0)
    assert out.rc == 0 and not out.problems()
    doc = json.loads(out.out)
    assert math.isfinite(doc["train_flops_per_token"]) and doc["totals"]["train_over_six_n"] > 1


# -- JSON -------------------------------------------------------------------------------------


def test_json_non_finite_numbers_are_null_with_a_reason():
    doc = json.loads(
        dumps("x", {}, {"a_s": float("inf"), "b": [1.0, float("nan")], "c": {"d": -math.inf}})
    )
    assert doc["a_s"] is None and "infinite" in doc["a_s_reason"]
    assert doc["b"] == [1.0, None] and "entries [1]" in doc["b_reason"]
    assert doc["c"]["d"] is None and doc["c"]["d_reason"]
    assert doc["schema_version"] == "1.1"
    # a reason the command gives wins over the generic one
    assert to_jsonable({"p": math.inf, "p_reason": "no price"}) == {
        "p": None,
        "p_reason": "no price",
    }


def test_json_never_writes_a_string_in_a_numeric_field():
    import numpy as np

    text = dumps("x", {}, {"v": np.float64("inf"), "w": np.array([1.0, np.inf]), "n": np.int64(3)})
    assert "inf" not in text.replace("infinite", "") and "NaN" not in text
    assert json.loads(text)["n"] == 3


def test_chips_json_unknown_price_and_missing_bf16_have_reasons(capsys):
    assert main(["chips", "--json"]) == 0
    by = {c["name"]: c for c in json.loads(capsys.readouterr().out)["chips"]}
    assert by["gb200"]["usd_per_hour"] is None and by["gb200"]["usd_per_hour_reason"]
    v = by["v100"]
    assert v["bf16_flops_per_s"] is None and "no bf16" in v["bf16_flops_per_s_reason"]
    assert v["default_dtype"] == "fp16" and v["default_dtype_flops_per_s"] == 1.25e14
    assert by["h100"]["bf16_flops_per_s"] == 9.89e14 and "bf16_flops_per_s_reason" not in by["h100"]


def test_collective_group_of_one_has_no_infinite_bandwidth(capsys):
    argv = ["collective", "AG", "--bytes", "1k", "--over", "X", "--system", "h100:1"]
    assert main(argv) == 0 and "inf" not in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (
        doc["algo_bw_bytes_per_s"] is None
        and "no communication" in doc["algo_bw_bytes_per_s_reason"]
    )


def test_v100_bf16_op_is_a_clear_error_and_fp16_works(capsys):
    one_paragraph(
        ["op", "bf16[B,D] @ bf16[D,F]", "--dims", "B=8,D=8,F=8", "--chip", "v100"], "fp16"
    )
    assert main(["op", "fp16[B,D] @ fp16[D,F]", "--dims", "B=8,D=8,F=8", "--chip", "v100"]) == 0
    assert "v100: 1.25e+14 FLOP/s (fp16)" in capsys.readouterr().out


# -- Python API -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: rl.parse_einsum(None),
        lambda: rl.parse_system("h100:8", tier_bw={"nvlink": "x"}),
        lambda: rl.parse_system("h100:8", tier_bw=5),
        lambda: rl.parse_system("h100:8", sharp="yes"),
        lambda: rl.parse_system("h100:8", usd_per_chip_hour="cheap"),
        lambda: rl.parse_system(None),
        lambda: rl.load_model("x" * 5000),
        lambda: rl.load_model(3),
        lambda: rl.load_chip(None),
        lambda: rl.load_chip("x" * 5000),
        lambda: rl.load_chip("h100").peak(None),
        lambda: rl.ModelSpec("m", 2, 64, 128, 4, 4, 16, "1000"),
        lambda: rl.ModelSpec("m", 2, 64, 128, 0, 4, 16, 1000),
    ],
)
def test_python_api_raises_typed_errors(call):
    with pytest.raises(RooflineError) as e:
        call()
    assert "Rule:" in str(e.value)


# -- usability --------------------------------------------------------------------------------


def test_model_inputs_say_preset_or_file(capsys):
    assert main(["model", "llama-3-8b", "--json"]) == 0
    inputs = json.loads(capsys.readouterr().out)["inputs"]
    assert inputs["model_source"] == "preset" and inputs["model_file"] is None
    path = str(Path(__file__).parent / "data" / "hf" / "llama-3-8b.json")
    assert main(["model", path, "--json"]) == 0
    inputs = json.loads(capsys.readouterr().out)["inputs"]
    assert inputs["model_source"] == "file" and inputs["model_file"] == path


def test_model_states_mtp_exclusion_and_active_convention(capsys):
    assert main(["model", "deepseek-v3"]) == 0
    text = capsys.readouterr().out
    assert "MTP" in text and "685B" in text and "embedding" in text
    assert main(["model", "deepseek-v3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mtp_modules"] == 1 and "685B" in doc["mtp_note"]
    # one MTP module ~ one MoE layer + a [2D, D] projection; HF's 685B = 671B + ~14B
    assert 10e9 < doc["mtp_params_excluded"] < 14e9
    assert doc["active_params"] - doc["active_params_without_embedding"] == 129280 * 7168
    assert "embedding" in doc["active_params_convention"]
