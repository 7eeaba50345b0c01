"""Megatron-LM's (and FlagScale's) consistency rules, in one place.

Everything that decides whether Megatron would accept a configuration lives here and is used by
the flag reader (planner/inputs/megatron_flags.py), the search (planner/search/space.py), the plan
checker (planner/checker.py), `estimate` and the launchers:

  * predicates on degrees, pure functions of a model and integers, each returning the violated
    rules (empty list: fine): `tp_violations`, `cp_violations`, `expert_violations`,
    `batch_violations`, `pipeline_split_violations`, `world_violations`;
  * the same as booleans for a search that enumerates degrees: `tp_ok`, `cp_ok`, `ep_ok`,
    `etp_ok`, `folding_ok`, `microbatches_ok`, `uniform_split_ok`, and `valid_degrees`, which
    yields every (TP, CP, EP, ETP, DP, PP, VPP, mbs) Megatron accepts for a model and world size;
  * `check_plan` on a Plan (uses the predicates above), plus the runtime rules.

Megatron checks several of these only when it initialises the process groups or at the first
step (reference/megatron.md sections 2 and 8), i.e. after a job has been queued and started;
the planner checks them before it emits a launcher.  Nothing here imports Megatron.  Where
Megatron (or FlagScale) has its own message, `RuleViolation.message` uses that exact text
(typos and missing spaces included, so that it can be matched against a real log).

Rule names (stable, used by tests and reports):
  heads_tp, query_groups_tp, ep_needs_experts, experts_ep, expert_folding, seq_cp,
  moe_tp_sequence_parallel, moe_etp_bias, gbs_microbatch, vpp_needs_pp, vpp_microbatches,
  world_size, pipeline_split, pipeline_split_vpp,
  layout_layers, layout_stage_count, tp_comm_overlap_sp, overlap_param_gather,
  megatron_uniform_dp, megatron_global_recompute,
  flagscale_cp, flagscale_vpp, flagscale_stage_mbs, flagscale_tied_tp,
  flagscale_shared_embedding_dp, flagscale_contiguous_types, flagscale_recompute
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

from planner.errors import PlannerInputError
from planner.schemas.model import ModelSpec
from planner.schemas.plan import Plan
from planner.schemas.training import TrainingSpec

PLAN_FIELD = "plan"


@dataclass(frozen=True)
class RuleViolation:
    """One broken rule: its name, the message Megatron/FlagScale would give, and what helps."""

    rule: str
    message: str
    hint: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message} ({self.hint})"


# --------------------------------------------------------------------------------------------
# Predicates on degrees (reference/megatron.md section 2).  Pure: a model and integers in, the
# violated rules out, with Megatron's own messages.
# --------------------------------------------------------------------------------------------
def tp_violations(model: ModelSpec, tp: int) -> list[RuleViolation]:
    """TC: heads % TP == 0; query groups a multiple or divisor of TP (megatron-core >= 0.16).
    Groups are the heads when group-query attention is off (and under MLA)."""
    out: list[RuleViolation] = []
    heads = model.num_attention_heads
    if heads % tp:
        out.append(RuleViolation(
            "heads_tp",
            f"num_attention_heads ({heads}) must be a multiple of tensor_model_parallel_size ({tp}).",
            f"choose a TP that divides {heads}",
        ))
    groups = model.query_groups
    if groups % tp and tp % groups:
        out.append(RuleViolation(
            "query_groups_tp",
            f"num_query_groups ({groups}) must be a multiple or divisor of tensor_model_parallel_size ({tp}).",
            f"choose a TP that divides {groups} or is a multiple of it (megatron-core <= 0.15 needs TP to divide it)",
        ))
    return out


def cp_violations(model: ModelSpec, cp: int) -> list[RuleViolation]:
    """VA: with CP > 1 the sequence is a multiple of 2*CP."""
    if cp > 1 and model.seq_length % (2 * cp):
        return [RuleViolation(
            "seq_cp",
            "seq-length should be a multiple of 2 * context-parallel-size if context-parallel-size > 1.",
            f"seq_length {model.seq_length} is not a multiple of 2*CP = {2 * cp}",
        )]
    return []


def expert_violations(
    model: ModelSpec, *, tp: int, cp: int, dp: int, ep: int, etp: int, pp: int = 1,
    sequence_parallel: bool = True,
) -> list[RuleViolation]:
    """EP needs experts and divides them (VA); parallel folding (TP*CP*DP) % (ETP*EP) == 0 (PS:
    "world_size ... expert_tensor_model_pipeline_parallel size", with world = TP*CP*DP*PP); MoE
    with TP > 1 needs sequence parallelism (RT); MoE with ETP > 1 needs biases off (TC)."""
    out: list[RuleViolation] = []
    if ep > 1 and not model.is_moe:
        out.append(RuleViolation("ep_needs_experts", "num_experts must be non None to use expert model parallelism",
                                 "a dense model needs EP = 1"))
    if model.is_moe and model.num_experts % ep:
        out.append(RuleViolation("experts_ep",
                                 "Number of experts should be a multiple of expert model parallel_size.",
                                 f"num_experts {model.num_experts} is not a multiple of EP {ep}"))
    world = tp * cp * dp
    if world % (etp * ep):
        out.append(RuleViolation(
            "expert_folding",
            f"world_size ({world * pp}) is not divisible by expert_tensor_model_pipeline_parallel size ({etp * ep * pp})",
            f"TP*CP*DP = {world} must be a multiple of ETP*EP = {etp * ep}",
        ))
    if model.is_moe and tp > 1 and not sequence_parallel:
        out.append(RuleViolation(
            "moe_tp_sequence_parallel",
            "During training, performance may degrade if MoE and tensor parallelismare enabled without also "
            "enabling sequence parallelism.",
            "MoE with TP > 1 needs --sequence-parallel (Megatron raises this in MoELayer.forward)",
        ))
    if model.is_moe and etp > 1 and model.add_bias_linear:
        out.append(RuleViolation("moe_etp_bias", "Bias in Moe is only supported when ETP==1",
                                 "add --disable-bias-linear, or use ETP = 1"))
    return out


def world_violations(world_size: int, *, tp: int, pp: int, cp: int) -> list[RuleViolation]:
    """VA: the world is a multiple of TP*PP*CP."""
    size = tp * pp * cp
    if world_size % size:
        return [RuleViolation("world_size",
                              f"world size ({world_size}) is not divisible by total_model_size (total_model_size={size})",
                              "choose TP*PP*CP dividing the number of GPUs")]
    return []


def batch_violations(gbs: int, *, mbs: int, dp: int, pp: int, vpp: int) -> list[RuleViolation]:
    """MB: GBS % (mbs*DP) == 0.  Interleaving (VPP > 1): PP > 1 (VA) and, with the default
    micro-batch group size PP, M >= PP and M % PP == 0 (SCH)."""
    out: list[RuleViolation] = []
    if gbs % (mbs * dp):
        out.append(RuleViolation(
            "gbs_microbatch",
            f"global batch size ({gbs}) is not divisible by micro batch size ({mbs}) times data parallel size ({dp})",
            "choose a global batch that is a multiple of mbs * DP",
        ))
    if vpp > 1:
        if pp < 2:
            out.append(RuleViolation("vpp_needs_pp",
                                     "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1",
                                     "use vpp = 1 with a single pipeline stage"))
        m = gbs // (mbs * dp) if gbs % (mbs * dp) == 0 else None
        if m is not None and pp > 1:
            if m < pp:
                out.append(RuleViolation(
                    "vpp_microbatches",
                    f"The number of contiguous micro-batches in a virtual pipeline stageshould range in [PP={pp} , M={m}]",
                    f"the interleaved schedule needs at least PP = {pp} micro-batches, got {m}",
                ))
            elif m % pp:
                out.append(RuleViolation(
                    "vpp_microbatches",
                    "The remainder of M (the total micro-batches) divided by N (number of contiguous micro-batches "
                    "in a virtual pipeline stage) should be 0, or larger than or equal to the pipeline-parallel "
                    f"size, but it is {m % pp}. Otherwise, it introduces dependency bubbles in the pipeline and "
                    "reduces throughput.",
                    f"micro-batches M = {m} must be a multiple of PP = {pp} with interleaving",
                ))
    return out


def pipeline_split_violations(
    num_layers: int, pp: int, vpp: int = 1, *, first: int | None = None, last: int | None = None,
    account_for_embedding: bool = False, account_for_loss: bool = False,
) -> list[RuleViolation]:
    """How --num-layers splits over PP ranks without an explicit layout (VA and TC, megatron-core
    0.19): first/last-stage overrides and the account-for flags exclude each other; the count
    (num_layers + 1 per accounted embedding/loss) divides over the ranks; with VPP each rank's
    count divides by VPP (without the account-for flags validate_args does not check this with
    VPP; the model build does, in transformer_block.get_num_layers_to_build, and its message is
    used).  With the account-for flags Megatron counts the embedding and the loss
    as layers here: Qwen3-235B's 94 layers on PP 8 with VPP 4 are (94 + 2) / 8 = 12 per rank, which
    4 divides."""
    out: list[RuleViolation] = []
    accounted = int(account_for_embedding) + int(account_for_loss)
    if (first is not None or last is not None) and accounted:
        return [RuleViolation(
            "pipeline_split",
            "num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot beset at the same "
            "time with account_for_embedding_in_pipeline_splitand account_for_loss_in_pipeline_split",
            "give either --decoder-first/last-pipeline-num-layers or the --account-for-* flags",
        )]
    v = vpp if vpp > 1 else None
    if first is not None or last is not None:
        layers, ranks = num_layers, pp
        for which, n in (("first", first), ("last", last)):
            if n is None:
                continue
            if n <= 0:
                out.append(RuleViolation("pipeline_split", f"num_layers_in_{which}_pipeline_stage must be larger than 0",
                                         f"give the {which} stage at least one layer"))
                return out
            if v and n % v:
                out.append(RuleViolation(
                    "pipeline_split_vpp",
                    f"number of layers at {which} stage: {n}must be divisible by virtual pipelineparallel degree {v}",
                    f"the {which} stage's layers must be a multiple of VPP {v}"))
            layers -= n
            ranks -= 1
        if bool(layers) != bool(ranks):
            out.append(RuleViolation("pipeline_split",
                                     f"Mismatch: {layers} middle layers remaining but {ranks} middle PP stages available.",
                                     "first + last must leave layers for the middle stages, or none"))
        elif ranks and layers % ranks:
            out.append(RuleViolation(
                "pipeline_split",
                f"number of layers at middle stage: {layers} must be divisible bythe middle pipeline model parallel size {ranks}",
                "the middle stages must share the remaining layers evenly"))
        elif ranks and v and (layers // ranks) % v:
            out.append(RuleViolation(
                "pipeline_split_vpp",
                f"number of layers on each middle pipeline rank:{layers // ranks} must be divisible by virtual"
                f"pipeline parallel degree {v}",
                f"each middle rank's layers must be a multiple of VPP {v}"))
        return out
    total = num_layers + accounted
    if total % pp:
        if accounted and v:
            message = (f"num_layers: {total} after enableaccount_for_embedding_in_pipeline_split or "
                       f"account_for_loss_in_pipeline_split must be divisibleby pipeline_model_parallel_size {pp}")
        elif accounted:
            message = f"number of middle layers: {total} must be divisible by middle pipeline_model_parallel_size {pp}"
        elif v:  # validate_args lets it pass; the model build refuses (transformer_block.get_num_layers_to_build)
            message = f"num_layers={total} should be divisible by config.pipeline_model_parallel_size={pp}"
        else:
            message = "Number of layers should be divisible by the pipeline-model-parallel size"
        return [RuleViolation("pipeline_split", message,
                              f"--num-layers {num_layers}{f' + {accounted} accounted' if accounted else ''} over PP {pp}; "
                              "give --pipeline-model-parallel-layout or --decoder-first/last-pipeline-num-layers")]
    per_rank = total // pp
    if v and per_rank % v:
        if accounted:
            message = (f"number of layers on each pipeline rank: {per_rank}(after enable account_for_embedding_in_"
                       "pipeline_split or account_for_loss_in_pipeline_split) must be divisible by"
                       f"virtual_pipeline_model_parallel_size{v}")
        else:  # the model build (transformer_block.get_num_layers_to_build)
            message = f"num_layers_per_pipeline_rank {per_rank}             should be divisible by vp_size {v}"
        out.append(RuleViolation("pipeline_split_vpp", message, f"each rank's {per_rank} layers must be a multiple of VPP {v}"))
    return out


# -- booleans for a search that enumerates degrees ------------------------------------------
def tp_ok(model: ModelSpec, tp: int) -> bool:
    """TP divides the heads, and the query groups divide or are divided by TP."""
    return not tp_violations(model, tp)


def cp_ok(model: ModelSpec, cp: int) -> bool:
    """The sequence is a multiple of 2*CP (CP > 1)."""
    return not cp_violations(model, cp)


def ep_ok(model: ModelSpec, ep: int) -> bool:
    """EP = 1 for a dense model; EP divides the experts of a MoE model."""
    return ep == 1 or (model.is_moe and model.num_experts % ep == 0)


def etp_ok(model: ModelSpec, etp: int) -> bool:
    """ETP > 1 only for a model without linear biases (Megatron: bias in MoE only with ETP 1)."""
    return etp == 1 or not model.is_moe or not model.add_bias_linear


def folding_ok(*, tp: int, cp: int, dp: int, ep: int, etp: int) -> bool:
    """(TP*CP*DP) % (ETP*EP) == 0: each stage's ranks hold whole expert groups."""
    return (tp * cp * dp) % (etp * ep) == 0


