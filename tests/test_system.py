"""Systems: spec strings, wraparound rules, GPU tiers, TOML files, validation errors, CLI."""

from __future__ import annotations

import json

import pytest

from roofline.cli import main
from roofline.errors import RooflineError, SpecError, UnknownNameError
from roofline.specs.system import DimKind, PhysDim, System, parse_system, system_files


def dims(spec: str, **kw) -> list[tuple[str, int, bool]]:
    return [(d.name, d.size, d.wraparound) for d in parse_system(spec, **kw).dims]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # tpus.md: v5e/v6e wrap only on axes of size 16
        ("tpu-v5e:16x16", [("x", 16, True), ("y", 16, True)]),
        ("tpu-v5e:8x16", [("x", 8, False), ("y", 16, True)]),
        ("tpu-v5e:4x4", [("x", 4, False), ("y", 4, False)]),
        ("tpu-v6e:16x16", [("x", 16, True), ("y", 16, True)]),
        # v4p/v5p/7x wrap on multiples of 4
        ("tpu-v4p:4x4x4", [("x", 4, True), ("y", 4, True), ("z", 4, True)]),
        ("v5p:16x20x28", [("x", 16, True), ("y", 20, True), ("z", 28, True)]),
        ("tpu-v5p:2x2x1", [("x", 2, False), ("y", 2, False)]),
        ("tpu-v5p:4x4x6", [("x", 4, True), ("y", 4, True), ("z", 6, False)]),
        ("tpu-7x:4x4x8", [("x", 4, True), ("y", 4, True), ("z", 8, True)]),
    ],
)
def test_tpu_wraparound_rules(spec: str, expected: list) -> None:
    assert dims(spec) == expected


def test_tpu_bandwidths_and_price() -> None:
    s = parse_system("tpu-v5p:4x4x4")
    assert s.n_chips == 64 and s.is_tpu and s.n_slices == 1
    assert all(
        d.kind is DimKind.ICI and d.bw_bytes_per_s == 9e10 and d.hop_latency_s == 1e-6
        for d in s.dims
    )
    assert s.usd_per_chip_hour == s.chip.usd_per_hour
    assert s.usd_per_hour == pytest.approx(64 * s.chip.usd_per_hour)
    assert parse_system(s, usd_per_chip_hour=1.0).usd_per_hour == 64.0
    assert parse_system("tpu-v5e").n_chips == 256  # chip alone = the pod


def test_multislice_dcn() -> None:
    s = parse_system("2xtpu-v5p:16x20x28")
    assert s.n_chips == 2 * 8960 and s.n_slices == 2
    assert s.dims[0].name == "dcn" and s.dims[0].kind is DimKind.DCN and s.dims[0].size == 2
    assert s.dims[0].bw_bytes_per_s == 6.25e9
    assert parse_system("4xv5e:16x16").dims[0].size == 4


def test_gpu_tiers() -> None:
    s = parse_system("h100:1024")
    assert [(d.name, d.size) for d in s.dims] == [("spine", 4), ("leaf", 32), ("nvlink", 8)]
    assert s.dim("nvlink").bw_bytes_per_s == 450e9
    assert s.dim("leaf").bw_bytes_per_s == 50e9  # 400 GB/s node egress / 8 GPUs (rail-optimised)
    assert s.dim("spine").bw_bytes_per_s == 50e9
    assert [(d.name, d.size) for d in parse_system("h100:16").dims] == [("leaf", 2), ("nvlink", 8)]
    assert [(d.name, d.size) for d in parse_system("h100:8").dims] == [("nvlink", 8)]
    assert [(d.name, d.size) for d in parse_system("h100:4").dims] == [
        ("nvlink", 4)
    ]  # part of a node
    assert [(d.name, d.size) for d in parse_system("h100:2048").dims] == [
        ("spine", 8),
        ("leaf", 32),
        ("nvlink", 8),
    ]
    # not a multiple of 32 nodes: the leaf groups a divisor; prime node counts: one tier
    assert [(d.name, d.size) for d in parse_system("h100:320").dims] == [
        ("spine", 2),
        ("leaf", 20),
        ("nvlink", 8),
    ]
    assert [(d.name, d.size) for d in parse_system("h100:384").dims] == [
        ("spine", 2),
        ("leaf", 24),
        ("nvlink", 8),
    ]
    assert [(d.name, d.size) for d in parse_system("h100:1016").dims] == [
        ("leaf", 127),
        ("nvlink", 8),
    ]
    gb = parse_system("gb200-nvl72:576")
    assert [(d.name, d.size) for d in gb.dims] == [("leaf", 8), ("nvlink", 72)]
    assert gb.dim("leaf").bw_bytes_per_s == pytest.approx(3.6e12 / 72)
    assert gb.dim("nvlink").bw_bytes_per_s == 900e9
    for spec in ("a100:64", "h200:16", "b200:32"):
        assert parse_system(spec).n_chips == int(spec.split(":")[1])


