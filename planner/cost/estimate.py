"""Price one given Megatron configuration (no search): MegatronRun + cluster -> Plan -> PlanCost."""

from __future__ import annotations

from dataclasses import replace

from planner.cost.model import CostModel, PlanCost
from planner.megatron.flags import unmodelled_notes
from planner.megatron.rules import microbatch_violations, world_violations
from planner.errors import PlannerInputError
from planner.precision import runs_precision
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan, StagePlan


def plan_from_run(run: MegatronRun, cluster: ClusterSpec, profiles) -> tuple[Plan, list[str]]:
    """The Plan Megatron would run for these flags on this cluster.

    DP = world / (TP*PP*CP).  Under the default rank order stage s owns ranks
    [s*TP*CP*DP, (s+1)*TP*CP*DP); ranks follow the cluster's node groups in the order given, so
    each stage gets the device type of its ranks.  A stage that straddles two types is priced on
    the slower one, with a note.
    """
    par, model, tr = run.parallel, run.model, run.training
    world = cluster.world_size
    denom = par.tp * par.pp * par.cp
    for v in world_violations(world, tp=par.tp, pp=par.pp, cp=par.cp):
        raise PlannerInputError("--cluster", f"{v.message} ({cluster.gpus_text()}: {v.hint})")
    dp = world // denom
    layers = par.stage_layers(model.num_layers)
    for v in microbatch_violations(tr.global_batch_size, mbs=tr.micro_batch_size, dp=dp):
        raise PlannerInputError("--global-batch-size", f"{v.message} ({v.hint})")
    # rank -> device type, in cluster order
    bounds: list[tuple[int, str]] = []
    acc = 0
    for grp in cluster.groups:
        acc += grp.num_gpus
        bounds.append((acc, grp.device_type))

    def type_of(rank: int) -> str:
        for end, t in bounds:
            if rank < end:
                return t
        return bounds[-1][1]

    notes: list[str] = []
    stage_size = par.tp * par.cp * dp
    stages = []
    for s in range(par.pp):
        first, last = type_of(s * stage_size), type_of((s + 1) * stage_size - 1)
        dev_type = first
        if first != last:
            pool = profiles.pool(first, last, tr.precision)
            slower = min((first, last), key=lambda t: _peak_flop_per_s(t, profiles, tr.precision))
            dev_type = pool or slower
            notes.append(f"stage {s} spans {first} and {last}; priced on the slower {slower}"
                         + (f" (the pooled type {pool}: DP over both, the slower link between them)" if pool else ""))
        stages.append(StagePlan(device_type=dev_type, num_layers=layers[s], dp=dp, recompute=par.recompute))
    vpp = par.virtual_size(model.num_layers)
    plan = Plan(
        runtime="megatron", tp=par.tp, cp=par.cp, ep=par.ep, etp=par.expert_tp, vpp=vpp,
        mbs=tr.micro_batch_size, gbs=tr.global_batch_size,
        sequence_parallel=par.sequence_parallel or (model.is_moe and par.tp > 1), stages=tuple(stages),
        layout=_kept_layout(par, layers, vpp),
    )
    return plan, notes


def _peak_flop_per_s(device_type: str, profiles, precision: str) -> float:
    """A type's peak at the run's precision; 0 for a type that does not run it (the stage is then put on it, and
    refused for it: api.check_plan_precision)."""
    return profiles.device(device_type).peak_flop_per_s(precision) if runs_precision(device_type, profiles,
                                                                                       precision) else 0.0


def _kept_layout(par, layers: list[int], vpp: int) -> tuple[str, ...] | None:
    """The run's own layout, kept in the plan when it places the layers priced (a refused layout that
    does not is priced on ParallelConfig.stage_layers' even split instead)."""
    if par.layout is None or len(par.layout) != par.pp * vpp:
        return None
    per_rank = [sum(par.layout[c * par.pp + r].count("t") for c in range(vpp)) for r in range(par.pp)]
    return par.layout if per_rank == layers else None


def estimate_run(run: MegatronRun, cluster: ClusterSpec, profiles) -> PlanCost:
    """Price the configuration a Megatron flag list describes on `cluster`."""
    plan, notes = plan_from_run(run, cluster, profiles)
    notes += unmodelled_notes(run.passthrough, run.training)
    cost = CostModel(run.model, run.training, cluster, profiles).evaluate(plan)
    if notes:
        cost = replace(cost, notes=tuple(notes))
    return cost
