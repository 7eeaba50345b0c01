"""Cost of one decoder layer for one micro-batch on one GPU of a pipeline stage.

Every part of a layer's time is named, the way Vidur names the parts of a stage (`LayerCost.parts`):
attention projections, the attention core, the dense MLP or the experts, shared experts, the router and
token permutation, FP8 quantisation, other memory-bound work (norms, residual adds, RoPE, activations, and the
passes Megatron-core runs as eager PyTorch ops: gpt-oss's activation clamp, its experts' output bias, unfused RoPE),
and the communication of tensor, context and expert parallelism; `layer_cost` composes one small function
per part over the layer's `_LayerInputs`.  A stage is a sum of these per-layer pieces plus its extras
(embedding, logits, MTP, pipeline sends, gradient sync, optimizer), composed in planner/cost/model.py.  The
search backends tabulate these pieces once per (device type, DP, micro-batch) and compose stages from them,
so the solvers and `estimate` read the very same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.cost.communication import GroupLinks, collective_s
from planner.cost.dispatch import DispatchCost, moe_dispatch
from planner.cost.flops import LayerFlops, layer_flops, windowed_attn_core_flop
from planner.cost.kernels import ATTENTION_BWD_OVER_FWD, ELEMENTWISE_BWD_OVER_FWD, GEMM_BWD_OVER_FWD, Kernels
from planner.cost.memory import ActivationModules, activation_bytes_per_token, attention_transient_bytes
from planner.schemas.model import ModelSpec
from planner.schemas.training import TrainingSpec

TP_COMM_OVERLAP_EXPOSED = 0.3  # fraction of TP traffic left exposed with --tp-comm-overlap (assumption)
EP_OVERLAP_HIDDEN_RUN = 0.3655
"""With --overlap-moe-expert-parallel-comm, the share of the EP dispatch and combine time hidden behind the other
micro-batch's compute over a whole iteration: 36.55% measured by Nsight on Megatron-Bridge's Qwen3-30B-A3B HybridEP
benchmark on 16 H100 (NVIDIA/skills @7149a88 skills/nemo-mbridge-perf-expert-parallel-overlap/SKILL.md,
"communication time hidden by compute", overlap on; 0.11% with it off).  That run is also two calibration rows
(source nvidia-skills-megatron-bridge), so those rows do not validate this constant independently."""
EP_OVERLAP_RUN_MICROBATCHES = 64
"""The micro-batches of that run (global batch 1024 over DP16 at micro-batch 1, no pipelining: the calibration rows
H100-qwen3-30B-A3B-16-bf16-hybridep-*): of its 64 forward and 64 backward steps, the first forward and the last
backward run alone (`ep_overlap_steady_share`), so 126 of 128 could hide communication."""
EP_OVERLAP_HIDDEN = EP_OVERLAP_HIDDEN_RUN * EP_OVERLAP_RUN_MICROBATCHES / (EP_OVERLAP_RUN_MICROBATCHES - 1)
"""The share hidden in a step where a forward and a backward run together (37.1%): the run's share over the share of
its steps that pair a forward with a backward."""


def ep_overlap_steady_share(pp: int, vpp: int, num_microbatches: int) -> float:
    """Of a pipeline rank's forward and backward chunk steps, the share Megatron's combined 1F1B schedule (what
    --overlap-moe-expert-parallel-comm runs) pairs with a step of the other kind, averaged over the PP ranks: only
    those hide EP communication behind the other step's compute.  The warm-up forwards and the cool-down backwards
    run alone.  NVIDIA/Megatron-LM @d98e8a64 megatron/core/pipeline_parallel/schedules.py
    `get_pp_rank_microbatches`: an interleaved rank r of PP p with V chunks and m micro-batches warms up with
    (p - r - 1) x 2 + (V - 1) x p (the micro-batch group per virtual stage, default p) + 1 (the extra forward EP
    overlap schedules) of its m x V chunks; combined_1f1b.py `combined_1f1b_schedule_for_no_pipelining` without
    pipelining runs the first forward and the last backward alone (1 of m)."""
    total = max(1, num_microbatches * vpp)
    if pp <= 1:
        warmups = [1]
    else:
        warmups = [(pp - r - 1) * 2 + (vpp - 1) * pp + 1 for r in range(pp)]
    return sum(total - min(w, total) for w in warmups) / (len(warmups) * total)


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
    expert_fill: float = 1.0  # tokens each expert's GEMM computes over the mean (dispatch.py `Routing.fill`)

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

    host_fwd_s: float = 0.0  # host time beyond the GPU work: the layer waits for its kernel launches (forward)
    host_bwd_s: float = 0.0
    ep_hidden_fwd_s: float = 0.0  # EP seconds --overlap-moe-expert-parallel-comm hid (forward), in a paired step
    ep_hidden_bwd_s: float = 0.0

    @property
    def fwd_s(self) -> float:
        return self.fwd_compute_s + self.tp_fwd_s + self.cp_fwd_s + self.ep_fwd_s + self.host_fwd_s

    @property
    def bwd_s(self) -> float:
        return self.bwd_compute_s + self.tp_bwd_s + self.cp_bwd_s + self.ep_bwd_s + self.host_bwd_s

    def act_bytes(self, kept_per_token: float) -> float:
        return kept_per_token * self.local_tokens


def layer_cost(
    model: ModelSpec, training: TrainingSpec, *, is_moe: bool, shape: LayerShape, kernels: Kernels,
    links: GroupLinks, tp_comm_overlap: bool,
) -> LayerCost:
    """Price one decoder layer (dense or MoE) for one micro-batch on one GPU: its compute parts, then the
    communication of tensor, context and expert parallelism with their overlap flags."""
    x = _layer_inputs(model, training, is_moe=is_moe, shape=shape, kernels=kernels, links=links)
    c = _compute_parts(x)
    tp_s, mlp_tp_s = _tp_comm_s(x, tp_comm_overlap)
    cp_fwd, cp_bwd = _cp_comm_s(x, c.attention_core)
    ep_fwd, ep_bwd, ep_hidden = _ep_comm_s(x, hide_s=c.fwd_s + c.bwd_s, shared_s=c.shared_expert_gemm)
    launches = _launches_fwd(x)
    # The host floor: a layer waits for its host operations where they outlast its GPU work.  The EP
    # communication counts in full there, also the part the overlaps hide: the fitted host time (HOST_OP_S x
    # host_overhead, ~137 us per operation, far above a launch) is mostly the host stalled at the dispatcher's
    # device-to-host copy of the tokens per expert, which the overlaps hide with the dispatch it waits for (one
    # micro-batch's copy while the other's compute runs).  Before, the floor took back what the overlap hid:
    # Qwen3-30B-A3B SFT, EP overlap off and on, priced 34.314 s both times, measured 41.25 and 31.31 s.
    ep_raw = x.dispatch.comm_s if x.dispatch else 0.0  # each way, before the overlaps hide any of it
    counts = x.dispatch.counts_s if x.dispatch else 0.0  # the forward's only
    host_fwd = max(0.0, x.kernels.host_s(sum(launches.values())) - (c.fwd_s + tp_s + cp_fwd + ep_raw + counts))
    host_bwd = max(0.0, x.kernels.host_s(BWD_LAUNCHES_OVER_FWD * sum(launches.values()))
                   - (c.bwd_s + tp_s + cp_bwd + ep_raw))
    b = GEMM_BWD_OVER_FWD + 1
    parts = {
        "attention_gemm": b * c.attention_gemm,
        "attention_core": c.attention_core + c.attention_core_bwd - c.attention_dropout,
        "attention_dropout": c.attention_dropout,
        "mlp_gemm": b * c.mlp_gemm,
        "expert_gemm": c.expert_gemm + c.expert_gemm_bwd,
        "shared_expert_gemm": b * c.shared_expert_gemm,
        "router_permute": (1 + ELEMENTWISE_BWD_OVER_FWD) * c.router_permute,
        "fp8_cast": c.fp8_cast_fwd + c.fp8_cast_bwd,
        "elementwise": ((1 + ELEMENTWISE_BWD_OVER_FWD) * (c.layernorm + c.activation + c.residual_rope)
                        + c.eager_fwd + c.eager_bwd),
        "tp_comm": tp_s + tp_s,
        "cp_comm": cp_fwd + cp_bwd,
        "ep_comm": ep_fwd + ep_bwd,
        "host_overhead": host_fwd + host_bwd,
    }
    return LayerCost(
        fwd_compute_s=c.fwd_s, bwd_compute_s=c.bwd_s, tp_fwd_s=tp_s, tp_bwd_s=tp_s, cp_fwd_s=cp_fwd, cp_bwd_s=cp_bwd,
        ep_fwd_s=ep_fwd, ep_bwd_s=ep_bwd, module_fwd_s=_module_fwd_s(x, c, mlp_tp_s, launches),
        activations=_activations(x), local_tokens=x.local_tokens, parts=parts, transient_bytes=_transient_bytes(x),
        host_fwd_s=host_fwd, host_bwd_s=host_bwd, ep_hidden_fwd_s=ep_hidden[0], ep_hidden_bwd_s=ep_hidden[1],
    )


@dataclass(frozen=True)
class _LayerInputs:
    """What every part of one layer's time reads: the specs, the shape and device, and what follows from
    them once (FLOP per token, the MoE dispatch, token counts)."""

    model: ModelSpec
    training: TrainingSpec
    is_moe: bool
    shape: LayerShape
    kernels: Kernels
    links: GroupLinks
    flops: LayerFlops
    dispatch: DispatchCost | None  # MoE layers only
    gathered_tokens: float  # t_g: tokens a TP region works on
    local_tokens: float  # t_l: tokens this GPU holds outside TP regions
    sp: float  # t_g / t_l: the sequence-parallel split (TP with sequence parallelism, else 1)
    act: int  # bytes per activation element
    fp8: bool  # FP8 linear-layer GEMMs


def _layer_inputs(model: ModelSpec, training: TrainingSpec, *, is_moe: bool, shape: LayerShape, kernels: Kernels,
                  links: GroupLinks) -> _LayerInputs:
    t_g, t_l = shape.gathered_tokens, shape.local_tokens
    act = training.activation_bytes
    dispatch = None
    if is_moe:
        dispatch = moe_dispatch(model, kernels=kernels, links=links, local_tokens=t_l, ep=shape.ep, etp=shape.etp,
                                imbalance=shape.imbalance, act_bytes=act, fill=shape.expert_fill)
    return _LayerInputs(
        model=model, training=training, is_moe=is_moe, shape=shape, kernels=kernels, links=links,
        flops=layer_flops(model, is_moe=is_moe, seq_length=shape.seq_length), dispatch=dispatch,
        gathered_tokens=t_g, local_tokens=t_l, sp=t_g / t_l, act=act, fp8=training.precision == "fp8",
    )


# --------------------------------------------------------------------------------------------- compute parts


@dataclass(frozen=True)
class _ComputeParts:
    """Forward seconds of each compute part of one layer (FP8 casts: forward and backward)."""

    attention_gemm: float  # QKV (or MLA) and output projections
    mla_up_proj: float  # MLA's up-projections: the share of attention_gemm selective recompute re-runs
    attention_core: float  # with what attention dropout adds to a fused core
    attention_core_bwd: float  # its backward: ATTENTION_BWD_OVER_FWD x the forward, or the unfused core's own
    attention_dropout: float  # forward + backward seconds that --attention-dropout adds to a fused core
    mlp_gemm: float  # dense layers
    expert_gemm: float  # MoE layers: routed experts
    expert_gemm_bwd: float  # their backward (data and weight gradients), each pass at least its HBM traffic
    shared_expert_gemm: float
    router_permute: float
    layernorm: float
    activation: float  # activation functions (SwiGLU) of the MLP, experts and shared experts
    residual_rope: float  # residual adds and RoPE
    fp8_cast_fwd: float
    fp8_cast_bwd: float
    eager_fwd: float = 0.0  # eager PyTorch passes with their own counted backward (`_eager_passes_s`)
    eager_bwd: float = 0.0

    @property
    def dense_gemm_s(self) -> float:
        """GEMMs whose backward is GEMM_BWD_OVER_FWD x the forward (compute-bound at their token counts)."""
        return self.attention_gemm + self.mlp_gemm + self.shared_expert_gemm

    @property
    def gemm_s(self) -> float:
        return self.dense_gemm_s + self.expert_gemm

    @property
    def elementwise_s(self) -> float:
        return self.layernorm + self.activation + self.residual_rope + self.router_permute

    @property
    def fwd_s(self) -> float:
        return self.gemm_s + self.attention_core + self.elementwise_s + self.fp8_cast_fwd + self.eager_fwd

    @property
    def bwd_s(self) -> float:
        return (GEMM_BWD_OVER_FWD * self.dense_gemm_s + self.expert_gemm_bwd
                + self.attention_core_bwd
                + ELEMENTWISE_BWD_OVER_FWD * self.elementwise_s + self.fp8_cast_bwd + self.eager_bwd)


def _compute_parts(x: _LayerInputs) -> _ComputeParts:
    attention_gemm = _attention_gemm_s(x)
    cast_fwd, cast_bwd = _fp8_cast_s(x)
    expert_fwd, expert_bwd = _expert_gemm_s(x)
    eager_fwd, eager_bwd = _eager_passes_s(x)
    dropout = 0.0
    if x.training.unfused_attention:
        core_fwd, core_bwd = _unfused_attention_s(x)  # its dropout passes included
    else:
        core_fwd = _attention_core_s(x)
        core_bwd = ATTENTION_BWD_OVER_FWD * core_fwd
        if x.training.attention_dropout > 0:
            slowdown = attention_dropout_slowdown(x.kernels.device.name, x.kernels.flash_attention)
            dropout = (slowdown["fwd"] - 1) * core_fwd + (slowdown["bwd"] - 1) * core_bwd
            core_fwd *= slowdown["fwd"]
            core_bwd *= slowdown["bwd"]
    return _ComputeParts(
        attention_gemm=attention_gemm, mla_up_proj=_mla_up_proj_s(x, attention_gemm),
        attention_core=core_fwd, attention_core_bwd=core_bwd, attention_dropout=dropout, mlp_gemm=_mlp_gemm_s(x),
        expert_gemm=expert_fwd,
        expert_gemm_bwd=expert_bwd,
        shared_expert_gemm=_shared_expert_gemm_s(x), router_permute=_router_permute_s(x), layernorm=_layernorm_s(x),
        activation=_activation_s(x), residual_rope=_residual_rope_s(x), fp8_cast_fwd=cast_fwd, fp8_cast_bwd=cast_bwd,
        eager_fwd=eager_fwd, eager_bwd=eager_bwd,
    )


def _gemm_s(x: _LayerInputs, flop: float) -> float:
    """Dense GEMMs of `flop` in the layer's GEMM precision (two calls of half the FLOP each)."""
    return x.kernels.gemm_s(flop, flop / 2, fp8=x.fp8)


