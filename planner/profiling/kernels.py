"""Torch micro-benchmarks of the kernels the cost model prices: dense GEMMs, the attention core
(scaled_dot_product_attention forward and forward+backward), grouped expert GEMMs, memory-bound
elementwise work (norm, activation, residual add, copy), the optimizer step, and the memory of
one layer's forward/backward.  Each timing is the median of `repeats` runs after `warmup` runs."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from planner.profiling.shapes import AttentionShape, BenchShapes, GemmShape, GroupedGemmShape

ProgressFn = Callable[[str], None]

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _torch() -> Any:
    import torch  # noqa: PLC0415 - optional dependency

    return torch


@dataclass(frozen=True)
class KernelResult:
    """One timed kernel.  `flop` is 0 for memory-bound kernels, `bytes_moved` 0 for GEMMs."""

    kind: str  # gemm, attention_fwd, attention_fwd_bwd, grouped_gemm, elementwise, copy, optimizer
    name: str
    time_s: float
    flop: float = 0.0
    bytes_moved: float = 0.0
    tokens_per_expert: int = 0
    flop_per_call: float = 0.0
    impl: str = ""  # what ran, where it matters (grouped GEMMs: TE's GroupedLinear or one matmul per expert)

    @property
    def flop_per_s(self) -> float:
        return self.flop / self.time_s if self.time_s > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_moved / self.time_s if self.time_s > 0 else 0.0

    def to_json(self) -> dict:
        out = asdict(self)
        out["tflops"] = self.flop_per_s / 1e12
        out["gb_per_s"] = self.bytes_per_s / 1e9
        return out


def synchronize(device: str) -> None:
    torch = _torch()
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_time_s(fn: Callable[[], Any], device: str, warmup: int, repeats: int) -> float:
    """Median wall time of `fn` over `repeats` runs after `warmup` runs, device synchronised."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench_gemms(shapes: tuple[GemmShape, ...], device: str, dtype: str, warmup: int, repeats: int,
                progress: ProgressFn) -> list[KernelResult]:
    """Time every dense GEMM shape (one matmul each)."""
    torch = _torch()
    dt = getattr(torch, DTYPES[dtype])
    out = []
    seen: dict[tuple[int, int, int], float] = {}
    for shape in shapes:
        key = (shape.m, shape.n, shape.k)
        if key not in seen:
            a = torch.randn(shape.m, shape.k, device=device, dtype=dt)
            b = torch.randn(shape.k, shape.n, device=device, dtype=dt)
            seen[key] = median_time_s(lambda: torch.matmul(a, b), device, warmup, repeats)
        out.append(KernelResult("gemm", shape.name, seen[key], flop=shape.flop, flop_per_call=shape.flop))
        progress(f"gemm {shape.name} [{shape.m}x{shape.k}]@[{shape.k}x{shape.n}]: "
                 f"{shape.flop / seen[key] / 1e12:.3f} TFLOP/s")
    return out


def bench_attention(shapes: tuple[AttentionShape, ...], device: str, dtype: str, warmup: int, repeats: int,
                    progress: ProgressFn) -> list[KernelResult]:
    """Causal scaled_dot_product_attention: forward alone, and forward + backward."""
    torch = _torch()
    F = torch.nn.functional
    dt = getattr(torch, DTYPES[dtype])
    out = []
    for shape in shapes:
        q = torch.randn(shape.batch, shape.heads, shape.seq, shape.head_dim, device=device, dtype=dt,
                        requires_grad=True)
        kv_shape = (shape.batch, shape.kv_heads, shape.seq, shape.head_dim)
        k = torch.randn(*kv_shape, device=device, dtype=dt, requires_grad=True)
        v = torch.randn(*kv_shape, device=device, dtype=dt, requires_grad=True)
        gqa = shape.kv_heads != shape.heads

        def fwd() -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

        grad = torch.randn(shape.batch, shape.heads, shape.seq, shape.head_dim, device=device, dtype=dt)

        def fwd_bwd() -> None:
            fwd().backward(grad)

        with torch.no_grad():
            t_fwd = median_time_s(fwd, device, warmup, repeats)
        t_fb = median_time_s(fwd_bwd, device, warmup, repeats)
        flop = shape.fwd_flop
        out.append(KernelResult("attention_fwd", shape.name, t_fwd, flop=flop, flop_per_call=flop))
        out.append(KernelResult("attention_fwd_bwd", shape.name, t_fb, flop=flop, flop_per_call=flop))
        progress(f"attention {shape.name} b{shape.batch} h{shape.heads} s{shape.seq} d{shape.head_dim}: "
                 f"fwd {t_fwd * 1e3:.3f} ms, fwd+bwd {t_fb * 1e3:.3f} ms")
    return out


SEQUENTIAL_EXPERTS = "torch.matmul per expert"
"""The grouped-GEMM implementation `bench_grouped` times without Transformer Engine: Megatron's SequentialMLP (no
--moe-grouped-gemm), one GEMM per local expert."""


