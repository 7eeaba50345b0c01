"""A property-style generator of flagscale-runtime plans: random small models (dense and MoE, tied and untied
embeddings, GQA) on random clusters of NVIDIA and AMD types, random meshes (one TP for the plan, each stage its
own DP, each device type's stages contiguous), random batch and per-stage recompute.  It keeps the plans the
planner's own rules accept (planner/megatron/rules.py check_plan) and that the launcher can place; FlagScale's
validator then says whether FlagScale accepts each emitted config (tests/test_flagscale_validator.py)."""

from __future__ import annotations

import random

from planner.errors import PlannerInputError
from planner.launcher import render_launch_files
from planner.megatron.rules import check_plan
from planner.schemas import ClusterSpec, ModelSpec, NodeGroup, Plan, Recompute, StagePlan, TrainingSpec
from planner.schemas.parallel import MegatronRun, ParallelConfig

TYPES = ("A100", "H100", "H800", "MI300X")
RECOMPUTES = (Recompute.none(), Recompute.full("uniform", 1), Recompute.full("block", 1))


def _model(rng: random.Random) -> ModelSpec:
    heads = rng.choice((8, 16))
    moe = rng.random() < 0.5
    return ModelSpec(
        name="prop", num_layers=rng.choice((4, 6, 8, 12)), hidden_size=rng.choice((512, 1024)),
        num_attention_heads=heads, num_query_groups=rng.choice((None, heads // 2, heads // 4)),
        vocab_size=32000, seq_length=1024, swiglu=True, normalization="RMSNorm",
        untie_embeddings_and_output_weights=rng.random() < 0.5,
        num_experts=rng.choice((4, 8)) if moe else None, moe_router_topk=2,
        add_bias_linear=False,
    )


def _plan(rng: random.Random, model: ModelSpec) -> Plan:
    types = rng.sample(TYPES, rng.choice((1, 2, 2, 3)))
    tp = rng.choice((1, 2, 4))
    pp = rng.randint(len(types), min(4, model.num_layers))
    per_type = [1] * len(types)
    for _ in range(pp - len(types)):
        per_type[rng.randrange(len(types))] += 1
    stage_types = [t for t, n in zip(types, per_type) for _ in range(n)]
    cuts = sorted(rng.sample(range(1, model.num_layers), pp - 1))
    layers = [b - a for a, b in zip([0, *cuts], [*cuts, model.num_layers])]
    dps = [rng.choice((1, 2, 4)) for _ in range(pp)]
    ep = rng.choice((1, 2, 4)) if model.is_moe else 1
    rc = [rng.choice(RECOMPUTES) for _ in range(pp)]
    b = max(dps) * rng.choice((1, 2))
    mbs = b // dps[0]
    gbs = b * rng.choice((8, 16))
    return Plan(runtime="flagscale", tp=tp, cp=1, ep=ep, etp=1, vpp=1, mbs=mbs, gbs=gbs, sequence_parallel=tp > 1,
                stages=tuple(StagePlan(device_type=t, num_layers=n, dp=d, recompute=r)
                             for t, n, d, r in zip(stage_types, layers, dps, rc)))


def _cluster(plan: Plan) -> ClusterSpec:
    need: dict[str, int] = {}
    for s in plan.stages:
        need[s.device_type] = need.get(s.device_type, 0) + plan.tp * s.dp
    return ClusterSpec(groups=tuple(NodeGroup(device_type=t, num_nodes=-(-n // 8), gpus_per_node=8)
                                    for t, n in need.items()))


def sample(n: int, seed: int = 0, tries: int = 4000) -> list[tuple[str, dict[str, str]]]:
    """Up to `n` (name, launcher files) of random plans the planner's rules accept and the launcher renders."""
    rng = random.Random(seed)
    out: list[tuple[str, dict[str, str]]] = []
    for k in range(tries):
        if len(out) >= n:
            break
        model = _model(rng)
        plan = _plan(rng, model)
        training = TrainingSpec(global_batch_size=plan.gbs, micro_batch_size=plan.mbs, use_distributed_optimizer=True)
        if check_plan(model, plan, training):
            continue
        run = MegatronRun(model=model, training=training, parallel=ParallelConfig())
        try:
            files = render_launch_files(run, plan, _cluster(plan))
        except PlannerInputError:
            continue
        out.append((f"property-{seed}-{k}", files))
    return out
