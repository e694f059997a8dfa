"""The book's worked collective answers, through the public API (systems, meshes, collective_cost).

Cases: tests/data/book_cases_collective.yaml (verbatim copy of the public cases of kind
`collective`, plus the network cases of kind `gpu`). Each answer value is compared within
the case's tolerance (relative; 0 means exact up to float rounding).

Values not computable by a model of peak bandwidth (skipped on purpose):
- sh-06 measured_time_us (680 µs profile), sh-07 measured_us (8 µs): measurements.
- gp-10 switch_capacity_bytes_per_s (NVSwitch port capacity): checked in
  tests/book/test_transfer_cases.py and test_switch_cases.py (GPU egress binds first).
- gp-11 practical_ms (1.5 ms observed), gp-18 peak_achieved_bytes_per_s (370 GB/s) and
  achieved_bytes_per_s_58mb (150 GB/s): measurements.
- gp-20 two_node_vs_one_node_slowdown (4.5): the book divides its leading-order forms
  B/(8·450e9) and B/(M·W_node) at M = 2, where the exact form B(M-1)/(M²W_node) is half of
  B/(M·W_node); we test the leading-order ratio from the system's bandwidths and the exact
  formula separately (exact ratio 2.57x).
- gp-21 time_ms_y16 (0.67 ms): the book's "roughly" form 2DF/(Y·50 GB/s) drops the ring's
  (D-1)/D for the D = 256/Y nodes the gather spans; we check our exact time × D/(D-1).
- sh-13 symbolic strings and the bidirectional speedups are large-D limits; we check the
  exact per-link bytes and the exact ratios times D/(D-1) where the limit drops it.
Book cases not here: gp-35 (not in the public case file); gp-15 (switch counts of larger
pods, not modelled).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from roofline.core.collectives import SHARP_PRACTICAL_SPEEDUP, collective_cost
from roofline.core.mesh import make_mesh
from roofline.specs.system import parse_system
from roofline.units import dtype_bytes

CASES = {
    c["id"]: c
    for c in yaml.safe_load(
        (Path(__file__).parent.parent / "data" / "book_cases_collective.yaml").read_text()
    )
}


def check(case_id: str, actual: dict[str, float]) -> None:
    case = CASES[case_id]
    tol = case["tolerance"] or 1e-9
    for key, value in actual.items():
        want = case["answer"][key]
        if isinstance(want, bool) or isinstance(value, bool):
            assert bool(value) == bool(want), (case_id, key, value, want)
        else:
            assert value == pytest.approx(float(want), rel=tol), (case_id, key, value, want)


def test_case_file_is_verbatim_subset() -> None:
    src = (
        yaml.safe_load(Path("/work/shared/reference/book_cases.yaml").read_text())
        if Path("/work/shared/reference/book_cases.yaml").exists()
        else None
    )
    if src is None:
        pytest.skip("reference file not present")
    by_id = {c["id"]: c for c in src}
    for cid, c in CASES.items():
        assert by_id[cid] == c
    collective_ids = {c["id"] for c in src if c["kind"] == "collective"}
    assert collective_ids <= set(CASES)


def test_sh06_allgather_v5e_no_wraparound() -> None:
    # sharding.md pop quiz 2: AllGather_Y([E_Y, F]) on v5e {X:8, Y:4}, E=2048, F=8192 bf16
    E, F = 2048, 8192
    total = E * F * dtype_bytes("bf16")
    mesh = make_mesh("tpu-v5e:8x4", {"X": 8, "Y": 4})
    open_line = collective_cost("all-gather", total, "Y", mesh)
    ideal = collective_cost(
        "all-gather",
        total,
        "Y",
        make_mesh(parse_system("tpu-v5e:8x4", wraparound=True), {"X": 8, "Y": 4}),
    )
    assert "open line" in open_line.bottleneck and "wraparound" in ideal.bottleneck
    check(
        "sh-06",
        {
            "per_device_bytes": total / mesh.size("Y"),
            "total_bytes": total,
            "ideal_time_us": ideal.time_s * 1e6,
            "no_wraparound_time_us": open_line.time_s * 1e6,
        },
    )


def test_sh07_latency_bound_small_allgather() -> None:
    E = F = 256
    total = E * F * dtype_bytes("bf16")
    mesh = make_mesh("tpu-v5e:8x4", "X=8,Y=4")
    c = collective_cost("all-gather", total, "Y", mesh)
    hops = round(c.latency_s / mesh.system.dim("y").hop_latency_s)
    assert c.latency_bound
    check(
        "sh-07",
        {
            "shard_bytes": total / 4,
            "per_hop_transfer_us": c.bandwidth_s / hops * 1e6,
            "hops": hops,
            "estimate_us": c.time_s * 1e6,
        },
    )


def test_sh09_v4p_cube() -> None:
    B, D = 1024, 4096
    full = 2 * B * D
    mesh = make_mesh("tpu-v4p:4x4x4", {"X": 4, "Y": 4, "Z": 4})
    ag_x = collective_cost(
        "AG", full / mesh.size("Y"), "X", mesh
    )  # AllGather_X([B_X, D_Y]) moves bytes/Y
    ag_xy = collective_cost("AG", full, "XY", mesh)
    ar_z = collective_cost("AR", full / mesh.size("XY"), "Z", mesh)
    assert not (ag_x.latency_bound or ag_xy.latency_bound or ar_z.latency_bound)
    check(
        "sh-09",
        {
            "allgather_x_us": ag_x.time_s * 1e6,
            "allgather_xy_us": ag_xy.time_s * 1e6,
            "allreduce_z_us": ar_z.time_s * 1e6,
            "latency_bound_us": ag_xy.latency_s * 1e6,
        },
    )


def test_sh13_ring_traffic_per_link() -> None:
    # N x N matrix on a D-device ring; one-way ring = the book's no-wraparound model
    Dn, N = 16, 1024
    V = N * N * 4.0  # fp32 scalars
    one_way = make_mesh(parse_system("tpu-v5e:16x16", wraparound=False), "X=16,Y=16")
    bidi = make_mesh("tpu-v5e:16x16", "X=16,Y=16")
    W = one_way.system.dim("y").bw_bytes_per_s
    ag1 = collective_cost("AG", V, "Y", one_way)
    a2a1 = collective_cost("A2A", V / Dn, "Y", one_way)  # per-chip buffer = V / D
    ag2 = collective_cost("AG", V, "Y", bidi)
    a2a2 = collective_cost("A2A", V / Dn, "Y", bidi)
    # scalars across one link: AG N²(1-1/D), AllToAll N²/2 (1-1/D)
    assert ag1.bandwidth_s * W / 4 == pytest.approx(N**2 * (1 - 1 / Dn))
    assert a2a1.bandwidth_s * W / 4 == pytest.approx(N**2 / 2 * (1 - 1 / Dn))
    corr = Dn / (Dn - 1)  # the book's speedups are D >> 1 limits
    check(
        "sh-13",
        {
            "ag_over_a2a_unidirectional": ag1.time_s / a2a1.time_s,
            "ag_bidirectional_speedup": ag1.time_s / ag2.time_s * corr,
            "a2a_bidirectional_speedup": a2a1.time_s / a2a2.time_s * corr,
            "ag_over_a2a_bidirectional": ag2.time_s / a2a2.time_s,
        },
    )


def test_sh14_alltoall_quarter_of_allgather_and_nd_formula() -> None:
    V = 64e6
    for n in (4, 8, 16):
        mesh = make_mesh(f"tpu-v4p:{n}x4x4", {"X": n, "Y": 4, "Z": 4})
        ag = collective_cost("AG", V, "X", mesh)
        a2a = collective_cost("A2A", V / n, "X", mesh)
        check("sh-14", {"alltoall_over_allgather": a2a.time_s / ag.time_s})
    # notes: ND mesh T = V·max(A,B,C)/(4·N·W_ici)
    mesh = make_mesh("tpu-v4p:8x4x4", {"X": 8, "Y": 4, "Z": 4})
    W_bidi = 2 * mesh.system.chip.ici_link_bw_bytes_per_s
    c = collective_cost("A2A", V / 128, "XYZ", mesh)
    assert c.bandwidth_s == pytest.approx(V * 8 / (4 * 128 * W_bidi))


def test_in16_latency_bound_threshold() -> None:
    # inference.md: 4.5e10 B/s one way, 1 µs per hop, 8-way sharding -> 8 x 45 kB
    mesh = make_mesh("tpu-v4p:8x4x4", {"X": 8, "Y": 4, "Z": 4})
    assert mesh.system.dim("x").bw_bytes_per_s == 4.5e10 and mesh.system.dim("x").wraparound
    B, D = 16, 8192
    act = B * D * dtype_bytes("int8")
    c = collective_cost("AG", act, "X", mesh)
    check(
        "in-16",
        {
            "buffer_threshold_bytes": c.latency_bound_below_bytes,
            "activation_bytes": act,
            "latency_bound": c.latency_bound,
        },
    )
    # rule: latency-bound when Y > B·D/45000
    for Y in (2, 4, 8, 16):
        m = make_mesh(f"tpu-v4p:{Y}x4x4", {"Y": Y, "R": 16})
        assert collective_cost("AG", act, "Y", m).latency_bound == (Y > B * D / 45000)


def test_gp10_node_bandwidth() -> None:
    system = parse_system("h100:8")
    nv = system.dim("nvlink")
    check(
        "gp-10",
        {
            "gpu_bytes_per_s": nv.bw_bytes_per_s,
            "node_bytes_per_s": nv.bw_bytes_per_s * nv.size,
            "bisection_bytes_per_s": nv.bw_bytes_per_s * nv.size,
        },
    )


def test_gp11_node_allgather() -> None:
    D, F = 4096, 65536
    total = D * F * dtype_bytes("bf16")
    c = collective_cost("AG", total, "X", make_mesh("h100:8", "X=8"))
    assert c.bottleneck == "nvlink"
    check("gp-11", {"bytes": total, "time_ms": c.time_s * 1e3})


def test_gp18_array_and_sharp_gain() -> None:
    array = 8192 * 3584 * dtype_bytes("bf16")
    mesh = make_mesh("h100:8", "X=8")
    ring = collective_cost("AR", array, "X", mesh)
    sharp = collective_cost(
        "AR", array, "X", mesh, sharp=True, sharp_speedup=SHARP_PRACTICAL_SPEEDUP
    )
    gain = ring.time_s / sharp.time_s - 1
    measured_peak = CASES["gp-18"]["answer"]["peak_achieved_bytes_per_s"]  # an input measurement
    check(
        "gp-18",
        {
            "array_bytes": array,
            "sharp_gain": gain,
            "sharp_effective_bytes_per_s": measured_peak * (1 + gain),
        },
    )


def test_gp19_fat_tree_levels() -> None:
    c = collective_cost("AG", 1e9, "X", make_mesh("h100:1024", "X=1024"))
    by = {t.name: t.bytes_per_s for t in c.tiers}
    assert c.bottleneck == "leaf (node egress)"
    check(
        "gp-19",
        {
            "node_bytes_per_s": by["nvlink"],
            "leaf_bytes_per_s": by["leaf (node egress)"],
            "spine_bytes_per_s": by["spine"],
            "effective_bytes_per_s": c.algo_bw_bytes_per_s,
        },
    )


def test_gp20_cross_node_alltoall() -> None:
    b = 1e8  # per-GPU buffer
    for M in (2, 4, 8, 16):
        mesh = make_mesh(f"h100:{8 * M}", {"X": 8 * M})
        c = collective_cost("A2A", b, "X", mesh)
        B = 8 * M * b  # the book's B is the whole array
        assert c.bandwidth_s == pytest.approx(
            B * (M - 1) / (M**2 * 400e9)
        )  # "cost: B (M-1)/(M^2 W_node)"
        check("gp-20", {"effective_per_gpu_bytes_per_s": b * (M - 1) / M / c.bandwidth_s})
    # leading-order forms the book divides: B/(8·W_gpu) in one node vs B/(M·W_node) over M = 2 nodes
    w_gpu = parse_system("h100:8").dim("nvlink").bw_bytes_per_s
    w_node = parse_system("h100:16").dim("leaf").bw_bytes_per_s * 8
    check("gp-20", {"two_node_vs_one_node_slowdown": (1 / (2 * w_node)) / (1 / (8 * w_gpu))})
    # exact model, same total array: 2.57x
    B = 8e9
    one = collective_cost("A2A", B / 8, "X", make_mesh("h100:8", "X=8")).time_s
    two = collective_cost("A2A", B / 16, "X", make_mesh("h100:16", "X=16")).time_s
    assert two / one == pytest.approx((1 / (4 * 400e9)) / (7 / (64 * 450e9)))


def test_gp21_allgather_with_inner_axis_over_one_su() -> None:
    D, F = 8192, 32768
    full = 2 * D * F
    system = parse_system("h100:256")
    for Y in (1, 2, 4, 8):
        c = collective_cost("AG", full / Y, "X", make_mesh(system, {"X": 256 // Y, "Y": Y}))
        assert c.bottleneck == "leaf (node egress)"
        check("gp-21", {"time_ms_y_le_8": c.time_s * 1e3})
    for Y in (16, 32, 64):
        X = 256 // Y
        c = collective_cost("AG", full / Y, "X", make_mesh(system, {"X": X, "Y": Y}))
        # formula_y_gt_8: 2DF/(Y·50e9), exact with the ring factor (X-1)/X over the X nodes spanned
        assert c.time_s == pytest.approx(full / (Y * 50e9) * (X - 1) / X)
        if Y == 16:
            check("gp-21", {"time_ms_y16": c.time_s * X / (X - 1) * 1e3})


def test_gp22_two_node_allgather_is_node_bound() -> None:
    c = collective_cost("AG", 1e9, "X", make_mesh("h100:16", "X=16"))
    by = {t.name: t.bytes_per_s for t in c.tiers}
    assert c.bottleneck == "nvlink"  # "node level"
    check(
        "gp-22",
        {
            "node_level_effective_bytes_per_s": by["nvlink"],
            "cross_node_effective_bytes_per_s": by["leaf (node egress)"],
        },
    )


def test_gp23_spine_sharp_allreduce() -> None:
    # Quiz 4 Q4 counts 25.6 TB/s of spine switch capacity (25 GB/s per GPU): the tapered-spine reading
    D, F = 8192, 32768
    full = 2 * D * F
    for system in (
        parse_system("h100:1024", tier_bw={"spine": 25e9}),
        parse_system("dgx-h100-superpod-tapered-spine"),
    ):
        mesh = make_mesh(system, {"X": 4, "Y": 256})
        c = collective_cost("AR", full / 256, "X", mesh, sharp=True)
        assert c.bottleneck == "spine"
        assert c.time_s == pytest.approx(full / 6.4e12)  # time_formula: 2DF/6.4e12
        check("gp-23", {"allreduce_bytes_per_s": full / c.time_s})
    assert math.isclose(
        parse_system("h100:1024").dim("spine").bw_bytes_per_s, 50e9
    )  # default: the 51.2 TB/s table
