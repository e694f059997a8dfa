"""`calibrate --device`: microbenchmarks on the local accelerator with JAX, and a fit of the
same physical parameters the shipped profiles carry.

Kernels: a matmul sweep (square, skinny m, short k, unaligned, every compute dtype the chip
has: bf16, and fp8 on GPUs whose chip file lists it), a grouped expert GEMM
(`jax.lax.ragged_dot`), an HBM copy, an elementwise RMS norm, flash attention (prefill
forward, prefill forward+backward, two head dims, causal and not; a decode step) and, with
several local devices, an all-reduce. Each is timed as the median of repeated back-to-back
dispatches after a warm-up. Predictions come from `kernels.predict_time_s`.

On the CPU backend (CI) there is no datasheet: the local "chip" is `host-cpu`, whose nominal
peaks are the best matmul rate and copy bandwidth measured here (said in the output), so the
fit there exercises the machinery and the shape physics, not a vendor's numbers.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.calibrate.fit import FitResult, Problem, fit
from roofline.calibrate.kernels import Kernel, KernelKind, kernel_flops, matmul_op, predict_time_s
from roofline.calibrate.params import apply_values, family_or_default, prior_of
from roofline.errors import RooflineError, SpecError
from roofline.specs.chip import Chip, load_chip
from roofline.specs.efficiency import Efficiency, load_profile

# Parameters the microbenchmarks can speak to, primary physics first (see fit.identify).
DEVICE_PARAMS = (
    "hbm",
    "kernel_fixed_s",
    "k_half",
    "vector",
    "grouped_fraction",
    "attn_fwd",
    "attn_bwd",
    "attn_softmax_flops",
    "attn_causal",
)


@dataclass(frozen=True)
class DeviceCalibration:
    chip: Chip
    device_kind: str
    platform: str
    jax_version: str
    kernels: tuple[Kernel, ...]
    measured_s: np.ndarray
    before: Efficiency  # the datasheet-only profile
    after: Efficiency  # fitted
    result: FitResult
    notes: tuple[str, ...]

    @property
    def predicted_before_s(self) -> np.ndarray:
        return predict_time_s(self.before, self.chip, list(self.kernels))

    @property
    def predicted_after_s(self) -> np.ndarray:
        return predict_time_s(self.after, self.chip, list(self.kernels))

    def to_dict(self) -> dict[str, Any]:
        pb, pa = self.predicted_before_s, self.predicted_after_s
        return {
            "chip": self.chip.name,
            "device_kind": self.device_kind,
            "platform": self.platform,
            "jax_version": self.jax_version,
            "notes": list(self.notes),
            "kernels": [
                {
                    **k.to_dict(),
                    "measured_s": float(m),
                    "predicted_before_s": float(b),
                    "predicted_after_s": float(a),
                    "error_before": float(b / m - 1),
                    "error_after": float(a / m - 1),
                }
                for k, m, b, a in zip(self.kernels, self.measured_s, pb, pa, strict=True)
            ],
            "fit": self.result.to_dict(),
            "profile": self.after.to_dict(),
        }


def _jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:  # pragma: no cover - jax is a test dependency
        raise RooflineError(
            "calibrate --device needs JAX",
            rule="the microbenchmarks run as JAX programs on the local accelerator",
            fix="pip install 'roofline[jax]' (or jax[cuda12] / jax[tpu] for an accelerator)",
        ) from None
    return jax, jnp


# -- which chip is this --------------------------------------------------------------------


# JAX device_kind strings of TPUs that do not name the catalog chip
_TPU_KINDS = {
    "TPU v4": "tpu-v4p",
    "TPU v5": "tpu-v5p",
    "TPU v5p": "tpu-v5p",
    "TPU v5 lite": "tpu-v5e",
    "TPU v5e": "tpu-v5e",
    "TPU v6 lite": "tpu-v6e",
    "TPU v6e": "tpu-v6e",
    "TPU7x": "tpu-7x",
}


def detect_chip(device: Any, chip_arg: str | None) -> Chip | None:
    """The catalog chip of a JAX device (or `chip_arg`); None on CPU without --chip."""
    if chip_arg:
        return load_chip(chip_arg)
    if device.platform == "cpu":
        return None
    kind = str(device.device_kind)
    words = kind.replace("-", " ").split()
    tries = [
        _TPU_KINDS.get(kind, kind),
        *words,
        *(" ".join(words[i : i + 2]) for i in range(len(words))),
    ]
    for t in tries:
        try:
            return load_chip(t)
        except SpecError:
            continue
    raise SpecError(
        f"the local device {device.device_kind!r} matches no chip in the catalog",
        rule="calibration fits a chip family's parameters against that chip's datasheet peaks",
        fix="pass --chip NAME (e.g. h100, tpu-v5e) or --chip FILE.toml with the datasheet numbers",
    )


def host_chip(best_flops_per_s: float, best_copy_bytes_per_s: float) -> Chip:
    """A CPU as a chip whose nominal peaks are the best rates measured (no datasheet)."""
    mem = (
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 1e9
    )
    return Chip(
        name="host-cpu",
        vendor="cpu",
        generation="host CPU",
        peak_flops_per_s=MappingProxyType({"bf16": best_flops_per_s, "fp32": best_flops_per_s}),
        hbm_bytes=float(mem),
        hbm_bw_bytes_per_s=best_copy_bytes_per_s,
        sm_count=os.cpu_count() or 1,
        description="the calibrating host's CPU; nominal peaks = best measured matmul rate and copy bandwidth",
    )


# -- the benchmark plan -------------------------------------------------------------------


def plan(
    platform: str, dtypes: tuple[str, ...], quick: bool, devices: int, topology: str = ""
) -> list[Kernel]:
    """The kernels to time: small on CPU, sized to fill an accelerator otherwise."""
    big = platform != "cpu"
    mm = _matmul_shapes(big, quick)
    out = [
        Kernel(KernelKind.MATMUL, f"matmul {d} {m}x{n}x{k}", d, m, n, k)
        for d in dtypes
        for m, n, k in mm
    ]
    g, gm, gk, gn = (8, 16384, 4096, 4096) if big else (4, 512, 256, 256)
    out.append(
        Kernel(
            KernelKind.MATMUL,
            f"grouped {dtypes[0]} {g}x({gm // g}x{gn}x{gk})",
            dtypes[0],
            gm,
            gn,
            gk,
            groups=g,
            grouped=True,
        )
    )
    for nb in (
        ([2**30] if quick else [2**28, 2**31]) if big else ([2**24] if quick else [2**24, 2**27])
    ):
        out.append(
            Kernel(KernelKind.COPY, f"copy {nb / 2**20:.0f} MiB", dtypes[0], nbytes=2.0 * nb)
        )
    rows, d = (65536, 8192) if big else (2048, 1024)
    out.append(
        Kernel(
            KernelKind.VECTOR,
            f"rmsnorm {rows}x{d}",
            dtypes[0],
            m=rows,
            n=d,
            nbytes=2.0 * rows * d * _itemsize(dtypes[0]),
        )
    )
    out += _attention_kernels(big, quick, dtypes[0])
    if devices > 1 and big:
        tier = "ici" if platform == "tpu" else "nvlink"
        for nb in [2**28] if quick else [2**24, 2**28, 2**30]:
            out.append(
                Kernel(
                    KernelKind.ALL_REDUCE,
                    f"all-reduce {nb / 2**20:.0f} MiB x{devices}",
                    dtypes[0],
                    nbytes=float(nb),
                    devices=devices,
                    tier=tier,
                    topology=topology,
                )
            )
    return out


def _matmul_shapes(big: bool, quick: bool) -> list[tuple[int, int, int]]:
    if big:
        shapes = [
            (8192, 8192, 8192),
            (4096, 4096, 4096),
            (1024, 8192, 8192),
            (8192, 8192, 1024),
            (256, 8192, 8192),
        ]
        if not quick:
            shapes += [
                (16384, 16384, 16384),
                (2048, 2048, 2048),
                (64, 8192, 8192),
                (8192, 8192, 256),
                (8192, 8192, 4096),
                (8256, 8192, 8192),
                (16384, 4096, 14336),
            ]
        return shapes
    shapes = [(512, 512, 512), (128, 512, 512), (512, 512, 64), (64, 64, 64), (256, 256, 256)]
    if not quick:
        shapes += [
            (1024, 1024, 1024),
            (32, 1024, 1024),
            (1024, 1024, 128),
            (520, 512, 512),
            (768, 768, 768),
        ]
    return shapes


def _attention_kernels(big: bool, quick: bool, dtype: str) -> list[Kernel]:
    b, t, h = (4, 4096, 32) if big else (1, 256, 4)
    out = []
    for hd in (128,) if quick else (64, 128):
        heads = h * 128 // hd
        for causal in (True,) if quick else (True, False):
            for bwd in (False, True):
                tag = f"attention {'fwd+bwd' if bwd else 'fwd'} {'causal ' if causal else ''}b{b} t{t} h{heads} d{hd}"
                out.append(
                    Kernel(
                        KernelKind.ATTENTION,
                        tag,
                        dtype,
                        batch=b,
                        heads=heads,
                        q_len=t,
                        kv_len=t,
                        head_dim=hd,
                        causal=causal,
                        backward=bwd,
                    )
                )
    db, ds = (64, 8192) if big else (8, 1024)
    out.append(
        Kernel(
            KernelKind.ATTENTION,
            f"decode attention b{db} s{ds} h{h} d128",
            dtype,
            batch=db,
            heads=h,
            q_len=1,
            kv_len=ds,
            head_dim=128,
        )
    )
    return out


def _itemsize(dtype: str) -> float:
    from roofline.units import dtype_bytes

    return dtype_bytes(dtype)


# -- timing ----------------------------------------------------------------------------


def _jnp_dtype(jnp, dtype: str):
    return {
        "bf16": jnp.bfloat16,
        "fp32": jnp.float32,
        "fp8": jnp.float8_e4m3fn,
        "fp16": jnp.float16,
    }[dtype]


def _builder(kr: Kernel) -> tuple[Callable, tuple]:
    """A jitted function and its arguments for one kernel."""
    jax, jnp = _jax()
    dt = _jnp_dtype(jnp, kr.dtype)
    out_dt = jnp.bfloat16 if kr.dtype == "fp8" else dt
    rng = np.random.default_rng(0)

    def rnd(shape, d=dt):  # made on the host: no compile per shape
        return jax.device_put(rng.standard_normal(shape, dtype=np.float32).astype(d))

    if kr.kind == KernelKind.MATMUL and kr.grouped:
        sizes = jax.device_put(np.full((kr.groups,), kr.m // kr.groups, np.int32))
        fn = jax.jit(lambda x, w, g: jax.lax.ragged_dot(x, w, g, preferred_element_type=out_dt))
        return fn, (rnd((kr.m, kr.k)), rnd((kr.groups, kr.k, kr.n)), sizes)
    if kr.kind == KernelKind.MATMUL:
        fn = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=out_dt))
        return fn, (rnd((kr.m, kr.k)), rnd((kr.k, kr.n)))
    if kr.kind == KernelKind.COPY:
        n = int(kr.nbytes / 2 / _itemsize(kr.dtype))
        return jax.jit(lambda x: x + jnp.asarray(1, dt)), (rnd((n,)),)
    if kr.kind == KernelKind.VECTOR:

        def rms(x, w):
            xf = x.astype(jnp.float32)
            return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6)).astype(
                dt
            ) * w

        return jax.jit(rms), (rnd((kr.m, kr.n)), rnd((kr.n,)))
    if kr.kind == KernelKind.ATTENTION:
        return _attention_fn(jax, jnp, kr, rnd)
    return _all_reduce_fn(jax, jnp, kr, rnd)


def _attention_fn(jax, jnp, kr: Kernel, rnd):
    q = rnd((kr.batch, kr.q_len, kr.heads, kr.head_dim))
    kv = rnd((kr.batch, kr.kv_len, kr.heads, kr.head_dim))
    causal = kr.causal and kr.q_len == kr.kv_len
    impl = "cudnn" if jax.devices()[0].platform == "gpu" else None

    def attn(q, k, v):
        try:
            return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=impl)
        except Exception:  # cuDNN refuses the shape: XLA's own attention
            return jax.nn.dot_product_attention(q, k, v, is_causal=causal)

    if kr.backward:
        loss = lambda q, k, v: attn(q, k, v).astype(jnp.float32).sum()  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (q, kv, kv)
    return jax.jit(attn), (q, kv, kv)


def _all_reduce_fn(jax, jnp, kr: Kernel, rnd):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devs = np.array(jax.devices()[: kr.devices])
    mesh = Mesh(devs, ("i",))
    n = int(kr.nbytes / _itemsize(kr.dtype))
    x = jax.device_put(rnd((kr.devices * n,)), NamedSharding(mesh, PartitionSpec("i")))
    f = jax.shard_map(
        lambda a: jax.lax.psum(a, "i"),
        mesh=mesh,
        in_specs=PartitionSpec("i"),
        out_specs=PartitionSpec("i"),
    )
    return jax.jit(f), (x,)


def time_kernel(kr: Kernel, *, reps: int, target_s: float) -> float:
    """Median seconds per call of back-to-back dispatches (after a warm-up call)."""
    jax, _ = _jax()
    fn, args = _builder(kr)
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    one = max(time.perf_counter() - t0, 1e-7)
    inner = int(min(max(1, target_s / one), 1000))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) / inner)
    return float(np.median(samples))


# -- the whole calibration ------------------------------------------------------------------


def run_device_calibration(
    *,
    quick: bool = False,
    base: str | Efficiency = "datasheet",
    chip: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> DeviceCalibration:
    """Time the plan on the local device, fit the chip family's parameters, return both profiles."""
    jax, _ = _jax()
    dev = jax.devices()[0]
    local = detect_chip(dev, chip)
    dtypes = _dtypes(dev.platform, local)
    kernels = plan(dev.platform, dtypes, quick, jax.device_count(), _topology(jax, local))
    reps, target = (3, 0.02) if quick else (7, 0.2)
    measured = []
    from roofline.progress import track

    for kr in track(kernels, "calibrate: kernels", unit="kernel"):
        measured.append(time_kernel(kr, reps=reps, target_s=target))
        if progress:
            progress(f"  {kr.label}: {measured[-1] * 1e3:.3f} ms")
    measured_s = np.array(measured)
    notes = []
    if local is None:
        local = _host_from(kernels, measured_s)
        notes.append(
            f"CPU backend: no datasheet, so the nominal peaks are the best measured rates "
            f"({local.peak('fp32') / 1e9:.1f} GFLOP/s matmul, {local.hbm_bw_bytes_per_s / 1e9:.1f} GB/s memory-bound kernel)"
        )
    before = _base_profile(base, local)
    after, result = _fit(before, local, kernels, measured_s, dtypes)
    after = _identity(after, local, dev, jax.__version__, len(kernels), quick)
    return DeviceCalibration(
        local,
        dev.device_kind,
        dev.platform,
        jax.__version__,
        tuple(kernels),
        measured_s,
        before,
        after,
        result,
        tuple(notes),
    )


