"""Collective micro-benchmarks with torch.distributed across local processes (gloo on CPU, NCCL on
GPUs), and a latency/bandwidth fit.

Bandwidth follows the nccl-tests convention: algorithm bandwidth = message bytes / time, bus
bandwidth = algorithm bandwidth x factor with factor 2(n-1)/n for all-reduce, (n-1)/n for
all-gather, reduce-scatter and all-to-all (message = the full gathered / reduced buffer), 1 for
point-to-point.  Each collective first tries the native call; where a backend lacks it (gloo
builds without reduce_scatter or all_to_all) reduce-scatter is emulated by all_reduce (reported as
`emulated_all_reduce`) and all-to-all by isend/irecv pairs (`send_recv`); the method used is
recorded with every sample and in the profile's provenance.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from planner.cost.communication import volume_factor


@dataclass(frozen=True)
class CollectiveSample:
    collective: str
    message_bytes: int
    time_s: float
    num_ranks: int
    method: str  # native, emulated, send_recv

    @property
    def bus_gb_per_s(self) -> float:
        return self.message_bytes / self.time_s * volume_factor(self.collective, self.num_ranks) / 1e9


@dataclass(frozen=True)
class LinkFit:
    """time = latency + bus_bytes / bandwidth, least squares over message sizes."""

    collective: str
    latency_us: float
    bandwidth_gb_per_s: float
    method: str


def fit_latency_bandwidth(samples: list[CollectiveSample]) -> LinkFit:
    """Least-squares line time(bus_bytes); latency clamped at >= 0, bandwidth from the slope (or,
    for a non-positive slope, the best measured bus bandwidth)."""
    if not samples:
        raise ValueError("no samples to fit")
    xs = [s.message_bytes * volume_factor(s.collective, s.num_ranks) for s in samples]
    ys = [s.time_s for s in samples]
    best_gb_per_s = max(s.bus_gb_per_s for s in samples)
    if len(samples) < 2 or len(set(xs)) < 2:
        return LinkFit(samples[0].collective, 0.0, best_gb_per_s, samples[0].method)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    bandwidth = 1.0 / slope / 1e9 if slope > 0 else best_gb_per_s
    return LinkFit(samples[0].collective, max(0.0, intercept) * 1e6, bandwidth, samples[0].method)


def free_port() -> int:
    """A free TCP port on localhost."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _time(fn: Any, dist: Any, device: str, warmup: int, repeats: int) -> float:
    import torch  # noqa: PLC0415

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    # the slowest rank decides: reduce the per-rank medians with MAX
    t = torch.tensor([statistics.median(samples)], dtype=torch.float64,
                     device=device if device.startswith("cuda") else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _worker(rank: int, world: int, port: int, backend: str, device_kind: str, sizes: list[int], warmup: int,
            repeats: int, result_path: str) -> None:
    """One process of the benchmark; rank 0 writes the samples as JSON."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    device = "cpu"
    if device_kind == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    samples: list[dict] = []
    try:
        for nbytes in sizes:
            n = max(world, nbytes // 4) // world * world
            full = torch.ones(n, dtype=torch.float32, device=device)
            shard = torch.ones(n // world, dtype=torch.float32, device=device)
            out_full = torch.empty_like(full)
            msg = n * 4
            ops: dict[str, tuple[str, Any]] = {"all_reduce": ("native", lambda: dist.all_reduce(full))}
            ops["all_gather"] = _all_gather_op(dist, out_full, shard, world)
            ops["reduce_scatter"] = _reduce_scatter_op(dist, full, shard, backend)
            ops["all_to_all"] = _all_to_all_op(dist, full, out_full, rank, world, backend)
            ops["p2p"] = ("send_recv", _p2p_op(dist, shard, rank))
            for name, (method, fn) in ops.items():
                size = msg if name != "p2p" else shard.numel() * 4
                t = _time(fn, dist, device, warmup, repeats)
                if name == "p2p":
                    t /= 2.0  # ping-pong: one way
                samples.append(asdict(CollectiveSample(name, size, t, world, method)))
        if rank == 0:
            Path(result_path).write_text(json.dumps(samples), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def _first_working(candidates: list[tuple[str, Any]]) -> tuple[str, Any] | None:
    """The first (method, fn) that runs once without error (every rank tries the same list, in
    the same order, so the collectives stay matched)."""
    for method, fn in candidates:
        try:
            fn()
            return method, fn
        except (RuntimeError, NotImplementedError, ValueError, AttributeError):
            continue
    return None


def _all_gather_op(dist: Any, out_full: Any, shard: Any, world: int) -> tuple[str, Any]:
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    parts = list(out_full.chunk(world))
    found = _first_working([
        ("native", lambda: getattr(dist, name)(out_full, shard)),
        ("list", lambda: dist.all_gather(parts, shard)),
    ])
    assert found is not None
    return found


def _reduce_scatter_op(dist: Any, full: Any, shard: Any, backend: str) -> tuple[str, Any]:
    name = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"

    def emulated() -> None:
        dist.all_reduce(full)  # no reduce_scatter on this backend: all-reduce, keep this rank's shard

    found = _first_working([("native", lambda: getattr(dist, name)(shard, full))])
    return found or ("emulated_all_reduce", emulated)


def _all_to_all_op(dist: Any, full: Any, out_full: Any, rank: int, world: int, backend: str) -> tuple[str, Any]:
    send_parts = list(full.chunk(world))
    recv_parts = list(out_full.chunk(world))

    def pairs() -> None:  # no all_to_all on this backend: isend/irecv to every peer
        reqs = []
        for peer in range(world):
            if peer == rank:
                recv_parts[peer].copy_(send_parts[peer])
                continue
            reqs.append(dist.isend(send_parts[peer], peer))
            reqs.append(dist.irecv(recv_parts[peer], peer))
        for r in reqs:
            r.wait()

    found = _first_working([("native", lambda: dist.all_to_all_single(out_full, full))])
    return found or ("send_recv", pairs)


def _p2p_op(dist: Any, buf: Any, rank: int) -> Any:
    def ping_pong() -> None:
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)

    return ping_pong


def run_collectives(device_kind: str, sizes: list[int], warmup: int, repeats: int, world: int = 2,
                    timeout_s: float = 300.0) -> list[CollectiveSample]:
    """Spawn `world` local processes (gloo on CPU, NCCL on CUDA/ROCm) and time every collective
    at every message size (bytes).  Raises RuntimeError when the processes fail."""
    import torch.multiprocessing as mp  # noqa: PLC0415

    backend = "nccl" if device_kind == "cuda" else "gloo"
    with tempfile.TemporaryDirectory() as tmp:
        result_path = str(Path(tmp) / "collectives.json")
        ctx = mp.start_processes(
            _worker, args=(world, free_port(), backend, device_kind, sizes, warmup, repeats, result_path),
            nprocs=world, join=False, start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                raise RuntimeError(f"collective benchmark did not finish within {timeout_s:.0f} s")
        rows = json.loads(Path(result_path).read_text(encoding="utf-8"))
    return [CollectiveSample(**row) for row in rows]
