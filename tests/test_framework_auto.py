"""`--framework auto`, the CLI's default for `train` and `report`: the chip vendor's reference
stack (roofline.core.stack.resolve_framework). TPU -> maxtext, NVIDIA and AMD GPUs -> megatron;
`--framework ideal` is the book's idealised machine, exactly what the Python API costs by
default (framework=None)."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest

from roofline.cli import main
from roofline.core.stack import (
    auto_reason,
    default_framework_for,
    is_auto,
    resolve_framework,
    stack_of,
)
from roofline.errors import VerifyError
from roofline.specs.chip import chip_names, load_chip
from roofline.specs.efficiency import load_profile
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system
from roofline.training.step import Workload, evaluate_plan, parse_plan

PLAN = ["--model", "llama-3-8b", "--batch-tokens", "1Mi", "--tokens", "1T", "--plan", "fsdp=16"]


def _json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "chip,stack",
    [
        ("tpu-v5p", "maxtext"),
        ("tpu-v5e", "maxtext"),
        ("tpu-v6e", "maxtext"),
        ("h100", "megatron"),
        ("b200", "megatron"),
        ("gb200", "megatron"),
        ("a100", "megatron"),
        ("mi300x", "megatron"),
        ("mi355x", "megatron"),
    ],
)
def test_auto_resolves_per_chip_vendor(chip, stack):
    c = load_chip(chip)
    assert default_framework_for(c) == stack
    assert resolve_framework("auto", c) == resolve_framework(" AUTO ", c) == stack
    assert stack_of(resolve_framework("auto", c)).name == stack
    assert auto_reason(c).endswith(f"→ {stack}")


def test_every_catalog_chip_has_a_reference_stack():
    """Every shipped chip is a TPU or a GPU with a reference stack: auto never falls back."""
    for name in chip_names():
        assert default_framework_for(load_chip(name)) in ("maxtext", "megatron"), name


def test_resolve_leaves_named_stacks_alone_and_unknown_vendors_get_the_ideal_machine():
    h100 = load_chip("h100")
    for fw in (None, "ideal", "torchtitan", "jax", "some/profile.toml"):
        assert resolve_framework(fw, h100) == fw
    assert default_framework_for(SimpleNamespace(vendor="cpu")) == "ideal"
    assert default_framework_for(None) == "ideal"
    assert is_auto("auto") and not is_auto(None) and not is_auto("ideal")


@pytest.mark.parametrize(
    "system,stack,why",
    [
        ("tpu-v5e:4x4", "maxtext", "tpu → maxtext"),
        ("h100:16", "megatron", "nvidia gpu → megatron"),
        ("b200:16", "megatron", "nvidia gpu → megatron"),
        ("mi300x:16", "megatron", "amd gpu → megatron"),
    ],
)
def test_train_default_is_auto_and_says_so(capsys, system, stack, why):
    d = _json(capsys, ["train", "--system", system, *PLAN])
    assert d["inputs"]["framework"] == "auto"
    assert d["inputs"]["framework_resolved"] == d["framework"] == stack
    assert d["efficiency"]["framework"] == stack  # the profile's fitted overrides of that stack
    assert main(["train", "--system", system, *PLAN]) == 0
    out = capsys.readouterr().out
    assert (
        f"Stack: {stack} (auto: {why}; --framework ideal for the book's idealised machine)" in out
    )
    named = _json(capsys, ["train", "--system", system, *PLAN, "--framework", stack])
    assert named["inputs"]["framework_resolved"] == stack
    assert named["step_time_s"] == d["step_time_s"]  # auto is exactly the named stack
    assert main(["train", "--system", system, *PLAN, "--framework", stack]) == 0
    assert "auto:" not in capsys.readouterr().out


@pytest.mark.parametrize("system", ["tpu-v5e:4x4", "h100:16"])
def test_framework_ideal_is_the_old_default_and_the_api_default(capsys, system):
    """--framework ideal through the CLI costs what evaluate_plan costs with framework=None."""
    d = _json(capsys, ["train", "--system", system, *PLAN, "--framework", "ideal"])
    assert d["inputs"]["framework_resolved"] == d["framework"] == "ideal"
    api = evaluate_plan(
        load_model("llama-3-8b"),
        parse_system(system),
        Workload(2**20, 4096, 1e12),
        parse_plan("fsdp=16,optimizer=adam-bf16"),
    )
    assert api.framework == "ideal"
    assert d["step_time_s"] == pytest.approx(api.step_time_s, rel=1e-12)
    assert d["mfu"] == pytest.approx(api.mfu, rel=1e-12)
    assert main(["train", "--system", system, *PLAN, "--framework", "ideal"]) == 0
    assert "Stack: the idealised machine (--framework ideal)" in capsys.readouterr().out


def test_realistic_default_is_slower_than_the_idealised_machine(capsys):
    for system in ("tpu-v5e:4x4", "h100:16"):
        auto = _json(capsys, ["train", "--system", system, *PLAN])
        ideal = _json(capsys, ["train", "--system", system, *PLAN, "--framework", "ideal"])
        assert auto["step_time_s"] > ideal["step_time_s"] and auto["mfu"] < ideal["mfu"]


def test_unknown_framework_is_one_paragraph(capsys):
    assert main(["train", "--system", "h100:16", *PLAN, "--framework", "no-such-stack"]) == 2
    err = capsys.readouterr().err
    assert "unknown framework" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_assume_mfu_is_framework_independent(capsys):
    argv = ["train", "--assume-mfu", "0.4", "--tokens", "15T"]
    auto = _json(capsys, argv)
    ideal = _json(capsys, [*argv, "--framework", "ideal"])
    assert auto["inputs"]["framework_resolved"] == "maxtext"
    assert auto["run_time_days"] == ideal["run_time_days"] == pytest.approx(44, rel=0.03)


def test_report_page_says_the_stack_was_chosen_automatically():
    from roofline.report.page import _framework

    auto = _framework("maxtext", {"framework": "auto", "framework_resolved": "maxtext"})
    assert auto.startswith("maxtext (chosen automatically") and "--framework ideal" in auto
    assert _framework("megatron", {"framework": "megatron"}) == "megatron"


def test_verify_accepts_auto_on_the_systems_chip():
    from roofline.cli.verify_cmd import _framework

    def ns(**kw):
        return argparse.Namespace(**{"framework": None, "system": None, **kw})

    assert _framework(ns(framework="auto", system="tpu-v5p:2x2x2")) == "maxtext"
    assert _framework(ns(framework="auto", system="h100:8")) == "megatron"
    assert _framework(ns()) is None  # its default stays the algebra's cheapest option
    assert _framework(ns(framework="maxtext")) == "maxtext"
    with pytest.raises(VerifyError, match="--system"):
        _framework(ns(framework="auto"))


def test_an_alias_gets_the_overrides_fitted_for_its_stack(capsys):
    """`--framework jax` is maxtext: the same stack, the same fitted per-framework overheads,
    the same step (the fitted profile stores overrides under the canonical name)."""
    argv = [*PLAN, "--system", "tpu-v5p:2x2x4"]
    by_alias = _json(capsys, ["train", *argv, "--framework", "jax"])
    by_name = _json(capsys, ["train", *argv, "--framework", "maxtext"])
    assert by_alias["overhead_time_s"] > 0  # maxtext's fitted overheads are in the step
    assert by_alias["step_time_s"] == pytest.approx(by_name["step_time_s"])
    assert by_alias["overhead_time_s"] == pytest.approx(by_name["overhead_time_s"])


def test_the_assumptions_line_states_the_physics_the_step_used(capsys):
    """With a physics profile the text names the chip family's numbers (not the constant view's
    0.8/0.9/0.8), including the stack's fitted fixed overheads."""
    assert main(["train", *PLAN, "--system", "h100:16", "--framework", "megatron"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Assumptions"))
    fam = load_profile("fitted").for_framework("megatron").family_for(load_chip("h100"))
    assert f"on {fam.family}" in line and f"bf16 {fam.mm_fraction['bf16']:.2f}" in line
    assert "ms per step" in line and "matmul 0.8" not in line
