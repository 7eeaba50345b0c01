"""Kernel times on one device: GEMMs (BF16/FP16, or FP8 per recipe), grouped expert GEMMs, fused
attention, memory-bound passes and FP8 quantisation.

Each time is a formula over the device profile's tables (planner/schemas/device.py) times the device's
calibrated correction for that kernel kind (profiles/corrections.yaml, fitted by
planner/calibration/fit.py).  Nothing here knows about layers; planner/cost/layer.py composes them.

FP8 (Megatron `--fp8-format` with `--fp8-recipe`): Transformer Engine runs the linear layers' GEMMs in FP8;
attention, the output layer, the router, norms and all communication stay BF16.  An FP8 GEMM runs at the
FP8 peak x the device's GEMM efficiency x `fp8_gemm_efficiency_ratio` (FP8 MAMF / BF16 MAMF, each over its
peak: reference/hardware.md s4.1), and every GEMM input is quantised first (`FP8_CAST_BYTES`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from planner.cost.curves import interpolate_efficiency
from planner.schemas.device import DeviceProfile

ATTENTION_BWD_OVER_FWD = 2.5
"""Flash attention's backward recomputes the score matrix: about 2.5x the forward time (FA2 paper)."""
GEMM_BWD_OVER_FWD = 2.0
"""dgrad + wgrad, each as large as the forward GEMM."""
ELEMENTWISE_BWD_OVER_FWD = 2.0
"""A memory-bound op's backward reads the saved input and the incoming gradient and writes one."""

FP8_CAST_BYTES: dict[str, float] = {
    "delayed": 4.0,  # one fused amax+cast pass: read BF16 (2), write the FP8 row copy (1) and its transpose (1)
    "tensorwise": 6.0,  # current scaling: an amax pass over the input (2) before the fused cast (4)
    "blockwise": 6.1,  # 1x128 row blocks and 128x1 column blocks quantised separately: read twice, + FP32 scales
    "mxfp8": 6.1,  # MXFP8 (Blackwell): row and column copies each with E8M0 scales per 32 elements
}
"""HBM bytes moved per element when a BF16 GEMM input is quantised to FP8, by recipe (Transformer Engine's
quantisation kernels: a row-wise copy for the forward GEMM and a column-wise copy for the backward GEMMs)."""

FP8_CORRECTION_KIND: dict[str, str] = {
    "delayed": "fp8_tensorwise", "tensorwise": "fp8_tensorwise", "blockwise": "fp8_blockwise", "mxfp8": "fp8_mxfp8",
}
"""Per-tensor recipes (delayed and current scaling) share one calibrated constant; block-scaled recipes have their own."""

HOST_OP_S = 50e-6
"""Host (CPU) time of one Python-level operation of Megatron's eager PyTorch with Transformer Engine (the module
call, its checks, autograd bookkeeping and the kernel launches it issues): ASSUMED 50 us before calibration (no
public per-operation figure for Megatron; the `host_overhead` correction is fitted on the published runs).  A
layer whose GPU work is shorter than its host operations waits for the host (planner/cost/layer.py)."""
ITERATION_HOST_S = 0.05
"""Fixed host-side time per iteration outside the layers (optimizer and gradient-norm kernel launches, loss and
timer reductions, the schedule's bookkeeping): ASSUMED 50 ms (no public figure).  It is not fitted: only the
Moonlight runs at GBS 4 (one source) would move it, and fitted on them it made every other short iteration too
slow (planner/calibration/fit.py); `cli.py calibrate` or a corrections row `iteration_overhead` scales it."""

GROUPED_GEMM_TILE_ROWS = 128
"""Rows of one tensor-core tile (Hopper WGMMA / CUTLASS grouped GEMM 128xN tiles): an expert with M tokens
computes ceil(M / 128) x 128 rows."""


