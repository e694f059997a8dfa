"""Dtypes: storage bytes with block-scale overhead, the compute format, and peaks per dtype."""

from __future__ import annotations

import pytest

from roofline.errors import SpecError
from roofline.specs.chip import load_chip
from roofline.units import (
    DTYPE_BYTES,
    block_scale_overhead,
    compute_format,
    dtype_bytes,
    parse_dtype,
)


@pytest.mark.parametrize(
    ("dtype", "element_bits", "scale_bits", "block"),
    [
        ("nvfp4", 4, 8, 16),  # NVIDIA NVFP4: E2M1 + one E4M3 scale per 16 values
        ("mxfp4", 4, 8, 32),  # OCP MX: E2M1 + one E8M0 scale per 32 values
        ("mxfp8", 8, 8, 32),  # OCP MX: E4M3 + one E8M0 scale per 32 values
        ("fp8_block", 8, 32, 128 * 128),  # DeepSeek-V3: fp32 scale per 128x128 weight block
    ],
)
def test_block_scaled_bytes_are_element_plus_scale(dtype, element_bits, scale_bits, block):
    expected = (element_bits + scale_bits / block) / 8
    assert dtype_bytes(dtype) == pytest.approx(expected, rel=1e-12)
    assert block_scale_overhead(dtype) == pytest.approx(scale_bits / block / 8, rel=1e-12)
    assert block_scale_overhead(compute_format(dtype)) == 0.0


def test_the_book_dtypes_keep_their_sizes():
    assert [dtype_bytes(d) for d in ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4")] == [
        4.0, 2.0, 2.0, 1.0, 1.0, 0.5, 0.5,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("alias", "canon"),
    [
        ("NVFP4", "nvfp4"),
        ("mx-fp4", "mxfp4"),
        ("e2m1", "fp4"),
        ("fp8-block", "fp8_block"),
        ("e4m3", "fp8"),
    ],
)
def test_aliases(alias, canon):
    assert parse_dtype(alias) == canon


@pytest.mark.parametrize("bad", [None, 4, 2.0, ["bf16"], "bf17", ""])
def test_bad_dtype_is_one_paragraph(bad):
    with pytest.raises(SpecError) as e:
        parse_dtype(bad)
    assert "nvfp4" in str(e.value) and "\n" not in str(e.value)


def test_block_formats_compute_at_their_element_peak():
    b200 = load_chip("b200")
    assert b200.peak("nvfp4") == b200.peak("mxfp4") == b200.peak("fp4")
    assert b200.peak("mxfp8") == b200.peak("fp8_block") == b200.peak("fp8")
    # H100 has no fp4 units: fp4 work runs on the fp8 units (the documented fallback)
    h100 = load_chip("h100")
    assert h100.peak("nvfp4") == h100.peak("fp8")


def test_v100_has_no_bf16_peak_and_says_what_to_do():
    v100 = load_chip("v100")
    assert "bf16" not in v100.peak_flops_per_s
    with pytest.raises(SpecError) as e:
        v100.peak("bf16")
    msg = str(e.value)
    assert "no bf16" in msg and "fp16" in msg and "fallback" in msg
    assert v100.default_dtype == "fp16" and v100.peak("fp16") == 1.25e14
    # the caller may choose to price bf16 work at the fp16 rate, explicitly
    assert v100.peak("bf16", fallback="fp16") == 1.25e14
    assert v100.critical_intensity("bf16", fallback="fp16") == pytest.approx(1.25e14 / 9e11)
    assert load_chip("h100").default_dtype == "bf16"


def test_every_dtype_has_a_size():
    for d in DTYPE_BYTES:
        assert parse_dtype(d) == d and dtype_bytes(d) > 0
