"""The launch line of a chosen plan, for `train` / `serve` output and the report page.

`train` and `serve` end with the plan they chose; this writes it in the language of the stack
that was costed (`--framework` / `--engine`, or the one `auto` picked) through that stack's
own writer (`write_launch`), so what the user copies is what `roofline export` would write.
A stack without a writer (`ideal`, `llm-foundry`, `jetstream`) gives None; a plan the stack
cannot say gives no text and the writer's reason, never a line that launches something else.
"""

from __future__ import annotations

from typing import Any

from roofline.core.stack import stack_of
from roofline.launch.base import (
    STACK_MODULES,
    LaunchConfig,
    LaunchError,
    LaunchKind,
    LaunchWorkload,
    write_launch,
)
from roofline.launch.serving_common import from_serve
from roofline.specs.plan import Plan

SERVING_STACKS = ("vllm", "sglang", "trtllm")


def _written(config: LaunchConfig, stack: str) -> dict[str, Any]:
    try:
        return {"stack": stack, "text": write_launch(config, stack), "reason": None}
    except LaunchError as e:
        return {"stack": stack, "text": None, "reason": str(e)}


def training_launch(
    stack: str,
    *,
    model: str,
    plan: Plan,
    seq_len: int,
    global_batch_sequences: int,
    precision: str | None = None,
    offload_optimizer: bool = False,
) -> dict[str, Any] | None:
    """{'stack', 'text', 'reason'} for a training plan in `stack`'s format, or None when the
    stack has no writer. `offload_optimizer`: the plan keeps its optimizer state in host memory
    (`training.offload`), written where the stack's framework record says it can."""
    if stack not in STACK_MODULES or stack in SERVING_STACKS:
        return None
    options = {"precision": precision} if precision else {}
    if offload_optimizer:
        if stack_of(stack).framework.data_parallel.optimizer_offload is None:
            return {
                "stack": stack,
                "text": None,
                "reason": f"{stack}'s framework record has no [data_parallel.optimizer_offload]: "
                "its launch file cannot keep the optimizer in host memory",
            }
        options["offload_optimizer"] = "true"
    config = LaunchConfig(
        stack=stack,
        kind=LaunchKind.TRAINING,
        model=model,
        plan=plan,
        workload=LaunchWorkload(seq_len=seq_len, global_batch_sequences=global_batch_sequences),
        options=options,
    )
    return _written(config, stack)


def serving_launch(
    engine: str | None,
    *,
    model: str,
    plan: dict[str, Any],
    chips: int,
    quant: dict[str, str],
    draft: int | None = None,
) -> dict[str, Any] | None:
    """{'stack', 'text', 'reason'} for a serving plan (`serve`'s best row: its plan dict, the
    GPUs of all its replicas and its quant) as `engine`'s launch line, or None when the engine
    has no writer."""
    if engine not in SERVING_STACKS:
        return None
    try:
        config = from_serve(
            engine,
            model=model,
            plan=plan,
            chips=chips,
            weight_dtype=quant["weights"],
            kv_dtype=quant["kv"],
            compute_dtype=quant["compute"],
            draft=draft,
        )
    except LaunchError as e:
        return {"stack": engine, "text": None, "reason": str(e)}
    return _written(config, engine)


def launch_text(launch: dict[str, Any] | None) -> str:
    """The launch section of `train` / `serve`'s text output ('' when there is none)."""
    if not launch:
        return ""
    if launch["text"] is None:
        return (
            f"\n\nLaunch ({launch['stack']}): not written. {launch['reason']} "
            f"(roofline export --to {launch['stack']} writes the best listed plan it can say.)"
        )
    body = "\n".join("  " + s for s in launch["text"].rstrip("\n").splitlines())
    return f"\n\nLaunch ({launch['stack']}, as roofline export --to {launch['stack']} writes it):\n{body}"


__all__ = ["SERVING_STACKS", "launch_text", "serving_launch", "training_launch"]
