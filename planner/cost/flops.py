"""Megatron-LM's FLOP accounting, per layer and per iteration.

Megatron reports TFLOP/s/GPU as `num_floating_point_operations(args, batch) / (t_iter * 1e12 * world)`
(megatron/training/training.py; reference/megatron.md section 4).  Its formula counts, per token:
  attention (GQA/MHA): 12*h^2*(1 + g/a + s/(2h)) * (a*d/h)     (fwd+bwd, causal half of the core)
  attention (MLA):     6 * (q term + kv term + rope + out proj + core/2)   (see `_mla_fwd_flop_per_token`)
  dense MLP:           12*h*ffn*glu                      (glu = 3/2 with a gated MLP)
  MoE layer:           12*h*(moe_ffn*topk + shared)*glu
  logits:              6*h*V_padded
A sliding-window layer (--window-size) runs fewer: `windowed_attn_core_flop` is what its kernel computes;
Megatron's count keeps the causal core.
The factor 3 is forward + two backward GEMMs; we keep the forward part per layer and multiply by 3
for the iteration, so predicted TFLOP/s/GPU means what Megatron prints.

One difference between the work a GPU does and what Megatron counts: a gated MLP (`--swiglu`, `--quick-geglu`:
ModelSpec.gated_linear_unit) runs three matrices, but Megatron's count (and its theoretical memory report) gives
the 3/2 factor to `--swiglu` only.  `layer_flops` prices the work (`counted=False`); `model_flop_per_iteration`
is Megatron's count (`counted=True`), the FLOPs behind a reported TFLOP/s/GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.schemas.model import ModelSpec


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOP of one decoder layer for one token (whole layer, before any parallel split)."""

    attn_proj_flop: float  # QKV (or MLA projections) + output projection GEMMs
    attn_core_flop: float  # QK^T and AV, causal half (Megatron's count)
    mlp_flop: float  # dense MLP GEMMs (0 on MoE layers)
    expert_flop: float  # routed experts: topk * per-expert MLP (0 on dense layers)
    shared_expert_flop: float  # shared experts (MoE layers only)

    @property
    def total_flop(self) -> float:
        return (
            self.attn_proj_flop + self.attn_core_flop + self.mlp_flop + self.expert_flop + self.shared_expert_flop
        )


def glu_flop_factor(model: ModelSpec, *, counted: bool = False) -> float:
    """MLP FLOPs over those of an ungated MLP of the same FFN size: 3/2 for a gated MLP (two up-projections and
    one down-projection).  `counted`: as Megatron's FLOP count has it (megatron/training/training.py
    `num_floating_point_operations`: `3/2 if args.swiglu else 1`), so a --quick-geglu run (gpt-oss) is counted
    with two matrices: Megatron-Bridge's GPT-OSS-120B on 64 B200 reports 219 TFLOP/s/GPU at 8047 tokens/s/GPU,
    27.2 GFLOP per token, the two-matrix count (tests/test_cost_model.py)."""
    gated = model.swiglu if counted else model.gated_linear_unit
    return 1.5 if gated else 1.0


def _mla_fwd_flop_per_token(model: ModelSpec, seq_length: int) -> tuple[float, float]:
    """(projection FLOP, core FLOP) per token, forward, for multi-latent attention."""
    a, h = model.num_attention_heads, model.hidden_size
    qk = model.qk_head_dim + model.qk_pos_emb_head_dim
    if model.q_lora_rank is None:
        q_term = h * a * qk
    else:
        q_term = model.q_lora_rank * (h + a * qk + 1)
    kv_term = model.kv_lora_rank * (h + a * (model.qk_head_dim + model.v_head_dim) + 1)
    rope_term = h * model.qk_pos_emb_head_dim
    out_term = a * model.v_head_dim * h
    core = seq_length * a * qk / 2 + seq_length * a * model.v_head_dim / 2
    return 2.0 * (q_term + kv_term + rope_term + out_term), 2.0 * core


