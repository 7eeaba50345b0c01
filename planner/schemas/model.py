"""ModelSpec: the transformer's shape, in Megatron-LM's own terms.

Field names follow Megatron's argument names (`num_layers`, `hidden_size`, ...), so a flag
`--foo-bar` maps to the field `foo_bar`.  Defaults follow Megatron's defaults
(reference/megatron.md section 1.7): ffn size 4h (or int(8h/3/64)*64 with SwiGLU), kv-channels
h/heads, query groups = heads unless group-query attention is on, vocab padded to a multiple
of 128*TP.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from planner.schemas.types import MAX_EXPERTS, DisplayText, StrictModel

DispatcherName = Literal["allgather", "alltoall", "flex"]
FlexBackend = Literal["deepep", "hybridep"]
LoadBalancingType = Literal["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"]
PositionEmbeddingType = Literal["learned_absolute", "rope", "yarn", "mrope", "relative", "none"]
ScoreFunction = Literal["softmax", "sigmoid", "sqrtsoftplus"]
AUX_LOSS_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss")
AUX_LOSS_ASSUMED = 1e-2
"""--moe-aux-loss-coeff of a model description that is not a Megatron command (a preset, an HF config.json, a model
YAML) whose router balances with an auxiliary loss (and no expert bias) but states no coefficient: Megatron-LM's MoE
examples use 1e-2.  Priced (planner/cost/dispatch.py), written into the launcher the planner generates for it, and
reported as assumed.  Megatron flags (`--megatron-args`, `--megatron-script`) always state one: Megatron's default 0.0
where they leave the flag out (planner/inputs/megatron_flags.py), which the run trains with, so the launcher keeps
it and the cost model prices it."""


class ModelSpec(StrictModel):
    """A GPT-style (dense or MoE) decoder as Megatron-LM builds it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: DisplayText = Field("custom", description="preset or file name, for reports (no control character)")
    num_layers: int = Field(gt=0, description="decoder layers (--num-layers)")
    hidden_size: int = Field(gt=0, description="--hidden-size")
    ffn_hidden_size: int | None = Field(None, gt=0, description="dense MLP size; None: Megatron default")
    num_attention_heads: int = Field(gt=0)
    num_query_groups: int | None = Field(None, gt=0, description="GQA groups; None: = heads (MHA)")
    kv_channels: int | None = Field(None, gt=0, description="head dim; None: hidden/heads")
    vocab_size: int = Field(gt=0, description="unpadded vocabulary")
    make_vocab_size_divisible_by: int = Field(128, gt=0)
    seq_length: int = Field(4096, gt=0)
    max_position_embeddings: int | None = Field(None, gt=0)
    # positions: Megatron's default is a learned absolute table of max_position_embeddings x hidden
    position_embedding_type: PositionEmbeddingType = Field(
        "learned_absolute", description="--position-embedding-type (Megatron's default: learned_absolute)"
    )
    rotary_base: int = Field(10000, gt=0, description="--rotary-base (RoPE theta)")
    rotary_percent: float = Field(1.0, gt=0.0, le=1.0, description="--rotary-percent: share of the head dim rotated")
    use_rope_scaling: bool = Field(False, description="--use-rope-scaling: Llama-3.x frequency scaling")
    rope_scaling_factor: float = Field(8.0, gt=0.0, description="--rope-scaling-factor (with --use-rope-scaling)")
    rotary_scaling_factor: float = Field(1.0, gt=0.0, description="--rotary-scaling-factor: YaRN factor of MLA")
    mscale: float = Field(1.0, description="--mscale: YaRN attention scale of MLA")
    mscale_all_dim: float = Field(0.0, description="--mscale-all-dim: YaRN attention scale of MLA")
    # activation: at most one of these; none is GeLU
    swiglu: bool = False
    quick_geglu: bool = Field(False, description="--quick-geglu: gated, quick-GeLU (gpt-oss)")
    squared_relu: bool = Field(False, description="--squared-relu: not gated")
    activation_func_clamp_value: float | None = Field(
        None, gt=0.0, description="--activation-func-clamp-value: the gated activation's inputs clamped (gpt-oss: 7.0)")
    apply_rope_fusion: bool = Field(
        True, description="--no-rope-fusion sets False: RoPE as eager PyTorch ops, not Transformer Engine's fused kernel")
    # sliding-window attention (gpt-oss): Megatron's is_layer_window_attention
    window_size: tuple[int, int] | None = Field(
        None, description="--window-size (left, right): keys each query sees besides itself; None: full attention")
    window_attn_skip_freq: int | tuple[int, ...] | None = Field(
        None, description="--window-attn-skip-freq: int N (layer n, 1-based, is windowed unless n % N == 0) or one "
                          "0/1 per layer (1 = windowed); None: every layer windowed (with --window-size)")
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    norm_epsilon: float = Field(1e-5, gt=0.0, description="--norm-epsilon")
    untie_embeddings_and_output_weights: bool = False
    add_bias_linear: bool = True
    add_qkv_bias: bool = Field(False, description="--add-qkv-bias: biases on Q, K, V only (Qwen2)")
    qk_layernorm: bool = Field(False, description="--qk-layernorm (with MLA: the q/kv latent norms)")
    # Multi-latent attention (DeepSeek-V2/V3)
    multi_latent_attention: bool = False
    q_lora_rank: int | None = Field(None, gt=0)
    kv_lora_rank: int = Field(512, gt=0)
    qk_head_dim: int = Field(128, gt=0)
    qk_pos_emb_head_dim: int = Field(64, ge=0)
    v_head_dim: int = Field(128, gt=0)
    # Mixture of experts
    num_experts: int | None = Field(None, gt=0, description="None: dense model")
    moe_router_topk: int = Field(2, gt=0)
    moe_ffn_hidden_size: int | None = Field(None, gt=0, description="None: = ffn_hidden_size")
    moe_shared_expert_intermediate_size: int | None = Field(None, gt=0)
    moe_shared_expert_gate: bool = Field(False, description="--moe-shared-expert-gate: sigmoid gate on the shared expert")
    moe_layer_pattern: tuple[int, ...] | None = Field(
        None, description="1 = MoE layer, 0 = dense, one per layer; None: every layer is MoE"
    )
    moe_expert_capacity_factor: float | None = Field(
        None, gt=0, le=MAX_EXPERTS,
        description="--moe-expert-capacity-factor; above the experts' count no expert can overflow (a typo such as "
                    "1e308 overflows Megatron's capacity)")
    moe_token_dispatcher_type: DispatcherName = "allgather"
    moe_flex_dispatcher_backend: FlexBackend = Field("deepep", description="--moe-flex-dispatcher-backend")
    moe_pad_expert_input_to_capacity: bool = Field(
        False, description="--moe-pad-expert-input-to-capacity: every expert computes its full capacity"
    )
    moe_router_load_balancing_type: LoadBalancingType = "aux_loss"
    moe_aux_loss_coeff: float | None = Field(
        None, ge=0.0, description="--moe-aux-loss-coeff (the sum, for several balancing types); None: not stated "
                                  "by a preset, HF config or model YAML (see trained_aux_loss_coeff); Megatron flags "
                                  "state Megatron's default 0.0 when they leave it out")
    moe_router_num_groups: int | None = Field(None, gt=0, description="--moe-router-num-groups (group-limited routing)")
    moe_router_group_topk: int | None = Field(None, gt=0, description="--moe-router-group-topk: groups a token may use")
    moe_router_enable_expert_bias: bool = Field(
        False, description="--moe-router-enable-expert-bias: auxiliary-loss-free balancing (DeepSeek-V3)"
    )
    moe_router_score_function: ScoreFunction = Field("softmax", description="--moe-router-score-function")
    moe_router_pre_softmax: bool = Field(
        False, description="--moe-router-pre-softmax: scores over all experts, then top-k (Megatron needs it for top-1)"
    )
    moe_router_topk_scaling_factor: float | None = Field(None, gt=0.0, description="--moe-router-topk-scaling-factor")
    moe_router_dtype: Literal["fp32", "fp64"] | None = Field(None, description="--moe-router-dtype")
    moe_grouped_gemm: bool = False
    moe_router_force_load_balancing: bool = False
    mtp_num_layers: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}) when kv_channels is unset"
            )
        g = self.num_query_groups
        if g is not None and self.num_attention_heads % g:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_query_groups ({g})"
            )
        if self.num_experts is not None:
            if self.moe_router_topk > self.num_experts:
                raise ValueError(
                    f"moe_router_topk ({self.moe_router_topk}) exceeds num_experts ({self.num_experts})"
                )
        if self.moe_layer_pattern is not None:
            if len(self.moe_layer_pattern) != self.num_layers:
                raise ValueError(
                    f"moe_layer_pattern has {len(self.moe_layer_pattern)} entries, expected "
                    f"num_layers={self.num_layers}"
                )
            if any(v not in (0, 1) for v in self.moe_layer_pattern):
                raise ValueError(f"Invalid layer pattern: {list(self.moe_layer_pattern)} (entries must be 0, dense, or "
                                 "1, MoE)")
        if self.window_size is not None and (self.window_size[0] < -1 or self.window_size[1] < -1):
            raise ValueError(f"window_size {self.window_size}: each side is -1 (unbounded) or a number of tokens >= 0")
        freq = self.window_attn_skip_freq
        if isinstance(freq, int) and freq < 1:
            raise ValueError(f"window_attn_skip_freq must be a positive integer, got {freq}")
        if isinstance(freq, tuple) and (len(freq) != self.num_layers or any(v not in (0, 1) for v in freq)):
            raise ValueError(f"window_attn_skip_freq: one 0 (full) or 1 (windowed) per layer, {self.num_layers} "
                             f"entries, got {list(freq)}")
        if sum((self.swiglu, self.quick_geglu, self.squared_relu)) > 1:
            raise ValueError("swiglu, quick_geglu and squared_relu are activations: give at most one")
        if self.max_position_embeddings is not None and self.max_position_embeddings < self.seq_length:
            raise ValueError(
                f"max_position_embeddings ({self.max_position_embeddings}) must be greater than or equal to "
                f"seq_length ({self.seq_length})."
            )
        return self

    # ---- derived quantities (Megatron's defaults) ----
    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def aux_loss_coeff_assumed(self) -> bool:
        """No coefficient stated where the router balances with an auxiliary loss alone."""
        return (self.moe_aux_loss_coeff is None and self.moe_router_load_balancing_type in AUX_LOSS_BALANCING
                and not self.moe_router_enable_expert_bias)

    @property
    def trained_aux_loss_coeff(self) -> float:
        """The --moe-aux-loss-coeff the run trains with, which the cost model prices and the launcher
        writes: the stated one, else AUX_LOSS_ASSUMED where aux_loss_coeff_assumed, else Megatron's 0.0."""
        if self.moe_aux_loss_coeff is not None:
            return self.moe_aux_loss_coeff
        return AUX_LOSS_ASSUMED if self.aux_loss_coeff_assumed else 0.0

    @property
    def unbalanced_routing(self) -> bool:
        """A MoE router that nothing pulls toward balance: no auxiliary loss (coefficient 0, Megatron's default, or
        load balancing 'none'), no expert bias, no Sinkhorn, no forced balance."""
        if not self.is_moe or self.moe_router_force_load_balancing or self.moe_router_enable_expert_bias:
            return False
        lb = self.moe_router_load_balancing_type
        return lb == "none" or (lb in AUX_LOSS_BALANCING and self.trained_aux_loss_coeff == 0.0)

    @property
    def gated_linear_unit(self) -> bool:
        """The MLP's first matrix is doubled (SwiGLU, quick-GeGLU): three weight matrices, not two."""
        return self.swiglu or self.quick_geglu

    @property
    def clamped_quick_geglu(self) -> bool:
        """Routed experts run a quick-GEGLU whose inputs are clamped (gpt-oss: --quick-geglu
        --activation-func-clamp-value 7.0), an eager clamp before the compiled activation (planner/cost/layer.py
        QUICK_GEGLU_CLAMP_PASSES)."""
        return self.is_moe and self.quick_geglu and self.activation_func_clamp_value is not None

    @property
    def ffn_size(self) -> int:
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        if self.swiglu:
            return int(8 * self.hidden_size / 3 / 64) * 64
        return 4 * self.hidden_size

    @property
    def moe_ffn_size(self) -> int:
        return self.moe_ffn_hidden_size if self.moe_ffn_hidden_size is not None else self.ffn_size

    @property
    def query_groups(self) -> int:
        return self.num_query_groups if self.num_query_groups is not None else self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    @property
    def layer_is_moe(self) -> tuple[bool, ...]:
        """Per decoder layer: True where the MLP is a routed-expert layer."""
        if not self.is_moe:
            return (False,) * self.num_layers
        if self.moe_layer_pattern is None:
            return (True,) * self.num_layers
        return tuple(bool(v) for v in self.moe_layer_pattern)

    @property
    def layer_is_windowed(self) -> tuple[bool, ...]:
        """Per decoder layer: True where its attention is sliding-window (Megatron-LM @2edffadb
        megatron/core/transformer/utils.py `is_layer_window_attention`, layer numbers from 1): every layer with
        --window-size and no --window-attn-skip-freq; with an int N, the layers whose number is not a multiple
        of N; with a list, the layers marked 1.  A window of (-1, *) is no window."""
        if self.window_size is None or self.window_size[0] < 0:
            return (False,) * self.num_layers
        freq = self.window_attn_skip_freq
        if freq is None:
            return (True,) * self.num_layers
        if isinstance(freq, int):
            return tuple((n + 1) % freq != 0 for n in range(self.num_layers))
        return tuple(bool(v) for v in freq)

    def padded_vocab_size(self, tp: int) -> int:
        """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by * TP."""
        multiple = self.make_vocab_size_divisible_by * tp
        return int(math.ceil(self.vocab_size / multiple) * multiple)


