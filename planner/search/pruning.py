"""The search's prunings: every restriction the runtime's rules do not impose, each named and
switchable (`solve --no-prune` turns all of them off).

  load_balance  the paper's pruning 1: stage i holds between (1 - delta) and (1 + delta) times its
                share of the cluster's speed x N layers (solver_models/tables.balance_windows);
  memory        the paper's pruning 2, the least recompute that fits: on the megatron runtime a
                configuration's greater recompute settings are tried only when the lesser one has
                no layout that fits; on flagscale each stage takes the least recompute of its
                (device type, DP) that fits;
  cp_min_seq    context parallelism only with at least `cp_min_seq_tokens` tokens per CP rank (not when the
                run's --hierarchical-context-parallel-sizes fix CP).

How they are used (`restrict`):
  False (the default)  the search covers the whole space; the prunings only order the work (the
                       pruned space first, for a good plan early; --backend cpsat: a configuration
                       with no plan yet is first solved under the load-balance window) and are what
                       a search cut short by the time limit has covered best.  A complete search
                       certifies the optimum of the whole space.
  True (`solve --prune`)  the search covers only the pruned space: faster, and its best plan is the
                       pruned space's; it never claims the whole space's optimum.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.schemas.model import ModelSpec
from planner.schemas.search import GlobalChoice


@dataclass(frozen=True)
class Pruning:
    """Which prunings are on, and whether they restrict the space.  `Pruning.off()` is the whole
    space with no pruning at all."""

    delta: float | None = 0.2  # load balance tolerance; None: off
    memory: bool = True
    cp_min_seq_tokens: int | None = 2048  # None: off
    restrict: bool = False  # True: search only the pruned space; False: the prunings order the work

    @classmethod
    def off(cls) -> "Pruning":
        return cls(delta=None, memory=False, cp_min_seq_tokens=None)

    @property
    def any(self) -> bool:
        """Whether any pruning is switched on."""
        return self.delta is not None or self.memory or self.cp_min_seq_tokens is not None

    @property
    def restricts(self) -> bool:
        """Whether the prunings restrict the searched space (some on, and `restrict`)."""
        return self.restrict and self.any

    def restricting(self) -> "Pruning":
        """These prunings, restricting the space."""
        return replace(self, restrict=True)

    def cp_pruned(self, model: ModelSpec, g: GlobalChoice) -> bool:
        """cp_min_seq: whether G's CP leaves fewer tokens per CP rank than the pruning wants."""
        return (self.cp_min_seq_tokens is not None and g.cp > 1
                and model.seq_length // g.cp < self.cp_min_seq_tokens)

    def to_json(self) -> dict:
        return {"load_balance_delta": self.delta, "memory": self.memory,
                "cp_min_seq_tokens": self.cp_min_seq_tokens, "restrict": self.restrict}