def microbatches_ok(gbs: int, *, mbs: int, dp: int, pp: int, vpp: int) -> bool:
    """GBS % (mbs*DP) == 0, and with VPP > 1: PP > 1, M >= PP and M % PP == 0."""
    return not batch_violations(gbs, mbs=mbs, dp=dp, pp=pp, vpp=vpp)


def uniform_split_ok(num_layers: int, pp: int, vpp: int = 1, *, account_for_embedding: bool = False,
                     account_for_loss: bool = False) -> bool:
    """Megatron's own even split (no layout flag) works: (L + accounted) % PP == 0 and each
    rank's count divides by VPP.  A layout string (--pipeline-model-parallel-layout) places any
    count per stage, so a search that emits layouts only needs L >= PP*VPP."""
    return not pipeline_split_violations(num_layers, pp, vpp, account_for_embedding=account_for_embedding,
                                         account_for_loss=account_for_loss)


class Degrees(NamedTuple):
    """One global parallel configuration: DP = world / (TP*CP*PP)."""

    tp: int
    cp: int
    ep: int
    etp: int
    dp: int
    pp: int
    vpp: int
    mbs: int


def valid_degrees(
    model: ModelSpec, world_size: int, gbs: int, *, tps: Sequence[int] = (1, 2, 4, 8), cps: Sequence[int] = (1, 2, 4),
    eps: Sequence[int] | None = None, etps: Sequence[int] | None = None, pps: Sequence[int] | None = None,
    vpps: Sequence[int] = (1, 2), mbss: Sequence[int] = (1, 2, 4), uniform_split: bool = False,
) -> Iterator[Degrees]:
    """Every uniform (upstream Megatron) configuration of `world_size` GPUs that Megatron
    accepts for this model and global batch: the world divides by TP*CP*PP, and every predicate
    above holds (with sequence parallelism on for MoE with TP > 1, as the launcher emits).
    eps default: the divisors of the expert count; etps: 1 and TP; pps: 1..num_layers.
    `uniform_split=True` also asks Megatron's even layer split (no layout string) to work."""
    experts = model.num_experts or 1
    for tp in tps:
        if not tp_ok(model, tp):
            continue
        for cp in cps:
            if not cp_ok(model, cp):
                continue
            for pp in (pps if pps is not None else range(1, model.num_layers + 1)):
                if world_size % (tp * cp * pp):
                    continue
                dp = world_size // (tp * cp * pp)
                for ep in (eps if eps is not None else [e for e in range(1, experts + 1) if experts % e == 0]):
                    if not ep_ok(model, ep):
                        continue
                    for etp in (etps if etps is not None else sorted({1, tp})):
                        if not etp_ok(model, etp) or not folding_ok(tp=tp, cp=cp, dp=dp, ep=ep, etp=etp):
                            continue
                        for vpp in vpps:
                            if vpp > 1 and model.num_layers < pp * vpp:
                                continue
                            if uniform_split and not uniform_split_ok(model.num_layers, pp, vpp):
                                continue
                            for mbs in mbss:
                                if microbatches_ok(gbs, mbs=mbs, dp=dp, pp=pp, vpp=vpp):
                                    yield Degrees(tp, cp, ep, etp, dp, pp, vpp, mbs)