def _attention_gemm_s(x: _LayerInputs) -> float:
    return _gemm_s(x, x.gathered_tokens * x.flops.attn_proj_flop / x.shape.tp)


def _mla_up_proj_flop(model: ModelSpec) -> float:
    """Forward FLOP per token of MLA's up-projections (latent -> per-head Q, K, V)."""
    a = model.num_attention_heads
    q_up = (model.q_lora_rank or 0) * a * (model.qk_head_dim + model.qk_pos_emb_head_dim)
    kv_up = model.kv_lora_rank * a * (model.qk_head_dim + model.v_head_dim)
    return 2.0 * (q_up + kv_up)


def _mla_up_proj_s(x: _LayerInputs, attention_gemm_s: float) -> float:
    if not x.model.multi_latent_attention:
        return 0.0
    return attention_gemm_s * _mla_up_proj_flop(x.model) / x.flops.attn_proj_flop


CP_RING_EFFICIENCY = 0.858
"""Load-balanced (zigzag) ring attention against flash attention of the whole sequence divided over the ranks,
forward + backward, causal, 8 H800 in one node, 4096 tokens per rank: 75.7 / 88.2 iterations per second
(ring-flash-attention table in feifeibear/long-context-attention README.md @0228a2b; plain ring: 61.6%): the
partial-softmax merges, smaller calls and step synchronisation of context parallelism's p2p ring."""


