"""A real 2-process JAX job over gloo on localhost, checked against one device."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")

from roofline.verify.distributed import gloo_available, run_local  # noqa: E402


@pytest.mark.hlo
def test_two_processes_match_single_device():
    ok, why = gloo_available()
    if not ok:
        pytest.skip(f"CPU collectives over gloo unavailable in this jaxlib: {why}")
    r = run_local("fsdp=4,tp=2", num_processes=2, local_devices=4, timeout_s=120)
    assert r.ok, "\n".join(r.logs)
    assert len(r.workers) == 2 and all(
        w.n_global_devices == 8 and w.n_local_devices == 4 for w in r.workers
    )
    assert r.max_abs_err < 1e-5
    assert r.workers[0].loss == pytest.approx(r.workers[0].loss_reference, rel=1e-5)