# --------------------------------------------------------------------------------------------
# Megatron's rules on a Plan
# --------------------------------------------------------------------------------------------
def _dense_rules(model: ModelSpec, plan: Plan) -> list[RuleViolation]:
    return tp_violations(model, plan.tp) + cp_violations(model, plan.cp)


def _moe_rules(model: ModelSpec, plan: Plan) -> list[RuleViolation]:
    out: list[RuleViolation] = []
    pp = plan.pp if plan.runtime == "megatron" else 1
    for i, stage in enumerate(plan.stages):  # every stage's ranks must hold whole expert groups
        for v in expert_violations(model, tp=plan.tp, cp=plan.cp, dp=stage.dp, ep=plan.ep, etp=plan.etp, pp=pp,
                                   sequence_parallel=plan.sequence_parallel):
            if any((v.rule, v.message) == (o.rule, o.message) for o in out):
                continue  # the same refusal on several stages is said once
            if v.rule == "expert_folding" and len({s.dp for s in plan.stages}) > 1:
                v = RuleViolation(v.rule, v.message, f"stage {i}: {v.hint}")
            out.append(v)
    return out


def _batch_rules(plan: Plan) -> list[RuleViolation]:
    return batch_violations(plan.gbs, mbs=plan.mbs, dp=plan.dp0, pp=plan.pp, vpp=plan.vpp)


