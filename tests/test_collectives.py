"""Collective costs: the issue's "done when" checks, properties of the models, errors, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from roofline.cli import main
from roofline.core.collectives import (
    SHARP_PRACTICAL_SPEEDUP,
    CollectiveKind,
    collective_cost,
    moe_ragged_fraction,
    parse_collective_kind,
)
from roofline.core.mesh import make_mesh
from roofline.errors import PlanError, RooflineError, SpecError
from roofline.specs.system import parse_system

# -- done-when checks --------------------------------------------------------------------


def test_8xh100_allgather_65us() -> None:
    # gpus.md pop quiz 1: AllGather(bf16[B_X, F]), B=1024, F=16384 on 8xH100 -> 65 µs
    c = collective_cost("all-gather", 2 * 1024 * 16384, "X", make_mesh("h100:8", "X=8"))
    assert c.time_s == pytest.approx(65e-6, rel=0.01)
    assert c.bottleneck == "nvlink" and not c.latency_bound
    assert c.wire_bytes_per_chip == pytest.approx(2 * 1024 * 16384 * 7 / 8)
    assert c.seconds_per_byte == pytest.approx(7 / 8 / 450e9)


def test_v4p_latency_bound_allgather_2us() -> None:
    # sharding.md Q3: AllGather_X([B_X]) of 128 bf16 values on v4p 4x4x4: 2 hops -> ~2 µs
    c = collective_cost("AG", 128 * 2, "X", make_mesh("tpu-v4p:4x4x4", "X=4,Y=4,Z=4"))
    assert c.latency_bound
    assert c.time_s == pytest.approx(2e-6)
    assert c.latency_bound_below_bytes == pytest.approx(2e-6 * 9e10)


# -- specific model behaviour ------------------------------------------------------------


def test_kind_aliases() -> None:
    for name, kind in [
        ("all-gather", "all-gather"),
        ("allgather", "all-gather"),
        ("AG", "all-gather"),
        ("RS", "reduce-scatter"),
        ("reduce_scatter", "reduce-scatter"),
        ("AR", "all-reduce"),
        ("all-reduce", "all-reduce"),
        ("A2A", "all-to-all"),
        ("alltoall", "all-to-all"),
        ("permute", "permute"),
        ("ppermute", "permute"),
    ]:
        assert parse_collective_kind(name) == CollectiveKind(kind)
    with pytest.raises(SpecError, match="unknown collective"):
        parse_collective_kind("broadcast")


def test_group_of_one_is_free() -> None:
    m = make_mesh("h100:8", {"data": 1, "tensor": 8})
    c = collective_cost("AR", 1e9, "data", m)
    assert c.time_s == 0 and c.group_size == 1 and not c.latency_bound and c.bottleneck == "none"
    v = collective_cost("AR", np.array([1.0, 2.0]), (), m)
    assert np.all(v.time_s == 0)


def test_multi_axis_bandwidth_adds_and_latency_sums() -> None:
    m = make_mesh("tpu-v5p:16x16x16", "X=16,Y=16,Z=16")
    one = collective_cost("AG", 1e9, "Z", m)
    three = collective_cost("AG", 1e9, "XYZ", m)
    assert one.seconds_per_byte == pytest.approx(1 / 1.8e11)
    assert three.seconds_per_byte == pytest.approx(1 / (3 * 1.8e11))  # V/(M·W_ici)
    assert three.latency_s == pytest.approx(3 * 8 * 1e-6)  # T_min·ΣX_i/2
    assert three.bottleneck == "ici x+y+z (wraparound)"


def test_strided_segment_shares_links() -> None:
    m = make_mesh("tpu-v5e:16x16", {"X": 8, "Y": 32})
    c = collective_cost(
        "AG", 1e9, "X", m
    )  # x 8 at stride 2 on a 16-ring: ring, half the link bandwidth
    assert c.seconds_per_byte == pytest.approx(1 / 4.5e10)
    assert c.latency_s == pytest.approx(4 * 2 * 1e-6)


def test_dcn_stage() -> None:
    m = make_mesh("2xtpu-v5p:4x4x4", {"dp": 2, "fsdp": 64})
    c = collective_cost("AR", 1e9, "dp", m)
    assert c.bottleneck == "dcn"
    assert c.seconds_per_byte == pytest.approx(2 * 0.5 / 6.25e9)
    both = collective_cost("AG", 1e9, ("dp", "fsdp"), m)
    dcn = next(t for t in both.tiers if t.name == "dcn")
    assert dcn.inner == 64 and dcn.seconds_per_byte == pytest.approx(0.5 / (64 * 6.25e9))


def test_sharp_allreduce() -> None:
    m = make_mesh("h100:8", "X=8")
    ring = collective_cost("AR", 1e9, "X", m)
    theory = collective_cost("AR", 1e9, "X", m, sharp=True)
    practice = collective_cost("AR", 1e9, "X", m, sharp=True, sharp_speedup=SHARP_PRACTICAL_SPEEDUP)
    assert ring.seconds_per_byte == pytest.approx(2 * 7 / 8 / 450e9)
    assert theory.seconds_per_byte == pytest.approx(1 / 450e9)  # gpus.md: bytes / W, exactly
    assert practice.time_s == pytest.approx(ring.time_s / 1.3)
    assert theory.wire_bytes_per_chip == 1e9 and ring.wire_bytes_per_chip == pytest.approx(
        2e9 * 7 / 8
    )
    assert collective_cost(
        "AR", 1e9, "X", make_mesh("h100:8+sharp", "X=8")
    ).time_s == pytest.approx(theory.time_s)
    # ICI has no switches: sharp changes nothing on a TPU
    t = make_mesh("tpu-v4p:4x4x4", "X=4,Y=4,Z=4")
    assert (
        collective_cost("AR", 1e9, "X", t, sharp=True).time_s
        == collective_cost("AR", 1e9, "X", t).time_s
    )


def test_gpu_alltoall_and_ragged() -> None:
    m = make_mesh("h100:8", "X=8")
    b = 1e9
    dense = collective_cost("A2A", b, "X", m)
    assert dense.bandwidth_s == pytest.approx(
        8 * b * 7 / (450e9 * 64)
    )  # B(N-1)/(W·N²), B = whole array
    half = collective_cost("A2A", b, "X", m, ragged_fraction=moe_ragged_fraction(4, 8))
    assert half.bandwidth_s == pytest.approx(dense.bandwidth_s / 2)  # pop quiz 2: 4 of 8 non-zero
    assert moe_ragged_fraction(16, 8) == 1.0
    assert moe_ragged_fraction(4, 8, exact=True) == pytest.approx(1 - (7 / 8) ** 4)
    with pytest.raises(SpecError):
        collective_cost("AG", b, "X", m, ragged_fraction=0.5)
    with pytest.raises(SpecError):
        collective_cost("A2A", b, "X", m, ragged_fraction=0.0)


def test_permute() -> None:
    c = collective_cost("permute", 1e6, "X", make_mesh("tpu-v5e:16x16", "X=16,Y=16"))
    assert c.bandwidth_s == pytest.approx(1e6 / 4.5e10) and c.latency_s == pytest.approx(1e-6)
    g = collective_cost("permute", 1e6, "X", make_mesh("h100:16", "X=16"))
    assert g.bandwidth_s == pytest.approx(1e6 / 50e9) and g.bottleneck == "leaf (node egress)"


def test_time_for_and_to_dict() -> None:
    c = collective_cost("AG", 1e6, "X", make_mesh("h100:8", "X=8"))
    assert c.time_for(1e6) == pytest.approx(c.time_s)
    assert c.time_for(1e9) == pytest.approx(1e9 * c.seconds_per_byte)
    d = c.to_dict()
    for key in (
        "time_s",
        "wire_bytes_per_chip",
        "latency_bound",
        "bottleneck",
        "seconds_per_byte",
        "formula",
        "tiers",
    ):
        assert key in d
    json.dumps(
        collective_cost("AG", np.array([1.0, 1e9]), "X", make_mesh("h100:8", "X=8")).to_dict()
    )


def test_errors() -> None:
    m = make_mesh("h100:8", "X=8")
    with pytest.raises(PlanError, match="not in the mesh"):
        collective_cost("AG", 1e6, "Y", m)
    with pytest.raises(SpecError, match="non-negative"):
        collective_cost("AG", -1.0, "X", m)
    with pytest.raises(SpecError, match="non-negative"):
        collective_cost("AG", np.array([1.0, np.nan]), "X", m)
    with pytest.raises(SpecError, match="positive"):
        collective_cost("AR", 1.0, "X", m, sharp=True, sharp_speedup=0)


# -- properties --------------------------------------------------------------------------

SPECS = [
    "tpu-v5e:16x16",
    "tpu-v5e:4x8",
    "tpu-v4p:4x4x8",
    "tpu-v5p:8x12x16",
    "tpu-v5p:2x4x6",
    "h100:1024",
    "h100:96",
    "h100:8",
    "2xtpu-v5e:8x16",
    "gb200-nvl72:576",
    "a100:64",
]
KINDS = list(CollectiveKind)


@st.composite
def mesh_and_axes(draw, specs=SPECS):
    system = parse_system(draw(st.sampled_from(specs)))
    n = system.n_chips
    sizes = []
    for _ in range(draw(st.integers(1, 3)) - 1):
        d = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
        sizes.append(d)
        n //= d
    sizes.append(n)
    mesh = make_mesh(system, {f"a{i}": s for i, s in enumerate(sizes)})
    axes = draw(st.lists(st.sampled_from(mesh.axis_names), min_size=1, unique=True))
    return mesh, tuple(axes)


BIG = 1e12  # bytes per chip deep in the bandwidth regime


@settings(max_examples=80, deadline=None)
@given(mesh_and_axes(), st.booleans())
def test_allreduce_is_reducescatter_plus_allgather(ma, sharp_system) -> None:
    mesh, axes = ma
    ar = collective_cost("AR", BIG, axes, mesh, sharp=False)
    rs = collective_cost("RS", BIG, axes, mesh)
    ag = collective_cost("AG", BIG, axes, mesh)
    assert ar.bandwidth_s == pytest.approx(rs.bandwidth_s + ag.bandwidth_s)
    assert ar.latency_s == pytest.approx(rs.latency_s + ag.latency_s)
    if sharp_system:  # in-network reduction never makes it slower
        assert collective_cost("AR", BIG, axes, mesh, sharp=True).time_s <= ar.time_s * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([4, 8, 12, 16, 20, 28, 64, 144, 576]), st.sampled_from(KINDS[:3]))
def test_wraparound_ring_allgather_independent_of_axis_size(n, kind) -> None:
    # sharding.md: T = V/W_ici on a bidirectional ring, whatever |X| (even sizes, bandwidth regime)
    mesh = make_mesh(f"tpu-7x:4x4x{n}", {"X": 16, "Y": n})
    c = collective_cost(kind, BIG, "Y", mesh)
    per = 2 if kind == CollectiveKind.ALL_REDUCE else 1
    assert c.seconds_per_byte == pytest.approx(per / 1.8e11)
    assert "wraparound" in c.bottleneck


@settings(max_examples=80, deadline=None)
@given(
    st.integers(2, 16),
    st.sampled_from(["tpu-v5e", "tpu-v4p"]),
    st.sampled_from(KINDS),
    st.floats(0, 1e10),
)
def test_open_line_never_faster_than_ring(n, chip, kind, nbytes) -> None:
    topo = f"{n}x16" if chip == "tpu-v5e" else f"{n}x4x4"
    ring = make_mesh(parse_system(f"{chip}:{topo}", wraparound=True), {"X": n, "R": 16})
    line = make_mesh(parse_system(f"{chip}:{topo}", wraparound=False), {"X": n, "R": 16})
    assert collective_cost(kind, nbytes, "X", line).time_s >= collective_cost(
        kind, nbytes, "X", ring
    ).time_s * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(
        [
            "tpu-v5e:16x16",
            "tpu-v5e:4x8",
            "tpu-v4p:4x4x8",
            "tpu-v5p:8x12x16",
            "tpu-v5p:2x4x6",
            "tpu-7x:4x4x12",
        ]
    ),
    st.data(),
    st.sampled_from(KINDS[:3]),
)
def test_more_ici_axes_never_slower(spec, data, kind) -> None:
    system = parse_system(spec)
    mesh = make_mesh(system, {d.name.upper(): d.size for d in system.dims})
    names = list(mesh.axis_names)
    axes = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    extra = [a for a in names if a not in axes]
    assume(extra)
    more = (*axes, data.draw(st.sampled_from(extra)))
    assert collective_cost(kind, BIG, more, mesh).time_s <= collective_cost(
        kind, BIG, tuple(axes), mesh
    ).time_s * (1 + 1e-12)


@settings(max_examples=80, deadline=None)
@given(mesh_and_axes(), st.sampled_from(KINDS), st.floats(0, 1e11), st.floats(0, 1e11))
def test_time_monotone_in_bytes(ma, kind, b1, b2) -> None:
    mesh, axes = ma
    lo, hi = sorted((b1, b2))
    assert (
        collective_cost(kind, lo, axes, mesh).time_s <= collective_cost(kind, hi, axes, mesh).time_s
    )


@settings(max_examples=60, deadline=None)
@given(
    mesh_and_axes(), st.sampled_from(KINDS), st.lists(st.floats(0, 1e11), min_size=1, max_size=6)
)
def test_vectorised_equals_scalar(ma, kind, sizes) -> None:
    mesh, axes = ma
    vec = collective_cost(kind, np.array(sizes), axes, mesh)
    assert isinstance(vec.time_s, np.ndarray) and vec.time_s.shape == (len(sizes),)
    for i, b in enumerate(sizes):
        one = collective_cost(kind, b, axes, mesh)
        assert isinstance(one.time_s, float)
        assert vec.time_s[i] == pytest.approx(one.time_s)
        assert vec.bandwidth_s[i] == pytest.approx(one.bandwidth_s)
        assert vec.wire_bytes_per_chip[i] == pytest.approx(one.wire_bytes_per_chip)
        assert bool(vec.latency_bound[i]) == one.latency_bound
        assert vec.time_for(b) == pytest.approx(one.time_s)


# -- CLI ---------------------------------------------------------------------------------


def run_json(capsys, *args: str) -> dict:
    assert main(["collective", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_allgather_h100(capsys) -> None:
    doc = run_json(
        capsys,
        "all-gather",
        "--array",
        "bf16[1024,16384]",
        "--sharding",
        "[B_X, F]",
        "--over",
        "X",
        "--mesh",
        "X=8",
        "--system",
        "h100:8",
    )
    assert doc["time_s"] == pytest.approx(65.2e-6, rel=0.01)
    assert doc["wire_bytes_per_chip"] == pytest.approx(2 * 1024 * 16384 * 7 / 8)
    assert doc["latency_bound"] is False and doc["bottleneck"] == "nvlink"


def test_cli_sharded_bytes(capsys) -> None:
    base = ["--array", "bf16[1024,4096]", "--mesh", "X=4,Y=4,Z=4", "--system", "tpu-v4p:4x4x4"]
    doc = run_json(capsys, "AG", "--sharding", "[B_X, D_Y]", "--over", "X", *base)
    assert doc["bytes_per_chip"] == pytest.approx(2 * 1024 * 4096 / 4) and doc[
        "time_s"
    ] == pytest.approx(23.3e-6, rel=0.01)
    doc = run_json(capsys, "AG", "--sharding", "[B_X, D_Y]", "--over", "XY", *base)
    assert doc["time_s"] == pytest.approx(46.6e-6, rel=0.01)
    doc = run_json(capsys, "AR", "--sharding", "[B_X, D_Y]", "--over", "Z", *base)
    assert doc["bytes_per_chip"] == pytest.approx(2 * 1024 * 4096 / 16) and doc[
        "time_s"
    ] == pytest.approx(11.65e-6, rel=0.01)
    doc = run_json(
        capsys, "A2A", "--bytes", "1M", "--over", "X", "--system", "h100:8"
    )  # default mesh: one axis
    assert doc["group_size"] == 8


def test_cli_text_and_errors(capsys) -> None:
    assert (
        main(
            [
                "collective",
                "RS",
                "--bytes",
                "32M",
                "--over",
                "X",
                "--mesh",
                "X=8,Y=4",
                "--system",
                "tpu-v5e:8x4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "reduce-scatter" in out and "T = max(" in out
    assert (
        main(
            [
                "collective",
                "AG",
                "--array",
                "bf16[1024,16384]",
                "--sharding",
                "[B, F]",
                "--over",
                "X",
                "--mesh",
                "X=8",
                "--system",
                "h100:8",
            ]
        )
        == 2
    )
    assert "does not shard" in capsys.readouterr().err
    assert (
        main(
            [
                "collective",
                "AR",
                "--array",
                "bf16[1024,16384]",
                "--sharding",
                "[B_X, F]",
                "--over",
                "X",
                "--mesh",
                "X=8",
                "--system",
                "h100:8",
            ]
        )
        == 2
    )
    assert (
        main(
            [
                "collective",
                "AG",
                "--bytes",
                "1M",
                "--over",
                "X",
                "--mesh",
                "X=4",
                "--system",
                "h100:8",
            ]
        )
        == 2
    )
    assert "multiply" in capsys.readouterr().err
    assert (
        main(
            [
                "collective",
                "AG",
                "--array",
                "bf16[1001,16]",
                "--sharding",
                "[B_X, F]",
                "--over",
                "X",
                "--mesh",
                "X=8",
                "--system",
                "h100:8",
            ]
        )
        == 2
    )


def test_errors_are_roofline_errors() -> None:
    with pytest.raises(RooflineError):
        collective_cost("AG", 1.0, "X", make_mesh("h100:8", "X=8,Y=2"))
