"""Point-to-point, many-to-one and host transfers, and the network's capacities (issue 20 items 3-4).

Book tpus.md Q5/Q6 and gpus.md Quiz 2-4, from the system records (`core.transfer`) and
through `roofline transfer`; the host memory level of `roofline op` (tpus.md Q3).
"""

from __future__ import annotations

import json

import pytest

from roofline.cli import main
from roofline.cli.op_cmd import result as op_result
from roofline.core import transfer as T
from roofline.core.collectives import IB_SWITCH_BW_BYTES_PER_S
from roofline.errors import PlanError
from roofline.specs.system import parse_system

V5E_4x4 = parse_system("tpu-v5e:4x4")


def test_point_to_point_tpus_q5():
    """bf16[8,128,8192] (1.7e7 B) from (0,0) to (3,3) of a v5e 4x4 (no wraparound): 2 ports x
    4.5e10 -> ~188 µs; 6 hops x 1 µs -> first byte after ~6 µs."""
    t = T.point_to_point(V5E_4x4, "0,0", "3,3", 8 * 128 * 8192 * 2)
    assert (t.hops, t.links) == (6, 2)
    assert t.t_first_byte_s == pytest.approx(6e-6)
    assert t.t_bandwidth_s == pytest.approx(188e-6, rel=0.01)


def test_ring_peer_half_way_round_uses_both_directions():
    v5p = parse_system("tpu-v5p:4x4x4")  # wraparound on every axis of 4
    t = T.point_to_point(v5p, "0,0,0", "2,0,0", 1e9)
    assert (t.hops, t.links) == (2, 2)
    t = T.point_to_point(v5p, "0,0,0", "3,0,0", 1e9)
    assert (t.hops, t.links) == (1, 1)  # one hop back over the wraparound link


def test_gather_and_host_load_tpus_q6():
    """16 GB in the host DRAM of a v5e 4x4, gathered into chip (0,0): PCIe 16 links x 1.6e10 ->
    63 ms; ICI: 15 GB into the corner chip's 2 links x 4.5e10 -> 167 ms."""
    host = T.host_to_hbm(V5E_4x4, 16e9)
    assert host.time_s == pytest.approx(63e-3, rel=0.01)
    g = T.gather_to_one(V5E_4x4, "0,0", 16e9)
    assert g.links == 2
    assert g.t_bandwidth_s == pytest.approx(167e-3, rel=0.01)
    interior = T.gather_to_one(V5E_4x4, "1,1", 16e9)
    assert interior.links == 4  # an interior chip of an open 4x4 has 4 ingress links


def test_gpu_node_gather_gpus_md_quiz2():
    """AllGather of bf16[4096,65536] (512 MiB) on 8xH100: each GPU takes in 7/8 of it over its
    450 GB/s NVLink -> 1.04 ms."""
    g = T.gather_to_one(parse_system("h100:8"), 0, 4096 * 65536 * 2)
    assert g.t_bandwidth_s == pytest.approx(1.04e-3, rel=0.01)


def test_gpu_point_to_point_tiers():
    h = parse_system("h100:1024")
    node = T.point_to_point(h, 0, 7, 1e9)
    assert node.bw_bytes_per_s == 450e9 and node.hops == 1
    su = T.point_to_point(h, 0, 8, 1e9)
    assert su.bw_bytes_per_s == 50e9 and su.hops == 1  # through the GPU's NIC and one leaf
    far = T.point_to_point(h, 0, 1000, 1e9)
    assert far.hops == 3  # leaf, spine, leaf


def test_capacities_gpus_md():
    """H100 node: GPU egress 8·450e9 = 3.6 TB/s = its bisection, NVSwitches 4·64·25e9 = 6.4 TB/s;
    SuperPod: leaf cable 12.8 / switches 25.6 TB/s per SU, spine 51.2 TB/s for 1024 GPUs; 2048
    GPUs need 8 SUs and 32 spine switches."""
    caps = {c.name: c for c in T.capacities(parse_system("h100:1024"))}
    assert caps["nvlink"].cable_bw_bytes_per_s == pytest.approx(3.6e12)
    assert caps["nvlink"].bisection_bw_bytes_per_s == pytest.approx(3.6e12)
    assert caps["nvlink"].switch_bw_bytes_per_s == pytest.approx(6.4e12)
    assert caps["leaf"].cable_bw_bytes_per_s == pytest.approx(12.8e12)
    assert caps["leaf"].switch_bw_bytes_per_s == pytest.approx(25.6e12)
    assert caps["spine"].cable_bw_bytes_per_s == pytest.approx(51.2e12)
    assert caps["spine"].switch_bw_bytes_per_s == pytest.approx(51.2e12)
    big = {c.name: c for c in T.capacities(parse_system("h100:2048"))}
    assert big["spine"].switch_bw_bytes_per_s / IB_SWITCH_BW_BYTES_PER_S == pytest.approx(32)


def test_torus_bisection():
    """An ICI axis of n cut in half: each of the N/n rows crosses once (open) or twice (ring)."""
    caps = {c.name: c for c in T.capacities(parse_system("tpu-v5e:16x16"))}
    # x (outer, ring of 16): 16 rows x 2 links x 4.5e10 x 2 directions
    assert caps["x"].bisection_bw_bytes_per_s == pytest.approx(16 * 2 * 4.5e10 * 2)


def test_host_level_of_op_tpus_q3():
    """tpus.md Q3: weights in host DRAM, streamed over PCIe: compute-bound for B > C/W_pcie. The
    book computes it with 1.6e10 (57,500); the v6e record is the 3.2e10 the same chapter states
    for v6e, which halves it."""
    res = op_result("bf16[B,D] @ bf16[D,F]", {"B": 1024, "D": 8192, "F": 32768}, "tpu-v6e")
    host = next(lv for lv in res["levels"] if lv["level"] == "host")
    assert host["critical_batch"] == pytest.approx(9.2e14 / 3.2e10)
    assert host["critical_batch"] * 3.2e10 / 1.6e10 == pytest.approx(57500)
    assert host["bound"] == "memory"


