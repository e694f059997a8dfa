"""Speed as ratios against a recorded baseline commit, measured side by side in one run
(issue 21 item 3): not wall-clock asserts, which a shared 2-core machine cannot keep.

Every measurement runs in a fresh Python process per source tree (this one, the baseline,
optionally the old core), the trees interleaved round by round; the figure kept per tree is
the best round's CPU seconds (user + system of that process and its children: what the work
costs, less sensitive than the wall clock to the other jobs on the machine; the wall clock is
printed beside it). A ratio > 1 means this tree is faster.

    git worktree add /tmp/base 494a97b        # the baseline: main after the package move
    git worktree add /tmp/old dae05df         # the old core: the commit before the stacks
    python benchmarks/bench_ratios.py --base /tmp/base --old /tmp/old [--rounds 3] [--only NAME ...]
    python benchmarks/bench_ratios.py --base /tmp/base --only calibrate   # minutes per tree

Measurements (name: what, target):
- one_plan: `evaluate_plan` of LLaMA-3 70B, fsdp=1024,tp=4 on tpu-v5p:16x16x16, 4Mi tokens of
  4096, the chip's default stack; ms per plan, cold (eight distinct plans, each costed once
  after a warm-up on another model), repeated (the same plan again) and under a new profile
  (the same plan, each time under a copy of the default profile: a new object with the same
  numbers) and under new fractions (the same plan, each time under a profile whose GEMM and
  attention fractions moved, as `calibrate`'s fit moves them: the mean of 20). Target < 1 ms,
  >= 10x.
- planner: costed plans per CPU second of `plan_training` on GPT-3 175B, a100:1024, the same
  workload, the default stack (the old core: its idealised machine, the only one it had), the
  first search of the process after a warm-up on another model. Target >= 1M/s and >= 2x the
  old core's rate.
- planner_ideal (only with --only): the same search on the idealised machine (no stack: the
  old core's only machine, the same 117,771 plans it costs), so the old core's rate is
  compared on the same plans.
- serve: `serving.search` of LLaMA-3 70B on h100:64 (vLLM, three quantisations; bench_serve's
  case). Target < 0.5 s.
- validate_serving: `roofline validate --runs serving` (the 400 serving points). Target < 10 s.
- calibrate: `roofline calibrate --from-runs training` (with its cross-validation). Target
  < 60 s. Only with --only calibrate: it takes minutes per tree.
- report: `roofline report` run twice, the second (warm) timed. Target < 3 s.
- help, chips: `roofline --help` and `roofline chips`. Target: help no slower than chips.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

ONE_PLAN = """
import json, time
try:
    from roofline.specs.model_catalog import load_model
except ImportError:  # trees before the import-cycle fix (494a97b, the old core)
    from roofline.specs.model import load_model
from roofline.specs.system import parse_system
from roofline.specs.plan import parse_plan, Workload
from roofline.training.step import evaluate_plan
from roofline.core.stack import resolve_framework
s = parse_system("tpu-v5p:16x16x16")
fw = resolve_framework("auto", s.chip)
w = Workload(4 * 2**20, 4096)
evaluate_plan(load_model("llama-3-8b"), s, w, parse_plan("fsdp=1024,tp=4"), framework=fw)  # warm-up
m = load_model("llama-3-70b")
plans = ["fsdp=1024,tp=4", "fsdp=512,tp=8", "fsdp=256,tp=16", "dp=4,fsdp=256,tp=4",
         "fsdp=1024,sp=4", "dp=2,fsdp=512,tp=4", "fsdp=512,tp=4,sp=2", "dp=8,fsdp=128,tp=4"]
cold = []
for text in plans:
    p = parse_plan(text)
    t = time.process_time(); evaluate_plan(m, s, w, p, framework=fw); cold.append(time.process_time() - t)
p = parse_plan(plans[0])
warm = []
for _ in range(20):
    t = time.process_time(); r = evaluate_plan(m, s, w, p, framework=fw); warm.append(time.process_time() - t)
