"""The chip's inner hierarchy (issue 20 item 2): vector units, on-chip memories, SMs and clocks.

The book's numbers (gpus.md Quiz 1, tpus.md VPU and VMEM) reproduced from the chip records
and from `roofline op`'s per-level rooflines, plus the chip files' internal consistency:
a vector peak is lanes × clock, an SMEM bandwidth is SMs × 128 B × clock.
"""

from __future__ import annotations

import pytest

from roofline.cli import main
from roofline.cli.op_cmd import result
from roofline.errors import SpecError
from roofline.specs.chip import chip_names, load_chip


def _level(res: dict, name: str) -> dict:
    return next(lv for lv in res["levels"] if lv["level"] == name)


def test_cuda_cores_and_vpu_alus_gp03():
    """gp-03: 132·4·32 = 16,896 CUDA cores (H100), 18,944 (B200); v5p 2·4·8·128 = 8192 VPU ALUs."""
    h100, b200, v5p = load_chip("h100"), load_chip("b200"), load_chip("tpu-v5p")
    assert h100.sm_count * 128 == 16896
    assert b200.sm_count * 128 == 18944
    assert v5p.vector_peak("fp32") / v5p.clock_hz == pytest.approx(8192)


def test_h100_vector_flops_and_intensity():
    """gpus.md Quiz 1: 132·4·32·1.59e9 = 26.9 TFLOP/s (33.5 at boost), ~30x below the 990 of
    the Tensor Cores; vector critical intensity ≈ 10."""
    h = load_chip("h100")
    assert h.sm_count * 128 * h.clock_hz == pytest.approx(26.9e12, rel=0.01)
    assert h.vector_peak("fp32") == pytest.approx(33.5e12, rel=0.01)
    assert h.peak("bf16") / h.vector_peak("fp32") == pytest.approx(30, rel=0.05)
    assert h.vector_peak("fp32") / h.hbm_bw_bytes_per_s == pytest.approx(10, rel=0.01)


def test_b200_clock_from_its_vector_peak():
    """gpus.md Quiz 1: 80e12 fp32 FLOP/s over 18,944 cores × 2 (FMA) = 2.1 GHz."""
    b = load_chip("b200")
    assert b.boost_clock_hz == pytest.approx(80e12 / (18944 * 2), rel=0.01)
    assert b.clock_hz is None  # the book's table has "?": no base clock is claimed


def test_v5p_vpu_and_vregs():
    """tpus.md: (8, 128) × 4 ALUs × 1.75 GHz ≈ 7e12 per core; 64 VREGs × 8 × 128 × 4 B = 256 kB."""
    v5p = load_chip("tpu-v5p")
    assert v5p.vector_peak("fp32") / v5p.cores_per_chip == pytest.approx(7e12, rel=0.03)
    assert v5p.vreg_bytes_per_core == 64 * 8 * 128 * 4
    assert load_chip("tpu-v4p").vreg_bytes_per_core == 32 * 8 * 128 * 4


def test_h100_smem_and_registers_gpus_md():
    """gpus.md: SMEM + registers on H100 ≈ 33 MB + 33 MB (vs TPU VMEM ~120 MB)."""
    h = load_chip("h100")
    assert h.smem_bytes_per_sm * h.sm_count == pytest.approx(33e6, rel=0.03)
    assert h.register_bytes_per_sm * h.sm_count == pytest.approx(33e6, rel=0.03)


@pytest.mark.parametrize("n,book_s", [(65536, 0.23e-6), (2**30, 3.84e-3)])
def test_fp32_vector_add_on_h100(n, book_s):
    """gpus.md Quiz 1: fp32 add of N elements, intensity 1/12, T = 12N/3.35e12 (0.23 µs, 3.84 ms)."""
    res = result("fp32[N] + fp32[N]", {"N": n}, "h100")
    assert res["unit"] == "vector" and res["bound"] == "memory"
    assert res["intensity"] == pytest.approx(1 / 12)
    assert res["time_lower_s"] == pytest.approx(12 * n / 3.35e12)
    assert res["time_lower_s"] == pytest.approx(book_s, rel=0.03)  # the book rounds 0.235 to 0.23


def test_matmul_from_vmem_tp07():
    """tp-07: int8[B,4096] × int8[4096,16384] on v5e turns compute-bound at B ≈ 240 from HBM and
    B ≈ 11 from VMEM (22x HBM bandwidth)."""
    res = result("int8[B,D] @ int8[D,F]", {"B": 64, "D": 4096, "F": 16384}, "tpu-v5e")
    assert _level(res, "hbm")["critical_batch"] == pytest.approx(240, rel=0.01)
    assert _level(res, "vmem")["critical_batch"] == pytest.approx(11, rel=0.05)
    assert _level(res, "hbm")["bound"] == "memory" and _level(res, "vmem")["bound"] == "compute"


@pytest.mark.parametrize("B,book_us,bound", [(64, 8.6, "memory"), (512, 15.0, "compute")])
def test_b200_matmul_gpus_md(B, book_us, bound):
    """gpus.md Quiz 1: fp16[B,4096]·[4096,8192] on B200: 69e6 bytes / 8e12 = 8.6 µs at B=64; ~15 µs
    of FLOPs at B=512."""
    res = result("fp16[B,D] @ fp16[D,F]", {"B": B, "D": 4096, "F": 8192}, "b200")
    hbm = _level(res, "hbm")
    assert hbm["time_lower_s"] * 1e6 == pytest.approx(book_us, rel=0.03)
    assert hbm["bound"] == bound