def test_system_file_sets_host_fields(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(
        'base = "tpu-v5e:4x4"\nhost_bw_bytes_per_s = 3.2e10\nhost_dram_bytes_per_chip = 1e11\n'
    )
    s = parse_system(str(f))
    assert (s.host_bw_bytes_per_s, s.host_dram_bytes_per_chip) == (3.2e10, 1e11)
    assert T.host_to_hbm(s, 16e9).time_s == pytest.approx(T.host_to_hbm(V5E_4x4, 16e9).time_s / 2)
    assert V5E_4x4.host_dram_bytes_per_chip == pytest.approx(450 * 2**30 / 8, rel=0.01)


def test_cli(capsys):
    argv = ["transfer", "--system", "tpu-v5e:4x4", "--bytes", "16777216", "--from", "0,0"]
    assert main([*argv, "--to", "3,3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["transfer"]["hops"] == 6
    assert main(["transfer", "--system", "h100:1024", "--capacities"]) == 0
    assert "switches 6.4e+12 B/s" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--bytes", "1G", "--from", "0,0"],
        ["--bytes", "1G", "--from", "0,9", "--to", "1,1"],
        ["--from", "0,0", "--to", "1,1"],
        ["--system", "2xtpu-v5e:16x16", "--bytes", "1G", "--from", "0,0", "--to", "1,1"],
        [],
    ],
)
def test_cli_errors_are_one_paragraph(argv, capsys):
    assert main(["transfer", *argv]) == 2
    err = capsys.readouterr().err
    assert "Rule:" in err and "Traceback" not in err


def test_bad_bytes():
    with pytest.raises(PlanError):
        T.host_to_hbm(V5E_4x4, -1.0)


def test_one_chip_moves_nothing(capsys):
    one = parse_system("tpu-v5e:1x1")
    assert T.gather_to_one(one, "0,0", 1e9).time_s == 0.0
    assert T.point_to_point(one, "0,0", "0,0", 1e9).links == 0
    assert main(["transfer", "--system", "tpu-v5e:1x1", "--capacities"]) == 0
    assert "no network tiers" in capsys.readouterr().out
    assert T.gather_to_one(parse_system("h100:1"), 0, 1e9).time_s == 0.0


# --------------------------------------------------------------- DCN between TPU slices


def test_dcn_whole_slice_is_the_per_chip_dcn_share():
    """training.md: a v5p host has ~25 GB/s of DCN for its 4 chips, 6.25e9 per TPU: a slice
    sending to another, every chip its 1/n, streams at n·6.25e9 — the same as the collectives
    module's permute over the dcn axis."""
    from roofline.core.collectives import collective_cost
    from roofline.core.mesh import make_mesh

    s = parse_system("2xtpu-v5p:4x4x4")
    t = T.point_to_point(s, "0", "1", 1e9)
    assert t.kind == "dcn" and t.bw_bytes_per_s == pytest.approx(64 * 6.25e9)
    assert t.t_bandwidth_s == pytest.approx(1e9 / (64 * 6.25e9))
    c = collective_cost("permute", 1e9 / 64, "dcn", make_mesh(s, {"dcn": 2, "ici": 64}))
    assert c.bandwidth_s == pytest.approx(t.t_bandwidth_s)
    assert t.t_first_byte_s == s.dim("dcn").hop_latency_s


@pytest.mark.parametrize(
    "spec,chip_bw",
    [
        ("2xtpu-v5p:4x4x4", min(1.6e10, 4 * 6.25e9)),  # host link binds: 16 GB/s < 25 GB/s NIC
        ("2xtpu-v5e:16x16", min(1.6e10, 8 * 3.125e9)),  # 8 chips per v5e host: 25 GB/s NIC
    ],
)
def test_dcn_one_chip_alone(spec, chip_bw):
    """One chip to a chip of another slice: its host link and its host's whole DCN NIC
    (tpus.md: TPU -> PCIe -> host NIC -> DCN -> host -> PCIe -> HBM)."""
    s = parse_system(spec)
    a = "0:" + ",".join("0" for _ in s.topology)
    b = "1:" + ",".join("1" for _ in s.topology)
    t = T.point_to_point(s, a, b, 1e9)
    assert t.bw_bytes_per_s == pytest.approx(chip_bw)
    assert t.time_s == pytest.approx(s.dim("dcn").hop_latency_s + 1e9 / chip_bw)


def test_dcn_same_slice_is_ici():
    one = T.point_to_point(parse_system("tpu-v5p:4x4x4"), "0,0,0", "2,1,0", 1e9)
    two = T.point_to_point(parse_system("2xtpu-v5p:4x4x4"), "1:0,0,0", "1:2,1,0", 1e9)
    assert two.to_dict() == one.to_dict()


def test_dcn_bad_coordinates(capsys):
    s = parse_system("2xtpu-v5p:4x4x4")
    with pytest.raises(PlanError, match="slice:coordinates"):
        T.point_to_point(s, "2:0,0,0", "0:0,0,0", 1e9)
    with pytest.raises(PlanError, match="both are whole slices"):
        T.point_to_point(s, "0:0,0,0", "1", 1e9)
    argv = [
        "transfer",
        "--system",
        "2xtpu-v5p:4x4x4",
        "--bytes",
        "1G",
        "--from",
        "0,0,0",
        "--to",
        "1",
    ]
    assert main(argv) == 2
    assert "Traceback" not in capsys.readouterr().err