def _topology(jax, chip: Chip | None) -> str:
    """The local TPU slice's shape from the devices' torus coordinates ('' elsewhere)."""
    devs = jax.devices()
    if chip is None or not chip.is_tpu or not all(hasattr(d, "coords") for d in devs):
        return ""
    dims = [max(d.coords[i] for d in devs) + 1 for i in range(len(devs[0].coords))]
    dims = (dims + [1, 1, 1])[: max(chip.ici_axes, 1)]
    return "x".join(str(x) for x in dims)


def _dtypes(platform: str, chip: Chip | None) -> tuple[str, ...]:
    if platform == "cpu":
        return ("fp32",)
    if platform == "gpu" and chip is not None and "fp8" in chip.peak_flops_per_s:
        return ("bf16", "fp8")
    return ("bf16",)


def _host_from(kernels: list[Kernel], measured_s: np.ndarray) -> Chip:
    flops = max(
        kernel_flops(k) / t
        for k, t in zip(kernels, measured_s, strict=True)
        if k.kind == KernelKind.MATMUL and not k.grouped
    )
    mem = (KernelKind.COPY, KernelKind.VECTOR)
    copy = max(k.nbytes / t for k, t in zip(kernels, measured_s, strict=True) if k.kind in mem)
    return host_chip(flops, copy)


