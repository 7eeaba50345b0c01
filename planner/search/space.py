"""The search space: global choices G and per-stage options, with Megatron's and the runtime's
rules applied before any solving (DESIGN section 5; reference/megatron.md sections 2 and 8).

megatron runtime: G = (TP, CP, EP, ETP, DP, micro-batch, PP, VPP, recompute); a stage option is a
device type.  flagscale runtime: G = (TP, CP=1, EP, ETP, DP0, micro-batch, PP); a stage option is
(device type, DP, recompute), VPP = 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from planner.schemas.cluster import ClusterSpec
from planner.schemas.model import ModelSpec
from planner.schemas.plan import Recompute
from planner.schemas.training import TrainingSpec


@dataclass(frozen=True)
class StageOption:
    """What one stage may be: a device type, its DP size and its recompute setting."""

    device_type: str
    dp: int
    recompute: Recompute = field(compare=False)
    recompute_label: str = ""  # identity of the recompute setting (cheap to hash)

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute_label", self.recompute.label)


@dataclass(frozen=True)
class GlobalChoice:
    runtime: str
    tp: int
    cp: int
    ep: int
    etp: int
    mbs: int
    pp: int
    vpp: int
    dp0: int  # megatron: the DP of every stage; flagscale: DP of stage 0
    recompute: Recompute | None  # megatron: the global setting; flagscale: None (per stage)

    def label(self) -> str:
        if self.runtime == "flagscale":
            return (f"tp{self.tp} cp{self.cp} ep{self.ep} etp{self.etp} samples/micro-batch {self.mbs * self.dp0} "
                    f"pp{self.pp} dp,rc=per-stage")
        rec = self.recompute.label if self.recompute else "per-stage"
        return (f"tp{self.tp} cp{self.cp} ep{self.ep} etp{self.etp} dp{self.dp0} mbs{self.mbs} pp{self.pp} "
                f"vpp{self.vpp} rc={rec}")

    @property
    def stage_gpus(self) -> int:
        return self.tp * self.cp * self.dp0


@dataclass(frozen=True)
class SearchSpace:
    """Knobs a user (or a test) may narrow; defaults cover what Megatron offers that pays off."""

    runtime: str = "megatron"
    tp: tuple[int, ...] = (1, 2, 4, 8)
    cp: tuple[int, ...] = (1, 2, 4)
    ep: tuple[int, ...] | None = None  # None: powers of two dividing the experts
    etp: tuple[int, ...] | None = None  # None: 1 and TP
    mbs: tuple[int, ...] = (1, 2, 4)
    vpp: tuple[int, ...] = (1, 2)
    max_pp: int | None = None
    recompute: tuple[Recompute, ...] = field(default_factory=lambda: RECOMPUTE_LADDER)
    # flagscale: the per-stage recompute choices (a shorter ladder keeps the per-stage options few)
    stage_recompute: tuple[Recompute, ...] = field(default_factory=lambda: STAGE_RECOMPUTE_LADDER)
    min_seq_per_cp: int = 2048  # CP only pays off for long sequences

    def with_(self, **kw) -> "SearchSpace":
        from dataclasses import replace

        return replace(self, **kw)


# Recompute settings ordered from least to most recompute (the memory-pruning ladder).
RECOMPUTE_LADDER: tuple[Recompute, ...] = (
    Recompute.none(),
    Recompute.selective(("core_attn",)),
    Recompute.selective(("core_attn", "layernorm", "moe_act")),
    Recompute.full("block", 1),
    Recompute.full("block", 2),
    Recompute.full("block", 4),
    Recompute.full("uniform", 1),
)


STAGE_RECOMPUTE_LADDER: tuple[Recompute, ...] = (
    Recompute.none(),
    Recompute.selective(("core_attn", "layernorm", "moe_act")),
    Recompute.full("uniform", 1),
)


def recompute_ladder(model: ModelSpec, allowed: tuple[Recompute, ...]) -> list[Recompute]:
    """The recompute settings valid for this model (moe_act needs a MoE model with grouped GEMM)."""
    out = []
    for r in allowed:
        if "moe_act" in r.modules and r.granularity == "selective" and not (model.is_moe and model.moe_grouped_gemm):
            mods = tuple(m for m in r.modules if m != "moe_act")
            r = Recompute.selective(mods)
        if r not in out:
            out.append(r)
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_ok(model: ModelSpec, tp: int) -> bool:
    g = model.query_groups
    return model.num_attention_heads % tp == 0 and (g % tp == 0 or tp % g == 0)


def enumerate_globals(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, space: SearchSpace, gpus_per_node: dict[str, int]
) -> Iterator[GlobalChoice]:
    """Every global choice that passes the divisibility and runtime rules.  Yields in no
    particular order; the driver orders them by a lower bound."""
    gbs = training.global_batch_size
    n_by_type = cluster.gpus_by_type()
    total = sum(n_by_type.values())
    ladder = recompute_ladder(model, space.recompute)
    max_gpn = max(gpus_per_node.values())
    num_experts = model.num_experts or 1
    eps = space.ep or tuple(e for e in (1, 2, 4, 8, 16, 32, 64, 128, 256) if num_experts % e == 0)
    if not model.is_moe:
        eps = (1,)
    for tp in space.tp:
        if tp > max_gpn or not tp_ok(model, tp):
            continue
        for cp in space.cp:
            if cp > 1 and (model.seq_length % (2 * cp) or model.seq_length // cp < space.min_seq_per_cp):
                continue
            if space.runtime == "flagscale" and cp != 1:
                continue
            etps = space.etp or tuple(sorted({1, tp}))
            if not model.is_moe:
                etps = (tp,)
            for ep in eps:
                for etp in etps:
                    if model.is_moe and etp > 1 and model.add_bias_linear:
                        # Megatron: "Bias in Moe is only supported when ETP==1"; the launcher adds
                        # --disable-bias-linear, which changes the model: only allowed if already off.
                        continue
                    if etp * ep > total:
                        continue
                    if space.runtime == "flagscale":
                        # G fixes B = DP0 * mbs (samples per micro-batch); stage 0's DP is a
                        # per-stage choice.  Carried as mbs=B, dp0=1 (see StageTables.first_stage_ok).
                        max_b = (total // (tp * cp)) * max(space.mbs)
                        for b in range(1, max_b + 1):
                            if gbs % b or not any(b % d == 0 and b // d in space.mbs
                                                  for d in _divisors(total // (tp * cp))):
                                continue
                            max_pp = min(model.num_layers, total // (tp * cp), space.max_pp or 10**9)
                            for pp in range(1, max_pp + 1):
                                yield GlobalChoice("flagscale", tp, cp, ep, etp, b, pp, 1, 1, None)
                        continue
                    for mbs in space.mbs:
                        for dp0 in _divisors(total // (tp * cp)):
                            if gbs % (mbs * dp0):
                                continue
                            s = tp * cp * dp0
                            if space.runtime == "megatron" and s % (etp * ep):
                                continue  # (TP*CP*DP) % (ETP*EP) == 0
                            m = gbs // (mbs * dp0)
                            max_stages = sum(n // s for n in n_by_type.values()) if space.runtime == "megatron" \
                                else total // (tp * cp)
                            max_pp = min(model.num_layers, max_stages, space.max_pp or 10**9)
                            for pp in range(1, max_pp + 1):
                                for vpp in space.vpp:
                                    if vpp > 1 and (space.runtime == "flagscale" or pp == 1 or m % pp or m < pp
                                                    or model.num_layers < pp * vpp):
                                        continue
                                    if space.runtime == "megatron":
                                        for rc in ladder:
                                            yield GlobalChoice("megatron", tp, cp, ep, etp, mbs, pp, vpp, dp0, rc)
                                    else:
                                        yield GlobalChoice("flagscale", tp, cp, ep, etp, mbs, pp, 1, dp0, None)


def stage_options(
    g: GlobalChoice, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, space: SearchSpace,
    gpus_per_node: dict[str, int],
) -> list[StageOption]:
    """The options a stage may take under G."""
    n_by_type = cluster.gpus_by_type()
    out: list[StageOption] = []
    for h, n in n_by_type.items():
        if g.tp > gpus_per_node[h]:
            continue
        if g.runtime == "megatron":
            if g.stage_gpus <= n:
                out.append(StageOption(h, g.dp0, g.recompute))
            continue
        for dp in _divisors(n // (g.tp * g.cp)):
            if (g.dp0 * g.mbs) % dp or (g.dp0 * g.mbs) // dp not in space.mbs:
                continue  # FlagScale: (DP0*mbs) % DP_i == 0; a rank's micro-batch within the space
            if (g.tp * g.cp * dp) % (g.etp * g.ep):
                continue
            for rc in recompute_ladder(model, space.stage_recompute):
                out.append(StageOption(h, dp, rc))
    return out
