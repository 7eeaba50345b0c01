"""Hook logic, independent of Megatron so that it can be tested on a toy torch model.

- `RouterRecorder` puts a forward hook on every module whose class name ends with `Router`
  (Megatron's TopKRouter and friends) and counts tokens per expert from the router's output:
  a boolean routing map [tokens, experts] (Megatron core >= 0.10 returns (probs, routing_map))
  or integer top-k indices [tokens, k] (older routers, most toy MoEs).
- `InstrumentSession` adds iteration timing (total, and the forward-backward part when the
  caller times it), peak memory per rank, and writes `router_stats_rank{r}.csv` and
  `instrument_rank{r}.json` once N iterations were recorded; then it removes its hooks.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

ROUTER_SUFFIXES = ("Router",)


def _torch() -> Any:
    import torch  # noqa: PLC0415 - torch is an optional dependency

    return torch


def find_routers(models: Any, suffixes: tuple[str, ...] = ROUTER_SUFFIXES) -> list[tuple[str, Any]]:
    """(qualified name, module) of every router module in a model or list of model chunks."""
    chunks = models if isinstance(models, (list, tuple)) else [models]
    found: list[tuple[str, Any]] = []
    for c, chunk in enumerate(chunks):
        for name, module in chunk.named_modules():
            if type(module).__name__.endswith(suffixes):
                prefix = f"chunk{c}." if len(chunks) > 1 else ""
                found.append((prefix + name, module))
    return found


def _num_experts(module: Any) -> int | None:
    config = getattr(module, "config", None)
    for holder, attr in ((config, "num_moe_experts"), (module, "num_experts"), (module, "num_moe_experts")):
        value = getattr(holder, attr, None) if holder is not None else None
        if isinstance(value, int) and value > 0:
            return value
    weight = getattr(module, "weight", None)
    if weight is not None and getattr(weight, "dim", lambda: 0)() == 2:
        return int(weight.shape[0])
    return None


def tokens_per_expert(output: Any, num_experts: int | None) -> list[int] | None:
    """Token counts per expert from a router's output, or None when the output is not understood.

    Accepts a tuple whose last tensor is either a bool/0-1 routing map [tokens, experts] or integer
    indices [tokens, k]."""
    torch = _torch()
    tensors = [t for t in (output if isinstance(output, (tuple, list)) else (output,)) if torch.is_tensor(t)]
    if not tensors:
        return None
    routing = tensors[-1].detach()
    if routing.dtype == torch.bool:
        counts = routing.reshape(-1, routing.shape[-1]).sum(dim=0)
        return [int(v) for v in counts.cpu().tolist()]
    if not routing.dtype.is_floating_point and routing.dtype != torch.bool:
        flat = routing.reshape(-1).long().cpu()
        size = num_experts if num_experts is not None else (int(flat.max()) + 1 if flat.numel() else 0)
        return [int(v) for v in torch.bincount(flat, minlength=size).tolist()]
    return None


@dataclass
class RouterRecorder:
    """Counts tokens per expert for every router, per iteration.  `iteration` is set by the caller."""

    models: Any
    suffixes: tuple[str, ...] = ROUTER_SUFFIXES
    iteration: int = 0
    recording: bool = True
    counts: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (iteration, layer) -> per expert
    layer_names: dict[int, str] = field(default_factory=dict)
    unreadable_outputs: int = 0
    _handles: list[Any] = field(default_factory=list)

    def attach(self) -> int:
        """Register the forward hooks; returns the number of routers found."""
        routers = find_routers(self.models, self.suffixes)
        numbers = [getattr(module, "layer_number", None) for _, module in routers]
        use_numbers = all(isinstance(n, int) for n in numbers) and len(set(numbers)) == len(numbers)
        for index, (name, module) in enumerate(routers):
            layer_id = int(numbers[index]) if use_numbers else index  # Megatron's layer_number is global
            self.layer_names[layer_id] = name
            self._handles.append(module.register_forward_hook(self._make_hook(layer_id, _num_experts(module))))
        return len(self._handles)

    def _make_hook(self, layer_id: int, num_experts: int | None):
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            if not self.recording:
                return
            counts = tokens_per_expert(output, num_experts)
            if counts is None:
                self.unreadable_outputs += 1
                return
            key = (self.iteration, layer_id)
            acc = self.counts.setdefault(key, [0] * len(counts))
            if len(acc) < len(counts):
                acc.extend([0] * (len(counts) - len(acc)))
            for e, n in enumerate(counts):
                acc[e] += n  # micro-batches of one iteration add up

        return hook

    def detach(self) -> None:
        """Remove every hook this recorder registered."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @property
    def attached(self) -> int:
        return len(self._handles)

    def rows(self) -> Iterator[tuple[int, int, int, int]]:
        """(iteration, layer, expert, tokens) rows in a stable order."""
        for (iteration, layer), per_expert in sorted(self.counts.items()):
            for expert, tokens in enumerate(per_expert):
                yield iteration, layer, expert, tokens

    def write_csv(self, path: Path) -> None:
        with path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["iteration", "layer", "expert", "tokens"])
            writer.writerows(self.rows())