def _attention_core_s(x: _LayerInputs) -> float:
    """The fused attention core.  With context parallelism (p2p ring) it runs as CP steps of a CP-th of this
    rank's work each (its load-balanced chunks against one peer's keys and values): priced at the efficiency of
    those calls, and at least the whole call's time over CP_RING_EFFICIENCY (the measured ring loss).  Without it,
    the model's sliding-window layers run the band of the score matrix only (`_windowed_share`)."""
    flop = x.gathered_tokens * x.flops.attn_core_flop / x.shape.tp
    cp = x.shape.cp
    if cp > 1 and x.training.cp_comm_type in ("p2p", "a2a+p2p"):
        return max(x.kernels.attention_s(flop, flop / cp), x.kernels.attention_s(flop) / CP_RING_EFFICIENCY)
    full = x.kernels.attention_s(flop)
    share = _windowed_share(x)
    if not share:
        return full
    band = flop * windowed_attn_core_flop(x.model, x.shape.seq_length) / x.flops.attn_core_flop
    return (1.0 - share) * full + share * x.kernels.attention_s(band, windowed=True)


def _windowed_share(x: _LayerInputs) -> float:
    """The share of the model's layers whose fused attention core runs a sliding window (ModelSpec.layer_is_windowed).
    cuDNN's fused attention (the backend Transformer Engine picks for --window-size with attention sinks:
    TransformerEngine v2.14.1 @366798ef dot_product_attention/utils.py `get_attention_backend` turns FlashAttention
    off for softmax_type != vanilla, and common/fused_attn/fused_attn.cpp takes the F16_arbitrary_seqlen sub-backend
    for a (left, 0) window, no dropout, bshd/sbhd, and sinks from cuDNN 9.13.1) visits only the tiles inside the band:
    NVIDIA/cudnn-frontend@3929da2 benchmark/sdpa_benchmark_training/results/gpt_oss (cuDNN 9.22, BF16, 128 heads of 64,
    batch 2, window 128, top-left causal) runs in time linear in the sequence, forward 0.109, 0.210, 0.414, 0.822 ms
    at 2k, 4k, 8k, 16k tokens on GB200.  The band is priced at the device's `windowed_attention_efficiency` (that
    benchmark's figures, profiles/published/: B200, B300, GB200 and GB300 have one) where it has one, else at its
    attention efficiency for the (smaller) call: for that benchmark's 4k call (the shape of a gpt-oss layer at 4 x 4096 tokens: 256 heads x batch of 64)
    0.48 ms forward + backward on B300's datasheet table against 0.644 ms measured on GB300 (0.202 + 0.442), and on B200's
    0.48 ms against GB200's 0.675; on H100's table 1.11 ms for a 1024-token window against 1.40 ms measured on H200
    (results/h200_919_only_cudnn/gpt_oss: cuDNN 9.19, 64 heads of 64 in 8 groups, batch 2, 4k).  The mean share over the model's layers prices every layer alike (a stage's
    layers alternate as the model's do, to within one layer); under context parallelism, with unfused attention
    (`_unfused_attention_s`, a mask over the whole square) and with dropout (cuDNN's window needs none) a window is
    priced as full causal attention."""
    tr = x.training
    if x.shape.cp > 1 or tr.unfused_attention or tr.attention_dropout > 0 or x.model.multi_latent_attention:
        return 0.0
    windowed = x.model.layer_is_windowed
    return sum(windowed) / len(windowed) if windowed else 0.0


