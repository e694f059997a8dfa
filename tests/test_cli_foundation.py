"""The CLI shell: every registered command has --help; op/model/models JSON; user errors exit 2
with one paragraph on stderr and no traceback; --plot writes an image."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from roofline.cli import COMMANDS, build_parser, main

REGISTERED = [c for c in COMMANDS if importlib.util.find_spec(f"roofline.cli.{c}_cmd") is not None]
OP = ["op", "bf16[B,D] @ int8[D,F]", "--dims", "B=256,D=8192,F=32768", "--chip", "tpu-v5e"]


def run_json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_my_commands_are_registered():
    assert {"op", "model", "models"} <= set(REGISTERED)


@pytest.mark.parametrize("name", REGISTERED)
def test_help_for_every_registered_command(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    assert "usage: roofline" in capsys.readouterr().out


def test_top_level_help(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in REGISTERED:
        assert name in out
    assert build_parser().prog == "roofline"


def test_op_json_keys_and_book_numbers(capsys):
    d = run_json(capsys, OP)
    for key in (
        "flops",
        "bytes",
        "intensity",
        "critical_intensity",
        "bound",
        "time_lower_s",
        "time_upper_s",
        "t_math_s",
        "t_mem_s",
        "compute_dtype",
        "critical_batch",
        "schema_version",
        "command",
        "inputs",
    ):
        assert key in d, key
    assert d["command"] == "op" and d["compute_dtype"] == "bf16"
    assert d["critical_batch"] == pytest.approx(120, rel=0.01)  # int8 weights, bf16 compute (book)
    assert d["flops"] == 2 * 256 * 8192 * 32768
    assert d["time_lower_s"] == max(d["t_math_s"], d["t_mem_s"])


@pytest.mark.parametrize(("B", "bound"), [(200, "memory"), (300, "compute")])
def test_op_bound_flips_between_200_and_300_on_v5e(capsys, B, bound):
    d = run_json(
        capsys, ["op", "bf16[B,D] @ bf16[D,F]", "--dims", f"B={B},D=8192,F=8192", "--chip", "v5e"]
    )
    assert d["bound"] == bound
    assert d["critical_batch"] == pytest.approx(240, rel=0.01)


def test_op_human_output_shows_the_arithmetic(capsys):
    assert main(OP) == 0
    out = capsys.readouterr().out
    assert "T_math" in out and "2·B·D·F / 1.97e+14" in out
    assert "2·B·D + 1·D·F + 2·B·F" in out
    assert "critical batch" in out and "compute" in out


def test_op_non_matmul_shape_has_no_critical_batch(capsys):
    d = run_json(capsys, ["op", "int8[B,D] @ int8[B,D,F] -> int8[B,F]", "--dims", "B=8,D=64,F=64"])
    assert d["critical_batch"] is None and d["bound"] == "memory"


def test_model_json_keys(capsys):
    d = run_json(capsys, ["model", "llama-3-70b"])
    for key in (
        "params",
        "active_params",
        "params_breakdown",
        "train_flops_per_token",
        "forward_flops_per_token",
        "kv_cache_bytes_per_token",
        "ledger",
        "model",
    ):
        assert key in d, key
    assert d["params"] == pytest.approx(70.55e9, rel=1e-3)
    assert d["kv_cache_bytes_per_token"] == 2 * 80 * 8 * 128 * 2
    assert d["model"]["name"] == "llama-3-70b"
    assert {r["name"] for r in d["ledger"]} >= {"attn/q", "mlp/up", "unembed"}
    assert sum(r["params_share"] for r in d["ledger"]) == pytest.approx(1)
    assert d["train_flops_per_token"] == pytest.approx(3 * d["forward_flops_per_token"])


def test_model_per_token_flops_match_library(capsys):
    from roofline.core.ledger import flops_per_token
    from roofline.specs.model_catalog import load_model

    d = run_json(
        capsys, ["model", "llama-3-8b", "--seq", "2048", "--batch", "4", "--causal", "full"]
    )
    m = load_model("llama-3-8b")
    assert d["train_flops_per_token"] == pytest.approx(
        flops_per_token(m, 2048, causal="full"), rel=1e-12
    )
    assert d["forward_flops_per_token"] == pytest.approx(
        flops_per_token(m, 2048, training=False, causal="full"), rel=1e-12
    )


def test_model_with_chip_prices_rows(capsys):
    d = run_json(
        capsys,
        [
            "model",
            "tiny-llama",
            "--chip",
            "tpu-v5e",
            "--seq",
            "128",
            "--batch",
            "8",
            "--kv-dtype",
            "int8",
        ],
    )
    rf = d["roofline"]
    assert rf["chip"] == "tpu-v5e" and len(rf["rows"]) == len(d["ledger"])
    assert {r["bound"] for r in rf["rows"]} <= {"memory", "compute"}
    assert rf["time_lower_s"] == pytest.approx(sum(r["time_lower_s"] for r in rf["rows"]))
    assert d["kv_cache_bytes_per_token"] == pytest.approx(
        d["model"]["n_layers"] * 2 * d["model"]["n_kv_heads"] * d["model"]["d_head"] * 1
    )


def test_model_human_output(capsys):
    assert main(["model", "llama-3-70b", "--chip", "v5e"]) == 0
    out = capsys.readouterr().out
    for text in (
        "% params",
        "% FLOPs",
        "6·N",
        "2·L·K·H·bytes = 2·80·8·128·2",
        "roofline on tpu-v5e",
        "T_lower",
    ):
        assert text in out, text


def test_model_from_config_json(tmp_path, capsys):
    cfg = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    d = run_json(capsys, ["model", str(path), "--seq", "64"])
    assert d["model"]["d_model"] == 256 and d["params"] > 0


def test_models_table_and_json(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "llama-3-70b" in out and "MoE" in out and "attention" in out
    d = run_json(capsys, ["models"])
    names = {m["name"]: m for m in d["models"]}
    assert names["llama-3-70b"]["params"] == pytest.approx(70.55e9, rel=1e-3)
    for m in d["models"]:
        assert m["active_params"] <= m["params"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["op", "bf16[B,D] @ bf16[D,F]", "--dims", "B=1,D=1,F=1", "--chip", "tpu-v99"],
            "unknown chip",
        ),
        (["model", "llama-9-1t"], "unknown model"),
        (["op", "bf17[B,D] @ bf16[D,F]", "--dims", "B=1,D=1,F=1"], "unknown dtype"),
        (["model", "llama-3-70b", "--kv-dtype", "int3"], "unknown dtype"),
        (["op", "bf16[B,D] @ bf16[D,F]", "--dims", "B=0,D=1,F=1"], "positive"),
        (["op", "bf16[B,D] @ bf16[D,F]", "--dims", "B=1,D=1"], "dim 'F'"),
        (["model", "llama-3-70b", "--seq", "0"], "positive"),
        (["model", "llama-3-70b", "--plot", "x.png"], "--plot needs --chip"),
    ],
)
def test_user_errors_exit_2_with_one_paragraph(capsys, argv, needle):
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    err = cap.err.strip()
    assert needle in err
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(f"roofline {argv[0]}: error:")


@pytest.mark.parametrize(
    "argv",
    [
        ["op", "bf16[B,D] @ bf16[D,F]", "--dims", "B=1,D=1,F=1", "--chip", "no-such-chip"],
        ["model", "no-such-model"],
        ["op", "bf99[B,D] @ bf16[D,F]", "--dims", "B=1,D=1,F=1"],
    ],
)
def test_user_errors_in_a_real_process_have_no_traceback(argv):
    p = subprocess.run(
        [sys.executable, "-m", "roofline", *argv], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2
    assert "Traceback" not in p.stdout + p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_op_plot_writes_png(tmp_path, capsys):
    out = tmp_path / "out.png"
    assert main([*OP, "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 1000
    assert str(out) in capsys.readouterr().out


def test_model_plot_writes_svg(tmp_path, capsys):
    out = tmp_path / "model.svg"
    d = run_json(capsys, ["model", "tiny-llama", "--chip", "h100", "--plot", str(out)])
    assert d["plot"] == str(out) and out.stat().st_size > 1000
