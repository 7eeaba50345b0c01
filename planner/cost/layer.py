"""Cost of one decoder layer for one micro-batch on one GPU of a pipeline stage.

Every part of a layer's time is named, the way Vidur names the parts of a stage (`LayerCost.parts`):
attention projections, the attention core, the dense MLP or the experts, shared experts, the router and
token permutation, FP8 quantisation, other memory-bound work (norms, residual adds, RoPE, activations),
and the communication of tensor, context and expert parallelism.  A stage is a sum of these per-layer
pieces plus its extras (embedding, logits, MTP, pipeline sends, gradient sync, optimizer), composed in
planner/cost/model.py.  The search backends tabulate these pieces once per (device type, DP, micro-batch)
and compose stages from them, so the solvers and `estimate` read the very same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.cost.dispatch import moe_dispatch
from planner.cost.flops import layer_flops
from planner.cost.kernels import ATTENTION_BWD_OVER_FWD, ELEMENTWISE_BWD_OVER_FWD, GEMM_BWD_OVER_FWD, Kernels
from planner.cost.communication import GroupLinks, collective_s
from planner.cost.memory import ActivationModules, activation_bytes_per_token
from planner.schemas.model import ModelSpec
from planner.schemas.training import TrainingSpec

TP_COMM_OVERLAP_EXPOSED = 0.3  # fraction of TP traffic left exposed with --tp-comm-overlap (assumption)
CP_OVERLAP = 1.0  # fraction of attention-core time that can hide the CP ring exchange
EP_OVERLAP_MIN_EXPOSED = 0.1
"""With --overlap-moe-expert-parallel-comm, the part of the EP all-to-all never hidden (the first and last
micro-batch of a schedule have no partner to overlap with; assumption)."""


@dataclass(frozen=True)
class LayerShape:
    """The parallel shape a layer runs at on one GPU."""

    tp: int
    cp: int
    ep: int
    etp: int
    micro_batch_size: int  # samples per micro-batch on this GPU's DP rank
    seq_length: int
    sequence_parallel: bool
    imbalance: float  # busiest EP rank's tokens over the mean (planner/cost/dispatch.py `routing`)

    @property
    def gathered_tokens(self) -> float:
        """Tokens a TP region works on (whole sequence chunk of this CP rank)."""
        return self.micro_batch_size * self.seq_length / self.cp

    @property
    def local_tokens(self) -> float:
        """Tokens this GPU holds outside TP regions (after the sequence-parallel split)."""
        sp = self.tp if self.sequence_parallel else 1
        return self.gathered_tokens / sp


@dataclass(frozen=True)
class LayerCost:
    """Seconds and bytes of one layer, one micro-batch, one GPU.  Backward excludes recompute."""

    fwd_compute_s: float
    bwd_compute_s: float
    tp_fwd_s: float
    tp_bwd_s: float
    cp_fwd_s: float
    cp_bwd_s: float
    ep_fwd_s: float
    ep_bwd_s: float
    module_fwd_s: dict  # forward pieces that selective recompute re-runs, by module name
    activations: ActivationModules  # bytes per local token
    local_tokens: float
    parts: dict = field(default_factory=dict)  # forward + backward seconds by named part
    transient_bytes: float = 0.0  # buffers alive only while the layer runs (dispatch buffers)

    @property
    def fwd_s(self) -> float:
        return self.fwd_compute_s + self.tp_fwd_s + self.cp_fwd_s + self.ep_fwd_s

    @property
    def bwd_s(self) -> float:
        return self.bwd_compute_s + self.tp_bwd_s + self.cp_bwd_s + self.ep_bwd_s

    def act_bytes(self, kept_per_token: float) -> float:
        return kept_per_token * self.local_tokens


def _mla_up_proj_flop(model: ModelSpec) -> float:
    """Forward FLOP per token of MLA's up-projections (latent -> per-head Q, K, V)."""
    a = model.num_attention_heads
    q_up = (model.q_lora_rank or 0) * a * (model.qk_head_dim + model.qk_pos_emb_head_dim)
    kv_up = model.kv_lora_rank * a * (model.qk_head_dim + model.v_head_dim)
    return 2.0 * (q_up + kv_up)


