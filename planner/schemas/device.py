"""DeviceProfile: the typed form of one file in profiles/devices/.

The contract (columns, units, provenance) is written out in profiles/README.md.  Every table
carries a `provenance` saying whether its numbers are `measured` (on the user's machines), `published`
(measured by a cited public benchmark), `datasheet-derived` or `calibrated`, and from what source.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from planner.errors import MissingProfileError
from planner.schemas.types import (
    BandwidthGBps, DisplayText, HbmTBps, LatencyUs, MemoryGiB, PeakTflops, StrictModel,
)

ProvenanceKind = Literal["measured", "published", "datasheet-derived", "calibrated"]
CollectiveName = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"]


class Provenance(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ProvenanceKind
    source: str = Field(min_length=1, description="where the numbers come from")


class EfficiencyPoint(StrictModel):
    """Achieved fraction of peak at a work size.  `size` is GEMM FLOP per call for GEMMs,
    tokens per expert for grouped GEMMs, message bytes for collectives."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    size: float = Field(gt=0)
    efficiency: float = Field(gt=0, le=1.2)


class EfficiencyCurve(StrictModel):
    """Piecewise-linear in log(size); clamped at both ends."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    points: tuple[EfficiencyPoint, ...] = Field(min_length=1)
    provenance: Provenance

    @model_validator(mode="after")
    def _sorted(self) -> "EfficiencyCurve":
        sizes = [p.size for p in self.points]
        if sizes != sorted(sizes) or len(set(sizes)) != len(sizes):
            raise ValueError("efficiency points must have strictly increasing size")
        return self


class LinkProfile(StrictModel):
    """One link kind as seen by one GPU: bandwidth per direction, latency, and the fraction of
    that bandwidth each collective achieves (bus bandwidth / link bandwidth, size-dependent)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: DisplayText = Field(description="nvlink, xgmi, hccs, pcie, infiniband, roce, ethernet, efa, slingshot, host-memory")
    bandwidth_gb_per_s: BandwidthGBps = Field(description="per GPU per direction, GB/s (10^9 bytes)")
    latency_us: LatencyUs
    efficiency: dict[str, EfficiencyCurve] = Field(
        description="per collective name (all_reduce, all_gather, reduce_scatter, all_to_all, p2p)"
    )
    provenance: Provenance


class DeviceProfile(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: DisplayText = Field(description="canonical name, e.g. H800")
    aliases: tuple[DisplayText, ...] = ()
    vendor: DisplayText
    memory_gib: MemoryGiB = Field(description="device memory as the framework sees it, GiB")
    memory_overhead_gib: float = Field(
        ge=0, description="context, communication buffers, allocator fragmentation, GiB"
    )
    peak_tflops: dict[str, PeakTflops] = Field(
        description="dense peak per precision: bf16, fp16, fp8, fp32"
    )
    hbm_bandwidth_tb_per_s: HbmTBps
    hbm_efficiency: float = Field(gt=0, le=1, description="achieved fraction of HBM bandwidth (STREAM-like)")
    gpus_per_node: int = Field(gt=0, description="GPUs per host (what one launcher agent starts)")
    scale_up_domain_gpus: int | None = Field(
        None, gt=0, description="GPUs the intra-node link joins beyond one host (GB200/GB300 NVL72: 72, four per "
        "host tray); None: the host's GPUs")
    gemm_efficiency: EfficiencyCurve = Field(description="dense GEMM, size = FLOP per GEMM call")
    attention_efficiency: EfficiencyCurve = Field(description="flash attention fwd+bwd, size = FLOP per call")
    flash_attention_efficiency: EfficiencyCurve | None = Field(
        None, description="the FlashAttention package's fwd+bwd, size = FLOP per call, where it differs from the"
        " kernel `attention_efficiency` describes (H100: FlashAttention-2 against cuDNN's fused attention); read for"
        " --attention-backend flash; None: attention_efficiency"
    )
    windowed_attention_efficiency: EfficiencyCurve | None = Field(
        None, description="the fused attention core of a sliding-window layer, fwd+bwd, size = the band's forward"
        " FLOP per call (the keys each query sees); a kernel visiting the band's tiles runs at its own, lower rate"
        " (B200, B300: cuDNN's gpt_oss benchmark); None: attention_efficiency at the band's FLOP"
    )
    grouped_gemm_efficiency: EfficiencyCurve = Field(
        description="multiplier on gemm efficiency (at the whole grouped call's FLOP) for grouped expert GEMMs,"
        " beyond tile padding; size = tokens per expert"
    )
    fp8_gemm_efficiency_ratio: float = Field(
        1.0, gt=0, le=1.2,
        description="FP8 GEMM efficiency over BF16 GEMM efficiency, each against its own peak (FP8 MAMF/FP8 peak"
        " over BF16 MAMF/BF16 peak); the source is in `datasheet`",
    )
    intra_node: LinkProfile
    inter_node: LinkProfile
    datasheet: Provenance

    @model_validator(mode="after")
    def _overhead_below_memory(self) -> "DeviceProfile":
        if self.memory_overhead_gib >= self.memory_gib:
            raise ValueError(f"memory_overhead_gib ({self.memory_overhead_gib:g}) must be below memory_gib "
                             f"({self.memory_gib:g})")
        if self.scale_up_domain_gpus is not None and self.scale_up_domain_gpus % self.gpus_per_node:
            raise ValueError(f"scale_up_domain_gpus ({self.scale_up_domain_gpus}) must be a multiple of "
                             f"gpus_per_node ({self.gpus_per_node}): a domain joins whole hosts")
        return self

    def peak_flop_per_s(self, precision: str) -> float:
        key = "bf16" if precision == "fp32" and "fp32" not in self.peak_tflops else precision
        if key not in self.peak_tflops:
            raise MissingProfileError(
                f"device {self.name} has no peak for precision {precision!r}; "
                f"it lists {sorted(self.peak_tflops)}"
            )
        return self.peak_tflops[key] * 1e12
