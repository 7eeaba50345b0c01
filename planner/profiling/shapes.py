"""The kernel shapes to time for one model at the TP/EP splits the search can choose (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import PlannerInputError
from planner.megatron.rules import ep_violations, tp_violations
from planner.schemas.model import ModelSpec

QUICK_MAX_HIDDEN = 256
QUICK_MAX_SEQ = 128
QUICK_MAX_FFN = 512


@dataclass(frozen=True)
class GemmShape:
    """C[m, n] = A[m, k] @ B[k, n]; FLOP = 2*m*n*k."""

    name: str
    m: int
    n: int
    k: int

    @property
    def flop(self) -> float:
        return 2.0 * self.m * self.n * self.k


@dataclass(frozen=True)
class AttentionShape:
    """scaled_dot_product_attention on [batch, heads, seq, head_dim], causal."""

    name: str
    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int

    @property
    def fwd_flop(self) -> float:
        """QK^T and AV, halved for the causal mask (Megatron's count, as planner/cost/flops.py)."""
        return 2.0 * self.batch * self.seq * self.seq * self.heads * self.head_dim


@dataclass(frozen=True)
class GroupedGemmShape:
    """`local_experts` GEMMs of [tokens_per_expert, hidden] @ [hidden, ffn] (expert fc1)."""

    name: str
    local_experts: int
    tokens_per_expert: int
    hidden: int
    ffn: int

    @property
    def flop(self) -> float:
        return 2.0 * self.local_experts * self.tokens_per_expert * self.hidden * self.ffn

    @property
    def flop_per_expert(self) -> float:
        return 2.0 * self.tokens_per_expert * self.hidden * self.ffn


@dataclass(frozen=True)
class BenchShapes:
    """Everything one profile run times."""

    model_name: str
    scaled_down: bool
    hidden: int
    ffn: int
    seq: int
    tokens: tuple[int, ...]
    gemms: tuple[GemmShape, ...]
    attention: tuple[AttentionShape, ...]
    grouped: tuple[GroupedGemmShape, ...]
    elementwise_elems: tuple[int, ...]
    optimizer_params: int
    layer_tp: int
    moe_grouped_gemm: bool = False  # --moe-grouped-gemm: Megatron runs the experts as TE's GroupedLinear


def _div(value: int, by: int) -> int:
    return max(1, value // by)


def _scaled(model: ModelSpec, quick: bool) -> tuple[int, int, int, int, int, int, int, bool]:
    """(hidden, ffn, moe_ffn, heads, kv_heads, head_dim, seq, scaled) — shrunk for --quick."""
    h, f, mf = model.hidden_size, model.ffn_size, model.moe_ffn_size
    heads, kv, d, s = model.num_attention_heads, model.query_groups, model.head_dim, model.seq_length
    if not quick:
        return h, f, mf, heads, kv, d, s, False
    scale = max(1, h // QUICK_MAX_HIDDEN)
    h2 = max(64, h // scale)
    heads2 = max(1, min(heads, h2 // 32))
    kv2 = max(1, min(kv, heads2))
    while heads2 % kv2:
        kv2 -= 1
    return (h2, min(QUICK_MAX_FFN, max(64, f // scale)), min(QUICK_MAX_FFN, max(64, mf // scale)),
            heads2, kv2, h2 // heads2, min(s, QUICK_MAX_SEQ), True)


def bench_shapes(
    model: ModelSpec, tp_list: list[int], ep_list: list[int], etp_list: list[int], micro_batch_sizes: list[int],
    quick: bool,
) -> BenchShapes:
    """GEMM, attention, grouped-GEMM, elementwise and optimizer sizes for `model` at every TP/EP/ETP.

    With `quick`, the hidden size, FFN and sequence are scaled down (a CPU smoke run); the curves
    are then indexed by the FLOP of the shapes actually run, so they stay valid lookups."""
    h, f, mf, heads, kv, d, s, scaled = _scaled(model, quick)
    glu = 2 if model.gated_linear_unit else 1
    q = heads * d
    tokens = tuple(sorted({mbs * s for mbs in micro_batch_sizes}))
    gemms: list[GemmShape] = []
    attention: list[AttentionShape] = []
    for tp in sorted(set(tp_list)):
        for t in tokens:
            gemms.append(GemmShape(f"qkv/tp{tp}/t{t}", t, _div(q + 2 * kv * d, tp), h))
            gemms.append(GemmShape(f"out_proj/tp{tp}/t{t}", t, h, _div(q, tp)))
            if not model.is_moe or any(not m for m in model.layer_is_moe):
                gemms.append(GemmShape(f"mlp_fc1/tp{tp}/t{t}", t, _div(f * glu, tp), h))
                gemms.append(GemmShape(f"mlp_fc2/tp{tp}/t{t}", t, h, _div(f, tp)))
            if heads % tp == 0 or tp == 1:
                attention.append(
                    AttentionShape(f"sdpa/tp{tp}/t{t}", t // s, _div(heads, tp), _div(kv, tp), s, d)
                )
    grouped: list[GroupedGemmShape] = []
    if model.is_moe:
        experts = model.num_experts or 1
        points = (16, 64, 256) if quick else (16, 64, 256, 1024, 4096)
        for ep in sorted(set(ep_list)):
            if experts % ep:
                continue
            for etp in sorted(set(etp_list)):
                local = experts // ep
                if quick:
                    local = min(local, 4)
                for tpe in points:
                    grouped.append(GroupedGemmShape(f"experts/ep{ep}/etp{etp}/tpe{tpe}", local, tpe, h,
                                                    _div(mf * glu, etp)))
    elementwise = tuple(sorted({t * h for t in tokens} | {t * _div(f, min(tp_list)) for t in tokens}))
    optimizer_params = 1 << 20 if quick else 1 << 26
    return BenchShapes(model.name, scaled, h, f, s, tokens, tuple(gemms), tuple(attention), tuple(grouped),
                       elementwise, optimizer_params, min(tp_list), moe_grouped_gemm=model.moe_grouped_gemm)


def check_splits(model: ModelSpec, tp_list: list[int], ep_list: list[int], quick: bool) -> None:
    """Refuse a --tp-list or --ep-list value Megatron would refuse for `model` (nothing timed there could be
    planned), and a --tp-list that leaves no attention shape (--quick shrinks the heads): checked before torch."""
    for flag, values, rule in (("--tp-list", tp_list, tp_violations), ("--ep-list", ep_list, ep_violations)):
        for value in values:
            found = rule(model, value)
            if found:
                raise PlannerInputError(flag, f"{value}: {found[0].message} ({found[0].hint})")
    heads = _scaled(model, quick)[3]
    if not any(heads % tp == 0 or tp == 1 for tp in tp_list):
        raise PlannerInputError("--tp-list", f"no TP in {','.join(map(str, tp_list))} divides the {heads} attention "
                                f"heads timed{' (--quick shrinks the model)' if quick else ''}: include 1 or a divisor "
                                f"of {heads}")


def allowed_tps(model: ModelSpec, candidates: list[int]) -> list[int]:
    """The default TP sizes Megatron allows for `model` (1 always)."""
    return [tp for tp in candidates if tp == 1 or not tp_violations(model, tp)]