import copy
from roofline.training.step import training_profile
eff = training_profile(None)
fresh = []
for _ in range(20):  # the same plan under a new profile object each time (calibrate's case)
    e = copy.copy(eff)
    t = time.process_time(); evaluate_plan(m, s, w, p, framework=fw, efficiency=e); fresh.append(time.process_time() - t)
from roofline.calibrate import scales
moved = []
for i in range(20):  # under new GEMM and attention fractions each time (calibrate's fit)
    e = scales.apply(eff, {"gemm_scale": 1.0 - 1e-3 * (i + 1), "attn_scale": 1.0 + 1e-3 * i})
    t = time.process_time(); evaluate_plan(m, s, w, p, framework=fw, efficiency=e); moved.append(time.process_time() - t)
print(json.dumps({"cold_ms": 1e3 * sum(cold) / len(cold), "repeat_ms": 1e3 * min(warm),
                  "profile_ms": 1e3 * min(fresh), "moved_ms": 1e3 * sum(moved) / len(moved),
                  "step_time_s": r.step_time_s}))
"""

PLANNER = """
import json, os, time
try:
    from roofline.training.planner import plan_training
    from roofline.training.step import Workload
    from roofline.core.stack import resolve_framework
    new = True
except ImportError:  # the old core's layout (no stacks: the idealised machine)
    from roofline.planner import plan_training
    from roofline.training import Workload
    new = False
try:
    from roofline.specs.model_catalog import load_model
except ImportError:  # trees before the import-cycle fix (494a97b, the old core)
    from roofline.specs.model import load_model
from roofline.specs.system import parse_system
s = parse_system("a100:1024")
ideal = os.environ.get("ROOFLINE_BENCH_IDEAL") == "1"  # planner_ideal: the idealised machine
kw = {"framework": resolve_framework("auto", s.chip)} if new and not ideal else {}
plan_training(load_model("llama-3-8b"), parse_system("a100:64"), Workload(2**20, 4096, 1e12), **kw)
m = load_model("gpt-3-175b")
w = Workload(4 * 2**20, 4096, 15e12)
t = time.process_time(); r = plan_training(m, s, w, **kw); dt = time.process_time() - t
print(json.dumps({"costed": r.candidates_evaluated, "seconds": dt,
                  "plans_per_s": r.candidates_evaluated / dt, "best": r.best.plan.describe()}))
"""

SERVE = """
import json, time
from roofline.serving.inference import Quant
from roofline.serving.search import Objective, ServeQuery, search
from roofline.serving.steady import Workload
from roofline.specs.engines import load_engine
try:
    from roofline.specs.model_catalog import load_model
except ImportError:  # trees before the import-cycle fix (494a97b, the old core)
    from roofline.specs.model import load_model
from roofline.specs.system import parse_system
def once(model, system):
    q = ServeQuery(load_model(model), parse_system(system), Workload(1024, 256, concurrency=256),
                   quants=(Quant(), Quant("fp8", "fp8", "bf16"), Quant("fp8", "fp8", "fp8")),
                   engine=load_engine("vllm"), slo_tpot_s=0.05, objective=Objective.COST)
    t = time.process_time(); search(q); return time.process_time() - t
once("llama-3-8b", "h100:8")  # warm-up
print(json.dumps({"seconds": once("llama-3-70b", "h100:64")}))
"""


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(tree: Path, argv: list[str], env: dict[str, str] | None = None) -> dict:
    """One process on `tree`'s sources: its CPU and wall seconds, and its JSON line if any."""
    e = dict(os.environ, PYTHONPATH=str(tree / "src"), **(env or {}))
    c0, t0 = _child_cpu(), time.perf_counter()
    p = subprocess.run(
        [sys.executable, *argv], env=e, cwd=tree, capture_output=True, text=True, check=False
    )
    out = {"cpu_s": _child_cpu() - c0, "wall_s": time.perf_counter() - t0, "rc": p.returncode}
    if p.returncode != 0:
        out["error"] = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["?"]
        return out
    last = p.stdout.strip().splitlines()[-1:] if p.stdout.strip() else []
    if last and last[0].startswith("{"):
        out.update(json.loads(last[0]))
    return out


