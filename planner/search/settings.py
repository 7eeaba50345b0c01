"""The search's vocabulary, one home each: what it is asked (SearchSettings), what it tells while it
works (ProgressEvent), what it returns (SearchResult, of Candidates) and how its status reads
(status_word, status_reason).

What a result claims:
  - `status` OPTIMAL: certified over the whole space (no pruning, every configuration solved
    exactly or bounded out, within the time limit); FEASIBLE otherwise.
  - `pruned_space_status`: the same statement for the pruned space (what the prunings left).
  - `lower_bound_s`: a bound valid for the whole space, or None when it is not known; never above
    the optimum (the tables round down, so table bounds bound the evaluator's costs).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from planner.cost.model import PlanCost
from planner.schemas.plan import Plan
from planner.schemas.search import GlobalChoice, StageOption
from planner.search.pruning import Pruning
from solver_models.base import SolverSettings

OPTIMAL = "OPTIMAL"
FEASIBLE = "FEASIBLE"


@dataclass
class SearchSettings:
    backend: str = "cpsat"  # cpsat | hsdp | brute
    pruning: Pruning = field(default_factory=Pruning)  # Pruning.off(): the whole space
    time_limit_s: float = 60.0
    top_k: int = 1
    num_workers: int = 2
    warm_start: bool = True  # flagscale: start from the best uniform-DP plan (a fast megatron-space search)
    deadline: float | None = None  # time.perf_counter() value; search() sets it on its own copy
    seed_plans: tuple[Plan, ...] = ()  # plans to start from (the user's own): --backend cpsat prices them first

    def without_pruning(self) -> "SearchSettings":
        return replace(self, pruning=Pruning.off())

    def solver_settings(self) -> SolverSettings:
        """What a backend's solve of one configuration gets (solver_models/base.py)."""
        return SolverSettings(time_limit_s=self.time_limit_s, num_workers=self.num_workers, deadline=self.deadline)


@dataclass(frozen=True)
class ProgressEvent(Mapping):
    """What a progress callback gets: configurations done of the total (--backend hsdp: both grow
    while the memory pruning lets greater recompute settings in; --backend cpsat: those closed, settled
    one by one or in shapes whose bound reaches the best plan, the share of the bound-ordered space the
    search is done with), seconds since the start, the best plan's objective so far and a lower bound on
    the searched space's optimum (seconds, None before any; --backend cpsat: the greatest it has
    proven, so it never decreases), and that best plan (which an interrupted `solve` names).  Also readable
    as a mapping (the keys of as_dict), which is how the terminal's progress display (planner/progress.py)
    reads it."""

    done: int
    total: int
    solved: int
    elapsed_s: float
    best_s: float | None
    bound_s: float | None
    phase: str  # enumerating | screening | certifying | pricing | seeding | searching | stage | done
    config: str = ""
    best_plan: Plan | None = None  # the plan of best_s

    def as_dict(self) -> dict[str, Any]:
        return {"done": self.done, "tried": self.done, "total": self.total, "solved": self.solved,
                "elapsed_s": self.elapsed_s, "best_s": self.best_s, "bound_s": self.bound_s,
                "phase": self.phase, "config": "done" if self.phase == "done" else self.config,
                "best_plan": self.best_plan}

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())


ProgressFn = Callable[[ProgressEvent], None]


@dataclass
class ProgressClock:
    """When the next progress event is due: at most every `every_s` seconds, unless forced."""

    every_s: float = 0.2
    last: float = 0.0

    def due(self, force: bool = False) -> bool:
        now = time.perf_counter()
        if not force and now - self.last < self.every_s:
            return False
        self.last = now
        return True


@dataclass
class Candidate:
    """A plan the search found for one configuration G."""

    g: GlobalChoice
    objective_s: float  # from the integer tables (rounded down: at most the plan's float cost)
    plan: Plan
    backend: str
    status: str  # OPTIMAL | FEASIBLE (for this configuration's tables)
    bound_s: float  # lower bound on this G's optimum under its tables
    options: list[StageOption] = field(default_factory=list)
    stages: list = field(default_factory=list)  # solver's (option, start, n)


@dataclass
class SearchResult:
    best: list[Candidate]
    costs: list[PlanCost]  # float evaluator, same order as best
    configs_total: int
    configs_solved: int
    configs_bounded: int
    configs_infeasible: int
    configs_pruned_memory: int
    lower_bound_s: float | None  # valid for the whole space; None when not known
    certified_optimal: bool
    search_time_s: float
    backend: str
    notes: list[str] = field(default_factory=list)
    pruning: Pruning = field(default_factory=Pruning)
    pruned_space_optimal: bool = False
    pruned_lower_bound_s: float | None = None  # valid for the pruned space
    configs_pruned_cp: int = 0
    configs_unsearched: int = 0  # configurations a time limit left open: neither solved nor bounded out
    space_counted: bool = True  # False: the time limit stopped enumerating the space, which holds more than the total
    timed_out: bool = False
    quantisation_s: float = 0.0  # most the best plan's float cost exceeds its table objective
    cpsat: dict | None = None  # the CP-SAT master's statistics (--backend cpsat)
    runners_up: list[Candidate] = field(default_factory=list)  # other configurations' plans the search kept,
    # beyond `best`, in objective order (nothing proven about them): what `solve` proposes as trials
    # a second search over a pooled view of the cluster (planner/search/pools.py): how the time limit was split
    time_split: dict | None = None

    @property
    def status(self) -> str:
        """OPTIMAL (whole space, certified) | FEASIBLE."""
        return status_word(self.certified_optimal)

    @property
    def pruned_space_status(self) -> str:
        """OPTIMAL when the pruned space's optimum is proven | FEASIBLE."""
        return status_word(self.pruned_space_optimal)


def status_word(proven: bool) -> str:
    """The status of a search over a space: OPTIMAL when its optimum is proven, FEASIBLE otherwise."""
    return OPTIMAL if proven else FEASIBLE


def status_reason(*, certified: bool, pruning: Pruning, pruning_on: bool, pruned_proven: bool,
                  time_limit_hit: bool) -> tuple[str, str, str]:
    """(status, why, hint), read the same for every backend: OPTIMAL only when certified over the
    whole search space; otherwise FEASIBLE, why it is not certified, and what would certify it.

    `pruning_on`: whether the search was pruned; `pruned_proven`: whether the pruned space's
    optimum is proven; `time_limit_hit`: whether the time limit cut some of the work short."""
    if certified:
        return status_word(True), "certified over the whole search space under the cost model", ""
    reasons, hints = [], []
    if pruning_on:
        best = "optimum of the pruned space" if pruned_proven else "best plan of the pruned space"
        on = [f"load-balance delta {pruning.delta}"] if pruning.delta is not None else []
        on += ["memory pruning"] if pruning.memory else []
        on += [f"CP only with >= {pruning.cp_min_seq_tokens} tokens per rank"] if pruning.cp_min_seq_tokens else []
        reasons.append(f"{best} ({', '.join(on)})")
        hints.append("--no-prune searches the whole space and certifies the optimum")
    if time_limit_hit:
        reasons.append("the time limit ended the search")
        hints.append("raise --time-limit")
    return status_word(False), "; ".join(reasons) or "not certified optimal", "; ".join(hints)
