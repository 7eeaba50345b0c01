"""The one evaluator: prices a whole Plan (every stage, the pipeline schedule, gradient sync,
optimizer step, memory) from the model, training settings, cluster and device profiles.

Iteration time (1F1B, DESIGN section 3), with t_i the per-micro-batch forward+backward time of
stage i including its pipeline sends (`stage_time_with_links`), m micro-batches and v virtual chunks per rank:
    T = sum_i t_i / v + (m - 1/v) * max_i t_i + fill + max_i (exposed DP sync_i + optimizer step_i)
For v = 1 this is sum_i t_i + (m-1) * max_i t_i (fill = 0); for uniform stages it is (m + (PP-1)/v) * t,
the interleaved schedule's bubble, plus `fill`: the first micro-batch goes through every virtual stage, so its
forward and its backward cross each boundary v times, each a whole message, which the chunk-sized bubble does
not hold (StageCost.fill_out_s; the wrap-around sends from the last rank to the first are not priced).
planner/simulate.py checks the formula by simulation (tests/test_simulate_vs_model.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import NamedTuple

import numpy as np

from planner.cost.communication import GroupLinks, LinkChoice, collective_s, stage_group_links
from planner.cost.dispatch import routing
from planner.cost.flops import logits_fwd_flop_per_token, model_flop_per_iteration, parameter_counts
from planner.cost.kernels import GEMM_BWD_OVER_FWD, Kernels
from planner.cost.layer import BLACKWELL_DEVICES, LayerCost, LayerShape, ep_overlap_steady_share, layer_cost
from planner.cost.memory import (
    UNITEMISED_ALLOCATED_GIB, ParamBytes, allocator_cache_fraction, comm_buffer_bytes, loss_reserved_bytes,
    process_groups, recorded_cache_share,
)
from planner.profile_tables import TIME_CORRECTION_KINDS, ProfileSet
from planner.schemas.cluster import POOL_SEP, ClusterSpec
from planner.schemas.device import DeviceProfile, LinkProfile
from planner.schemas.model import ModelSpec
from planner.schemas.pipeline import (
    pipeline_boundary_crosses_nodes, pipeline_boundary_may_stay_in_node, stage_time_with_links,
)
from planner.schemas.plan import Plan, Recompute
from planner.schemas.training import TrainingSpec
from planner.uncertainty import default_memory_headroom
from planner.units import GIB_BYTES, US_S

DP_OVERLAP_MIN_EXPOSED = 0.1  # with overlap, at least the last bucket's share stays exposed (assumption)
NEAR_CAPACITY_FRACTION = 0.97
"""A stage at 97-100% of what it may use (capacity less headroom) fits, but is marked in the output (issue 19)."""

TIME_PARTS = (
    "attention_gemm", "attention_core", "attention_dropout", "mlp_gemm", "expert_gemm", "shared_expert_gemm",
    "router_permute", "fp8_cast", "elementwise", "tp_comm", "cp_comm", "ep_comm", "host_overhead", "fsdp_comm",
    "recompute", "embedding", "logits_loss", "mtp_proj", "pp_comm", "chunk_stall", "pipeline_bubble", "dp_sync",
    "optimizer", "iteration_overhead",
)
"""The mechanisms an iteration's time is split into (PlanCost.time_breakdown): a decoder layer's named parts
(planner/cost/layer.py LayerCost.parts: host_overhead is the time a layer waits for its kernel launches),
recompute, the stage ends, pipeline sends, the interleaved schedule's stall on unequal chunks (`chunk_stall_layers`),
the bubble, the gradient sync, the optimizer step and the fixed host time per iteration."""
END_PARTS = ("embedding", "logits_loss", "mtp_proj")
"""The time parts of a stage's ends (not its decoder layers)."""


@dataclass(frozen=True)
class StageMemory:
    """What one GPU of a stage holds, but for the activations of the micro-batches in flight (its index fixes how
    many: CostModel.inflight_microbatches): the memory part of a StageCore, which CostModel.stage_memory gives
    without pricing the stage's time (the same numbers: StageCore holds these fields).  The fit check of a stage
    holding `inflight` micro-batches is `fits_at(inflight)`; StageCost.fits is it at the stage's own count."""

    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    act_per_microbatch_bytes: float  # activations one in-flight micro-batch keeps
    fixed_act_bytes: float  # activation buffers alive once, whatever the micro-batches in flight
    unitemised_bytes: float  # torch-allocated memory the terms above leave out (memory.UNITEMISED_ALLOCATED_GIB)
    context_bytes: float  # CUDA/ROCm/CANN context of the process (the device's memory_overhead_gib)
    comm_buffer_bytes: float  # NCCL/RCCL/HCCL communicator buffers of the groups the rank uses
    device_memory_bytes: float  # the device's memory as the framework reports it
    capacity_bytes: float  # what the plan may use: device memory less the memory headroom
    # what the allocator reserves beyond the allocated peak: (its cache over the activations, a share:
    # memory.allocator_cache_fraction; the bytes it reserves anew for the unfused loss's FP32 logits:
    # memory.loss_reserved_bytes); one field, for the reason StageCore.ep_hidden_s gives
    allocator_cache: tuple[float, float]
    recorded_cache_share: float  # of the free memory a long run's recorded reserved peak fills (memory.py)

    @property
    def cache_fraction(self) -> float:
        """The allocator's cache over the activations (memory.allocator_cache_fraction)."""
        return self.allocator_cache[0]

    @property
    def loss_reserved_bytes(self) -> float:
        """What the allocator reserves anew for the unfused loss's FP32 logits (memory.loss_reserved_bytes; 0 but on
        the last stage)."""
        return self.allocator_cache[1]

    @property
    def other_bytes(self) -> float:
        """Memory outside torch's allocator: context and communicator buffers."""
        return self.context_bytes + self.comm_buffer_bytes

    @property
    def headroom_bytes(self) -> float:
        return self.device_memory_bytes - self.capacity_bytes

    @property
    def held_static_bytes(self) -> float:
        """What the stage holds whatever the micro-batches in flight, as the fit check counts it: static_bytes, the
        allocator's cache on the activation buffers alive once and the segment it reserves anew for the unfused
        loss's logits."""
        return self.static_bytes + self.cache_fraction * self.fixed_act_bytes + self.loss_reserved_bytes

    @property
    def held_act_per_microbatch_bytes(self) -> float:
        """What each in-flight micro-batch adds to the fit check: its activations and the allocator's cache on
        them.  A stage fits when held_static_bytes + in-flight * this <= capacity_bytes (StageCost.fits)."""
        return self.act_per_microbatch_bytes * (1.0 + self.cache_fraction)

    @property
    def static_bytes(self) -> float:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.fixed_act_bytes
                + self.unitemised_bytes + self.other_bytes)

    # the peak with `inflight` micro-batches in flight: StageCost's properties of the same names at its own count

    def activations_bytes_at(self, inflight: float) -> float:
        return inflight * self.act_per_microbatch_bytes + self.fixed_act_bytes

    def allocated_bytes_at(self, inflight: float) -> float:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes_at(inflight)
                + self.unitemised_bytes)

    def reserved_bytes_at(self, inflight: float) -> float:
        activations = self.activations_bytes_at(inflight)
        return self.allocated_bytes_at(inflight) + self.cache_fraction * activations + self.loss_reserved_bytes

    def memory_bytes_at(self, inflight: float) -> float:
        return self.reserved_bytes_at(inflight) + self.other_bytes

    def fits_at(self, inflight: float) -> bool:
        return self.memory_bytes_at(inflight) <= self.capacity_bytes


@dataclass(frozen=True)
class StageCore(StageMemory):
    """The neighbour- and index-independent part of a stage (see CostModel.stage_core): per-micro-batch
    times without pipeline sends, per-iteration sync and optimizer step, per-GPU memory without the
    in-flight activations (its StageMemory fields)."""

    device_type: str
    num_layers: int
    dp: int
    recompute: str
    micro_batch_size: int
    forward_s: float
    backward_s: float  # includes recompute
    compute_s: float  # fwd + bwd + recompute compute, per micro-batch
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    dp_comm_s: float  # exposed, per iteration
    optimizer_s: float  # per iteration
    iteration_overhead_s: float  # fixed host time per iteration (kernels.py ITERATION_HOST_S, calibrated)
    parts: tuple[tuple[str, float], ...]  # forward + backward seconds per micro-batch by mechanism (TIME_PARTS)
    # (forward, backward) EP seconds per micro-batch the EP overlap hid in the schedule's paired steps, which its
    # unpaired steps pay (CostModel.stage); one field, not two: 30 instance attributes or more cost CPython its
    # key-sharing dict, 5x the memory of each of the ~10^5 cores a search keeps
    ep_hidden_s: tuple[float, float]

    @property
    def time_s(self) -> float:
        """Per-micro-batch forward + backward (of a StageCost: the t_i of the schedule formula)."""
        return self.forward_s + self.backward_s

    @property
    def sync_s(self) -> float:
        """Per iteration, after the pipeline: exposed DP sync, optimizer step and the fixed host time."""
        return sync_sum(self.dp_comm_s, self.optimizer_s, self.iteration_overhead_s)


def sync_sum(dp_comm_s: float, optimizer_s: float, iteration_overhead_s: float) -> float:
    """A stage's per-iteration time after the pipeline from its parts (StageCore.sync_s)."""
    return dp_comm_s + optimizer_s + iteration_overhead_s


_CORE_FIELDS = tuple(f.name for f in fields(StageCore))


