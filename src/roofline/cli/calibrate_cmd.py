"""`roofline calibrate`: fit the efficiency physics on your accelerator or on measured runs.

    roofline calibrate --device [--quick] --out my-chip.toml
    roofline calibrate --from-runs training [--framework megatron] --out fitted.toml [--docs FILE]
    roofline calibrate --from-runs serving [--base fitted] [--out fitted.toml] [--docs FILE]

`--device` times JAX microbenchmarks on the local device (matmul sweep per dtype, grouped
GEMM, HBM copy, RMS norm, flash attention prefill/decode, all-reduce with several devices),
fits the chip family's physical parameters within their bounds and prints measured vs
predicted per kernel with the datasheet-only profile and with the fitted one.
`--from-runs` fits a few physical factors (a shared GEMM scale with per-family deviations,
low-precision GEMMs, attention, elementwise kernels, fixed overheads per framework) through
the step model on training runs in the measured_training.yaml schema (`training` = the public
runs), with leave-one-source-out and leave-one-chip-family-out cross-validation. A serving-runs
file (`serving` = AIConfigurator's public sample) fits the disaggregated hand-off
(`disagg_handoff_s`) on the disaggregated runs' TTFT instead (calibrate.serving), with
leave-one-engine-out and leave-one-chip-family-out cross-validation. All write a profile that
`--profile FILE` reads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from roofline.cli._common import add_json, check_output_path, emit
from roofline.errors import SpecError
from roofline.progress import write as progress_write

NAME = "calibrate"
HELP = "fit the efficiency profile on the local accelerator (--device) or on measured runs (--from-runs)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--device", action="store_true", help="microbenchmark the local accelerator with JAX"
    )
    mode.add_argument(
        "--from-runs",
        metavar="FILE",
        help="measured runs: training (measured_training.yaml schema) or serving "
        "(measured_serving_aic.yaml schema: fits the disaggregated hand-off)",
    )
    p.add_argument(
        "--quick", action="store_true", help="--device: a few seconds instead of a few minutes"
    )
    p.add_argument(
        "--chip",
        help="--device: the catalog chip (or chip TOML) of the local device (default: detected)",
    )
    p.add_argument(
        "--framework", help="--from-runs: fit only runs of this framework (default: all runs)"
    )
    p.add_argument(
        "--jobs",
        help="--from-runs: worker processes for the step model (default: up to 2 cores)",
    )
    p.add_argument(
        "--base",
        help="profile to start from (default: datasheet; serving runs: fitted, the default profile)",
    )
    p.add_argument("--out", help="write the fitted profile here (TOML, for --profile FILE)")
    p.add_argument(
        "--no-cv", action="store_true", help="--from-runs: fit only, without cross-validation"
    )
    p.add_argument(
        "--docs",
        metavar="FILE",
        help="--from-runs: write the CV tables into FILE between its markers",
    )
    add_json(p)


def run(args: argparse.Namespace) -> int:
    check_output_path(args.out, "--out")  # before minutes of fitting, not at the write
    check_output_path(args.docs, "--docs")
    if args.device:
        return _device(args)
    return _runs(args)


def _device(args: argparse.Namespace) -> int:
    from roofline.calibrate import render
    from roofline.calibrate.device import run_device_calibration
    from roofline.calibrate.write import chip_to_toml, profile_to_toml

    quiet = args.json
    say = None if quiet else progress_write
    if say:
        say(f"timing microbenchmarks{' (quick)' if args.quick else ''} ...")
    args.base = args.base or "datasheet"
    cal = run_device_calibration(quick=args.quick, base=args.base, chip=args.chip, progress=say)
    written = _write_device(args.out, cal, profile_to_toml, chip_to_toml)
    d = cal.to_dict() | {"written": written}
    inputs = {"quick": args.quick, "base": args.base, "chip": cal.chip.name}
    return emit(args, NAME, inputs, d, _device_text(cal, written, render))


def _write_device(out: str | None, cal, profile_to_toml, chip_to_toml) -> list[str]:
    if not out:
        return []
    path = Path(out)
    head = f"Written by `roofline calibrate --device`: {cal.after.source}.\nRegenerate on the same machine with the same command."
    path.write_text(profile_to_toml(cal.after, head))
    written = [str(path)]
    if cal.chip.vendor == "cpu":  # not in the catalog: write the chip the profile's family covers
        chip_path = path.with_name(path.stem + ".chip.toml")
        chip_path.write_text(
            chip_to_toml(
                cal.chip,
                "The calibrating host CPU as a chip (nominal peaks = best measured rates).",
            )
        )
        written.append(str(chip_path))
    return written


def _device_text(cal, written: list[str], render) -> str:
    from roofline.calibrate.device import KernelKind, tflops

    rates = []
    for k, m in zip(cal.kernels, cal.measured_s, strict=True):
        if k.kind in (KernelKind.MATMUL, KernelKind.ATTENTION):
            rates.append(f"{tflops(k, m):.3g} TFLOP/s")
        else:
            rates.append(f"{k.nbytes / m / 1e9:.3g} GB/s")
    pb, pa = cal.predicted_before_s, cal.predicted_after_s
    kinds = [k.kind.value for k in cal.kernels]
    lines = [
        f"Device: {cal.device_kind} ({cal.platform}), chip {cal.chip.name}, JAX {cal.jax_version}",
        *[f"Note: {n}" for n in cal.notes],
        "",
        render.kernel_table([k.label for k in cal.kernels], rates, cal.measured_s, pb, pa),
        "",
        "How far the datasheet-only profile was, and the fitted one (signed error = predicted/measured - 1):",
        render.by_kind(kinds, cal.measured_s, pb, pa),
        "",
        f"Fitted parameters of family '{cal.after.family_for(cal.chip).family}':",
        render.fit_table(cal.result),
        "",
        f"Profile: {cal.after.describe()} — {cal.after.source}",
    ]
    lines += [f"Wrote {w}" for w in written] or ["(not written: pass --out FILE to keep it)"]
    return "\n".join(lines)


def _runs(args: argparse.Namespace) -> int:
    from roofline.calibrate.ship import calibrate_from_runs, runs_text
    from roofline.cli._common import int_flag

    if _is_serving(args.from_runs):
        return _serving(args)
    args.base = args.base or "datasheet"
    jobs = None if args.jobs is None else int_flag(args.jobs, "jobs", hi=64, example="2")
    try:
        say = None if args.json else progress_write
        res = calibrate_from_runs(
            args.from_runs,
            framework=args.framework,
            base=args.base,
            out=args.out,
            docs=args.docs,
            cv=not args.no_cv,
            jobs=jobs,
            progress=say,
        )
    except ModuleNotFoundError as e:  # the run readers live in roofline.validate (h3)
        if not (e.name or "").startswith("roofline.validate"):
            raise
        raise SpecError(
            f"calibrate --from-runs needs the measured-run readers of `roofline validate` ({e.name} is missing)",
            rule="runs are read, mapped to plans and predicted by roofline.validate",
            fix="use a build that includes `roofline validate`",
        ) from None
    inputs = {"from_runs": args.from_runs, "framework": args.framework, "base": args.base}
    return emit(args, NAME, inputs, res.to_dict(), runs_text(res))


def _is_serving(path: str) -> bool:
    try:
        from roofline.validate.runfile import Schema, load_runs
    except ModuleNotFoundError:  # the training path says what is missing
        return False
    return load_runs(path).schema != Schema.TRAINING


def _serving(args: argparse.Namespace) -> int:
    """Serving runs: fit the disaggregated hand-off (roofline.calibrate.serving)."""
    from roofline.calibrate.serving import calibrate_serving, runs_text

    if args.framework or args.jobs:
        raise SpecError(
            "--framework and --jobs select and split training runs",
            rule="a serving calibration fits every mapped disaggregated run, in one process",
            fix="drop --framework / --jobs",
        )
    say = None if args.json else progress_write
    res = calibrate_serving(
        args.from_runs,
        base=args.base or "fitted",
        out=args.out,
        docs=args.docs,
        cv=not args.no_cv,
        progress=say,
    )
    inputs = {"from_runs": args.from_runs, "base": args.base or "fitted"}
    return emit(args, NAME, inputs, res.to_dict(), runs_text(res))
