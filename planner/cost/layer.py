"""Cost of one decoder layer for one micro-batch on one GPU of a pipeline stage.

Everything a stage costs is a sum of these per-layer pieces plus the stage's extras (embedding,
logits, pipeline sends, gradient sync, optimizer), composed in planner/cost/model.py (CostModel.stage_core).  The search
backends tabulate these pieces once per (device type, DP, micro-batch) and compose stages from them,
so the solvers and `estimate` read the very same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.flops import layer_flops
from planner.cost.links import GroupLinks, collective_s
from planner.cost.memory import ActivationModules, activation_bytes_per_token
from planner.schemas.device import DeviceProfile
from planner.schemas.model import ModelSpec

ATTENTION_BWD_OVER_FWD = 2.5  # flash attention backward recomputes S: ~2.5x forward time (FA2 paper)
GEMM_BWD_OVER_FWD = 2.0  # dgrad + wgrad
ELEMENTWISE_BWD_OVER_FWD = 2.0
TP_COMM_OVERLAP_EXPOSED = 0.3  # fraction of TP traffic left exposed with --tp-comm-overlap (assumption)
CP_OVERLAP = 1.0  # fraction of attention-core time that can hide the CP ring exchange


def expected_destination_ranks(num_experts: int, ep: int, topk: int) -> float:
    """Expected number of distinct EP ranks one token's top-k experts live on, for uniform routing
    over `num_experts` experts split evenly over `ep` ranks: ep * (1 - C(E - E/ep, k) / C(E, k)).

    Megatron's `flex` dispatcher (DeepEP / HybridEP) sends a token once to every rank that hosts
    at least one of its experts (DeepEP `get_dispatch_layout`: `is_token_in_rank`), while the
    `alltoall` dispatcher permutes first and sends one copy per selected expert (k copies)."""
    if ep <= 1 or num_experts <= 0:
        return 1.0
    k = min(topk, num_experts)
    per_rank = num_experts / ep
    p_miss = 1.0
    for i in range(k):
        p_miss *= max(num_experts - per_rank - i, 0.0) / (num_experts - i)
    return ep * (1.0 - p_miss)


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
    precision: str
    tp_comm_overlap: bool
    imbalance: float  # busiest expert's tokens over the mean
    dispatcher: str

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
    # forward pieces that selective recompute re-runs, by module name
    module_fwd_s: dict
    activations: ActivationModules  # bytes per local token
    local_tokens: float

    @property
    def fwd_s(self) -> float:
        return self.fwd_compute_s + self.tp_fwd_s + self.cp_fwd_s + self.ep_fwd_s

    @property
    def bwd_s(self) -> float:
        return self.bwd_compute_s + self.tp_bwd_s + self.cp_bwd_s + self.ep_bwd_s

    def act_bytes(self, kept_per_token: float) -> float:
        return kept_per_token * self.local_tokens


def _gemm_s(device: DeviceProfile, flop: float, call_flop: float, precision: str, corr: float) -> float:
    from planner.profile_tables import interpolate_efficiency

    if flop <= 0:
        return 0.0
    eff = interpolate_efficiency(device.gemm_efficiency, max(call_flop, 1.0))
    return flop / (device.peak_flop_per_s(precision) * eff) * corr


def layer_cost(
    model: ModelSpec, *, is_moe: bool, shape: LayerShape, device: DeviceProfile, links: GroupLinks,
    corrections: dict[str, float],
) -> LayerCost:
    """Price one decoder layer (dense or MoE) for one micro-batch on one GPU."""
    from planner.profile_tables import interpolate_efficiency

    fl = layer_flops(model, is_moe=is_moe, seq_length=shape.seq_length)
    tp, etp, ep = shape.tp, shape.etp, shape.ep
    t_g, t_l = shape.gathered_tokens, shape.local_tokens
    prec = shape.precision
    act_b = 1 if prec == "fp8" else 2
    c = corrections
    h = model.hidden_size

    # --- compute: GEMMs at their per-call sizes ---
    attn_proj_flop = t_g * fl.attn_proj_flop / tp
    attn_proj_s = _gemm_s(device, attn_proj_flop, attn_proj_flop / 2, prec, c["gemm"])
    core_flop = t_g * fl.attn_core_flop / tp
    att_eff = interpolate_efficiency(device.attention_efficiency, max(core_flop, 1.0))
    core_s = core_flop / (device.peak_flop_per_s("bf16" if prec == "fp8" else prec) * att_eff) * c["attention"]
    mlp_s = _gemm_s(device, t_g * fl.mlp_flop / tp, t_g * fl.mlp_flop / tp / 2, prec, c["gemm"])
    shared_s = _gemm_s(
        device, t_g * fl.shared_expert_flop / tp, t_g * fl.shared_expert_flop / tp / 2, prec, c["gemm"]
    )
    experts_s = 0.0
    if is_moe:
        n_exp = model.num_experts or 1
        k = model.moe_router_topk
        tokens_per_expert = ep * etp * t_l * k / n_exp
        expert_flop = t_l * fl.expert_flop * shape.imbalance
        per_expert_call = 2.0 * tokens_per_expert * h * model.moe_ffn_size / etp
        base = interpolate_efficiency(device.gemm_efficiency, max(per_expert_call, 1.0))
        mult = interpolate_efficiency(device.grouped_gemm_efficiency, max(tokens_per_expert, 1.0))
        experts_s = expert_flop / (device.peak_flop_per_s(prec) * base * mult) * c["grouped_gemm"]

    # --- memory-bound elementwise work (norms, residuals, rope, activation, permutation) ---
    hbm_bytes_per_s = device.hbm_bandwidth_tb_per_s * 1e12 * device.hbm_efficiency / c["memory_bound"]
    tp_region = (tp if shape.sequence_parallel else 1) / tp
    qkv = model.num_attention_heads * model.head_dim + 2 * model.query_groups * model.head_dim
    norm_elems = 4 * h  # two norms, read + write
    other_elems = 6 * h + 2 * qkv * tp_region  # residual adds, rope on q/k
    if is_moe:
        f = model.moe_ffn_size
        act_elems = 3 * f * model.moe_router_topk * shape.imbalance
        act_elems += 4 * h * model.moe_router_topk * etp  # permute + unpermute, read + write
        if shape.dispatcher == "alltoall" and ep > 1 and (model.num_experts or 1) > ep:
            # MoEAlltoAllTokenDispatcher re-sorts the received chunks by local expert after the
            # dispatch all-to-all and back before the combine (sort_chunks_by_idxs): 2 more copies
            act_elems += 4 * h * model.moe_router_topk * etp
    else:
        act_elems = 3 * model.ffn_size * tp_region
    to_s = t_l * act_b / hbm_bytes_per_s
    norm_s, act_s, other_s = norm_elems * to_s, act_elems * to_s, other_elems * to_s

    fwd_compute = attn_proj_s + core_s + mlp_s + shared_s + experts_s + norm_s + act_s + other_s
    bwd_compute = (
        GEMM_BWD_OVER_FWD * (attn_proj_s + mlp_s + shared_s + experts_s)
        + ATTENTION_BWD_OVER_FWD * core_s
        + ELEMENTWISE_BWD_OVER_FWD * (norm_s + act_s + other_s)
    )

    # --- tensor parallel (sequence parallel: all-gather + reduce-scatter per block) ---
    tp_fwd = 0.0
    mlp_tp = 0.0
    if tp > 1:
        full = t_g * h * act_b
        attn_tp = collective_s(links.tp, "all_gather", full, tp) + collective_s(links.tp, "reduce_scatter", full, tp)
        if not is_moe:
            mlp_tp = attn_tp
        elif model.moe_shared_expert_intermediate_size:
            mlp_tp = attn_tp
        tp_fwd = attn_tp + mlp_tp
    etp_fwd = 0.0
    if is_moe and etp > 1:
        gathered = etp * t_l * model.moe_router_topk * h * act_b
        etp_fwd = collective_s(links.etp, "all_gather", gathered, etp) + collective_s(
            links.etp, "reduce_scatter", gathered, etp
        )
    tp_fwd += etp_fwd
    if shape.tp_comm_overlap:
        tp_fwd *= TP_COMM_OVERLAP_EXPOSED
    tp_bwd = tp_fwd

    # --- context parallel: ring exchange of K/V chunks, hidden under attention core ---
    cp_fwd = cp_bwd = 0.0
    if shape.cp > 1:
        kv_bytes = 2 * t_g * model.query_groups * model.head_dim / min(tp, model.query_groups) * act_b
        step = collective_s(links.cp, "p2p", kv_bytes, 2)
        ring = (shape.cp - 1) * step
        cp_fwd = max(0.0, ring - CP_OVERLAP * core_s)
        cp_bwd = max(0.0, 2 * ring - CP_OVERLAP * ATTENTION_BWD_OVER_FWD * core_s)

    # --- expert parallel: dispatch + combine ---
    ep_fwd = 0.0
    if is_moe and ep > 1:
        k = model.moe_router_topk
        if shape.dispatcher == "allgather":
            gathered = t_l * h * act_b * ep
            one = collective_s(links.ep, "all_gather", gathered, ep) + collective_s(
                links.ep, "reduce_scatter", gathered, ep
            )
            ep_fwd = one * shape.imbalance
        else:
            copies = float(k)
            if shape.dispatcher == "flex":
                copies = min(float(k), expected_destination_ranks(model.num_experts or 1, ep, k))
            send = t_l * copies * h * act_b
            one = collective_s(links.ep, "all_to_all", send, ep)
            ep_fwd = 2 * one * shape.imbalance
    ep_bwd = ep_fwd

    acts = activation_bytes_per_token(
        model, is_moe=is_moe, tp=tp, etp=etp, ep=ep, sequence_parallel=shape.sequence_parallel,
        act_bytes=act_b, imbalance=shape.imbalance,
    )
    module_fwd = {
        "core_attn": core_s,
        "layernorm": norm_s,
        "moe_act": act_s if is_moe else 0.0,
        "mlp": (mlp_s + act_s + mlp_tp) if not is_moe else 0.0,
        "moe": (experts_s + act_s + ep_fwd + etp_fwd) if is_moe else 0.0,
        "shared_experts": shared_s,
        "mla_up_proj": attn_proj_s * 0.3 if model.multi_latent_attention else 0.0,
    }
    return LayerCost(
        fwd_compute_s=fwd_compute, bwd_compute_s=bwd_compute, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd,
        cp_fwd_s=cp_fwd, cp_bwd_s=cp_bwd, ep_fwd_s=ep_fwd, ep_bwd_s=ep_bwd, module_fwd_s=module_fwd,
        activations=acts, local_tokens=t_l,
    )
