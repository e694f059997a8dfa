"""Chip catalog, chip TOML loading and validation, and the `roofline chips` / `roofline chip` commands."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from roofline.cli import main
from roofline.errors import SpecError, UnknownNameError
from roofline.specs.catalog import normalize
from roofline.specs.chip import CHIP_DIR, Chip, chip_names, load_chip

EXPECTED_CHIPS = {
    "tpu-v3", "tpu-v4p", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-7x",
    "v100", "a100", "h100", "h200", "b200", "gb200",
}  # fmt: skip


# -- catalog ---------------------------------------------------------------------------------------
def test_catalog_has_the_expected_chips() -> None:
    assert EXPECTED_CHIPS <= set(chip_names())


@pytest.mark.parametrize("name", sorted(EXPECTED_CHIPS))
def test_every_catalog_chip_loads_and_is_coherent(name: str) -> None:
    c = load_chip(name)
    assert isinstance(c, Chip) and c.name == name
    assert (CHIP_DIR / f"{name}.toml").is_file(), "file name is the chip name"
    # dense peaks and memory in sane ranges (catches unit slips: TB vs GB, sparse vs dense)
    assert 1e13 < c.peak(c.default_dtype) < 1e16  # bf16; fp16 on V100 (no bf16 units)
    assert 1e10 <= c.hbm_bytes <= 1e12
    assert 5e11 <= c.hbm_bw_bytes_per_s <= 2e13
    for d, v in c.peak_flops_per_s.items():
        assert c.critical_intensity(d) == pytest.approx(v / c.hbm_bw_bytes_per_s)
    if c.is_tpu:
        assert c.ici_link_bw_bytes_per_s and c.ici_axes in (2, 3)
        assert c.wraparound in ("multiple_of_4", "size_16", "none")
        assert len(c.pod_topology) == c.ici_axes and len(c.host_topology) == c.ici_axes
        assert c.nvlink_bw_bytes_per_s is None
        assert c.dcn_bw_bytes_per_s and c.pcie_bw_bytes_per_s
    else:
        assert c.vendor == "nvidia"
        assert c.nvlink_bw_bytes_per_s and c.nvlink_domain in (8, 72) and c.node_egress_bytes_per_s
        assert c.ici_link_bw_bytes_per_s is None and c.ici_axes == 0
        # a node's scale-out egress never exceeds what its GPUs can push over NVLink
        assert c.node_egress_bytes_per_s < c.nvlink_domain * c.nvlink_bw_bytes_per_s
    # a price always says where it comes from; a missing price says why
    assert c.price_source
    assert c.usd_per_hour is None or 0.1 < c.usd_per_hour < 100


@pytest.mark.parametrize("name", sorted(EXPECTED_CHIPS))
def test_every_number_in_a_chip_file_has_a_source_comment(name: str) -> None:
    text = (CHIP_DIR / f"{name}.toml").read_text()
    assert text.startswith("#") and "Sources:" in text[:300], "a header comment lists the sources"
    numeric = re.compile(r"^\s*[a-z0-9_]+\s*=\s*(\[\s*)?[-+]?[0-9.]")
    unsourced = [ln for ln in text.splitlines() if numeric.match(ln) and "#" not in ln]
    assert not unsourced, f"{name}: numbers without a source comment: {unsourced}"


def test_aliases_are_unique_across_the_catalog() -> None:
    seen: dict[str, str] = {}
    for n in chip_names():
        c = load_chip(n)
        for a in (c.name, *c.aliases):
            key = normalize(a)
            assert seen.setdefault(key, n) == n, f"alias {a!r} of {n} also names {seen[key]}"


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("v5e", "tpu-v5e"), ("TPU v5e", "tpu-v5e"), ("tpu_v5e", "tpu-v5e"), ("v5p", "tpu-v5p"),
        ("v4", "tpu-v4p"), ("TPU v4p", "tpu-v4p"), ("v3", "tpu-v3"), ("trillium", "tpu-v6e"),
        ("v6e", "tpu-v6e"), ("ironwood", "tpu-7x"), ("TPU7x", "tpu-7x"), ("tpu7x", "tpu-7x"),
        ("h100-sxm", "h100"), ("H100 SXM5", "h100"), ("NVIDIA H100", "h100"), ("a100-80gb", "a100"),
        ("H200", "h200"), ("B200", "b200"), ("GB200 NVL72", "gb200"), ("V100", "v100"),
    ],
)  # fmt: skip
def test_aliases_resolve(alias: str, name: str) -> None:
    assert load_chip(alias).name == name


def test_unknown_name_lists_closest_matches() -> None:
    with pytest.raises(UnknownNameError) as e:
        load_chip("h10")
    msg = str(e.value)
    assert "'h10'" in msg and "closest" in msg and "h100" in msg
    with pytest.raises(UnknownNameError, match="closest: b200, gb200"):
        load_chip("gb250")  # a near miss lists the close names (b300 is in the catalog now)


def test_dense_peaks_and_dtype_fallbacks() -> None:
    h100 = load_chip("h100")
    assert h100.peak("fp16") == h100.peak("bf16") == 9.89e14  # NVIDIA 1,979 "with sparsity" halved
    assert h100.peak("fp8") == pytest.approx(2 * h100.peak("bf16"), rel=1e-3)
    assert h100.critical_intensity() == pytest.approx(295.2, abs=0.1)
    assert load_chip("v5e").critical_intensity() == pytest.approx(240.2, abs=0.1)
    assert load_chip("b200").critical_intensity("fp8") == pytest.approx(562.5)
    with pytest.raises(SpecError, match="int8"):
        load_chip("v100").peak("int8")  # V100 Tensor Cores have no int8 mode
    with pytest.raises(SpecError):
        load_chip("v5p").peak("fp32")  # no published fp32 matmul peak for TPUs


def test_interconnect_numbers_follow_the_book() -> None:
    assert load_chip("v5p").ici_bidi_bw_bytes_per_s == 1.8e11
    assert [load_chip(n).wraparound for n in ("v4", "v5p", "7x", "v5e", "v6e", "v3")] == [
        "multiple_of_4", "multiple_of_4", "multiple_of_4", "size_16", "size_16", "none",
    ]  # fmt: skip
    assert [load_chip(n).nvlink_bw_bytes_per_s for n in ("a100", "h100", "h200", "b200", "gb200")] == [
        3e11, 4.5e11, 4.5e11, 9e11, 9e11,
    ]  # fmt: skip
    gb200 = load_chip("gb200")
    assert (gb200.nvlink_domain, gb200.node_egress_bytes_per_s) == (72, 3.6e12)
    assert load_chip("a100").node_egress_bytes_per_s == 2e11  # DGX A100: 8 x 200 Gb/s HDR


# -- user chip files and validation ----------------------------------------------------------------
GOOD = """\
name = "my-chip"
vendor = "google"
generation = "test"
hbm_bytes = 16e9                 # made up
hbm_bw_bytes_per_s = 8e11        # made up
ici_link_bw_bytes_per_s = 4.5e10 # made up
ici_axes = 2
wraparound = "size_16"
pcie_bw_bytes_per_s = 1.6e10     # made up