def layer_flops(model: ModelSpec, *, is_moe: bool, seq_length: int | None = None, counted: bool = False) -> LayerFlops:
    """Forward FLOP per token of one decoder layer, Megatron's accounting; a gated MLP as it runs (three matrices),
    or with `counted` as Megatron counts it (`glu_flop_factor`)."""
    s = seq_length or model.seq_length
    h = model.hidden_size
    if model.multi_latent_attention:
        proj, core = _mla_fwd_flop_per_token(model, s)
    else:
        q = model.num_attention_heads * model.head_dim
        kv = model.query_groups * model.head_dim
        proj = 2.0 * h * (q + 2 * kv) + 2.0 * q * h
        core = 2.0 * s * q  # 2*(2*s*q) for QK^T and AV, halved for causal masking
    glu = glu_flop_factor(model, counted=counted)
    if is_moe:
        shared = model.moe_shared_expert_intermediate_size or 0
        return LayerFlops(
            attn_proj_flop=proj,
            attn_core_flop=core,
            mlp_flop=0.0,
            expert_flop=4.0 * h * model.moe_ffn_size * model.moe_router_topk * glu,
            shared_expert_flop=4.0 * h * shared * glu,
        )
    return LayerFlops(
        attn_proj_flop=proj, attn_core_flop=core, mlp_flop=4.0 * h * model.ffn_size * glu,
        expert_flop=0.0, shared_expert_flop=0.0,
    )


def window_keys_per_query(model: ModelSpec, seq_length: int) -> float:
    """Mean keys a query of a sliding-window layer attends to (itself included), over a causal sequence of
    `seq_length` tokens: with --window-size (L, R) query i sees keys max(0, i - L)..i, min(i, L) + 1 of them; the
    causal mask bounds the right side (Transformer Engine runs a causal layer's window as (L, 0):
    TransformerEngine v2.14.1 @366798ef transformer_engine/pytorch/attention/dot_product_attention/utils.py
    `check_set_window_size`).  Mean over the sequence: (L + 1) - L (L + 1) / (2 s) for L < s; at most s / 2, the
    causal count's."""
    s = seq_length
    left = model.window_size[0] if model.window_size is not None else -1
    if left < 0 or left >= s - 1:
        return s / 2
    return min(s / 2, (left + 1) - left * (left + 1) / (2 * s))


def windowed_attn_core_flop(model: ModelSpec, seq_length: int | None = None) -> float:
    """Forward FLOP per token of a sliding-window layer's attention core, QK^T and AV over the keys its queries see
    (4 x q x `window_keys_per_query`; the causal count 2 x s x q is the same with s / 2 keys).  Megatron's own FLOP
    count (`model_flop_per_iteration`) ignores windows: megatron/training/training.py
    `num_floating_point_operations` @2edffadb has no window term."""
    s = seq_length or model.seq_length
    if model.multi_latent_attention:
        return layer_flops(model, is_moe=False, seq_length=s).attn_core_flop
    return 4.0 * model.num_attention_heads * model.head_dim * window_keys_per_query(model, s)


def logits_fwd_flop_per_token(model: ModelSpec, tp: int) -> float:
    return 2.0 * model.hidden_size * model.padded_vocab_size(tp)


def model_flop_per_iteration(model: ModelSpec, *, global_batch_size: int, tp: int, seq_length: int | None = None) -> float:
    """Megatron's `num_floating_point_operations` for one iteration (fwd + bwd = 3x fwd), as Megatron counts it
    (a --quick-geglu MLP with two matrices: `glu_flop_factor`)."""
    s = seq_length or model.seq_length
    kinds = model.layer_is_moe
    per_kind = {m: layer_flops(model, is_moe=m, seq_length=s, counted=True).total_flop for m in set(kinds)}
    per_token_fwd = sum(per_kind[m] for m in kinds)  # a layer's FLOPs are its kind's: once per kind
    if model.mtp_num_layers:
        last_moe = model.layer_is_moe[-1]
        per_token_fwd += model.mtp_num_layers * (
            layer_flops(model, is_moe=last_moe, seq_length=s, counted=True).total_flop + 2.0 * 2 * model.hidden_size**2
        )
    per_token_fwd += logits_fwd_flop_per_token(model, tp) * (1 + model.mtp_num_layers)
    return 3.0 * per_token_fwd * global_batch_size * s


