"""Memory per GPU of a pipeline stage: weights, gradients, optimizer states, activations, other.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models") with sequence parallelism and flash attention, written module by module so
that Megatron's `--recompute-modules` can drop exactly what each module stores.  Bytes per token of
one micro-batch on one GPU, with T tokens per GPU after the sequence-parallel split.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.schemas.model import ModelSpec

# bytes per parameter: bf16/fp16 weights; gradients accumulate in fp32 under bf16 (Megatron sets
# accumulate_allreduce_grads_in_fp32 for bf16), in fp16 under fp16; Adam: fp32 master + 2 moments.
WEIGHT_BYTES = 2
OPTIMIZER_BYTES = 12


def grad_bytes(precision: str) -> int:
    return 2 if precision == "fp16" else 4


@dataclass(frozen=True)
class ActivationModules:
    """Activation bytes per token a layer keeps for backward, split by recompute module."""

    layernorm: float  # norm outputs (inputs to the next GEMM); dropped by `layernorm`
    attn_inputs: float  # norm input + Q/K/V + attention output (always kept unless full)
    core_attn: float  # what core attention keeps beyond Q/K/V/O (flash: softmax stats only)
    mlp: float  # dense MLP internals (fc1 out, activation out); dropped by `mlp`
    moe_act: float  # expert activation outputs; dropped by `moe_act` (and `moe`)
    moe: float  # rest of the MoE block internals (dispatched inputs, fc1 out, combine buffer)
    shared_experts: float  # shared-expert internals
    layer_input: float  # what full recompute keeps: the layer's input

    @property
    def total(self) -> float:
        return (
            self.layernorm + self.attn_inputs + self.core_attn + self.mlp + self.moe_act + self.moe
            + self.shared_experts
        )

    def after_selective(self, modules: tuple[str, ...]) -> float:
        """Bytes kept when the given modules are recomputed (their inputs are kept elsewhere)."""
        kept = self.total
        dropped = set(modules)
        if "layernorm" in dropped:
            kept -= self.layernorm
        if "core_attn" in dropped:
            kept -= self.core_attn
        if "mlp" in dropped:
            kept -= self.mlp
        if "moe" in dropped:
            kept -= self.moe + self.moe_act
        elif "moe_act" in dropped:
            kept -= self.moe_act
        if "shared_experts" in dropped:
            kept -= self.shared_experts
        return kept


def activation_bytes_per_token(
    model: ModelSpec, *, is_moe: bool, tp: int, etp: int, ep: int, sequence_parallel: bool,
    act_bytes: int = 2, imbalance: float = 1.0,
) -> ActivationModules:
    """Per token held by this GPU (after the SP split), bytes kept for backward by one layer."""
    h = model.hidden_size
    sp = tp if sequence_parallel else 1  # norm/residual tensors split over TP only with SP
    if model.multi_latent_attention:
        a = model.num_attention_heads
        qkv = a * (2 * (model.qk_head_dim + model.qk_pos_emb_head_dim) + model.v_head_dim)
        qkv += model.kv_lora_rank + (model.q_lora_rank or 0)
        o = a * model.v_head_dim
    else:
        qd = model.num_attention_heads * model.head_dim
        qkv = qd + 2 * model.query_groups * model.head_dim
        o = qd
    # Every term is per *local* token (T/sp tokens on this GPU).  Tensors inside a TP region are
    # gathered over the sequence (T tokens) but split over features (1/tp), hence the factor sp/tp.
    tp_region = sp / tp
    layernorm = act_bytes * h * 2  # the two norm outputs (GEMM inputs), kept SP-sharded
    attn_inputs = act_bytes * (h * 2 + (qkv + o) * tp_region)  # two norm inputs + Q/K/V + attention out
    core_attn = 4.0 * model.num_attention_heads * tp_region  # flash softmax statistics, fp32 per head
    glu = 2 if model.swiglu else 1
    mlp = moe_act = moe = shared = 0.0
    if is_moe:
        # k copies of each local token reach the experts; the ETP group all-gathers them (x etp) and
        # splits the expert FFN over etp.  `imbalance` is the busiest GPU over the mean.
        k = model.moe_router_topk * imbalance
        f = model.moe_ffn_size
        moe = act_bytes * k * (2 * h * etp + glu * f) + 4.0 * (model.num_experts or 1)  # + router fp32
        moe_act = act_bytes * k * f
        s_f = model.moe_shared_expert_intermediate_size or 0
        shared = act_bytes * (glu * s_f + s_f) * tp_region
    else:
        f = model.ffn_size
        mlp = act_bytes * (glu * f + f) * tp_region  # fc1 output and activation output
    layer_input = act_bytes * h
    return ActivationModules(
        layernorm=layernorm, attn_inputs=attn_inputs, core_attn=core_attn, mlp=mlp, moe_act=moe_act,
        moe=moe, shared_experts=shared, layer_input=layer_input,
    )
