"""Unit tests of the HLO collective parser on scrubbed HLO from real compiles.

The fixtures in tests/data/hlo/*.txt were produced by this file's `regenerate()` with
jax[cpu]==0.10.2 on 8 simulated CPU devices (python tests/verify/test_hlo_parse.py --regen);
they are plain text and need no JAX to read. Small hand-written snippets cover the
syntaxes this XLA build does not print (async pairs, older explicit operand types).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from roofline.errors import VerifyError
from roofline.verify.hlo import (
    collectives_in,
    compact,
    mesh_axes_of_groups,
    mesh_axes_of_pairs,
    multiplicities,
    observe_text,
    parse_module,
    parse_replica_groups,
    parse_source_target_pairs,
    scrub,
    summarize,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "hlo"

# name -> (builder kwargs, mesh)  — the fixtures' programs (tiny dims: D=64, F=128, N=4, K=2, H=16, B=8, T=16)
FIXTURES = {
    "matmul_rs": (("matmul", "A[I,J_X] * B[J_X,K] -> C[I_X,K]"), (("X", 8),)),
    "matmul_gather": (("matmul", "A[I_X,J] * B[J,K_X]"), (("X", 8),)),
    "fsdp4_tp2": (("layer", "fsdp=4,tp=2", {}), (("fsdp", 4), ("tensor", 2))),
    "scan_fsdp8": (("layer", "fsdp=8", {"n_layers": 2}), (("fsdp", 8),)),
    "moe_ep4_fsdp2": (("moe", "ep=4,fsdp=2", {}), (("fsdp", 2), ("expert", 4))),
    "sp4_fsdp2": (("layer", "fsdp=2,sp=4", {}), (("fsdp", 2), ("seq", 4))),
}


WITH_FINAL = ("matmul_rs", "matmul_gather", "fsdp4_tp2")  # final HLO is large: kept for these only


def _read(name: str, which: str) -> str:
    if which == "final" and name not in WITH_FINAL:
        which = "post_spmd"
    return (DATA / f"{name}.{which}.txt").read_text()


def _obs(name: str):
    return observe_text(
        _read(name, "post_spmd"), _read(name, "final"), FIXTURES[name][1], cost={"flops": 0.0}
    )


# ----------------------------------------------------------------------------- replica groups


def test_explicit_groups():
    assert parse_replica_groups("replica_groups={{0,1},{2,3}}, x=1", 4) == ((0, 1), (2, 3))
    assert parse_replica_groups("replica_groups={}, to_apply=%a", 4) == ((0, 1, 2, 3),)
    assert parse_replica_groups("channel_id=1", 2) == ((0, 1),)


def test_iota_groups():
    assert parse_replica_groups("replica_groups=[2,4]<=[8], dims", 8) == (
        (0, 1, 2, 3),
        (4, 5, 6, 7),
    )
    # [4,2]<=[2,4]T(1,0): iota(8).reshape(2,4).T -> rows (0,4),(1,5),(2,6),(3,7)
    assert parse_replica_groups("replica_groups=[4,2]<=[2,4]T(1,0), x", 8) == (
        (0, 4),
        (1, 5),
        (2, 6),
        (3, 7),
    )
    assert parse_replica_groups("replica_groups=[2,4]<=[4,2]T(1,0)", 8) == (
        (0, 2, 4, 6),
        (1, 3, 5, 7),
    )


def test_mesh_groups():
    s = "replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, use_global_device_ids=true"
    assert parse_replica_groups(s, 8) == ((0, 1, 2, 3), (4, 5, 6, 7))
    s = "replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, x"
    assert parse_replica_groups(s, 8) == ((0, 4), (1, 5), (2, 6), (3, 7))
    s = "replica_groups=mesh['axis_0'=1,'axis_1'=8] {'axis_1'}"
    assert parse_replica_groups(s, 8) == (tuple(range(8)),)
    # device order given explicitly: devices = iota([2,4]).T reshaped to the mesh [4,2]
    s = "replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_1'}, use_global_device_ids=true"
    assert parse_replica_groups(s, 8) == ((0, 4), (1, 5), (2, 6), (3, 7))
    s = "replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}, x"
    assert parse_replica_groups(s, 8) == ((0, 1, 2, 3), (4, 5, 6, 7))
    with pytest.raises(VerifyError):
        parse_replica_groups("replica_groups=garbage", 8)


def test_groups_to_mesh_axes():
    mesh = (("fsdp", 2), ("tensor", 4))
    assert mesh_axes_of_groups(((0, 1, 2, 3), (4, 5, 6, 7)), mesh) == (("tensor",), True)
    assert mesh_axes_of_groups(((0, 4), (1, 5), (2, 6), (3, 7)), mesh) == (("fsdp",), True)
    assert mesh_axes_of_groups((tuple(range(8)),), mesh) == (("fsdp", "tensor"), True)
    assert mesh_axes_of_groups(((0, 1), (2, 3), (4, 5), (6, 7)), mesh) == (("tensor",), False)
    assert mesh_axes_of_pairs(((0, 1), (1, 2), (2, 3), (3, 0)), mesh) == ("tensor",)
    assert mesh_axes_of_pairs(((0, 0), (1, 1)), mesh) == ()
    assert parse_source_target_pairs("source_target_pairs={{0,1},{1,0}}, x") == ((0, 1), (1, 0))


# ----------------------------------------------------------------------------- hand-written syntax


_ASYNC = """HloModule m