@dataclass(frozen=True)
class Kernels:
    """Kernel-time formulas bound to one device and its corrections."""

    device: DeviceProfile
    corrections: Mapping[str, float]
    compute_dtype: str  # bf16 | fp16 | fp32: everything that is not an FP8 GEMM
    fp8_recipe: str | None  # None: no FP8 GEMMs
    flash_attention: bool = False  # --attention-backend flash: the FlashAttention package, not cuDNN's fused kernel

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.device.hbm_bandwidth_tb_per_s * 1e12 * self.device.hbm_efficiency / self.corrections["memory_bound"]

    def memory_s(self, nbytes: float) -> float:
        """A memory-bound pass moving `nbytes` through HBM."""
        return max(nbytes, 0.0) / self.hbm_bytes_per_s

    def _efficiency(self, call_flop: float) -> float:
        return interpolate_efficiency(self.device.gemm_efficiency, max(call_flop, 1.0))

    def _rate(self, call_flop: float, fp8: bool) -> float:
        """FLOP/s of one GEMM call of `call_flop`."""
        if fp8 and self.fp8_recipe is not None:
            return (self.device.peak_flop_per_s("fp8") * self._efficiency(call_flop)
                    * self.device.fp8_gemm_efficiency_ratio / self.corrections[FP8_CORRECTION_KIND[self.fp8_recipe]])
        return self.device.peak_flop_per_s(self.compute_dtype) * self._efficiency(call_flop)

    def gemm_s(self, flop: float, call_flop: float, *, fp8: bool = False) -> float:
        """`flop` of dense GEMMs made of calls of `call_flop` each."""
        if flop <= 0:
            return 0.0
        return flop / self._rate(call_flop, fp8) * self.corrections["gemm"]

    def grouped_gemm_s(self, flop: float, *, tokens_per_expert: float, local_experts: int, call_flop: float,
                       grouped: bool, fp8: bool = False) -> float:
        """Expert GEMMs over `local_experts` experts of `tokens_per_expert` tokens each.  `call_flop` is
        one expert's GEMM; a grouped kernel (`--moe-grouped-gemm`) runs all experts' tiles at once, at the
        efficiency of the whole call, less its tile padding and the device's grouped-kernel multiplier;
        without it (SequentialMLP) each expert is its own GEMM call."""
        if flop <= 0:
            return 0.0
        if not grouped:
            return self.gemm_s(flop, call_flop, fp8=fp8)
        m = max(tokens_per_expert, 1.0)
        padding = m / (math.ceil(m / GROUPED_GEMM_TILE_ROWS) * GROUPED_GEMM_TILE_ROWS)
        mult = interpolate_efficiency(self.device.grouped_gemm_efficiency, m)
        rate = self._rate(call_flop * max(local_experts, 1), fp8) * padding * mult
        return flop / rate * self.corrections["grouped_gemm"]

    def attention_s(self, flop: float, call_flop: float | None = None, windowed: bool = False) -> float:
        """Forward of the fused attention core (always in the compute dtype), `flop` in calls of `call_flop` each
        (one call by default; context parallelism splits it into ring steps).  `windowed`: the band of a
        sliding-window layer, priced on the device's `windowed_attention_efficiency` where it has one (cuDNN's rate
        for a band: planner/cost/layer.py `_windowed_share`), else on the causal curve at the band's FLOP."""
        if flop <= 0:
            return 0.0
        curve, flash = self.device.attention_efficiency, self.device.flash_attention_efficiency
        window = self.device.windowed_attention_efficiency
        if windowed and window is not None and not self.flash_attention:
            curve = window
        elif self.flash_attention and flash is not None and (
                flash.provenance.kind == "measured" or curve.provenance.kind != "measured"):
            curve = flash  # H100: FlashAttention-2, 0.65-0.75x cuDNN's rate; a user's measured table wins over it
        eff = interpolate_efficiency(curve, max(call_flop or flop, 1.0))
        return flop / (self.device.peak_flop_per_s(self.compute_dtype) * eff) * self.corrections["attention"]

    def host_s(self, ops: float) -> float:
        """Host time of `ops` Python-level operations (HOST_OP_S x the calibrated `host_overhead`)."""
        return ops * HOST_OP_S * self.corrections["host_overhead"]

    @property
    def iteration_host_s(self) -> float:
        """Fixed host time per iteration (ITERATION_HOST_S x the calibrated `iteration_overhead`)."""
        return ITERATION_HOST_S * self.corrections["iteration_overhead"]

    def fp8_cast_s(self, elements: float) -> float:
        """Quantising `elements` BF16 values of GEMM inputs to FP8 (0 without FP8)."""
        if self.fp8_recipe is None or elements <= 0:
            return 0.0
        return self.memory_s(elements * FP8_CAST_BYTES[self.fp8_recipe])
