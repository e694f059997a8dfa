"""Run a plan as a real multi-process JAX job and check it against a single-device run.

On one machine (CI): `run_local(plan)` starts `num_processes` worker processes, each
with `local_devices` CPU devices, joined by `jax.distributed.initialize` on a localhost
coordinator (127.0.0.1, a free port), with CPU collectives over gloo. Each worker runs
one training step of the small layer (`build_train_step`) on the global mesh, gathers
the updated parameters and the loss, runs the same step on one local device, and
prints one `ROOFLINE_RESULT {json}` line with the largest difference.

    python -m roofline.verify.distributed --plan fsdp=4,tp=2 --launch          # both workers here

A real multi-host cluster runs the same worker once per host (process), pointing all
of them at process 0's address; leave out --local-devices (use the accelerators) and
pass --collectives default on GPU/TPU (gloo is for CPU only):

    # host 0 (10.0.0.1)                                  # host 1
    python -m roofline.verify.distributed \\              python -m roofline.verify.distributed \\
      --plan fsdp=8,tp=2 --num-processes 2 \\               --plan fsdp=8,tp=2 --num-processes 2 \\
      --process-id 0 --coordinator 10.0.0.1:1234 \\          --process-id 1 --coordinator 10.0.0.1:1234 \\
      --collectives default                                 --collectives default

The mesh must have exactly (num_processes x devices per process) devices; the
coordinator port must be reachable from every host. Under SLURM or on Cloud TPU,
`jax.distributed.initialize()` can discover all of this itself: pass `--coordinator auto`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from roofline.errors import VerifyError

RESULT_TAG = "ROOFLINE_RESULT "


def small_model():
    """The small LLaMA-like layer used by the distributed check (and CI)."""
    from roofline.specs.model import ModelSpec

    return ModelSpec(
        name="verify-small",
        n_layers=1,
        d_model=64,
        d_ff=128,
        n_heads=4,
        n_kv_heads=2,
        d_head=16,
        vocab=256,
    )


@dataclass(frozen=True)
class WorkerResult:
    process_id: int
    ok: bool
    max_abs_err: float
    max_rel_err: float
    loss: float
    loss_reference: float
    n_global_devices: int
    n_local_devices: int
    seconds: float
    error: str = ""


@dataclass(frozen=True)
class DistributedResult:
    ok: bool
    plan: str
    workers: tuple[WorkerResult, ...]
    coordinator: str
    seconds: float
    logs: tuple[str, ...] = ()

    @property
    def max_abs_err(self) -> float:
        return max((w.max_abs_err for w in self.workers), default=float("nan"))


# ----------------------------------------------------------------------------- worker


def worker(
    plan: str,
    *,
    num_processes: int,
    process_id: int,
    coordinator: str,
    local_devices: int | None,
    collectives: str = "gloo",
    batch: int = 8,
    seq: int = 16,
    dtype: str = "f32",
    seed: int = 0,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> WorkerResult:
    """One process of the job (call before anything else touches jax)."""
    t0 = time.time()
    import jax

    if local_devices:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", int(local_devices))
    if collectives and collectives != "default":
        jax.config.update("jax_cpu_collectives_implementation", collectives)
    if coordinator == "auto":
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
        )
    try:
        return _step_and_compare(plan, process_id, batch, seq, dtype, seed, rtol, atol, t0)
    finally:
        jax.distributed.shutdown()


def _step_and_compare(
    plan: str,
    process_id: int,
    batch: int,
    seq: int,
    dtype: str,
    seed: int,
    rtol: float,
    atol: float,
    t0: float,
) -> WorkerResult:
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from roofline.core.rules import Degrees, parse_degrees
    from roofline.verify.program import build_train_step

    model = small_model()
    deg = parse_degrees(plan)[0]
    if deg.n_chips != jax.device_count():
        raise VerifyError(
            f"plan {plan!r} needs {deg.n_chips} devices, the job has {jax.device_count()}",
            rule="mesh size = processes x devices per process",
            fix="change --num-processes/--local-devices or the plan",
        )
    prog = build_train_step(model, deg, batch=batch, seq=seq, dtype=dtype)
    host = prog.example_args(seed)
    flat_host, tree = jax.tree_util.tree_flatten(host)
    flat_abs = jax.tree_util.tree_leaves(prog.args)
    glob = [
        jax.make_array_from_callback(a.shape, a.sharding, lambda idx, h=h: h[idx])
        for a, h in zip(flat_abs, flat_host, strict=True)
    ]
    params, opt, loss = prog.fn(*jax.tree_util.tree_unflatten(tree, glob))
    out = multihost_utils.process_allgather((params, loss), tiled=True)
    out_params, out_loss = out

    ref = build_train_step(
        model, Degrees(), batch=batch, seq=seq, dtype=dtype, devices=[jax.local_devices()[0]]
    )
    ref_params, _, ref_loss = ref.fn(
        *jax.tree_util.tree_unflatten(tree, [np.array(h) for h in flat_host])
    )
    abs_err = rel_err = 0.0
    ok = True
    for k in ref_params:
        a = np.asarray(out_params[k], dtype=np.float64)
        b = np.asarray(ref_params[k], dtype=np.float64)
        d = np.abs(a - b)
        abs_err = max(abs_err, float(d.max()))
        rel_err = max(rel_err, float((d / (np.abs(b) + 1e-12)).max()))
        ok = ok and bool(np.allclose(a, b, rtol=rtol, atol=atol))
    l1, l2 = float(np.asarray(out_loss)), float(np.asarray(ref_loss))
    ok = ok and abs(l1 - l2) <= atol + rtol * abs(l2)
    return WorkerResult(
        process_id,
        ok,
        abs_err,
        rel_err,
        l1,
        l2,
        jax.device_count(),
        jax.local_device_count(),
        time.time() - t0,
    )


# ----------------------------------------------------------------------------- launcher


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gloo_available() -> tuple[bool, str]:
    """Whether this jaxlib has CPU collectives over gloo (checked in a subprocess)."""
    code = (
        "import jax\n"
        "jax.config.update('jax_cpu_collectives_implementation', 'gloo')\n"
        "try:\n"
        "    from jax._src.lib import _jax as j\n"
        "    print(hasattr(j, 'make_gloo_tcp_collectives'))\n"
        "except ImportError:\n"
        "    print(True)  # cannot tell from here: let the real run decide\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return False, r.stderr.strip().splitlines()[
            -1
        ] if r.stderr.strip() else f"exit {r.returncode}"
    if r.stdout.strip().endswith("False"):
        return False, "this jaxlib has no make_gloo_tcp_collectives"
    return True, ""


def run_local(
    plan: str = "fsdp=4,tp=2",
    *,
    num_processes: int = 2,
    local_devices: int = 4,
    timeout_s: float = 180,
    batch: int = 8,
    seq: int = 16,
    dtype: str = "f32",
    extra_args: Sequence[str] = (),
) -> DistributedResult:
    """Spawn the workers on this machine (localhost coordinator, gloo) and collect results."""
    t0 = time.time()
    port = free_port()
    coord = f"127.0.0.1:{port}"
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the worker sets its own device count
    env["JAX_PLATFORMS"] = "cpu"
    procs = []
    for i in range(num_processes):
        cmd = [
            sys.executable,
            "-m",
            "roofline.verify.distributed",
            "--plan",
            plan,
            "--num-processes",
            str(num_processes),
            "--process-id",
            str(i),
            "--coordinator",
            coord,
            "--local-devices",
            str(local_devices),
            "--batch",
            str(batch),
            "--seq",
            str(seq),
            "--dtype",
            dtype,
            *extra_args,
        ]
        procs.append(
            subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
        )
    logs: list[str] = []
    results: list[WorkerResult] = []
    deadline = t0 + timeout_s
    for i, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
            logs.append(f"[process {i}] timed out after {timeout_s:.0f} s\n{err[-3000:]}")
            results.append(
                WorkerResult(
                    i,
                    False,
                    float("nan"),
                    float("nan"),
                    float("nan"),
                    float("nan"),
                    0,
                    0,
                    time.time() - t0,
                    error="timeout",
                )
            )
            continue
        logs.append(f"[process {i}] exit {p.returncode}\n{err[-3000:]}")
        line = next((ln for ln in out.splitlines() if ln.startswith(RESULT_TAG)), None)
        if line is None:
            results.append(
                WorkerResult(
                    i,
                    False,
                    float("nan"),
                    float("nan"),
                    float("nan"),
                    float("nan"),
                    0,
                    0,
                    time.time() - t0,
                    error=(err.strip().splitlines() or ["no output"])[-1],
                )
            )
        else:
            results.append(WorkerResult(**json.loads(line[len(RESULT_TAG) :])))
    ok = all(r.ok for r in results) and len(results) == num_processes
    return DistributedResult(ok, plan, tuple(results), coord, time.time() - t0, tuple(logs))


# ----------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m roofline.verify.distributed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--plan",
        default="fsdp=4,tp=2",
        help="plan degrees, e.g. fsdp=4,tp=2 (product = total devices)",
    )
    p.add_argument(
        "--launch", action="store_true", help="spawn all workers on this machine and report"
    )
    p.add_argument("--num-processes", type=int, default=2)
    p.add_argument("--process-id", type=int, default=0)
    p.add_argument(
        "--coordinator", default="", help="HOST:PORT of process 0, or 'auto' (SLURM, Cloud TPU)"
    )
    p.add_argument(
        "--local-devices", type=int, default=4, help="CPU devices per process; 0 = use accelerators"
    )
    p.add_argument("--collectives", default="gloo", help="gloo (CPU) | mpi | default (GPU/TPU)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--dtype", default="f32")
    p.add_argument("--timeout", type=float, default=180)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.launch:
        r = run_local(
            a.plan,
            num_processes=a.num_processes,
            local_devices=a.local_devices,
            timeout_s=a.timeout,
            batch=a.batch,
            seq=a.seq,
            dtype=a.dtype,
        )
        for w in r.workers:
            print(
                f"process {w.process_id}: ok={w.ok} max|diff|={w.max_abs_err:.3g} loss={w.loss:.6g} "
                f"(single device {w.loss_reference:.6g}) {w.error}"
            )
        if not r.ok:
            print("\n".join(r.logs), file=sys.stderr)
        print(
            f"{'OK' if r.ok else 'FAILED'}: plan {r.plan} on {a.num_processes} processes in {r.seconds:.1f} s"
        )
        return 0 if r.ok else 1
    if not a.coordinator:
        print("--coordinator HOST:PORT is required for a worker (or use --launch)", file=sys.stderr)
        return 2
    res = worker(
        a.plan,
        num_processes=a.num_processes,
        process_id=a.process_id,
        coordinator=a.coordinator,
        local_devices=a.local_devices or None,
        collectives=a.collectives,
        batch=a.batch,
        seq=a.seq,
        dtype=a.dtype,
    )
    print(RESULT_TAG + json.dumps(res.__dict__), flush=True)
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
