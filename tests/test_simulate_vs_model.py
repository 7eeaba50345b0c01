"""The cost model's pipeline formula against the discrete-event simulation (planner/simulate.py) on real plans."""

from __future__ import annotations

import pytest

from planner.baselines.common import build_plan, cost_model
from planner.bench import pipeline_inputs
from planner.inputs.cluster import parse_cluster
from planner.inputs.resolve import resolve_run
from planner.schemas.plan import Recompute
from planner.simulate import analytic_1f1b_s, simulate_pipeline


def priced(profiles, model, cluster_name, *, tp=1, ep=1, dp, pp, vpp=1, types=None, layers=None):
    """PlanCost of a megatron plan (full recompute so every shape fits) with GBS = 16 x GPUs."""
    cluster = parse_cluster(cluster_name, profiles)
    run = resolve_run(model=model, world_size=cluster.world_size, overrides={"gbs": 16 * cluster.world_size})
    n = run.model.num_layers
    plan = build_plan(tp=tp, cp=1, ep=ep, etp=1, mbs=1, gbs=run.training.global_batch_size, dp=dp,
                      types=types or [cluster.device_types[0]] * pp, layers=layers or [n // pp] * pp,
                      recompute=Recompute.full("uniform", 1), vpp=vpp)
    pc = cost_model(run, cluster, profiles).evaluate(plan)
    assert pc.fits
    return pc


UNIFORM = [
    ("mixtral-s", "h800-16", dict(ep=8, dp=8, pp=2)),
    ("mixtral-s", "h800-16", dict(ep=8, dp=4, pp=4)),
    ("llama2-7b", "a100-910b", dict(dp=8, pp=4)),
]


@pytest.mark.parametrize("model,cluster,kw", UNIFORM)
def test_uniform_stages_simulation_within_one_percent(profiles, model, cluster, kw):
    """On same-device, even-split plans the simulated 1F1B pipeline is within 1% of the cost model's formula."""
    pc = priced(profiles, model, cluster, **kw)
    fwd, bwd, p2p = pipeline_inputs(pc)
    sim = simulate_pipeline(fwd, bwd, pc.num_microbatches, p2p_s=p2p)
    assert sim.iteration_time_s == pytest.approx(pc.pipeline_s, rel=0.01)
    # the per-boundary decomposition reproduces the formula exactly (same inputs, same algebra)
    assert analytic_1f1b_s(fwd, bwd, pc.num_microbatches, p2p) == pytest.approx(pc.pipeline_s, rel=1e-9)


def test_interleaved_uniform_within_one_percent(profiles):
    """With VPP=2 the interleaved schedule's simulation matches the formula's v-fold smaller bubble within 1%."""
    pc = priced(profiles, "mixtral-s", "h800-16", ep=8, dp=4, pp=4, vpp=2)
    fwd, bwd, p2p = pipeline_inputs(pc)
    sim = simulate_pipeline(fwd, bwd, pc.num_microbatches, p2p_s=p2p, schedule="interleaved", vpp=2)
    assert sim.iteration_time_s == pytest.approx(pc.pipeline_s, rel=0.01)


def test_non_uniform_stages_difference_reported(profiles):
    """On a heterogeneous, non-uniform plan the difference is printed; the simulation never exceeds the formula
    (the formula charges every stage both links per micro-batch) and stays within 5% of it."""
    pc = priced(profiles, "mixtral-s", "h800-910b", ep=8, dp=4, pp=8,
                types=["910B"] * 4 + ["H800"] * 4, layers=[3, 3, 3, 3, 5, 5, 5, 5])
    fwd, bwd, p2p = pipeline_inputs(pc)
    sim = simulate_pipeline(fwd, bwd, pc.num_microbatches, p2p_s=p2p)
    diff = sim.iteration_time_s / pc.pipeline_s - 1
    print(f"non-uniform stages: simulated {sim.iteration_time_s:.4f} s, formula {pc.pipeline_s:.4f} s, "
          f"difference {diff:+.2%}")
    assert sim.iteration_time_s <= pc.pipeline_s * (1 + 1e-9)
    assert abs(diff) < 0.05


def test_pipeline_inputs_split_each_link_between_two_stages(profiles):
    """Every boundary's send is charged to both neighbours, so the boundaries sum to half the stages' pp_comm_s."""
    pc = priced(profiles, "mixtral-s", "h800-910b", ep=8, dp=4, pp=8,
                types=["910B"] * 4 + ["H800"] * 4, layers=[3, 3, 3, 3, 5, 5, 5, 5])
    _, _, p2p = pipeline_inputs(pc)
    assert len(p2p) == 7
    assert sum(p2p) == pytest.approx(sum(s.pp_comm_s for s in pc.stages) / 2, rel=1e-9)
    assert p2p[3] > p2p[0]  # the 910B -> H800 boundary crosses device types: the slowest link
