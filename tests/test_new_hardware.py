"""Chips and systems added for the measured runs (issue 9 item 5, issue 11): sourced specs,
per-dtype dense peaks, partly used NVL72 racks, AMD Infinity Fabric nodes."""

from __future__ import annotations

import re

import pytest

from roofline.errors import SpecError
from roofline.specs.chip import CHIP_DIR, load_chip
from roofline.specs.system import DimKind, parse_system

NEW = ("a100-40gb", "h800", "h20", "b300", "gb300", "mi300x", "mi325x", "mi355x")


@pytest.mark.parametrize("name", NEW)
def test_new_chips_are_sourced_and_sane(name):
    c = load_chip(name)
    text = (CHIP_DIR / f"{name}.toml").read_text()
    assert text.startswith("#") and "Sources:" in text[:400]
    numeric = re.compile(r"^\s*[a-z0-9_]+\s*=\s*(\[\s*)?[-+]?[0-9.]")
    assert not [ln for ln in text.splitlines() if numeric.match(ln) and "#" not in ln]
    assert 1e14 <= c.peak("bf16") <= 1e16
    assert 1e10 <= c.hbm_bytes <= 1e12 and 1e12 <= c.hbm_bw_bytes_per_s <= 2e13
    assert c.nvlink_bw_bytes_per_s and c.nvlink_domain in (8, 72) and c.node_egress_bytes_per_s
    assert c.node_egress_bytes_per_s < c.nvlink_domain * c.nvlink_bw_bytes_per_s
    # dense peaks: each lower precision at least the bf16 rate, except the int8 that Blackwell Ultra cut
    for d in ("fp8", "fp4"):
        if d in c.peak_flops_per_s:
            assert c.peak(d) >= c.peak("bf16")
    assert c.price_source


def test_a100_40gb_is_the_a100_with_less_memory():
    big, small = load_chip("a100"), load_chip("a100-40gb")
    assert (small.hbm_bytes, small.hbm_bw_bytes_per_s) == (40e9, 1.555e12)
    assert small.peak_flops_per_s == big.peak_flops_per_s
    assert small.nvlink_bw_bytes_per_s == big.nvlink_bw_bytes_per_s == 3e11
    assert small.sm_count == big.sm_count == 108
    assert load_chip("A100 40GB").name == "a100-40gb" and load_chip("a100").name == "a100"


def test_chip_variant_file_inherits_and_overrides(tmp_path):
    p = tmp_path / "h100-slow.toml"
    p.write_text('base = "h100"\nname = "h100-slow"\nhbm_bw_bytes_per_s = 2e12 # made up\n')
    c = load_chip(str(p))
    assert c.hbm_bw_bytes_per_s == 2e12 and c.peak("fp8") == load_chip("h100").peak("fp8")
    p.write_text('base = "h100"\nname = "x"\nhbm_bw_bytes_per_s = "fast"\n')
    with pytest.raises(SpecError, match="hbm_bw_bytes_per_s"):
        load_chip(str(p))


def test_hopper_export_variants():
    h100, h800, h20 = (load_chip(n) for n in ("h100", "h800", "h20"))
    assert h800.peak_flops_per_s == h100.peak_flops_per_s  # same Tensor Cores
    assert h800.nvlink_bw_bytes_per_s == 2e11  # 400 GB/s bidirectional (H100: 900)
    # H20: TPP = dense TOPS x bits stays under the 4,800 export line
    assert h20.peak("fp8") * 8 / 1e12 == pytest.approx(h20.peak("bf16") * 16 / 1e12) == 2368
    assert h20.critical_intensity() == pytest.approx(37, abs=0.5)  # memory-rich: 148e12 / 4e12


def test_blackwell_ultra_peaks():
    b300, gb300, gb200 = (load_chip(n) for n in ("b300", "gb300", "gb200"))
    assert gb300.peak("nvfp4") == 1.5e16 == 1.5 * gb200.peak("fp4")  # "1.5x dense FP4"
    assert gb300.peak("bf16") == gb200.peak("bf16") and gb300.hbm_bytes == 288e9
    assert b300.peak("fp4") == 1.35e16 and b300.peak("bf16") == 2.25e15
    # int8 was cut on Blackwell Ultra: listed, so it does not fall back to the fp8 rate
    assert b300.peak("int8") < b300.peak("bf16") / 10
    assert gb300.gpus_per_tray == gb200.gpus_per_tray == 4


def test_amd_chips():
    mi300x, mi325x, mi355x = (load_chip(n) for n in ("mi300x", "mi325x", "mi355x"))
    # the CU arithmetic the data sheets imply: CUs x FLOP/clk/CU x clock
    assert mi300x.peak("bf16") == pytest.approx(304 * 2048 * 2.1e9, rel=1e-3)
    assert mi355x.peak("fp8") == pytest.approx(256 * 8192 * 2.4e9, rel=1e-3)
    assert mi325x.peak_flops_per_s == mi300x.peak_flops_per_s and mi325x.hbm_bytes == 256e9
    assert mi355x.peak("mxfp4") == pytest.approx(2 * mi355x.peak("fp8"), rel=1e-3)
    assert {c.vendor for c in (mi300x, mi325x, mi355x)} == {"amd"}
    assert mi300x.scaleup_fabric == "Infinity Fabric" and mi300x.nvlink_bw_bytes_per_s == 7 * 64e9


@pytest.mark.parametrize(
    ("spec", "dims", "per_domain"),
    [
        ("gb200-nvl72:576", [("leaf", 8), ("nvlink", 72)], 72),
        ("gb200:256", [("leaf", 4), ("nvlink", 64)], 64),  # 4 racks with 16 trays each
        ("gb300-nvl72:64", [("nvlink", 64)], 64),  # part of one rack
        ("gb300:100", [("leaf", 5), ("nvlink", 20)], 20),
        ("gb300:20", [("nvlink", 20)], 20),  # the AIC serving points: 5 trays
        ("gb200:252", [("leaf", 7), ("nvlink", 36)], 36),
    ],
)
def test_nvl72_systems_of_any_whole_tray_count(spec, dims, per_domain):
    s = parse_system(spec)
    assert [(d.name, d.size) for d in s.dims] == dims
    assert s.topology[-1] == per_domain and per_domain % 4 == 0
    if len(dims) > 1:  # one 800/400 Gb/s NIC per GPU, also in a partly used rack
        assert s.dim("leaf").bw_bytes_per_s == pytest.approx(s.chip.node_egress_bytes_per_s / 72)


def test_nvl72_counts_that_are_not_whole_trays_say_so():
    with pytest.raises(SpecError, match="trays") as e:
        parse_system("gb200:1002")
    assert "1000 or 1004" in str(e.value)


@pytest.mark.parametrize("name", ["mi300x", "mi325x", "mi355x"])
def test_amd_nodes_are_8_gpus_over_infinity_fabric(name):
    s = parse_system(f"{name}:64")
    assert [(d.name, d.size) for d in s.dims] == [("leaf", 8), ("xgmi", 8)]
    assert s.dim("xgmi").kind is DimKind.NVLINK  # fully connected: any peer one hop away
    assert "Infinity Fabric" in parse_system(f"{name}:8").description


@pytest.mark.parametrize("spec", ["h800:2048", "h20:16", "b300:64", "a100-40gb:64"])
def test_hgx_style_nodes(spec):
    s = parse_system(spec)
    assert s.dims[-1].name == "nvlink" and s.dims[-1].size == 8
    assert s.n_chips == int(spec.split(":")[1])