[peak_flops_per_s]
bf16 = 2e14                      # made up
"""


def _write(tmp_path: Path, text: str, name: str = "my_chip.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_user_chip_file_loads_by_path(tmp_path: Path) -> None:
    p = _write(tmp_path, GOOD)
    for arg in (str(p), p):
        c = load_chip(arg)
        assert c.name == "my-chip" and c.critical_intensity() == pytest.approx(250.0)
        assert c.ici_bidi_bw_bytes_per_s == 9e10


def _error(tmp_path: Path, text: str) -> str:
    p = _write(tmp_path, text)
    with pytest.raises(SpecError) as e:
        load_chip(str(p))
    msg = str(e.value)
    assert str(p) in msg, f"message does not name the file: {msg}"
    assert "Traceback" not in msg
    return msg


def test_malformed_toml_names_the_file(tmp_path: Path) -> None:
    msg = _error(tmp_path, GOOD.replace("hbm_bytes = 16e9", "hbm_bytes = = 16e9"))
    assert "not valid TOML" in msg and "line 4" in msg


def test_missing_required_key_names_file_and_key(tmp_path: Path) -> None:
    text = "\n".join(ln for ln in GOOD.splitlines() if not ln.startswith("hbm_bw_bytes_per_s"))
    assert "'hbm_bw_bytes_per_s'" in _error(tmp_path, text)


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("hbm_bw_bytes_per_s", "-8e11"),
        ("hbm_bw_bytes_per_s", "0"),
        ("ici_link_bw_bytes_per_s", "0"),
        ("ici_link_bw_bytes_per_s", "-4.5e10"),
        ("pcie_bw_bytes_per_s", "0.0"),
        ("hbm_bytes", "-1"),
        ("bf16", "0"),
        ("hbm_bw_bytes_per_s", "nan"),
        ("hbm_bw_bytes_per_s", '"fast"'),
    ],
)
def test_non_positive_numbers_name_file_and_key(tmp_path: Path, key: str, bad: str) -> None:
    text = re.sub(rf"^{key} = \S+", f"{key} = {bad}", GOOD, flags=re.M)
    assert text != GOOD
    assert key in _error(tmp_path, text)


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("nvlink_bw_bytes_per_s = -4.5e11", "nvlink_bw_bytes_per_s"),
        ("dcn_bw_bytes_per_s = 0", "dcn_bw_bytes_per_s"),
        ("node_egress_bytes_per_s = -1", "node_egress_bytes_per_s"),
        ("usd_per_hour = 0", "usd_per_hour"),
    ],
)
def test_optional_bandwidths_are_validated(tmp_path: Path, line: str, key: str) -> None:
    text = GOOD.replace("ici_axes = 2\n", f"ici_axes = 2\n{line}\n")
    assert key in _error(tmp_path, text)


def test_unknown_key_names_file_key_and_suggestion(tmp_path: Path) -> None:
    msg = _error(
        tmp_path, GOOD.replace("ici_axes = 2", "ici_axes = 2\nhbm_bandwith_bytes_per_s = 1e12")
    )
    assert "'hbm_bandwith_bytes_per_s'" in msg and "did you mean 'hbm_bw_bytes_per_s'" in msg


def test_bad_wraparound_and_axes_are_rejected(tmp_path: Path) -> None:
    assert "wraparound" in _error(tmp_path, GOOD.replace('"size_16"', '"always"'))
    assert "ici_axes" in _error(tmp_path, GOOD.replace("ici_axes = 2", "ici_axes = 4"))


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        load_chip(str(tmp_path / "nope.toml"))


# -- CLI -------------------------------------------------------------------------------------------
LINK_KEYS = (
    "ici_link_bw_bytes_per_s", "ici_bidi_bw_bytes_per_s", "nvlink_bw_bytes_per_s",
    "node_egress_bytes_per_s", "pcie_bw_bytes_per_s", "dcn_bw_bytes_per_s",
)  # fmt: skip


def test_cli_chip_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chip", "tpu-v5e", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "chip" and "schema_version" in doc
    assert doc["inputs"]["chip"] == "tpu-v5e" and doc["inputs"]["resolved"] == "tpu-v5e"
    for k in (
        "peak_flops_per_s",
        "hbm_bytes",
        "hbm_bw_bytes_per_s",
        "critical_intensity",
        "usd_per_hour",
        *LINK_KEYS,
    ):
        assert k in doc, k
    assert doc["peak_flops_per_s"]["bf16"] == 1.97e14
    assert doc["critical_intensity"]["bf16"] == pytest.approx(240.24, abs=0.01)
    assert doc["ici_link_bw_bytes_per_s"] == 4.5e10 and doc["ici_bidi_bw_bytes_per_s"] == 9e10
    assert doc["nvlink_bw_bytes_per_s"] is None
    assert doc["usd_per_hour"] == 1.2
    assert doc["flops_per_usd"]["bf16"] == pytest.approx(1.97e14 * 3600 / 1.2)


def test_cli_chip_json_for_gpu_alias(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chip", "h100-sxm", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["inputs"]["resolved"] == "h100"
    assert (doc["nvlink_bw_bytes_per_s"], doc["nvlink_domain"], doc["node_egress_bytes_per_s"]) == (
        4.5e11,
        8,
        4e11,
    )
    assert doc["ici_bidi_bw_bytes_per_s"] is None
    assert doc["critical_intensity"]["bf16"] == pytest.approx(295.2, abs=0.1)


def test_cli_chip_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chip", "v5e"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tpu-v5e")
    assert re.search(r"^HBM bandwidth\s+820 GB/s$", out, re.M)
    assert re.search(r"^peak bf16 \(dense\)\s+197 TFLOP/s$", out, re.M)
    assert re.search(r"^critical intensity bf16\s+240 FLOP/B$", out, re.M)
    assert re.search(r"^ICI per link, bidirectional\s+90 GB/s$", out, re.M)
    assert "wraparound: size_16" in out and "$1.20/h" in out


def test_cli_chip_accepts_a_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _write(tmp_path, GOOD)
    assert main(["chip", str(p), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["name"] == "my-chip" and doc["inputs"]["file"] == str(p)


@pytest.mark.parametrize(
    "argv", [["chip", "nope"], ["chip", "nope.toml"], ["chip", "h10", "--json"]]
)
def test_cli_chip_error_is_one_paragraph(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    err = cap.err.strip()
    assert err.startswith("roofline chip: error:") and "Traceback" not in err
    assert "\n" not in err, "error is one paragraph"


def test_cli_bad_user_file_is_one_paragraph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = _write(tmp_path, GOOD.replace("hbm_bw_bytes_per_s = 8e11", "hbm_bw_bytes_per_s = -8e11"))
    assert main(["chip", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(p) in err and "hbm_bw_bytes_per_s" in err and "\n" not in err


def test_cli_chips_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chips"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["chip", "bf16"]
    for n in chip_names():
        assert any(ln.startswith(n + " ") for ln in lines), n
    h100 = next(ln for ln in lines if ln.startswith("h100 "))
    assert h100.split()[1:5] == ["989", "80", "3.35", "295"]


def test_cli_chips_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chips", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "chips" and isinstance(doc["chips"], list)
    assert [c["name"] for c in doc["chips"]] == chip_names()
    by = {c["name"]: c for c in doc["chips"]}
    v5p = by["tpu-v5p"]
    assert v5p["bf16_flops_per_s"] == 4.59e14 and v5p["usd_per_hour"] == 4.2
    assert math.isclose(v5p["critical_intensity_bf16"], 4.59e14 / 2.8e12)
    assert by["gb200"]["usd_per_hour"] is None and by["gb200"]["nvlink_domain"] == 72


def test_plans_fit_the_allocatable_hbm_the_book_keeps_the_marketed(tmp_path: Path) -> None:
    """Issue 19 item 2: an "80 GB" H100 is an 80 GiB part of which CUDA sees 81559 MiB and a
    "96 GB" v5p has 95 GiB; plans are checked against that, the book's worked answers keep the
    marketed numbers, a chip file without it fits against the marketed capacity, and a variant
    that restates the capacity does not inherit its base's allocatable HBM."""
    h100, v5p, b200 = load_chip("h100"), load_chip("tpu-v5p"), load_chip("b200")
    assert (h100.hbm_bytes, v5p.hbm_bytes) == (80e9, 96e9)  # the book's "80GB", "96GB"
    assert h100.fit_hbm_bytes == 81559 * 2**20 and v5p.fit_hbm_bytes == 95 * 2**30
    assert (b200.hbm_bytes, b200.fit_hbm_bytes) == (192e9, 183359 * 2**20)  # [smi], as H100's
    v100 = load_chip("v100")  # no allocatable figure in its file: the marketed capacity
    assert v100.usable_hbm_bytes is None and v100.fit_hbm_bytes == v100.hbm_bytes
    variant = _write(tmp_path, 'base = "h100"\nname = "h100-96"\nhbm_bytes = 96e9\n')
    assert load_chip(str(variant)).fit_hbm_bytes == 96e9
    msg = _error(
        tmp_path, GOOD.replace("hbm_bytes = 16e9", "hbm_bytes = 16e9\nusable_hbm_bytes = 8e9")
    )
    assert "usable_hbm_bytes" in msg and "GiB" in msg
