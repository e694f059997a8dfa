"""The sharded-einsum algebra (book sharding.md) and the `roofline matmul` command.

Notation parsing, the four cases, FSDP / tensor-parallel matmuls forward and backward,
AllToAll, input errors, and properties (FLOPs and bytes conservation, monotone costs,
vectorised sizes equal scalar calls). Most tests use the book's cost model for collectives
on one link of bandwidth W: AllGather / ReduceScatter V/W, AllReduce 2V/W, AllToAll V/(4W)
with V the per-chip bytes of roofline.core.collectives' convention; a few use real systems.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from roofline.cli import main
from roofline.core.collectives import CollectiveKind, collective_cost
from roofline.core.mesh import make_mesh
from roofline.core.sharding import (
    Spec,
    backward_specs,
    bytes_in_notation,
    parse_einsum,
    parse_spec,
    plan_einsum,
    plan_training_einsum,
    spec_from_partition_spec,
    validate_spec,
)
from roofline.errors import ShardingError

AG, RS, AR, A2A = (
    CollectiveKind.ALL_GATHER,
    CollectiveKind.REDUCE_SCATTER,
    CollectiveKind.ALL_REDUCE,
    CollectiveKind.ALL_TO_ALL,
)
W_ICI = 1e11  # bytes/s, any value: the book's rules are ratios
FACTOR = {AG: 1.0, RS: 1.0, AR: 2.0, A2A: 0.25}


def book_comm(kind, nbytes, axes):
    return FACTOR[kind] * nbytes / W_ICI


FREE = {"peak_flops_per_s": 1e30, "hbm_bw_bytes_per_s": 1e30}  # comms-only regime


def plan(expr: str, sizes: dict, mesh: dict, comm_fn=book_comm, **kw):
    a, b, c = parse_einsum(expr, list(mesh))
    return plan_einsum(a, b, c, sizes, mesh, comm_fn, **kw)


def kinds(option) -> list[tuple[str, tuple[str, ...], str]]:
    return [(c.kind.value, c.axes, c.tensor) for c in option.comms]


# ------------------------------------------------------------------------------------------
# Notation
# ------------------------------------------------------------------------------------------


def test_parse_multi_axis_subscript():
    s = parse_spec("A[I_XY, J]", ["X", "Y", "Z"])
    assert s.name == "A" and s.dims == ("I", "J")
    assert s.axes == (("X", "Y"), ())
    assert str(s) == "A[I_XY, J]"
    assert s.local_shape({"I": 128, "J": 2048}, {"X": 2, "Y": 8, "Z": 2}) == (8, 2048)


def test_parse_braced_long_axis_names():
    s = parse_spec("In[B_{data,fsdp}, D_tensor]", ["data", "fsdp", "tensor"])
    assert s.axes == (("data", "fsdp"), ("tensor",))
    assert str(s) == "In[B_{data,fsdp}, D_{tensor}]"
    assert parse_spec(str(s), ["data", "fsdp", "tensor"]) == s


def test_parse_unreduced_suffix():
    s = parse_spec("Out[B, F]{U_X}", ["X", "Y"])
    assert s.unreduced == ("X",) and s.axes == ((), ())
    assert str(s) == "Out[B, F]{U_X}"
    assert parse_spec("C[I_X, K]{U_YZ}", ["X", "Y", "Z"]).unreduced == ("Y", "Z")


def test_spec_from_partition_spec_matches_notation():
    dims = ("B", "D")
    assert spec_from_partition_spec("In", dims, ("X", None)) == parse_spec(
        "In[B_X, D]", ["X", "Y"], name="In"
    )
    assert spec_from_partition_spec("In", dims, (("X", "Y"), None)) == parse_spec(
        "In[B_XY, D]", ["X", "Y"]
    )
    assert spec_from_partition_spec("W", dims, (None,)).axes == (
        (),
        (),
    )  # short spec: trailing None
    assert spec_from_partition_spec("W", dims, ()).axes == ((), ())
    with pytest.raises(ShardingError, match="more entries"):
        spec_from_partition_spec("W", dims, ("X", None, "Y"))


@pytest.mark.parametrize("op", ["*", "·", "@", "x"])
def test_parse_einsum_operators(op):
    a, b, c = parse_einsum(f"In[B_X, D] {op} W[D_X, F] -> Out[B_X, F]", ["X", "Y"])
    assert (a.name, b.name, c.name) == ("In", "W", "Out")
    assert b.axes == (("X",), ())


@pytest.mark.parametrize(
    "text, match",
    [
        ("In[B_X, D", "cannot read sharded array"),
        ("In[B_X,, D]", "empty dimension"),
        ("In(B_X, D)", "cannot read sharded array"),
        ("A[I_XQ, J]", "cannot read mesh axes"),
    ],
)
def test_malformed_spec(text, match):
    with pytest.raises(ShardingError, match=match):
        parse_spec(text, ["X", "Y"])


@pytest.mark.parametrize(
    "text, match",
    [
        ("In[B_X, D] * W[D, F]", "no output"),
        ("In[B_X, D] -> Out[B_X, D]", "two operands"),
        ("A[I, J] * B[J, K] * C[K, L] -> D[I, L]", "two operands"),
    ],
)
def test_malformed_einsum(text, match):
    with pytest.raises(ShardingError, match=match):
        parse_einsum(text, ["X", "Y"])


def test_validate_spec_errors():
    mesh = {"X": 4, "Y": 2}
    with pytest.raises(ShardingError, match=r"In\[B_X, D_X\] uses mesh axis X twice") as e:
        validate_spec(parse_spec("In[B_X, D_X]", list(mesh)), {"B": 8, "D": 8}, mesh)
    assert "In[B, D_X]" in str(e.value) and "In[B_X, D]" in str(e.value)  # both fixes
    with pytest.raises(ShardingError, match="'Z'.*not in the mesh"):
        validate_spec(parse_spec("In[B_Z, D]", list(mesh)), {"B": 8, "D": 8}, mesh)
    with pytest.raises(ShardingError, match="'D'.*has no size"):
        validate_spec(parse_spec("In[B_X, D]", list(mesh)), {"B": 8}, mesh)
    with pytest.raises(ShardingError, match="B=6 .*not divisible by X=4"):
        validate_spec(parse_spec("In[B_X, D]", list(mesh)), {"B": 6, "D": 8}, mesh)
    validate_spec(
        parse_spec("In[B_X, D]", list(mesh)), {"B": 6, "D": 8}, mesh, check_divisible=False
    )


# ------------------------------------------------------------------------------------------
# The four cases
# ------------------------------------------------------------------------------------------

SIZES = {"I": 1024, "J": 2048, "K": 4096}
MESH = {"X": 4, "Y": 8}


@pytest.mark.parametrize(
    "expr, shards",
    [
        ("A[I_X, J] * B[J, K_Y] -> C[I_X, K_Y]", 32),
        ("A[I, J] * B[J, K] -> C[I, K]", 1),
        ("A[I_X, J] * B[J, K] -> C[I_X, K]", 4),
        ("A[I, J] * B[J, K_Y] -> C[I, K_Y]", 8),
        ("A[I_XY, J] * B[J, K] -> C[I_XY, K]", 32),
        # replicated inputs, sharded output: each chip slices its inputs and computes its block
        ("A[I, J] * B[J, K] -> C[I_X, K_Y]", 32),
    ],
)
def test_case1_no_communication(expr, shards):
    p = plan(expr, SIZES, MESH)
    assert p.case.startswith("1")
    assert p.collectives == () and p.comm_time_s == 0
    assert p.flops_per_chip == pytest.approx(2 * 1024 * 2048 * 4096 / shards)


def test_case2_gather_or_reduce_both_costed():
    p = plan("A[I, J_X] * B[J, K] -> C[I, K]", SIZES, MESH, **FREE)
    assert p.case.startswith("2")
    got = sorted(kinds(o) for o in p.options)
    assert [("all-gather", ("X",), "A")] in got  # book: AllGather_X A, then multiply
    assert [("all-reduce", ("X",), "C")] in got  # or slice B locally, multiply, AllReduce
    gather = next(o for o in p.options if kinds(o) == [("all-gather", ("X",), "A")])
    assert gather.comms[0].bytes_per_chip == 1024 * 2048 * 2  # the whole A per chip
    assert str(gather.lhs) == "A[I, J]"


@pytest.mark.parametrize("D, winner", [(1536, "all-gather"), (2560, "all-reduce")])
def test_q4_rule_allreduce_wins_iff_D_above_2B(D, winner):
    # sharding.md Q4, comms-bound regime: X[B, D] · Y[D_X, F]; Strategy 1 AllGather Y (2DF bytes,
    # T = 2DF/W) vs Strategy 2 local matmul + AllReduce (2BF bytes, T = 4BF/W): 2 wins iff D > 2B
    B = 1024
    p = plan("X[B, D] * Y[D_X, F] -> Z[B, F]", {"B": B, "D": D, "F": 8192}, {"X": 8}, **FREE)
    assert [c.kind.value for c in p.collectives] == [winner]
    t = {o.comms[0].kind.value: o.comm_time_s for o in p.options}
    assert t["all-gather"] == pytest.approx(2 * D * 8192 / W_ICI)
    assert t["all-reduce"] == pytest.approx(4 * B * 8192 / W_ICI)


def test_case3_allreduce_or_reducescatter():
    p = plan("A[I, J_X] * B[J_X, K] -> C[I, K]", SIZES, MESH, **FREE)
    assert p.case.startswith("3")
    assert kinds(p.best) == [("all-reduce", ("X",), "C")]
    assert p.collectives[0].bytes_per_chip == 1024 * 4096 * 2
    assert str(p.best.natural_out) == "C[I, K]{U_X}"
    q = plan("A[I, J_X] * B[J_X, K] -> C[I, K_X]", SIZES, MESH, **FREE)
    assert kinds(q.best) == [("reduce-scatter", ("X",), "C")]
    assert q.collectives[0].bytes_per_chip == 1024 * 4096 * 2  # the unreduced input
    assert p.comm_time_s == pytest.approx(2 * q.comm_time_s)  # T_AR = 2 T_RS
    assert q.flops_per_chip == pytest.approx(2 * 1024 * 2048 * 4096 / 4)


def test_case4_rejected_with_both_fixes():
    with pytest.raises(ShardingError) as e:
        plan("A[I_X, J] * B[J, K_X] -> C[I_X, K_X]", SIZES, MESH, allow_conflict=False)
    msg = str(e.value)
    assert "case 4" in msg
    assert "AllGather_X A first (A[I, J] * B[J, K_X] -> C[I, K_X])" in msg
    assert "AllGather_X B first (A[I_X, J] * B[J, K] -> C[I_X, K])" in msg


def test_case4_resolved_when_allowed():
    p = plan("A[I_X, J] * B[J, K_X] -> C[I, K_X]", SIZES, MESH, **FREE)
    assert p.case.startswith("4")
    assert kinds(p.best) == [("all-gather", ("X",), "A")]


def test_alltoall_moves_a_subscript():
    p = plan("A[I_X, J] * B[J, K] -> C[I, K_X]", SIZES, MESH, **FREE)
    assert kinds(p.best) == [("all-to-all", ("X",), "C")]
    c = p.collectives[0]
    assert (c.before, c.after) == ("C[I_X, K]", "C[I, K_X]")
    assert c.bytes_per_chip == 1024 / 4 * 4096 * 2


def test_multi_axis_collective():
    p = plan("A[I, J_XY] * B[J_XY, K] -> C[I, K]", SIZES, MESH, **FREE)
    assert kinds(p.best) == [("all-reduce", ("X", "Y"), "C")]
    assert p.flops_per_chip == pytest.approx(2 * 1024 * 2048 * 4096 / 32)


def test_reorder_of_axes_is_not_a_free_slice():
    # C[I_Y] -> C[I_XY]: the rows a chip needs live elsewhere, so it is gathered then sliced
    p = plan("A[I_Y, J] * B[J, K] -> C[I_XY, K]", SIZES, MESH, **FREE)
    assert kinds(p.best) == [("all-gather", ("Y",), "C")]


# ------------------------------------------------------------------------------------------
# FSDP and tensor parallelism, forward and backward (book training.md)
# ------------------------------------------------------------------------------------------

FSDP = "In[B_X, D] * W[D_X, F] -> Out[B_X, F]"
D, F = 8192, 32768


def test_fsdp_forward_large_batch_gathers_weights():
    B = 2**20  # 1M tokens
    p = plan(
        FSDP,
        {"B": B, "D": D, "F": F},
        {"X": 16},
        peak_flops_per_s=1.97e14,
        hbm_bw_bytes_per_s=8.2e11,
    )
    assert kinds(p.best) == [("all-gather", ("X",), "W")]
    assert p.collectives[0].bytes_per_chip == 2 * D * F
    assert p.flops_per_chip == pytest.approx(2 * B * D * F / 16)
    assert [("all-gather", ("X",), "In"), ("reduce-scatter", ("X",), "Out")] in [
        kinds(o) for o in p.options
    ]


@pytest.mark.parametrize("factor, gathers", [(0.8, "In"), (1.25, "W")])
def test_fsdp_forward_weights_vs_activations_threshold(factor, gathers):
    # comms only: AllGather W moves 2DF, gathering In + ReduceScatter Out moves 2B(D + F):
    # activations are cheaper below B* = DF/(D + F)
    b_star = D * F / (D + F)
    B = 16 * round(factor * b_star / 16)
    p = plan(FSDP, {"B": B, "D": D, "F": F}, {"X": 16}, **FREE)
    assert p.collectives[0].tensor == gathers


def test_tp_second_matmul_allreduce_or_reducescatter():
    sizes, mesh = {"B": 4096, "F": F, "D": D}, {"X": 2, "Y": 8}
    p = plan("In[B, F_Y] * W[F_Y, D] -> Out[B, D]", sizes, mesh, **FREE)
    assert kinds(p.best) == [("all-reduce", ("Y",), "Out")]
    q = plan("In[B, F_Y] * W[F_Y, D] -> Out[B, D_Y]", sizes, mesh, **FREE)
    assert kinds(q.best) == [("reduce-scatter", ("Y",), "Out")]
    assert q.best.out.axes == ((), ("Y",))


def test_fsdp_backward_reduce_scatters_weight_gradient():
    a, b, c = parse_einsum(FSDP, ["X"])
    (l1, r1, o1), (l2, r2, o2) = backward_specs(a, b, c)
    assert f"{l1} * {r1} -> {o1}" == "dOut[B_X, F] * W[D_X, F] -> dIn[B_X, D]"
    assert f"{l2} * {r2} -> {o2}" == "In[B_X, D] * dOut[B_X, F] -> dW[D_X, F]"
    sizes = {"B": 2**20, "D": D, "F": F}
    fwd, d_in, d_w = plan_training_einsum(
        a, b, c, sizes, {"X": 16}, book_comm, peak_flops_per_s=1.97e14, hbm_bw_bytes_per_s=8.2e11
    )
    # the forward AllGather of W is transposed into a ReduceScatter of dW (same bytes, same axes)
    assert kinds(fwd.best) == [("all-gather", ("X",), "W")]
    assert kinds(d_w.best) == [("reduce-scatter", ("X",), "dW")]
    assert d_w.collectives[0].bytes_per_chip == fwd.collectives[0].bytes_per_chip == 2 * D * F
    assert d_w.collectives[0].phase == "backward"
    # dIn = dOut · W is case 4 (X on B and on D): the weights are gathered again
    assert d_in.case.startswith("4")
    assert kinds(d_in.best) == [("all-gather", ("X",), "W")]
    for p in (fwd, d_in, d_w):
        assert p.flops_per_chip == pytest.approx(2 * 2**20 * D * F / 16)


def test_real_system_comm_fn():
    mesh = make_mesh("tpu-v5e:16x16", "X=16,Y=16")

    def comm(kind, nbytes, axes):
        return collective_cost(kind, nbytes, axes, mesh).time_s

    p = plan(
        FSDP,
        {"B": 2**20, "D": D, "F": F},
        mesh.shape,
        comm_fn=comm,
        peak_flops_per_s=1.97e14,
        hbm_bw_bytes_per_s=8.2e11,
    )
    # v5e: 16-chip ring with wraparound, 2 x 4.5e10 B/s: T = V / W_bidi
    assert p.comm_time_s == pytest.approx(2 * D * F / 9e10, rel=1e-6)
    assert p.replication == 16  # Out[B_X, F] is replicated over Y
    assert p.time_lower_s == max(p.compute_time_s, p.memory_time_s, p.comm_time_s)
    assert p.time_upper_s == pytest.approx(p.compute_time_s + p.memory_time_s + p.comm_time_s)


@pytest.mark.parametrize(
    "expr, sizes, match",
    [
        (
            "In[B_X, D] * W[D, F] -> Out[B_X, F]",
            {"B": 100, "D": 8, "F": 8},
            r"B=100 .*not divisible by X=16",
        ),
        (
            "In[B_XY, D] * W[D, F] -> Out[B_XY, F]",
            {"B": 128, "D": 8, "F": 8},
            r"B=128 .*not divisible by XY=256",
        ),
        ("In[B_Z, D] * W[D, F] -> Out[B, F]", {"B": 16, "D": 8, "F": 8}, r"'Z'.*not in the mesh"),
        ("In[B, D] * W[D, F] -> Out[B, F]", {"B": 16, "D": 8}, r"'F'.*no size"),
        (
            "In[B, D] * W[D, F] -> Out[B, F, E]",
            {"B": 16, "D": 8, "F": 8, "E": 2},
            "appears in neither input",
        ),
        ("In[B, D] * W[D, F] -> Out[B]", {"B": 16, "D": 8, "F": 8}, "one input only"),
        (
            "In[B, D] * W[D, F] -> Out[B_X, F_X]",
            {"B": 16, "D": 8, "F": 16},
            "uses mesh axis X twice",
        ),
    ],
)
def test_input_errors(expr, sizes, match):
    with pytest.raises(ShardingError, match=match):
        plan(expr, sizes, {"X": 16, "Y": 16})


# ------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------

TEMPLATES = [
    (("I", "J"), ("J", "K"), ("I", "K")),
    (("B", "I", "J"), ("B", "J", "K"), ("B", "I", "K")),
    (("I", "J"), ("K", "J"), ("K", "I")),
]
AXES = ("X", "Y", "Z")


@st.composite
def einsums(draw):
    lhs_d, rhs_d, out_d = draw(st.sampled_from(TEMPLATES))
    mesh = {
        "X": draw(st.sampled_from([1, 2, 4])),
        "Y": draw(st.sampled_from([2, 4])),
        "Z": draw(st.sampled_from([1, 2])),
    }

    def spec(name, dims):
        where = {a: draw(st.sampled_from((*dims, None))) for a in AXES}
        return Spec(name, dims, tuple(tuple(a for a in AXES if where[a] == d) for d in dims))

    lhs, rhs, out = spec("A", lhs_d), spec("B", rhs_d), spec("C", out_d)
    sizes = {d: 32 * draw(st.integers(1, 6)) for d in {*lhs_d, *rhs_d}}
    return lhs, rhs, out, sizes, mesh


def _plan_or_reject(lhs, rhs, out, sizes, mesh, **kw):
    try:
        return plan_einsum(
            lhs,
            rhs,
            out,
            sizes,
            mesh,
            book_comm,
            peak_flops_per_s=1e12,
            hbm_bw_bytes_per_s=1e11,
            **kw,
        )
    except ShardingError:
        assume(False)


PROP = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)


@PROP
@given(einsums())
def test_flops_summed_over_chips_equal_unsharded_times_replication(e):
    lhs, rhs, out, sizes, mesh = e
    p = _plan_or_reject(lhs, rhs, out, sizes, mesh)
    chips = math.prod(mesh.values())
    full = 2 * math.prod(sizes.values())
    for o in p.options:
        # the operands meet with every shared dim split identically
        for d in set(o.lhs.dims) & set(o.rhs.dims):
            assert o.lhs.axes_of(d) == o.rhs.axes_of(d)
        nat = o.natural_out
        split = math.prod(mesh[a] for a in nat.used_axes + nat.unreduced)
        replication = chips / split  # chips that compute the same block
        assert o.flops_per_chip * chips == pytest.approx(full * replication)
        # same count from the local operand shapes: 2 x product of the local dim sizes
        local = {
            d: n
            for s in (o.lhs, o.rhs)
            for d, n in zip(s.dims, s.local_shape(sizes, mesh), strict=True)
        }
        assert o.flops_per_chip == pytest.approx(2 * math.prod(local.values()))
        assert o.out.axes == out.axes and set(o.out.unreduced) == set(out.unreduced)


@PROP
@given(einsums())
def test_replicated_inputs_compute_only_their_output_block(e):
    lhs, rhs, out, sizes, mesh = e
    lhs = Spec("A", lhs.dims, tuple(() for _ in lhs.dims))
    rhs = Spec("B", rhs.dims, tuple(() for _ in rhs.dims))
    p = _plan_or_reject(lhs, rhs, out, sizes, mesh)
    assert p.collectives == ()
    split = math.prod(mesh[a] for a in out.used_axes)
    assert p.flops_per_chip == pytest.approx(2 * math.prod(sizes.values()) / split)


@PROP
@given(einsums(), st.sampled_from(["int8", "bf16", "fp32"]))
def test_bytes_per_chip_times_chips_over_replication_is_the_array(e, dtype):
    lhs, _, _, sizes, mesh = e
    s = Spec(lhs.name, lhs.dims, lhs.axes, dtype=dtype)
    r = bytes_in_notation(s, sizes, mesh)
    chips = math.prod(mesh.values())
    full = math.prod(sizes[d] for d in s.dims) * {"int8": 1, "bf16": 2, "fp32": 4}[dtype]
    assert r["replication"] == pytest.approx(chips / math.prod(mesh[a] for a in s.used_axes))
    assert r["total_bytes"] / r["replication"] == pytest.approx(full)
    assert r["bytes_per_device"] * chips / r["replication"] == pytest.approx(full)


@PROP
@given(einsums(), st.sampled_from(["I", "J", "K", "B"]), st.integers(2, 4))
def test_costs_monotone_in_sizes(e, dim, k):
    lhs, rhs, out, sizes, mesh = e
    assume(dim in sizes)
    p = _plan_or_reject(lhs, rhs, out, sizes, mesh)
    q = _plan_or_reject(lhs, rhs, out, {**sizes, dim: sizes[dim] * k}, mesh)
    assert [o.describe() for o in p.options] == [o.describe() for o in q.options]
    for a, b in zip(p.options, q.options, strict=True):
        assert b.comm_time_s >= a.comm_time_s * (1 - 1e-12)
        assert b.flops_per_chip >= a.flops_per_chip
        assert b.hbm_bytes_per_chip >= a.hbm_bytes_per_chip
    assert q.time_lower_s >= p.time_lower_s * (1 - 2e-3)  # the argmin breaks ties by 1e-3 x the sum


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(einsums(), st.lists(st.integers(1, 64), min_size=3, max_size=3))
def test_array_sizes_equal_scalar_calls(e, ks):
    lhs, rhs, out, sizes, mesh = e
    dim = sorted(sizes)[0]
    arr = np.array([32 * k for k in ks], dtype=float)
    vec = _plan_or_reject(lhs, rhs, out, {**sizes, dim: arr}, mesh)
    for i, v in enumerate(arr):
        one = _plan_or_reject(lhs, rhs, out, {**sizes, dim: float(v)}, mesh)
        assert int(np.asarray(vec.choice)[i]) == one.choice
        for attr in (
            "flops_per_chip",
            "hbm_bytes_per_chip",
            "comm_time_s",
            "compute_time_s",
            "memory_time_s",
            "time_lower_s",
            "time_upper_s",
        ):
            assert np.broadcast_to(getattr(vec, attr), arr.shape)[i] == pytest.approx(
                getattr(one, attr)
            ), attr


# ------------------------------------------------------------------------------------------
# `roofline matmul`
# ------------------------------------------------------------------------------------------

CLI = ["matmul", FSDP, "--mesh", "X=16,Y=16", "--system", "tpu-v5e:16x16"]


def run_json(capsys, argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_json_forward(capsys):
    d = run_json(capsys, [*CLI, "--dims", "B=1M,D=8192,F=32768"])
    assert d["command"] == "matmul" and d["schema_version"]
    for key in (
        "flops_per_chip",
        "hbm_bytes_per_chip",
        "collectives",
        "compute_time_s",
        "memory_time_s",
        "comm_time_s",
        "time_lower_s",
        "time_upper_s",
        "alternatives",
        "case",
        "strategy",
        "local_shapes",
        "replication",
    ):
        assert key in d, key
    assert d["case"].startswith("2")
    assert [(c["kind"], c["axes"], c["tensor"], c["name"]) for c in d["collectives"]] == [
        ("all-gather", ["X"], "W", "AllGather_X")
    ]
    c = d["collectives"][0]
    assert (
        c["bytes"] == 2 * D * F
        and c["before"] == "W[D_X, F]"
        and c["after"] == "W[D, F]"
        and c["why"]
    )
    assert c["time_s"] == pytest.approx(2 * D * F / 9e10, rel=1e-6)
    assert d["local_shapes"] == {"In": [62500, 8192], "W": [512, 32768], "Out": [62500, 32768]}
    assert d["flops_per_chip"] == pytest.approx(2 * 1e6 * D * F / 16)
    assert d["compute_time_s"] == pytest.approx(d["flops_per_chip"] / 1.97e14, rel=0.02)
    assert d["time_lower_s"] == max(d["compute_time_s"], d["memory_time_s"], d["comm_time_s"])
    assert d["replication"] == 16
    assert d["chosen_is_textbook"] is True
    (alt,) = d["alternatives"]
    assert [c["name"] for c in alt["collectives"]] == ["AllGather_X", "ReduceScatter_X"]
    assert alt["time_lower_s"] > d["time_lower_s"]
    for key in ("comm_time_s", "compute_time_s", "memory_time_s", "time_upper_s", "strategy"):
        assert key in alt


def test_cli_json_backward(capsys):
    d = run_json(capsys, [*CLI, "--dims", "B=1M,D=8192,F=32768", "--backward"])
    d_in, d_w = d["backward"]
    assert d_in["expr"] == "dOut[B_X, F] * W[D_X, F] -> dIn[B_X, D]"
    assert [c["name"] for c in d_in["collectives"]] == ["AllGather_X"]
    assert [(c["name"], c["tensor"]) for c in d_w["collectives"]] == [("ReduceScatter_X", "dW")]
    assert d_w["collectives"][0]["phase"] == "backward"
    assert d["transposes"] == [
        "forward AllGather_X(W[D_X, F]) <-> backward ReduceScatter_X(dW[D, F]{U_X})"
    ]
    for b in (d_in, d_w):
        assert {
            "flops_per_chip",
            "collectives",
            "alternatives",
            "time_lower_s",
            "local_shapes",
        } <= set(b)


def test_cli_small_batch_prefers_gathering_activations(capsys):
    d = run_json(capsys, [*CLI, "--dims", "B=4096,D=8192,F=32768"])
    assert [c["name"] for c in d["collectives"]] == ["AllGather_X", "ReduceScatter_X"]
    assert d["chosen_is_textbook"] is False
    assert d["textbook_strategy"] == "AllGather_X W, then local matmul"
    assert d["alternatives"][0]["strategy"] == d["textbook_strategy"]


def test_cli_text(capsys):
    assert main([*CLI, "--dims", "B=4096,D=8192,F=32768", "--backward"]) == 0
    out = capsys.readouterr().out
    for s in (
        "case      2",
        "AllGather_X",
        "ReduceScatter_X",
        "Local shapes per chip",
        "[256, 8192]",
        "FLOPs/chip / peak",
        "lower bound",
        "chosen because",
        "textbook strategy",
        "backward 2",
        "Transposes:",
    ):
        assert s in out, s


@pytest.mark.parametrize(
    "expr, dims, match",
    [
        ("A[I_X, J] * B[J, K_X] -> C[I_X, K_X]", "I=1024,J=2048,K=4096", "AllGather_X B first"),
        (FSDP, "B=100,D=8192,F=32768", "B=100 .*not divisible by X=16"),
        (FSDP, "B=4096,D=8192", "'F'.*no size"),
        ("In[B_Q, D] * W[D, F] -> Out[B, F]", "B=16,D=8,F=8", "'Q'.*not in the mesh"),
        ("In[B_X, D_X] * W[D, F] -> Out[B_X, F]", "B=16,D=16,F=8", "In\\[B, D_X\\]"),
        ("In[B_X, D * W[D, F] -> Out[B_X, F]", "B=16,D=8,F=8", "cannot read"),
        (FSDP, "B=4096,D=8192,F=32768,Q=2", "does not use"),
    ],
)
def test_cli_errors_exit_2_one_paragraph(capsys, expr, dims, match):
    assert (
        main(["matmul", expr, "--dims", dims, "--mesh", "X=16,Y=16", "--system", "tpu-v5e:16x16"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("roofline matmul: error: ") and err.count("\n") == 1
    assert "Traceback" not in err
    import re

    assert re.search(match, err), err
