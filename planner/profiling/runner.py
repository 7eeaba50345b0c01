"""Run a whole profile (kernels, collectives, one layer's memory) and write it as a DeviceProfile."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import platform
import re
import resource
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from planner.errors import PlannerInputError
from planner.output.run_dir import PROFILE_OUTPUT, write_files
from planner.profile_tables import ProfileSet
from planner.profiling import collectives, kernels
from planner.profiling.shapes import BenchShapes, bench_shapes
from planner.profiling.tables import build_device_profile
from planner.schemas.device import DeviceProfile
from planner.schemas.model import ModelSpec
from planner.units import GIB_BYTES

ProgressFn = Callable[[str], None]
CPU_GPUS_PER_NODE = 2  # two gloo processes stand for the two "GPUs" of one CPU node


@dataclass
class ProfileOptions:
    """What to measure.  Lists are the splits the search may choose."""

    model: ModelSpec
    device: str  # cpu | cuda
    quick: bool = False
    tp_list: list[int] = field(default_factory=lambda: [1, 2])
    ep_list: list[int] = field(default_factory=lambda: [1])
    etp_list: list[int] = field(default_factory=lambda: [1])
    micro_batch_sizes: list[int] = field(default_factory=lambda: [1])
    dtype: str | None = None  # default: fp32 on CPU, bf16 on CUDA/ROCm
    warmup: int | None = None
    repeats: int | None = None
    collective_sizes_bytes: list[int] | None = None
    skip_collectives: bool = False

    def resolved_dtype(self) -> str:
        return self.dtype or ("fp32" if self.device == "cpu" else "bf16")

    def timing(self) -> tuple[int, int]:
        return (self.warmup if self.warmup is not None else (1 if self.quick else 3),
                self.repeats if self.repeats is not None else (3 if self.quick else 10))

    def sizes(self) -> list[int]:
        if self.collective_sizes_bytes:
            return sorted(self.collective_sizes_bytes)
        if self.quick:
            return [1 << 12, 1 << 16, 1 << 20, 1 << 22]
        top = 28 if self.device == "cuda" else 26
        return [1 << p for p in range(16, top + 1, 2)]


@dataclass
class ProfileOutcome:
    profile: DeviceProfile
    report: dict[str, Any]


def default_ep_list(model: ModelSpec, max_ep: int = 8) -> list[int]:
    """Expert-parallel sizes worth timing: divisors of the expert count up to `max_ep`."""
    if not model.is_moe:
        return [1]
    experts = model.num_experts or 1
    return [e for e in (1, 2, 4, 8, 16, 32, 64) if e <= max_ep and experts % e == 0]


def cpu_device_name() -> str:
    """`CPU-<6 hex digits of the host name's hash>`: stable per host, no host name leaked."""
    return "CPU-" + hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def _total_ram_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16.0 * GIB_BYTES


def _rss_bytes() -> float:
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0  # Linux: KiB


def _reference_profile(device_name: str) -> DeviceProfile | None:
    """The shipped profile whose name or alias appears in the CUDA device name, if any."""
    try:
        profiles = ProfileSet.load()
    except Exception:  # a broken shipped set must not stop a measurement  # noqa: BLE001
        return None
    tokens = [device_name, *re.split(r"[\s_]+", device_name)]
    tokens += ["-".join(device_name.split()[i:]) for i in range(1, len(device_name.split()))]
    for token in tokens:
        try:
            return profiles.device(token)
        except Exception:  # MissingProfileError / KeyError / PlannerInputError  # noqa: BLE001
            continue
    return None


def software_versions(torch: Any, device_label: str) -> str:
    cuda = getattr(torch.version, "cuda", None)
    hip = getattr(torch.version, "hip", None)
    accel = f"CUDA {cuda}" if cuda else (f"ROCm {hip}" if hip else "no CUDA/ROCm")
    return f"torch {torch.__version__}, {accel}, device {device_label}, python {platform.python_version()}"


@dataclass
class _Device:
    """The device being measured, and what the profile states about it."""

    dev: str  # torch device string
    label: str  # the name the driver (or the CPU) gives
    reference: DeviceProfile | None  # the shipped profile of the same device, if any
    name: str
    vendor: str
    memory_gib: float
    overhead_gib: float
    context_gib: float | None
    gpus_per_node: int
    link_kind: str


def run_profile(opts: ProfileOptions, progress: ProgressFn) -> ProfileOutcome:
    """Time the model's kernels and the collectives; return the DeviceProfile and a report."""
    import torch  # optional dependency (the profile extra): imported only when a profile is run

    dtype = _checked_dtype(opts, torch)
    warmup, repeats = opts.timing()
    baseline_rss = _rss_bytes()
    device = _cuda_device(torch) if opts.device == "cuda" else _cpu_device(baseline_rss)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    shapes: BenchShapes = bench_shapes(opts.model, opts.tp_list, opts.ep_list, opts.etp_list,
                                       opts.micro_batch_sizes, opts.quick)
    source = (f"hapmoe profile {stamp}, model {opts.model.name}"
              + (" (quick: shapes scaled down)" if shapes.scaled_down else "")
              + f"; {software_versions(torch, device.label)}; {warmup} warm-up + median of {repeats}")
    progress(f"profiling {device.name} ({device.label}), dtype {dtype}, {len(shapes.gemms)} GEMMs, "
             f"{len(shapes.attention)} attention, {len(shapes.grouped)} grouped GEMMs")
    results = _bench_kernels(opts, shapes, device.dev, dtype, progress)
    memory = _layer_memory(opts, shapes, device.dev, dtype, progress)
    coll, coll_note = _bench_collectives(opts, torch, device, progress)
    profile = build_device_profile(
        name=device.name, vendor=device.vendor, memory_gib=device.memory_gib, memory_overhead_gib=device.overhead_gib,
        gpus_per_node=device.gpus_per_node, dtype=dtype, kernels=results, collectives=coll, source=source,
        link_kind=device.link_kind, reference=device.reference, progress=progress,
    )
    report = {
        "device": device.name,
        "device_label": device.label,
        "source": source,
        "dtype": dtype,
        "shapes_scaled_down": shapes.scaled_down,
        "kernels": [r.to_json() for r in results],
        "collectives": [
            {**s.__dict__, "bus_gb_per_s": s.bus_gb_per_s} for s in coll
        ],
        "collectives_note": coll_note or "measured",
        "layer_memory": memory,
        "cuda_context_gib": device.context_gib,
        "process_rss_before_benchmarks_gib": baseline_rss / GIB_BYTES,
        "reference_profile": device.reference.name if device.reference is not None else None,
    }
    return ProfileOutcome(profile=profile, report=report)