def _layout_rules(model: ModelSpec, plan: Plan) -> list[RuleViolation]:
    out: list[RuleViolation] = []
    placed = sum(s.num_layers for s in plan.stages)
    if placed != model.num_layers:
        out.append(
            RuleViolation(
                "layout_layers",
                f"Number of decoder layers {placed}must match num_layers {model.num_layers}",
                "the stages' layer counts must add up to --num-layers",
            )
        )
    if plan.vpp > 1:
        short = [i for i, s in enumerate(plan.stages) if s.num_layers < plan.vpp]
        if short:
            out.append(
                RuleViolation(
                    "layout_stage_count",
                    f"stages {short} hold fewer decoder layers than the {plan.vpp} virtual chunks "
                    "each pipeline rank runs",
                    "give every stage at least vpp layers, or lower vpp",
                )
            )
    return out


def _training_rules(plan: Plan, training: TrainingSpec | None) -> list[RuleViolation]:
    out: list[RuleViolation] = []
    if training is None:
        return out
    if training.tp_comm_overlap and not (plan.sequence_parallel and plan.tp > 1):
        out.append(
            RuleViolation(
                "tp_comm_overlap_sp",
                "Tensor parallel communication/GEMM overlap can happen only when sequence "
                "parallelism is enabled",
                "--tp-comm-overlap requires --sequence-parallel (and TP > 1)",
            )
        )
    if training.overlap_param_gather:
        if not training.use_distributed_optimizer:
            out.append(
                RuleViolation(
                    "overlap_param_gather",
                    "--overlap-param-gather only supported with distributed optimizer",
                    "add --use-distributed-optimizer",
                )
            )
        if not training.overlap_grad_reduce:
            out.append(
                RuleViolation(
                    "overlap_param_gather",
                    "Must use --overlap-param-gather with --overlap-grad-reduce",
                    "add --overlap-grad-reduce",
                )
            )
    return out


