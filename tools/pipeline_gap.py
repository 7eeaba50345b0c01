"""The cost model's pipeline time against the discrete-event timeline, plan by plan.

    python -m tools.pipeline_gap

For a small MoE (the flags of tests/test_trials_mixed.py) at PP 2 on one device type (H800:16) and on two
(H800:8,A100:8), each of VPP 1, 2, 3 and each layer split 4/4, 6/2, 2/6, prints
- `evaluate`: CostModel.evaluate's iteration_time_s (planner/cost/model.py `combine`);
- `timeline`: what tests/helpers/synthetic_log.py writes into a synthetic Megatron log: the pipeline schedule
  simulated from the stages' forward and backward seconds (planner/simulate.py, pipeline sends inside them) plus
  the slowest stage's sync;
- their gap, the share of `evaluate` that is the interleaved links' fill (StageCost.fill_out_s, which the timeline
  cannot see), and whether the slowest stage comes before a faster one (where the formula's bubble over-charges).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.baselines.common import build_plan  # noqa: E402
from planner.cost.model import CostModel, PlanCost  # noqa: E402
from planner.inputs.cluster import parse_cluster  # noqa: E402
from planner.inputs.megatron_flags import parse_megatron_flags  # noqa: E402
from planner.profile_tables import ProfileSet  # noqa: E402
from planner.schemas.plan import Recompute  # noqa: E402
from planner.simulate import simulate_pipeline  # noqa: E402

FLAGS = ("--num-layers 8 --hidden-size 4096 --ffn-hidden-size 11008 --num-attention-heads 32 --seq-length 4096 "
         "--max-position-embeddings 4096 --num-experts 16 --moe-router-topk 2 --moe-ffn-hidden-size 4096 "
         "--moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2 --moe-grouped-gemm --swiglu "
         "--micro-batch-size 2 --global-batch-size 128 --bf16 --vocab-size 32000 --expert-model-parallel-size 8 "
         "--pipeline-model-parallel-size 2")
CLUSTERS = (("H800:16", ("H800", "H800")), ("H800:8,A100:8", ("H800", "A100")))
SPLITS = ((4, 4), (6, 2), (2, 6))


def timeline_s(cost: PlanCost, vpp: int) -> float:
    """The synthetic log's steady iteration (tests/helpers/synthetic_log.py `simulated_iteration_s`)."""
    sim = simulate_pipeline([s.forward_s for s in cost.stages], [s.backward_s for s in cost.stages],
                            cost.num_microbatches, schedule="interleaved" if vpp > 1 else "1f1b", vpp=vpp)
    return sim.iteration_time_s + max(s.sync_s for s in cost.stages)


def priced(profiles: ProfileSet, cluster: str, types: tuple[str, ...], layers: tuple[int, ...],
           vpp: int) -> PlanCost:
    """The flags' plan at DP 8 with the given stage types, layers and VPP, priced by the shipped model."""
    spec = parse_cluster(cluster, profiles)
    run = parse_megatron_flags(shlex.split(FLAGS), world_size=spec.world_size)
    plan = build_plan(tp=1, cp=1, ep=8, etp=1, mbs=2, gbs=128, dp=8, types=list(types), layers=list(layers),
                      recompute=Recompute.none(), vpp=vpp)
    return CostModel(run.model, run.training, spec, profiles).evaluate(plan)


def row(profiles: ProfileSet, cluster: str, types: tuple[str, ...], layers: tuple[int, ...], vpp: int) -> str:
    cost = priced(profiles, cluster, types, layers, vpp)
    sim_s = timeline_s(cost, vpp)
    times_s = [s.time_s for s in cost.stages]
    slow_first = times_s.index(max(times_s)) < len(times_s) - 1 and min(times_s) < max(times_s)
    fill = sum(s.fill_out_s for s in cost.stages) / cost.iteration_time_s
    return (f"{cluster:14s} {'/'.join(map(str, layers)):4s} {vpp:4d} {cost.iteration_time_s:9.4f} {sim_s:9.4f} "
            f"{sim_s / cost.iteration_time_s - 1:+7.2%} {fill:6.2%}  {'yes' if slow_first else 'no':3s}  "
            + " ".join(f"{t * 1e3:6.1f}" for t in times_s))


def main() -> None:
    profiles = ProfileSet.load()
    print(f"{'cluster':14s} {'lay':4s} {'vpp':>4s} {'evaluate':>9s} {'timeline':>9s} {'gap':>7s} {'fill':>6s}  "
          f"slow-first  t_i (ms)")
    for vpp in (1, 2, 3):
        for cluster, types in CLUSTERS:
            for layers in SPLITS:
                print(row(profiles, cluster, types, layers, vpp))


if __name__ == "__main__":
    main()