def layer_cost(
    model: ModelSpec, training: TrainingSpec, *, is_moe: bool, shape: LayerShape, kernels: Kernels,
    links: GroupLinks, tp_comm_overlap: bool,
) -> LayerCost:
    """Price one decoder layer (dense or MoE) for one micro-batch on one GPU."""
    fl = layer_flops(model, is_moe=is_moe, seq_length=shape.seq_length)
    tp, etp, ep = shape.tp, shape.etp, shape.ep
    t_g, t_l = shape.gathered_tokens, shape.local_tokens
    sp = t_g / t_l
    act = training.activation_bytes
    fp8 = training.precision == "fp8"
    h = model.hidden_size
    k = kernels

    # --- GEMMs and attention, forward ---
    attn_flop = t_g * fl.attn_proj_flop / tp
    attn_proj_s = k.gemm_s(attn_flop, attn_flop / 2, fp8=fp8)
    up_proj_s = attn_proj_s * _mla_up_proj_flop(model) / fl.attn_proj_flop if model.multi_latent_attention else 0.0
    core_s = k.attention_s(t_g * fl.attn_core_flop / tp)
    mlp_flop = t_g * fl.mlp_flop / tp
    mlp_s = k.gemm_s(mlp_flop, mlp_flop / 2, fp8=fp8)
    shared_flop = t_g * fl.shared_expert_flop / tp
    shared_s = k.gemm_s(shared_flop, shared_flop / 2, fp8=fp8)
    experts_s = 0.0
    dispatch = None
    if is_moe:
        dispatch = moe_dispatch(model, kernels=k, links=links, local_tokens=t_l, ep=ep, etp=etp,
                                imbalance=shape.imbalance, act_bytes=act)
        per_copy_flop = fl.expert_flop / model.moe_router_topk / etp
        local_experts = max(1, (model.num_experts or 1) // ep)
        experts_s = k.grouped_gemm_s(
            t_l * dispatch.copies_per_token * per_copy_flop, tokens_per_expert=dispatch.tokens_per_expert,
            local_experts=local_experts, call_flop=dispatch.tokens_per_expert * per_copy_flop / 2,
            grouped=model.moe_grouped_gemm, fp8=fp8)

    # --- memory-bound work per local token (elements read + written) ---
    qkv = model.num_attention_heads * model.head_dim + 2 * model.query_groups * model.head_dim
    tp_region = sp / tp
    norm_elems = 4 * h  # two norms, read + write
    other_elems = 6 * h + 2 * qkv * tp_region  # two residual adds, RoPE on Q and K
    glu = 2 if model.swiglu else 1
    if is_moe:
        f = model.moe_ffn_size / etp
        act_elems = (glu + 1) * f * dispatch.copies_per_token
        s_f = model.moe_shared_expert_intermediate_size or 0
        act_elems += (glu + 1) * s_f * tp_region
    else:
        act_elems = (glu + 1) * model.ffn_size * tp_region
    norm_s = k.memory_s(norm_elems * t_l * act)
    act_s = k.memory_s(act_elems * t_l * act)
    other_s = k.memory_s(other_elems * t_l * act)

    # --- FP8 quantisation of every FP8 GEMM's input (forward) and output gradient (backward) ---
    cast_fwd = cast_bwd = 0.0
    if fp8:
        o_dim = model.num_attention_heads * (model.v_head_dim if model.multi_latent_attention else model.head_dim)
        cast_fwd = (h * sp + o_dim / tp * sp) * t_l  # QKV input, projection input
        cast_bwd = (qkv / tp * sp + h * sp) * t_l
        if is_moe:
            c = dispatch.copies_per_token
            cast_fwd += c * (h + model.moe_ffn_size / etp) * t_l
            cast_bwd += c * (glu * model.moe_ffn_size / etp + h) * t_l
            s_f = model.moe_shared_expert_intermediate_size or 0
            cast_fwd += (h + s_f / tp) * sp * t_l if s_f else 0.0
            cast_bwd += (glu * s_f / tp + h) * sp * t_l if s_f else 0.0
        else:
            cast_fwd += (h + model.ffn_size / tp) * sp * t_l
            cast_bwd += (glu * model.ffn_size / tp + h) * sp * t_l
    cast_fwd_s, cast_bwd_s = k.fp8_cast_s(cast_fwd), k.fp8_cast_s(cast_bwd)

    route_s = (dispatch.router_s + dispatch.permute_s) if dispatch else 0.0
    gemm_fwd = attn_proj_s + mlp_s + shared_s + experts_s
    elementwise_fwd = norm_s + act_s + other_s + route_s
    fwd_compute = gemm_fwd + core_s + elementwise_fwd + cast_fwd_s
    bwd_compute = (GEMM_BWD_OVER_FWD * gemm_fwd + ATTENTION_BWD_OVER_FWD * core_s
                   + ELEMENTWISE_BWD_OVER_FWD * elementwise_fwd + cast_bwd_s)

    # --- tensor parallel (sequence parallel: all-gather + reduce-scatter around each TP block) ---
    tp_fwd = mlp_tp = 0.0
    if tp > 1:
        full = t_g * h * act
        attn_tp = collective_s(links.tp, "all_gather", full, tp) + collective_s(links.tp, "reduce_scatter", full, tp)
        if not is_moe or model.moe_shared_expert_intermediate_size:
            mlp_tp = attn_tp  # the dense MLP, or the shared experts, are a TP block of their own
        tp_fwd = attn_tp + mlp_tp
        if tp_comm_overlap:
            mlp_tp *= TP_COMM_OVERLAP_EXPOSED
    if tp_comm_overlap:  # userbuffers overlap the TP linear layers' collectives, not the dispatcher's
        tp_fwd *= TP_COMM_OVERLAP_EXPOSED
    tp_fwd += dispatch.etp_s if dispatch else 0.0
    tp_bwd = tp_fwd

    # --- context parallel ---
    cp_fwd = cp_bwd = 0.0
    if shape.cp > 1:
        kv_bytes = 2 * t_g * model.query_groups * model.head_dim / min(tp, model.query_groups) * act
        if training.cp_comm_type in ("p2p", "a2a+p2p"):
            ring = (shape.cp - 1) * collective_s(links.cp, "p2p", kv_bytes, 2)
            cp_fwd = max(0.0, ring - CP_OVERLAP * core_s)
            cp_bwd = max(0.0, 2 * ring - CP_OVERLAP * ATTENTION_BWD_OVER_FWD * core_s)
        elif training.cp_comm_type == "a2a":  # Ulysses: Q, K, V in and O out, head-scattered
            q_bytes = t_g * model.num_attention_heads * model.head_dim / tp * act
            moved = 2 * q_bytes + kv_bytes
            cp_fwd = cp_bwd = collective_s(links.cp, "all_to_all", moved, shape.cp)
        else:  # allgather of K and V
            cp_fwd = collective_s(links.cp, "all_gather", kv_bytes * shape.cp, shape.cp)
            cp_bwd = cp_fwd + collective_s(links.cp, "reduce_scatter", kv_bytes * shape.cp, shape.cp)

    # --- expert parallel: dispatch + combine, each way ---
    ep_fwd = ep_bwd = dispatch.comm_s if dispatch else 0.0
    if dispatch and training.overlap_moe_expert_parallel_comm:
        hide = fwd_compute + bwd_compute  # the other micro-batch's forward and backward run meanwhile
        total = ep_fwd + ep_bwd
        exposed = max(EP_OVERLAP_MIN_EXPOSED * total, total - hide)
        ep_fwd = ep_bwd = exposed / 2
    if dispatch and training.moe_shared_expert_overlap and shared_s:
        ep_fwd = max(0.0, ep_fwd - shared_s)
        ep_bwd = max(0.0, ep_bwd - GEMM_BWD_OVER_FWD * shared_s)

    acts = activation_bytes_per_token(
        model, training, is_moe=is_moe, tp=tp, etp=etp, sequence_parallel=shape.sequence_parallel,
        copies_per_token=dispatch.copies_per_token if dispatch else 0.0,
    )
    module_fwd = {
        "core_attn": core_s,
        "layernorm": norm_s,
        "moe_act": act_s if is_moe else 0.0,
        "mlp": (mlp_s + act_s + mlp_tp) if not is_moe else 0.0,
        "moe": (experts_s + act_s + dispatch.total_s) if is_moe else 0.0,
        "shared_experts": shared_s,
        "mla_up_proj": up_proj_s,
    }
    b = GEMM_BWD_OVER_FWD + 1
    parts = {
        "attention_gemm": b * attn_proj_s,
        "attention_core": (1 + ATTENTION_BWD_OVER_FWD) * core_s,
        "mlp_gemm": b * mlp_s,
        "expert_gemm": b * experts_s,
        "shared_expert_gemm": b * shared_s,
        "router_permute": (1 + ELEMENTWISE_BWD_OVER_FWD) * route_s,
        "fp8_cast": cast_fwd_s + cast_bwd_s,
        "elementwise": (1 + ELEMENTWISE_BWD_OVER_FWD) * (norm_s + act_s + other_s),
        "tp_comm": tp_fwd + tp_bwd,
        "cp_comm": cp_fwd + cp_bwd,
        "ep_comm": ep_fwd + ep_bwd,
    }
    transient = 0.0
    if dispatch:  # receive buffer + permuted copy of this GPU's expert tokens, alive during the layer
        transient = 2 * t_l * dispatch.copies_per_token * h * act
    return LayerCost(
        fwd_compute_s=fwd_compute, bwd_compute_s=bwd_compute, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd,
        cp_fwd_s=cp_fwd, cp_bwd_s=cp_bwd, ep_fwd_s=ep_fwd, ep_bwd_s=ep_bwd, module_fwd_s=module_fwd,
        activations=acts, local_tokens=t_l, parts=parts, transient_bytes=transient,
    )
