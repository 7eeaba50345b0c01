"""The use cases behind the commands: read the inputs, estimate, emit, and what solve and compare share.

Commands (planner/commands/) parse options, call these and print or write what they return
(planner/output/).  `load_inputs` is the one input path: the CLI, the benchmarks (planner/bench.py,
tools/bench_search.py) and the tests read a run, its cluster and the profiles through it, so the
same input is priced the same everywhere (the precision check and the assumed MoE imbalance
included).  The search itself (`solve`, `compare_rows`) is planner/api_search.py's: nothing here loads the
search's backends (OR-Tools), so that `estimate`, `emit` and `calibrate` start without them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from planner import precision as precisions
from planner.checker import plan_problems, precision_problems
from planner.cost.estimate import plan_from_run
from planner.cost.model import CostModel, PlanCost, ep_overlap_notes
from planner.cost.dispatch import fabric_notes
from planner.cost.layer import blackwell_eager_notes
from planner.cost.ranges import RangeModel, TimeRange
from planner.errors import ImplausiblePredictionError, MissingProfileError, PlannerInputError
from planner.inputs.assumed import IMBALANCE_FLAG, as_planned, imbalance_assumption, measured_imbalance_notes
from planner.inputs.cluster import describe_cluster, domain_notes, parse_cluster
from planner.inputs.plan_file import check_plan_document, load_plan_file, resolve_plan_inputs, script_from_plan
from planner.inputs.resolve import read_script, resolve_run_script, script_override_flags
from planner.inputs.script import LauncherScript, reads_alike
from planner.inputs.script_gpus import script_gpus
from planner.inputs.hosts import Host, read_hosts
from planner.launcher import render_launch_files
from planner.launcher.common import place_agents, placement_notes
from planner.profile_tables import ProfileSet
from planner.runtime import (
    MEGATRON, Refusal, Runtime, RuntimeChoice, choose_runtime, plannable_runtimes, runtime_of, sub_cluster,
)
from planner.megatron.flags import OVERRIDE_FLAGS, rule_options, unmodelled_notes
from planner.megatron.rules import (
    check_plan, format_violations, run_violations, runtime_model_refusal, world_violations,
)
from planner.sanity import check_prediction
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan
from planner.search.explain import fits_nowhere
from planner.search.settings import SearchResult
from planner.search.space import SearchSpace, fillable, flagscale_stage_gpus
from planner.user_plan import UserPlan, price_user_plan

# ------------------------------------------------------------------------------------------------
# Inputs


class Inputs(NamedTuple):
    """A run, the cluster it runs on and the profiles that price it; with the --megatron-script it was read from,
    as read (once: the launcher files, the launch checks and the notes take it from here)."""

    run: MegatronRun
    cluster: ClusterSpec
    profiles: ProfileSet
    script: LauncherScript | None = None


def load_inputs(*, cluster: str | ClusterSpec, model=None, megatron_args=None, megatron_script=None,
                script_args: Sequence[str] = (), overrides: dict | None = None, profile_dirs: Sequence[str] = (),
                profiles: ProfileSet | None = None, moe_imbalance: float | None = None, allow_invalid: bool = False,
                on_note: Callable[[str], None] | None = None, script_deadline: float | None = None,
                script: LauncherScript | None = None) -> Inputs:
    """Resolve (MegatronRun, ClusterSpec, ProfileSet, the LauncherScript) from the inputs as the CLI names them.

    `overrides`: {tp, pp, cp, ep, etp, vpp, mbs, gbs, seq, layout, recompute} (None values are
    ignored).  `profiles`: the profile set to use (loaded once by a caller that reads many inputs);
    by default the shipped one with `profile_dirs` on top.  The run lists in `assumed` the values no
    input stated (planner/inputs/assumed.py); what the input reader did not model goes to `on_note`,
    one line each (dropped when None).  `script_deadline` (time.monotonic()): reading a --megatron-script
    stops there with an error naming the line it reached (the command's time limit).  `script`: the
    --megatron-script already read as a job on `cluster` (load_estimate_inputs), not read again."""
    if moe_imbalance is not None and not (math.isfinite(moe_imbalance) and moe_imbalance >= 1.0):
        raise PlannerInputError(IMBALANCE_FLAG, f"expected a finite number >= 1 (max/mean tokens per expert), "
                                f"got {moe_imbalance}")
    if profiles is None:
        profiles = ProfileSet.load(extra_dirs=list(profile_dirs or ()))
    cluster_spec = cluster if isinstance(cluster, ClusterSpec) else parse_cluster(cluster, profiles)
    clean = {k: v for k, v in (overrides or {}).items() if v is not None}
    notes: list[str] = []
    try:
        run, script = resolve_run_script(
            model=model, megatron_args=megatron_args, megatron_script=megatron_script,
            script_args=list(script_args or ()), world_size=cluster_spec.world_size, overrides=clean, notes=notes,
            allow_invalid=allow_invalid, cluster=cluster_spec, script_deadline=script_deadline, script=script)
    except PlannerInputError as exc:
        raise _in_override_terms(exc, clean) from None
    check_world_overrides(run, cluster_spec, clean, profiles)
    check_precision(run.training.precision, cluster_spec, profiles)
    check_imbalance(run, profiles, moe_imbalance)
    if on_note is not None:
        for note in notes:
            on_note(note)
    if moe_imbalance is not None:
        run = run.model_copy(update={"training": run.training.model_copy(
            update={"moe_imbalance_factor": float(moe_imbalance)})})
    run = imbalance_assumption(run, cluster_spec, profiles, user_profiles=bool(profile_dirs))
    return Inputs(run, cluster_spec, profiles, script)


def load_estimate_inputs(*, cluster: str | ClusterSpec, model=None, megatron_script=None,
                         script_args: Sequence[str] = (), profile_dirs: Sequence[str] = (),
                         on_note: Callable[[str], None] | None = None,
                         **options) -> tuple[Inputs, ClusterSpec, list[str]]:
    """load_inputs for `estimate`, the whole cluster given, and the notes on what is priced: a --megatron-script's
    flags are priced on the GPUs its own launch uses (its torchrun/srun/mpirun counts, on the first nodes of the
    cluster: planner/inputs/script_gpus.py), the global batch Megatron defaults to included; a launch the cluster
    cannot hold is refused.  Which GPUs are priced, where not the whole cluster or where the script states no
    count, is such a note: part of the result (estimate's `notes`, in its JSON too), not a note on reading the
    input (`on_note`).  The script is read once, as a job on the whole cluster; again as a job on the GPUs priced
    only where the SLURM_* values it reads differ there (planner.inputs.script `reads_alike`).  `options`:
    load_inputs' other keywords."""
    profiles = ProfileSet.load(extra_dirs=list(profile_dirs or ()))
    whole = cluster if isinstance(cluster, ClusterSpec) else parse_cluster(cluster, profiles)
    part, script, priced = whole, None, []
    if megatron_script is not None and model is None:  # with --model too, load_inputs refuses the pair
        script = read_script(megatron_script, script_args, cluster=whole,
                             deadline=options.get("script_deadline"))
        gpus = script_gpus(script, whole, profiles)
        part = gpus.cluster
        priced = [gpus.note] if gpus.note else []
    inputs = load_inputs(cluster=part, model=model, megatron_script=megatron_script, script_args=script_args,
                         profile_dirs=profile_dirs, profiles=profiles, on_note=on_note,
                         script=script if script is not None and reads_alike(script, whole, part) else None,
                         **options)
    return inputs, whole, priced


def _in_override_terms(exc, overrides: dict):
    """An error about a Megatron flag that a CLI override set names the override too (`--ep`, not only
    `--expert-model-parallel-size`)."""
    field = getattr(exc, "field", "")
    for key, flag in OVERRIDE_FLAGS.items():
        if key in overrides and field == flag:
            message = str(exc)[len(field) + 2:] if str(exc).startswith(field + ": ") else str(exc)
            return PlannerInputError(f"--{key} ({flag})", message)
    return exc


def check_world_overrides(run: MegatronRun, cluster_spec: ClusterSpec, overrides: dict, profiles: ProfileSet) -> None:
    """A --tp/--pp/--cp override whose TP*PP*CP does not divide the cluster's GPUs (Megatron's "world size is
    not divisible by total_model_size") is refused naming the override that broke it, not --cluster; when the
    degrees the input itself states already fail to divide, the input's error stands (plan_from_run)."""
    par, world = run.parallel, cluster_spec.world_size
    degrees = {"tp": par.tp, "pp": par.pp, "cp": par.cp}
    if not world_violations(world, **degrees):
        return
    given = [key for key in degrees if key in overrides and degrees[key] > 1]
    stated = math.prod(value for key, value in degrees.items() if key not in given)
    if not given or world % stated:
        return
    size = math.prod(degrees.values())
    named = " and ".join(f"{key.upper()} {degrees[key]}" for key in given)
    product = f"TP*PP*CP = {par.tp}*{par.pp}*{par.cp} = {size}" if len(given) > 1 or stated > 1 else named
    why = (f"exceeds the cluster's {world} GPUs" if size > world else f"does not divide the cluster's {world} GPUs")
    fix = "smaller degrees or a larger cluster" if size > world else f"degrees whose product divides {world}"
    raise PlannerInputError(
        " / ".join(f"--{key}" for key in given),
        f"{product} {why} ({describe_cluster(cluster_spec, profiles)}): one model replica spans TP*PP*CP GPUs, "
        f"which must divide the number of GPUs (Megatron: world size ({world}) is not divisible by total_model_size "
        f"({size})); choose {fix}")


def check_imbalance(run: MegatronRun, profiles: ProfileSet, given: float | None) -> None:
    """The MoE imbalance the run states (max/mean tokens per expert, from --moe-imbalance, the model file or a
    calibration in the user's --profiles) is at most num_experts / topk: every token on the same k experts.
    --moe-imbalance on a dense model is refused (it would be accepted and change nothing)."""
    model = run.model
    if given is not None and not model.is_moe:
        raise PlannerInputError(IMBALANCE_FLAG, "the model has no experts (it is dense): the MoE router's "
                                "imbalance does not apply to it; drop --moe-imbalance")
    if not model.is_moe or not model.num_experts or not model.moe_router_topk:
        return
    bound = model.num_experts / model.moe_router_topk
    why = (f"above num_experts / topk = {model.num_experts}/{model.moe_router_topk} = {bound:g}, the largest "
           "max/mean tokens per expert there is (every token routed to the same experts)")
    stated = run.training.moe_imbalance_factor
    if given is not None and given > bound:
        raise PlannerInputError(IMBALANCE_FLAG, f"{given:g} is {why}")
    if given is None and stated is not None and stated > bound:
        raise PlannerInputError("training.moe_imbalance_factor", f"{stated:g} is {why}")
    # the shipped calibration comes from other models' routers: the cost model caps it at this model's
    # num_experts / topk (planner/cost/dispatch.py routing).  One from the user's own --profiles above the bound
    # is a log or a file that cannot be of this run: refused, naming the file
    calibrated = profiles.moe_imbalance_factor()
    users = [f for f in profiles.user_files if f.endswith("corrections.yaml")]
    if (given is None and stated is None and calibrated is not None and calibrated > bound and users
            and calibrated != ProfileSet.load().moe_imbalance_factor()):  # the user's file set it, not the shipped one
        raise PlannerInputError("--profiles", f"{', '.join(users)}: moe_imbalance_factor {calibrated:g} is {why}; "
                                              f"fix or remove that entry, or give --moe-imbalance")


def check_precision(precision: str, cluster_spec, profiles) -> None:
    """Some device type of the cluster must run the run's precision (a V100 or T4 has no bf16): PlannerInputError
    naming --cluster and the types otherwise.  The types that do not run it stay idle (planner/precision.py:
    the runtime choice leaves them out with the reason; a plan with a stage on one is refused)."""
    precisions.left_out(cluster_spec, profiles, precision)


# ------------------------------------------------------------------------------------------------
# Solve (the search: planner/api_search.py)


@dataclass
class IdleGpus:
    """GPUs of one device type the plan leaves idle, and why."""

    device_type: str
    count: int
    why: str


OBJECTIVES = ("pessimistic", "nominal")
"""What `solve` minimises: the top of each plan's iteration-time range (planner/cost/ranges.py), or the cost
model's nominal time."""


@dataclass
class SolveOutcome:
    run: MegatronRun
    cluster: ClusterSpec
    result: SearchResult
    plans: list[Plan]
    costs: list[PlanCost]  # the nominal (float) cost model's
    problems: list[list[str]] = field(default_factory=list)
    idle: list[IdleGpus] = field(default_factory=list)
    script: LauncherScript | None = None  # the input launcher (--megatron-script), for the launcher files
    ranges: list[TimeRange] = field(default_factory=list)  # each plan's iteration-time range
    objective: str = "pessimistic"
    memory_headroom: float = 0.0
    range_model: RangeModel | None = None
    choice: RuntimeChoice | None = None  # the runtime and the part of the cluster its job runs on
    profiles: ProfileSet | None = None  # what priced it: vendors and node probes for the launcher
    hosts: tuple[Host, ...] | None = None  # --hosts: the real nodes the launcher places the stages on
    space: SearchSpace | None = None  # what the search covered (its certificate says nothing beyond it)

    @property
    def objective_s(self) -> float:
        """The searched objective's float value for the best plan (its pessimistic or nominal time)."""
        return self.ranges[0].high_s if self.objective == "pessimistic" else self.costs[0].iteration_time_s


def make_space(run: MegatronRun, runtime: str, mbs: int | None = None, **narrow) -> SearchSpace:
    space = SearchSpace(runtime=runtime, **narrow)
    if mbs is not None:
        space = space.with_(mbs=(mbs,))
    return space


def left_out_json(choice: RuntimeChoice, cluster: ClusterSpec) -> dict[str, dict]:
    """The device types the runtime choice left out of the search: type -> {count, why}."""
    have = cluster.gpus_by_type()
    return {t: {"count": have.get(t, 0), "why": why} for t, why in choice.left_out.items()}


def left_out_lines(choice: RuntimeChoice, cluster: ClusterSpec, profiles: ProfileSet) -> list[str]:
    """The same, one line each, as solve's hints and compare's notes say them (each type's GPUs as --cluster
    gives them)."""
    return [f"{describe_cluster(sub_cluster(cluster, [t]), profiles)} of the cluster were not searched: {o['why']}"
            for t, o in left_out_json(choice, cluster).items()]


def runtime_choice(runtime: str, cluster: ClusterSpec, profiles, run: MegatronRun,
                   memory_headroom: float | None = None) -> RuntimeChoice:
    """`--runtime` resolved against profiles/runtimes.yaml: the runtime and the part of the cluster one
    job of it runs on.  A named runtime that cannot run the whole cluster is refused (PlannerInputError
    naming --runtime, with the reason and what would run it), and so is one whose own rules refuse the model
    (planner/megatron/rules.py `runtime_model_refusal`: `auto` then plans with a runtime that runs it).  Each
    device type left out says, after why, whether its GPUs may run the model as a job of their own
    (`own_job_advice`, with `memory_headroom` kept free; a type without the run's precision in one it runs)."""
    def refuses(rt: Runtime) -> str | None:
        return runtime_model_refusal(rt.name, run.model)

    choice = choose_runtime(runtime, cluster, profiles, run.training.precision, refuses=refuses)
    left = {}
    for t, why in choice.left_out.items():
        own = _own_job_run(t, choice, profiles, run)
        left[t] = why if own is None else \
            f"{why}; {own_job_advice(sub_cluster(cluster, [t]), profiles, own[0], refuses, memory_headroom, own[1])}"
    return replace(choice, left_out=left)


def _own_job_run(device_type: str, choice: RuntimeChoice, profiles: ProfileSet, run: MegatronRun
                 ) -> tuple[MegatronRun, str] | None:
    """The run a left-out type's job of its own would train and the words that offer it: the run itself; for a
    type without the run's precision, the run in the first mixed precision it has (None: it has none)."""
    if device_type not in choice.lacks_precision:
        return run, "plan them as a job of their own"
    runs_in = next((p for p in precisions.MIXED_PRECISIONS if precisions.runs_precision(device_type, profiles, p)),
                   None)
    if runs_in is None:
        return None
    training = run.training.model_copy(update={"precision": runs_in})
    return run.model_copy(update={"training": training}), f"plan them as a job of their own in {runs_in}"


def own_job_advice(part: ClusterSpec, profiles: ProfileSet, run: MegatronRun, refuses: Refusal,
                   memory_headroom: float | None = None, lead: str = "plan them as a job of their own") -> str:
    """What to do with GPUs no job of the chosen runtime holds: `lead` and their --cluster text where a runtime
    runs them alone and the model's most memory-friendly layout fits in them, else why not.  The fit is the cheap
    one of planner/search/explain.py `fits_nowhere` (one layout priced, no search: the judgement of solve's "fits
    nowhere" message), so a cluster it offers may still hold no plan passing every rule."""
    runs = [rt for rt in plannable_runtimes(profiles) if rt.can_run(part, profiles).ok and not refuses(rt)]
    if not runs:
        return "no runtime runs them in a job of their own either"
    try:
        cost = CostModel(run.model, run.training, part, profiles, memory_headroom=memory_headroom)
        why = fits_nowhere(cost, SearchSpace(runtime=runs[0].name))
    except MissingProfileError as exc:
        return f"a job of their own is not priced here ({exc})"
    if why is not None:
        return f"no job of their own holds the model either: {why}"
    return f"{lead} (--cluster {describe_cluster(part, profiles)})"


def uniform_space_for(space: SearchSpace, runtime: str) -> SearchSpace:
    """The megatron space narrowed to plans `runtime` runs as they are (one DP and recompute for every
    stage): no CP or VPP where it has none, contiguous device types where it needs them."""
    rt = runtime_of(runtime)
    narrowed = space.with_(runtime="megatron")
    if not rt.context_parallel:
        narrowed = narrowed.with_(cp=(1,))
    if not rt.interleaving:
        narrowed = narrowed.with_(vpp=(1,))
    if rt.contiguous_types:
        narrowed = narrowed.with_(contiguous_types=True)
    return narrowed


def relabel_result(result: SearchResult, runtime: str) -> SearchResult:
    """The result's plans as `runtime`'s (the cost model does not depend on the runtime's name)."""
    def relabel(cands):
        return [replace(c, plan=c.plan.model_copy(update={"runtime": runtime})) for c in cands]

    return replace(result, best=relabel(result.best), runners_up=relabel(result.runners_up))


def idle_gpus(plan: Plan, cluster: ClusterSpec, result: SearchResult,
              left_out: dict[str, str] | None = None, space: SearchSpace | None = None,
              objective: str = "nominal") -> list[IdleGpus]:
    """Per device type, the GPUs the plan leaves idle and why: no job of the runtime can hold that type
    (`left_out`, from the runtime choice), no sum of the stage sizes the plan's micro-batch allows fills them
    (flagscale, with the `space` searched: every stage splits the micro-batch's samples evenly over its DP),
    too few left for one more stage of the plan's shape, or (when more stages would fit) the search found no
    faster plan using them (`objective`: what "faster" compares, the nominal time or the top of the range)."""
    used = cluster.spread(plan.gpus_by_type())  # a pooled stage type's GPUs counted on its members
    left_out = left_out or {}
    out = []
    faster = "faster" if objective == "nominal" else "faster at the top of its range (the pessimistic objective)"
    proof = f"the search proved that no plan using them is {faster}" if result.certified_optimal else \
        f"no plan using them was {faster} among those searched"
    sizes = sorted({plan.tp * plan.cp * s.dp for s in plan.stages})
    for h, n in cluster.gpus_by_type().items():
        idle = n - used.get(h, 0)
        if idle <= 0:
            continue
        unfilled = _unfilled_by_stages(plan, h, n, space)
        if h in left_out:
            why = left_out[h]
        elif unfilled:
            why = unfilled[1] + ("; other micro-batch sizes: " if idle <= unfilled[0] else
                                 f"; the other {idle - unfilled[0]} would hold more stages, but ") + proof
        elif idle < sizes[0]:
            why = (f"fewer than one more stage of the plan's TP x CP x DP = {sizes[0]} GPUs; " + proof)
        else:
            why = proof
        out.append(IdleGpus(h, idle, why))
    return out


def _unfilled_by_stages(plan: Plan, device_type: str, gpus: int, space: SearchSpace | None
                        ) -> tuple[int, str] | None:
    """flagscale: the GPUs of a type no stages of the plan's micro-batch can use (space.fillable), and why;
    None when they fill every GPU (or on megatron, whose stages all take TP x CP x DP)."""
    if space is None or not runtime_of(plan.runtime).per_stage_meshes:
        return None
    samples = plan.mbs * plan.dp0
    sizes = flagscale_stage_gpus(space, plan.tp, plan.cp, plan.ep, plan.etp or plan.tp, samples, gpus)
    if not sizes:  # no DP of this type splits the micro-batch into a per-GPU size of the menu
        return gpus, (
            f"every stage splits the plan's {samples} samples per micro-batch (a divisor of GBS {plan.gbs}) evenly "
            f"over its DP, {_or(sorted(space.mbs))} per GPU, and no such split gives a {device_type} stage of the "
            f"plan's TP x CP = {plan.tp * plan.cp} (EP {plan.ep}) within its {gpus} GPUs")
    most = fillable(sizes, gpus)
    if most >= gpus:
        return None
    per_gpu = sorted({samples // (s // (plan.tp * plan.cp)) for s in sizes})
    return gpus - most, (
        f"every stage splits the plan's {samples} samples per micro-batch (a divisor of GBS {plan.gbs}) evenly over "
        f"its DP, {_or(per_gpu)} per GPU, so {device_type} stages take {_or(sizes)} GPUs (TP x CP x DP), which fill "
        f"at most {most} of its {gpus}")


def _or(values: Sequence[int]) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def check_predictions(outcome: SolveOutcome, profiles: ProfileSet | None = None) -> None:
    """Every reported plan passes the prediction guard (planner/sanity.py)."""
    for rank, cost in enumerate(outcome.costs):
        check_prediction(cost, "the best plan" if rank == 0 else f"plan {rank + 1}",
                         profiles.user_files if profiles is not None else ())


def input_script(inputs: Inputs, megatron_args: str | None, overrides: dict) -> LauncherScript | None:
    """The input launcher as load_inputs read it (None: no --megatron-script), with the flags the launcher files
    apply on top of it (--megatron-args, a --seq override) riding along."""
    if inputs.script is None:
        return None
    extra = script_override_flags(megatron_args, overrides, inputs.run.model.max_position_embeddings)
    return replace(inputs.script, extra_flags=extra)


def input_plan(inputs: Inputs, megatron_script: str | None, megatron_args: str | None) -> Plan | None:
    """The plan the input's own flags describe on its cluster, for the search to start from (None: a model
    without flags, or flags that lay out no plan on this cluster; price_input_plan says why)."""
    if not (megatron_script or megatron_args):
        return None
    try:
        return plan_from_run(inputs.run, inputs.cluster, inputs.profiles)[0]
    except ValueError:
        return None


def price_input_plan(inputs: Inputs, megatron_script: str | None, megatron_args: str | None,
                     outcome: SolveOutcome | None = None) -> UserPlan | None:
    """The plan the input's own flags describe, priced on the same cluster with the same cost model, headroom
    and range as `outcome`'s plans (None when the input is a model without flags); with `outcome`, whether to
    keep it (planner/user_plan.py `keep_yours`)."""
    if not (megatron_script or megatron_args):
        return None
    source = f"--megatron-script {Path(megatron_script).name}" if megatron_script else "--megatron-args"
    ranges = outcome.range_model if outcome is not None else None
    user = price_user_plan(inputs.run, inputs.cluster, inputs.profiles, source, range_model=ranges)
    if outcome is not None:
        user.judge(outcome.ranges[0], outcome.costs[0])
    return user


# ------------------------------------------------------------------------------------------------
# Estimate

@dataclass
class Estimate:
    """One configuration priced: the plan Megatron would run for the flags, its cost, and the notes
    (stages priced on a slower type, rules broken under allow_invalid, flags not modelled)."""

    plan: Plan
    cost: PlanCost
    notes: list[str]
    time_range: TimeRange | None = None


def estimate(inputs: Inputs, *, allow_invalid: bool = False, memory_headroom: float | None = None) -> Estimate:
    """Price the configuration the run's flags give on its cluster, no search, with its iteration-time
    range and the memory headroom kept free.  A configuration Megatron would refuse is refused, naming the
    options behind the broken rules, unless `allow_invalid` (then each broken rule is a note)."""
    run, cluster, profiles = inputs.run, inputs.cluster, inputs.profiles
    try:
        plan, notes = plan_from_run(run, cluster, profiles)
    except PlannerInputError:  # the flags' plan spans the whole cluster: a type that cannot run the precision is
        idle = precisions.left_out(cluster, profiles, run.training.precision)  # said before the rules its layout
        if idle:  # breaks there (fuzz 77777 #12)
            raise _flags_precision_error(inputs, [why.split(";")[0] for why in idle.values()]) from None
        raise
    return price_plan(inputs, plan, notes, allow_invalid=allow_invalid, memory_headroom=memory_headroom)


def price_plan(inputs: Inputs, plan: Plan, notes: list[str], *, allow_invalid: bool = False,
               memory_headroom: float | None = None, saved: bool = False) -> Estimate:
    """`estimate`'s pricing of one plan of the run on its cluster: the flags' plan (checked with the flags that
    place it), or a `saved` plan file's (checked as itself, on the runtime it names: a FlagScale plan too)."""
    run, cluster, profiles = inputs.run, inputs.cluster, inputs.profiles
    check_plan_precision(inputs, plan, saved, notes)  # before the rules: no precision, no run at all
    violations = check_plan(run.model, plan, run.training) if saved else run_violations(run, plan)
    if violations and not allow_invalid:
        raise PlannerInputError(  # a saved plan's rule breaks are the file's, not options the user passed
            "--plan" if saved else " / ".join(sorted({rule_options(v.rule) or "configuration" for v in violations})),
            "Megatron would refuse it: " + format_violations(violations)
            + "; --allow-invalid prices it anyway",
        )
    runtime = runtime_of(plan.runtime) if saved else MEGATRON
    # the flags' plan spans the whole cluster: a stage straddling two types is priced as one of them
    runs = runtime.can_run(plan.member_types() if saved else cluster, profiles)
    if not runs.ok:
        if not allow_invalid:
            raise PlannerInputError("--plan" if saved else "--cluster",
                                    f"{runs.reason}; `solve` plans a runtime that can (FlagScale for NVIDIA+AMD); "
                                    f"--allow-invalid prices {'this plan' if saved else 'these flags'} anyway")
        notes = notes + [f"no {runtime.title} job runs this: {runs.reason}"]
    ranges = RangeModel(run.model, run.training, cluster, profiles, memory_headroom=memory_headroom)
    cost = ranges.nominal.evaluate(plan)
    check_prediction(cost, "the configuration", profiles.user_files)
    notes = (notes + [f"rule {v.rule}: {v.message}" for v in violations]
             + unmodelled_notes(run.passthrough, run.training) + fabric_notes(ranges.nominal, plan)
             + blackwell_eager_notes(run.model, run.training, plan) + ep_overlap_notes(ranges.nominal, plan, cost)
             + measured_imbalance_notes(as_planned(run, plan) if saved else run, cluster, profiles)
             + domain_notes(cluster, profiles))
    return Estimate(plan=plan, cost=cost, notes=notes, time_range=ranges.time_range(plan, cost))


def check_plan_precision(inputs: Inputs, plan: Plan, saved: bool = False, notes: Sequence[str] = ()) -> None:
    """A plan with a stage on a device type that does not run the run's precision cannot be priced (the type
    has no peak for it), --allow-invalid or not: PlannerInputError naming the stages (with `notes`' word on a
    stage that straddles two types), and what to do instead (the flags' plan spans the whole cluster: `solve`
    leaves such a type idle)."""
    run, cluster, profiles = inputs.run, inputs.cluster, inputs.profiles
    precision = run.training.precision
    problems = precision_problems(plan, profiles, precision)
    if not problems:
        return
    problems += [n.split(";")[0] for n in notes if " spans " in n]
    idle = precisions.left_out(cluster, profiles, precision)
    lacking = "+".join(idle)
    solve_instead = f"`solve`, which leaves {lacking} idle"
    if saved:
        raise PlannerInputError("--plan", f"{'; '.join(problems)}: the plan cannot be priced in {precision}; price "
                                          f"it in a precision {lacking} runs, or re-plan with {solve_instead}")
    raise _flags_precision_error(inputs, problems)


def _flags_precision_error(inputs: Inputs, problems: list[str]) -> PlannerInputError:
    """The refusal of the flags' plan (which spans the whole cluster) on a cluster with types that do not run the
    run's precision: `problems`, and what to do instead."""
    run, cluster, profiles = inputs.run, inputs.cluster, inputs.profiles
    precision = run.training.precision
    idle = precisions.left_out(cluster, profiles, precision)
    lacking = "+".join(idle)
    runs = describe_cluster(sub_cluster(cluster, [t for t in cluster.device_types if t not in idle]), profiles)
    return PlannerInputError(
        precisions.PRECISION_FIELD,
        f"{'; '.join(problems)}: the flags' plan, which spans the whole cluster, cannot be priced in {precision}; "
        f"price it in a precision {lacking} runs, estimate on the types that run {precision} (--cluster {runs}), "
        f"or `solve`, which leaves {lacking} idle")


# ------------------------------------------------------------------------------------------------
# Compare (the search: planner/api_search.py compare_rows)

BRUTE_MAX_LAYERS = 12
BRUTE_MAX_GPUS = 32


def reduce_layers(run, layers: int):
    """The run with its model cut to the first `layers` decoder layers (MoE pattern cut alike)."""
    model = run.model
    if layers > model.num_layers:
        raise PlannerInputError("--layers", f"{layers} is more than the model's {model.num_layers} layers")
    update = {"num_layers": layers}
    if model.moe_layer_pattern is not None:
        update["moe_layer_pattern"] = tuple(model.moe_layer_pattern[:layers])
    reduced = model.model_validate({**model.model_dump(), **update})
    return run.model_copy(update={"model": reduced})


def compare_backends(run: MegatronRun, cluster: ClusterSpec, brute: bool | None) -> list[str]:
    """hsdp and cpsat, and brute force when the case is small (or `brute` forces it on or off); a
    forced brute force on a large case is refused."""
    small = run.model.num_layers <= BRUTE_MAX_LAYERS and cluster.world_size <= BRUTE_MAX_GPUS
    if brute and not small:
        raise PlannerInputError(
            "--brute", f"brute force enumerates every plan and is for small cases (at most {BRUTE_MAX_LAYERS} layers "
                       f"and {BRUTE_MAX_GPUS} GPUs); this one has {run.model.num_layers} layers on "
                       f"{cluster.world_size} GPUs: drop --brute",
        )
    return ["hsdp", "cpsat"] + (["brute"] if (brute if brute is not None else small) else [])


def compare_stages(plan: Plan) -> list[dict]:
    """A compare row's stages: what `plan`'s one-line label leaves out under per-stage meshes (FlagScale: each
    stage's device type, layers, DP, recompute and micro-batch), so that two backends' plans can be told apart."""
    return [{"index": i, "device_type": st.device_type, "num_layers": st.num_layers, "dp": st.dp,
             "recompute": st.recompute.label, "micro_batch_size": plan.stage_mbs(i)}
            for i, st in enumerate(plan.stages)]


CONTRADICTION_REL = 1e-9  # float noise a bound may show above a plan (bounds are rounded down to whole us)


def contradictions(rows: list[dict]) -> list[str]:
    """The backends' results that cannot all hold, one line each naming both backends: a lower bound
    (valid for the whole space, on the searched objective) above another backend's plan, priced the
    same way in the same space, so that the bound, and any certificate of optimality resting on it, is
    false."""
    out = []
    for a in rows:
        lb = a.get("lower_bound_s")
        for b in rows:
            obj = b.get("objective_s")
            if b is a or lb is None or obj is None or lb <= obj * (1 + CONTRADICTION_REL):
                continue
            what = "certifies as optimal" if a.get("certified_optimal") else "proves as a lower bound"
            out.append(f"{a['backend']} {what} {lb:.6f} s, but {b['backend']} found a plan at {obj:.6f} s "
                       f"({b['plan']}): {a['backend']}'s bound is false")
    return out


# ------------------------------------------------------------------------------------------------
# Emit


def emit(plan_path: str | Path, *, model: str | None = None, megatron_args: str | None = None,
         megatron_script: str | None = None, cluster: str | None = None, script_args: Sequence[str] = (),
         profile_dirs: Sequence[str] = (), on_note: Callable[[str], None] | None = None,
         hosts_path: str | None = None) -> tuple[dict[str, str], LauncherScript | None]:
    """The launcher files ({relative path: text}) for a saved plan, and the input launcher they apply
    it to (whose file, and the files it sources, an output may never overwrite): plan.json as `solve --out`
    writes it (its run, cluster and input launcher included), or a bare Plan with the model and
    cluster given.  Everything `solve` checks is checked again (planner/checker.py: layers, GPUs,
    memory, Megatron's rules; the prediction guard), and a plan whose model or cluster differs from
    the one it was made for is refused (planner/inputs/plan_file.py).  `hosts_path` (--hosts FILE): the
    real nodes (planner/inputs/hosts.py); without it the host file is a template."""
    data, profiles, found = _read_plan_file(plan_path, model=model, megatron_args=megatron_args,
                                            megatron_script=megatron_script, cluster=cluster,
                                            script_args=script_args, profile_dirs=profile_dirs)
    run, plan, cluster_spec = found.run, found.plan, found.cluster
    check_emitted_plan(found, profiles, memory_headroom=data.get("memory_headroom"))
    if not found.has_record and "plan" in data and on_note is not None:
        on_note(f"{Path(plan_path).name} has no made_for record (plan.json and solve --json of this version carry "
                "one): the model and cluster were checked, not compared with what solve planned for")
    script = script_from_plan(data, found)  # the --megatron-script as read for the model check
    hosts = read_hosts(hosts_path, cluster_spec, profiles, saved_plan=True) if hosts_path else None
    files = render_launch_files(run, plan, cluster_spec, script, profiles=profiles, hosts=hosts)
    for note in placement_notes(plan, cluster_spec, hosts, script, place_agents(plan, cluster_spec, hosts)):
        if on_note is not None:
            on_note(note)
    return files, script


def _read_plan_file(plan_path: str | Path, *, model, megatron_args, megatron_script, cluster, script_args,
                    profile_dirs):
    """(the file's data, the profiles, its PlanInputs) of a saved plan, its derived keys checked against its
    stages (planner/inputs/plan_file.py): what emit and estimate --plan read."""
    data = load_plan_file(Path(plan_path))
    profiles = ProfileSet.load(extra_dirs=list(profile_dirs or ()))
    found = resolve_plan_inputs(data, model=model, megatron_args=megatron_args, megatron_script=megatron_script,
                                cluster=cluster, script_args=tuple(script_args), profiles=profiles)
    check_plan_document(data, found.plan, found.run, found.cluster, profiles)
    return data, profiles, found


def load_plan_inputs(plan_path: str | Path, *, model: str | None = None, megatron_args: str | None = None,
                     megatron_script: str | None = None, cluster: str | None = None, script_args: Sequence[str] = (),
                     profile_dirs: Sequence[str] = (), moe_imbalance: float | None = None,
                     ) -> tuple[Inputs, Plan, dict, list[str]]:
    """A saved plan to price (`estimate --plan`): plan.json or a `solve --json` output (its run and cluster
    included), or a bare Plan with the model and cluster given, checked for consistency as `emit` checks it; its
    inputs as load_inputs gives them (the imbalance assumed or given), the plan, the file's data, and the notes on
    what is priced (the model or cluster edited since solve wrote the file: part of the result, as
    load_estimate_inputs' are)."""
    data, profiles, found = _read_plan_file(plan_path, model=model, megatron_args=megatron_args,
                                            megatron_script=megatron_script, cluster=cluster,
                                            script_args=script_args, profile_dirs=profile_dirs)
    run, plan, cluster_spec = found.run, found.plan, found.cluster
    priced = [f"{' and '.join(found.edited)} changed after solve wrote {Path(plan_path).name}: priced for them as "
              "they are now"] if found.edited else []
    check_imbalance(run, profiles, moe_imbalance)
    if moe_imbalance is not None:  # stated now: no longer assumed
        run = run.model_copy(update={
            "training": run.training.model_copy(update={"moe_imbalance_factor": float(moe_imbalance)}),
            "assumed": tuple(a for a in run.assumed if a.name != "MoE imbalance")})
    else:  # assumed for the plan priced, not for the flags solve started from
        run = assumed_for_plan(run, plan, cluster_spec, profiles)
    return Inputs(run, cluster_spec, profiles), plan, data, priced


def assumed_for_plan(run: MegatronRun, plan: Plan, cluster_spec: ClusterSpec, profiles: ProfileSet,
                     whose: str = "the input's") -> MegatronRun:
    """The run with the MoE imbalance it assumes given for `plan` (its EP, TP, CP and micro-batch: the value that
    plan is priced with), not for the flags the input states: solve's pick ("the pick's"), estimate --plan's plan."""
    kept = tuple(a for a in run.assumed if a.name != "MoE imbalance")
    assumed = imbalance_assumption(as_planned(run, plan).model_copy(update={"assumed": kept}), cluster_spec,
                                   profiles, user_profiles=bool(profiles.user_files), whose=whose).assumed
    return run.model_copy(update={"assumed": assumed})


def hosts_notes(outcome: SolveOutcome) -> list[str]:
    """Where the pick runs against what the user gave (solve's notes: text, JSON, plan.json, summary.md): the nodes
    of --hosts it leaves unused, the script's srun on another number of nodes or under an --export launch.sh cannot
    reach through (launcher/common.placement_notes)."""
    plan, cluster, hosts = outcome.plans[0], outcome.cluster, outcome.hosts
    if hosts is None and (outcome.script is None or not outcome.script.under_srun):
        return []
    return placement_notes(plan, cluster, hosts, outcome.script, place_agents(plan, cluster, hosts))


def check_emitted_plan(found, profiles: ProfileSet, memory_headroom: float | None = None) -> None:
    """The checker's verdict on the plan for the run and cluster it is emitted for, and the record:
    a rejected plan, an implausible prediction or inputs edited since solve are refused (--plan).
    `memory_headroom`: the one solve planned with (plan.json's `memory_headroom`; None: the default)."""
    cost_model = CostModel(found.run.model, found.run.training, found.cluster, profiles,
                           memory_headroom=memory_headroom)
    problems, cost = plan_problems(cost_model, found.plan)
    edited = f" ({' and '.join(found.edited)} changed after solve wrote plan.json)" if found.edited else ""
    if problems:
        raise PlannerInputError("--plan", f"the plan checker rejects this plan for {found.run.model.name} on "
                                          f"{describe_cluster(found.cluster, profiles)}: {'; '.join(problems)}"
                                          f"{edited}; re-run solve")
    if found.edited:
        raise PlannerInputError("--plan", f"{' and '.join(found.edited)} changed after solve wrote plan.json (their "
                                          "SHA-256 no longer matches made_for); emit writes only what solve planned: "
                                          "re-run solve")
    try:
        check_prediction(cost, "the plan", profiles.user_files)
    except ImplausiblePredictionError as exc:
        raise PlannerInputError("--plan", f"implausible prediction: {exc}") from None
