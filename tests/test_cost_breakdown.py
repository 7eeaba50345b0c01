"""The iteration time split by mechanism (PlanCost.time_breakdown / time_shares): the split the uncertainty
ranges weight residuals by.  Each test states one property a wrong split would break."""

from __future__ import annotations

import pytest

from planner.calibration.runs import cases
from planner.cost.model import TIME_PARTS


@pytest.fixture(scope="module")
def priced(profiles):
    return [(c, c.price(profiles)) for c in cases(profiles)]


def test_breakdown_sums_to_the_iteration_time(priced):
    """On every calibration run (dense, MoE, PP, VPP, CP, recompute, FP8) the parts add up to the time."""
    for c, cost in priced:
        parts = cost.time_breakdown()
        assert sum(parts.values()) == pytest.approx(cost.iteration_time_s, rel=1e-9), c.id
        assert set(parts) <= set(TIME_PARTS), (c.id, set(parts) - set(TIME_PARTS))
        assert sum(cost.time_shares().values()) == pytest.approx(1.0, rel=1e-9), c.id


def test_stage_parts_sum_to_the_stage_time(priced):
    """A stage's per-micro-batch parts (its pipeline sends included) are its forward + backward."""
    for c, cost in priced:
        for s in cost.stages:
            assert sum(v for _, v in s.parts) == pytest.approx(s.time_s, rel=1e-9), (c.id, s.index)


def test_the_parts_name_what_the_plan_does(priced):
    """No expert time in a dense run, no bubble with one stage, recompute only where a run recomputes, context
    parallel time only with CP > 1."""
    for c, cost in priced:
        parts = cost.time_breakdown()
        assert ("expert_gemm" in parts) == c.run.model.is_moe, c.id
        assert "cp_comm" not in parts or c.plan.cp > 1, c.id
        if c.plan.pp == 1:
            assert "pipeline_bubble" not in parts and "pp_comm" not in parts, c.id
        if all(s.recompute.granularity == "none" for s in c.plan.stages):
            assert "recompute" not in parts, c.id
