"""validate's MaxText defaults and the maxtext stack profile agree on collective matmul: XLA's
windowed-einsum collective matmul is on by default on TPU (MaxText ships a flag set to switch
it off, DISABLE_COLLECTIVE_MATMUL, and '*-no-collective-matmul' recipes that add it), so a TP
run that does not say is costed with it on (validate leaves the plan's switch unset; the
profile's default `tpu` decides), and off on GPUs."""

from __future__ import annotations

from roofline.core.stack import chip_requirements, stack_of
from roofline.specs.plan import parse_plan
from roofline.specs.system import parse_system
from roofline.validate.sources import STACKS


def test_validate_leaves_maxtext_collective_matmul_to_the_profile():
    st = STACKS["maxtext"]
    assert st.collective_matmul is False  # not written: the plan's switch stays unset
    assert "on on TPU" in st.cm_why and "DISABLE_COLLECTIVE_MATMUL" in st.cm_why
    plan = parse_plan("fsdp=16,tp=4,megatron_sp=1,remat=full")
    on_tpu = chip_requirements(parse_system("tpu-v5p:4x4x4").chip)
    on_gpu = chip_requirements(parse_system("h100:64").chip)
    assert stack_of("maxtext").plan_overlap(plan, on_tpu)["collective_matmul"] is True
    assert stack_of("maxtext").plan_overlap(plan, on_gpu)["collective_matmul"] is False


def test_a_mapped_maxtext_tpu_tp_run_is_costed_with_collective_matmul(training_entries):
    from roofline.validate.training_runs import map_training_run

    x = map_training_run(training_entries["maxtext-v5p-128-64b"]).inputs
    assert x.plan.degrees.tp > 1 and x.plan.collective_matmul is None
    held = chip_requirements(x.system.chip)
    assert stack_of("maxtext").plan_overlap(x.plan, held)["collective_matmul"] is True