def _base_profile(base: str | Efficiency, chip: Chip) -> Efficiency:
    prof = load_profile(base)
    fam = family_or_default(prof, chip)
    return prof.with_family(fam)


def _fit(
    before: Efficiency,
    chip: Chip,
    kernels: list[Kernel],
    measured_s: np.ndarray,
    dtypes: tuple[str, ...],
) -> tuple[Efficiency, FitResult]:
    fam = before.family_for(chip)
    assert fam is not None
    names = [f"mm_fraction.{d}" for d in dtypes] + list(DEVICE_PARAMS)
    names += sorted({f"link.{k.tier}" for k in kernels if k.kind == KernelKind.ALL_REDUCE})
    prior = prior_of(before, fam.family, names)

    def predict(values, idx):
        prof = apply_values(before, fam.family, values)
        return predict_time_s(prof, chip, [kernels[i] for i in idx])

    problem = Problem(
        tuple(k.label for k in kernels),
        measured_s,
        predict,
        prior,
        {"kind": [k.kind.value for k in kernels]},
    )
    result = fit(problem, names)
    return apply_values(before, fam.family, result.values), result


def _identity(
    prof: Efficiency, chip: Chip, dev: Any, jax_version: str, n: int, quick: bool
) -> Efficiency:
    day = _dt.date.today().isoformat()
    return replace(
        prof,
        name=f"{chip.name}-measured",
        calibrated=True,
        source=f"roofline calibrate --device{' --quick' if quick else ''} on {dev.device_kind} ({dev.platform}), {day}, JAX {jax_version}, {n} kernels",
    )


def tflops(kr: Kernel, seconds: float) -> float:
    return kernel_flops(kr) / seconds / 1e12


__all__ = [
    "DeviceCalibration",
    "run_device_calibration",
    "plan",
    "time_kernel",
    "detect_chip",
    "host_chip",
    "matmul_op",
    "tflops",
]
