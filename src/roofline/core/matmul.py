"""One sharded matmul in the book's notation, analysed: case, local shapes, collectives,
times, every costed alternative, and the option the book's text prescribes.

The sharded-einsum algebra (`sharding.plan_einsum`) costs every legal way to compute the
einsum (gather the weights, gather the activations and reduce-scatter, multiply locally and
all-reduce, ...) and picks the fastest under the roofline: time = max(compute, HBM,
communication) with perfect overlap. Collectives are timed on the given system by
`collectives.collective_cost`. The book's case 4 (one mesh axis on a free dim of both
operands) is rejected with its two legal fixes; `backward=True` adds the two gradient
einsums (a forward AllGather becomes a backward ReduceScatter; book training.md).
`roofline matmul` prints what `analyze_matmul` returns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from roofline.core.collectives import CollectiveKind, collective_cost
from roofline.core.mesh import make_mesh
from roofline.core.sharding import (
    Comm,
    EinsumPlan,
    Option,
    Spec,
    backward_specs,
    parse_einsum,
    plan_einsum,
)
from roofline.errors import SpecError
from roofline.specs.system import parse_system
from roofline.units import parse_dtype

# book names of the collectives: AllGather_X, ReduceScatter_XY, ...
BOOK_NAME = {
    CollectiveKind.ALL_GATHER: "AllGather",
    CollectiveKind.REDUCE_SCATTER: "ReduceScatter",
    CollectiveKind.ALL_REDUCE: "AllReduce",
    CollectiveKind.ALL_TO_ALL: "AllToAll",
    CollectiveKind.PERMUTE: "Permute",
}


def book_name(c: Comm) -> str:
    """'AllGather_X', 'ReduceScatter_XY', 'AllReduce_{data,fsdp}' (book notation)."""
    axes = c.axes
    sub = "".join(axes) if all(len(a) == 1 for a in axes) else "{" + ",".join(axes) + "}"
    return f"{BOOK_NAME[c.kind]}_{sub}"


def strategy(o: Option) -> str:
    """The steps of an option in book notation; 'local matmul only' when nothing moves."""
    if not o.comms:
        return "local matmul, no communication"
    pre = [c for c in o.comms if c.tensor != o.out.name]
    post = [c for c in o.comms if c.tensor == o.out.name]
    steps = [f"{book_name(c)} {c.tensor}" for c in pre] + ["local matmul"]
    steps += [f"{book_name(c)} {c.tensor}" for c in post]
    return ", then ".join(steps)


def _num(x: Any) -> Any:
    v = float(x)
    return int(v) if v.is_integer() else v


def _shape(s: Spec, sizes: dict[str, float], mesh: dict[str, int]) -> list[Any]:
    return [_num(v) for v in s.local_shape(sizes, mesh)]


def _comm_dict(c: Comm) -> dict[str, Any]:
    d = c.to_dict()
    d["name"] = book_name(c)
    d["bytes"] = float(d["bytes"])
    d["time_s"] = float(d["time_s"])
    return d


def _option_dict(o: Option, peak: float, hbm: float, sizes, mesh) -> dict[str, Any]:
    comp = float(o.flops_per_chip) / peak
    mem = float(o.hbm_bytes_per_chip) / hbm
    comm = float(o.comm_time_s)
    return {
        "strategy": strategy(o),
        "flops_per_chip": float(o.flops_per_chip),
        "hbm_bytes_per_chip": float(o.hbm_bytes_per_chip),
        "collectives": [_comm_dict(c) for c in o.comms],
        "compute_time_s": comp,
        "memory_time_s": mem,
        "comm_time_s": comm,
        "time_lower_s": max(comp, mem, comm),
        "time_upper_s": comp + mem + comm,
        "bound": _bound(comp, mem, comm),
        "matmul": {
            "lhs": str(o.lhs),
            "rhs": str(o.rhs),
            "out": str(o.natural_out),
            "local_shapes": {
                "lhs": _shape(o.lhs, sizes, mesh),
                "rhs": _shape(o.rhs, sizes, mesh),
                "out": _shape(o.natural_out, sizes, mesh),
            },
        },
    }


def _bound(comp: float, mem: float, comm: float) -> str:
    return max((comp, "compute"), (mem, "memory"), (comm, "communication"))[1]


def textbook_index(plan: EinsumPlan) -> int | None:
    """The option the book's text prescribes for this case, when it names one.

    Case 2: gather the operand sharded on the contracting dim, then multiply (no partial
    sums). Case 3: multiply locally, then AllReduce / ReduceScatter (no input gathers).
    """
    case = plan.case[:1]
    if case == "1":
        return 0 if len(plan.options) == 1 else None
    best: tuple[int, int] | None = None
    for i, o in enumerate(plan.options):
        pre = [c for c in o.comms if c.tensor != o.out.name]
        if case == "2":
            ok = not o.natural_out.unreduced and all(
                c.kind is CollectiveKind.ALL_GATHER for c in pre
            )
        elif case == "3":
            ok = bool(o.natural_out.unreduced) and not pre
        else:
            ok = False
        if ok and (best is None or len(o.comms) < best[0]):
            best = (len(o.comms), i)
    return None if best is None else best[1]


def plan_dict(
    plan: EinsumPlan, peak: float, hbm: float, lhs: Spec, rhs: Spec, out: Spec
) -> dict[str, Any]:
    """The JSON structure of one planned einsum (forward or one backward einsum)."""
    sizes, mesh = dict(plan.sizes), dict(plan.mesh)
    d = plan.to_dict()
    choice = int(np.asarray(plan.choice).flat[0])
    best = _option_dict(plan.best, peak, hbm, sizes, mesh)
    tb = textbook_index(plan)
    d.update(
        {
            "strategy": best["strategy"],
            "local_shapes": {s.name: _shape(s, sizes, mesh) for s in (lhs, rhs, out)},
            "specs": {"lhs": str(lhs), "rhs": str(rhs), "out": str(out)},
            "matmul": best["matmul"],
            "flops_per_chip": best["flops_per_chip"],
            "hbm_bytes_per_chip": best["hbm_bytes_per_chip"],
            "collectives": best["collectives"],
            "compute_time_s": best["compute_time_s"],
            "memory_time_s": best["memory_time_s"],
            "comm_time_s": best["comm_time_s"],
            "time_lower_s": best["time_lower_s"],
            "time_upper_s": best["time_upper_s"],
            "bound": best["bound"],
            "replication": float(plan.replication),
            "textbook_strategy": None if tb is None else strategy(plan.options[tb]),
            "chosen_is_textbook": tb is None or tb == choice,
            "alternatives": [
                _option_dict(o, peak, hbm, sizes, mesh)
                for i, o in enumerate(plan.options)
                if i != choice
            ],
        }
    )
    return d


def analyze_matmul(
    expr: str,
    dims: dict[str, float],
    mesh_text: str,
    system_text: str,
    dtype: str = "bf16",
    backward: bool = False,
) -> dict[str, Any]:
    """Everything `matmul` reports, as plain data."""
    system = parse_system(system_text)
    mesh = make_mesh(system, mesh_text)
    dt = parse_dtype(dtype)
    lhs, rhs, out = parse_einsum(expr, mesh.axis_names, (dt, dt, dt))
    used = {*lhs.dims, *rhs.dims, *out.dims}
    extra = [d for d in dims if d not in used]
    if extra:
        raise SpecError(
            f"--dims names {', '.join(extra)}, which the einsum {expr!r} does not use",
            rule="--dims gives the size of each dim of the einsum",
            fix=f"size only {', '.join(sorted(used))}",
        )
    sizes = {d: float(v) for d, v in dims.items()}
    mesh_sizes = mesh.shape
    peak = system.chip.peak(dt)
    hbm = system.chip.hbm_bw_bytes_per_s

    def comm_fn(kind: CollectiveKind, nbytes: Any, axes: tuple[str, ...]) -> Any:
        return collective_cost(kind, nbytes, axes, mesh).time_s

    kw = dict(peak_flops_per_s=peak, hbm_bw_bytes_per_s=hbm, check_divisible=True)
    fwd = plan_einsum(lhs, rhs, out, sizes, mesh_sizes, comm_fn, allow_conflict=False, **kw)
    res = plan_dict(fwd, peak, hbm, lhs, rhs, out)
    res.update(
        {
            "system": system.name,
            "mesh": mesh.spec(),
            "placement": mesh.describe(),
            "dtype": dt,
            "peak_flops_per_s": peak,
            "hbm_bw_bytes_per_s": hbm,
            "n_chips": mesh.n_chips,
        }
    )
    if backward:
        res["backward"] = []
        for a, b, c in backward_specs(lhs, rhs, out):
            # the gradient einsums are often case 4 (FSDP: dIn = dOut[B_X, F] · W[D_X, F]):
            # resolving it by gathering one operand is the point, so conflicts are allowed here
            p = plan_einsum(
                a, b, c, sizes, mesh_sizes, comm_fn, phase="backward", allow_conflict=True, **kw
            )
            res["backward"].append(plan_dict(p, peak, hbm, a, b, c))
        res["transposes"] = transposes(res)
    return res


def transposes(res: dict[str, Any]) -> list[str]:
    """Forward AllGathers of an input paired with the backward ReduceScatter of its gradient."""
    pairs = []
    bwd = [c for b in res.get("backward", []) for c in b["collectives"]]
    for c in res["collectives"]:
        if c["kind"] != CollectiveKind.ALL_GATHER.value:
            continue
        for g in bwd:
            if (
                g["kind"] == CollectiveKind.REDUCE_SCATTER.value
                and g["tensor"] == "d" + c["tensor"]
            ):
                if g["axes"] == c["axes"]:
                    pairs.append(
                        f"forward {c['name']}({c['before']}) <-> backward {g['name']}({g['before']})"
                    )
    return pairs
