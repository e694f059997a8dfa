"""`roofline verify`: compile a plan with JAX/XLA on simulated CPU devices and diff what the
compiler emitted against what the algebra predicts (collectives and FLOPs per device).

    roofline verify --model tiny-llama --plan fsdp=4,tp=2 --devices 8
    roofline verify --matmul "A[I,J_X] * B[J_X,K] -> C[I,K]" --dims I=256,J=512,K=256 --mesh X=8

The table has one row per (collective kind, mesh axes): predicted and observed bytes per
device per step, counts, the ratio and a status — `agree` (within --bytes-tol, default 5%),
a NAMED deviation with its excess bytes (XLA's own choices, recognised from the data), or
DISAGREE with the unexplained bytes. Exit status: 0 when everything agrees or is explained,
1 when something is unexplained, 2 on bad input.

The devices are XLA's simulated host devices: this command sets
XLA_FLAGS=--xla_force_host_platform_device_count=N (and JAX_PLATFORMS=cpu) before jax is
imported. If jax was already initialised with fewer devices (a notebook, an embedding
program) it stops with an error instead.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from roofline.cli._common import add_json, emit, parse_assignments
from roofline.core.rules import parse_degrees
from roofline.errors import PlanError, VerifyError
from roofline.progress import bar

NAME = "verify"
HELP = "compile a plan with JAX/XLA on simulated devices and diff its collectives and FLOPs against the algebra"
# The stack the compiled program runs on: verify compiles with JAX/XLA, so by default the
# algebra is priced with the option policy of the JAX/XLA stack (specs/frameworks/maxtext.toml).
XLA_STACK = "maxtext"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default="tiny-llama", help="model preset or file (default tiny-llama)"
    )
    p.add_argument(
        "--plan", default=None, help='strategy degrees, e.g. "fsdp=4,tp=2" (dp, fsdp, tp, sp, ep)'
    )
    p.add_argument(
        "--matmul",
        metavar="EXPR",
        default=None,
        help='instead of a model: one sharded matmul in the book notation, e.g. "A[I,J_X] * B[J_X,K] -> C[I,K]"',
    )
    p.add_argument(
        "--dims", default="", help="matmul dim sizes, e.g. I=256,J=512,K=256 (default 256 each)"
    )
    p.add_argument(
        "--mesh",
        default="",
        help="matmul mesh axes, e.g. X=8 or X=2,Y=4 (default: X=8, or X=2,Y=4)",
    )
    p.add_argument(
        "--devices",
        type=int,
        default=8,
        help="simulated CPU devices (default 8); must equal the plan's chips",
    )
    p.add_argument(
        "--layers", type=int, default=1, help="layers (scanned with lax.scan when > 1; default 1)"
    )
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument(
        "--phase",
        choices=("train", "decode", "prefill"),
        default="train",
        help="train step (default), or a serving decode / prefill step (verify/decode.py)",
    )
    p.add_argument("--context", type=int, default=256, help="decode: KV-cache length (default 256)")
    p.add_argument("--seq", type=int, default=64, help="tokens per sequence (default 64)")
    p.add_argument(
        "--dtype", default="bf16", choices=["bf16", "f32"], help="program dtype (default bf16)"
    )
    p.add_argument("--remat", action="store_true", help="rematerialise each layer (jax.checkpoint)")
    p.add_argument(
        "--fused-qkv", action="store_true", help="one fused QKV projection instead of three"
    )
    p.add_argument(
        "--capacity-factor", type=float, default=1.0, help="MoE capacity factor (default 1.0)"
    )
    p.add_argument(
        "--system",
        default=None,
        help="price the algebra's options on this system's chip (e.g. h100:8) instead of compute-first",
    )
    p.add_argument(
        "--framework",
        default=XLA_STACK,
        help=f"the stack whose option policy predicts the collectives (default {XLA_STACK}: the "
        "JAX/XLA stack, XLA's partitioner habits — FSDP gathers weights, TP moves activations; "
        "ideal: the algebra's cheapest option; auto: the reference stack of --system's chip)",
    )
    p.add_argument(
        "--final",
        action="store_true",
        help="diff against the final HLO instead of the post-SPMD one",
    )
    p.add_argument(
        "--bytes-tol",
        type=float,
        default=0.05,
        help="relative tolerance on bytes per row (default 0.05)",
    )
    p.add_argument(
        "--flops-tol", type=float, default=0.10, help="relative tolerance on FLOPs (default 0.10)"
    )
    add_json(p)


def ensure_devices(n: int) -> None:
    """Make JAX see `n` CPU devices: set XLA_FLAGS before jax is imported, or check it."""
    if n < 1:
        raise VerifyError(f"--devices {n}", rule="at least one device", fix="use --devices 8")
    if "jax" not in sys.modules:
        flags = re.sub(
            r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", "")
        ).strip()
        os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={n}").strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        return
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", n)  # only takes effect before the backend starts
    except Exception:  # noqa: BLE001 - backend already initialised: check the count below
        pass
    have = jax.device_count()
    if have < n:
        raise VerifyError(
            f"JAX is already initialised with {have} device(s); verify needs {n}",
            rule="the simulated device count is fixed when jax starts its backend",
            fix=f"run `roofline verify` in a fresh process, or set XLA_FLAGS=--xla_force_host_platform_device_count={n} "
            "before importing jax",
        )


def _check_plan(text: str, devices: int) -> None:
    deg, rest = parse_degrees(text)
    if rest:
        raise PlanError(
            f"plan keys {sorted(rest)} are not strategy degrees",
            rule="verify compiles degrees only: dp, fsdp, tp, sp, ep",
            fix='write e.g. --plan "fsdp=4,tp=2"; use --remat and --fused-qkv for the rest',
        )
    if deg.pp > 1:
        raise PlanError(
            f"pp={deg.pp}",
            rule="the verify program is a layer stack without pipeline stages",
            fix="verify dp, fsdp, tp, sp and ep",
        )
    if deg.n_chips != devices:
        raise PlanError(
            f"plan {text!r} uses {deg.n_chips} devices but --devices is {devices}",
            rule="the plan's degrees multiply to the device count",
            fix=f"change the degrees or pass --devices {deg.n_chips}",
        )


def run(args: argparse.Namespace) -> int:
    if args.phase != "train":  # serving steps: verify/decode.py builds, compiles and diffs them
        ensure_devices(args.devices)
        from roofline.verify.decode import run_cli

        inputs, result, text, ok = run_cli(args)
        emit(args, NAME, inputs, result, text)
        return 0 if ok else 1
    _check_args(args)
    with bar(2, "verify", unit="stage") as stages:
        r, inputs, what = (_verify_matmul if args.matmul else _verify_model)(args, stages)
    from roofline.verify.hlo import summarize

    d = r.diff
    mesh_txt = ", ".join(f"{a}={n}" for a, n in d.mesh.items())
    header = (
        f"roofline verify: {what}\n"
        f"mesh {mesh_txt} on {args.devices} simulated CPU devices; compiled in {r.seconds:.1f} s; "
        f"observed = {'final' if args.final else 'post-SPMD'} HLO, predicted = {d.prediction.inputs.get('pricing', '')}\n"
        f"bytes per device per step (all-gather: gathered output; reduce-scatter: unreduced input; "
        f"all-reduce/all-to-all: the buffer); tolerance {args.bytes_tol:.0%} bytes, {args.flops_tol:.0%} FLOPs\n"
    )
    text = header + "\n" + d.table()
    result = d.to_dict()
    result["observed"] = {
        "collectives": summarize(
            r.observed.collectives_final if args.final else r.observed.collectives
        ),
        "dot_flops_per_device": r.observed.dot_flops_per_device,
        "cost_analysis_flops_per_device": r.observed.flops_per_device,
    }
    result["program_notes"] = list(r.program_notes)
    result["seconds"] = r.seconds
    emit(args, NAME, inputs, result, text)
    return 0 if d.ok else 1


def _check_args(args: argparse.Namespace) -> None:
    if bool(args.matmul) == bool(args.plan):
        raise VerifyError(
            "give either --plan (with --model) or --matmul",
            rule="verify compiles one model plan or one sharded matmul",
            fix='e.g. --plan "fsdp=4,tp=2" or --matmul "A[I,J_X] * B[J_X,K] -> C[I,K]"',
        )
    for name in ("bytes_tol", "flops_tol"):
        if not 0 <= getattr(args, name) < 1:
            raise VerifyError(
                f"--{name.replace('_', '-')} {getattr(args, name)}",
                rule="a fraction in [0, 1)",
                fix="use e.g. 0.05",
            )


def _stage(stages: Any, name: str) -> None:
    """Finish the previous stage of the verify bar and name the next one."""
    stages.update(1)
    stages.set_description(f"verify: {name}")


def _start_jax(devices: int, stages: Any) -> None:
    ensure_devices(devices)
    stages.set_description("verify: starting JAX")
    from roofline.verify.program import _jax

    _jax()  # the slow first import (or the error saying JAX is missing), as its own stage
    _stage(stages, "compiling and reading the HLO")


def _verify_matmul(args: argparse.Namespace, stages: Any):
    mesh = parse_assignments(args.mesh, what="mesh") if args.mesh else None
    dims = parse_assignments(args.dims, what="dims") if args.dims else None
    from roofline.verify.program import MatmulSpec

    spec = MatmulSpec.parse(args.matmul)  # bad notation fails here, before jax starts
    if not any(ax for op in (spec.lhs, spec.rhs) for _, ax in op):
        raise VerifyError(
            f"--matmul {args.matmul!r} shards no dimension",
            rule="verify compares the collectives of a sharded matmul; with no mesh axis "
            "XLA partitions nothing",
            fix="shard a dim on a mesh axis, e.g. 'A[I,J_X] * B[J_X,K] -> C[I,K]'",
        )
    n = 1
    for v in (mesh or {}).values():
        n *= int(v)
    if mesh and n != args.devices:
        raise PlanError(
            f"mesh {args.mesh} has {n} devices but --devices is {args.devices}",
            rule="the mesh axes multiply to the device count",
            fix=f"pass --devices {n}",
        )
    _start_jax(args.devices, stages)
    from roofline.verify.diff import verify_matmul

    r = verify_matmul(
        args.matmul,
        sizes=dims,
        mesh_shape=mesh,
        dtype=args.dtype,
        system=args.system,
        final=args.final,
        bytes_tol=args.bytes_tol,
        flops_tol=args.flops_tol,
    )
    _stage(stages, "done")
    inputs: dict[str, Any] = {
        "matmul": args.matmul,
        "dims": dims,
        "mesh": mesh,
        "dtype": args.dtype,
        "devices": args.devices,
        "system": args.system,
        "final": args.final,
    }
    return r, inputs, f"matmul {args.matmul}"


def _framework(args: argparse.Namespace) -> str | None:
    """--framework, with `auto` resolved on --system's chip (stack.resolve_framework)."""
    from roofline.core.stack import is_auto, resolve_framework

    if not is_auto(args.framework):
        return args.framework
    if args.system is None:
        raise VerifyError(
            "--framework auto without --system",
            rule="auto is the reference stack of the system's chip (TPU: maxtext, NVIDIA and "
            "AMD GPUs: megatron)",
            fix="give --system (e.g. --system tpu-v5p:2x2x2) or name the stack, e.g. --framework maxtext",
        )
    from roofline.specs.system import parse_system

    return resolve_framework(args.framework, parse_system(args.system).chip)