FUSED_ATTENTION_DROPOUT_SLOWDOWN = {
    "flash": {"fwd": 1.20, "bwd": 1.21},
    "fused": {"fwd": 1.03, "bwd": 1.03},
    "fused-Blackwell": {"fwd": 1.09, "bwd": 1.09},
}
"""A fused attention core with `--attention-dropout` > 0 against the same call without, by kernel: it draws a Philox
random number for every score element in the forward and again in the backward, ALU work beside the tensor-core
GEMMs, which a kernel may or may not hide behind them.  Measured:
- flash (the FlashAttention package, `--attention-backend flash`): FlashAttention's own with/without-dropout tables on
  A100 (arXiv 2205.14135 appendix E.6, tables 15-20: fp16, p 0.1, head dim 64, 2k-8k tokens): forward 1.17-1.23x,
  backward 1.19-1.23x, taken as 1.20 and 1.21 on every device (FlashAttention-2 keeps that design; no Hopper table at
  training sizes was found; FlashAttention-2 on B300 at 4 x 1024 packed tokens pays 1.05x, where fixed costs
  dominate: NVIDIA/TransformerEngine PR #3313).
- fused (cuDNN through Transformer Engine, Megatron's default): Transformer Engine's DotProductAttention, bf16, sbhd,
  4 x 1024 tokens, 16 heads of 128, forward and backward together: H200 0.594 -> 0.614 ms, 1.03x; B300 0.480 ->
  0.525 ms, 1.09x (NVIDIA/TransformerEngine issue #3312; "the same work in sbhd pays almost nothing for the same
  dropout"): the only cuDNN figures, at a small size, so floors (cuDNN hides the random numbers behind the GEMMs, the
  method of arXiv 2410.07531 from NVIDIA).  Not used: FlashAttention-4 on GB200, a kernel Megatron does not run,
  forward at 75-85% and backward at 60-70% of its no-dropout TFLOP/s at ~32k tokens (Dao-AILab/flash-attention PR
  #2597).
Other accelerators (AMD, Ascend, Gaudi) take the flash or fused row by their --attention-backend: an assumption, no
table found."""
BLACKWELL_DEVICES = frozenset({"B200", "B300", "GB200", "GB300"})

BLACKWELL_EAGER_MOE_RATIO = (1.09, 1.74)
"""The range of measured over predicted iteration time of NVIDIA's held-out MoE runs on Blackwell without full-iteration
CUDA graphs (Megatron-Bridge's performance summary, 26.04.01 and 26.06 containers, B200 and B300 over NVLink and
InfiniBand: planner/calibration/published/unfitted_runs.csv, `python -m planner.calibration.report`): what
BLACKWELL_EAGER_MOE_NOTE quotes (a test re-prices the rows and checks the quote).  The bounds are rounded outward to
hundredths (the rows' ratios are 1.096-1.732; graphed, 0.920-1.144), so that every row lies inside the quoted range."""
BLACKWELL_GRAPHED_MOE_RATIO = (0.92, 1.15)
"""The same for its held-out MoE runs on Blackwell with them (26.06 and 26.08 containers, B300, GB200, GB300)."""
BLACKWELL_EAGER_MOE_NOTE = (
    "MoE on {devices} without full-iteration CUDA graphs (--cuda-graph-impl full_iteration) is priced at the "
    "kernels' published rates (cuDNN's fused attention on GB200/GB300; profiles/published/), which NVIDIA's newest "
    "runs reach: its Megatron-Bridge 26.06 and 26.08 MoE runs with full-iteration graphs and Transformer Engine's "
    "fused grouped MLP measured {glo:.2f}-{ghi:.2f}x this planner's estimate on B300, GB200 and GB300, but its 26.04.01 and "
    "26.06 runs without them measured {lo:.2f}-{hi:.2f}x on B200 and B300 (the eager MoE path's time beyond its "
    "kernels, no profile published: planner/calibration/published/README.md 'Blackwell attention'); expect this "
    "plan to run up to that much slower, or measure a short trial (solve --out writes one)")
"""What the estimate of an eager (not fully graphed) MoE step on Blackwell does not price (`blackwell_eager_notes`)."""


def blackwell_eager_notes(model, training, plan) -> list[str]:
    """The note on a MoE plan with a stage on Blackwell whose step is not one full-iteration CUDA graph."""
    devices = sorted(set(plan.member_types()) & BLACKWELL_DEVICES)
    if not model.is_moe or not devices or training.cuda_graph_impl == "full_iteration":
        return []
    (lo, hi), (glo, ghi) = BLACKWELL_EAGER_MOE_RATIO, BLACKWELL_GRAPHED_MOE_RATIO
    return [BLACKWELL_EAGER_MOE_NOTE.format(devices="/".join(devices), lo=lo, hi=hi, glo=glo, ghi=ghi)]


def attention_dropout_slowdown(device_name: str, flash: bool) -> dict[str, float]:
    """FUSED_ATTENTION_DROPOUT_SLOWDOWN's row for a device and kernel (`flash`: --attention-backend flash)."""
    if flash:
        return FUSED_ATTENTION_DROPOUT_SLOWDOWN["flash"]
    return FUSED_ATTENTION_DROPOUT_SLOWDOWN["fused-Blackwell" if device_name in BLACKWELL_DEVICES else "fused"]


UNFUSED_SCORE_PASSES = {"fwd": 4, "bwd": 7, "dropout_fwd": 2.5, "dropout_bwd": 2.5}
"""HBM passes over the s x s score matrix per head (elements of `activation_bytes` each; a dropout mask byte counts
half) of unfused attention (Megatron's DotProductAttention, `--attention-backend unfused` or `local`): forward, the
scores GEMM writes it, the scale-mask-softmax kernel reads and writes it, the probabilities-times-values GEMM reads
it; backward, the GEMM of the probabilities' gradient writes it, the values' gradient GEMM reads the probabilities,
the softmax backward reads the probabilities and the gradient and writes the scores' gradient, and the gradients of
the queries and keys read it once each.  With `--attention-dropout` > 0, the dropout reads the probabilities and
writes the dropped copy and its mask, and its backward reads the gradient and the mask and writes the gradient."""


