"""Partial recompute (Megatron's --recompute-granularity selective --recompute-modules ...):
the plan's `remat=a+b`, its saved bytes and its reruns (issue 19 item 1)."""

from __future__ import annotations

import pytest

from roofline.core.ledger import build_ledger
from roofline.core.memory import (
    Remat,
    RematKind,
    parse_remat,
    recompute_flops_fraction,
    saved_activation_bytes_per_token,
)
from roofline.errors import PlanError, SpecError
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import RECOMPUTE_MODULES
from roofline.specs.system import parse_system
from roofline.training.step import Workload, evaluate_plan, parse_plan, step_terms

LLAMA = load_model("llama-3-8b")
DSV3 = load_model("deepseek-v3")


def per_token_layer(model, remat: str) -> float:
    """Saved bytes per token per layer, all layers averaged (bf16, flash attention)."""
    led = build_ledger(model, batch=1, seq=1)
    return saved_activation_bytes_per_token(led, parse_remat(remat)) / model.n_layers


def test_modules_parse_in_megatrons_order_and_print_back():
    r = parse_remat("moe_act+mla_up_proj+layernorm")
    assert r.kind == RematKind.MODULES
    assert r.modules == ("mla_up_proj", "layernorm", "moe_act")
    assert parse_remat(str(r)) == r and str(r) == "mla_up_proj+layernorm+moe_act"
    assert parse_plan("dp=8,remat=mlp+core_attn").remat.modules == ("core_attn", "mlp")
    assert set(RECOMPUTE_MODULES) >= {"core_attn", "mla_up_proj", "moe_act", "layernorm"}


@pytest.mark.parametrize("text", ["attention", "mlp+attention", "+"])
def test_unknown_modules_are_refused(text):
    with pytest.raises(SpecError, match="recomputed modules"):
        parse_remat(text)


def test_a_modules_remat_names_its_modules_and_only_it():
    with pytest.raises(PlanError, match="partial recompute"):
        Remat(RematKind.MODULES)
    with pytest.raises(PlanError, match="partial recompute"):
        Remat(RematKind.FULL, modules=("mlp",))
    with pytest.raises(PlanError, match="partial recompute"):
        Remat(RematKind.MODULES, modules=("mlp", "core_attn"))  # not Megatron's order


def test_dense_mlp_recompute_drops_the_mlp_activations():
    """Llama 3 8B (D=4096, F=14336, bf16): no remat keeps x, q, k, v, ctx (attention block)
    and x, g, u, h (MLP block) plus the two norms' copies of x; recomputing the MLP drops
    g, u and h (3·2F bytes per token), recomputing the layernorms their 2·2D."""
    d, f = LLAMA.d_model, LLAMA.d_ff
    none = per_token_layer(LLAMA, "none")
    assert none - per_token_layer(LLAMA, "mlp") == pytest.approx(3 * 2 * f)
    assert none - per_token_layer(LLAMA, "layernorm") == pytest.approx(2 * 2 * d)
    # a module the model does not have drops nothing
    assert per_token_layer(LLAMA, "mla_up_proj") == pytest.approx(none)
    assert per_token_layer(LLAMA, "moe_act") == pytest.approx(none)


def test_mla_up_projection_recompute_drops_q_k_v_and_the_kv_projection():
    """DeepSeek-V3 (128 heads, qk 128+64, v 128): the up-projections' outputs q (H·192),
    kv (H·(128+128)) and the keys (H·192) and values (H·128) split from kv, in bf16."""
    h = 128
    dropped = 2 * h * (192 + 256 + 192 + 128)
    assert per_token_layer(DSV3, "none") - per_token_layer(DSV3, "mla_up_proj") == pytest.approx(
        dropped
    )


def test_rerun_flops_are_the_modules_forward():
    led = build_ledger(LLAMA, batch=1, seq=4096)
    fwd = sum(o.flops for o in led if o.name not in ("embed", "unembed", "loss"))
    mlp = sum(o.flops for o in led if o.name.startswith("mlp/"))
    assert recompute_flops_fraction(led, parse_remat("mlp")) == pytest.approx(mlp / fwd)
    assert recompute_flops_fraction(led, parse_remat("mla_up_proj")) == 0.0