def _checked_dtype(opts: ProfileOptions, torch: Any) -> str:
    """The kernel precision, after the device and precision are checked."""
    if opts.device not in ("cpu", "cuda"):
        raise PlannerInputError("--device", f"expected cpu or cuda, got {opts.device!r}")
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise PlannerInputError("--device", "cuda requested but torch sees no CUDA/ROCm device")
    dtype = opts.resolved_dtype()
    if dtype not in kernels.DTYPES:
        raise PlannerInputError("--dtype", f"expected one of {', '.join(kernels.DTYPES)}, got {dtype!r}")
    return dtype


def _cuda_device(torch: Any) -> _Device:
    """GPU 0, named after the shipped profile of the same device when there is one."""
    torch.cuda.set_device(0)
    torch.cuda.init()
    label = torch.cuda.get_device_name(0)
    reference = _reference_profile(label)
    free_b, total_b = torch.cuda.mem_get_info()
    context_gib = (total_b - free_b - torch.cuda.memory_reserved()) / GIB_BYTES
    return _Device(
        dev="cuda:0", label=label, reference=reference,
        name=reference.name if reference is not None else re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-"),
        vendor="AMD" if getattr(torch.version, "hip", None) else "NVIDIA",
        memory_gib=total_b / GIB_BYTES, context_gib=context_gib,
        overhead_gib=reference.memory_overhead_gib if reference is not None else context_gib,
        gpus_per_node=reference.gpus_per_node if reference is not None else max(1, torch.cuda.device_count()),
        link_kind=reference.intra_node.kind if reference is not None else "pcie",
    )


def _cpu_device(baseline_rss: float) -> _Device:
    """This host's CPU as two "GPUs" of one node, each with half the memory."""
    return _Device(
        dev="cpu", label=platform.processor() or platform.machine() or "cpu", reference=None,
        name=cpu_device_name(), vendor="cpu", gpus_per_node=CPU_GPUS_PER_NODE,
        memory_gib=_total_ram_bytes() / CPU_GPUS_PER_NODE / GIB_BYTES, overhead_gib=baseline_rss / GIB_BYTES,
        context_gib=None, link_kind="host-memory",
    )


