"""Single-chip roofline (roofline.py), op expressions (opexpr.py) and the roofline chart (plots.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roofline.core.ledger import OpKind, build_ledger
from roofline.core.opexpr import (
    bytes_formula,
    flops_formula,
    matmul_shape,
    parse_dims,
    parse_expr,
    parse_op,
)
from roofline.core.roofline import (
    Bound,
    analyze,
    analyze_ledger,
    analyze_op,
    compute_dtype,
    critical_batch,
    matmul_crossover_batch,
)
from roofline.errors import SpecError
from roofline.specs.chip import load_chip
from roofline.specs.model_catalog import load_model


@pytest.fixture(scope="module")
def v5e():
    return load_chip("tpu-v5e")


# ---- roofline.py ---------------------------------------------------------------------------


def test_bf16_matmul_d8192_memory_bound_at_200_compute_bound_at_300(v5e):
    for B, bound in ((200, Bound.MEMORY), (300, Bound.COMPUTE)):
        op = parse_op("bf16[B,D] @ bf16[D,F]", {"B": B, "D": 8192, "F": 8192})
        assert analyze_op(op, v5e).bound == bound
    cross = matmul_crossover_batch(v5e, 8192, 8192)
    assert 200 < cross < 300
    r = analyze_op(parse_op("bf16[B,D] @ bf16[D,F]", {"B": cross, "D": 8192, "F": 8192}), v5e)
    assert r.t_math_s == pytest.approx(r.t_mem_s, rel=1e-12)


def test_critical_batch_mixed_precision(v5e):
    assert critical_batch(v5e) == pytest.approx(240, rel=0.01)
    assert critical_batch(v5e, "int8", "bf16") == pytest.approx(
        120, rel=0.01
    )  # int8 weights, bf16 compute
    assert critical_batch(v5e, "int8", "int8") == pytest.approx(
        240, rel=0.01
    )  # int8 × int8 at the int8 rate
    assert critical_batch(v5e, "int4", "bf16") == pytest.approx(60, rel=0.01)


def test_compute_dtype_is_the_widest_input():
    assert compute_dtype(["bf16", "int8"]) == "bf16"
    assert compute_dtype(["int8", "int8"]) == "int8"
    assert compute_dtype(["fp32", "bf16"]) == "fp32"
    assert compute_dtype(["bfloat16"]) == "bf16"


def test_analyze_numbers_and_times(v5e):
    r = analyze(2e12, 1e9, v5e)
    assert r.intensity == 2000
    assert r.t_math_s == pytest.approx(2e12 / 1.97e14)
    assert r.t_mem_s == pytest.approx(1e9 / 8.2e11)
    assert r.bound == Bound.COMPUTE
    assert r.achieved_flops_per_s == pytest.approx(1.97e14)
    d = r.to_dict()
    assert {
        "flops",
        "bytes",
        "intensity",
        "critical_intensity",
        "bound",
        "time_lower_s",
        "time_upper_s",
    } <= set(d)
    assert analyze(1.0, 0.0, v5e).intensity == math.inf


def test_analyze_accepts_numpy_arrays(v5e):
    B = np.array([64.0, 128.0, 1024.0])
    D = F = 8192.0
    r = analyze(2 * B * D * F, 2 * (B * D + D * F + B * F), v5e)
    assert r.time_lower_s.shape == (3,)
    assert np.all(r.time_lower_s == np.maximum(r.t_math_s, r.t_mem_s))
    assert np.allclose(r.intensity, B * D * F / (B * D + D * F + B * F))


def test_analyze_ledger_covers_every_row(v5e):
    led = build_ledger(load_model("llama-3-70b"), batch=1, seq=2048)
    priced = analyze_ledger(led, v5e)
    assert [op.name for op, _ in priced] == [op.name for op in led]
    assert all(r.bound == Bound.MEMORY for op, r in priced if op.kind == OpKind.ELEMENTWISE)
    assert all(
        r.bound == Bound.COMPUTE
        for op, r in priced
        if op.name.startswith("mlp/") and op.kind == OpKind.MATMUL
    )


def test_unknown_compute_dtype_peak_is_a_spec_error(v5e):
    with pytest.raises(SpecError, match="no fp32 peak"):
        analyze(1.0, 1.0, v5e, "fp32")


@settings(max_examples=100, deadline=None)
@given(
    D=st.integers(min_value=256, max_value=1 << 16),
    F=st.integers(min_value=256, max_value=1 << 16),
    w=st.sampled_from(["bf16", "int8", "fp8", "int4"]),
)
def test_crossover_batch_balances_math_and_memory(D: int, F: int, w: str) -> None:
    chip = load_chip("tpu-v5e")
    b = matmul_crossover_batch(chip, D, F, w, "bf16")
    if math.isinf(b):
        return
    assert b >= critical_batch(chip, w, "bf16") * (1 - 1e-9)  # activation bytes only push it up
    r = analyze_op(parse_op(f"bf16[B,D] @ {w}[D,F]", {"B": b, "D": D, "F": F}), chip)
    assert r.t_math_s == pytest.approx(r.t_mem_s, rel=1e-9)


# ---- opexpr.py -----------------------------------------------------------------------------


def test_parse_matmul_defaults():
    op = parse_op("bf16[B,D] @ int8[D,F]", "B=256,D=8192,F=32768")
    x, w = op.inputs
    assert op.kind == OpKind.MATMUL and op.contracting == ("D",)
    assert (x.dims, x.dtype, x.is_param) == (("B", "D"), "bf16", False)
    assert (w.dims, w.dtype, w.is_param) == (("D", "F"), "int8", True)
    assert (op.out.dims, op.out.dtype) == (("B", "F"), "bf16")  # output in the activation dtype
    assert op.flops == 2 * 256 * 8192 * 32768
    assert op.bytes == 2 * 256 * 8192 + 8192 * 32768 + 2 * 256 * 32768
    assert op.params == 8192 * 32768
    assert flops_formula(op) == ("2·B·D·F", "2·256·8192·32768")
    assert bytes_formula(op)[0] == "2·B·D + 1·D·F + 2·B·F"


def test_parse_einsum_with_more_dims():
    op = parse_op("bf16[B,T,D] @ bf16[D,N,H]", {"B": 2, "T": 3, "D": 4, "N": 5, "H": 6})
    assert op.out.dims == ("B", "T", "N", "H") and op.contracting == ("D",)
    assert op.flops == 2 * 2 * 3 * 4 * 5 * 6
    s = matmul_shape(op)
    assert (s.tokens, s.contract, s.features) == (6, 4, 30)


def test_parse_explicit_output_and_names():
    op = parse_op("X:int8[B,D] @ Y:int8[B,D,F] -> Z:fp32[B,F]", {"B": 2, "D": 3, "F": 4})
    assert [t.name for t in op.inputs] == ["X", "Y"] and op.out.dtype == "fp32"
    assert op.contracting == ("D",)
    assert op.flops == 2 * 2 * 3 * 4
    assert matmul_shape(op) is None  # per-example weights: no critical batch (book: intensity ≈ 2)
    big = parse_op("int8[B,D] @ int8[B,D,F] -> int8[B,F]", {"B": 512, "D": 4096, "F": 4096})
    assert big.intensity == pytest.approx(2, rel=0.01)


def test_dot_product_book_example():
    # book roofline.md: bf16[N]·bf16[N] -> 2N FLOPs (2N-1 exactly), 4N+2 bytes, intensity -> 1/2
    op = parse_op("bf16[N] @ bf16[N]", {"N": 1e6})
    assert op.out.dims == ()
    assert op.bytes == 4e6 + 2
    assert op.intensity == pytest.approx(0.5, rel=1e-5)


@pytest.mark.parametrize("op_sym", ["@", "·", "*", "×"])
def test_operator_spellings(op_sym):
    assert parse_expr(f"bf16[B,D] {op_sym} bf16[D,F]").contracting == ("D",)


def test_arrow_spellings():
    assert parse_expr("bf16[B,D] @ bf16[D,F] → fp32[B,F]").out.dtype == "fp32"


@pytest.mark.parametrize(
    ("expr", "dims", "match"),
    [
        ("bf16[B,D] @ int9[D,F]", "B=1,D=1,F=1", "unknown dtype 'int9'"),
        ("bf16[B,D] @ int8[D,F]", "B=1,D=1", "dim 'F' .* has no size"),
        ("bf16[B,D] @ int8[D,F]", {"B": 0, "D": 1, "F": 1}, "dim B = 0"),
        ("bf16[B,D] @ int8[D,F]", {"B": -3, "D": 1, "F": 1}, "dim B = -3"),
        ("bf16[B,D] @ int8[D,F]", {"B": math.inf, "D": 1, "F": 1}, "dim B = inf"),
        ("bf16[B,D] @ int8[E,F]", "B=1,D=1,E=1,F=1", "share no dim"),
        ("bf16[B,D] int8[D,F]", "", "expected '@'"),
        ("bf16[B,D @ int8[D,F]", "", "expected ',' or ']'"),
        ("bf16[B,D] @ int8[D,F] junk", "", "unexpected"),
        ("", "", "cannot read op expression"),
        ("bf16[B,4096] @ bf16[4096,F]", "", "number as a dim name"),
        ("bf16[B,B] @ bf16[B,F]", "", "appears twice"),
        ("bf16[B,D] @ bf16[D,F] -> bf16[B,Q]", "", "in neither operand"),
        ("bf16[B,D] @ bf16[D,F] -> bf16[B,D,F]", "", "contracts no dim"),
        ("bf16[B,D,E] @ bf16[D,F] -> bf16[B,F]", "", "neither shared nor in the output"),
        ("bf16[B,D] @ bf16[D,F]", "B=1,D=1,F=1,G=2", "not a dim"),
        ("bf16[B,D] @ bf16[D,F]", "B=1,d=1,F=1", "did you mean d"),
    ],
)
def test_parse_errors_are_one_paragraph(expr, dims, match):
    with pytest.raises(SpecError, match=match) as e:
        parse_op(expr, dims)
    msg = str(e.value)
    assert "Rule:" in msg and "Fix:" in msg and "\n" not in msg


def test_parse_dims_suffixes():
    assert parse_dims("B=4k, D=8192,F=32Ki") == {"B": 4000.0, "D": 8192.0, "F": 32768.0}
    with pytest.raises(SpecError):
        parse_dims("B256")


# ---- plots.py ------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["png", "svg"])
def test_roofline_chart_writes_file(tmp_path, v5e, ext):
    from roofline.report.plots import roofline_chart

    led = build_ledger(load_model("tiny-llama"), batch=4, seq=256)
    pts = analyze_ledger(led, v5e)
    pts.append(
        (
            "int8 mm",
            analyze_op(parse_op("int8[B,D] @ int8[D,F]", {"B": 512, "D": 4096, "F": 4096}), v5e),
        )
    )
    out = roofline_chart(pts, v5e, tmp_path / f"r.{ext}")
    data = out.read_bytes()
    assert len(data) > 1000
    if ext == "png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert b"<svg" in data[:2000] and b"attn/scores" in data  # labels are text in the SVG


def test_roofline_chart_accepts_mapping_and_single(tmp_path, v5e):
    from roofline.report.plots import roofline_chart

    r = analyze(1e12, 1e9, v5e)
    assert roofline_chart({"a": r}, v5e, tmp_path / "a.png").stat().st_size > 0
    assert roofline_chart(r, v5e, tmp_path / "b.svg").stat().st_size > 0
    assert roofline_chart([], v5e, tmp_path / "empty.png").stat().st_size > 0


def test_roofline_chart_bad_path(tmp_path, v5e):
    from roofline.report.plots import roofline_chart

    r = analyze(1e12, 1e9, v5e)
    with pytest.raises(SpecError, match="extension"):
        roofline_chart([("a", r)], v5e, tmp_path / "a.jpeg2")
    with pytest.raises(SpecError, match="does not exist"):
        roofline_chart([("a", r)], v5e, tmp_path / "nope" / "a.png")