def test_the_step_reruns_exactly_the_modules_forward():
    """The walk's reruns: remat=mlp recomputes the four MLP rows' forward (the last projection
    included: Megatron checkpoints the whole MLP submodule), nothing else."""
    layers = tuple(o.name for o in build_ledger(LLAMA) if o.name not in ("embed", "unembed"))
    s, w = parse_system("h100:8"), Workload(2**16, 4096)
    mlp_rows = tuple(n for n in layers if n.startswith("mlp/"))
    none = step_terms(LLAMA, s, w, parse_plan("dp=8,remat=none"), ops=mlp_rows)
    part = step_terms(LLAMA, s, w, parse_plan("dp=8,remat=mlp"), ops=layers)
    assert part["t_math_recompute_s"] == pytest.approx(none["t_math_forward_s"], rel=1e-9)
    noop = step_terms(LLAMA, s, w, parse_plan("dp=8,remat=mla_up_proj"), ops=layers)
    assert noop["t_math_recompute_s"] == 0.0


def test_partial_recompute_sits_between_none_and_full():
    s, w = parse_system("h100:8"), Workload(2**17, 4096)
    cost = {
        r: evaluate_plan(LLAMA, s, w, parse_plan(f"dp=8,microbatch=4,remat={r}"))
        for r in ("none", "mlp", "full")
    }
    acts = {r: c.memory_breakdown["activations"] for r, c in cost.items()}
    assert acts["full"] < acts["mlp"] < acts["none"]
    assert cost["none"].step_time_s < cost["mlp"].step_time_s < cost["full"].step_time_s
    # the activations scale with the saved bytes per token of the rule
    ratio = per_token_layer(LLAMA, "mlp") / per_token_layer(LLAMA, "none")
    assert acts["mlp"] / acts["none"] == pytest.approx(ratio, rel=0.02)


def test_bf16_gradients_halve_the_replicas_gradient_sum():
    """A master-weights optimizer with a bf16 gradient buffer (Megatron grad_reduce_in_fp32 =
    False) reduces it in bf16: half the bytes of Megatron's default fp32 reduction; the book's
    adam-bf16 keeps the stack's own reduction dtype."""
    from roofline.core.stack import stack_of
    from roofline.specs.plan import OPTIMIZERS
    from roofline.training.step import _grad_reduce_factor

    mega = stack_of("megatron")
    assert _grad_reduce_factor(mega, OPTIMIZERS["adam-fp32-master"]) == 2.0
    assert _grad_reduce_factor(mega, OPTIMIZERS["adam-fp32-master-bf16-grads"]) == 1.0
    assert _grad_reduce_factor(mega, OPTIMIZERS["adam-bf16"]) == 2.0
    assert OPTIMIZERS["adam-fp32-master-bf16-grads"].bytes_per_param == 16.0


def test_recompute_of_a_module_the_model_lacks_is_refused():
    """mla_up_proj on a GQA model and moe_act on a dense one are named, not silently costed."""
    from roofline.specs.model_catalog import load_model
    from roofline.specs.plan import Workload, parse_plan
    from roofline.training.feasibility import plan_problems

    dense = load_model("llama-3-8b")
    work = Workload(2**20, 8192)
    bad = plan_problems(dense, 8, work, parse_plan("fsdp=8,remat=mla_up_proj+moe_act+mlp"))
    assert len(bad) == 1 and "mla_up_proj, moe_act" in bad[0] and "llama-3-8b" in bad[0]
    assert plan_problems(dense, 8, work, parse_plan("fsdp=8,remat=mlp+core_attn")) == []
    moe = load_model("deepseek-v3")
    assert not any(
        "recomputes" in p
        for p in plan_problems(moe, 64, work, parse_plan("fsdp=64,remat=mla_up_proj+moe_act"))
    )