# --------------------------------------------------------------------------------------------
# Runtime rules
# --------------------------------------------------------------------------------------------
def _megatron_runtime_rules(plan: Plan) -> list[RuleViolation]:
    out: list[RuleViolation] = []
    dps = [s.dp for s in plan.stages]
    if len(set(dps)) > 1:
        out.append(
            RuleViolation(
                "megatron_uniform_dp",
                f"upstream Megatron-LM runs one data-parallel size for the whole job, but the "
                f"plan's stages have DP {dps}",
                "use the same DP on every stage, or --runtime flagscale for per-stage DP",
            )
        )
    recomputes = [s.recompute for s in plan.stages]
    if len({r.label for r in recomputes}) > 1:
        out.append(
            RuleViolation(
                "megatron_global_recompute",
                "upstream Megatron-LM takes one recompute setting for every stage, but the plan "
                f"asks for {[r.label for r in recomputes]}",
                "use one recompute choice on every stage, or --runtime flagscale for per-stage "
                "recompute",
            )
        )
    return out


def _flagscale_runtime_rules(
    model: ModelSpec | None, plan: Plan, training: TrainingSpec | None
) -> list[RuleViolation]:
    out: list[RuleViolation] = []
    if plan.cp != 1:
        out.append(
            RuleViolation(
                "flagscale_cp",
                "Context parallelism is not supported.",
                "FlagScale's heterogeneous meshes need CP = 1",
            )
        )
    if plan.vpp != 1:
        out.append(
            RuleViolation(
                "flagscale_vpp",
                "virtual pipeline not support now!",
                "FlagScale's heterogeneous meshes need vpp = 1 (no interleaving)",
            )
        )
    dp0 = plan.dp0
    for i, stage in enumerate(plan.stages):
        if (dp0 * plan.mbs) % stage.dp:
            out.append(
                RuleViolation(
                    "flagscale_stage_mbs",
                    f"(DP0 * micro_batch_size) = ({dp0} * {plan.mbs}) is not divisible by the "
                    f"data-parallel size {stage.dp} of stage {i}",
                    "every stage processes DP0*mbs samples per micro-batch, split over its own DP",
                )
            )
    tied = model is not None and (
        not model.untie_embeddings_and_output_weights or model.mtp_num_layers > 0
    )
    first, last = plan.stages[0], plan.stages[-1]
    # A Plan has one global TP today, so this holds; the check stays for per-stage TP.
    first_tp, last_tp = getattr(first, "tp", plan.tp), getattr(last, "tp", plan.tp)
    if tied and first_tp != last_tp:
        out.append(
            RuleViolation(
                "flagscale_tied_tp",
                f"the first and last process mesh must have the same TP ({first_tp} != {last_tp}) "
                "with tied embeddings or MTP",
                "untie the embeddings (--untie-embeddings-and-output-weights)",
            )
        )
    uses_dist_opt = training is None or training.use_distributed_optimizer
    if tied and uses_dist_opt and first.dp != last.dp and first.dp % last.dp and last.dp % first.dp:
        out.append(
            RuleViolation(
                "flagscale_shared_embedding_dp",
                f"with tied embeddings the first and last mesh DP ({first.dp}, {last.dp}) must "
                "divide one another (--use-partial-reduce-for-shared-embedding)",
                "make one DP a multiple of the other, or untie the embeddings",
            )
        )
    seen: list[str] = []
    for stage in plan.stages:
        if not seen or seen[-1] != stage.device_type:
            seen.append(stage.device_type)
    if len(seen) != len(set(seen)):
        out.append(
            RuleViolation(
                "flagscale_contiguous_types",
                f"stages of one device type must be consecutive, but the stage types run {seen}: "
                "FlagScale orders ranks by the first index of each type in hetero_device_types",
                "group the stages of each device type together",
            )
        )
    kinds = {s.recompute.granularity for s in plan.stages}
    labels = {s.recompute.label for s in plan.stages}
    if "selective" in kinds and len(labels) > 1:
        out.append(
            RuleViolation(
                "flagscale_recompute",
                "FlagScale's per-stage recompute lists only switch full recompute on or off per "
                f"stage; the plan mixes {sorted(labels)}",
                "use selective recompute on every stage, or full/none per stage",
            )
        )
    return out