def _cli(*args: str) -> list[str]:
    return ["-m", "roofline", *args]


def measure(name: str, tree: Path, tmp: Path) -> dict:
    if name == "one_plan":
        return run(tree, ["-c", ONE_PLAN])
    if name == "planner":
        return run(tree, ["-c", PLANNER])
    if name == "planner_ideal":
        return run(tree, ["-c", PLANNER], {"ROOFLINE_BENCH_IDEAL": "1"})
    if name == "serve":
        return run(tree, ["-c", SERVE])
    if name == "validate_serving":
        return run(tree, _cli("validate", "--runs", "serving"))
    if name == "calibrate":
        out = tmp / f"fit-{tree.name}.toml"
        return run(tree, _cli("calibrate", "--from-runs", "training", "--out", str(out)))
    if name == "report":
        env = {"ROOFLINE_CACHE_DIR": str(tmp / f"cache-{tree.name}")}
        html = str(tmp / f"report-{tree.name}.html")
        run(tree, _cli("report", "--out", html), env)  # cold: fills the caches
        return run(tree, _cli("report", "--out", html), env)
    if name == "help":
        return run(tree, _cli("--help"))
    if name == "chips":
        return run(tree, _cli("chips"))
    raise SystemExit(f"unknown measurement {name!r}")


# what each measurement reports (key, unit, smaller is better?) beside its CPU seconds
FIGURES = {
    "one_plan": (
        ("cold_ms", "ms/plan cold", True),
        ("repeat_ms", "ms/plan repeated", True),
        ("profile_ms", "ms/plan new profile", True),
        ("moved_ms", "ms/plan new fractions", True),
    ),
    "planner": (("plans_per_s", "costed plans/s", False), ("costed", "plans costed", None)),
    "planner_ideal": (("plans_per_s", "costed plans/s", False), ("costed", "plans costed", None)),
    "serve": (("seconds", "s search", True),),
}
DEFAULT = ("one_plan", "planner", "serve", "validate_serving", "report", "help", "chips")


def best(rounds: list[dict]) -> dict:
    ok = [r for r in rounds if r.get("rc") == 0]
    return min(ok, key=lambda r: r["cpu_s"]) if ok else rounds[-1]


def _fmt(v: object) -> str:
    return f"{v:,.3g}" if isinstance(v, float) else str(v)


def report(name: str, results: dict[str, dict]) -> list[str]:
    lines = []
    trees = list(results)
    here = results[trees[0]]
    for key, unit, smaller in (*FIGURES.get(name, ()), ("cpu_s", "CPU s", True)):
        vals = {t: results[t].get(key) for t in trees}
        cells = "  ".join(f"{t} {_fmt(v)}" for t, v in vals.items())
        ratios = ""
        for t in trees[1:]:
            a, b = here.get(key), results[t].get(key)
            if smaller is None or not a or not b:
                continue
            r = b / a if smaller else a / b
            ratios += f"  {r:.2f}x vs {t}"
        lines.append(f"{name:17s} {unit:18s} {cells}{ratios}")
    if "wall_s" in here:
        lines.append(
            f"{'':17s} {'wall s':18s} "
            + "  ".join(f"{t} {_fmt(results[t].get('wall_s'))}" for t in trees)
        )
    for t in trees:
        if results[t].get("rc"):
            lines.append(f"{'':17s} {t} failed: {results[t].get('error')}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="worktree of the baseline commit")
    ap.add_argument("--old", type=Path, help="worktree of the old core (planner only)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=list(DEFAULT))
    args = ap.parse_args()
    trees = {"this": HERE, "base": args.base.resolve()}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in args.only:
            use = dict(trees)
            if name in ("planner", "planner_ideal") and args.old is not None:
                use["old"] = args.old.resolve()
            rounds = 1 if name == "calibrate" else args.rounds
            got: dict[str, list[dict]] = {t: [] for t in use}
            for _ in range(max(rounds, 1)):
                for t, path in use.items():
                    got[t].append(measure(name, path, tmp))
            for line in report(name, {t: best(r) for t, r in got.items()}):
                print(line, flush=True)


if __name__ == "__main__":
    main()