def test_every_gpu_has_sms_and_a_clock():
    """Every GPU gives its SM (CU) count and a boost clock, except H20's clock (its published
    numbers disagree) and GB200's SM count (held back until the efficiency profile is refit:
    the wave model reads it; both files say why)."""
    gpus = [load_chip(n) for n in chip_names() if not load_chip(n).is_tpu]
    assert {c.name for c in gpus if not c.sm_count} == {"gb200"}
    assert {c.name for c in gpus if c.boost_clock_hz is None} == {"h20"}


@pytest.mark.parametrize("name", ["h100", "h200", "h800", "a100", "v100", "b200", "gb200"])
def test_smem_bandwidth_is_sms_times_128_bytes_times_clock(name):
    c = load_chip(name)
    sms = c.sm_count or load_chip("b200").sm_count  # GB200's GPU is a B200
    assert c.smem_bw_bytes_per_s == pytest.approx(sms * 128 * c.boost_clock_hz, rel=2e-3)


@pytest.mark.parametrize(
    "name,lanes",
    [("h100", 128), ("a100", 64), ("b200", 128), ("b300", 128), ("gb300", 128)] + [("mi300x", 128)],
)
def test_vector_peak_is_lanes_times_clock(name, lanes):
    """One fp32 op per lane per clock: 128 lanes per Hopper/Blackwell SM (4 × 32), 64 per
    Ampere SM, 128 per CDNA 3 CU (AMD's 163.4 TFLOP/s = 304 × 128 × 2 × 2.1 GHz)."""
    c = load_chip(name)
    assert c.vector_peak("fp32") == pytest.approx(c.sm_count * lanes * c.boost_clock_hz, rel=0.01)


def test_dtypes_without_a_vector_rate_run_at_fp32_and_missing_tables_are_errors(capsys):
    v5e = load_chip("tpu-v5e")
    assert v5e.vector_peak("bf16") == v5e.vector_peak("fp32")  # the VPU computes in fp32
    with pytest.raises(SpecError, match="vector"):
        load_chip("tpu-v6e").vector_peak("fp32")
    assert main(["op", "fp32[N] + fp32[N]", "--dims", "N=1024", "--chip", "tpu-v6e"]) == 2
    assert "vector_ops_per_s" in capsys.readouterr().err


def test_op_text_lists_each_level(capsys):
    assert main(["op", "fp32[N] + fp32[N]", "--dims", "N=65536", "--chip", "h100"]) == 0
    out = capsys.readouterr().out
    assert "elementwise, vector units" in out
    for level in ("hbm", "l2", "smem"):
        assert f"\n{level} " in out


def test_v5p_matmul_from_vmem_gpus_md():
    """gpus.md: a TPU's VMEM has 'around 40TB/s' (the chapter's TPU is v5p): a bf16 matmul
    reading its weights from VMEM turns compute-bound at B ≈ C/W_vmem = 4.59e14/4e13 ≈ 11.5,
    against C/W_hbm = 4.59e14/2.765e12 ≈ 166 from HBM."""
    chip = load_chip("tpu-v5p")
    assert chip.vmem_bw_bytes_per_s == 4.0e13
    res = result("bf16[B,D] @ bf16[D,F]", {"B": 64, "D": 8192, "F": 32768}, "tpu-v5p")
    C = chip.peak_flops_per_s["bf16"]
    assert _level(res, "vmem")["critical_batch"] == pytest.approx(C / 4.0e13, rel=0.01)
    assert _level(res, "hbm")["critical_batch"] == pytest.approx(
        C / chip.hbm_bw_bytes_per_s, rel=0.01
    )
    assert _level(res, "vmem")["bound"] == "compute" and _level(res, "hbm")["bound"] == "memory"


@pytest.mark.parametrize("name", ["h200", "h800"])
def test_gh100_parts_share_the_measured_l2(name):
    """The book's measured H100 L2 (~5.5 TB/s, ~1.6x HBM) is the GH100 die's: H200 and H800
    carry it; H200's faster HBM (4.8 TB/s) brings L2 to only ~1.15x HBM there."""
    assert load_chip(name).l2_bw_bytes_per_s == load_chip("h100").l2_bw_bytes_per_s == 5.5e12
    res = result("bf16[B,D] @ bf16[D,F]", {"B": 64, "D": 8192, "F": 8192}, name)
    assert _level(res, "l2")["critical_batch"] == pytest.approx(
        load_chip(name).peak_flops_per_s["bf16"] / 5.5e12, rel=0.01
    )


def test_mi300x_infinity_cache_bandwidth():
    """AMD's CDNA 3 white paper: 17.2 TB/s from the 256 MB Infinity Cache (MI325X: same die)."""
    for name in ("mi300x", "mi325x"):
        chip = load_chip(name)
        assert (chip.l2_bytes, chip.l2_bw_bytes_per_s) == (256e6, 1.72e13)


@pytest.mark.parametrize("name", ["a100", "v100", "b200", "gb200", "h20"])
def test_gpus_without_a_citable_l2_bandwidth_leave_it_unset(name):
    assert load_chip(name).l2_bw_bytes_per_s is None
    res = result("fp16[B,D] @ fp16[D,F]", {"B": 64, "D": 8192, "F": 8192}, name)
    assert "l2" not in {lv["level"] for lv in res["levels"]}