def _bench_kernels(opts: ProfileOptions, shapes: BenchShapes, dev: str, dtype: str,
                   progress: ProgressFn) -> list[kernels.KernelResult]:
    """GEMMs, attention, grouped GEMMs, elementwise passes and the optimizer step at the model's shapes."""
    warmup, repeats = opts.timing()
    results = []
    results += kernels.bench_gemms(shapes.gemms, dev, dtype, warmup, repeats, progress)
    results += kernels.bench_attention(shapes.attention, dev, dtype, warmup, repeats, progress)
    results += kernels.bench_grouped(shapes.grouped, dev, dtype, warmup, repeats, progress,
                                     grouped_gemm=shapes.moe_grouped_gemm)
    copy_bytes = (64 << 20) if opts.quick else ((1 << 30) if dev != "cpu" else (256 << 20))
    results += kernels.bench_elementwise(shapes.elementwise_elems, shapes.hidden, dev, dtype, warmup, repeats,
                                         copy_bytes, progress)
    results.append(kernels.bench_optimizer(shapes.optimizer_params, dev, warmup, repeats, progress))
    return results


def _layer_memory(opts: ProfileOptions, shapes: BenchShapes, dev: str, dtype: str,
                  progress: ProgressFn) -> dict[str, Any]:
    """One layer's forward and backward: the activation bytes it saves per token, and its peak."""
    heads = max(1, min(opts.model.num_attention_heads, shapes.hidden // 32)) if shapes.scaled_down \
        else opts.model.num_attention_heads
    kv = min(opts.model.query_groups, heads)
    while heads % kv:
        kv -= 1
    memory = kernels.layer_memory(shapes, heads, kv, shapes.hidden // heads, opts.model.gated_linear_unit, dev, dtype)
    progress(f"one layer fwd+bwd saved {memory['saved_activation_bytes_per_token']:.0f} bytes/token"
             + (f", peak {memory['peak_allocated_above_start_bytes'] / 2**20:.1f} MiB"
                if memory["peak_allocated_above_start_bytes"] is not None else " (CPU: no allocator peak)"))
    return memory


def _bench_collectives(opts: ProfileOptions, torch: Any, device: _Device,
                       progress: ProgressFn) -> tuple[list[collectives.CollectiveSample], str]:
    """The collectives on two local processes, or (one device, or --skip-collectives) none, with
    the reason; then the links come from the shipped profile of the same device."""
    warmup, repeats = opts.timing()
    n_local = torch.cuda.device_count() if opts.device == "cuda" else 2
    if opts.skip_collectives or n_local < 2:
        coll_note = ("skipped by --skip-collectives" if opts.skip_collectives
                     else f"skipped: {n_local} local device(s), collectives need 2")
        progress(f"collectives {coll_note}")
        if device.reference is None:
            raise PlannerInputError("--device", "cannot measure collectives on one device and no shipped profile "
                                    f"matches {device.label!r} to take the links from")
        return [], coll_note
    progress(f"collectives on 2 local processes ({'nccl' if opts.device == 'cuda' else 'gloo'}), "
             f"sizes {opts.sizes()[0]}..{opts.sizes()[-1]} bytes")
    coll = collectives.run_collectives(opts.device, opts.sizes(), warmup, repeats)
    for s in coll:
        progress(f"  {s.collective:<14} {s.message_bytes:>11} B: {s.time_s * 1e6:10.1f} us "
                 f"busbw {s.bus_gb_per_s:8.3f} GB/s ({s.method})")
    return coll, ""


def profile_yaml(profile: DeviceProfile) -> str:
    """The profile as YAML in the shipped files' layout (field order of the schema)."""
    data = json.loads(profile.model_dump_json())
    header = (f"# Measured device profile ({profile.name}), written by `cli.py profile`.\n"
              "# Schema: planner/schemas/device.py; contract: profiles/README.md.\n")
    return header + yaml.safe_dump(data, sort_keys=False, width=120)


def write_profile(outcome: ProfileOutcome, out_dir: str | Path, *, force: bool = False) -> list[Path]:
    """Write DIR/devices/<name>.yaml (loaded by `--profiles DIR`) and DIR/profile_report.json through the
    staged writer; the files of other devices' profiles there stay (each device's run is its own writer)."""
    name = outcome.profile.name
    files = {f"devices/{name}.yaml": profile_yaml(outcome.profile),
             "profile_report.json": json.dumps(outcome.report, indent=2, default=str)}
    kind = dataclasses.replace(PROFILE_OUTPUT, writer=f"{PROFILE_OUTPUT.writer} ({name})")
    return write_files(out_dir, files, "--out", kind, force=force)
