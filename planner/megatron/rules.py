"""Megatron-LM's (and FlagScale's) consistency rules: the one rule set of the planner.

Everything that decides whether Megatron would accept a configuration lives here and is used by
the flag reader (planner/inputs/megatron_flags.py, planner/megatron/layout.py), the search
(planner/search/space.py, the CP-SAT master's rule families in planner/search/certify.py), the
plan checker (planner/checker.py), `estimate` and the launchers:

  * each rule is one `*_violations` function, a pure function of a model and integers that
    returns the violated rules (empty list: fine), with Megatron's (or FlagScale's) wording:
    `tp_violations`, `cp_violations`, `ep_violations`, `folding_violations`, `etp_violations`,
    `expert_violations` (the expert rules together), `world_violations`, `microbatch_violations`,
    `interleave_violations`, `batch_violations` (the two together), `pipeline_split_violations`,
    `stage_count_violations` and the FlagScale rules `flagscale_*_violations`;
  * the booleans a search asks while it enumerates degrees are `not <rule>_violations(...)`:
    `tp_allowed`, `cp_allowed`, `ep_allowed`, `etp_allowed`, `expert_folding_ok`, `batch_ok`,
    `interleave_ok`, `layout_ok`, `runtime_degrees_ok`, `flagscale_stage_mbs_ok`,
    `flagscale_recompute_ok`, `flagscale_shared_embedding_ok` (those the search asks in its loops
    remember their answers: they are pure functions of integers);
  * `check_plan` on a Plan (the rules above, plus the rules of the plan's runtime).

Megatron checks several of these only when it initialises the process groups or at the first
step (reference/megatron.md sections 2 and 8), i.e. after a job has been queued and started;
the planner checks them before it emits a launcher.  Nothing here imports Megatron.  Where
Megatron (or FlagScale) has its own message, `RuleViolation.message` uses that exact text
(typos and missing spaces included, so that it can be matched against a real log).

Rule names (stable, used by tests and reports; planner/megatron/flags.py names the flags behind
each):
  heads_tp, query_groups_tp, ep_needs_experts, experts_ep, expert_folding, seq_cp,
  moe_tp_sequence_parallel, moe_etp_bias, gbs_microbatch, vpp_needs_pp, vpp_microbatches,
  world_size, pipeline_split, pipeline_split_vpp,
  layout_layers, layout_stage_count, tp_comm_overlap_sp, overlap_param_gather,
  megatron_uniform_dp, megatron_global_recompute,
  flagscale_cp, flagscale_vpp, flagscale_stage_mbs, flagscale_tied_tp,
  flagscale_shared_embedding_dp, flagscale_contiguous_types, flagscale_recompute
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

from planner.errors import PlannerInputError
from planner.runtime import runtime_of
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


def ep_violations(model: ModelSpec, ep: int) -> list[RuleViolation]:
    """VA: EP needs experts, and divides them."""
    out: list[RuleViolation] = []
    if ep > 1 and not model.is_moe:
        out.append(RuleViolation("ep_needs_experts", "num_experts must be non None to use expert model parallelism",
                                 "a dense model needs EP = 1"))
    if model.is_moe and model.num_experts % ep:
        out.append(RuleViolation("experts_ep",
                                 "Number of experts should be a multiple of expert model parallel_size.",
                                 f"num_experts {model.num_experts} is not a multiple of EP {ep}"))
    return out


def folding_violations(*, tp: int, cp: int, dp: int, ep: int, etp: int, pp: int = 1) -> list[RuleViolation]:
    """PS: parallel folding, (TP*CP*DP) % (ETP*EP) == 0 ("world_size ... expert_tensor_model_
    pipeline_parallel size", with world = TP*CP*DP*PP): a stage's ranks hold whole expert groups."""
    world = tp * cp * dp
    if world % (etp * ep):
        return [RuleViolation(
            "expert_folding",
            f"world_size ({world * pp}) is not divisible by expert_tensor_model_pipeline_parallel size ({etp * ep * pp})",
            f"TP*CP*DP = {world} must be a multiple of ETP*EP = {etp * ep}",
        )]
    return []


def sequence_parallel_violations(model: ModelSpec, tp: int, sequence_parallel: bool) -> list[RuleViolation]:
    """RT: MoE with TP > 1 needs sequence parallelism."""
    if model.is_moe and tp > 1 and not sequence_parallel:
        return [RuleViolation(
            "moe_tp_sequence_parallel",
            "During training, performance may degrade if MoE and tensor parallelismare enabled without also "
            "enabling sequence parallelism.",
            "MoE with TP > 1 needs --sequence-parallel (Megatron raises this in MoELayer.forward)",
        )]
    return []


def etp_violations(model: ModelSpec, etp: int) -> list[RuleViolation]:
    """TC: MoE with ETP > 1 needs the linear biases off."""
    if model.is_moe and etp > 1 and model.add_bias_linear:
        return [RuleViolation("moe_etp_bias", "Bias in Moe is only supported when ETP==1",
                              "add --disable-bias-linear, or use ETP = 1")]
    return []


def expert_violations(
    model: ModelSpec, *, tp: int, cp: int, dp: int, ep: int, etp: int, pp: int = 1,
    sequence_parallel: bool = True,
) -> list[RuleViolation]:
    """The expert rules together: EP (ep_violations), parallel folding (folding_violations), MoE
    with TP needs sequence parallelism, MoE with ETP > 1 needs biases off (etp_violations)."""
    return (ep_violations(model, ep) + folding_violations(tp=tp, cp=cp, dp=dp, ep=ep, etp=etp, pp=pp)
            + sequence_parallel_violations(model, tp, sequence_parallel) + etp_violations(model, etp))


def world_violations(world_size: int, *, tp: int, pp: int, cp: int) -> list[RuleViolation]:
    """VA: the world is a multiple of TP*PP*CP."""
    size = tp * pp * cp
    if world_size % size:
        return [RuleViolation("world_size",
                              f"world size ({world_size}) is not divisible by total_model_size (total_model_size={size})",
                              "choose TP*PP*CP dividing the number of GPUs")]
    return []


def microbatch_violations(gbs: int, *, mbs: int, dp: int) -> list[RuleViolation]:
    """MB: GBS % (mbs*DP) == 0."""
    if gbs % (mbs * dp):
        return [RuleViolation(
            "gbs_microbatch",
            f"global batch size ({gbs}) is not divisible by micro batch size ({mbs}) times data parallel size ({dp})",
            "choose a global batch that is a multiple of mbs * DP",
        )]
    return []


def interleave_violations(m: int | None, *, pp: int, vpp: int) -> list[RuleViolation]:
    """Interleaving (VPP > 1): PP > 1 (VA) and, with the default micro-batch group size PP, M >= PP
    and M % PP == 0 (SCH), for M micro-batches (None: not known, only the first rule applies)."""
    out: list[RuleViolation] = []
    if vpp <= 1:
        return out
    if pp < 2:
        out.append(RuleViolation("vpp_needs_pp",
                                 "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1",
                                 "use vpp = 1 with a single pipeline stage"))
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


def batch_violations(gbs: int, *, mbs: int, dp: int, pp: int, vpp: int) -> list[RuleViolation]:
    """The batch rules together: microbatch_violations, then interleave_violations with
    M = GBS / (mbs*DP) when it divides."""
    m = gbs // (mbs * dp) if gbs % (mbs * dp) == 0 else None
    return microbatch_violations(gbs, mbs=mbs, dp=dp) + interleave_violations(m, pp=pp, vpp=vpp)


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
        return _end_stage_split_violations(num_layers, pp, v, first, last)
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
        return [RuleViolation("pipeline_split_vpp", message, f"each rank's {per_rank} layers must be a multiple of VPP {v}")]
    return []


def _end_stage_split_violations(num_layers: int, pp: int, v: int | None, first: int | None, last: int | None
                                ) -> list[RuleViolation]:
    """pipeline_split_violations with --decoder-first/last-pipeline-num-layers (v: VPP, None
    without interleaving)."""
    out: list[RuleViolation] = []
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


def stage_count_violations(stage_layers: Sequence[int], vpp: int) -> list[RuleViolation]:
    """With interleaving every stage (pipeline rank) holds at least one decoder layer per virtual
    chunk."""
    short = [i for i, n in enumerate(stage_layers) if n < vpp] if vpp > 1 else []
    if short:
        return [RuleViolation(
            "layout_stage_count",
            f"stages {short} hold fewer decoder layers than the {vpp} virtual chunks each pipeline rank runs",
            "give every stage at least vpp layers, or lower vpp",
        )]
    return []


# -- FlagScale's rules on degrees -----------------------------------------------------------
def flagscale_degree_violations(cp: int, vpp: int) -> list[RuleViolation]:
    """FlagScale's heterogeneous meshes take no context parallelism and no interleaving."""
    out: list[RuleViolation] = []
    if cp != 1:
        out.append(RuleViolation("flagscale_cp", "Context parallelism is not supported.",
                                 "FlagScale's heterogeneous meshes need CP = 1"))
    if vpp != 1:
        out.append(RuleViolation("flagscale_vpp", "virtual pipeline not support now!",
                                 "FlagScale's heterogeneous meshes need vpp = 1 (no interleaving)"))
    return out


def flagscale_tp_violations(model: ModelSpec, tp: int) -> list[RuleViolation]:
    """FlagScale 0.8.0's Megatron fork (megatron-core 0.15) needs the query groups to be a multiple of TP
    (megatron/core/transformer/transformer_config.py); upstream >= 0.16 also takes a divisor of TP.
    Found by FlagScale's own validator on the planner's emitted configs (tests/test_flagscale_validator.py)."""
    groups = model.query_groups
    if groups % tp:
        return [RuleViolation(
            "flagscale_query_groups_tp",
            f"num_query_groups ({groups}) must be a multiple of tensor_model_parallel_size ({tp}).",
            f"FlagScale's Megatron fork needs TP to divide the {groups} query groups",
        )]
    return []


def runtime_tp_ok(runtime: str, model: ModelSpec, tp: int) -> bool:
    """flagscale_query_groups_tp on the flagscale runtime (upstream Megatron: tp_allowed alone)."""
    return not runtime_of(runtime).per_stage_meshes or not flagscale_tp_violations(model, tp)


def flagscale_stage_mbs_violations(dp0: int, mbs: int, stage_dps: Sequence[int]) -> list[RuleViolation]:
    """Every stage processes DP0*mbs samples per micro-batch, split over its own DP."""
    return [RuleViolation(
        "flagscale_stage_mbs",
        f"(DP0 * micro_batch_size) = ({dp0} * {mbs}) is not divisible by the data-parallel size {dp} of stage {i}",
        "every stage processes DP0*mbs samples per micro-batch, split over its own DP",
    ) for i, dp in enumerate(stage_dps) if (dp0 * mbs) % dp]


def flagscale_recompute_violations(labels: Sequence[str]) -> list[RuleViolation]:
    """FlagScale's per-stage recompute lists switch full recompute on or off per stage: a selective
    setting (Recompute.label "selective:...") must be every stage's."""
    distinct = set(labels)
    if any(label.startswith("selective") for label in distinct) and len(distinct) > 1:
        return [RuleViolation(
            "flagscale_recompute",
            "FlagScale's per-stage recompute lists only switch full recompute on or off per "
            f"stage; the plan mixes {sorted(distinct)}",
            "use selective recompute on every stage, or full/none per stage",
        )]
    return []


def flagscale_shared_embedding_violations(first_dp: int, last_dp: int) -> list[RuleViolation]:
    """With tied embeddings (flagscale_tied_embeddings) the first and last stage's DP divide one
    another (--use-partial-reduce-for-shared-embedding)."""
    if first_dp != last_dp and first_dp % last_dp and last_dp % first_dp:
        return [RuleViolation(
            "flagscale_shared_embedding_dp",
            f"with tied embeddings the first and last mesh DP ({first_dp}, {last_dp}) must "
            "divide one another (--use-partial-reduce-for-shared-embedding)",
            "make one DP a multiple of the other, or untie the embeddings",
        )]
    return []


def tied_embeddings(model: ModelSpec) -> bool:
    """The first and last stage share the embedding weights (tied output layer, or MTP)."""
    return not model.untie_embeddings_and_output_weights or model.mtp_num_layers > 0


def flagscale_tied_embeddings(model: ModelSpec, training: TrainingSpec | None) -> bool:
    """Whether flagscale_shared_embedding_dp couples the first and last stage's DP (tied embeddings
    or MTP, with the distributed optimizer)."""
    return tied_embeddings(model) and (training is None or training.use_distributed_optimizer)


# --------------------------------------------------------------------------------------------
# The rules as booleans, for a search that enumerates degrees (planner/search/space.py) and the
# CP-SAT master's rule families (planner/search/certify.py): each is `not` a rule above, and
# names the rules it stands for; tests/test_master.py checks them against check_plan.  Those the
# search asks in its loops (pure functions of integers) remember their answers.
# --------------------------------------------------------------------------------------------
_remembered = functools.lru_cache(maxsize=1 << 16)


def tp_allowed(model: ModelSpec, tp: int) -> bool:
    """heads_tp, query_groups_tp."""
    return not tp_violations(model, tp)


def cp_allowed(model: ModelSpec, cp: int) -> bool:
    """seq_cp."""
    return not cp_violations(model, cp)


def ep_allowed(model: ModelSpec, ep: int) -> bool:
    """ep_needs_experts, experts_ep."""
    return not ep_violations(model, ep)


def etp_allowed(model: ModelSpec, tp: int, etp: int) -> bool:
    """moe_etp_bias (MoE with bias only at ETP 1).  A dense model has no experts, so its ETP is
    Megatron's default, TP: the only value the search gives it."""
    if not model.is_moe:
        return etp == tp
    return not etp_violations(model, etp)


@_remembered
def expert_folding_ok(tp: int, cp: int, dp: int, ep: int, etp: int) -> bool:
    """expert_folding: a stage's TP*CP*DP ranks hold whole ETP*EP expert groups."""
    return not folding_violations(tp=tp, cp=cp, dp=dp, ep=ep, etp=etp)


@_remembered
def batch_ok(gbs: int, mbs: int, dp: int) -> bool:
    """gbs_microbatch."""
    return not microbatch_violations(gbs, mbs=mbs, dp=dp)


@_remembered
def interleave_ok(gbs: int, mbs: int, dp: int, pp: int, vpp: int) -> bool:
    """vpp_needs_pp, vpp_microbatches (with batch_ok), for M = GBS // (mbs*DP) micro-batches."""
    return not interleave_violations(gbs // (mbs * dp), pp=pp, vpp=vpp)


@_remembered
def layout_ok(num_layers: int, pp: int, vpp: int) -> bool:
    """layout_stage_count on the degrees: the even split's shortest stage (num_layers // PP
    layers) holds vpp of them, i.e. num_layers >= PP*VPP; the search also gives every stage a
    layer (PP <= num_layers)."""
    return pp <= num_layers and not stage_count_violations((num_layers // pp,), vpp)


@_remembered
def runtime_degrees_ok(runtime: str, cp: int, vpp: int) -> bool:
    """flagscale_cp, flagscale_vpp: CP and VPP only where the runtime has them (upstream Megatron takes
    both; FlagScale's meshes neither)."""
    rt = runtime_of(runtime)
    return not flagscale_degree_violations(1 if rt.context_parallel else cp, 1 if rt.interleaving else vpp)


@_remembered
def flagscale_stage_mbs_ok(samples_per_microbatch: int, dp: int) -> bool:
    """flagscale_stage_mbs: every stage splits the DP0*mbs samples of a micro-batch over its DP."""
    return not flagscale_stage_mbs_violations(samples_per_microbatch, 1, (dp,))


def flagscale_recompute_ok(labels: list[str] | tuple[str, ...]) -> bool:
    """flagscale_recompute: one selective setting on every stage, or none/full per stage."""
    return not flagscale_recompute_violations(labels)


def flagscale_shared_embedding_ok(first_dp: int, last_dp: int) -> bool:
    """flagscale_shared_embedding_dp (when flagscale_tied_embeddings holds)."""
    return not flagscale_shared_embedding_violations(first_dp, last_dp)


# --------------------------------------------------------------------------------------------
# Megatron's rules on a Plan
# --------------------------------------------------------------------------------------------
def _dense_rules(model: ModelSpec, plan: Plan) -> list[RuleViolation]:
    return tp_violations(model, plan.tp) + cp_violations(model, plan.cp)


def _moe_rules(model: ModelSpec, plan: Plan) -> list[RuleViolation]:
    out: list[RuleViolation] = []
    pp = 1 if runtime_of(plan.runtime).per_stage_meshes else plan.pp  # FlagScale: each mesh is its own world
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
    return out + stage_count_violations([s.num_layers for s in plan.stages], plan.vpp)


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
    out = flagscale_degree_violations(plan.cp, plan.vpp)
    if model is not None:
        out += flagscale_tp_violations(model, plan.tp)
    out += flagscale_stage_mbs_violations(plan.dp0, plan.mbs, [s.dp for s in plan.stages])
    tied = model is not None and tied_embeddings(model)
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
    if model is not None and flagscale_tied_embeddings(model, training):
        out += flagscale_shared_embedding_violations(first.dp, last.dp)
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
    return out + flagscale_recompute_violations([s.recompute.label for s in plan.stages])


def check_runtime_expressible(plan: Plan, model: ModelSpec | None = None) -> list[RuleViolation]:
    """The rules of the plan's runtime alone: why `plan.runtime` cannot run this plan as given.

    megatron: one DP and one recompute setting for all stages.  flagscale: CP = 1, no
    interleaving, (DP0*mbs) % DP_i == 0, device types contiguous, recompute per stage only as
    full-or-none (plus the tied-embedding rules when `model` is given)."""
    return runtime_violations(model, plan, None)


def runtime_violations(model: ModelSpec | None, plan: Plan, training: TrainingSpec | None) -> list[RuleViolation]:
    """The rules of the plan's runtime: one job's degrees for every stage (upstream Megatron), or the
    rules of FlagScale's per-stage meshes."""
    if runtime_of(plan.runtime).per_stage_meshes:
        return _flagscale_runtime_rules(model, plan, training)
    return _megatron_runtime_rules(plan)


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
    return out + runtime_violations(model, plan, training)


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