def check_runtime_expressible(plan: Plan, model: ModelSpec | None = None) -> list[RuleViolation]:
    """The rules of the plan's runtime alone: why `plan.runtime` cannot run this plan as given.

    megatron: one DP and one recompute setting for all stages.  flagscale: CP = 1, no
    interleaving, (DP0*mbs) % DP_i == 0, device types contiguous, recompute per stage only as
    full-or-none (plus the tied-embedding rules when `model` is given)."""
    if plan.runtime == "megatron":
        return _megatron_runtime_rules(plan)
    return _flagscale_runtime_rules(model, plan, None)


def check_plan(
    model: ModelSpec, plan: Plan, training: TrainingSpec | None = None
) -> list[RuleViolation]:
    """Every rule of reference/megatron.md section 2 that applies to a Plan, plus the rules of
    the plan's runtime.  Empty list: the plan is fine."""
    out = _dense_rules(model, plan)
    out += _moe_rules(model, plan)
    out += _batch_rules(plan)
    out += _layout_rules(model, plan)
    out += _training_rules(plan, training)
    if plan.runtime == "megatron":
        out += _megatron_runtime_rules(plan)
    else:
        out += _flagscale_runtime_rules(model, plan, training)
    return out


def format_violations(violations: list[RuleViolation]) -> str:
    """One line per violation: the message, then what would help."""
    return "; ".join(f"{v.message} [{v.rule}: {v.hint}]" for v in violations)


