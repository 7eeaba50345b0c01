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
    `tp_allowed`, `cp_allowed`, `sequence_split_ok`, `ep_allowed`, `etp_allowed`, `expert_folding_ok`, `batch_ok`,
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
  heads_tp, query_groups_tp, ep_needs_experts, experts_ep, expert_folding, seq_cp, seq_tp_sp,
  moe_tp_sequence_parallel, moe_etp_bias, gbs_microbatch, vpp_needs_pp, vpp_microbatches,
  world_size, pipeline_split, pipeline_split_vpp,
  layout_layers, layout_stage_count, tp_comm_overlap_sp, overlap_param_gather,
  megatron_uniform_dp, megatron_global_recompute,
  flagscale_cp, flagscale_vpp, flagscale_stage_mbs, flagscale_tied_tp,
  flagscale_shared_embedding_dp, flagscale_contiguous_types, flagscale_recompute, flagscale_moe_bias
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

from planner.errors import PlannerInputError
from planner.megatron.flags import flag_value
from planner.runtime import runtime_of
from planner.schemas.model import ModelSpec
from planner.schemas.parallel import MegatronRun, ParallelConfig
from planner.schemas.plan import Plan, Recompute
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


def sequence_split_violations(model: ModelSpec, tp: int, cp: int, sequence_parallel: bool) -> list[RuleViolation]:
    """RT: with sequence parallelism the embedding's output, this rank's seq_length/CP tokens, is split
    over the TP ranks at the first forward step (scatter_to_sequence_parallel_region asserts it divides):
    seq_length must be a multiple of TP*CP.  Megatron's argument checks do not catch it."""
    if sequence_parallel and tp > 1 and model.seq_length % (tp * cp):
        return [RuleViolation(
            "seq_tp_sp",
            "First dimension of the tensor should be divisible by tensor parallel size",
            f"with --sequence-parallel each TP rank holds seq_length/(TP*CP) tokens: seq_length {model.seq_length} "
            f"is not a multiple of TP*CP = {tp * cp}; choose a sequence length that is (or another TP)",
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
    """GBS % (mbs*DP) == 0.  Megatron checks it twice: validate_args on the evaluation batch, which
    defaults to the training batch (its message is the one a run prints), then the micro-batch
    calculator."""
    if gbs % (mbs * dp):
        return [RuleViolation(
            "gbs_microbatch",
            f"eval_global_batch_size ({gbs}) must be divisible by eval_micro_batch_size ({mbs}) * data_parallel_size "
            f"({dp})",
            f"--global-batch-size {gbs} must be a multiple of micro-batch x DP = {mbs * dp} (Megatron checks the "
            "evaluation batch first, which defaults to it)",
        )]
    return []


def interleave_violations(m: int | None, *, pp: int, vpp: int, overlap_p2p_comm: bool = True
                          ) -> list[RuleViolation]:
    """Interleaving (VPP > 1): PP > 1, or PP > 2 with --no-overlap-p2p-communication (VA), and, with
    the default micro-batch group size PP, M >= PP and M % PP == 0 (SCH, at the first step), for M
    micro-batches (None: not known, only the first rule applies)."""
    out: list[RuleViolation] = []
    if vpp <= 1:
        return out
    if overlap_p2p_comm and pp < 2:
        out.append(RuleViolation("vpp_needs_pp",
                                 "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1",
                                 "use vpp = 1 with a single pipeline stage"))
    elif not overlap_p2p_comm and pp < 3:
        out.append(RuleViolation(
            "vpp_needs_pp",
            "When interleaved schedule is used and p2p communication overlap is disabled, pipeline-model-parallel "
            "size should be greater than 2 to avoid having multiple p2p sends and recvs between same 2 ranks per "
            "communication batch",
            "use vpp = 1, PP > 2, or drop --no-overlap-p2p-communication"))
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
    account_for_embedding: bool = False, account_for_loss: bool = False, vpp_given: bool | None = None,
) -> list[RuleViolation]:
    """How --num-layers splits over PP ranks without an explicit layout (VA and TC, megatron-core
    0.19), in Megatron's order: without a VPP flag and without first/last-stage overrides, validate_args
    wants the count (num_layers + 1 per accounted embedding/loss) to divide over the ranks; the
    first/last-stage overrides and the account-for flags exclude each other (TC); the overrides leave
    an even middle (TC); with the account-for flags and VPP the count divides by PP and each rank's by
    VPP (TC); otherwise, with VPP, the model build (transformer_block.get_num_layers_to_build) wants
    num_layers % PP == 0 and each rank's layers % VPP == 0, and its message is used.  With the
    account-for flags Megatron counts the embedding and the loss as layers: Qwen3-235B's 94 layers on
    PP 8 with VPP 4 are (94 + 2) / 8 = 12 per rank, which 4 divides.  `vpp_given`: a VPP flag was given
    (None: VPP > 1)."""
    accounted = int(account_for_embedding) + int(account_for_loss)
    v = vpp if vpp > 1 else None
    given = v is not None if vpp_given is None else vpp_given
    total = num_layers + accounted
    if not given and first is None and last is None and total % pp:  # validate_args, before TC
        return [RuleViolation("pipeline_split", "Number of layers should be divisible by the pipeline-model-parallel size",
                              _split_hint(num_layers, accounted, pp))]
    if (first is not None or last is not None) and accounted:
        return [RuleViolation(
            "pipeline_split",
            "num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot beset at the same "
            "time with account_for_embedding_in_pipeline_splitand account_for_loss_in_pipeline_split",
            "give either --decoder-first/last-pipeline-num-layers or the --account-for-* flags",
        )]
    if first is not None or last is not None:
        return _end_stage_split_violations(num_layers, pp, v, first, last)
    if total % pp:
        if accounted and v:
            message = (f"num_layers: {total} after enableaccount_for_embedding_in_pipeline_split or "
                       f"account_for_loss_in_pipeline_split must be divisibleby pipeline_model_parallel_size {pp}")
        elif accounted:
            message = f"number of middle layers: {total} must be divisible by middle pipeline_model_parallel_size {pp}"
        else:  # validate_args lets it pass with a VPP flag; the model build refuses
            return [RuleViolation("pipeline_split_build",
                                  f"num_layers={total} should be divisible by config.pipeline_model_parallel_size={pp}",
                                  _split_hint(num_layers, accounted, pp) + " (Megatron refuses it when it builds the model)")]
        return [RuleViolation("pipeline_split", message, _split_hint(num_layers, accounted, pp))]
    per_rank = total // pp
    if v and per_rank % v:
        if accounted:
            message = (f"number of layers on each pipeline rank: {per_rank}(after enable account_for_embedding_in_"
                       "pipeline_split or account_for_loss_in_pipeline_split) must be divisible by"
                       f"virtual_pipeline_model_parallel_size{v}")
        else:  # the model build (transformer_block.get_num_layers_to_build)
            return [RuleViolation("pipeline_split_build",
                                  f"num_layers_per_pipeline_rank {per_rank}             should be divisible by vp_size {v}",
                                  f"each rank's {per_rank} layers must be a multiple of VPP {v} (Megatron refuses it "
                                  "when it builds the model)")]
        return [RuleViolation("pipeline_split_vpp", message, f"each rank's {per_rank} layers must be a multiple of VPP {v}")]
    return []


def _split_hint(num_layers: int, accounted: int, pp: int) -> str:
    return (f"--num-layers {num_layers}{f' + {accounted} accounted' if accounted else ''} over PP {pp}; "
            "give --pipeline-model-parallel-layout or --decoder-first/last-pipeline-num-layers")


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


_LAYER_TYPE = {"E": "LayerType.embedding", "L": "LayerType.loss", "t": "LayerType.decoder", "m": "LayerType.mtp"}


def layout_violations(stages: Sequence[str], *, pp: int, num_layers: int, mtp_num_layers: int = 0,
                      overlap_p2p_comm: bool = True) -> list[RuleViolation]:
    """--pipeline-model-parallel-layout, expanded into its virtual stages (planner/megatron/layout.py
    `layout_stages`), on PP ranks, in Megatron's order: the stage count is a multiple of PP (VA), the
    VPP it implies needs PP > 1 (PP > 2 with --no-overlap-p2p-communication) (VA), then
    PipelineParallelLayerLayout.validate_layer_layout: E and L are the first and last symbols of the
    flattened layout and appear once each (markers only: Megatron builds the embedding on rank 0's
    first chunk and the loss on the last rank's last chunk wherever they are written), the decoder
    and MTP layers are counted, no decoder layer follows an MTP layer, MTP layers sit in one chunk that
    is the last of its rank.  Empty chunks and chunks holding only E or L are fine."""
    if len(stages) % pp:
        return [RuleViolation(
            "layout_stages_pp",
            "The length of pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size "
            f"(num_stages={len(stages)}, args.pipeline_model_parallel_size={pp})",
            f"give a multiple of PP = {pp} stages ('|'-separated)")]
    out = interleave_violations(None, pp=pp, vpp=len(stages) // pp, overlap_p2p_comm=overlap_p2p_comm)
    flat = "".join(stages)
    if not flat or flat[0] != "E":
        got = _LAYER_TYPE[flat[0]] if flat else "nothing"
        return out + [RuleViolation("layout_embedding", f"The first layer must be embedding, but got {got}",
                                    "start the layout with E")]
    if flat[-1] != "L":
        return out + [RuleViolation("layout_loss", f"The last layer must be loss, but got {_LAYER_TYPE[flat[-1]]}",
                                    "end the layout with L")]
    if flat.count("E") != 1:
        return out + [RuleViolation("layout_embedding", "Embedding must be specified exactly once", "write E once")]
    if flat.count("L") != 1:
        return out + [RuleViolation("layout_loss", "Loss must be specified exactly once", "write L once")]
    if flat.count("t") != num_layers:
        return out + [RuleViolation("layout_layers",
                                    f"Number of decoder layers {flat.count('t')}must match num_layers {num_layers}",
                                    f"place --num-layers {num_layers} decoder layers (t)")]
    return out + _layout_mtp_violations(stages, pp, flat, mtp_num_layers)


def _layout_mtp_violations(stages: Sequence[str], pp: int, flat: str, mtp_num_layers: int) -> list[RuleViolation]:
    """validate_layer_layout's MTP checks (layout_violations)."""
    if flat.count("m") != mtp_num_layers:
        return [RuleViolation("layout_mtp", "Number of mtp layers in layout must match mtp_num_layers",
                              f"place --mtp-num-layers {mtp_num_layers} MTP layers (m)")]
    if "m" in flat and "t" in flat[flat.index("m"):]:
        return [RuleViolation("layout_mtp", "decoder layers must be placed before MTP layers",
                              "put every m after the last t")]
    vpp = len(stages) // pp
    if any("m" in stages[c * pp + r] for r in range(pp) for c in range(vpp - 1)):
        return [RuleViolation("layout_mtp", "Currently we restrict that the MTP should be always in the last ",
                              "MTP layers go in the last virtual chunk of a pipeline rank")]
    if any("m" in stages[(vpp - 1) * pp + r] and stages[(vpp - 1) * pp + r].count("m") != mtp_num_layers
           for r in range(pp)):
        return [RuleViolation("layout_mtp", "All of the MTP layers must be in the same one virtual pipeline stage",
                              "put every m in one stage")]
    return []


def pipeline_flag_violations(model: ModelSpec, parallel: ParallelConfig, *, overlap_p2p_comm: bool = True
                             ) -> list[RuleViolation]:
    """How the run's flags place the layers on the pipeline (VA and TC, megatron-core 0.19): at most
    one of --num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank and the
    layout; a layout excludes the first/last-stage and account-for flags and follows
    `layout_violations`; otherwise the split of `pipeline_split_violations`."""
    p = parallel
    ways = (("num_layers_per_virtual_pipeline_stage", p.num_layers_per_virtual_stage),
            ("num_virtual_stages_per_pipeline_rank", p.vpp),
            ("pipeline_model_parallel_layout", "|".join(p.layout) if p.layout is not None else None))
    if sum(value is not None for _, value in ways) > 1:
        return [RuleViolation(
            "vpp_flags",
            "No more than one of the following arguments can be set at the same time: "
            "--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank,"
            "--pipeline-model-parallel-layout. " + ", ".join(f"args.{name}={value!r}" for name, value in ways) + ".",
            "give the virtual pipeline one way")]
    first, last = p.first_stage_layers, p.last_stage_layers
    accounted = p.account_for_embedding_in_pipeline_split or p.account_for_loss_in_pipeline_split
    if p.layout is not None:
        out = layout_violations(p.layout, pp=p.pp, num_layers=model.num_layers, mtp_num_layers=model.mtp_num_layers,
                                overlap_p2p_comm=overlap_p2p_comm)
        if first is not None or last is not None or accounted:
            out.insert(0, RuleViolation(
                "pipeline_split",
                "pipeline_model_parallel_layout cannot be set with other pipeline layout arguments. "
                f"self.num_layers_in_first_pipeline_stage={first}, self.num_layers_in_last_pipeline_stage={last}, "
                f"self.account_for_embedding_in_pipeline_split={p.account_for_embedding_in_pipeline_split}, "
                f"self.account_for_loss_in_pipeline_split={p.account_for_loss_in_pipeline_split}.",
                "drop --decoder-first/last-pipeline-num-layers and the --account-for-* flags"))
        return out
    if p.num_layers_per_virtual_stage is not None:
        out = _layers_per_virtual_stage_violations(model, p)
        if out:
            return out
    vpp = p.virtual_size(model.num_layers)
    return (interleave_violations(None, pp=p.pp, vpp=vpp, overlap_p2p_comm=overlap_p2p_comm)
            + pipeline_split_violations(model.num_layers, p.pp, vpp, first=first, last=last,
                                        account_for_embedding=p.account_for_embedding_in_pipeline_split,
                                        account_for_loss=p.account_for_loss_in_pipeline_split,
                                        vpp_given=p.vpp is not None or p.num_layers_per_virtual_stage is not None))


def _layers_per_virtual_stage_violations(model: ModelSpec, p: ParallelConfig) -> list[RuleViolation]:
    """VA's --num-layers-per-virtual-pipeline-stage route."""
    if p.first_stage_layers is not None or p.last_stage_layers is not None:
        return [RuleViolation(
            "pipeline_split",
            "please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline parallel degree when "
            "enable uneven pipeline parallelism", "give --num-virtual-stages-per-pipeline-rank instead")]
    total = p.accounted_layers(model.num_layers)
    if total % p.pp:
        return [RuleViolation("pipeline_split",
                              "number of layers of the model must be divisible pipeline model parallel size",
                              f"{total} layers over PP {p.pp}")]
    if (total // p.pp) % p.num_layers_per_virtual_stage:
        return [RuleViolation(
            "pipeline_split_vpp",
            "number of layers per pipeline stage must be divisible number of layers per virtual pipeline stage",
            f"{total // p.pp} layers per stage, {p.num_layers_per_virtual_stage} per virtual stage")]
    return []


# -- Megatron's rules on the model and on the run's other flags (megatron-core 0.19.2) --------
def model_violations(model: ModelSpec) -> list[RuleViolation]:
    """What validate_args and TransformerConfig refuse in the model alone, whatever the plan: top-1
    routing needs --moe-router-pre-softmax (with softmax scores, TC), MLA excludes group-query
    attention (VA), MTP needs RoPE or no position embedding (VA), group-limited routing (TC), capacity
    and padding (TC), expert bias needs sigmoid scores (TC), --moe-ffn-hidden-size needs experts (TC)."""
    out: list[RuleViolation] = []
    if model.mtp_num_layers and model.position_embedding_type not in ("rope", "none"):
        out.append(RuleViolation(
            "mtp_position_embedding",
            f"Multi-Token Prediction (MTP) is not supported with {model.position_embedding_type} position embedding "
            "type.The supported position embedding types are rope and none.",
            "add --position-embedding-type rope"))
    if model.multi_latent_attention and model.num_query_groups is not None:
        out.append(RuleViolation("mla_gqa", "Group query attention is mutually exclusive with multi latent attention.",
                                 "drop --group-query-attention"))
    if not model.is_moe:
        if model.moe_ffn_hidden_size is not None:
            out.append(RuleViolation(
                "moe_ffn_without_experts",
                "moe_ffn_hidden_size is set but num_moe_experts is None. Please set num_moe_experts or remove "
                "moe_ffn_hidden_size.", "drop --moe-ffn-hidden-size, or give --num-experts"))
        return out + _topk_one_violations(model)
    return out + _moe_model_violations(model) + _topk_one_violations(model) + _router_group_violations(model)


def _moe_model_violations(model: ModelSpec) -> list[RuleViolation]:
    """TC's MoE checks in its order: capacity factor and balancing, padding, expert bias."""
    out: list[RuleViolation] = []
    balancing = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")
    if model.moe_expert_capacity_factor is not None and model.moe_router_load_balancing_type not in balancing:
        out.append(RuleViolation(
            "moe_capacity",
            "moe_expert_capacity_factor only works with aux_loss, seq_aux_loss, global_aux_loss or none load balancing",
            "drop --moe-expert-capacity-factor, or choose one of those --moe-router-load-balancing-type"))
    if model.moe_pad_expert_input_to_capacity and model.moe_expert_capacity_factor is None:
        out.append(RuleViolation("moe_capacity",
                                 "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity",
                                 "add --moe-expert-capacity-factor"))
    if model.moe_router_enable_expert_bias and model.moe_router_score_function not in ("sigmoid", "sqrtsoftplus"):
        out.append(RuleViolation(
            "moe_expert_bias",
            "Expert bias for aux-loss-free routing only supports 'sigmoid' and 'sqrtsoftplus' score functions. "
            "Please set --moe-router-score-function to 'sigmoid' or 'sqrtsoftplus', or unset "
            "--moe-router-enable-expert-bias.", "add --moe-router-score-function sigmoid"))
    return out


def _topk_one_violations(model: ModelSpec) -> list[RuleViolation]:
    if (model.moe_router_topk == 1 and model.moe_router_score_function == "softmax" and not model.moe_router_pre_softmax
            and model.moe_router_load_balancing_type != "sinkhorn"):
        return [RuleViolation("moe_topk_one", "Please use --moe-router-pre-softmax when topk is 1.",
                              "add --moe-router-pre-softmax")]
    return []


def _router_group_violations(model: ModelSpec) -> list[RuleViolation]:
    """Group-limited routing (--moe-router-group-topk with --moe-router-num-groups), TC."""
    k, groups = model.moe_router_group_topk, model.moe_router_num_groups
    if not k:
        return []
    if not groups:
        return [RuleViolation("moe_router_groups",
                              "When using group limited routing, moe_router_num_groups must be specified.",
                              "add --moe-router-num-groups")]
    if model.num_experts % groups:
        return [RuleViolation(
            "moe_router_groups",
            f"num_moe_experts ({model.num_experts}) should be divisible by moe_router_num_groups ({groups}).",
            f"choose --moe-router-num-groups dividing {model.num_experts}")]
    if k > groups:
        return [RuleViolation(
            "moe_router_groups",
            f"moe_router_group_topk ({k}) should be smaller than moe_router_num_groups ({groups}).",
            "lower --moe-router-group-topk")]
    return []


def settings_violations(model: ModelSpec, training: TrainingSpec) -> list[RuleViolation]:
    """What Megatron refuses in the run's other flags, whatever the plan: hierarchical CP for a2a+p2p
    (VA), the parameter-gather overlaps (VA), FP8 parameters (VA, TC), the expert-parallel overlap's own
    needs (TC), delayed weight gradients (VA, TC), Megatron-FSDP's checkpoint format (VA), DeepEP's
    dispatcher (TC), shared-expert overlap (TC), the balancing coefficients (TC), CUDA-graph spellings."""
    st = training.megatron
    out: list[RuleViolation] = []
    if "a2a+p2p" in st.cp_comm_types and st.hierarchical_context_parallel_sizes is None:
        out.append(RuleViolation("cp_comm_type",
                                 "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm",
                                 "add --hierarchical-context-parallel-sizes (their product is CP)"))
    out += _overlap_flag_violations(training)
    if training.fp8_param_gather and not (training.use_distributed_optimizer or st.use_torch_fsdp2
                                          or training.use_megatron_fsdp):
        out.append(RuleViolation(
            "fp8_param_gather",
            "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp, or inference "
            "mode", "add --use-distributed-optimizer"))
    if training.use_megatron_fsdp and st.ckpt_format != "fsdp_dtensor":
        out.append(RuleViolation("megatron_fsdp", "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format.",
                                 "add --ckpt-format fsdp_dtensor"))
    if st.ckpt_format == "fsdp_dtensor" and not training.use_megatron_fsdp:
        out.append(RuleViolation("megatron_fsdp", "--ckpt-format fsdp_dtensor is only tested with Megatron FSDP.",
                                 "add --use-megatron-fsdp, or another --ckpt-format"))
    if training.delay_wgrad_compute and st.transformer_impl != "transformer_engine":
        out.append(RuleViolation("delay_wgrad_compute",
                                 "Delaying wgrad compute is only supported with transformer_engine implementation",
                                 "use --transformer-impl transformer_engine"))
    if training.main_grads_dtype != "fp32" and not training.use_precision_aware_optimizer:
        # megatron/core/optimizer/optimizer_config.py (@d98e8a64) OptimizerConfig.__post_init__, when the optimizer is
        # built (validate_args lets it pass): the launch stops there
        out.append(RuleViolation("main_grads_dtype",
                                 "main_grads_dtype can only be fp32 when not using precision-aware optimizer",
                                 "add --use-precision-aware-optimizer, or drop --main-grads-dtype"))
    if training.fp8_param_gather and training.precision != "fp8":
        out.append(RuleViolation("fp8_param_gather", "fp8_param must be used together with fp8 mode.",
                                 "add --fp8-format, or drop --fp8-param-gather"))
    return out + _moe_settings_violations(model, training)


def _overlap_flag_violations(training: TrainingSpec) -> list[RuleViolation]:
    """--overlap-param-gather and --overlap-param-gather-with-optimizer-step's needs besides VPP (VA)."""
    st = training.megatron
    out: list[RuleViolation] = []
    if training.overlap_param_gather and not (training.use_distributed_optimizer or training.use_megatron_fsdp):
        out.append(RuleViolation(
            "overlap_param_gather",
            "--overlap-param-gather only supported with distributed optimizer, megatron fsdp, or dist_muon",
            "add --use-distributed-optimizer"))
    if training.overlap_param_gather and not training.overlap_grad_reduce:
        out.append(RuleViolation("overlap_param_gather", "Must use --overlap-param-gather with --overlap-grad-reduce",
                                 "add --overlap-grad-reduce"))
    if st.overlap_param_gather_with_optimizer_step:
        if not training.use_distributed_optimizer:
            out.append(RuleViolation(
                "overlap_param_gather_step",
                "--overlap-param-gather-with-optimizer-step only supported with distributed optimizer",
                "add --use-distributed-optimizer"))
        elif not training.overlap_param_gather:
            out.append(RuleViolation(
                "overlap_param_gather_step",
                "Must use --overlap-param-gather-with-optimizer-step with --overlap-param-gather",
                "add --overlap-param-gather"))
        elif st.ckpt_format != "torch":
            out.append(RuleViolation(
                "overlap_param_gather_step",
                "--overlap-param-gather-with-optimizer-step not supported with distributed checkpointing yet",
                "add --ckpt-format torch"))
    if cuda_graph_impl(training) == "full_iteration" and st.check_for_nan_in_loss_and_grad:
        out.append(RuleViolation(
            "cuda_graph", "--no-check-for-nan-in-loss-and-grad should be set with --cuda-graph-impl=full_iteration for "
            "training.", "add --no-check-for-nan-in-loss-and-grad"))
    return out


def _moe_settings_violations(model: ModelSpec, training: TrainingSpec) -> list[RuleViolation]:
    """The MoE flags' checks of TransformerConfig that do not depend on the plan."""
    st = training.megatron
    out: list[RuleViolation] = []
    if st.moe_enable_deepep and model.moe_token_dispatcher_type != "flex":
        out.append(RuleViolation("moe_dispatcher", "DeepEP backend is only supported with flex token dispatcher.",
                                 "add --moe-token-dispatcher-type flex"))
    if (model.moe_token_dispatcher_type == "flex" and model.moe_pad_expert_input_to_capacity
            and (st.moe_enable_deepep or model.moe_flex_dispatcher_backend == "deepep")):
        out.append(RuleViolation(
            "moe_dispatcher", "Flex token dispatcher with deepep backend does not support moe_pad_expert_input_to_capacity",
            "drop --moe-pad-expert-input-to-capacity, or use another dispatcher"))
    if (model.moe_shared_expert_intermediate_size is not None and training.moe_shared_expert_overlap
            and model.moe_token_dispatcher_type not in ("alltoall", "flex")):
        out.append(RuleViolation("moe_shared_expert_overlap",
                                 "moe_shared_expert_overlap only works with alltoall or flex token dispatcher.",
                                 "use --moe-token-dispatcher-type alltoall"))
    if st.moe_router_load_balancing_types and len(st.moe_aux_loss_coeffs) != len(st.moe_router_load_balancing_types):
        out.append(RuleViolation(
            "moe_aux_loss_coeff",
            "moe_aux_loss_coeff must be a list of the same length as moe_router_load_balancing_type",
            "give one --moe-aux-loss-coeff per balancing type"))
    if training.overlap_moe_expert_parallel_comm:
        out += _ep_overlap_flag_violations(model, training)
    elif training.delay_wgrad_compute:
        out.append(RuleViolation(
            "delay_wgrad_compute",
            "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute",
            "add --overlap-moe-expert-parallel-comm"))
    return out


def _ep_overlap_flag_violations(model: ModelSpec, training: TrainingSpec) -> list[RuleViolation]:
    """--overlap-moe-expert-parallel-comm's needs that do not depend on the plan (TC, in its order)."""
    out: list[RuleViolation] = []
    if model.moe_token_dispatcher_type not in ("alltoall", "flex"):
        out.append(RuleViolation("ep_overlap",
                                 "overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher",
                                 "use --moe-token-dispatcher-type alltoall or flex"))
    if training.precision == "fp32":
        out.append(RuleViolation("ep_overlap",
                                 "overlap_moe_expert_parallel_comm is only supported with bf16 or fp16 model",
                                 "add --bf16"))
    if training.moe_shared_expert_overlap:
        out.append(RuleViolation("ep_overlap",
                                 "disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm",
                                 "drop --moe-shared-expert-overlap"))
    if model.mtp_num_layers > 1:
        out.append(RuleViolation("ep_overlap",
                                 "MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm.",
                                 "use --mtp-num-layers 1"))
    return out


# -- Megatron's refusals of switches the planner passes through ---------------------------------------
Need = tuple[str, bool, str, str]
"""A switch, whether what it needs is there, Megatron's message, what helps."""


def passthrough_violations(model: ModelSpec, training: TrainingSpec, passthrough: Sequence[str]) -> list[RuleViolation]:
    """What validate_args (VA) and TransformerConfig (TC) refuse in switches the planner passes through unread, against
    what each needs (megatron-core 0.19.2; tests/test_megatron_validator.py runs Megatron on every one, refused without
    its need and accepted with it).  Each rule is named after its switch."""
    present = {tok.partition("=")[0] for tok in passthrough if tok.startswith("--")}
    out = [RuleViolation(flag, message, hint)
           for flag, ok, message, hint in _kernel_switch_needs(model, training, present)
           + _run_switch_needs(model, training, present, passthrough) if flag in present and not ok]
    if model.squared_relu and model.add_bias_linear and "--no-bias-gelu-fusion" not in present:  # TC, a read flag
        out.append(RuleViolation("--squared-relu", "When bias_activation_fusion is True, activation function should be "
                                 "either gelu, swiglu, or quick_geglu",
                                 "add --disable-bias-linear or --no-bias-gelu-fusion"))
    return out


def _kernel_switch_needs(model: ModelSpec, training: TrainingSpec, present: set[str]) -> list[Need]:
    """Kernel, precision and layer switches: positions, activation fusions, FP8/FP4, norms, MLA, grouped weights."""
    fusion_off = "--no-bias-swiglu-fusion" if model.swiglu else "--no-bias-gelu-fusion"
    recipe = training.fp8_recipe if training.precision == "fp8" else None
    quantised = training.precision == "fp8" or "--fp4-format" in present
    padding = ("--moe-router-padding-for-fp8", "--moe-router-padding-for-quantization")
    return [
        ("--no-position-embedding", model.position_embedding_type == "rope",  # VA
         "--no-position-embedding is deprecated, use --position-embedding-type",
         "use it with --position-embedding-type rope only"),
        ("--use-te-activation-func", not model.add_bias_linear or fusion_off in present,  # TC
         "bias_activation_fusion and use_te_activation_func cannot be both true.",
         f"add --disable-bias-linear or {fusion_off}"),
        ("--fp8-output-proj", recipe == "mxfp8",  # TC
         "fp8_output_proj must be used together with fp8 mode." if recipe is None else
         f"fp8_output_proj requires fp8_recipe='mxfp8', got '{recipe}'.", "use it with --fp8-recipe mxfp8"),
        *((flag, quantised, "fp8/fp4 must be specified when moe_router_padding_for_quantization is True.",  # TC
           "use it with --fp8-format or --fp4-format") for flag in padding),
        *((flag, not quantised or model.moe_token_dispatcher_type in ("alltoall", "flex"),  # TC
           "allgather and alltoall_seq dispatcher does not support moe_router_padding_for_quantization.",
           "use --moe-token-dispatcher-type alltoall or flex") for flag in padding),
        ("--fp16-lm-cross-entropy", training.precision == "fp16",  # VA
         "lm cross entropy in fp16 only support in fp16 mode.", "drop it, or train in --fp16"),
        ("--fp4-param-gather", "--fp4-format" in present,  # VA
         "--fp4-param-gather must be used together with --fp4-format.", "add --fp4-format"),
        ("--fused-residual-rmsnorm", model.normalization == "RMSNorm",  # TC
         "fused_residual_rmsnorm is only supported when normalization is RMSNorm.", "drop it, or use RMSNorm"),
        ("--mla-down-proj-fusion", model.multi_latent_attention,  # VA
         "--mla-down-proj-fusion requires --multi-latent-attention", "drop it"),
        *((flag, model.moe_grouped_gemm,  # TC
           "moe_single_grouped_weight and moe_single_grouped_bias require moe_grouped_gemm=True.",
           "add --moe-grouped-gemm") for flag in ("--moe-single-grouped-weight", "--moe-single-grouped-bias")),
        ("--moe-single-grouped-bias", model.add_bias_linear,  # TC
         "moe_single_grouped_bias requires add_bias_linear=True.", "drop --disable-bias-linear, or this flag"),
        ("--moe-single-grouped-weight", not model.moe_grouped_gemm or "--use-transformer-engine-op-fuser" in present,
         "moe_single_grouped_weight requires use_transformer_engine_op_fuser=True.",  # TC
         "add --use-transformer-engine-op-fuser"),
    ]


def _run_switch_needs(model: ModelSpec, training: TrainingSpec, present: set[str], passthrough: Sequence[str]
                      ) -> list[Need]:
    """Overlap, optimizer, checkpoint, MoE capacity, FSDP2, attention-mode and data switches."""
    fa_version = flag_value(passthrough, "--flash-attention-version")
    fsdp2 = "--use-torch-fsdp2"
    return [
        ("--ep-overlap-early-attn-memory-release", training.overlap_moe_expert_parallel_comm,  # TC
         "overlap_moe_expert_parallel_comm must be enabled when enabling ep_overlap_early_attn_memory_release",
         "add --overlap-moe-expert-parallel-comm"),
        ("--optimizer-cpu-offload", training.use_precision_aware_optimizer,  # VA
         "The optimizer cpu offload must be used in conjunction with `--use-precision-aware-optimizer`, as the hybrid "
         "device optimizer reuses the code path of this flag.", "add --use-precision-aware-optimizer"),
        ("--hybrid-context-parallel", "--calculate-per-token-loss" in present,  # VA
         "Hybrid context parallelism must be used with --calculate-per-token-loss", "add --calculate-per-token-loss"),
        ("--load-main-params-from-ckpt", "--no-load-optim" in present,  # VA
         "--load-main-params-from-ckpt must be used with --no-load-optim.", "add --no-load-optim"),
        ("--moe-paged-stash", "--moe-expert-rank-capacity-factor" in present,  # TC
         "moe_paged_stash requires moe_expert_rank_capacity_factor to be set; there is no need to use paged stashing "
         "without it.", "add --moe-expert-rank-capacity-factor"),
        ("--moe-expert-rank-capacity-factor", model.moe_token_dispatcher_type == "flex"
         and model.moe_flex_dispatcher_backend in ("hybridep", "ncclep"),  # TC
         "moe_expert_rank_capacity_factor requires moe_flex_dispatcher_backend to be 'hybridep' or 'ncclep'.",
         "use --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep"),
        ("--moe-expert-rank-capacity-factor", model.moe_flex_dispatcher_backend != "hybridep"
         or "--use-transformer-engine-op-fuser" in present,  # TC
         "moe_expert_rank_capacity_factor with the 'hybridep' backend requires use_transformer_engine_op_fuser to be "
         "enabled.", "add --use-transformer-engine-op-fuser"),
        (fsdp2, "--no-gradient-accumulation-fusion" in present,  # VA
         "--use-torch-fsdp2 is not supported with gradient accumulation fusion",
         "add --no-gradient-accumulation-fusion"),
        (fsdp2, model.untie_embeddings_and_output_weights,  # VA
         "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights",
         "add --untie-embeddings-and-output-weights"),
        (fsdp2, not training.use_distributed_optimizer,  # VA
         "--use-torch-fsdp2 is not supported with MCore's distributed optimizer", "drop --use-distributed-optimizer"),
        (fsdp2, training.megatron.ckpt_format in ("torch_dist", "torch_dcp"),  # VA
         "--use-torch-fsdp2 requires --ckpt-format torch_dist or torch_dcp", "use --ckpt-format torch_dist"),
        (fsdp2, training.precision != "fp16", "--use-torch-fsdp2 not supported with fp16 yet", "train in --bf16"),  # VA
        ("--batch-invariant-mode", training.attention_backend == "flash",  # TC
         "Batch invariant mode only supports FlashAttention (--attention-backend flash)",
         "add --attention-backend flash"),
        ("--batch-invariant-mode", training.attention_backend != "flash" or fa_version in ("3", "4"),  # TC
         "Batch invariant mode requires --flash-attention-version 3 or 4 so the training and inference attention paths "
         f"run the same batch-invariant FlashAttention kernel (got {fa_version}).", "add --flash-attention-version 3"),
        ("--fsdp-manual-registration", training.use_megatron_fsdp,  # VA
         "FSDP manual registration is only supported with Megatron FSDP.", "add --use-megatron-fsdp"),
        ("--replication", "--replication-jump" in present,  # VA
         "--replication requires the value of --replication-jump!", "add --replication-jump"),
        ("--fim-data", "--mock-data" not in present,  # VA
         "Mock dataset is not supported with FIM dataset.", "drop --mock-data or --fim-data"),
    ]


def input_violations(model: ModelSpec, training: TrainingSpec | None) -> list[RuleViolation]:
    """Megatron's refusals that no plan can lift: the model's and the run's other flags'."""
    return model_violations(model) + (settings_violations(model, training) if training is not None else [])


# -- Megatron's rules on the run's flags together with the plan's degrees ------------------------
def recompute_violations(model: ModelSpec, training: TrainingSpec | None, recompute: Recompute
                         ) -> list[RuleViolation]:
    """The plan's recompute setting against the model and the flags (TC): moe_act needs grouped GEMM,
    mla_up_proj needs MLA, shared_experts recompute excludes --moe-shared-expert-overlap, FP8 with
    delayed scaling (Megatron's default recipe) excludes moe_act and layernorm recompute, the
    expert-parallel overlap excludes full recompute and `moe`, CUDA graphs limit recompute, MTP with
    full uniform recompute recomputes one layer at a time (MTP block, first step)."""
    out: list[RuleViolation] = []
    modules = recompute.modules if recompute.granularity == "selective" else ()
    if "moe_act" in modules and not model.moe_grouped_gemm:
        out.append(RuleViolation("recompute_modules", "moe_act in recompute_modules is only supported with moe_grouped_gemm.",
                                 "drop moe_act from --recompute-modules, or add --moe-grouped-gemm"))
    if "mla_up_proj" in modules and not model.multi_latent_attention:
        out.append(RuleViolation("recompute_modules",
                                 "mla_up_proj in recompute_modules is only supported with multi_latent_attention.",
                                 "drop mla_up_proj from --recompute-modules"))
    if training is None:
        return out
    if ("shared_experts" in modules and model.moe_shared_expert_intermediate_size is not None
            and training.moe_shared_expert_overlap):
        out.append(RuleViolation("recompute_modules",
                                 "shared_experts recompute cannot work with --moe-shared-expert-overlap.",
                                 "drop shared_experts from --recompute-modules"))
    if training.precision == "fp8" and training.fp8_recipe == "delayed" and ({"moe_act", "layernorm"} & set(modules)):
        out.append(RuleViolation(
            "fp8_delayed_recompute", "Delayed scaling does not support moe_act and layernorm recompute for fp8.",
            "drop moe_act and layernorm from --recompute-modules, or use another --fp8-recipe"))
    if training.overlap_moe_expert_parallel_comm and recompute.granularity == "full":
        out.append(RuleViolation("ep_overlap",
                                 "disable full recomputation when enabling overlap_moe_expert_parallel_comm",
                                 "use selective or no recompute with --overlap-moe-expert-parallel-comm"))
    if training.overlap_moe_expert_parallel_comm and "moe" in modules:
        out.append(RuleViolation("ep_overlap",
                                 "disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm",
                                 "drop moe from --recompute-modules"))
    if (model.mtp_num_layers and recompute.granularity == "full" and recompute.method == "uniform"
            and recompute.num_layers != 1):
        out.append(RuleViolation("mtp_recompute", "recompute_num_layers must be 1 for MTP recompute",
                                 "use --recompute-num-layers 1 (Megatron raises this at the first step)"))
    return out + _graph_recompute_violations(model, training, recompute) + _offload_recompute_violations(
        training, recompute)


def _graph_recompute_violations(model: ModelSpec, training: TrainingSpec, recompute: Recompute
                                ) -> list[RuleViolation]:
    """CUDA graphs against the recompute setting (TC): full recompute only under a full-iteration graph;
    graphed modules recomputed must not draw random numbers (dropout, input jitter)."""
    st, impl = training.megatron, cuda_graph_impl(training)
    if impl == "none" or recompute.granularity == "none":
        return []
    if recompute.granularity == "full":
        if impl != "full_iteration":
            return [RuleViolation("cuda_graph_recompute", "full recompute is only supported with full iteration CUDA graph.",
                                  "use selective recompute, or --cuda-graph-impl full_iteration")]
        return []
    graphed = tuple(m for m in training.cuda_graph_scope if m != "full")  # "full": the whole layer, as none given
    full = impl == "full_iteration" or not graphed
    out: list[RuleViolation] = []
    if impl == "transformer_engine" and "moe" in recompute.modules and "moe_router" in graphed:
        out.append(RuleViolation("cuda_graph_recompute", "moe recompute is not supported with moe_router CUDA graph with: ",
                                 "drop moe from --recompute-modules"))

    def outside(module: str, graph: str) -> bool:
        return (not full and graph not in graphed) or module not in recompute.modules

    if training.attention_dropout != 0.0 and not outside("core_attn", "attn"):
        out.append(RuleViolation("cuda_graph_recompute", "attention dropout is not supported with graphed attention "
                                 "recomputation.", "add --attention-dropout 0, or drop core_attn recompute"))
    if training.hidden_dropout != 0.0 and not (outside("mlp", "mlp") and outside("moe", "moe")):
        out.append(RuleViolation("cuda_graph_recompute", "hidden dropout is not supported with graphed MLP/MoE "
                                 "recomputation.", "add --hidden-dropout 0, or drop mlp/moe recompute"))
    if st.moe_input_jitter_eps is not None and not outside("moe", "moe"):
        out.append(RuleViolation("cuda_graph_recompute",
                                 "moe_input_jitter_eps is not supported with graphed moe recomputation.",
                                 "drop moe from --recompute-modules"))
    return out


def cuda_graph_impl(training: TrainingSpec) -> str:
    """The CUDA-graph implementation as TransformerConfig sets it: --cuda-graph-impl, else local for
    --enable-cuda-graph and transformer_engine for --external-cuda-graph."""
    st = training.megatron
    if training.cuda_graph_impl != "none":
        return training.cuda_graph_impl
    return "local" if st.enable_cuda_graph else "transformer_engine" if st.external_cuda_graph else "none"


def _offload_recompute_violations(training: TrainingSpec, recompute: Recompute) -> list[RuleViolation]:
    st = training.megatron
    out: list[RuleViolation] = []
    if st.cpu_offloading and recompute.granularity != "none":
        out.append(RuleViolation("cpu_offloading", "CPU offloading does not work when activation recomputation is enabled",
                                 "drop --cpu-offloading, or recompute"))
    if st.distribute_saved_activations:
        if recompute.granularity != "full":
            out.append(RuleViolation(
                "distribute_saved_activations",
                "distributed recompute activations is only application to full recompute granularity",
                "drop --distribute-saved-activations"))
    return out


def degree_flag_violations(model: ModelSpec, training: TrainingSpec | None, *, tp: int, cp: int, ep: int, etp: int,
                           dp: int | None, pp: int, vpp: int, sequence_parallel: bool | None = None
                           ) -> list[RuleViolation]:
    """The plan's degrees against the run's flags: the expert-parallel overlap needs VPP with PP > 1 and
    EP > 1 (TC); hierarchical CP sizes multiply to CP (VA) and a per-layer --cp-comm-type has one entry
    per layer with CP > 1 (TC); the DeepEP dispatcher needs TP x EP > 1 (model build); the parameter
    gather overlapped with the optimizer step needs VPP (VA); --num-distributed-optimizer-instances
    divides DP x CP and the expert DP (process groups); CPU offloading and FSDP2 take no PP, FSDP2 no EP;
    --tp-comm-overlap needs sequence parallelism, so TP > 1 (VA); distributed saved activations need TP > 1
    without sequence parallelism (VA, TC).  `dp` None: per-stage
    DPs (FlagScale), whose rules the stages' own check covers."""
    if training is None:
        return []
    st = training.megatron
    out: list[RuleViolation] = []
    if training.overlap_moe_expert_parallel_comm:
        if pp > 1 and vpp <= 1:
            out.append(RuleViolation(
                "ep_overlap", "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified when "
                "pipeline_model_parallel_size > 1", "use VPP > 1 with PP > 1 (a layout or "
                "--num-virtual-stages-per-pipeline-rank)"))
        if ep <= 1:
            out.append(RuleViolation("ep_overlap",
                                     "overlap_moe_expert_parallel_comm is only supported with expert model parallelism",
                                     "use EP > 1"))
    sizes = st.hierarchical_context_parallel_sizes
    if sizes and math.prod(sizes) != cp:
        out.append(RuleViolation(  # a bare assert of validate_args: Megatron prints no message, only its line
            "cp_comm_type", "assert args.context_parallel_size == prod(args.hierarchical_context_parallel_sizes)",
            f"the product of --hierarchical-context-parallel-sizes {list(sizes)} must be CP = {cp}"))
    if cp > 1 and len(st.cp_comm_types) > 1 and len(st.cp_comm_types) != model.num_layers:
        out.append(RuleViolation(
            "cp_comm_type", f"Length of cp_comm_type ({len(st.cp_comm_types)}) should equal to the total number of "
            f"transformer layers ({model.num_layers})!", "give one --cp-comm-type, or one per layer"))
    if (model.is_moe and model.moe_token_dispatcher_type == "flex" and model.moe_flex_dispatcher_backend == "deepep"
            and tp * ep <= 1):
        out.append(RuleViolation("flex_tp_ep", "DeepEP dispatcher requires TPxEP > 1",
                                 "use TP x EP > 1 (Megatron raises this when it builds the model)"))
    if st.overlap_param_gather_with_optimizer_step and vpp <= 1:
        out.append(RuleViolation(
            "overlap_param_gather_step",
            "--overlap-param-gather-with-optimizer-step only supported with interleaved pipeline parallelism",
            "use VPP > 1, or drop --overlap-param-gather-with-optimizer-step"))
    if st.overlap_p2p_comm_warmup_flush and (vpp <= 1 or not st.overlap_p2p_comm):
        # megatron/core/model_parallel_config.py (@d98e8a64) __post_init__: p2p overlap is the interleaved schedule's
        out.append(RuleViolation(
            "p2p_warmup_flush", "Pipeline parallel communication overlapping in warmup and flush is only compatible "
            "with overlap_p2p_comm but not batch_p2p_comm.", "use VPP > 1 (with p2p overlap on), or drop the flag"))
    return out + _group_flag_violations(model, training, tp=tp, cp=cp, ep=ep, etp=etp, dp=dp, pp=pp,
                                        sequence_parallel=tp > 1 if sequence_parallel is None else sequence_parallel)


def _group_flag_violations(model: ModelSpec, training: TrainingSpec, *, tp: int, cp: int, ep: int, etp: int,
                           dp: int | None, pp: int, sequence_parallel: bool) -> list[RuleViolation]:
    st = training.megatron
    out: list[RuleViolation] = []
    k = st.num_distributed_optimizer_instances if dp is not None else 1
    if k > 1 and (dp * cp) % k:
        out.append(RuleViolation("dist_opt_instances", "Data parallel size should be divisible by partial DistOpt shard factor",
                                 f"--num-distributed-optimizer-instances {k} must divide DP x CP = {dp * cp}"))
    edp = tp * cp * dp // (etp * ep) if model.is_moe and dp is not None and (tp * cp * dp) % (etp * ep) == 0 else None
    if k > 1 and edp is not None and edp % k:
        out.append(RuleViolation(
            "dist_opt_instances", "Expert data parallel size should be divisible by partial DistOpt shard factor",
            f"--num-distributed-optimizer-instances {k} must divide the expert DP {edp}"))
    if st.cpu_offloading and pp > 1:
        out.append(RuleViolation("cpu_offloading", "Currently there is no support for Pipeline parallelism with CPU "
                                 "offloading", "use PP 1 with --cpu-offloading"))
    if st.use_torch_fsdp2 and pp != 1:
        out.append(RuleViolation("torch_fsdp2", "--use-torch-fsdp2 is not supported with pipeline parallelism",
                                 "use PP 1 with --use-torch-fsdp2"))
    if st.use_torch_fsdp2 and ep != 1:
        out.append(RuleViolation("torch_fsdp2", "--use-torch-fsdp2 is not supported with expert parallelism",
                                 "use EP 1 with --use-torch-fsdp2"))
    if training.tp_comm_overlap and (tp <= 1 or sequence_parallel is False):
        out.append(RuleViolation(
            "tp_comm_overlap_sp",
            "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled",
            "--tp-comm-overlap requires --sequence-parallel (and TP > 1)"))
    if st.defer_embedding_wgrad_compute and pp <= 1:
        # megatron/core/model_parallel_config.py (@d98e8a64) __post_init__
        out.append(RuleViolation("defer_embedding_wgrad",
                                 "Cannot defer embedding wgrad compute when pipeline model parallel is not used",
                                 "use PP > 1, or drop --defer-embedding-wgrad-compute"))
    if st.distribute_saved_activations and tp <= 1:
        out.append(RuleViolation("distribute_saved_activations",
                                 "can distribute recomputed activations only across tensor model parallel groups",
                                 "use TP > 1, or drop --distribute-saved-activations"))
    elif st.distribute_saved_activations and sequence_parallel:
        out.append(RuleViolation(
            "distribute_saved_activations",
            "distribute_saved_activations: True must be false when sequence parallel is enabled: True",
            "drop --distribute-saved-activations, or --sequence-parallel"))
    return out


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


def flagscale_model_violations(model: ModelSpec) -> list[RuleViolation]:
    """FlagScale 0.8.0's Megatron fork (megatron-core 0.15) takes no linear biases in an MoE model: its
    TransformerConfig asserts `not add_bias_linear` whenever there are experts
    (flag_scale/third_party/Megatron-LM/megatron/core/transformer/transformer_config.py); upstream Megatron takes
    them at ETP 1 (moe_etp_bias).  gpt-oss has biases.  Found by FlagScale's own validator on a plan of gpt-oss."""
    if model.is_moe and model.add_bias_linear:
        return [RuleViolation(
            "flagscale_moe_bias", "Bias is not supported for MoE",
            "FlagScale's Megatron fork refuses linear biases in an MoE model: use --runtime megatron (upstream "
            "Megatron takes them at ETP 1), or --disable-bias-linear if the model has none",
        )]
    return []


def runtime_model_refusal(runtime: str, model: ModelSpec) -> str | None:
    """Why `runtime` cannot run `model` at any degrees (its model-level rules), or None."""
    if not runtime_of(runtime).per_stage_meshes:
        return None
    found = flagscale_model_violations(model)
    return "; ".join(f"{v.message} ({v.rule}: {v.hint})" for v in found) if found else None


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


def sequence_split_ok(model: ModelSpec, tp: int, cp: int) -> bool:
    """seq_tp_sp, with sequence parallelism on whenever TP > 1 (as the search plans it)."""
    return not sequence_split_violations(model, tp, cp, True)


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
def interleave_ok(gbs: int, mbs: int, dp: int, pp: int, vpp: int, overlap_p2p_comm: bool = True) -> bool:
    """vpp_needs_pp, vpp_microbatches (with batch_ok), for M = GBS // (mbs*DP) micro-batches."""
    return not interleave_violations(gbs // (mbs * dp), pp=pp, vpp=vpp, overlap_p2p_comm=overlap_p2p_comm)


def recompute_allowed(model: ModelSpec, training: TrainingSpec | None, recompute: Recompute) -> bool:
    """recompute_modules, fp8_delayed_recompute, ep_overlap (recompute), cuda_graph_recompute,
    mtp_recompute, cpu_offloading, distribute_saved_activations (recompute_violations)."""
    return not recompute_violations(model, training, recompute)


def degree_flags_check(model: ModelSpec, training: TrainingSpec | None):
    """The boolean of degree_flag_violations for a search, as f(tp, cp, ep, etp, dp, pp, vpp) -> bool,
    or None when the run's flags hold none of the rules it stands for (the usual case: nothing to ask)."""
    if training is None:
        return None
    st = training.megatron
    deepep = model.is_moe and model.moe_token_dispatcher_type == "flex" and model.moe_flex_dispatcher_backend == "deepep"
    if not (training.overlap_moe_expert_parallel_comm or st.hierarchical_context_parallel_sizes
            or len(st.cp_comm_types) > 1 or deepep or st.overlap_param_gather_with_optimizer_step
            or st.num_distributed_optimizer_instances > 1 or st.cpu_offloading or st.use_torch_fsdp2
            or st.distribute_saved_activations or st.defer_embedding_wgrad_compute or st.overlap_p2p_comm_warmup_flush
            or training.tp_comm_overlap):
        return None

    @functools.lru_cache(maxsize=1 << 16)
    def ok(tp: int, cp: int, ep: int, etp: int, dp: int | None, pp: int, vpp: int) -> bool:
        return not degree_flag_violations(model, training, tp=tp, cp=cp, ep=ep, etp=etp, dp=dp, pp=pp, vpp=vpp)

    return ok


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
    return (tp_violations(model, plan.tp) + cp_violations(model, plan.cp)
            + sequence_split_violations(model, plan.tp, plan.cp, plan.sequence_parallel))


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


def _batch_rules(plan: Plan, training: TrainingSpec | None) -> list[RuleViolation]:
    overlap = training.megatron.overlap_p2p_comm if training is not None else True
    m = plan.gbs // (plan.mbs * plan.dp0) if plan.gbs % (plan.mbs * plan.dp0) == 0 else None
    return (microbatch_violations(plan.gbs, mbs=plan.mbs, dp=plan.dp0)
            + interleave_violations(m, pp=plan.pp, vpp=plan.vpp, overlap_p2p_comm=overlap))


def _flag_rules(model: ModelSpec, plan: Plan, training: TrainingSpec | None) -> list[RuleViolation]:
    """The run's flags against the plan (degree_flag_violations, recompute_violations), each said once."""
    out = degree_flag_violations(model, training, tp=plan.tp, cp=plan.cp, ep=plan.ep, etp=plan.etp, dp=plan.dp0,
                                 pp=plan.pp, vpp=plan.vpp, sequence_parallel=plan.sequence_parallel)
    for rc in {s.recompute.label: s.recompute for s in plan.stages}.values():
        out += [v for v in recompute_violations(model, training, rc) if v not in out]
    return out


def _layout_rules(model: ModelSpec, plan: Plan) -> list[RuleViolation]:
    placed = sum(s.num_layers for s in plan.stages)
    if placed != model.num_layers:
        return [RuleViolation(
            "layout_layers",
            f"Number of decoder layers {placed}must match num_layers {model.num_layers}",
            "the stages' layer counts must add up to --num-layers",
        )]
    if plan.layout is None:
        return []
    return [v for v in layout_violations(plan.layout, pp=plan.pp, num_layers=model.num_layers,
                                         mtp_num_layers=model.mtp_num_layers) if v.rule != "vpp_needs_pp"]


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
        out += flagscale_model_violations(model) + flagscale_tp_violations(model, plan.tp)
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
    out = input_violations(model, training)
    out += _dense_rules(model, plan)
    out += _moe_rules(model, plan)
    out += _batch_rules(plan, training)
    out += _layout_rules(model, plan)
    out += _flag_rules(model, plan, training)
    return out + runtime_violations(model, plan, training)


def run_violations(run: MegatronRun, plan: Plan) -> list[RuleViolation]:
    """Everything Megatron refuses in a run's own flags and the plan they give: how the flags place the
    layers (pipeline_flag_violations, which a plan's per-stage counts no longer show) and check_plan."""
    out = pipeline_flag_violations(run.model, run.parallel, overlap_p2p_comm=run.training.megatron.overlap_p2p_comm)
    return out + [v for v in check_plan(run.model, plan, run.training) if v not in out]


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