ENTRY %main (p: f32[4,8]) -> f32[32,8] {
  %p = f32[4,8]{1,0} parameter(0)
  %ags = (f32[4,8]{1,0}, f32[32,8]{1,0}) all-gather-start(f32[4,8]{1,0} %p), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  %agd = f32[32,8]{1,0} all-gather-done((f32[4,8]{1,0}, f32[32,8]{1,0}) %ags)
  %ars = f32[32,8]{1,0} all-reduce-start(f32[32,8]{1,0} %agd), channel_id=2, replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
  %ard = f32[32,8]{1,0} all-reduce-done(f32[32,8]{1,0} %ars)
  %cps = (f32[32,8]{1,0}, f32[32,8]{1,0}, u32[], u32[]) collective-permute-start(f32[32,8]{1,0} %ard), channel_id=3, source_target_pairs={{0,4},{4,0}}
  ROOT %cpd = f32[32,8]{1,0} collective-permute-done((f32[32,8]{1,0}, f32[32,8]{1,0}, u32[], u32[]) %cps)
}
"""


def test_async_pairs_count_once_and_inline_operand_types():
    cs = collectives_in(_ASYNC, (("a", 2), ("b", 4)))
    assert [c.kind for c in cs] == ["all-gather", "all-reduce", "collective-permute"]
    ag, ar, cp = cs
    assert ag.async_pair and ag.bytes_per_device == 32 * 8 * 4 and ag.group_size == 8
    assert ag.mesh_axes == ("a", "b")
    assert ar.bytes_per_device == 32 * 8 * 4 and ar.mesh_axes == ("b",)
    assert cp.bytes_per_device == 32 * 8 * 4 and cp.mesh_axes == ("a",)


_TUPLE_RS = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[8,4], q: f32[16]) -> (f32[1,4], f32[16], bf16[4,2]) {
  %p = f32[8,4]{1,0} parameter(0)
  %q = f32[16]{0} parameter(1)
  %r = bf16[8,4]{1,0} parameter(2)
  %pid = u32[] partition-id()
  %c = s32[] constant(0)
  %ar = (f32[8,4]{1,0}, f32[16]{0}) all-reduce(%p, %q), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %g0 = f32[8,4]{1,0} get-tuple-element(%ar), index=0
  %g1 = f32[16]{0} get-tuple-element(%ar), index=1
  %b0 = f32[8,4]{1,0} bitcast(%g0)
  %ds = f32[1,4]{1,0} dynamic-slice(%b0, %c, %c), dynamic_slice_sizes={1,4}
  %rs = bf16[4,2]{1,0} reduce-scatter(%r), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, to_apply=%add
  ROOT %t = (f32[1,4]{1,0}, f32[16]{0}, bf16[4,2]{1,0}) tuple(%ds, %g1, %rs)
}
"""


def test_tuple_all_reduce_split_and_normalised():
    cs = collectives_in(_TUPLE_RS, (("x", 8),))
    assert [(c.kind, c.tuple_index, c.normalized_from) for c in cs] == [
        ("reduce-scatter", 0, "all-reduce"),
        ("all-reduce", 1, None),
        ("reduce-scatter", None, None),
    ]
    assert cs[0].bytes_per_device == 8 * 4 * 4  # reduce-scatter counts its input
    assert cs[1].bytes_per_device == 16 * 4
    assert cs[2].bytes_per_device == 8 * 4 * 2 and cs[2].dtype == "bf16" and cs[2].shape == (8, 4)
    raw = collectives_in(_TUPLE_RS, (("x", 8),), normalize=False)
    assert raw[0].kind == "all-reduce"


# ----------------------------------------------------------------------------- real compiles


def test_fixtures_are_scrubbed():
    for p in DATA.glob("*.txt"):
        t = p.read_text()
        assert (
            "/home/" not in t
            and "/tmp/" not in t
            and "/work/" not in t
            and "site-packages" not in t
        ), p.name


def test_matmul_reduce_scatter_is_all_reduce_plus_slice_on_cpu():
    o = _obs("matmul_rs")
    [c] = o.collectives
    assert (c.kind, c.normalized_from, c.mesh_axes, c.dtype) == (
        "reduce-scatter",
        "all-reduce",
        ("X",),
        "bf16",
    )
    assert c.bytes_per_device == 64 * 64 * 2  # I x K bf16 partial sums, the RS input
    [f] = o.collectives_final
    assert f.dtype == "f32"  # CPU does the bf16 all-reduce in f32


