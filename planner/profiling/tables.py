"""Turn benchmark results into a DeviceProfile (profiles/devices schema), provenance `measured`.

Conventions (the ones the cost model reads, planner/cost/layer.py, curves.py and communication.py):
- gemm_efficiency: size = FLOP per GEMM call, efficiency = achieved FLOP/s / peak.
- attention_efficiency: size = forward FLOP per call (causal half, Megatron's count); the cost
  model prices backward as ATTENTION_BWD_OVER_FWD x forward, so efficiency is set from the measured
  forward+backward time: (1 + ratio) x forward FLOP / (time x peak).
- grouped_gemm_efficiency: size = tokens per expert, value = a multiplier on gemm_efficiency at the
  whole grouped call's FLOP, beyond its tile padding (measured grouped efficiency / (the measured dense
  curve there x padding)), as planner/cost/kernels.py `grouped_gemm_s` reads it.
- peak: for GPUs with a shipped profile, the datasheet peak (so efficiencies are achieved/datasheet);
  otherwise (CPU, unknown devices) the best GEMM rate measured in this run, said in the source.
- links: bandwidth per GPU per direction (GB/s); efficiency per collective = nccl-tests bus
  bandwidth / link bandwidth with the latency term subtracted first (bandwidth-only, like the
  shipped tables), size = message bytes (the full buffer).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Callable

from planner.cost.communication import latency_steps, volume_factor
from planner.cost.curves import interpolate_points
from planner.cost.kernels import ATTENTION_BWD_OVER_FWD, GROUPED_GEMM_TILE_ROWS
from planner.profiling.collectives import CollectiveSample, fit_latency_bandwidth
from planner.profiling.kernels import KernelResult
from planner.schemas.device import DeviceProfile, EfficiencyCurve, EfficiencyPoint, LinkProfile, Provenance

MIN_EFFICIENCY = 1e-4
MAX_EFFICIENCY = 1.2


def _clamp(value: float) -> float:
    return min(MAX_EFFICIENCY, max(MIN_EFFICIENCY, value))


def _curve(by_size: dict[float, list[float]], source: str) -> EfficiencyCurve:
    points = tuple(
        EfficiencyPoint(size=size, efficiency=round(_clamp(statistics.median(vals)), 5))
        for size, vals in sorted(by_size.items())
    )
    return EfficiencyCurve(points=points, provenance=Provenance(kind="measured", source=source))


def best_gemm_flop_per_s(results: list[KernelResult]) -> float:
    """The highest GEMM rate in the run (dense or grouped), FLOP/s."""
    rates = [r.flop_per_s for r in results if r.kind in ("gemm", "grouped_gemm") and r.time_s > 0]
    if not rates:
        raise ValueError("no GEMM results to derive a peak from")
    return max(rates)


def gemm_curve(results: list[KernelResult], peak_flop_per_s: float, source: str) -> EfficiencyCurve:
    by_size: dict[float, list[float]] = defaultdict(list)
    for r in results:
        if r.kind == "gemm":
            by_size[r.flop_per_call].append(r.flop_per_s / peak_flop_per_s)
    return _curve(by_size, source)


def attention_curve(results: list[KernelResult], peak_flop_per_s: float, source: str) -> EfficiencyCurve:
    ratio = ATTENTION_BWD_OVER_FWD
    by_size: dict[float, list[float]] = defaultdict(list)
    for r in results:
        if r.kind == "attention_fwd_bwd":
            by_size[r.flop_per_call].append((1.0 + ratio) * r.flop / (r.time_s * peak_flop_per_s))
    return _curve(by_size, source + f"; efficiency from fwd+bwd time with bwd = {ratio} x fwd (cost model)")


def grouped_curve(results: list[KernelResult], gemm: EfficiencyCurve, peak_flop_per_s: float,
                  source: str) -> EfficiencyCurve | None:
    dense = [(p.size, p.efficiency) for p in gemm.points]
    by_size: dict[float, list[float]] = defaultdict(list)
    for r in results:
        if r.kind == "grouped_gemm":
            grouped_eff = r.flop_per_s / peak_flop_per_s
            m = max(r.tokens_per_expert, 1)
            padding = m / (math.ceil(m / GROUPED_GEMM_TILE_ROWS) * GROUPED_GEMM_TILE_ROWS)
            # relative to a dense GEMM of the whole grouped call's FLOP, tile padding taken out (cost model)
            by_size[float(m)].append(grouped_eff / (interpolate_points(dense, r.flop) * padding))
    impls = sorted({r.impl for r in results if r.kind == "grouped_gemm" and r.impl})
    if impls:
        source += f"; expert GEMMs timed as {' and '.join(impls)}"
    return _curve(by_size, source) if by_size else None


def memory_bandwidth(results: list[KernelResult], reference_tb_per_s: float | None) -> tuple[float, float, str]:
    """(peak TB/s, efficiency, note): peak = datasheet if known else the best measured copy; the
    efficiency is the median achieved bandwidth of the elementwise kernels and the optimizer step."""
    copies = [r.bytes_per_s for r in results if r.kind == "copy"]
    work = [r.bytes_per_s for r in results if r.kind in ("elementwise", "optimizer")]
    if not copies and not work:
        raise ValueError("no memory-bound results")
    best = max(copies + work)
    peak = reference_tb_per_s * 1e12 if reference_tb_per_s else best
    eff = min(1.0, max(MIN_EFFICIENCY, statistics.median(work or copies) / peak))
    note = "datasheet HBM bandwidth" if reference_tb_per_s else "best measured copy bandwidth as the peak"
    return peak / 1e12, eff, note


def link_profile(samples: list[CollectiveSample], kind: str, reference_gb_per_s: float | None,
                 source: str) -> LinkProfile:
    """A LinkProfile from collective samples: latency = median fitted intercept (per step), link
    bandwidth = datasheet if known else the best fitted/measured bus bandwidth."""
    by_coll: dict[str, list[CollectiveSample]] = defaultdict(list)
    for s in samples:
        by_coll[s.collective].append(s)
    fits = {name: fit_latency_bandwidth(group) for name, group in by_coll.items()}
    step_latency_s = statistics.median(
        f.latency_us * 1e-6 / max(1, latency_steps(name, by_coll[name][0].num_ranks)) for name, f in fits.items()
    )
    measured_bw = max(max(f.bandwidth_gb_per_s for f in fits.values()), max(s.bus_gb_per_s for s in samples))
    bandwidth = reference_gb_per_s or measured_bw
    curves: dict[str, EfficiencyCurve] = {}
    for name, group in by_coll.items():
        by_size: dict[float, list[float]] = defaultdict(list)
        for s in group:
            lat_s = step_latency_s * latency_steps(name, s.num_ranks)
            t_bw = max(s.time_s - lat_s, s.time_s * 0.05)
            busbw = s.message_bytes * volume_factor(name, s.num_ranks) / t_bw / 1e9
            by_size[float(s.message_bytes)].append(busbw / bandwidth)
        methods = sorted({s.method for s in group})
        curves[name] = _curve(by_size, f"{source}; {name} via {'/'.join(methods)} on {group[0].num_ranks} ranks")
    return LinkProfile(
        kind=kind, bandwidth_gb_per_s=round(bandwidth, 4), latency_us=round(step_latency_s * 1e6, 3),
        efficiency=curves,
        provenance=Provenance(kind="measured", source=f"{source}; bandwidth = "
                              + ("datasheet" if reference_gb_per_s else "best measured bus bandwidth")),
    )


def _reference_domain(reference: DeviceProfile | None, gpus_per_node: int) -> int | None:
    """The shipped profile's NVLink domain beyond the host, where the measured host is the shipped one's size."""
    if reference is None or reference.scale_up_domain_gpus is None or reference.gpus_per_node != gpus_per_node:
        return None
    return reference.scale_up_domain_gpus


def build_device_profile(
    *, name: str, vendor: str, memory_gib: float, memory_overhead_gib: float, gpus_per_node: int, dtype: str,
    kernels: list[KernelResult], collectives: list[CollectiveSample], source: str, link_kind: str,
    reference: DeviceProfile | None = None, progress: Callable[[str], None] = lambda _m: None,
) -> DeviceProfile:
    """Assemble the measured DeviceProfile; `reference` (a shipped profile of the same device)
    supplies datasheet peaks, the inter-node link and the NVLink domain beyond the host (GB200/GB300 NVL72), which
    one host cannot measure."""
    if reference is not None and dtype in reference.peak_tflops:
        peak = reference.peak_tflops[dtype] * 1e12
        peak_note = f"efficiency = achieved / datasheet peak {reference.peak_tflops[dtype]} TFLOP/s ({dtype})"
        peaks = dict(reference.peak_tflops)
    else:
        peak = best_gemm_flop_per_s(kernels)
        peak_note = (f"peak = best GEMM rate measured in this run, {peak / 1e12:.4f} TFLOP/s in {dtype}"
                     + ("; bf16 listed with the same value so bf16 runs can be priced" if dtype != "bf16" else ""))
        peaks = {dtype: round(peak / 1e12, 6)}
        peaks.setdefault("bf16", peaks[dtype])
    src = f"{source}; {peak_note}"
    gemm = gemm_curve(kernels, peak, src)
    attention = attention_curve(kernels, peak, src)
    grouped = grouped_curve(kernels, gemm, peak, src)
    if grouped is None:
        grouped = (reference.grouped_gemm_efficiency if reference is not None else EfficiencyCurve(
            points=(EfficiencyPoint(size=1.0, efficiency=1.0),),
            provenance=Provenance(kind="measured", source=f"{source}; dense model: no expert GEMMs timed, "
                                  "multiplier 1.0")))
    hbm_tb_per_s, hbm_eff, hbm_note = memory_bandwidth(kernels, reference.hbm_bandwidth_tb_per_s if reference else None)
    progress(f"memory bandwidth {hbm_tb_per_s * 1e3:.1f} GB/s ({hbm_note}), efficiency {hbm_eff:.3f}")
    if collectives:
        intra = link_profile(collectives, link_kind,
                             reference.intra_node.bandwidth_gb_per_s if reference is not None else None,
                             f"{source}; intra-node collectives")
    elif reference is not None:
        intra = reference.intra_node  # not measured here: the shipped table, with its own provenance
    else:
        raise ValueError("no collective samples and no reference profile to take the links from")
    if reference is not None:
        inter = reference.inter_node
    else:
        inter = intra.model_copy(update={"provenance": Provenance(
            kind="measured", source=f"{source}; inter-node NOT measured (one host): copy of the intra-node link")})
    return DeviceProfile(
        name=name, aliases=(), vendor=vendor, memory_gib=round(memory_gib, 3),
        memory_overhead_gib=round(memory_overhead_gib, 3), peak_tflops=peaks,
        hbm_bandwidth_tb_per_s=round(hbm_tb_per_s, 6), hbm_efficiency=round(hbm_eff, 4), gpus_per_node=gpus_per_node,
        scale_up_domain_gpus=_reference_domain(reference, gpus_per_node), gemm_efficiency=gemm, attention_efficiency=attention, grouped_gemm_efficiency=grouped,
        intra_node=intra, inter_node=inter,
        datasheet=Provenance(kind="measured", source=src + f"; memory: {hbm_note}"),
    )
