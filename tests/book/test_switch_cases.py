"""Collectives bounded by switch capacity (issue 20 item 4, gpus.md's SuperPod table, Quiz 4).

A switched tier's group of P chips shares its switches' capacity S: a collective gets
`min(w, S/P)` per chip there (core.collectives). With the book's records the cables bind
first (node: 6.4 TB/s of NVSwitch over 3.6 TB/s of GPU egress; leaf 25.6 over 12.8; spine
51.2 over 51.2), so nothing changes; Appendix B / Quiz 4 Q4's spine of 16 x 1.6 = 25.6 TB/s
(`[switch_bw] spine = 25.6e12`, the shipped dgx-h100-superpod-spine-switches) binds.
"""

from __future__ import annotations

import pytest

from roofline.core import transfer as T
from roofline.core.collectives import collective_cost, switch_capacity, switched_bw
from roofline.core.mesh import make_mesh
from roofline.errors import SpecError
from roofline.specs.system import parse_system

POD = parse_system("h100:1024")
SWITCHED = parse_system("dgx-h100-superpod-spine-switches")
TAPERED = parse_system("dgx-h100-superpod-tapered-spine")  # the per-GPU cable lowered instead
D, F = 8192, 32768


def test_book_records_never_switch_bound():
    """gp-10: an H100 node's 4 NVSwitches carry 6.4 TB/s > 8·450e9 = 3.6 TB/s of GPU egress;
    the SuperPod's leaf (25.6 TB/s per SU) and spine (51.2 TB/s) switches exceed their cables."""
    for d in POD.dims:
        w, capped = switched_bw(POD, d)
        assert capped is None and w == d.bw_bytes_per_s
    assert switch_capacity(POD, POD.dim("nvlink")) == pytest.approx(6.4e12)
    c = collective_cost("AG", 2 * 4096 * 65536, "X", make_mesh("h100:8", "X=8"))
    assert c.time_s * 1e3 == pytest.approx(1.04, rel=0.02)  # gp-11, unchanged
    # gp-19: the precise per-level AllGather bandwidths over the whole pod, leaf-bound (413 GB/s)
    c = collective_cost("AG", 1e9, "X", make_mesh(POD, "X=1024"))
    assert c.bottleneck == "leaf (node egress)"
    assert 1 / c.seconds_per_byte == pytest.approx(400e9 * 32 / 31)


def test_quiz4_q4_spine_allreduce_from_switches():
    """Quiz 4 Q4: 25.6 TB/s of spine switches over 4 SUs -> 6.4 TB/s each; with SHARP,
    AllReduce(bf16[D, F_Y]{U_X}) at Y = 256 takes 2DF/6.4e12 (the cables alone: 2DF/12.8e12)."""
    full = 2 * D * F
    mesh = make_mesh(SWITCHED, {"X": 4, "Y": 256})
    c = collective_cost("AR", full / 256, "X", mesh, sharp=True)
    assert c.bottleneck == "spine (switch-bound)"
    assert c.time_s == pytest.approx(full / 6.4e12)
    assert "w = S/P = 2.56e+13/1024 = 2.5e+10" in c.formula
    cables = collective_cost("AR", full / 256, "X", make_mesh(POD, {"X": 4, "Y": 256}), sharp=True)
    assert cables.time_s == pytest.approx(full / 12.8e12)


@pytest.mark.parametrize("kind", ["AG", "RS", "AR", "A2A"])
def test_switches_and_tapered_cable_agree_for_collectives(kind):
    """The two readings of Appendix B's spine give every collective the same bandwidth term:
    25.6e12/1024 = 25e9 per GPU from the switches, or a 25e9 cable."""
    for axes, sizes in (("X", {"X": 1024}), ("X", {"X": 4, "Y": 256}), ("Y", {"X": 4, "Y": 256})):
        a = collective_cost(kind, 1e9, axes, make_mesh(SWITCHED, sizes))
        b = collective_cost(kind, 1e9, axes, make_mesh(TAPERED, sizes))
        assert a.seconds_per_byte == pytest.approx(b.seconds_per_byte)


def test_alltoall_across_the_pod_is_spine_bound():
    """gpus.md: an AllToAll is not hierarchical, everything leaving a group crosses its tier.
    Over all 1024 GPUs the leaf carries (1024-8)/1024 of each buffer at 50e9 per GPU; the spine
    carries (1024-256)/1024 at min(50e9, S/1024): the cables leave the leaf binding, the
    25.6 TB/s spine switches move the bound there (0.75/25e9 > 0.992/50e9)."""
    B = 1e9
    free = collective_cost("A2A", B, "X", make_mesh(POD, "X=1024"))
    assert free.bottleneck == "leaf (node egress)"
    assert free.bandwidth_s == pytest.approx(B * (1024 - 8) / 1024 / 50e9)
    bound = collective_cost("A2A", B, "X", make_mesh(SWITCHED, "X=1024"))
    assert bound.bottleneck == "spine (switch-bound)"
    assert bound.bandwidth_s == pytest.approx(B * 0.75 / 25e9)


def test_capacities_report_the_switch_bound():
    caps = {c.name: c for c in T.capacities(SWITCHED)}
    spine = caps["spine"]
    assert spine.switch_bound and spine.collective_bw_bytes_per_s == pytest.approx(25e9)
    assert spine.cable_bw_bytes_per_s == pytest.approx(51.2e12)  # the cables are unchanged
    assert spine.bisection_bw_bytes_per_s == pytest.approx(25.6e12)  # min(cable, switches)
    assert not caps["leaf"].switch_bound and not caps["nvlink"].switch_bound
    # a single flow is not capped by the aggregate: 50 GB/s through the GPU's NIC
    assert T.point_to_point(SWITCHED, 0, 1000, 1e9).bw_bytes_per_s == 50e9


def test_reference_switches_scale_with_the_nic():
    """The SuperPod shape with ports as fast as the node's NICs: a B300 pod (800 GB/s per node)
    stays cable-bound (its spine switches carry 1024 x 100e9)."""
    b300 = parse_system("b300:1024")
    assert switch_capacity(b300, b300.dim("spine")) == pytest.approx(1024 * 100e9)
    assert all(switched_bw(b300, d)[1] is None for d in b300.dims)


def test_switch_bw_bad_input(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('base = "h100:1024"\n[switch_bw]\ncore = 1e12\n')
    with pytest.raises(SpecError, match="switch_bw names dim 'core'"):
        parse_system(p)
    p.write_text('base = "h100:1024"\nswitch_bw = 3\n')
    with pytest.raises(SpecError, match="switch_bw is a table"):
        parse_system(p)
    p.write_text('base = "h100:1024"\n[switch_bw]\nspine = -1\n')
    with pytest.raises(SpecError, match="switch_bw.spine"):
        parse_system(p)