def _unfused_attention_s(x: _LayerInputs) -> tuple[float, float]:
    """(forward, backward) seconds of unfused attention: explicit batched GEMMs over the whole s x s square (no
    causal skipping: Megatron's count, `attn_core_flop`, is the causal half), two forward and four backward, each
    at least the HBM time of the score matrix it writes or reads, plus the softmax (and dropout) passes over it
    (UNFUSED_SCORE_PASSES)."""
    flop = 2.0 * x.gathered_tokens * x.flops.attn_core_flop / x.shape.tp  # QK^T and PV, the whole square
    scores = x.gathered_tokens * x.shape.seq_length * x.model.num_attention_heads / x.shape.tp * x.act  # bytes
    k = x.kernels
    gemm = k.gemm_s(flop / 2, flop / 2)  # one of the two forward GEMMs
    one_pass = k.memory_s(scores)
    dropout = x.training.attention_dropout > 0
    fwd = 2 * max(gemm, one_pass) + (UNFUSED_SCORE_PASSES["fwd"] - 2) * one_pass
    bwd = 4 * max(gemm, one_pass) + (UNFUSED_SCORE_PASSES["bwd"] - 4) * one_pass
    if dropout:
        fwd += UNFUSED_SCORE_PASSES["dropout_fwd"] * one_pass
        bwd += UNFUSED_SCORE_PASSES["dropout_bwd"] * one_pass
    return fwd, bwd


def _mlp_gemm_s(x: _LayerInputs) -> float:
    return _gemm_s(x, x.gathered_tokens * x.flops.mlp_flop / x.shape.tp)


def _shared_expert_gemm_s(x: _LayerInputs) -> float:
    return _gemm_s(x, x.gathered_tokens * x.flops.shared_expert_flop / x.shape.tp)


MAIN_GRAD_BYTES = 8
"""HBM bytes per weight element of a weight-gradient GEMM: Megatron accumulates weight gradients into the FP32
`main_grad` buffer (gradient-accumulation fusion: the GEMM reads it, 4 bytes, and writes it back, 4), every
micro-batch, whatever the GEMM's precision."""