def _rank_and_world() -> tuple[int, int]:
    try:
        dist = _torch().distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _synchronize() -> None:
    torch = _torch()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@dataclass
class InstrumentSession:
    """Records `iters` iterations after `skip` warm-up ones, then writes its files and detaches.

    Use: `session.attach(model)`; per iteration `session.begin_iteration()`, optionally
    `with session.phase("forward_backward"):` around parts, `session.end_iteration()`; it returns
    True once the files are written."""

    out_dir: Path
    iters: int = 3
    skip: int = 1
    suffixes: tuple[str, ...] = ROUTER_SUFFIXES
    router: RouterRecorder | None = None
    records: list[dict[str, float | int]] = field(default_factory=list)
    seen: int = 0
    finished: bool = False
    _t0_s: float = 0.0
    _phases_s: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.iters <= 0:
            raise ValueError(f"--iters must be positive, got {self.iters}")
        if self.skip < 0:
            raise ValueError(f"--skip must be >= 0, got {self.skip}")
        self.out_dir = Path(self.out_dir)

    def attach(self, models: Any) -> int:
        """Hook the routers of a model (or list of chunks); returns how many were found."""
        self.router = RouterRecorder(models, self.suffixes)
        return self.router.attach()

    @property
    def recording(self) -> bool:
        return not self.finished and self.seen >= self.skip

    def begin_iteration(self) -> None:
        torch = _torch()
        if self.router is not None:
            self.router.iteration = self.seen
            self.router.recording = self.recording
        if self.recording and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
        self._phases_s = {}
        _synchronize()
        self._t0_s = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a part of the iteration (synchronising the device around it)."""
        _synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            _synchronize()
            self._phases_s[name] = self._phases_s.get(name, 0.0) + time.perf_counter() - start

    def end_iteration(self) -> bool:
        """Close the iteration; write files and detach after the last recorded one."""
        if self.finished:
            return True
        _synchronize()
        total_s = time.perf_counter() - self._t0_s
        if self.recording:
            record: dict[str, float | int] = {"iteration": self.seen, "time_s": total_s}
            record.update({f"{k}_s": v for k, v in self._phases_s.items()})
            if "forward_backward" in self._phases_s:
                record["rest_s"] = max(0.0, total_s - self._phases_s["forward_backward"])
            record.update(_memory_now())
            self.records.append(record)
        self.seen += 1
        if len(self.records) >= self.iters:
            self.finish()
        return self.finished

    def finish(self) -> list[Path]:
        """Write router_stats_rank{r}.csv and instrument_rank{r}.json; remove the hooks."""
        if self.router is not None:
            self.router.detach()
        rank, world = _rank_and_world()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        if self.router is not None and self.router.counts:
            csv_path = self.out_dir / f"router_stats_rank{rank}.csv"
            self.router.write_csv(csv_path)
            written.append(csv_path)
        torch = _torch()
        summary = {
            "rank": rank,
            "world_size": world,
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "recorded_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "skipped_iterations": self.skip,
            "routers": dict(sorted((self.router.layer_names if self.router else {}).items())),
            "unreadable_router_outputs": self.router.unreadable_outputs if self.router else 0,
            "iterations": self.records,
            "max_memory_allocated_bytes": _max_of(self.records, "max_memory_allocated_bytes"),
            "max_memory_reserved_bytes": _max_of(self.records, "max_memory_reserved_bytes"),
        }
        json_path = self.out_dir / f"instrument_rank{rank}.json"
        json_path.write_text(json.dumps(summary, indent=2), encoding="utf-8")
        written.append(json_path)
        self.finished = True
        return written


def _max_of(records: list[dict[str, float | int]], key: str) -> int | None:
    values = [int(r[key]) for r in records if key in r]
    return max(values) if values else None


def _memory_now() -> dict[str, int]:
    """Peak device memory since the last reset (CUDA/ROCm only; empty on CPU)."""
    torch = _torch()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return {
            "max_memory_allocated_bytes": int(torch.cuda.max_memory_allocated()),
            "max_memory_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        }
    return {}


def iter_model_chunks(candidates: Iterable[Any]) -> Any:
    """The first argument that is a torch module or a list of them (Megatron passes `model` as a
    list of chunks); None if there is none."""
    torch = _torch()
    for value in candidates:
        if isinstance(value, torch.nn.Module):
            return value
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.nn.Module) for v in value):
            return list(value)
    return None