def moe_pattern_from_freq(freq: int | str | list[int], num_layers: int) -> tuple[int, ...]:
    """Megatron's --moe-layer-freq: int N (layer i is MoE when i % N == 0) or a list expression
    such as "([0]+[1]*23)" (only the characters ,digits[]()+* are allowed)."""
    if isinstance(freq, int):
        if freq == 0:  # Megatron's `i % moe_layer_freq` divides by it
            raise ValueError("moe-layer-freq must not be 0 (layer i is MoE when i % N == 0)")
        # as Megatron computes it: a negative N picks the layers |N| does (MindSpeed-LLM's -1: every layer)
        return tuple(1 if i % freq == 0 else 0 for i in range(num_layers))
    if isinstance(freq, list):
        pattern = freq
    else:
        text = str(freq).strip()
        if text.lstrip("-").isdigit():
            return moe_pattern_from_freq(int(text), num_layers)
        if not text or "**" in text or any(c not in ",0123456789[]()+*" for c in text):
            raise ValueError(
                f"moe-layer-freq {text!r}: expected an int or a list expression like ([0]+[1]*23) "
                "using only the characters ,digits[]()+*"
            )
        try:
            pattern = eval(text, {"__builtins__": {}}, {})  # noqa: S307 - characters restricted above
        except Exception as exc:  # SyntaxError, TypeError
            raise ValueError(f"moe-layer-freq {text!r} is not a valid list expression: {exc}") from None
        if not isinstance(pattern, list):
            raise ValueError(f"moe-layer-freq {text!r} does not evaluate to a list")
    if len(pattern) != num_layers:  # Megatron's words (gpt_layer_specs, when it builds the model)
        raise ValueError(
            f"Invalid length of moe_layer_pattern: {len(pattern)}, expected {num_layers}, current moe layer "
            f"pattern: {freq}"
        )
    return tuple(int(v) for v in pattern)
