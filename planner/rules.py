"""The planner's own checks of Megatron-LM's (and FlagScale's) rules on a Plan.

Megatron checks several of these only when it initialises the process groups or at the first
step (reference/megatron.md sections 2 and 8), i.e. after a job has been queued and started;
the planner checks them before it emits a launcher.  Nothing here imports Megatron.  Where
Megatron (or FlagScale) has its own message, `RuleViolation.message` uses that exact text
(typos and missing spaces included, so that it can be matched against a real log).

Rule names (stable, used by tests and reports):
  heads_tp, query_groups_tp, ep_needs_experts, experts_ep, expert_folding, seq_cp,
  moe_tp_sequence_parallel, moe_etp_bias, gbs_microbatch, vpp_needs_pp, vpp_microbatches,
  layout_layers, layout_stage_count, tp_comm_overlap_sp, overlap_param_gather,
  megatron_uniform_dp, megatron_global_recompute,
  flagscale_cp, flagscale_vpp, flagscale_stage_mbs, flagscale_tied_tp,
  flagscale_shared_embedding_dp, flagscale_contiguous_types, flagscale_recompute
"""

from __future__ import annotations

from dataclasses import dataclass

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
# Megatron's rules (reference/megatron.md section 2)
# --------------------------------------------------------------------------------------------
def _dense_rules(model: ModelSpec, plan: Plan) -> list[RuleViolation]:
    out: list[RuleViolation] = []
    tp, cp = plan.tp, plan.cp
    heads = model.num_attention_heads
    if heads % tp:
        out.append(
            RuleViolation(
                "heads_tp",
                f"num_attention_heads ({heads}) must be a multiple of tensor_model_parallel_size ({tp}).",
                f"choose a TP that divides {heads}",
            )
        )
    groups = model.query_groups
    if model.num_query_groups is not None and groups % tp and tp % groups:
        out.append(
            RuleViolation(
                "query_groups_tp",
                f"num_query_groups ({groups}) must be a multiple or divisor of "
                f"tensor_model_parallel_size ({tp}).",
                f"choose a TP that divides {groups} or is a multiple of it "
                "(megatron-core <= 0.15 needs TP to divide it)",
            )
        )
    if cp > 1 and model.seq_length % (2 * cp):
        out.append(
            RuleViolation(
                "seq_cp",
                "seq-length should be a multiple of 2 * context-parallel-size if "
                "context-parallel-size > 1.",
                f"seq_length {model.seq_length} is not a multiple of 2*CP = {2 * cp}",
            )
        )
    return out


def _moe_rules(model: ModelSpec, plan: Plan) -> list[RuleViolation]:
    out: list[RuleViolation] = []
    tp, cp, ep, etp = plan.tp, plan.cp, plan.ep, plan.etp
    if ep > 1 and not model.is_moe:
        out.append(
            RuleViolation(
                "ep_needs_experts",
                "num_experts must be non None to use expert model parallelism",
                "a dense model needs EP = 1",
            )
        )
    if model.is_moe and model.num_experts % ep:
        out.append(
            RuleViolation(
                "experts_ep",
                "Number of experts should be a multiple of expert model parallel_size.",
                f"num_experts {model.num_experts} is not a multiple of EP {ep}",
            )
        )
    # parallel folding: every stage's (TP*CP*DP) ranks must hold whole ETP*EP expert groups
    for i, stage in enumerate(plan.stages):
        world = tp * cp * stage.dp
        expert = etp * ep
        if world % expert:
            pp = plan.pp if plan.runtime == "megatron" else 1
            out.append(
                RuleViolation(
                    "expert_folding",
                    f"world_size ({world * pp}) is not divisible by "
                    f"expert_tensor_model_pipeline_parallel size ({expert * pp})",
                    f"stage {i}: TP*CP*DP = {world} must be a multiple of ETP*EP = {expert}",
                )
            )
    if model.is_moe and tp > 1 and not plan.sequence_parallel:
        out.append(
            RuleViolation(
                "moe_tp_sequence_parallel",
                "During training, performance may degrade if MoE and tensor parallelismare "
                "enabled without also enabling sequence parallelism.",
                "MoE with TP > 1 needs --sequence-parallel (Megatron raises this in MoELayer.forward)",
            )
        )
    if model.is_moe and etp > 1 and model.add_bias_linear:
        out.append(
            RuleViolation(
                "moe_etp_bias",
                "Bias in Moe is only supported when ETP==1",
                "add --disable-bias-linear, or use ETP = 1",
            )
        )
    return out


def _batch_rules(plan: Plan) -> list[RuleViolation]:
    out: list[RuleViolation] = []
    dp0 = plan.dp0
    if plan.gbs % (plan.mbs * dp0):
        out.append(
            RuleViolation(
                "gbs_microbatch",
                f"global batch size ({plan.gbs}) is not divisible by micro batch size "
                f"({plan.mbs}) times data parallel size ({dp0})",
                "choose a global batch that is a multiple of mbs * DP",
            )
        )
    if plan.vpp > 1:
        if plan.pp < 2:
            out.append(
                RuleViolation(
                    "vpp_needs_pp",
                    "pipeline-model-parallel size should be greater than 1 with interleaved schedule",
                    "use vpp = 1 with a single pipeline stage",
                )
            )
        m = plan.gbs // (plan.mbs * dp0) if plan.gbs % (plan.mbs * dp0) == 0 else None
        if m is not None and plan.pp > 1:
            if m < plan.pp:
                out.append(
                    RuleViolation(
                        "vpp_microbatches",
                        "The number of contiguous micro-batches in a virtual pipeline stage"
                        f"should range in [PP={plan.pp} , M={m}]",
                        f"the interleaved schedule needs at least PP = {plan.pp} micro-batches, got {m}",
                    )
                )
            elif m % plan.pp:
                out.append(
                    RuleViolation(
                        "vpp_microbatches",
                        "The remainder of M (the total micro-batches) divided by N (number of "
                        "contiguous micro-batches in a virtual pipeline stage) should be 0, or "
                        "larger than or equal to the pipeline-parallel size, but it is "
                        f"{m % plan.pp}. Otherwise, it introduces dependency bubbles in the "
                        "pipeline and reduces throughput.",
                        f"micro-batches M = {m} must be a multiple of PP = {plan.pp} with interleaving",
                    )
                )
    return out


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