def _transformer_engine() -> Any | None:
    """transformer_engine.pytorch where it imports, else None."""
    try:
        import transformer_engine.pytorch as te  # noqa: PLC0415 - optional dependency
    except Exception:  # noqa: BLE001 - absent, or present without a GPU build: time the per-expert loop instead
        return None
    return te


def grouped_runner(shape: GroupedGemmShape, device: str, dtype: str, *, grouped_gemm: bool,
                   te: Any | None = None) -> tuple[Callable[[], Any], str]:
    """(one forward of `shape`'s expert fc1, what runs it): with --moe-grouped-gemm and Transformer Engine (`te`,
    else imported where it can be), TE's GroupedLinear over the local experts, as Megatron's TEGroupedMLP runs them
    (transformer_engine/pytorch/module/grouped_linear.py); else one matmul per local expert, as SequentialMLP."""
    torch = _torch()
    dt = getattr(torch, DTYPES[dtype])
    if grouped_gemm and te is None and device.startswith("cuda"):
        te = _transformer_engine()
    if grouped_gemm and te is not None:
        layer = te.GroupedLinear(shape.local_experts, shape.hidden, shape.ffn, bias=False, params_dtype=dt,
                                 device=device)
        inp = torch.randn(shape.local_experts * shape.tokens_per_expert, shape.hidden, device=device, dtype=dt)
        splits = [shape.tokens_per_expert] * shape.local_experts
        try:  # TE 2.x takes the split sizes as a tensor (CUDA int64 preferred), older releases as a list
            m_splits: Any = torch.tensor(splits, dtype=torch.int64, device=device)
            layer(inp, m_splits)
        except (TypeError, AttributeError):
            m_splits = splits
        # transformer_engine.pytorch carries no version of its own; its package does
        version = getattr(te, "__version__", "") or getattr(sys.modules.get("transformer_engine"), "__version__", "")
        return (lambda: layer(inp, m_splits)), f"Transformer Engine GroupedLinear {version}".strip()
    xs = [torch.randn(shape.tokens_per_expert, shape.hidden, device=device, dtype=dt)
          for _ in range(shape.local_experts)]
    ws = [torch.randn(shape.hidden, shape.ffn, device=device, dtype=dt) for _ in range(shape.local_experts)]

    def run() -> None:
        for x, w in zip(xs, ws):
            torch.matmul(x, w)

    return run, SEQUENTIAL_EXPERTS


def bench_grouped(shapes: tuple[GroupedGemmShape, ...], device: str, dtype: str, warmup: int, repeats: int,
                  progress: ProgressFn, *, grouped_gemm: bool = False, te: Any | None = None) -> list[KernelResult]:
    """Expert GEMMs as the run's Megatron runs them (`grouped_runner`): TE's GroupedLinear with --moe-grouped-gemm
    where Transformer Engine imports, else one matmul per local expert; each result names what ran."""
    torch = _torch()
    out = []
    with torch.no_grad():
        for shape in shapes:
            run, impl = grouped_runner(shape, device, dtype, grouped_gemm=grouped_gemm, te=te)
            t = median_time_s(run, device, warmup, repeats)
            out.append(KernelResult("grouped_gemm", shape.name, t, flop=shape.flop,
                                    tokens_per_expert=shape.tokens_per_expert,
                                    flop_per_call=shape.flop_per_expert, impl=impl))
            progress(f"grouped gemm {shape.name} ({shape.local_experts} experts, {impl}): "
                     f"{shape.flop / t / 1e12:.3f} TFLOP/s")
    return out