def _verify_model(args: argparse.Namespace, stages: Any):
    from roofline.specs.model_catalog import load_model

    model = load_model(args.model)
    _check_plan(args.plan, args.devices)
    for name in ("layers", "batch", "seq"):
        if getattr(args, name) < 1:
            raise VerifyError(
                f"--{name} {getattr(args, name)}",
                rule="a positive whole number",
                fix=f"use --{name} 1 or more",
            )
    framework = _framework(args)
    _start_jax(args.devices, stages)
    from roofline.verify.diff import verify_train_step

    r = verify_train_step(
        model,
        args.plan,
        batch=args.batch,
        seq=args.seq,
        dtype=args.dtype,
        n_layers=args.layers,
        remat=args.remat,
        fused_qkv=args.fused_qkv,
        capacity_factor=args.capacity_factor,
        system=args.system,
        final=args.final,
        bytes_tol=args.bytes_tol,
        flops_tol=args.flops_tol,
        framework=framework,
    )
    _stage(stages, "done")
    inputs = {
        "model": model.name,
        "plan": args.plan,
        "framework": framework,
        "devices": args.devices,
        "layers": args.layers,
        "batch": args.batch,
        "seq": args.seq,
        "dtype": args.dtype,
        "remat": args.remat,
        "fused_qkv": args.fused_qkv,
        "capacity_factor": args.capacity_factor,
        "system": args.system,
        "final": args.final,
    }
    what = (
        f"{model.name} plan {args.plan}, {args.layers} layer(s), batch {args.batch} x seq {args.seq}, {args.dtype}"
        + (", remat" if args.remat else "")
        + (", fused QKV" if args.fused_qkv else "")
    )
    return r, inputs, what