@dataclass(frozen=True)
class StageCost(StageCore):
    """One pipeline stage in its place: its StageCore, with the sends on both of its pipeline links
    (`pp_comm_s`, half of it in `forward_s` and half in `backward_s`) and the micro-batches whose
    activations it holds at its peak."""

    index: int
    pp_comm_s: float
    inflight_microbatches: float
    send_out_s: float = 0.0  # one message (a chunk's activations) to the next stage, before any overlap
    fill_out_s: float = 0.0  # what the boundary to the next stage adds to the pipeline's fill (`link_fill_s`)

    @classmethod
    def place(cls, core: StageCore, *, index: int, pp_comm_s: float, inflight_microbatches: float,
              send_out_s: float = 0.0, fill_out_s: float = 0.0, stall: tuple[float, float] = (0.0, 0.0),
              ep_unpaired: tuple[float, float] = (0.0, 0.0)) -> "StageCost":
        """`core` as stage `index` with `pp_comm_s` of pipeline sends per micro-batch (exposed), one message to
        the next stage taking `send_out_s` and `fill_out_s` of that boundary in the pipeline's fill, the
        interleaved schedule's stall (forward, backward seconds: `CostModel.chunk_stall`) and the EP communication
        the schedule's unpaired steps leave exposed (forward, backward seconds: `CostModel.ep_unpaired`)."""
        fields_of_core = {name: getattr(core, name) for name in _CORE_FIELDS}
        extra = (("chunk_stall", sum(stall)),) if any(stall) else ()
        extra += (("ep_comm", sum(ep_unpaired)),) if any(ep_unpaired) else ()
        fields_of_core.update(forward_s=core.forward_s + stall[0] + ep_unpaired[0] + pp_comm_s / 2,
                              backward_s=core.backward_s + stall[1] + ep_unpaired[1] + pp_comm_s / 2,
                              ep_comm_s=core.ep_comm_s + sum(ep_unpaired),
                              parts=core.parts + extra + (("pp_comm", pp_comm_s),))
        return cls(**fields_of_core, index=index, pp_comm_s=pp_comm_s, inflight_microbatches=inflight_microbatches,
                   send_out_s=send_out_s, fill_out_s=fill_out_s)

    @property
    def activations_bytes(self) -> float:
        return self.activations_bytes_at(self.inflight_microbatches)

    @property
    def allocated_bytes(self) -> float:
        """What torch's allocator holds at the peak (Megatron's `mem-max-allocated`, torch.cuda.max_memory_allocated):
        weights, gradients, optimizer state, activations and what these terms leave out (unitemised_bytes); not the
        context and the communicator buffers."""
        return self.allocated_bytes_at(self.inflight_microbatches)

    @property
    def reserved_bytes(self) -> float:
        """What the allocator reserves at the peak (torch.cuda.max_memory_reserved): the allocated peak and the
        blocks it caches beyond it, a share (cache_fraction, by the run's allocator settings) of the activations,
        which are allocated and freed every micro-batch; weights, gradients and optimizer state sit in buffers
        allocated once; on the last stage under the unfused loss, one more FP32 copy of a micro-batch's logits per
        loss head (loss_reserved_bytes)."""
        return self.reserved_bytes_at(self.inflight_microbatches)

    @property
    def recorded_reserved_bytes(self) -> float:
        """The reserved peak a long run records (torch.cuda.max_memory_reserved since the start): the needed
        reserved peak, and where tensor sizes vary between micro-batches a share of the device memory left free
        above it, which the allocator fills with cached segments while the driver still grants them (it releases
        them before it would run out: the fit check uses reserved_bytes).  planner/cost/memory.py
        RECORDED_CACHE_SHARE."""
        free = max(0.0, self.device_memory_bytes - self.other_bytes - self.reserved_bytes)
        return self.reserved_bytes + self.recorded_cache_share * free

    @property
    def memory_bytes(self) -> float:
        """The device memory the stage needs at its peak: what the allocator reserves and the memory outside it
        (context, communicator buffers).  The fit check compares it with the capacity."""
        return self.memory_bytes_at(self.inflight_microbatches)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB_BYTES

    @property
    def fits(self) -> bool:
        return self.fits_at(self.inflight_microbatches)

    @property
    def fits_device(self) -> bool:
        """Within the device's whole memory (the headroom not kept free): a stage that fits the device but not
        the usable memory may run, or run out, within the memory model's error (the headroom)."""
        return self.memory_bytes <= self.device_memory_bytes

    @property
    def capacity_fraction(self) -> float:
        """Memory over what the plan may use (capacity less headroom)."""
        return self.memory_bytes / self.capacity_bytes if self.capacity_bytes > 0 else math.inf

    @property
    def near_capacity(self) -> bool:
        """Fits, but within NEAR_CAPACITY_FRACTION of what the plan may use: marked in the output."""
        return self.fits and self.capacity_fraction >= NEAR_CAPACITY_FRACTION

    def to_json(self) -> dict:
        g = GIB_BYTES
        return {
            "index": self.index,
            "device_type": self.device_type,
            "num_layers": self.num_layers,
            "dp": self.dp,
            "recompute": self.recompute,
            "micro_batch_size": self.micro_batch_size,
            "time_s": self.time_s,
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "compute_s": self.compute_s,
            "recompute_s": self.recompute_s,
            "tp_comm_s": self.tp_comm_s,
            "cp_comm_s": self.cp_comm_s,
            "ep_comm_s": self.ep_comm_s,
            "pp_comm_s": self.pp_comm_s,
            "dp_comm_s": self.dp_comm_s,
            "optimizer_s": self.optimizer_s,
            "iteration_overhead_s": self.iteration_overhead_s,
            "memory_gib": self.memory_gib,
            "peak_allocated_gib": self.allocated_bytes / g,
            "peak_reserved_gib": self.reserved_bytes / g,
            "allocator_cache_gib": (self.reserved_bytes - self.allocated_bytes) / g,
            "peak_reserved_recorded_gib": self.recorded_reserved_bytes / g,
            "weights_gib": self.weights_bytes / g,
            "grads_gib": self.grads_bytes / g,
            "optimizer_gib": self.optimizer_bytes / g,
            "activations_gib": self.activations_bytes / g,
            "unitemised_gib": self.unitemised_bytes / g,
            "other_gib": self.other_bytes / g,
            "context_gib": self.context_bytes / g,
            "comm_buffers_gib": self.comm_buffer_bytes / g,
            "capacity_gib": self.device_memory_bytes / g,
            "usable_gib": self.capacity_bytes / g,
            "headroom_gib": self.headroom_bytes / g,
            "capacity_used_fraction": self.capacity_fraction,
            "near_capacity": self.near_capacity,
            "inflight_microbatches": self.inflight_microbatches,
            "fits": self.fits,
            "fits_device": self.fits_device,
        }


