"""Memory per GPU of a pipeline stage, component by component as Megatron allocates it.

Static, per parameter held by the GPU (`ParamBytes`):
* weights: BF16/FP16 (2 bytes); with FP8 training Transformer Engine also keeps an FP8 copy and its transpose
  of every linear weight (+2), unless `--fp8-param-gather`, where the FP8 weight and its transpose replace
  the BF16 one (2 in all);
* gradients: the FP32 main-grad buffer (4; Megatron accumulates BF16 runs' gradients in FP32), 2 with
  `--grad-reduce-in-bf16` or FP16;
* optimizer (Adam): FP32 master weights + two moments (12), or the dtypes of `--main-params-dtype`,
  `--exp-avg-dtype`, `--exp-avg-sq-dtype` under `--use-precision-aware-optimizer`; sharded over the
  data-parallel group (dense) and the expert-data-parallel group (experts) by the distributed optimizer.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models") with sequence parallelism and flash attention, written module by module so that each
`--recompute-modules` entry (`core_attn`, `layernorm`, `mlp`, `moe_act`, `moe`, `shared_experts`,
`mla_up_proj`) drops exactly what it recomputes.  Bytes per token of one micro-batch held by one GPU (after the
sequence-parallel split).  Under FP8 the inputs of FP8 GEMMs are saved as the quantised FP8 tensor (1 byte).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.schemas.model import ModelSpec
from planner.schemas.training import TrainingSpec

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
ROUTER_PROB_BYTES = 4  # FP32 router logits/probabilities kept per token per expert


@dataclass(frozen=True)
class ParamBytes:
    """Bytes per parameter held by one GPU, before optimizer sharding (see the module docstring)."""

    weight: float
    linear_weight: float  # weights of FP8-capable linear layers (extra FP8 copies under FP8)
    grad: float
    optimizer: float  # master weights + moments, for one full (unsharded) parameter
    optimizer_step_moved: float  # HBM bytes the Adam step moves per parameter of the local shard

    @classmethod
    def of(cls, training: TrainingSpec) -> "ParamBytes":
        weight = 4.0 if training.precision == "fp32" else 2.0
        linear = weight
        if training.precision == "fp8":
            linear = 2.0 if training.fp8_param_gather else weight + 2.0
        if training.precision == "fp16" or training.grad_reduce_in_bf16:
            grad = 2.0
        else:
            grad = 4.0
        if training.use_precision_aware_optimizer:
            master = DTYPE_BYTES[training.main_params_dtype]
            m, v = DTYPE_BYTES[training.exp_avg_dtype], DTYPE_BYTES[training.exp_avg_sq_dtype]
        else:
            master, m, v = 4.0, 4.0, 4.0
        # Adam step: read master, grad, m, v; write master, m, v and the model weight
        moved = 2 * master + grad + 2 * m + 2 * v + weight
        return cls(weight=weight, linear_weight=linear, grad=grad, optimizer=master + m + v, optimizer_step_moved=moved)


@dataclass(frozen=True)
class ActivationModules:
    """Activation bytes per local token a layer keeps for backward, split by recompute module."""

    layernorm: float  # norm outputs (inputs of the QKV and FC1 GEMMs); dropped by `layernorm`
    attn_inputs: float  # norm inputs + Q/K/V + attention output (kept unless full recompute)
    mla_up_proj: float  # MLA's up-projected Q/K/V (part of attn_inputs); dropped by `mla_up_proj`
    core_attn: float  # what core attention keeps beyond Q/K/V/O (flash: softmax statistics)
    mlp: float  # dense MLP internals (FC1 out, activation out); dropped by `mlp`
    moe_act: float  # expert activation outputs; dropped by `moe_act` (and `moe`)
    moe: float  # rest of the MoE block (dispatched inputs, FC1 out, router probabilities)
    shared_experts: float  # shared-expert internals
    layer_input: float  # what full recompute keeps: the layer's input

    @property
    def total(self) -> float:
        return (self.layernorm + self.attn_inputs + self.core_attn + self.mlp + self.moe_act + self.moe
                + self.shared_experts)

    def after_selective(self, modules: tuple[str, ...]) -> float:
        """Bytes kept when the given modules are recomputed (their inputs are kept elsewhere)."""
        dropped = set(modules)
        kept = self.total
        if "layernorm" in dropped:
            kept -= self.layernorm
        if "mla_up_proj" in dropped:
            kept -= self.mla_up_proj
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
    model: ModelSpec, training: TrainingSpec, *, is_moe: bool, tp: int, etp: int, sequence_parallel: bool,
    copies_per_token: float = 0.0,
) -> ActivationModules:
    """Per token held by this GPU (after the SP split), bytes one layer keeps for backward.
    `copies_per_token`: MoE token copies this GPU's experts compute per local token (planner/cost/dispatch.py)."""
    act = training.activation_bytes
    gemm_in = 1 if training.precision == "fp8" else act  # FP8 GEMM inputs are saved quantised
    h = model.hidden_size
    sp = tp if sequence_parallel else 1  # norm/residual tensors split over TP only with SP
    tp_region = sp / tp  # inside a TP region tensors are gathered over the sequence, split over features
    a = model.num_attention_heads
    if model.multi_latent_attention:
        up = a * (2 * (model.qk_head_dim + model.qk_pos_emb_head_dim) + model.v_head_dim)  # Q, K, V
        latents = model.kv_lora_rank + model.qk_pos_emb_head_dim + (model.q_lora_rank or 0)
        qkv, mla_up = up * tp_region + latents, up * tp_region
        o = a * model.v_head_dim
    else:
        qkv = (a * model.head_dim + 2 * model.query_groups * model.head_dim) * tp_region
        mla_up, o = 0.0, a * model.head_dim
    layernorm = gemm_in * h * 2  # the two norm outputs (GEMM inputs), SP-sharded
    attn_inputs = act * (h * 2 + qkv) + gemm_in * o * tp_region  # norm inputs, Q/K/V, attention output
    core_attn = 4.0 * a * tp_region  # flash-attention softmax statistics, FP32 per head
    glu = 2 if model.swiglu else 1
    mlp = moe_act = moe = shared = 0.0
    if is_moe:
        f = model.moe_ffn_size / etp
        c = copies_per_token
        # dispatched FC1 input and FC1 output per token copy; the router probabilities are applied inside
        # the expert activation (TEGroupedMLP), so the expert output is not kept
        moe = c * (gemm_in * h + act * glu * f) + ROUTER_PROB_BYTES * (model.num_experts or 1)
        moe_act = c * gemm_in * f
        s_f = model.moe_shared_expert_intermediate_size or 0
        shared = (act * glu * s_f + gemm_in * s_f) * tp_region
    else:
        f = model.ffn_size
        mlp = (act * glu * f + gemm_in * f) * tp_region  # FC1 output and activation output
    return ActivationModules(
        layernorm=layernorm, attn_inputs=attn_inputs, mla_up_proj=act * mla_up, core_attn=core_attn, mlp=mlp,
        moe_act=moe_act, moe=moe, shared_experts=shared, layer_input=act * h,
    )
