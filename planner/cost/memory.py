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
Beyond Korthikanti's flash-attention count:
* dropout masks: with `--hidden-dropout` > 0 (Megatron's default 0.1) each of the layer's two bias-dropout-add
  steps keeps a 1-byte mask of its [s, b, h] input (Korthikanti's "sbh" mask terms; Megatron's own theoretical
  memory report counts them);
* Q/K norms (`--qk-layernorm`, attention other than MLA): the two norms' saved inputs and statistics
  (`qk_norm_bytes_per_token`);
* unfused attention (`--attention-backend unfused` or `local`): the core keeps the BF16 softmax output,
  b x heads/TP x s x s (2 bytes an element), and with `--attention-dropout` > 0 also the dropout mask (1 byte)
  and the dropped-out copy (2 bytes): Korthikanti's 5as^2b.  Flash and fused kernels keep only the softmax
  statistics and regenerate the dropout mask from the RNG state.  While a layer's attention runs, the raw scores
  and the softmax gradient add two more s x s tensors (`attention_transient_bytes`).
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
        bf16_main_grads = training.main_grads_dtype == "bf16" and training.precision in ("bf16", "fp8")
        if training.precision == "fp16" or training.grad_reduce_in_bf16 or bf16_main_grads:
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
    dropout_masks: float = 0.0  # bias-dropout-add masks (kept unless full recompute)
    qk_norm: float = 0.0  # --qk-layernorm: the Q and K norms' saved inputs and statistics (kept unless full recompute)

    @property
    def total(self) -> float:
        return (self.layernorm + self.attn_inputs + self.core_attn + self.mlp + self.moe_act + self.moe
                + self.shared_experts + self.dropout_masks + self.qk_norm)

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


def core_attention_bytes_per_token(model: ModelSpec, training: TrainingSpec, *, tp_region: float,
                                   seq_length: int) -> float:
    """Bytes the attention core keeps per local token: flash/fused kernels the FP32 softmax statistics per
    head; unfused attention each query's row of the s x s softmax output per head (see the module docstring)."""
    heads = model.num_attention_heads * tp_region
    if not training.unfused_attention:
        return 4.0 * heads
    per_element = training.activation_bytes + (1 + training.activation_bytes if training.attention_dropout else 0)
    return per_element * heads * seq_length


QK_NORM_STATISTICS_BYTES = {"RMSNorm": 4, "LayerNorm": 8}
"""FP32 statistics Transformer Engine's norm saves per normalised row: RMSNorm the reciprocal RMS, LayerNorm the mean
too (TransformerEngine@d0067d0 transformer_engine/pytorch/ops/basic/rmsnorm.py:209, layer_norm.py:228)."""


def qk_norm_bytes_per_token(model: ModelSpec, training: TrainingSpec, *, tp_region: float) -> float:
    """Bytes per local token the Q and K norms of `--qk-layernorm` keep for backward, beyond Korthikanti's Q/K/V (0
    without the flag, and for MLA, whose latent norms are another module).

    Megatron-LM@d98e8a64 megatron/core/transformer/attention.py: with `qk_layernorm` the norms are Transformer
    Engine's (TENorm, :1714), one per head (`hidden_size_per_attention_head`, :1734-1750), applied to Q and K after the
    QKV GEMM's output is split (:1913) and Q reshaped to heads (:1918): `query = apply_module(self.q_layernorm)(query)`
    (:1933), the same for K (:1936).  Transformer Engine's norm op saves a contiguous copy of its input and its FP32
    statistics per row (TransformerEngine@d0067d0 transformer_engine/pytorch/ops/basic/rmsnorm.py:189
    `x = maybe_dequantize(input_.contiguous(), ...)`, :209 `ctx.save_for_backward(x, rstdevs)`; layer_norm.py:206,
    :228 with the means): Q and K are strided views of the QKV output (Q copied by the reshape where a group has
    more than one head), so the saved inputs are new tensors of Q's and K's size in the activation dtype.  Their
    normed outputs go through RoPE (the fused kernel saves no input) into the attention core, which keeps its own
    Q/K/V (counted in `attn_inputs`).  Per local token: activation bytes x (heads + query groups) x head_dim, and
    QK_NORM_STATISTICS_BYTES per head row, inside the TP region.  Kept unless the whole layer is recomputed (the
    `layernorm` recompute module covers the input and pre-MLP norms only).

    Calibration rows (planner/calibration/published/measured_memory.csv) with the flag: LAION's open-sci-ref 1.7B
    (`A100-laion-osr-1.7b-dp252-rcsel`, MHA, 24 layers: 3.0 GiB, allocated peak -5.0% without it), Megatron-Bridge's
    Qwen3-30B-A3B HybridEP run and ms-swift's Qwen3-30B-A3B SFT (GQA 32/4)."""
    if not model.qk_layernorm or model.multi_latent_attention:
        return 0.0
    heads = model.num_attention_heads + model.query_groups
    per_head = training.activation_bytes * model.head_dim + QK_NORM_STATISTICS_BYTES[model.normalization]
    return heads * per_head * tp_region


def attention_transient_bytes(model: ModelSpec, training: TrainingSpec, *, tp: int, gathered_tokens: float,
                              seq_length: int) -> float:
    """Unfused attention: the raw scores and the softmax gradient, two s x s tensors per head of this GPU,
    alive while one layer's attention runs (0 for flash and fused kernels)."""
    if not training.unfused_attention:
        return 0.0
    return 2 * training.activation_bytes * model.num_attention_heads / tp * gathered_tokens * seq_length


def activation_bytes_per_token(
    model: ModelSpec, training: TrainingSpec, *, is_moe: bool, tp: int, etp: int, sequence_parallel: bool,
    copies_per_token: float = 0.0, seq_length: int | None = None,
) -> ActivationModules:
    """Per token held by this GPU (after the SP split), bytes one layer keeps for backward.
    `copies_per_token`: MoE token copies this GPU's experts compute per local token (planner/cost/dispatch.py);
    `seq_length`: the keys each query attends to (the model's sequence by default)."""
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
    core_attn = core_attention_bytes_per_token(model, training, tp_region=tp_region,
                                               seq_length=seq_length or model.seq_length)
    glu = 2 if model.gated_linear_unit else 1  # FC1 output: gate and up
    mlp = moe_act = moe = shared = 0.0
    if is_moe:
        f = model.moe_ffn_size / etp
        c = copies_per_token
        # dispatched FC1 input and FC1 output per token copy; the router probabilities are applied inside
        # the expert activation (TEGroupedMLP), so the expert output is not kept
        moe = c * (gemm_in * h + act * glu * f) + ROUTER_PROB_BYTES * (model.num_experts or 1)
        moe_act = c * gemm_in * f
        if model.clamped_quick_geglu:  # the clamped copy of the FC1 output the compiled activation saves
            moe_act += c * act * glu * f
        s_f = model.moe_shared_expert_intermediate_size or 0
        shared = (act * glu * s_f + gemm_in * s_f) * tp_region
    else:
        f = model.ffn_size
        mlp = (act * glu * f + gemm_in * f) * tp_region  # FC1 output and activation output
    return ActivationModules(
        layernorm=layernorm, attn_inputs=attn_inputs, mla_up_proj=act * mla_up, core_attn=core_attn, mlp=mlp,
        moe_act=moe_act, moe=moe, shared_experts=shared, layer_input=act * h,
        dropout_masks=2.0 * h if training.hidden_dropout else 0.0,  # two 1-byte masks of [s/SP, b, h]
        qk_norm=qk_norm_bytes_per_token(model, training, tp_region=tp_region),
    )


# --------------------------------------------------------------------------------------------- outside torch

COMM_BUFFER_GIB = {
    "NVIDIA": 0.67,
    "AMD": 0.67,
    "Intel": 0.67,
    "Huawei": 0.39,
}
"""GPU memory one collective-communication communicator takes on a rank, by vendor (GiB):
* NVIDIA (NCCL): NVIDIA/nccl#964 measured 544 MB for a 2-rank and 688 MB for a larger communicator on four
  NVLink A100s after one all-reduce (688 MB = 0.67 GiB taken for every group); NCCL's maintainer (NVIDIA/nccl#864,
  #986) says the memory grows with the channels (more to reach H100 NVLink bandwidth) and no longer with the
  group beyond 2 nodes, and that every communicator has its own unless created with shared resources;
* AMD (RCCL, NCCL's port) and Intel (HCCL on Gaudi): assumed as NCCL;
* Huawei (HCCL on Ascend): 2 x HCCL_BUFFSIZE, default 200 MB each (CANN environment-variable reference,
  HCCL_BUFFSIZE: "each communicator occupies 2 x HCCL_BUFFSIZE memory").
None of this is inside torch's allocated memory (what Megatron's `mem-max-allocated` reports)."""
COMM_BUFFER_DEFAULT_GIB = 0.67


def process_groups(*, tp: int, cp: int, dp: int, pp: int, ep: int, etp: int, moe: bool,
                   tied_embedding_stage: bool) -> tuple[str, ...]:
    """The communicators one rank of a stage creates during training under Megatron (PyTorch creates a
    group's NCCL communicator at its first collective): the world (start-up barrier), and each group of more
    than one rank it communicates over: tensor, context, pipeline (p2p), data (gradient reduce-scatter and
    parameter all-gather over DP x CP), expert (token all-to-all), expert-data (expert gradients), expert-tensor
    (when ETP differs from TP), model (TP x PP: gradient norm and loss), embedding (tied word embeddings on
    the first and last stage)."""
    if tp * cp * dp * pp == 1:
        return ()  # one process: no communicator
    groups = ["world"]
    named = (("tensor", tp > 1), ("context", cp > 1), ("pipeline", pp > 1), ("data", dp * cp > 1),
             ("expert", moe and ep > 1), ("expert-data", moe and tp * cp * dp // max(1, ep * etp) > 1),
             ("expert-tensor", moe and etp > 1 and etp != tp), ("model", tp > 1 and pp > 1),
             ("embedding", tied_embedding_stage and pp > 1))
    groups += [name for name, used in named if used]
    return tuple(groups)


def comm_buffer_bytes(vendor: str, groups: tuple[str, ...]) -> float:
    """Bytes of communicator buffers one rank holds (COMM_BUFFER_GIB per group)."""
    return len(groups) * COMM_BUFFER_GIB.get(vendor, COMM_BUFFER_DEFAULT_GIB) * 2**30


# ------------------------------------------------------------------- torch-allocated memory the terms do not name

UNITEMISED_ALLOCATED_GIB = 0.74
"""Memory torch's allocator holds at the peak beyond the itemised terms (weights, gradients, optimizer state,
activations), per GPU, GiB: one constant for every stage.  Fitted (planner/calibration/memory.py
`fit_unitemised_gib`: the median over the measured allocated peaks of measured minus itemised; `python -m
planner.calibration.report` prints it beside the shipped value and its leave-one-source-out errors).  Before it
the memory model fell short on 14 of 15 measured allocated peaks from four publishers, by 0.54-2.52 GiB, whatever
the run's size (a 1.2B dense model on 8 H100 and 16B-235B MoE proxies alike), so the miss is a fixed amount, not a
share.  Part of it is held from start to end: the allocated memory after the optimizer step exceeds weights,
gradients and optimizer state (which match Megatron's own theoretical figure) by 0.47 GiB in Megatron-LM CI's GPT 7B
test and 0.70 GiB in a Megatron-Bridge Llama-3.2-1B run (measured_memory.csv notes), 0.02 GiB in a 2024 Megatron-LM
fork's MoE run.  Candidates, none itemised: the GEMM libraries' workspaces (cuBLAS, cuBLASLt and Transformer
Engine's, allocated through torch), the allocator's rounding of each block, and the framework's own buffers.
Assumed the same on every vendor's stack (all rows ran NVIDIA's).  Refitted at 0.74 GiB (was 0.81) on 19 allocated
peaks from five publishers once the Q/K norms' saved inputs and each MTP depth's FP32 loss block were itemised."""


# ------------------------------------------------------------------------------------------ the allocator's cache

ALLOCATOR_CACHE_FRACTION = {True: 0.052, False: 0.125}
"""Memory torch's caching allocator reserves beyond what it has allocated, as a fraction of the activations at the
peak, with expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) and without (PyTorch's default).
Blocks freed by tensors of one size are cached and cannot all serve the next, larger requests: the segments the
allocator reserves outgrow the tensors alive.  The activations are what is allocated and freed every micro-batch;
weights, gradients and optimizer state live in buffers Megatron allocates once.  Measured when large training runs
ran out of memory (what torch's message calls "reserved by PyTorch but unallocated", over "allocated by PyTorch":
over the whole allocated memory, so at most the share of the activations):
* default allocator: GLM-4.7-Flash MoE (TP2 EP4, 64K context, 8 x B200), 15.50 GiB over 124.24 GiB allocated
  (0.125; github.com/NovaSky-AI/SkyRL/pull/1470, which then turned expandable segments on and ran);
* expandable segments: a 79 GiB GPU at 74.77 GiB allocated, 3.87 GiB reserved but unallocated (0.052;
  github.com/pytorch/pytorch/issues/152135, "with expandable segments set to true").
Both are at the point where the cache matters (the device full).  Megatron's own memory reports of fixed-shape
runs show less (max reserved 0.6-1% above max allocated, e.g. a Qwen3-30B-A3B PP4 EP2 run on Megatron-LM
core_v0.16), an older BERT run 22% more; a default allocator can waste up to 43% of memory under interleaving and
recompute (arXiv 2507.16274, STWeaver).  planner/calibration/memory.py compares the reserved peaks it predicts with
measured ones."""

EXPANDABLE_SEGMENTS_ASSUMED = True
"""Allocator settings the input does not state (flags without a launcher script, or a script that exports no
allocator variable: the environment it runs in may set one): expandable segments, as NVIDIA's Megatron-Bridge
launch templates set them ("Most Slurm launch templates already include it",
docs.nvidia.com/nemo/megatron-bridge/nightly/skills/perf-memory-tuning)."""

ALLOCATOR_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF")
"""The environment variables that configure torch's caching allocator (CUDA, any device since torch 2.9, ROCm,
Ascend); PyTorch reads PYTORCH_ALLOC_CONF first."""


def expandable_segments_of(env: dict[str, str]) -> bool | None:
    """Whether an environment's allocator settings turn expandable segments on (`expandable_segments:True`,
    comma-separated options, the last value winning); None when no allocator variable is set."""
    for name in ALLOCATOR_ENV:
        conf = env.get(name)
        if conf is None:
            continue
        value = False
        for option in conf.split(","):
            key, _, val = option.strip().partition(":")
            if key.strip() == "expandable_segments":
                value = val.strip().lower() in ("true", "1")
        return value
    return None


def allocator_cache_fraction(expandable_segments: bool | None) -> float:
    """The allocator's cache over the activations at the peak (ALLOCATOR_CACHE_FRACTION); None: as assumed
    (EXPANDABLE_SEGMENTS_ASSUMED)."""
    return ALLOCATOR_CACHE_FRACTION[EXPANDABLE_SEGMENTS_ASSUMED if expandable_segments is None else expandable_segments]


# ------------------------------------------------------------------- the unfused loss's logits segment, reserved anew

LOSS_FP32_BYTES = 4
"""Bytes per logit of the FP32 block Megatron's cross-entropy holds from the loss's forward to its backward."""


def loss_reserved_bytes(training: TrainingSpec, *, tokens: float, vocab_local: float, heads: int) -> float:
    """Bytes the last stage's allocator reserves beyond its allocated peak and the cache on its activations
    (ALLOCATOR_CACHE_FRACTION) under Megatron's default unfused cross-entropy (no `--cross-entropy-loss-fusion`): one
    FP32 copy of a micro-batch's logits, `tokens` x `vocab_local` (vocabulary / TP) x LOSS_FP32_BYTES, per loss head
    (`heads`: the output layer's, and one per MTP depth); 0 with the fused loss.

    The block, in Megatron-LM@d98e8a64: without the fusion the loss is `tensor_parallel.vocab_parallel_cross_entropy`
    (megatron/core/models/common/language_module/language_module.py:173, :199-202), which casts the logits to FP32
    (megatron/core/tensor_parallel/cross_entropy.py:25 `vocab_parallel_logits.float()`), normalises them in place
    (:42, :62, :77) and saves the result for backward (:181); the backward writes the logits' gradient into that same
    FP32 block (:88 `grad_input = softmax`, :111, :114), which autograd casts to the logits' dtype and frees.  So one
    FP32 block of tokens x vocab / TP lives from each micro-batch's loss forward to its backward (the allocated peak
    counts it beside the logits: CostModel._stage_ends' transient), and each MTP depth's loss goes through the same
    function (megatron/core/transformer/multi_token_prediction.py:1027), its block saved until its own backward.

    Why it is reserved twice: torch's caching allocator serves a request from the smallest cached free block that
    holds it and splits that block (CUDACachingAllocator.cpp); once the freed FP32 block is split by other requests
    (activations, gradients, optimizer state allocated after the first micro-batch), the next micro-batch's
    same-size request finds no block large enough and the allocator reserves a new segment, while the pieces of
    the old one stay cached.  Measured (planner/calibration/published/measured_memory.csv, fixed-shape runs, unfused
    loss, allocator settings not stated): the max reserved exceeds the max allocated by 7.66 GiB in SeunghyunSEO's
    dense 0.2B run (`A100-shseo-dense0.2b-dp8-reserved`, FP32 logits 8 x 2048 x 128256 x 4 B = 7.83 GiB), 3.04 GiB in
    LAION's open-sci-ref 1.7B (`A100-laion-osr-1.7b-dp252-rcsel-reserved`, 4 x 4096 x 50304 x 4 B = 3.07 GiB) and
    4.49 GiB in SeunghyunSEO's capacity-padded MoE run (`A100-shseo-moe64top1-ep4-cap1pad-reserved`, 7.83 GiB).
    The one fixed-shape reserved row with the fused loss (Megatron-Bridge's Llama-3.2-1B, `--cross-entropy-fusion-impl
    native`, `H100-bridge-llama32-1b-dp8-mock-reserved`) shows 0.22 GiB for a 0.49 GiB block, so the fused paths are
    not priced, although they hold an FP32 block too (megatron/core/fusions/fused_cross_entropy.py:18 the same
    `.float()`; TransformerEngine@d0067d0 transformer_engine/pytorch/triton/cross_entropy.py:58 an FP32 gradient,
    saved at transformer_engine/pytorch/cross_entropy.py:62).  No row measured the unfused loss with expandable
    segments, which cannot merge free space lying between live blocks either: priced with and without them (an
    over-prediction of the reserved peak is the safe side).  No constant is fitted: the block's size is the term."""
    if training.cross_entropy_loss_fusion:
        return 0.0
    return heads * tokens * vocab_local * LOSS_FP32_BYTES


# ------------------------------------------------------------------------- the reserved peak a long run records

RECORDED_CACHE_SHARE = 0.534
"""Share of the device memory left free above the needed reserved peak that a long run's recorded reserved peak
(torch.cuda.max_memory_reserved: a running maximum since the process started, what Megatron's and ms-swift's
memory logs print) grows into when tensor sizes change from one micro-batch to the next.

Why it grows: torch's caching allocator serves a request from a cached free block when one is large enough;
otherwise it asks the driver for a new segment first, and releases cached blocks only when that fails
(CUDACachingAllocator.cpp `malloc`: `alloc_block(params, false)`, then `release_available_cached_blocks`, then
`release_cached_blocks`, then the out-of-memory error).  So the cache never makes a run run out of memory
(ALLOCATOR_CACHE_FRACTION prices what remains at that point, and the fit check uses it), but while the device has
room each request that no cached block serves adds a segment, and the recorded peak climbs toward the memory left
to the allocator (the device less the context and communicator buffers).  Requests miss the cache when their
sizes move: buffers sized by the tokens each expert receives, under MoE routing that is neither forced balanced nor
padded to a fixed capacity.  PyTorch's Note [Expandable Segments] (CUDACachingAllocator.cpp) describes the
pattern, tensors slightly larger than the cached ones, repeated over 50+ layers; expandable segments shrink it but
cannot merge free space lying between live blocks.  Published observations of the two cases: reserved memory
growing "until the device is full and the allocator has to release and retry" while the allocated memory stays
small, once a small block that stays alive fences freed space off (github.com/pytorch/pytorch/pull/193400, for
issue #123548); variable-length micro-batches that "strand large amounts of reserved-but-unallocated memory" in
long runs (github.com/sgl-project/SpecForge/pull/739); and with packed, constant-size batches "constant peak memory
allocated and peak memory reserved" (github.com/meta-pytorch/torchtune/issues/2830).

Fitted (planner/calibration/memory.py `fit_recorded_cache_share`: the median over measured reserved peaks of
variable-shape runs): ms-swift's Qwen3-30B-A3B SFT on 16 A800 (TP2 EP8 ETP2, aux-loss routing, packed sequences,
its April 2025 script: measured_memory.csv) records 60 GiB where the model needs 41.9 GiB allocated and 42.2 GiB
reserved (UNITEMISED_ALLOCATED_GIB included), with 75.5 GiB left to the allocator: (60 - 42.2) / (75.5 - 42.2) =
0.534; two Qwen1.5-MoE-A2.7B SFT scripts of the same repository on 8 A800 give 0.551 (TP2 EP4, "8 * 65GiB") and
0.463 (PP2 EP4 with expandable segments, "8 * 57GiB").  Three rows from one source, and how their figures were read
is not stated: held out, nothing is left to fit the share on (`python -m planner.calibration.report` prints the
leave-one-source-out figure), and short runs or fixed shapes record less (Megatron-LM memory reports quoted in
ALLOCATOR_CACHE_FRACTION: 0.6-1% above the allocated peak; NVIDIA/skills' 20-step Moonlight-16B study, "near 40 GB"
reserved, about 0.08 of the free memory: docs/cost-model.md)."""


def shapes_vary(model: ModelSpec) -> bool:
    """Whether the run's tensor sizes change between micro-batches: MoE routing neither forced balanced
    (`--moe-router-force-load-balancing`) nor padded to a fixed capacity (`--moe-pad-expert-input-to-capacity`
    with a capacity factor), so each expert's token count, and the buffers sized by it, move every micro-batch."""
    if not model.is_moe or model.moe_router_force_load_balancing:
        return False
    return not (model.moe_expert_capacity_factor is not None and model.moe_pad_expert_input_to_capacity)


def recorded_cache_share(model: ModelSpec, share: float = RECORDED_CACHE_SHARE) -> float:
    """The share of the free device memory a long run's recorded reserved peak grows into (RECORDED_CACHE_SHARE
    when its shapes vary, else 0)."""
    return share if shapes_vary(model) else 0.0