def assert_plan_ok(model: ModelSpec, plan: Plan, training: TrainingSpec | None = None) -> None:
    """Raise PlannerInputError("plan", ...) listing every violated rule."""
    violations = check_plan(model, plan, training)
    if violations:
        raise PlannerInputError(
            PLAN_FIELD,
            f"the plan breaks {len(violations)} rule(s) of the {plan.runtime} runtime: "
            + format_violations(violations),
        )


# --------------------------------------------------------------------------------------------
# Search-space predicates (issues 12 and 15).  The rules above, as small pure functions of the
# degrees, for the search's enumerator (planner/search/space.py), the CP-SAT master's rule
# constraints (solver_models/cpsat/master.py) and the tests' brute force.  Each names the rules of
# check_plan it stands for; tests/test_master.py checks that they agree with check_plan.
# --------------------------------------------------------------------------------------------
def tp_allowed(model: ModelSpec, tp: int) -> bool:
    """heads_tp, query_groups_tp."""
    groups = model.query_groups
    return model.num_attention_heads % tp == 0 and (
        model.num_query_groups is None or groups % tp == 0 or tp % groups == 0)


def cp_allowed(model: ModelSpec, cp: int) -> bool:
    """seq_cp."""
    return cp == 1 or model.seq_length % (2 * cp) == 0


def ep_allowed(model: ModelSpec, ep: int) -> bool:
    """ep_needs_experts, experts_ep."""
    if not model.is_moe:
        return ep == 1
    return model.num_experts % ep == 0


def etp_allowed(model: ModelSpec, tp: int, etp: int) -> bool:
    """moe_etp_bias (MoE with bias only at ETP 1); a dense model has no experts, so its ETP is
    Megatron's default, TP."""
    if not model.is_moe:
        return etp == tp
    return etp == 1 or not model.add_bias_linear


def expert_folding_ok(tp: int, cp: int, dp: int, ep: int, etp: int) -> bool:
    """expert_folding: a stage's TP*CP*DP ranks hold whole ETP*EP expert groups."""
    return (tp * cp * dp) % (etp * ep) == 0


def batch_ok(gbs: int, mbs: int, dp: int) -> bool:
    """gbs_microbatch."""
    return gbs % (mbs * dp) == 0


def interleave_ok(gbs: int, mbs: int, dp: int, pp: int, vpp: int) -> bool:
    """vpp_needs_pp, vpp_microbatches (with batch_ok)."""
    if vpp == 1:
        return True
    m = gbs // (mbs * dp)
    return pp > 1 and m >= pp and m % pp == 0


def layout_ok(num_layers: int, pp: int, vpp: int) -> bool:
    """layout_layers, layout_stage_count: every stage holds at least one layer per virtual chunk."""
    return num_layers >= pp * vpp


def runtime_degrees_ok(runtime: str, cp: int, vpp: int) -> bool:
    """flagscale_cp, flagscale_vpp (upstream Megatron takes both)."""
    return runtime == "megatron" or (cp == 1 and vpp == 1)


def flagscale_stage_mbs_ok(samples_per_microbatch: int, dp: int) -> bool:
    """flagscale_stage_mbs: every stage splits the DP0*mbs samples of a micro-batch over its DP."""
    return samples_per_microbatch % dp == 0


def flagscale_recompute_ok(labels: list[str] | tuple[str, ...]) -> bool:
    """flagscale_recompute: one selective setting on every stage, or none/full per stage."""
    selective = [lab for lab in labels if lab.startswith("selective")]
    return not selective or len(set(labels)) == 1


def flagscale_tied_embeddings(model: ModelSpec, training: TrainingSpec | None) -> bool:
    """Whether flagscale_shared_embedding_dp couples the first and last stage's DP (tied embeddings
    or MTP, with the distributed optimizer)."""
    tied = not model.untie_embeddings_and_output_weights or model.mtp_num_layers > 0
    return tied and (training is None or training.use_distributed_optimizer)


def flagscale_shared_embedding_ok(first_dp: int, last_dp: int) -> bool:
    """flagscale_shared_embedding_dp (when flagscale_tied_embeddings holds)."""
    return first_dp % last_dp == 0 or last_dp % first_dp == 0