def parameter_counts(model: ModelSpec) -> dict[str, float]:
    """Parameter counts (whole model, unsharded), as Megatron builds the model on one GPU: attention (with the
    layer's two norms, QK norms and biases), dense MLP, routed experts, shared experts (with their gate), router,
    word embeddings (vocabulary padded to a multiple of make_vocab_size_divisible_by) and output layer, learned
    position embeddings, the final norm, and the MTP layers (the per-layer entries are the decoder's layers only).
    A gated MLP (`--swiglu`, `--quick-geglu`) has three matrices and a doubled FC1 bias.
    tests/test_megatron_params.py checks the total against the model Megatron itself builds
    (tools/megatron_params.py) for every preset, the HuggingFace configs and the calibration runs' models."""
    h = model.hidden_size
    glu_mats = 3 if model.gated_linear_unit else 2
    bias = 1 if model.add_bias_linear else 0
    norm = 2 if model.normalization == "LayerNorm" else 1  # weight, and LayerNorm's bias
    if model.multi_latent_attention:
        a = model.num_attention_heads
        qk = model.qk_head_dim + model.qk_pos_emb_head_dim
        q = h * a * qk if model.q_lora_rank is None else model.q_lora_rank * (h + a * qk)
        kv = h * (model.kv_lora_rank + model.qk_pos_emb_head_dim) + model.kv_lora_rank * a * (
            model.qk_head_dim + model.v_head_dim
        )
        latent_norms = model.kv_lora_rank + (model.q_lora_rank or 0) if model.qk_layernorm else 0
        attn = q + kv + a * model.v_head_dim * h + norm * latent_norms
    else:
        qd = model.num_attention_heads * model.head_dim
        kvd = model.query_groups * model.head_dim
        qkv_bias = bias or (1 if model.add_qkv_bias else 0)
        attn = h * (qd + 2 * kvd) + qd * h + qkv_bias * (qd + 2 * kvd) + bias * h
        attn += norm * 2 * model.head_dim if model.qk_layernorm else 0
    norms = 2 * h * norm
    ffn_bias = (glu_mats - 1) * bias  # FC1's bias is as wide as its output (doubled when gated)

    def mlp(ffn: int) -> int:
        return glu_mats * h * ffn + ffn_bias * ffn + bias * h

    shared_size = model.moe_shared_expert_intermediate_size or 0
    shared = mlp(shared_size) + (h if shared_size and model.moe_shared_expert_gate else 0) if shared_size else 0
    n_moe = sum(model.layer_is_moe)
    n_dense = model.num_layers - n_moe
    num_experts = model.num_experts or 0
    vocab = model.padded_vocab_size(1)
    positions = model.max_position_embeddings or model.seq_length
    moe_block = mlp(model.moe_ffn_size) * num_experts + shared + (h + bias) * num_experts
    last_mlp = moe_block if model.layer_is_moe[-1] else mlp(model.ffn_size)
    # an MTP layer: eh_proj, enorm, hnorm and its final norm, and a transformer layer like the last decoder layer
    mtp = model.mtp_num_layers * (2 * h * h + 3 * norm * h + attn + norms + last_mlp)
    return {
        "attention": (attn + norms) * model.num_layers,
        "dense_mlp": mlp(model.ffn_size) * n_dense,
        "experts": mlp(model.moe_ffn_size) * num_experts * n_moe,
        "shared_experts": shared * n_moe,
        "router": (h + bias) * num_experts * n_moe,
        "embedding": vocab * h * (2 if model.untie_embeddings_and_output_weights else 1),
        "position_embedding": positions * h if model.position_embedding_type == "learned_absolute" else 0,
        "final_norm": norm * h,
        "mtp": mtp,
    }


@dataclass(frozen=True)
class ParameterTotals:
    """The model's parameters (`parameter_counts`, as Megatron builds the model on one GPU) and those one token's
    forward pass uses.  Published figures differ in what they count: Mistral (Mixtral 8x7B: 46.7B, 12.9B active) and
    Qwen (Qwen3-30B-A3B: 30.5B, 3.3B active) count the input embedding and the output layer in both; DeepSeek-V3's
    671B / 37B leave out the MTP module, and its 37B and gpt-oss-120b's 5.1B active the input embedding
    (tests/test_cost_model.py)."""

    total: int  # every parameter, the MTP layers and the input embedding included
    active: int  # total less the routed experts a token is not routed to: (experts - top-k) in each MoE layer and MTP
    # layer; so the top-k routed and the shared experts, routers, attention, dense MLPs, norms, the input embedding
    # table and the output layer (one table where they are tied), position embeddings and the MTP layers
    input_embedding: int  # the word embedding table (padded vocabulary x hidden), counted in total and active
    mtp: int  # the MTP layers' share of total (0 without --mtp-num-layers)


def parameter_totals(model: ModelSpec) -> ParameterTotals:
    """Total and active (per token) parameters of `model` (ParameterTotals)."""
    counts = parameter_counts(model)
    total = int(sum(counts.values()))
    n_moe = sum(model.layer_is_moe)
    experts = model.num_experts or 0
    idle = 0
    if n_moe and experts:
        per_expert = int(counts["experts"]) // (n_moe * experts)
        moe_layers = n_moe + (model.mtp_num_layers if model.layer_is_moe[-1] else 0)
        idle = (experts - min(model.moe_router_topk, experts)) * per_expert * moe_layers
    return ParameterTotals(total=total, active=total - idle,
                           input_embedding=model.padded_vocab_size(1) * model.hidden_size, mtp=int(counts["mtp"]))