@dataclass(frozen=True)
class PlanCost:
    iteration_time_s: float
    pipeline_s: float
    bubble_s: float
    sync_s: float
    num_microbatches: int
    world_size: int
    model_flop_per_iteration: float
    peak_flop_per_s_total: float
    stages: tuple[StageCost, ...]
    notes: tuple[str, ...] = field(default=())
    memory_headroom: float = 0.0  # fraction of each device's memory the plan keeps free

    @property
    def tflops_per_gpu(self) -> float:
        return self.model_flop_per_iteration / (self.iteration_time_s * 1e12 * self.world_size)

    @property
    def mfu(self) -> float:
        """Model FLOPs over the peak of every GPU in the plan (weighted by each device's peak)."""
        return self.model_flop_per_iteration / (self.iteration_time_s * self.peak_flop_per_s_total)

    @property
    def max_memory_gib(self) -> float:
        return max(s.memory_gib for s in self.stages)

    @property
    def max_allocated_gib(self) -> float:
        return max(s.allocated_bytes for s in self.stages) / GIB_BYTES

    @property
    def max_reserved_gib(self) -> float:
        return max(s.reserved_bytes for s in self.stages) / GIB_BYTES

    @property
    def max_reserved_recorded_gib(self) -> float:
        return max(s.recorded_reserved_bytes for s in self.stages) / GIB_BYTES

    def time_breakdown(self) -> dict[str, float]:
        """Seconds of the iteration by mechanism (TIME_PARTS, zero entries omitted), summing to
        `iteration_time_s`: the slowest stage's per-micro-batch parts times the micro-batches, the pipeline
        bubble (the rest of the pipeline time), and the DP sync and optimizer step of the stage whose
        per-iteration sync is longest (the schedule formula's terms)."""
        slowest = max(self.stages, key=lambda s: s.time_s)
        out: dict[str, float] = {}
        for name, sec in slowest.parts:
            out[name] = out.get(name, 0.0) + self.num_microbatches * sec
        out["pipeline_bubble"] = self.pipeline_s - self.num_microbatches * slowest.time_s
        syncing = max(self.stages, key=lambda s: s.sync_s)
        out["dp_sync"] = syncing.dp_comm_s
        out["optimizer"] = syncing.optimizer_s
        out["iteration_overhead"] = syncing.iteration_overhead_s
        return {k: v for k, v in out.items() if v}

    def time_shares(self) -> dict[str, float]:
        """`time_breakdown` as fractions of the iteration time (summing to 1)."""
        return {k: v / self.iteration_time_s for k, v in self.time_breakdown().items()}

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages)

    @property
    def fits_device(self) -> bool:
        """Every stage within its device's whole memory (StageCost.fits_device)."""
        return all(s.fits_device for s in self.stages)

    @property
    def overflow_stages(self) -> list[int]:
        return [s.index for s in self.stages if not s.fits]

    def to_json(self) -> dict:
        return {
            "iteration_time_s": self.iteration_time_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "max_memory_gib": self.max_memory_gib,
            "max_allocated_gib": self.max_allocated_gib,
            "max_reserved_gib": self.max_reserved_gib,
            "max_reserved_recorded_gib": self.max_reserved_recorded_gib,
            "fits": self.fits,
            "fits_device": self.fits_device,
            "memory_headroom": self.memory_headroom,
            "overflow_stages": self.overflow_stages,
            "world_size": self.world_size,
            "num_microbatches": self.num_microbatches,
            "pipeline_s": self.pipeline_s,
            "bubble_s": self.bubble_s,
            "sync_s": self.sync_s,
            "model_flop_per_iteration": self.model_flop_per_iteration,
            "stages": [s.to_json() for s in self.stages],
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------------------------
# context shared by every stage of one plan (and by the search's cost tables)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GlobalShape:
    """The plan-wide choices that fix per-layer costs (everything but per-stage options)."""

    tp: int
    cp: int
    ep: int
    etp: int
    vpp: int
    mbs: int
    gbs: int
    dp0: int
    pp: int
    sequence_parallel: bool

    @property
    def num_microbatches(self) -> int:
        return self.gbs // (self.mbs * self.dp0)

    @classmethod
    def of(cls, plan: Plan) -> "GlobalShape":
        return cls(tp=plan.tp, cp=plan.cp, ep=plan.ep, etp=plan.etp, vpp=plan.vpp, mbs=plan.mbs, gbs=plan.gbs,
                   dp0=plan.dp0, pp=plan.pp, sequence_parallel=plan.sequence_parallel)


def tp_overlap_runs(training, device) -> bool:
    """Whether --tp-comm-overlap (Transformer Engine's userbuffers) hides TP communication on `device`.  On NVIDIA
    GPUs before Blackwell it needs CUDA_DEVICE_MAX_CONNECTIONS=1, or the communication kernels queue behind the GEMM
    they should overlap (Megatron-Bridge docs/performance-guide.md); with --overlap-moe-expert-parallel-comm the
    launch exports 32 for the EP overlap (planner/launcher/megatron.py `max_connections`; Megatron: "1 or 32, which
    depends on which parallelization you want to prioritize"), so there the TP overlap is priced as absent."""
    if not training.tp_comm_overlap:
        return False
    pre_blackwell_nvidia = device.vendor.upper() == "NVIDIA" and device.name not in BLACKWELL_DEVICES
    return not (training.overlap_moe_expert_parallel_comm and pre_blackwell_nvidia)


class CostModel:
    """Binds model, training, cluster and profiles; prices stages and plans.

    Per-layer costs are memoised by (device, micro-batch, layer kind, the TP/CP/EP/ETP degrees and sequence
    parallelism: what a layer reads, not its stage's DP): the search tabulates them once and composes stages from
    them, exactly as `evaluate` does.
    """

    def __init__(self, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, profiles: ProfileSet, *,
                 memory_headroom: float | None = None) -> None:
        """`memory_headroom`: the fraction of each device's memory a plan keeps free (None: the shipped
        default, derived from the memory model's measured error, planner/uncertainty.py)."""
        self.model = model
        self.memory_headroom = default_memory_headroom() if memory_headroom is None else float(memory_headroom)
        self.training = training
        self.cluster = cluster
        self.profiles: ProfileSet = profiles
        self._layer_cache: dict = {}
        self._core_cache: dict = {}
        self._memory_cache: dict = {}  # StageMemory by the core's key (stage_memory)
        self._comm_cache: dict = {}  # communicator buffer bytes per stage groups (_comm_buffer_bytes)
        self._own_cache: dict = {}  # a stage's weights + grads + optimizer bytes (stage_own_bytes)
        self._context_cache: dict[str, float] = {}
        self._sync_cache: dict = {}  # raw DP-sync collective times per stage shape (see _dp_sync_s)
        self._corr_cache: dict = {}
        self._link_cache: dict = {}
        self._group_link_cache: dict = {}
        self._kernel_cache: dict[str, Kernels] = {}
        self._flop_cache: dict[tuple[int, int], float] = {}  # Megatron's FLOP count per (global batch, TP)
        self._cross_link_cache: dict[tuple[str, str], LinkProfile] = {}
        self._p2p_cache: dict = {}  # one pipeline message's seconds per (shape, the two stages, node crossing)
        self.param_bytes = ParamBytes.of(training)
        counts = parameter_counts(model)
        n_moe = sum(model.layer_is_moe)
        n_dense = model.num_layers - n_moe
        self._attn_params = counts["attention"] / model.num_layers
        self._dense_mlp_params = counts["dense_mlp"] / n_dense if n_dense else 0.0
        self._expert_params = counts["experts"] / n_moe if n_moe else 0.0  # all experts of one layer
        self._shared_params = counts["shared_experts"] / n_moe if n_moe else 0.0
        self._router_params = counts["router"] / n_moe if n_moe else 0.0
        self._layer_is_moe = model.layer_is_moe
        self.routing = routing(model, training.moe_imbalance_factor, profiles.moe_imbalance_factor())

    # ---- lookups ----

    @property
    def layer_kinds(self) -> tuple[bool, ...]:
        """The model's decoder layers' kinds in order (True: MoE): ModelSpec.layer_is_moe, read once."""
        return self._layer_is_moe

    def on_cluster(self, cluster: ClusterSpec) -> "CostModel":
        """This cost model on another cluster (a view of its cluster: pooled types, capped links), pricing as this
        one does: same model, training, profiles and memory headroom (planner/cost/ranges.py RangeEnd keeps its
        multipliers too)."""
        return CostModel(self.model, self.training, cluster, self.profiles, memory_headroom=self.memory_headroom)

    def imbalance(self, ep: int, tokens_per_rank: float | None = None) -> float:
        """The busiest EP rank's tokens over the mean, each EP rank routing `tokens_per_rank` tokens per micro-batch
        (planner/cost/dispatch.py `Routing`)."""
        return self.routing.imbalance(ep, tokens_per_rank)

    def device(self, name: str) -> DeviceProfile:
        return self.profiles.device(name)

    def corrections(self, device: str) -> dict[str, float]:
        hit = self._corr_cache.get(device)
        if hit is None:
            hit = {k: self.profiles.correction(device, k) for k in TIME_CORRECTION_KINDS}
            self._corr_cache[device] = hit
        return hit

    def _context_bytes(self, device_type: str) -> float:
        """The process context on one GPU of `device_type` (its memory_overhead_gib with its correction), memoised."""
        hit = self._context_cache.get(device_type)
        if hit is None:
            hit = self._context_cache[device_type] = _memory_overhead_gib(self.profiles, self.device(device_type)) \
                * GIB_BYTES
        return hit

    def kernels(self, device_type: str) -> Kernels:
        hit = self._kernel_cache.get(device_type)
        if hit is None:
            tr = self.training
            hit = self._kernel_cache[device_type] = Kernels(
                self.device(device_type), self.corrections(device_type), tr.compute_dtype,
                tr.fp8_recipe if tr.precision == "fp8" else None, flash_attention=tr.attention_backend == "flash")
        return hit

    def _links(self, device_type: str):
        hit = self._link_cache.get(device_type)
        if hit is None:
            hit = self._link_cache[device_type] = self._links_uncached(device_type)
        return hit

    def _links_uncached(self, device_type: str):
        """(intra-node link, inter-node link, GPUs that share the intra-node link) of a type, with the cluster's
        overrides: the group's scale-up domain (an NVL72 rack's trays), else its host."""
        try:
            group = self.cluster.group_of(device_type)
        except KeyError:
            if POOL_SEP in device_type:
                return self._pool_links(device_type)
            dev = self.device(device_type)
            return dev.intra_node, dev.inter_node, dev.scale_up_domain_gpus or dev.gpus_per_node
        intra, inter = self.profiles.group_links(group)
        return intra, inter, group.domain_gpus

    def _pool_links(self, device_type: str):
        """A pooled type (a stage whose DP spans the members' nodes): its limiting member's links, the
        inter-node one no faster than the slowest member's NIC or link between members."""
        limiting = self.profiles.limiting_member(device_type)
        intra, inter, gpn = self._links(limiting)
        slowest = self.cross_link(device_type, device_type)
        if slowest.bandwidth_gb_per_s < inter.bandwidth_gb_per_s:
            inter = inter.model_copy(update={"bandwidth_gb_per_s": slowest.bandwidth_gb_per_s})
        return intra, inter, gpn

    def cross_link(self, type_a: str, type_b: str) -> LinkProfile:
        """The link pipeline activations cross between two device types of this cluster
        (`ProfileSet.cross_link`), memoised: every pipeline send of every stage the search prices asks for it."""
        hit = self._cross_link_cache.get((type_a, type_b))
        if hit is None:
            hit = self._cross_link_cache[(type_a, type_b)] = self.profiles.cross_link(type_a, type_b, self.cluster)
        return hit

    def domain_gpus(self, device_type: str) -> int:
        """GPUs of a type that share its intra-node link (what every link choice calls a node): one host, or the
        hosts of a scale-up domain (GB200/GB300 NVL72).  The launcher's hosts are the groups' gpus_per_node."""
        return self._links(device_type)[2]

    def group_links(self, device_type: str, *, tp: int, cp: int, dp: int, ep: int, etp: int) -> GroupLinks:
        key = (device_type, tp, cp, dp, ep, etp)
        hit = self._group_link_cache.get(key)
        if hit is None:
            intra, inter, gpn = self._links(device_type)
            hit = self._group_link_cache[key] = stage_group_links(
                intra=intra, inter=inter, domain_gpus=gpn, tp=tp, cp=cp, dp=dp, ep=ep, etp=etp,
                factors=self.corrections(device_type))
        return hit

    def layer_links(self, device_type: str, *, tp: int, cp: int, ep: int, etp: int) -> GroupLinks:
        """The links a decoder layer's price reads: the TP, CP, EP, ETP and expert-group links of a stage's groups,
        which do not depend on its DP (communication.stage_group_links places them inside the TP x CP x ETP x EP
        blocks); its DP and expert-DP links are left out (None: a layer that read them would fail, not be priced
        for some other DP)."""
        return replace(self.group_links(device_type, tp=tp, cp=cp, dp=1, ep=ep, etp=etp), dp=None, edp=None)

    def layer(self, g: GlobalShape, device_type: str, dp: int, stage_mbs: int, is_moe: bool) -> LayerCost:
        """One decoder layer of a stage of `device_type` (`dp`: the stage's DP, which the layer's price does not
        read: `layer_links`), memoised by what it reads."""
        key = (g.tp, g.cp, g.ep, g.etp, g.sequence_parallel, device_type, stage_mbs, is_moe)
        hit = self._layer_cache.get(key)
        if hit is not None:
            return hit
        sp = g.tp if g.sequence_parallel and g.tp > 1 else 1
        shape = LayerShape(
            tp=g.tp, cp=g.cp, ep=g.ep, etp=g.etp, micro_batch_size=stage_mbs, seq_length=self.model.seq_length,
            sequence_parallel=sp > 1, imbalance=self.imbalance(g.ep, stage_mbs * self.model.seq_length / g.cp / sp),
            expert_fill=self.routing.fill,
        )
        kernels = self.kernels(device_type)
        cost = layer_cost(self.model, self.training, is_moe=is_moe, shape=shape, kernels=kernels,
                          links=self.layer_links(device_type, tp=g.tp, cp=g.cp, ep=g.ep, etp=g.etp),
                          tp_comm_overlap=tp_overlap_runs(self.training, kernels.device))
        self._layer_cache[key] = cost
        return cost

    def pp_link(self, g: GlobalShape, a_type: str, a_dp: int, b_type: str, b_dp: int, *,
                crosses_nodes: bool | None) -> LinkChoice:
        """The link a pipeline send from stage a (a_type, a_dp) to the next stage (b_type, b_dp) runs on: the link
        between the two device types when they differ; else the node's own link when the two stages' ranks share a
        node (`crosses_nodes` False, see `boundary_crosses_nodes`) and the inter-node link when they do not.
        `crosses_nodes` None: the fastest link the pair can get wherever it sits in the pipeline (the search's
        lower bounds)."""
        factors = tuple(sorted(self.corrections(a_type).items()))
        if a_type != b_type:
            link = self.cross_link(a_type, b_type)
            return LinkChoice(intra=link, inter=None, ranks_per_node=1, factors=factors)
        intra, inter, gpn = self._links(a_type)
        if crosses_nodes is None:
            crosses_nodes = not pipeline_boundary_may_stay_in_node(
                g.tp * g.cp * a_dp, g.tp * g.cp * b_dp, gpn)
        return LinkChoice(intra=inter if crosses_nodes else intra, inter=None, ranks_per_node=1, factors=factors)

    def boundary_crosses_nodes(self, g: GlobalShape, a_type: str, a_offset_gpus: int, a_dp: int, b_type: str,
                               b_dp: int) -> bool:
        """Whether the pipeline sends from stage a to the next stage b leave a node: always between two device
        types; inside one type, when a node boundary falls inside the two stages' rank blocks (stage a starts
        `a_offset_gpus` into its type's GPUs: `type_offsets`; planner/schemas/pipeline.py
        `pipeline_boundary_crosses_nodes`)."""
        if a_type != b_type:
            return True
        return pipeline_boundary_crosses_nodes(a_offset_gpus, g.tp * g.cp * a_dp, g.tp * g.cp * b_dp,
                                               self.domain_gpus(a_type))

    # ---- a stage ----
    def stage_core(
        self, g: GlobalShape, *, device_type: str, start: int, end: int, dp: int, recompute: Recompute,
        is_first: bool, is_last: bool,
    ) -> "StageCore":
        """Everything about a stage that does not depend on its neighbours or its index:
        per-micro-batch forward/backward (no pipeline sends), per-iteration sync and optimizer,
        static memory and activation bytes per in-flight micro-batch.  Memoised by the layer kinds
        of the range, so the search tables and `evaluate` share the work and the numbers."""
        return self.stage_core_of_kinds(g, device_type=device_type, kinds=self._layer_is_moe[start:end], dp=dp,
                                        recompute=recompute, is_first=is_first, is_last=is_last)

    def stage_core_of_kinds(
        self, g: GlobalShape, *, device_type: str, kinds: tuple[bool, ...], dp: int, recompute: Recompute,
        is_first: bool, is_last: bool,
    ) -> "StageCore":
        """`stage_core` of a stage whose decoder layers have the kinds `kinds` (True: MoE), in order, wherever
        the model has such a range or not (the search's bounds price stages of one kind and many layers)."""
        kinds = tuple(kinds)
        key = _core_key(g, device_type, dp, recompute, kinds, is_first, is_last)
        hit = self._core_cache.get(key)
        if hit is None:
            hit = self._stage_core(g, key, device_type=device_type, kinds=kinds, dp=dp, recompute=recompute,
                                   is_first=is_first, is_last=is_last)
            self._core_cache[key] = hit
        return hit

    def stage_memory(
        self, g: GlobalShape, *, device_type: str, start: int, end: int, dp: int, recompute: Recompute,
        is_first: bool, is_last: bool,
    ) -> StageMemory:
        """The memory fields of `stage_core` (the same numbers: the same function gives both) without pricing the
        stage's time: what a fit check needs.  Memoised by the same key (a core already priced is its own memory)."""
        kinds = self._layer_is_moe[start:end]
        key = _core_key(g, device_type, dp, recompute, kinds, is_first, is_last)
        hit = self._core_cache.get(key)
        if hit is None:
            hit = self._memory_cache.get(key)
        if hit is None:
            by_kind = self._kind_layers(g, device_type, dp, self.stage_mbs(g, dp), kinds, recompute)
            params = self._stage_params(g, kinds, dp, is_first, is_last)
            fields_ = self._memory_fields(g, device_type, dp, kinds, recompute, is_first, is_last, by_kind, params)
            hit = self._memory_cache[key] = StageMemory(**fields_)
        return hit

    def stage_mbs(self, g: GlobalShape, dp: int) -> int:
        """Samples per micro-batch on one DP rank of a stage with `dp` (FlagScale: DP0*mbs/DP_i)."""
        return max(1, g.mbs * g.dp0 // dp)

    def _stage_core(self, g: GlobalShape, key: tuple, *, device_type: str, kinds: tuple[bool, ...], dp: int,
                    recompute: Recompute, is_first: bool, is_last: bool) -> "StageCore":
        """A stage = its decoder layers (with recompute) + its ends (embedding; logits, loss and MTP)
        + the parameters it holds (memory, gradient sync, optimizer step).  `key`: its memo key (_core_key)."""
        t = self._stage_times(g, device_type=device_type, kinds=kinds, dp=dp, recompute=recompute, is_first=is_first,
                              is_last=is_last)
        stage_mbs, lay, ends, fwd, bwd, dp_s, optimizer_s = \
            t.stage_mbs, t.lay, t.ends, t.fwd_s, t.bwd_s, t.dp_s, t.optimizer_s
        screened = self._memory_cache.pop(key, None)  # a stage_memory of it before: the core replaces it
        memory = screened.__dict__ if screened is not None else \
            self._memory_fields(g, device_type, dp, kinds, recompute, is_first, is_last, t.by_kind, t.params)
        return StageCore(
            **memory,
            device_type=device_type, num_layers=len(kinds), dp=dp, recompute=recompute.label,
            micro_batch_size=stage_mbs, forward_s=fwd, backward_s=bwd, compute_s=lay.compute_s + ends.compute_s,
            recompute_s=lay.recompute_s, tp_comm_s=lay.tp_s + ends.tp_s, cp_comm_s=lay.cp_s + ends.cp_s,
            ep_comm_s=lay.ep_s + ends.ep_s, dp_comm_s=dp_s, optimizer_s=optimizer_s,
            iteration_overhead_s=self.kernels(device_type).iteration_host_s,
            parts=_merge_parts(lay.parts, ends.parts),
            ep_hidden_s=(lay.ep_hidden_fwd_s + ends.ep_hidden_fwd_s, lay.ep_hidden_bwd_s + ends.ep_hidden_bwd_s),
        )

    def _stage_times(self, g: GlobalShape, *, device_type: str, kinds: tuple[bool, ...], dp: int,
                     recompute: Recompute, is_first: bool, is_last: bool) -> "_Times":
        """A stage's times (`_stage_core` but its memory): its layers and ends per micro-batch, its exposed DP sync
        and optimizer step per iteration."""
        stage_mbs = self.stage_mbs(g, dp)
        by_kind = self._kind_layers(g, device_type, dp, stage_mbs, kinds, recompute)
        params = self._stage_params(g, kinds, dp, is_first, is_last)
        lay = self._stage_layers(g, device_type, dp, by_kind, recompute)
        ends = self._stage_ends(g, device_type, dp, stage_mbs, is_first, is_last)
        fwd, bwd = lay.fwd_s + ends.fwd_s, lay.bwd_s + ends.bwd_s
        dp_s = self._dp_sync_s(device_type, g, dp, params, kinds, is_first, is_last, fwd_s=fwd, bwd_s=bwd)
        optimizer_s = self.kernels(device_type).memory_s(params.shard * self.param_bytes.optimizer_step_moved)
        return _Times(stage_mbs, by_kind, params, lay, ends, fwd, bwd, dp_s, optimizer_s)

    def stage_sync_s(self, g: GlobalShape, *, device_type: str, start: int, end: int, dp: int, recompute: Recompute,
                     is_first: bool, is_last: bool) -> float:
        """`stage_core(...).sync_s` (the same numbers: the same functions give them) without pricing the stage's
        memory or keeping a core: the search's sync bound reads only this of many stages.  A core already priced
        gives its own."""
        kinds = self._layer_is_moe[start:end]
        core = self._core_cache.get(_core_key(g, device_type, dp, recompute, kinds, is_first, is_last))
        if core is not None:
            return self._sync_total(g, device_type, dp, recompute, core.dp_comm_s, core.optimizer_s,
                                    core.iteration_overhead_s)
        t = self._stage_times(g, device_type=device_type, kinds=kinds, dp=dp, recompute=recompute, is_first=is_first,
                              is_last=is_last)
        return self._sync_total(g, device_type, dp, recompute, t.dp_s, t.optimizer_s,
                                self.kernels(device_type).iteration_host_s)

    def _sync_total(self, g: GlobalShape, device_type: str, dp: int, recompute: Recompute, dp_s: float,
                    optimizer_s: float, overhead_s: float) -> float:
        """StageCore.sync_s of a stage with these parts (a range end scales them as its stage_core does)."""
        return sync_sum(dp_s, optimizer_s, overhead_s)

    def _memory_fields(self, g: GlobalShape, device_type: str, dp: int, kinds: tuple[bool, ...], recompute: Recompute,
                      is_first: bool, is_last: bool, by_kind: "list[_KindLayers]", params: "_Params") -> dict:
        """What one GPU of the stage holds, StageMemory's fields: its parameters' weights, gradients and optimizer
        state, its decoder layers' (`by_kind`) and its ends' activations, the context and the communicator
        buffers."""
        dev = self.device(device_type)
        lay_act, lay_transient = self._layers_memory(by_kind, recompute)
        ends_act, ends_transient, loss_reserved = self._ends_memory(g, device_type, dp, self.stage_mbs(g, dp),
                                                                    is_first, is_last)
        weights, grads, optimizer = self._own_fields(g, kinds, dp, params)
        return dict(
            weights_bytes=weights, grads_bytes=grads, optimizer_bytes=optimizer,
            act_per_microbatch_bytes=lay_act + ends_act,
            fixed_act_bytes=lay_transient + ends_transient, unitemised_bytes=UNITEMISED_ALLOCATED_GIB * GIB_BYTES,
            context_bytes=self._context_bytes(device_type),
            comm_buffer_bytes=self._comm_buffer_bytes(g, dev, dp, is_first or is_last),
            device_memory_bytes=dev.memory_gib * GIB_BYTES,
            capacity_bytes=dev.memory_gib * GIB_BYTES * (1.0 - self.memory_headroom),
            allocator_cache=(allocator_cache_fraction(self.training.expandable_segments), loss_reserved),
            recorded_cache_share=recorded_cache_share(self.model),
        )

    def _comm_buffer_bytes(self, g: GlobalShape, dev: DeviceProfile, dp: int, an_end: bool) -> float:
        """The communicator buffers one rank of a stage holds (memory.comm_buffer_bytes of its process groups;
        `an_end`: the first or the last stage), memoised by what they read."""
        key = (dev.vendor, g.tp, g.cp, dp, g.pp, g.ep, g.etp, an_end)
        hit = self._comm_cache.get(key)
        if hit is None:
            groups = process_groups(tp=g.tp, cp=g.cp, dp=dp, pp=g.pp, ep=g.ep, etp=g.etp, moe=self.model.is_moe,
                                    tied_embedding_stage=an_end and not self.model.untie_embeddings_and_output_weights)
            hit = self._comm_cache[key] = comm_buffer_bytes(dev.vendor, groups)
        return hit

    def _own_fields(self, g: GlobalShape, kinds: tuple[bool, ...], dp: int,
                    params: "_Params") -> tuple[float, float, float]:
        """A stage's (weights, gradients, optimizer state) bytes per GPU (StageMemory's fields of those names)."""
        pb = self.param_bytes
        return (self._fsdp_resident(params.weights_bytes(pb), kinds, g, dp, "weights"),
                self._fsdp_resident(params.total * pb.grad, kinds, g, dp, "grads"), params.optimizer_bytes(pb))

    def stage_own_bytes(self, g: GlobalShape, *, kinds: tuple[bool, ...], dp: int, is_first: bool,
                        is_last: bool) -> float:
        """weights_bytes + grads_bytes + optimizer_bytes of `stage_core_of_kinds` with these arguments (the same
        function gives them), whatever the device type, micro-batch, VPP and recompute: they read only the degrees
        below, the stage's layer kinds and its position.  Memoised by those (the search's memory bounds ask for
        them once per shape and option)."""
        kinds = tuple(kinds)
        key = (g.tp, g.cp, g.ep, g.etp, g.pp > 1, dp, kinds, is_first, is_last)
        hit = self._own_cache.get(key)
        if hit is None:
            weights, grads, optimizer = self._own_fields(g, kinds, dp,
                                                         self._stage_params(g, kinds, dp, is_first, is_last))
            hit = self._own_cache[key] = weights + grads + optimizer
        return hit

    def _kind_layers(self, g: GlobalShape, device_type: str, dp: int, stage_mbs: int, kinds: tuple[bool, ...],
                     recompute: Recompute) -> "list[_KindLayers]":
        """The stage's decoder layers by kind (dense, then MoE; the kinds it has): counts per kind make a stage's
        figures O(1) in its layers."""
        n = len(kinds)
        counts = {False: n - sum(kinds), True: sum(kinds)}
        n_full = {False: 0, True: 0}
        for j in _recomputed_full_layers(recompute, n, g.vpp):
            n_full[kinds[j]] += 1
        return [_KindLayers(kind, self.layer(g, device_type, dp, stage_mbs, kind), counts[kind], n_full[kind])
                for kind in (False, True) if counts[kind]]

    def _stage_layers(self, g: GlobalShape, device_type: str, dp: int, by_kind: "list[_KindLayers]",
                      recompute: Recompute) -> "_Part":
        """The stage's decoder layers, per micro-batch: forward, backward with recompute (their activations:
        `_layers_memory`)."""
        out = _Part()
        fsdp_gather = fsdp_scatter = 0.0
        for kind, c, cnt, nf in by_kind:
            rest = cnt - nf
            out.fwd_s += cnt * c.fwd_s
            out.bwd_s += cnt * c.bwd_s
            parts = out.parts
            for name, sec in c.parts.items():  # _Part.add, inline (every stage the search prices runs this)
                seconds = cnt * sec
                if seconds:
                    parts[name] = parts.get(name, 0.0) + seconds
            out.compute_s += (cnt * (c.fwd_compute_s + c.bwd_compute_s + c.host_fwd_s + c.host_bwd_s)
                              + nf * (c.fwd_compute_s + c.host_fwd_s))
            out.tp_s += cnt * (c.tp_fwd_s + c.tp_bwd_s) + nf * c.tp_fwd_s
            out.cp_s += cnt * (c.cp_fwd_s + c.cp_bwd_s) + nf * c.cp_fwd_s
            out.ep_s += cnt * (c.ep_fwd_s + c.ep_bwd_s) + nf * c.ep_fwd_s
            out.ep_hidden_fwd_s += cnt * c.ep_hidden_fwd_s
            out.ep_hidden_bwd_s += cnt * c.ep_hidden_bwd_s
            out.recompute_s += nf * c.fwd_s
            gather_s, scatter_s = self._fsdp_layer_s(g, device_type, dp, kind)
            fsdp_gather += cnt * gather_s
            fsdp_scatter += cnt * scatter_s
            if recompute.granularity == "selective":
                extra = sum(c.module_fwd_s.get(mod, 0.0) for mod in recompute.modules)
                out.recompute_s += rest * extra
                out.compute_s += rest * extra
        out.bwd_s += out.recompute_s
        out.add("recompute", out.recompute_s)
        if fsdp_gather or fsdp_scatter:  # Megatron-FSDP: prefetched behind the stage's compute, the excess exposed
            exposed = max(0.0, fsdp_gather - out.fwd_s), max(0.0, fsdp_gather + fsdp_scatter - out.bwd_s)
            out.fwd_s += exposed[0]
            out.bwd_s += exposed[1]
            out.add("fsdp_comm", exposed[0] + exposed[1])
        return out

    @staticmethod
    def _layers_memory(by_kind: "list[_KindLayers]", recompute: Recompute) -> tuple[float, float]:
        """The stage's decoder layers' activation bytes: (what each in-flight micro-batch keeps, with recompute;
        the buffers alive once: the largest layer's transient, and under full recompute a recomputed chunk's full
        activations)."""
        act_per_mb = transient = 0.0
        for _, c, cnt, nf in by_kind:
            rest = cnt - nf
            act_per_mb += nf * c.act_bytes(c.activations.layer_input)
            transient = max(transient, c.transient_bytes)
            if recompute.granularity == "selective":
                act_per_mb += rest * c.act_bytes(c.activations.after_selective(recompute.modules))
            else:
                act_per_mb += rest * c.act_bytes(c.activations.total)
        if recompute.granularity == "full" and by_kind:
            # during a recomputed chunk's backward its layers' full activations exist at once
            chunk = (recompute.num_layers or 1) if recompute.method == "uniform" else 1
            worst = max(k.layer.act_bytes(k.layer.activations.total) for k in by_kind)
            transient += chunk * worst
        return act_per_mb, transient

    def _stage_ends(self, g: GlobalShape, device_type: str, dp: int, stage_mbs: int, is_first: bool,
                    is_last: bool) -> "_Part":
        """The embedding on the first stage; the output layer, loss and MTP layers on the last (their activations:
        `_ends_memory`)."""
        model = self.model
        k = self.kernels(device_type)
        act = self.training.activation_bytes
        t_g = stage_mbs * model.seq_length / g.cp
        sp = g.tp if g.sequence_parallel and g.tp > 1 else 1
        h = model.hidden_size
        out = _Part()
        if is_first:
            emb = k.memory_s(4 * t_g / sp * h * act)  # gather rows, write, and the backward scatter
            out.fwd_s += emb
            out.bwd_s += emb
            out.compute_s += 2 * emb
            out.add("embedding", 2 * emb)
        if not is_last:
            return out
        vocab_local = model.padded_vocab_size(g.tp) / g.tp
        logit_flop = t_g * logits_fwd_flop_per_token(model, g.tp) / g.tp
        logit_s = k.gemm_s(logit_flop, logit_flop)  # the output layer stays in the compute dtype
        ce_s = k.memory_s(t_g * vocab_local * (act + 4 + 4))  # logits, FP32 softmax, gradient
        heads = 1 + model.mtp_num_layers
        out.fwd_s += heads * (logit_s + ce_s)
        out.bwd_s += heads * (GEMM_BWD_OVER_FWD * logit_s + ce_s)
        out.compute_s += heads * ((1 + GEMM_BWD_OVER_FWD) * logit_s + 2 * ce_s)
        out.add("logits_loss", heads * ((1 + GEMM_BWD_OVER_FWD) * logit_s + 2 * ce_s))
        if model.mtp_num_layers:
            # each MTP depth: one more decoder layer (of the last layer's kind) and a 2h -> h projection
            mtp = self.layer(g, device_type, dp, stage_mbs, self._layer_is_moe[-1])
            proj_flop = t_g * 2.0 * 2 * h * h / g.tp
            proj_s = k.gemm_s(proj_flop, proj_flop)
            d = model.mtp_num_layers
            out.fwd_s += d * (mtp.fwd_s + proj_s)
            out.bwd_s += d * (mtp.bwd_s + GEMM_BWD_OVER_FWD * proj_s)
            out.compute_s += d * (mtp.fwd_compute_s + mtp.bwd_compute_s + (1 + GEMM_BWD_OVER_FWD) * proj_s)
            out.tp_s += d * (mtp.tp_fwd_s + mtp.tp_bwd_s)
            out.cp_s += d * (mtp.cp_fwd_s + mtp.cp_bwd_s)
            out.ep_s += d * (mtp.ep_fwd_s + mtp.ep_bwd_s)
            out.ep_hidden_fwd_s += d * mtp.ep_hidden_fwd_s
            out.ep_hidden_bwd_s += d * mtp.ep_hidden_bwd_s
            for name, sec in mtp.parts.items():
                out.add(name, d * sec)
            out.add("mtp_proj", d * (1 + GEMM_BWD_OVER_FWD) * proj_s)
        return out

    def _ends_memory(self, g: GlobalShape, device_type: str, dp: int, stage_mbs: int, is_first: bool,
                     is_last: bool) -> tuple[float, float, float]:
        """The stage ends' bytes: (activations each in-flight micro-batch keeps, the buffers alive once, what the
        allocator reserves anew for the unfused loss's FP32 logits: reserved, not allocated, memory.py)."""
        model = self.model
        act = self.training.activation_bytes
        t_g = stage_mbs * model.seq_length / g.cp
        sp = g.tp if g.sequence_parallel and g.tp > 1 else 1
        h = model.hidden_size
        act_per_mb = transient = loss_reserved = 0.0
        if is_first:
            act_per_mb += t_g / sp * h * act  # embedding output kept per in-flight micro-batch
            if self.training.hidden_dropout:
                act_per_mb += t_g / sp * h  # the embedding dropout's 1-byte mask
        if not is_last:
            return act_per_mb, transient, loss_reserved
        vocab_local = model.padded_vocab_size(g.tp) / g.tp
        heads = 1 + model.mtp_num_layers
        # the logits of one micro-batch, and the FP32 copy each loss head's cross-entropy saves for its backward: the
        # output layer's and each MTP depth's are alive together from the last loss's forward to the first backward
        # (memory.loss_reserved_bytes cites where Megatron makes and saves them)
        transient += t_g * vocab_local * (act + 4 * heads)
        loss_reserved = loss_reserved_bytes(self.training, tokens=t_g, vocab_local=vocab_local, heads=heads)
        if model.mtp_num_layers:  # each MTP depth: one more decoder layer (of the last layer's kind)
            mtp = self.layer(g, device_type, dp, stage_mbs, self._layer_is_moe[-1])
            act_per_mb += model.mtp_num_layers * (mtp.act_bytes(mtp.activations.total) + 2 * t_g / sp * h * act)
        return act_per_mb, transient, loss_reserved

    def _stage_params(self, g: GlobalShape, kinds: tuple[bool, ...], dp: int, is_first: bool,
                      is_last: bool) -> "_Params":
        """Parameters one GPU of this stage holds: dense ones (sharded by the optimizer over DPxCP),
        expert ones (over expert-DP), and the word embeddings (on the first and last stage)."""
        model = self.model
        tp, ep, etp = g.tp, g.ep, g.etp
        n, n_moe = len(kinds), sum(kinds)
        edp = max(1, tp * g.cp * dp // (etp * ep))
        dense = n * self._attn_params / tp + (n - n_moe) * self._dense_mlp_params / tp
        dense += n_moe * (self._shared_params / tp + self._router_params)
        experts = n_moe * self._expert_params / (ep * etp)
        emb_local = model.padded_vocab_size(tp) * model.hidden_size / tp
        embedding = emb_local if is_first else 0.0
        tied_copy = is_last and not is_first and not model.untie_embeddings_and_output_weights
        if is_last and (model.untie_embeddings_and_output_weights or tied_copy):
            embedding += emb_local
        if is_last and model.mtp_num_layers and not is_first:
            # the MTP stage builds its own word embedding, a duplicate of the first stage's (gpt_model.py:
            # `if self.pre_process or self.mtp_process: self.embedding = LanguageModelEmbedding(...)`)
            embedding += emb_local
        if is_last and model.mtp_num_layers:
            last_moe = self._layer_is_moe[-1]
            per = (self._attn_params / tp + (self._dense_mlp_params / tp if not last_moe else
                   self._shared_params / tp + self._router_params) + 2 * model.hidden_size ** 2 / tp)
            dense += model.mtp_num_layers * per
            experts += model.mtp_num_layers * (self._expert_params / (ep * etp) if last_moe else 0.0)
        tied = emb_local if (is_first or is_last) and g.pp > 1 and not model.untie_embeddings_and_output_weights \
            else 0.0
        dist = self.training.use_distributed_optimizer
        return _Params(dense=dense, experts=experts, embedding=embedding, tied=tied,
                       dense_shards=dp * g.cp if dist else 1, expert_shards=edp if dist else 1, edp=edp)

    def _dp_sync_s(self, device_type: str, g: GlobalShape, dp: int, params: "_Params", kinds: tuple[bool, ...],
                   is_first: bool, is_last: bool, *, fwd_s: float, bwd_s: float) -> float:
        """Exposed gradient reduction + parameter gather per iteration.  With overlap, a bucket's
        collective runs during the last micro-batch's backward (reduce) or the first micro-batch's
        forward (gather); only what exceeds that window, or the last bucket's share, stays exposed.
        The raw collective times depend on the parameter counts and groups, not on recompute or the
        micro-batch: memoised (the search prices many recompute and micro-batch variants)."""
        key = (device_type, g.tp, g.cp, dp, g.ep, g.etp, len(kinds), sum(kinds), is_first, is_last, g.pp > 1)
        raw = self._sync_cache.get(key)
        if raw is None:
            raw = self._sync_cache[key] = self._raw_sync_s(device_type, g, dp, params)
        rs, ag, tied_s = raw
        tr = self.training
        sharding = self._fsdp_sharding()
        if "grads" in sharding:
            rs = 0.0  # reduce-scattered layer by layer in every micro-batch's backward (_fsdp_layer_s)
        if "params" in sharding:
            ag = 0.0  # gathered layer by layer before each forward and backward
        rs_exposed = max(DP_OVERLAP_MIN_EXPOSED * rs, rs - bwd_s) if tr.overlap_grad_reduce else rs
        ag_exposed = max(DP_OVERLAP_MIN_EXPOSED * ag, ag - fwd_s) if tr.overlap_param_gather else ag
        return rs_exposed + ag_exposed + tied_s

    def _raw_sync_s(self, device_type: str, g: GlobalShape, dp: int, params: "_Params") -> tuple[float, float, float]:
        """(gradient reduce, parameter gather, tied-embedding all-reduce) seconds per iteration for
        one stage, before any overlap with compute."""
        pb = self.param_bytes
        tr = self.training
        links = self.group_links(device_type, tp=g.tp, cp=g.cp, dp=dp, ep=g.ep, etp=g.etp)
        dense = params.dense + params.embedding
        n_dense, n_exp = dp * g.cp, params.edp
        gather_bytes = 1.0 if tr.precision == "fp8" and tr.fp8_param_gather else pb.weight
        if tr.use_distributed_optimizer:
            rs = collective_s(links.dp, "reduce_scatter", dense * pb.grad, n_dense) + collective_s(
                links.edp, "reduce_scatter", params.experts * pb.grad, n_exp)
            ag = collective_s(links.dp, "all_gather", dense * gather_bytes, n_dense) + collective_s(
                links.edp, "all_gather", params.experts * gather_bytes, n_exp)
        else:
            rs = collective_s(links.dp, "all_reduce", dense * pb.grad, n_dense) + collective_s(
                links.edp, "all_reduce", params.experts * pb.grad, n_exp)
            ag = 0.0
        # tied embedding: first and last stage all-reduce the word-embedding gradient
        tied = collective_s(LinkChoice(links.dp.inter or links.dp.intra, None, 1, links.dp.factors), "all_reduce",
                            params.tied * pb.grad, 2) if params.tied else 0.0
        return rs, ag, tied

    def _fsdp_sharding(self) -> str:
        """The Megatron-FSDP sharding strategy in effect ('' without --use-megatron-fsdp)."""
        tr = self.training
        return tr.data_parallel_sharding_strategy if tr.use_megatron_fsdp else ""

    def _fsdp_layer_s(self, g: GlobalShape, device_type: str, dp: int, is_moe: bool) -> tuple[float, float]:
        """Megatron-FSDP, per layer per micro-batch: (the all-gather of its parameters, issued before the forward and
        again before the backward, with optim_grads_params; the reduce-scatter of its gradients after its backward,
        with optim_grads and optim_grads_params).  Dense parameters shard over DPxCP, experts over expert-DP;
        gradients travel in the parameter dtype (Megatron-FSDP's default mixed-precision policy).  They are prefetched
        and issued behind the compute, so per micro-batch only what outlasts the stage's forward (gathers) and
        backward with recompute (gathers and scatters) is exposed (_stage_layers)."""
        sharding = self._fsdp_sharding()
        if "grads" not in sharding:
            return 0.0, 0.0
        dense = self._attn_params / g.tp + (self._shared_params / g.tp + self._router_params if is_moe else
                                            self._dense_mlp_params / g.tp)
        experts = self._expert_params / (g.ep * g.etp) if is_moe else 0.0
        links = self.group_links(device_type, tp=g.tp, cp=g.cp, dp=dp, ep=g.ep, etp=g.etp)
        edp = max(1, g.tp * g.cp * dp // (g.etp * g.ep))
        nbytes = self.param_bytes.weight

        def both(collective: str) -> float:
            return (collective_s(links.dp, collective, dense * nbytes, dp * g.cp)
                    + collective_s(links.edp, collective, experts * nbytes, edp))

        return (both("all_gather") if "params" in sharding else 0.0), both("reduce_scatter")

    def _fsdp_resident(self, full_bytes: float, kinds: tuple[bool, ...], g: GlobalShape, dp: int, what: str) -> float:
        """Weights or gradients one GPU keeps under Megatron-FSDP: its shard (over DPxCP, experts over expert-DP),
        plus the unsharded copy of the layers in flight (two layers' weights: the one computing and the one being
        prefetched; one layer's gradients before its reduce-scatter).  Without sharding of `what`, `full_bytes`."""
        sharding = self._fsdp_sharding()
        if {"weights": "params", "grads": "grads"}[what] not in sharding or not kinds:
            return full_bytes
        shards = min(dp * g.cp, max(1, g.tp * g.cp * dp // (g.etp * g.ep)))  # the smaller group bounds the shard
        in_flight = (2 if what == "weights" else 1) / len(kinds)
        return full_bytes / shards + full_bytes * in_flight

    def p2p_message_s(self, g: GlobalShape, a_type: str, a_dp: int, b_type: str, b_dp: int, *,
                      crosses_nodes: bool | None) -> float:
        """One pipeline message (a micro-batch's activations, or their gradient; one virtual chunk's) between
        adjacent stages a -> b, on the link they share (`pp_link`): latency plus its bytes over the link.  Memoised:
        a stage's two sends are priced for every layer split and every stage it neighbours."""
        key = (g, a_type, a_dp, b_type, b_dp, crosses_nodes)
        hit = self._p2p_cache.get(key)
        if hit is None:
            hit = self._p2p_cache[key] = self._p2p_message_s(g, a_type, a_dp, b_type, b_dp, crosses_nodes)
        return hit

    def _p2p_message_s(self, g: GlobalShape, a_type: str, a_dp: int, b_type: str, b_dp: int,
                       crosses_nodes: bool | None) -> float:
        model = self.model
        sp = g.tp if g.sequence_parallel and g.tp > 1 else 1
        mbs = self.stage_mbs(g, a_dp)
        link = self.pp_link(g, a_type, a_dp, b_type, b_dp, crosses_nodes=crosses_nodes)
        p2p_bytes = mbs * model.seq_length / g.cp / sp * model.hidden_size * self.training.activation_bytes
        return collective_s(link, "p2p", p2p_bytes, 2)

    def p2p_parts(self, g: GlobalShape, a_type: str, a_dp: int, b_type: str, b_dp: int, *,
                  crosses_nodes: bool | None) -> tuple[float, float]:
        """(L, M) of the link a -> b per micro-batch, as one of its two stages pays it (`stage_time_with_links`):
        under 1F1B its one message, waited for, and nothing overlapped (message, 0); interleaved, v latencies
        and the v messages (one per virtual chunk) that the compute overlaps (v * latency, v * message)."""
        message = self.p2p_message_s(g, a_type, a_dp, b_type, b_dp, crosses_nodes=crosses_nodes)
        if g.vpp == 1:
            return message, 0.0
        link = self.pp_link(g, a_type, a_dp, b_type, b_dp, crosses_nodes=crosses_nodes)
        return g.vpp * link.intra.latency_us * US_S, g.vpp * message

    @staticmethod
    def inflight_microbatches(g: GlobalShape, index: int) -> float:
        """Micro-batches whose activations stage `index` holds at its peak under 1F1B (interleaved:
        in-flight virtual chunks / vpp, as Megatron's warm-up counts them)."""
        m = g.num_microbatches
        if g.vpp == 1:
            return float(min(g.pp - index, m))
        chunks = min((g.pp - index - 1) * 2 + (g.vpp - 1) * g.pp + 1, m * g.vpp)
        return chunks / g.vpp

    def stage(
        self, g: GlobalShape, *, index: int, device_type: str, start: int, end: int, dp: int,
        recompute: Recompute, prev_type: str | None, next_type: str | None, prev_dp: int | None = None,
        next_dp: int | None = None, offset_gpus: int,
    ) -> StageCost:
        """Price stage `index` holding decoder layers [start, end) on `device_type` with `dp`, its ranks starting
        `offset_gpus` into its type's GPUs (`type_offsets`).  Its time includes what its pipeline sends on both
        links add to its forward and backward (t_i of the schedule formula, `stage_time_with_links`)."""
        core = self.stage_core(g, device_type=device_type, start=start, end=end, dp=dp, recompute=recompute,
                               is_first=prev_type is None, is_last=next_type is None)
        link_in = link_out = (0.0, 0.0)
        send_out_s = 0.0
        if next_type is not None:
            nd = next_dp or dp
            out = self.boundary_crosses_nodes(g, device_type, offset_gpus, dp, next_type, nd)
            send_out_s = self.p2p_message_s(g, device_type, dp, next_type, nd, crosses_nodes=out)
            link_out = self.p2p_parts(g, device_type, dp, next_type, nd, crosses_nodes=out)
        if prev_type is not None:
            pd = prev_dp or dp
            into = self.boundary_crosses_nodes(g, prev_type, offset_gpus - g.tp * g.cp * pd, pd, device_type, dp)
            link_in = self.p2p_parts(g, prev_type, pd, device_type, dp, crosses_nodes=into)
        stall = self.chunk_stall(g, core) if prev_type is not None and next_type is not None else (0.0, 0.0)
        unpaired = self.ep_unpaired(g, core)
        fwd, bwd = core.forward_s + stall[0] + unpaired[0], core.backward_s + stall[1] + unpaired[1]
        pp_s = float(stage_time_with_links(fwd, bwd, link_in, link_out)) - (fwd + bwd)
        return StageCost.place(core, index=index, pp_comm_s=pp_s, send_out_s=send_out_s,
                               fill_out_s=link_fill_s(g.vpp, *link_out), stall=stall, ep_unpaired=unpaired,
                               inflight_microbatches=self.inflight_microbatches(g, index))

    def ep_unpaired_share(self, g: GlobalShape) -> float:
        """With --overlap-moe-expert-parallel-comm, the share of a stage's chunk steps that run alone (the combined
        1F1B schedule's warm-up forwards and cool-down backwards, averaged over the PP ranks:
        planner/cost/layer.py `ep_overlap_steady_share`), which hide no EP communication; else 0.  A mean over the
        ranks, so that every stage of a plan pays the same share whatever its index (the search's tables price a
        stage by its position, not its index)."""
        if not (self.model.is_moe and self.training.overlap_moe_expert_parallel_comm):
            return 0.0
        return 1.0 - ep_overlap_steady_share(g.pp, g.vpp, g.num_microbatches)

    def ep_unpaired(self, g: GlobalShape, core: StageCore) -> tuple[float, float]:
        """(forward, backward) seconds per micro-batch of EP communication that the EP overlap hides in paired
        steps and the unpaired ones pay (`ep_unpaired_share` of `core`'s hidden seconds)."""
        share = self.ep_unpaired_share(g)
        return share * core.ep_hidden_s[0], share * core.ep_hidden_s[1]

    def chunk_stall(self, g: GlobalShape, core: StageCore) -> tuple[float, float]:
        """What Megatron's interleaved schedule stalls a stage of `core` per micro-batch when its virtual chunks
        hold unequal layer counts (`chunk_stall_layers` of its decoder layers' time), as (forward, backward)
        seconds in the proportion of its own.  Middle stages only: the first and the last stage's chunks also
        hold the embedding and the loss, which even them out (NVIDIA's `E|(t|)*94L` puts the embedding alone in
        rank 0's first chunk; planner/megatron/layout.py `chunk_split` takes the missing layers off the chunks
        beside them), so `stage` charges neither.  A stage's chunks are the planner's split (`chunk_split`): a
        user's layout with unequal chunks over a count VPP divides is priced as equal.  The search's tables add
        it as `stage` does (planner/search/tables.py); the bounds price one-layer stages without it, which only
        lowers them."""
        share = self.chunk_stall_share(g, core.num_layers)
        if not share or core.time_s <= 0:
            return 0.0, 0.0
        stall = share * max(0.0, core.time_s - sum(sec for name, sec in core.parts if name in END_PARTS))
        return stall * core.forward_s / core.time_s, stall * core.backward_s / core.time_s

    def chunk_stall_share(self, g: GlobalShape, num_layers: int) -> float:
        """The stall of a middle stage with `num_layers` decoder layers as a share of their time."""
        return chunk_stall_layers(num_layers, g.vpp, g.pp) / num_layers if num_layers else 0.0

    # ---- a plan ----
    def fits(self, plan: Plan, stages: list[int] | None = None) -> bool:
        """`evaluate(plan).fits` from the stages' memory alone (stage_memory: the same numbers and the same fit
        check, StageMemory.fits_at), without pricing their time: a screen for the plans that cannot fit.  `stages`:
        whether those stages (indices) fit."""
        g = GlobalShape.of(plan)
        last = plan.pp - 1
        for i, (sp, (start, end)) in enumerate(zip(plan.stages, plan.layer_ranges())):
            if stages is not None and i not in stages:
                continue
            memory = self.stage_memory(g, device_type=sp.device_type, start=start, end=end, dp=sp.dp,
                                       recompute=sp.recompute, is_first=i == 0, is_last=i == last)
            if not memory.fits_at(self.inflight_microbatches(g, i)):
                return False
        return True

    def evaluate(self, plan: Plan) -> PlanCost:
        g = GlobalShape.of(plan)
        offsets = type_offsets([(sp.device_type, plan.tp * plan.cp * sp.dp) for sp in plan.stages])
        stages = []
        for i, (sp, (start, end)) in enumerate(zip(plan.stages, plan.layer_ranges())):
            stages.append(self.stage(
                g, index=i, device_type=sp.device_type, start=start, end=end, dp=sp.dp,
                recompute=sp.recompute,
                prev_type=plan.stages[i - 1].device_type if i > 0 else None,
                next_type=plan.stages[i + 1].device_type if i + 1 < plan.pp else None,
                prev_dp=plan.stages[i - 1].dp if i > 0 else None,
                next_dp=plan.stages[i + 1].dp if i + 1 < plan.pp else None,
                offset_gpus=offsets[i],
            ))
        return self.combine(plan, stages)

    def _gpus_of(self, plan: Plan) -> dict[str, int]:
        """The GPUs the plan runs on, per device type, for its MFU's peak: a plan using every GPU of the cluster runs
        on all of them (a flags plan's stage straddling two types is priced as the slower one, but half its GPUs
        are the other's); a pooled stage type's GPUs are its members' (ClusterSpec.spread); else the stages'
        types."""
        if plan.world_size == self.cluster.world_size:
            return self.cluster.gpus_by_type()
        used = plan.gpus_by_type()
        spread = self.cluster.spread(used)
        return spread if sum(spread.values()) == plan.world_size else used

    def model_flop(self, gbs: int, tp: int) -> float:
        """Megatron's FLOP count of one iteration (`model_flop_per_iteration`), memoised: a sum over the layers that
        every `evaluate` needed, and the baselines' enumerations and the brute force evaluate plans by the
        ten thousand."""
        hit = self._flop_cache.get((gbs, tp))
        if hit is None:
            hit = self._flop_cache[(gbs, tp)] = model_flop_per_iteration(self.model, global_batch_size=gbs, tp=tp)
        return hit

    def combine(self, plan: Plan, stages: list[StageCost]) -> PlanCost:
        m = plan.num_microbatches
        v = plan.vpp
        times = [s.time_s for s in stages]
        pipeline = sum(times) / v + (m - 1.0 / v) * max(times) + sum(s.fill_out_s for s in stages)
        busy = m * max(times)
        sync = max(s.sync_s for s in stages)
        flop = self.model_flop(plan.gbs, plan.tp)
        peak_total = sum(n * self.device(t).peak_flop_per_s(self.training.compute_dtype)
                         for t, n in self._gpus_of(plan).items())
        return PlanCost(
            iteration_time_s=pipeline + sync, pipeline_s=pipeline, bubble_s=pipeline - busy, sync_s=sync,
            num_microbatches=m, world_size=plan.world_size, model_flop_per_iteration=flop,
            peak_flop_per_s_total=peak_total, stages=tuple(stages), memory_headroom=self.memory_headroom,
        )


class _Times(NamedTuple):
    """A stage's times (CostModel._stage_times) and what they were priced from."""

    stage_mbs: int
    by_kind: "list[_KindLayers]"
    params: "_Params"
    lay: "_Part"
    ends: "_Part"
    fwd_s: float
    bwd_s: float
    dp_s: float
    optimizer_s: float


class _KindLayers(NamedTuple):
    """A stage's decoder layers of one kind: the layer's cost, how many the stage holds, how many full recompute
    re-runs."""

    is_moe: bool
    layer: LayerCost
    count: int
    full_recomputed: int


@dataclass
class _Part:
    """Seconds per micro-batch of a piece of a stage (layers, or its ends)."""

    fwd_s: float = 0.0
    bwd_s: float = 0.0
    compute_s: float = 0.0
    recompute_s: float = 0.0
    tp_s: float = 0.0
    cp_s: float = 0.0
    ep_s: float = 0.0
    ep_hidden_fwd_s: float = 0.0  # what --overlap-moe-expert-parallel-comm hid, in a step pairing fwd and bwd
    ep_hidden_bwd_s: float = 0.0
    parts: dict = field(default_factory=dict)  # forward + backward seconds by mechanism

    def add(self, name: str, seconds: float) -> None:
        if seconds:
            self.parts[name] = self.parts.get(name, 0.0) + seconds


def _merge_parts(*dicts: dict) -> tuple[tuple[str, float], ...]:
    out: dict[str, float] = {}
    for d in dicts:
        for name, sec in d.items():
            out[name] = out.get(name, 0.0) + sec
    return tuple(out.items())


@dataclass(frozen=True)
class _Params:
    """Parameters one GPU of a stage holds, and over how many GPUs the optimizer shards them."""

    dense: float
    experts: float
    embedding: float
    tied: float  # tied word-embedding parameters whose gradient the first and last stage all-reduce
    dense_shards: int
    expert_shards: int
    edp: int

    @property
    def total(self) -> float:
        return self.dense + self.experts + self.embedding

    @property
    def shard(self) -> float:
        """Parameters whose optimizer state this GPU holds."""
        return (self.dense + self.embedding) / self.dense_shards + self.experts / self.expert_shards

    def weights_bytes(self, pb: ParamBytes) -> float:
        return (self.dense + self.experts) * pb.linear_weight + self.embedding * pb.weight

    def optimizer_bytes(self, pb: ParamBytes) -> float:
        return self.shard * pb.optimizer


EP_UNPAIRED_NOTE_MIN_SHARE = 0.03
"""`ep_overlap_notes` speaks when the EP seconds the schedule's unpaired steps pay are at least this share of the
iteration."""


def ep_overlap_notes(cost: CostModel, plan: Plan, plan_cost: PlanCost | None = None) -> list[str]:
    """A note when --overlap-moe-expert-parallel-comm hides little because few of the schedule's steps pair a
    forward with a backward (`CostModel.ep_unpaired_share`): what the unpaired steps cost and what would pair
    more of them."""
    g = GlobalShape.of(plan)
    share = cost.ep_unpaired_share(g)
    if not share:
        return []
    plan_cost = plan_cost or cost.evaluate(plan)
    slowest = max(plan_cost.stages, key=lambda s: s.time_s)
    paid_s = plan_cost.num_microbatches * sum(cost.ep_unpaired(g, slowest))
    if paid_s < EP_UNPAIRED_NOTE_MIN_SHARE * plan_cost.iteration_time_s:
        return []
    shape = f"at PP{plan.pp} VPP{plan.vpp}" if plan.pp > 1 else "without pipelining"
    return [f"--overlap-moe-expert-parallel-comm hides EP communication only in the steps where Megatron's combined "
            f"1F1B schedule runs one micro-batch's forward beside another's backward: with {g.num_microbatches} "
            f"micro-batches per pipeline {shape}, {share:.0%} of the chunk steps (the warm-up forwards and the "
            f"cool-down backwards) run alone and pay their dispatch in full, {paid_s:.2f} s of the "
            f"{plan_cost.iteration_time_s:.2f} s iteration; more micro-batches per pipeline (a larger global batch, "
            f"a smaller DP or micro-batch) or fewer pipeline stages pair more of them"]


def link_fill_s(vpp: int, floor_s: float, traffic_s: float) -> float:
    """What a pipeline boundary with link (L, M) (CostModel.p2p_parts) adds to the interleaved pipeline's fill and
    drain: the first micro-batch crosses it v times forward and v times backward, each a whole message
    (2 * (M - L / v): the v messages each way, less the latency the bubble's share of t_i already holds).  The
    discrete-event simulation with waits for sends matches the formula with it to a few percent where the
    messages are shorter than a chunk's compute (tests/test_simulate_vs_model.py).  0 under 1F1B, whose t_i
    already waits for every message."""
    if vpp == 1:
        return 0.0
    return 2.0 * (traffic_s - floor_s / vpp)


def chunk_stall_layers(num_layers: int, vpp: int, pp: int) -> float:
    """The steady-state stall of Megatron's interleaved schedule per micro-batch, in decoder layers' time, on a
    rank whose `num_layers` split over `vpp` virtual chunks unequally (b or b + 1 layers a chunk, b =
    num_layers // vpp; planner/megatron/layout.py `chunk_split`): 1 - (b + 2) / PP, at least 0; none with equal
    chunks or without interleaving.  This is planner/simulate.py's discrete-event simulation of the schedule on
    PP equal ranks, fitted by hand: it matches it within 0.01 layer for PP >= 6 with b >= 1, and falls short by
    up to a third of a layer on 3-4 ranks or with empty chunks (b = 0) (tests/test_simulate_vs_model.py); the
    rank's own forward/backward ratio does not move it.  With more layers a chunk than PP - 2 the stall is gone."""
    if vpp <= 1 or pp < 2 or num_layers % vpp == 0:
        return 0.0
    return max(0.0, 1.0 - (num_layers // vpp + 2) / pp)


def _core_key(g: GlobalShape, device_type: str, dp: int, recompute: Recompute, kinds: tuple[bool, ...],
              is_first: bool, is_last: bool) -> tuple:
    """What a StageCore (and its StageMemory) depends on: the memo key of both."""
    return (g.tp, g.cp, g.ep, g.etp, g.vpp, g.mbs, g.dp0, g.sequence_parallel, g.pp > 1,
            device_type, dp, recompute.label, kinds, is_first, is_last)


def type_offsets(stages: list[tuple[str, int]]) -> list[int]:
    """Per stage (device type, GPUs), the GPUs of its type the stages before it hold: where its block of ranks
    starts among its type's GPUs (the ranks of a type fill its nodes in stage order, planner/launcher/common.py
    `place_agents`)."""
    used: dict[str, int] = {}
    out = []
    for device_type, gpus in stages:
        out.append(used.get(device_type, 0))
        used[device_type] = out[-1] + gpus
    return out


def _memory_overhead_gib(profiles, dev: DeviceProfile) -> float:
    """The device's fixed overhead plus a calibrated additive correction, if any."""
    return dev.memory_overhead_gib + profiles.correction(dev.name, "memory_overhead_gib")


def recomputed_layer_count(recompute: Recompute, n: int, v: int) -> int:
    """How many of a stage's n layers full recompute re-runs with v virtual chunks (the search's
    lower bounds price a stage's recompute with it)."""
    return len(_recomputed_full_layers(recompute, n, v))


def _recomputed_full_layers(recompute: Recompute, n: int, v: int) -> set[int]:
    """Indices (within the stage) of layers that full recompute re-runs."""
    if recompute.granularity != "full":
        return set()
    if recompute.method == "uniform":
        return set(range(n))
    k = recompute.num_layers or 0
    if v <= 1:
        return set(range(min(k, n)))
    chunk = max(1, math.ceil(n / v))
    return {j for j in range(n) if (j % chunk) < k}
