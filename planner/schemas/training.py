"""TrainingSpec: batch, precision and optimizer/overlap settings of the run.

Field names follow Megatron-LM's argument names where one exists (`--fp8-recipe` -> `fp8_recipe`).
Every field here changes time or memory in the cost model (planner/cost/); flags that change
time or memory but are not modelled are named in planner/megatron/flags.py (`not_modelled`) instead.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from planner.schemas.types import StrictModel

Precision = Literal["bf16", "fp16", "fp8", "fp32"]
Fp8Recipe = Literal["delayed", "tensorwise", "blockwise", "mxfp8"]
OptimizerStateDtype = Literal["fp32", "fp16", "bf16", "fp8"]
CpCommType = Literal["p2p", "a2a", "allgather", "a2a+p2p"]
DpShardingStrategy = Literal["no_shard", "optim", "optim_grads", "optim_grads_params"]
AttentionBackend = Literal["auto", "flash", "fused", "unfused", "local"]

FP8_RECIPES: tuple[str, ...] = ("delayed", "tensorwise", "blockwise", "mxfp8")
"""Megatron's `--fp8-recipe` choices the cost model prices (its default is `delayed`)."""


class MegatronSettings(StrictModel):
    """Flags of the run that only Megatron's rules read (planner/megatron/rules.py): the cost model does
    not price them (flags.py names those that change time as not modelled).  Megatron's defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cp_comm_types: tuple[CpCommType, ...] = Field((), description="every value of --cp-comm-type (one, or one per layer)")
    hierarchical_context_parallel_sizes: tuple[int, ...] | None = Field(
        None, description="--hierarchical-context-parallel-sizes (their product is CP)")
    overlap_p2p_comm: bool = Field(True, description="False with --no-overlap-p2p-communication")
    overlap_param_gather_with_optimizer_step: bool = False
    num_distributed_optimizer_instances: int = Field(1, gt=0, description="--num-distributed-optimizer-instances")
    ckpt_format: str = Field("torch_dist", description="--ckpt-format")
    use_torch_fsdp2: bool = False
    transformer_impl: Literal["transformer_engine", "local", "inference_optimized"] = "transformer_engine"
    enable_cuda_graph: bool = Field(False, description="--enable-cuda-graph (TransformerConfig: --cuda-graph-impl local)")
    external_cuda_graph: bool = Field(False, description="--external-cuda-graph (TransformerConfig: transformer_engine)")
    moe_input_jitter_eps: float | None = None
    moe_enable_deepep: bool = Field(False, description="--moe-enable-deepep (needs --moe-token-dispatcher-type flex)")
    moe_router_load_balancing_types: tuple[str, ...] = Field(
        (), description="every value of --moe-router-load-balancing-type, when more than one")
    moe_aux_loss_coeffs: tuple[float, ...] = Field((), description="every value of --moe-aux-loss-coeff")
    distribute_saved_activations: bool = False
    defer_embedding_wgrad_compute: bool = Field(
        False, description="--defer-embedding-wgrad-compute (needs PP > 1: model_parallel_config.py)")
    overlap_p2p_comm_warmup_flush: bool = Field(
        False, description="--overlap-p2p-communication-warmup-flush (needs the interleaved schedule's p2p overlap)")
    cpu_offloading: bool = False
    check_for_nan_in_loss_and_grad: bool = Field(True, description="False with --no-check-for-nan-in-loss-and-grad")


class TrainingSpec(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    micro_batch_size: int = Field(1, gt=0, description="--micro-batch-size (per DP rank of stage 0)")
    global_batch_size: int = Field(gt=0, description="--global-batch-size")
    precision: Precision = "bf16"
    fp8_recipe: Fp8Recipe = Field(
        "delayed", description="--fp8-recipe; only read when precision is fp8 (FP8 GEMMs, BF16 everything else)"
    )
    fp8_param_gather: bool = Field(False, description="--fp8-param-gather: FP8 weights, FP8 parameter all-gather")
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    grad_reduce_in_bf16: bool = Field(False, description="--grad-reduce-in-bf16: BF16 gradient buffer and reduce")
    use_precision_aware_optimizer: bool = False
    main_params_dtype: Literal["fp32", "fp16"] = Field(
        "fp32", description="--main-params-dtype (read only with --use-precision-aware-optimizer, as Megatron does)"
    )
    main_grads_dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="--main-grads-dtype (with --use-precision-aware-optimizer): bf16 keeps the gradient buffer "
        "and its reduction in BF16, as --grad-reduce-in-bf16 does (validate_args then leaves gradient accumulation in "
        "FP32 off)"
    )
    exp_avg_dtype: OptimizerStateDtype = Field("fp32", description="--exp-avg-dtype (Adam first moment)")
    exp_avg_sq_dtype: OptimizerStateDtype = Field("fp32", description="--exp-avg-sq-dtype (Adam second moment)")
    overlap_moe_expert_parallel_comm: bool = Field(
        False, description="--overlap-moe-expert-parallel-comm: EP all-to-all hidden behind another micro-batch"
    )
    delay_wgrad_compute: bool = Field(False, description="--delay-wgrad-compute (widens the EP overlap window)")
    moe_shared_expert_overlap: bool = Field(False, description="--moe-shared-expert-overlap")
    cp_comm_type: CpCommType = Field("p2p", description="--cp-comm-type: p2p (ring), a2a (Ulysses), allgather")
    cuda_graph_impl: Literal["none", "local", "transformer_engine", "full_iteration"] = Field(
        "none", description="--cuda-graph-impl: per-layer CUDA graphs (local, transformer_engine) or the whole iteration")
    cuda_graph_scope: tuple[str, ...] = Field(
        (), description="--cuda-graph-scope / --cuda-graph-modules: the captured modules (attn, mlp, moe, moe_router,"
        " moe_preprocess, mamba, full); empty with an implementation: the whole layer")
    use_megatron_fsdp: bool = Field(False, description="--use-megatron-fsdp: Megatron-FSDP data parallelism")
    data_parallel_sharding_strategy: DpShardingStrategy = Field(
        "no_shard", description="--data-parallel-sharding-strategy (with --use-megatron-fsdp): no_shard, optim (ZeRO-1),"
        " optim_grads (ZeRO-2), optim_grads_params (ZeRO-3)")
    attention_backend: AttentionBackend = Field(
        "auto", description="--attention-backend: unfused and local keep the s x s softmax output per layer"
    )
    hidden_dropout: float = Field(
        0.1, ge=0.0, le=1.0, description="--hidden-dropout (Megatron's default 0.1): 1-byte masks of bias-dropout-add"
    )
    attention_dropout: float = Field(
        0.1, ge=0.0, le=1.0, description="--attention-dropout (Megatron's default 0.1): a mask and a copy of the "
        "softmax output with unfused attention (fused and flash kernels regenerate the mask)"
    )
    cross_entropy_loss_fusion: bool = Field(
        False, description="--cross-entropy-loss-fusion (Megatron's default: off): without it the last stage's "
        "allocator reserves one more FP32 copy of a micro-batch's logits per loss head (planner/cost/memory.py "
        "loss_reserved_bytes)")
    expandable_segments: bool | None = Field(
        None, description="torch's caching allocator with expandable segments (PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True in the launcher's environment), which caches less beyond what it allocates; None:"
        " not stated (planner/cost/memory.py EXPANDABLE_SEGMENTS_ASSUMED)")
    unpriced_flags: tuple[str, ...] = Field(
        (), description="the run's flags that change time without a price in the cost model (planner/megatron/flags.py"
        " UNPRICED_IN), sorted: where no calibration run had one, the mechanisms it changes are outside the measured"
        " region (planner/cost/mechanisms.py)")
    megatron: MegatronSettings = Field(default_factory=MegatronSettings,
                                       description="flags only Megatron's rules read (not priced)")
    moe_imbalance_factor: float | None = Field(
        None,
        ge=1.0,
        description="max tokens per expert over the mean; None: 1.0 with forced balancing, else the"
        " routing model's value (planner/cost/dispatch.py)",
    )

    @property
    def activation_bytes(self) -> int:
        """Bytes per activation element: BF16/FP16 (FP8 training keeps activations and communication
        in BF16; only GEMM inputs are cast), FP32 for fp32 runs."""
        return 4 if self.precision == "fp32" else 2

    @property
    def unfused_attention(self) -> bool:
        """Attention computed as explicit matmuls and a softmax (`--attention-backend unfused` or `local`)."""
        return self.attention_backend in ("unfused", "local")

    @property
    def compute_dtype(self) -> str:
        """The dtype of everything that is not an FP8 GEMM (attention core, logits, elementwise)."""
        return "bf16" if self.precision == "fp8" else self.precision