def bench_elementwise(elems: tuple[int, ...], hidden: int, device: str, dtype: str, warmup: int, repeats: int,
                      copy_bytes: int, progress: ProgressFn) -> list[KernelResult]:
    """Norm, SiLU and residual add at the model's activation sizes, and a large copy (the
    achievable memory bandwidth).  Bytes moved = reads + writes of the tensors."""
    torch = _torch()
    F = torch.nn.functional
    dt = getattr(torch, DTYPES[dtype])
    esize = torch.empty(0, dtype=dt).element_size()
    out = []
    for n in elems:
        rows = max(1, n // hidden)
        x = torch.randn(rows, hidden, device=device, dtype=dt)
        y = torch.randn(rows, hidden, device=device, dtype=dt)
        w = torch.ones(hidden, device=device, dtype=dt)
        nbytes = x.numel() * esize
        cases = {
            "layer_norm": (lambda: F.layer_norm(x, (hidden,), w), 2 * nbytes),
            "silu": (lambda: F.silu(x), 2 * nbytes),
            "residual_add": (lambda: torch.add(x, y), 3 * nbytes),
        }
        for name, (fn, moved) in cases.items():
            t = median_time_s(fn, device, warmup, repeats)
            out.append(KernelResult("elementwise", f"{name}/{x.numel()}", t, bytes_moved=moved))
        progress(f"elementwise at {x.numel()} elements: "
                 + ", ".join(f"{r.name.split('/')[0]} {r.bytes_per_s / 1e9:.1f} GB/s" for r in out[-3:]))
    src = torch.empty(copy_bytes // esize, device=device, dtype=dt).normal_()
    dst = torch.empty_like(src)
    t = median_time_s(lambda: dst.copy_(src), device, warmup, repeats)
    out.append(KernelResult("copy", f"copy/{copy_bytes}", t, bytes_moved=2 * src.numel() * esize))
    progress(f"copy {copy_bytes / 2**20:.0f} MiB: {out[-1].bytes_per_s / 1e9:.1f} GB/s")
    return out


def bench_optimizer(num_params: int, device: str, warmup: int, repeats: int, progress: ProgressFn) -> KernelResult:
    """AdamW step over `num_params` fp32 parameters (fused on CUDA).  Bytes moved per parameter:
    read param, grad, two moments (16) and write param, two moments (12) = 28."""
    torch = _torch()
    param = torch.zeros(num_params, device=device, dtype=torch.float32, requires_grad=True)
    param.grad = torch.randn_like(param)
    kwargs = {"fused": True} if device.startswith("cuda") else {"foreach": True}
    opt = torch.optim.AdamW([param], lr=1e-4, **kwargs)
    t = median_time_s(opt.step, device, warmup, repeats)
    result = KernelResult("optimizer", f"adamw/{num_params}", t, bytes_moved=28.0 * num_params)
    progress(f"optimizer AdamW {num_params} params: {result.bytes_per_s / 1e9:.1f} GB/s")
    return result


class _Layer:
    """A minimal pre-norm transformer layer (torch modules only) at one TP shard's widths."""

    def __init__(self, torch: Any, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, gated: bool,
                 device: str, dtype: Any):
        nn = torch.nn
        self.torch, self.heads, self.kv_heads, self.head_dim = torch, heads, kv_heads, head_dim
        self.gated = gated  # a gated MLP (SwiGLU measured: quick-GeGLU has the same shapes)
        kw = {"device": device, "dtype": dtype}
        self.norm1 = nn.LayerNorm(hidden, **kw)
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=False, **kw)
        self.proj = nn.Linear(heads * head_dim, hidden, bias=False, **kw)
        self.norm2 = nn.LayerNorm(hidden, **kw)
        self.fc1 = nn.Linear(hidden, ffn * (2 if gated else 1), bias=False, **kw)
        self.fc2 = nn.Linear(ffn, hidden, bias=False, **kw)

    def __call__(self, x: Any) -> Any:
        torch = self.torch
        F = torch.nn.functional
        b, s, _ = x.shape
        qkv = self.qkv(self.norm1(x))
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                             self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, -1))
        hmid = self.fc1(self.norm2(x))
        if self.gated:
            g, u = hmid.chunk(2, dim=-1)
            hmid = F.silu(g) * u
        else:
            hmid = F.gelu(hmid)
        return x + self.fc2(hmid)


def layer_memory(shapes: BenchShapes, heads: int, kv_heads: int, head_dim: int, gated: bool, device: str,
                 dtype: str) -> dict:
    """Memory of one layer's forward+backward at micro-batch 1 and TP = the smallest TP profiled.

    Always: bytes of tensors saved for backward (autograd saved-tensor hooks, storages counted
    once) per token.  On CUDA/ROCm also the peak allocated above the weights
    (torch.cuda.max_memory_allocated).  On CPU no allocator peak is available; the report says so."""
    torch = _torch()
    dt = getattr(torch, DTYPES[dtype])
    tp = shapes.layer_tp
    layer = _Layer(torch, shapes.hidden, max(1, heads // tp), max(1, kv_heads // tp), head_dim,
                   max(1, shapes.ffn // tp), gated, device, dt)
    tokens = shapes.seq
    x = torch.randn(1, tokens, shapes.hidden, device=device, dtype=dt, requires_grad=True)
    saved: dict[Any, int] = {}

    def pack(t: Any) -> Any:
        try:
            key = t.untyped_storage().data_ptr()
            saved[key] = max(saved.get(key, 0), t.untyped_storage().nbytes())
        except (RuntimeError, NotImplementedError):
            saved[id(t)] = t.numel() * t.element_size()
        return t

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = layer(x)
    y.sum().backward()
    report = {
        "tokens": tokens,
        "tp": tp,
        "hidden": shapes.hidden,
        "saved_activation_bytes": float(sum(saved.values())),
        "saved_activation_bytes_per_token": float(sum(saved.values())) / tokens,
        "dtype": dtype,
    }
    if cuda:
        torch.cuda.synchronize()
        report["peak_allocated_above_start_bytes"] = float(torch.cuda.max_memory_allocated() - base)
    else:
        report["peak_allocated_above_start_bytes"] = None
        report["note"] = "CPU: no allocator peak; saved-for-backward tensor bytes only"
    return report