def _expert_gemm_s(x: _LayerInputs) -> tuple[float, float]:
    """(forward, backward) seconds of the routed experts' grouped GEMMs on this GPU: its tokens' copies after
    dispatch (and ETP gather).  Each of the three passes (forward, data gradient, weight gradient) runs at the
    grouped kernel's efficiency for its tokens per expert, and takes at least the time its HBM traffic does (a
    roofline over tokens per expert and local experts): the forward and the data gradient read every local
    expert's weights (FP8: the quantised copy) and the weight gradient reads and writes every local expert's FP32
    main gradient (MAIN_GRAD_BYTES), each pass also reading and writing the copies' activations.  With many local
    experts and few tokens each (replicated experts, EP1) the weight-gradient pass is memory-bound: its arithmetic
    intensity is 2 x tokens per expert / MAIN_GRAD_BYTES FLOP per byte, below the ridge (peak FLOP/s over HBM
    bytes/s, ~300 on H100 and B200) under ~1,200 tokens per expert.

    The kernel's rate is the one of its balanced shape (`DispatchCost.tokens_per_expert`: the mean tokens per
    expert, times the capacity factor when experts are padded to it); the busiest rank's extra tokens under real
    routing (or the ones a capacity factor drops) add (or save) their FLOP at that rate.  Real routing puts them in
    a few hot experts, not on every expert of the rank, so they do not raise the rank's efficiency: priced at the
    busiest rank's mean tokens per expert, where the tables rise steeply (512 to 2048 tokens), a busier rank came
    out barely slower, or faster (issue 31 item 6)."""
    d = x.dispatch
    if d is None:
        return 0.0, 0.0
    model, k = x.model, x.kernels
    per_copy_flop = x.flops.expert_flop / model.moe_router_topk / x.shape.etp
    local_experts = max(1, (model.num_experts or 1) // x.shape.ep)
    copies = x.local_tokens * d.copies_per_token
    compute = k.grouped_gemm_s(
        copies * per_copy_flop, tokens_per_expert=d.tokens_per_expert, local_experts=local_experts,
        call_flop=d.tokens_per_expert * per_copy_flop / 2, grouped=model.moe_grouped_gemm, fp8=x.fp8)
    h, f, glu = model.hidden_size, model.moe_ffn_size / x.shape.etp, _glu(model)
    weights = local_experts * (glu + 1) * h * f  # FC1 (h x glu*f) and FC2 (f x h) of every local expert
    activations = copies * (2 * h + (glu + 1) * f) * x.act  # FC1 in and out, FC2 in and out
    weight_read = k.memory_s(weights * (1 if x.fp8 else x.act) + activations)
    main_grad = k.memory_s(weights * MAIN_GRAD_BYTES + activations)
    return max(compute, weight_read), max(compute, weight_read) + max(compute, main_grad)


def _router_permute_s(x: _LayerInputs) -> float:
    d = x.dispatch
    return (d.router_s + d.permute_s) if d else 0.0


# memory-bound work: elements read + written per local token


def _qkv_width(model: ModelSpec) -> int:
    """Q, K and V columns of the QKV projection, whole layer."""
    return model.num_attention_heads * model.head_dim + 2 * model.query_groups * model.head_dim


def _glu(model: ModelSpec) -> int:
    """Up-projection outputs per FFN column: 2 with a gated MLP (gate and up: --swiglu, --quick-geglu), else 1."""
    return 2 if model.gated_linear_unit else 1


def _memory_pass_s(x: _LayerInputs, elements_per_token: float) -> float:
    return x.kernels.memory_s(elements_per_token * x.local_tokens * x.act)


def _layernorm_s(x: _LayerInputs) -> float:
    return _memory_pass_s(x, 4 * x.model.hidden_size)  # two norms, read + write


def _residual_rope_s(x: _LayerInputs) -> float:
    """The two bias-dropout-adds (read the branch and the residual, write the sum) and RoPE on Q and K (Transformer
    Engine's fused kernel: one read and one write; the eager RoPE is `_eager_passes_s`'s); with `--hidden-dropout`
    > 0 each bias-dropout-add also writes its 1-byte keep mask (the backward reads it)."""
    tp_region = x.sp / x.shape.tp
    h = x.model.hidden_size
    masks = 2 * h / x.act if x.training.hidden_dropout > 0 else 0.0  # elements of activation_bytes each
    rope = 0.0 if _eager_rope(x.model) else 2 * _qkv_width(x.model) * tp_region
    return _memory_pass_s(x, 6 * h + masks + rope)


def _activation_s(x: _LayerInputs) -> float:
    """The activation functions: the compiled kernel reads the FC1 output and writes the activation, and routed
    experts with a clamped quick-GEGLU add its eager clamp (QUICK_GEGLU_CLAMP_PASSES)."""
    model, glu = x.model, _glu(x.model)
    tp_region = x.sp / x.shape.tp
    if x.is_moe:
        f = model.moe_ffn_size / x.shape.etp
        elems = (glu + 1 + (QUICK_GEGLU_CLAMP_PASSES if model.clamped_quick_geglu else 0)) * f \
            * x.dispatch.copies_per_token
        s_f = model.moe_shared_expert_intermediate_size or 0
        elems += (glu + 1) * s_f * tp_region
    else:
        elems = (glu + 1) * model.ffn_size * tp_region
    return _memory_pass_s(x, elems)


QUICK_GEGLU_CLAMP_PASSES = 8
"""Elements read and written per FFN column of each routed copy by the eager clamp of a quick-GEGLU with
--activation-func-clamp-value, forward.  Megatron-LM @2edffadb (the submodule of Megatron-Bridge v0.4.2,
NVIDIA-NeMo/Megatron-Bridge@c8101293 3rdparty/Megatron-LM) megatron/core/fusions/fused_bias_geglu.py
`weighted_bias_quick_geglu_impl`, which TEGroupedMLP calls with bias_activation_fusion (experts.py `bias_act_func`):
before the compiled activation (megatron/core/jit.py: jit_fuser = torch.compile) it splits the FC1 output in its two
halves, clamps each (`x_glu.clamp(max=c)`, `x_linear.clamp(-c, c)`: read f, write f, twice = 4f) and concatenates them
again (`torch.cat`: read 2f, write 2f = 4f); unchanged at d98e8a64.  Backward: PyTorch's clamp_backward (the
comparisons, their logical_and and a `where`: about 4f and 7f) and the split's gradient concatenation (4f), 15f by
count, priced as ELEMENTWISE_BWD_OVER_FWD x 8f = 16f.  Selective `moe_act` recompute re-runs it (it is inside the
checkpointed function).  SwiGLU's clamp is inside its compiled function (fused_bias_swiglu.py `clamped_swiglu`
@d98e8a64), not priced here."""
EXPERT_BIAS_PASSES = {"fwd": 6, "bwd": 8}
"""Elements read and written per hidden column of each routed copy by the routed experts' FC2 bias, added outside the
GEMM: Megatron-LM @2edffadb megatron/core/transformer/moe/experts.py TEGroupedMLP builds linear_fc2 with
skip_bias_add=True and adds its bias in `_apply_bias`, an eager loop over the local experts: `t + b * p` on each
expert's rows of the FC2 output (torch.split), then `torch.cat`.  Forward: b * p writes 1, the add reads 2 and writes
1, the cat reads 1 and writes 1 = 6.  Backward (autograd of those ops): the bias gradient (grad x p, then its sum over
the rows: 3), the routing probabilities' gradient (grad x b, then its sum over the columns: 3), and the split's
gradient concatenation (2) = 8.  FC1's bias costs nothing extra: TEGroupedMLP keeps it in Transformer Engine's GEMM
(skip_bias_add=False; TransformerEngine v2.14.1 @366798ef, the version Megatron-Bridge v0.4.2 locks,
transformer_engine/pytorch/module/grouped_linear.py: the bias in the GEMM epilogue, its gradient fused with the
weight-gradient GEMM in BF16).  Priced where the experts have biases (no --disable-bias-linear) and run as one
grouped GEMM (--moe-grouped-gemm); SequentialMLP's per-expert MLPs are not priced for it."""
EAGER_ROPE_PASSES = {"fwd": 12, "bwd": 13}
"""Elements read and written per rotated Q and K element by RoPE as eager PyTorch ops, where Transformer Engine's
fused RoPE does not run (`_eager_rope`): Megatron-LM @2edffadb megatron/core/models/common/embeddings/rope_utils.py
`_apply_rotary_pos_emb_bshd`: forward t * cos (read 1, write 1), the rotated half's negation (0.5, 0.5) and
concatenation (1, 1), x sin (1, 1), the sum (2, 1), and the concatenation with the (empty) unrotated part (1, 1) = 12;
backward the two products' gradients (2 + 2), the negation's (1), the split's gradient concatenation (2), the two
branches' sum (3) and the slice's zero-filled gradient (3) = 13.  The fused kernel's read and write of Q, K and V
(`_residual_rope_s`) is then not charged."""


def _eager_rope(model: ModelSpec) -> bool:
    """RoPE runs as eager PyTorch ops, not Transformer Engine's fused kernel: with --no-rope-fusion, and with any
    position embedding other than plain `rope` (Megatron-LM @2edffadb megatron/training/arguments.py: "if
    args.position_embedding_type != 'rope': args.apply_rope_fusion = False"; YaRN's attention scale (mscale != 1)
    also takes the unfused path in rope_utils.py `apply_rotary_pos_emb`; Megatron-Bridge v0.4.2's GPTModelProvider
    disables the fusion by the same rule, src/megatron/bridge/utils/fusions.py `validate_rope_fusion_compatibility`).
    Rotary embeddings only (rope, yarn, mrope), not multi-latent attention (its RoPE is priced as before)."""
    if model.multi_latent_attention or model.position_embedding_type not in ("rope", "yarn", "mrope"):
        return False
    return not model.apply_rope_fusion or model.position_embedding_type != "rope"


def _expert_bias_s(x: _LayerInputs) -> tuple[float, float]:
    """(forward, backward) seconds of the routed experts' FC2 bias added outside the GEMM (EXPERT_BIAS_PASSES)."""
    model = x.model
    if not (x.is_moe and model.add_bias_linear and model.moe_grouped_gemm):
        return 0.0, 0.0
    elems = model.hidden_size * x.dispatch.copies_per_token
    return (_memory_pass_s(x, EXPERT_BIAS_PASSES["fwd"] * elems), _memory_pass_s(x, EXPERT_BIAS_PASSES["bwd"] * elems))


def _eager_passes_s(x: _LayerInputs) -> tuple[float, float]:
    """(forward, backward) seconds of the layer's eager PyTorch passes priced with their own counted backward: the
    routed experts' FC2 bias (EXPERT_BIAS_PASSES) and eager RoPE on Q and K (EAGER_ROPE_PASSES)."""
    fwd, bwd = _expert_bias_s(x)
    if _eager_rope(x.model):
        model = x.model
        qk = (model.num_attention_heads + model.query_groups) * model.head_dim * model.rotary_percent
        qk *= x.sp / x.shape.tp
        fwd += _memory_pass_s(x, EAGER_ROPE_PASSES["fwd"] * qk)
        bwd += _memory_pass_s(x, EAGER_ROPE_PASSES["bwd"] * qk)
    return fwd, bwd


def _fp8_cast_s(x: _LayerInputs) -> tuple[float, float]:
    """(forward, backward) seconds quantising every FP8 GEMM's input (forward) and output gradient (backward)."""
    fwd, bwd = _fp8_cast_elements(x) if x.fp8 else (0.0, 0.0)
    return x.kernels.fp8_cast_s(fwd), x.kernels.fp8_cast_s(bwd)


def _fp8_cast_elements(x: _LayerInputs) -> tuple[float, float]:
    model, sp, t_l = x.model, x.sp, x.local_tokens
    tp, etp, h, glu = x.shape.tp, x.shape.etp, model.hidden_size, _glu(model)
    o_dim = model.num_attention_heads * (model.v_head_dim if model.multi_latent_attention else model.head_dim)
    fwd = (h * sp + o_dim / tp * sp) * t_l  # QKV input, projection input
    bwd = (_qkv_width(model) / tp * sp + h * sp) * t_l
    if x.is_moe:
        c = x.dispatch.copies_per_token
        fwd += c * (h + model.moe_ffn_size / etp) * t_l
        bwd += c * (glu * model.moe_ffn_size / etp + h) * t_l
        s_f = model.moe_shared_expert_intermediate_size or 0
        fwd += (h + s_f / tp) * sp * t_l if s_f else 0.0
        bwd += (glu * s_f / tp + h) * sp * t_l if s_f else 0.0
    else:
        fwd += (h + model.ffn_size / tp) * sp * t_l
        bwd += (glu * model.ffn_size / tp + h) * sp * t_l
    return fwd, bwd


# --------------------------------------------------------------------------------------------- communication


def _tp_comm_s(x: _LayerInputs, tp_comm_overlap: bool) -> tuple[float, float]:
    """(exposed TP seconds each way, the MLP block's exposed share of it).  Sequence parallel: an all-gather
    and a reduce-scatter around each TP block; the ETP collectives of the dispatcher are added as they are."""
    tp = x.shape.tp
    tp_s = mlp_tp = 0.0
    if tp > 1:
        full = x.gathered_tokens * x.model.hidden_size * x.act
        links = x.links
        attn_tp = collective_s(links.tp, "all_gather", full, tp) + collective_s(links.tp, "reduce_scatter", full, tp)
        if not x.is_moe or x.model.moe_shared_expert_intermediate_size:
            mlp_tp = attn_tp  # the dense MLP, or the shared experts, are a TP block of their own
        tp_s = attn_tp + mlp_tp
        if tp_comm_overlap:
            mlp_tp *= TP_COMM_OVERLAP_EXPOSED
    if tp_comm_overlap:  # userbuffers overlap the TP linear layers' collectives, not the dispatcher's
        tp_s *= TP_COMM_OVERLAP_EXPOSED
    tp_s += _qkv_gather_s(x)
    tp_s += x.dispatch.etp_s if x.dispatch else 0.0
    return tp_s, mlp_tp


def gathers_qkv(model: ModelSpec, tp: int) -> bool:
    """Whether Megatron-core all-gathers the QKV projection output over TP: fewer KV groups than TP ranks, not MLA."""
    return tp > 1 and not model.multi_latent_attention and model.query_groups < tp


def _qkv_gather_s(x: _LayerInputs) -> float:
    """Seconds each way of the QKV gather that fewer KV groups than TP ranks cost.  Megatron-core (attention.py
    `get_query_key_value_tensors`, NVIDIA/Megatron-LM @d98e8a64): when num_query_groups < TP, each rank all-gathers
    the QKV projection's output over TP along its last dimension and slices out its group's heads, so the forward
    moves the whole projection output (every gathered token x (heads + 2 x groups) x head_dim) and the backward its
    gradient's reduce-scatter; a standalone collective, not one the userbuffer overlap hides.  Priced as the mean of
    the two each way (the layer charges its TP time both ways).  MLA attention has no such step."""
    tp, model = x.shape.tp, x.model
    if not gathers_qkv(model, tp):
        return 0.0
    full = x.gathered_tokens * _qkv_width(model) * x.act
    links = x.links.tp
    return 0.5 * (collective_s(links, "all_gather", full, tp) + collective_s(links, "reduce_scatter", full, tp))


def _cp_comm_s(x: _LayerInputs, attention_core_s: float) -> tuple[float, float]:
    """(forward, backward) exposed context-parallel seconds, by --cp-comm-type."""
    cp, model = x.shape.cp, x.model
    if cp <= 1:
        return 0.0, 0.0
    t_g, tp, act, links = x.gathered_tokens, x.shape.tp, x.act, x.links
    kv_bytes = 2 * t_g * model.query_groups * model.head_dim / min(tp, model.query_groups) * act
    cp_comm_type = x.training.cp_comm_type
    if cp_comm_type in ("p2p", "a2a+p2p"):
        # ring: step i computes with the keys and values received at step i-1 while sending them on; a step's
        # send is exposed where it outlasts that step's attention (backward also returns their gradients)
        step = collective_s(links.cp, "p2p", kv_bytes, 2)
        attn_step = attention_core_s / cp
        return ((cp - 1) * max(0.0, step - attn_step),
                (cp - 1) * max(0.0, 2 * step - ATTENTION_BWD_OVER_FWD * attn_step))
    if cp_comm_type == "a2a":  # Ulysses: Q, K, V in and O out, head-scattered
        q_bytes = t_g * model.num_attention_heads * model.head_dim / tp * act
        moved = 2 * q_bytes + kv_bytes
        a2a = collective_s(links.cp, "all_to_all", moved, cp)
        return a2a, a2a
    # allgather of K and V
    fwd = collective_s(links.cp, "all_gather", kv_bytes * cp, cp)
    return fwd, fwd + collective_s(links.cp, "reduce_scatter", kv_bytes * cp, cp)


def _ep_comm_s(x: _LayerInputs, *, hide_s: float, shared_s: float
               ) -> tuple[float, float, tuple[float, float]]:
    """(forward, backward) exposed expert-parallel seconds: dispatch + combine each way, less what
    --overlap-moe-expert-parallel-comm hides behind `hide_s` (the other micro-batch's forward and backward
    compute) in a step that pairs a forward with a backward, and --moe-shared-expert-overlap behind the shared
    experts; and the (forward, backward) seconds the EP overlap hid, which a step running alone (the schedule's
    warm-up and cool-down: `ep_overlap_steady_share`) pays back (CostModel.stage)."""
    d, tr = x.dispatch, x.training
    ep_fwd = ep_bwd = d.comm_s if d else 0.0
    if d:
        ep_fwd += d.counts_s  # the forward's all-gather of tokens per expert (planner/cost/dispatch.py)
    hidden = (0.0, 0.0)
    if d and tr.overlap_moe_expert_parallel_comm:
        total = ep_fwd + ep_bwd
        exposed = max((1.0 - EP_OVERLAP_HIDDEN) * total, total - hide_s)
        raw = ep_fwd, ep_bwd
        ep_fwd, ep_bwd = (exposed * ep_fwd / total, exposed * ep_bwd / total) if total > 0 else (0.0, 0.0)
        hidden = raw[0] - ep_fwd, raw[1] - ep_bwd
    if d and tr.moe_shared_expert_overlap and shared_s:
        ep_fwd = max(0.0, ep_fwd - shared_s)
        ep_bwd = max(0.0, ep_bwd - GEMM_BWD_OVER_FWD * shared_s)
    return ep_fwd, ep_bwd, hidden


# --------------------------------------------------------------------------------------------- memory, recompute


def _activations(x: _LayerInputs) -> ActivationModules:
    return activation_bytes_per_token(
        x.model, x.training, is_moe=x.is_moe, tp=x.shape.tp, etp=x.shape.etp,
        sequence_parallel=x.shape.sequence_parallel,
        copies_per_token=x.dispatch.copies_per_token if x.dispatch else 0.0, seq_length=x.shape.seq_length,
    )


def _module_fwd_s(x: _LayerInputs, c: _ComputeParts, mlp_tp_s: float, launches: dict[str, float]) -> dict[str, float]:
    """Forward seconds selective recompute re-runs, by --recompute-modules name: the module's GPU time, or the
    host time to launch its kernels again when that is longer."""
    gpu = {
        "core_attn": c.attention_core,
        "layernorm": c.layernorm,
        "moe_act": c.activation if x.is_moe else 0.0,
        "mlp": (c.mlp_gemm + c.activation + mlp_tp_s) if not x.is_moe else 0.0,
        "moe": (c.expert_gemm + c.activation + _expert_bias_s(x)[0] + x.dispatch.total_s) if x.is_moe else 0.0,
        "shared_experts": c.shared_expert_gemm,
        "mla_up_proj": c.mla_up_proj,
    }
    relaunched = {  # host operations a recomputed module issues again, with its checkpoint wrapper
        "core_attn": 2.0, "layernorm": 2.0 * 2, "moe_act": 2.0 if x.is_moe else 0.0,
        "mlp": launches.get("mlp", 0.0), "moe": launches.get("moe", 0.0),
        "shared_experts": launches.get("shared_experts", 0.0),
        "mla_up_proj": 4.0 if x.model.multi_latent_attention else 0.0,
    }
    return {m: max(t, x.kernels.host_s(relaunched[m])) if t or relaunched[m] else 0.0 for m, t in gpu.items()}


BWD_LAUNCHES_OVER_FWD = 1.0
"""Host operations of the backward per forward operation: autograd replays one node per forward operation, from C++
(assumption)."""
HOST_OPS_FWD = {
    "attention": 9.0,  # fused norm+QKV linear, reshape, RoPE on q and k, fused attention, output linear, bias-dropout-add
    "qk_layernorm": 2.0,
    "mla": 7.0,  # MLA adds the down/up projections, the latent norm, the RoPE split and the concatenations
    "tp_block": 2.0,  # the sequence-parallel all-gather and reduce-scatter of a TP block
    "cp_step": 3.0,  # one ring step: send/receive and a partial attention with its correction
    "mlp": 4.0,  # fused norm+fc1, activation, fc2, bias-dropout-add
    "moe_router": 6.0,  # router linear, score function, top-k, scaling, routing map and probabilities
    "moe_balancing": 5.0,  # auxiliary or sequence-auxiliary loss, or the expert-bias update (router scope)
    "moe_preprocess": 6.0,  # tokens per expert, the split sizes and their host copy, permutation metadata
    "moe": 12.0,  # norm, permute, dispatch, two grouped linears and the activation, combine, unpermute, bias-dropout-add
    "shared_experts": 5.0,  # fc1, activation, fc2, and with --moe-shared-expert-overlap the stream hand-off
}
"""Host (Python-level) operations of one layer's forward per micro-batch, by module: ASSUMED counts from Megatron's
module structure with Transformer Engine (each a module or tensor call the CPU issues; Transformer Engine's
grouped linear loops over the experts in C++, so local experts add no Python operations).  A module captured in a
CUDA graph (--cuda-graph-impl with --cuda-graph-scope) is one graph launch instead."""


def _graphed(x: _LayerInputs, scope: str) -> bool:
    """Is `scope` (attn, mlp, moe, moe_router, moe_preprocess) captured in a per-layer CUDA graph?"""
    tr = x.training
    if tr.cuda_graph_impl == "none":
        return False
    scopes = set(tr.cuda_graph_scope)
    return not scopes or bool(scopes & {"full", "full_iteration", scope})


def _launches_fwd(x: _LayerInputs) -> dict[str, float]:
    """Host operations of one layer's forward per micro-batch, by recompute-module name (HOST_OPS_FWD)."""
    model, shape, ops = x.model, x.shape, HOST_OPS_FWD
    tp_block = ops["tp_block"] if shape.tp > 1 else 0.0
    attention = ops["attention"] + tp_block + (ops["qk_layernorm"] if model.qk_layernorm else 0.0)
    attention += (ops["mla"] if model.multi_latent_attention else 0.0) + ops["cp_step"] * (shape.cp - 1)
    out = {"attention": 1.0 if _graphed(x, "attn") else attention}
    if not x.is_moe:
        out["mlp"] = 1.0 if _graphed(x, "mlp") else ops["mlp"] + tp_block
        return out
    balancing = not model.moe_router_force_load_balancing and model.moe_router_load_balancing_type != "none"
    router = ops["moe_router"] + (ops["moe_balancing"] if balancing or model.moe_router_enable_expert_bias else 0.0)
    if _graphed(x, "moe"):
        out["moe"] = 1.0
    else:
        out["moe"] = (ops["moe"] + (1.0 if _graphed(x, "moe_router") else router)
                      + (1.0 if _graphed(x, "moe_preprocess") else ops["moe_preprocess"]))
    if model.moe_shared_expert_intermediate_size:
        out["shared_experts"] = ops["shared_experts"] + tp_block
    return out


def _transient_bytes(x: _LayerInputs) -> float:
    """Buffers alive only while the layer runs: unfused attention's scores and softmax gradient
    (planner/cost/memory.py), or the dispatcher's receive buffer and permuted copy of this GPU's expert tokens."""
    attention = attention_transient_bytes(x.model, x.training, tp=x.shape.tp, gathered_tokens=x.gathered_tokens,
                                          seq_length=x.shape.seq_length)
    if not x.dispatch:
        return attention
    # attention and dispatch run one after the other: their buffers are not alive at once
    return max(attention, 2 * x.local_tokens * x.dispatch.copies_per_token * x.model.hidden_size * x.act)
