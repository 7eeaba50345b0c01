"""The search's vocabulary shared by the enumerator (planner/search) and the solvers
(solver_models): a global choice G and a stage option.  Plain frozen dataclasses, hashed millions of
times in the search's inner loops, so not pydantic.

megatron runtime: G = (TP, CP, EP, ETP, DP, micro-batch, PP, VPP, recompute) and a stage option is a
device type (with G's DP and recompute).  flagscale runtime: G = (TP, CP=1, EP, ETP, samples per
micro-batch B, PP, recompute mode) and a stage option is (device type, DP, recompute); stage i runs
micro-batches of B / DP_i samples per rank.

The degrees, and which type holds them where:
  ParallelConfig  (schemas/parallel.py) Megatron's flags as read for `estimate`: DP derived, layouts
  GlobalChoice    (here) one configuration the search tries; the key of its caches and records
  Shape           (search/space.py) the global choices that differ only in PP, VPP and recompute:
                  one GlobalChoice (`base`) and the (PP, VPP) pairs and recompute settings it spans
  GlobalShape     (cost/model.py) the plan-wide figures the cost model prices with (with GBS and
                  sequence parallelism); from a Plan (GlobalShape.of) or a GlobalChoice
                  (search/tables.TableBuilder.shape)
  Plan            (schemas/plan.py) the answer: global degrees and, per stage, device type, layers,
                  DP and recompute
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.runtime import runtime_of
from planner.schemas.plan import Recompute


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
    """One configuration of the global degrees.

    megatron: `dp0` is the DP of every stage, `mbs` the micro-batch per DP rank, `recompute` the
    global setting.  flagscale: `mbs` carries B = DP0 * mbs (samples per micro-batch, every stage
    alike) with `dp0` = 1; `recompute` is a selective setting every stage shares, or None when each
    stage picks none or full recompute on its own (FlagScale's per-stage lists); `first_dp` fixes
    stage 0's DP when the tied-embedding rule couples the first and last stage (None: free)."""

    runtime: str
    tp: int
    cp: int
    ep: int
    etp: int
    mbs: int
    pp: int
    vpp: int
    dp0: int
    recompute: Recompute | None
    first_dp: int | None = None

    def label(self) -> str:
        if self.per_stage_meshes:
            rec = self.recompute.label if self.recompute else "per-stage none/full"
            first = f" dp0={self.first_dp}" if self.first_dp else ""
            return (f"tp{self.tp} cp{self.cp} ep{self.ep} etp{self.etp} samples/micro-batch {self.mbs * self.dp0} "
                    f"pp{self.pp}{first} dp=per-stage rc={rec}")
        rec = self.recompute.label if self.recompute else "per-stage"
        return (f"tp{self.tp} cp{self.cp} ep{self.ep} etp{self.etp} dp{self.dp0} mbs{self.mbs} pp{self.pp} "
                f"vpp{self.vpp} rc={rec}")

    @property
    def per_stage_meshes(self) -> bool:
        """Each stage a process mesh of its own, with its own DP (the runtime's `per_stage_meshes`)."""
        return runtime_of(self.runtime).per_stage_meshes

    @property
    def per_stage_recompute(self) -> bool:
        """Each stage chooses its own recompute (the runtime's `per_stage_recompute`)."""
        return runtime_of(self.runtime).per_stage_recompute

    @property
    def stage_gpus(self) -> int:
        """GPUs of one stage under the megatron runtime (TP x CP x DP)."""
        return self.tp * self.cp * self.dp0

    @property
    def samples_per_microbatch(self) -> int:
        return self.mbs * self.dp0


def stage_min_layers(i: int, pp: int, vpp: int) -> int:
    """The least decoder layers the search puts on pipeline rank i of pp with vpp virtual chunks (the
    space's definition, not a Megatron rule: Megatron allows empty chunks): one per chunk, except that
    the first rank's first chunk may hold only the embedding and the last rank's last chunk only the
    loss (NVIDIA's `E|(t|)*94L`).  Without interleaving, one layer."""
    if vpp <= 1:
        return 1
    return vpp - (1 if pp > 1 and i in (0, pp - 1) else 0)