def test_matmul_case4_gathers():
    [c] = _obs("matmul_gather").collectives
    assert c.kind == "all-gather" and c.mesh_axes == ("X",) and c.bytes_per_device == 64 * 64 * 2


def test_fsdp_tp_layer():
    o = _obs("fsdp4_tp2")
    kinds = {(r["kind"], r["mesh_axes"]) for r in summarize(o.collectives)}
    assert ("all-gather", ("fsdp",)) in kinds
    assert ("reduce-scatter", ("fsdp",)) in kinds
    assert ("all-reduce", ("tensor",)) in kinds
    assert all(c.axes_complete for c in o.collectives)
    # combined (tuple) all-reduces in the final HLO are split per element
    assert any(c.tuple_size > 1 for c in o.collectives_final)


def test_scan_multiplies_by_trip_count():
    o = _obs("scan_fsdp8")
    assert o.loops and all(t == 2 for _, t in o.loops)
    assert all(c.count in (1, 2) for c in o.collectives)
    mod = parse_module(_read("scan_fsdp8", "post_spmd"))
    mult, loops = multiplicities(mod)
    assert loops and all(
        t == 2 for _, t, _ in loops
    )  # read from the loop condition (no backend_config)
    in_loop = [c for c in o.collectives if c.count == 2]
    assert in_loop and {c.kind for c in in_loop} >= {"all-gather", "reduce-scatter"}
    # dot FLOPs count the body twice: 2 layers x (fwd + 2 bwd) of the same matmuls
    assert o.dot_flops_per_device > 0


_WHILE = """HloModule w

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4]{0} get-tuple-element(%p), index=1
  %ag = f32[32]{0} all-gather(%x), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %y = f32[4]{0} slice(%ag), slice={[0:4]}
  ROOT %t = (s32[], f32[4]{0}) tuple(%j, %y)
}

%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[4]) -> (s32[], f32[4]) {
  %x = f32[4]{0} parameter(0)
  %z = s32[] constant(0)
  %t = (s32[], f32[4]{0}) tuple(%z, %x)
  ROOT %w = (s32[], f32[4]{0}) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
}
"""


def test_trip_count_from_backend_config_wins_over_condition():
    [c] = collectives_in(_WHILE, (("x", 8),))
    assert c.count == 3 and c.bytes_per_device == 32 * 4
    [c] = collectives_in(
        _WHILE.replace(', backend_config={"known_trip_count":{"n":"3"}}', ""), (("x", 8),)
    )
    assert c.count == 5


def test_moe_all_to_all():
    o = _obs("moe_ep4_fsdp2")
    a2a = [c for c in o.collectives if c.kind == "all-to-all"]
    assert len(a2a) >= 4 and all(c.mesh_axes == ("expert",) for c in a2a)


def test_sequence_parallel_permutes_and_gathers():
    o = _obs("sp4_fsdp2")
    assert any(c.kind == "all-gather" and c.mesh_axes == ("seq",) for c in o.collectives)


def test_scrub():
    t = scrub('op_name="x" source_file="/home/u/proj/a.py" /tmp/abc/x.txt ok')
    assert "/home" not in t and "/tmp" not in t and "ok" in t


# ----------------------------------------------------------------------------- regeneration


def regenerate() -> None:  # pragma: no cover - run by hand
    import os

    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    import tempfile

    from roofline.specs.model import ModelSpec, MoESpec
    from roofline.verify.program import build_matmul, build_train_step

    tiny = ModelSpec(
        name="tiny", n_layers=1, d_model=64, d_ff=128, n_heads=4, n_kv_heads=2, d_head=16, vocab=256
    )
    moe = tiny.with_(name="tiny-moe", moe=MoESpec(n_experts=4, top_k=2, d_ff_expert=64))
    DATA.mkdir(parents=True, exist_ok=True)
    for name, (spec, _mesh) in FIXTURES.items():
        if spec[0] == "matmul":
            prog = build_matmul(spec[1], sizes={"I": 64, "J": 64, "K": 64})
        else:
            model = moe if spec[0] == "moe" else tiny
            prog = build_train_step(model, spec[1], batch=8, seq=16, dtype="bf16", **spec[2])
        with tempfile.TemporaryDirectory() as d:
            c = prog.lower().compile(
                compiler_options={"xla_dump_to": d, "xla_dump_hlo_pass_re": "spmd-partitioning"}
            )
            post = next(Path(d).glob("*after_spmd-partitioning*.txt")).read_text()
        (DATA / f"{name}.post_spmd.txt").write_text(compact(post))
        if name in WITH_FINAL:
            (DATA / f"{name}.final.txt").write_text(compact(c.as_text()))
        print("wrote", name)


if __name__ == "__main__":  # pragma: no cover
    if "--regen" in sys.argv:
        regenerate()