def test_sharp_and_options() -> None:
    assert parse_system("h100:64+sharp").sharp
    assert not parse_system("h100:64").sharp
    assert parse_system("h100:64", sharp=True).sharp
    s = parse_system("h100:1024", tier_bw={"spine": 25e9})
    assert s.dim("spine").bw_bytes_per_s == 25e9
    assert [d.wraparound for d in parse_system("tpu-v5e:4x4", wraparound=True).dims] == [True, True]
    assert [d.wraparound for d in parse_system("tpu-v5e:16x16", wraparound=False).dims] == [
        False,
        False,
    ]
    with pytest.raises(SpecError, match="tier_bw"):
        parse_system("h100:8", tier_bw={"spine": 1e9})


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("tpu-v9000:4x4", "unknown chip"),  # unknown chip
        ("tpu-v5e:4x4x4", "3 axes but tpu-v5e has a 2D torus"),  # wrong number of axes
        ("v5p:4x4", "write tpu-v5p:4x4x1"),
        ("tpu-v5e:32x16", "does not fit"),  # bigger than the pod
        ("tpu-v5e:0x16", "size 0"),
        ("tpu-v5e:ax4", "cannot read topology"),
        ("h100:12", "not a whole number of 8-GPU"),  # not a multiple of the node
        ("h100:0", "at least one GPU"),
        ("h100:-8", "at least one GPU"),
        ("h100:lots", "cannot read GPU count"),
        ("h100:8+turbo", "unknown option"),
        ("2xh100:16", "slice count"),
        ("", "cannot read system"),
    ],
)
def test_errors(spec: str, match: str) -> None:
    with pytest.raises(RooflineError, match=match) as e:
        parse_system(spec)
    assert "Rule:" in str(e.value) or isinstance(e.value, UnknownNameError)


def test_unknown_chip_suggests() -> None:
    with pytest.raises(UnknownNameError, match="closest"):
        parse_system("h1000:8")


def test_system_record_validation() -> None:
    chip = parse_system("h100:8").chip
    d = PhysDim("nvlink", DimKind.NVLINK, 8, 450e9)
    with pytest.raises(SpecError, match="multiply to the chip count"):
        System("bad", chip, 16, (d,))
    with pytest.raises(SpecError, match="size"):
        PhysDim("x", DimKind.ICI, 0, 1e9)
    with pytest.raises(SpecError, match="bw_bytes_per_s"):
        PhysDim("x", DimKind.ICI, 4, -1.0)
    with pytest.raises(SpecError, match="repeat"):
        System("bad", chip, 64, (d, d))


def test_shipped_system_files() -> None:
    names = {p.stem for p in system_files()}
    assert {"example-custom", "dgx-h100-superpod-tapered-spine"} <= names
    s = parse_system("example-custom")
    assert s.n_chips == 16 and s.usd_per_chip_hour == 2.5
    assert [(d.name, d.kind, d.bw_bytes_per_s) for d in s.dims] == [
        ("leaf", DimKind.SCALEOUT, 25e9),
        ("nvlink", DimKind.NVLINK, 450e9),
    ]
    t = parse_system(str(system_files()[0].parent / "dgx-h100-superpod-tapered-spine.toml"))
    assert t.dim("spine").bw_bytes_per_s == 25e9 and t.n_chips == 1024


def test_user_toml(tmp_path) -> None:
    p = tmp_path / "my.toml"
    p.write_text(
        'chip = "tpu-v5e"\nwraparound = true\n[[dims]]\nname = "x"\nkind = "ici"\nsize = 4\nbw_bytes_per_s = 4.5e10\n'
        '[[dims]]\nname = "y"\nkind = "ici"\nsize = 4\nbw_bytes_per_s = 4.5e10\n'
    )
    s = parse_system(p)
    assert s.name == "my" and s.n_chips == 16 and all(d.wraparound for d in s.dims)
    bad = tmp_path / "bad.toml"
    bad.write_text('chip = "h100"\nbandwidth = 3\n')
    with pytest.raises(SpecError, match="unknown key 'bandwidth'"):
        parse_system(bad)
    bad.write_text(
        'base = "h100:8"\n[[dims]]\nname = "x"\nkind = "ici"\nsize = 8\nbw_bytes_per_s = 1e9\n'
    )
    with pytest.raises(SpecError, match="both base"):
        parse_system(bad)
    bad.write_text(
        'chip = "h100"\n[[dims]]\nname = "x"\nkind = "warp"\nsize = 8\nbw_bytes_per_s = 1e9\n'
    )
    with pytest.raises(SpecError, match="kind"):
        parse_system(bad)
    with pytest.raises(SpecError, match="does not exist"):
        parse_system(tmp_path / "missing.toml")


def test_cli_system_json(capsys) -> None:
    assert main(["system", "h100:1024", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "system" and doc["n_chips"] == 1024
    assert [d["name"] for d in doc["dims"]] == ["spine", "leaf", "nvlink"]
    nv = doc["dims"][2]
    assert nv["allgather_bytes_per_s"] == pytest.approx(450e9 * 8 / 7)
    assert doc["usd_per_hour"] == pytest.approx(1024 * doc["usd_per_chip_hour"])


def test_cli_system_text_and_errors(capsys) -> None:
    assert main(["system", "tpu-v5e:8x16"]) == 0
    out = capsys.readouterr().out
    assert "open line" in out and "ring" in out
    assert main(["system"]) == 0
    assert "h100:1024" in capsys.readouterr().out
    assert main(["system", "h100:12"]) == 2
    assert "not a whole number" in capsys.readouterr().err
