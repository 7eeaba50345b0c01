"""Stages whose DP spans two device types that can share one job (README, "The search space").

On the megatron runtime a cluster with such a pair (planner/search/space.py `shared_pools`, e.g. H100 with
H200: one vendor, one software stack) is searched twice: with every stage on one device type, and with the
pair pooled (`pooled_view`: the pair's nodes as one group of the pooled type "H100+H200", which runs at the
slower member's speed, in the smaller memory, its inter-node link the slowest between members).  The time
limit is shared: the first search has at most half of it, the second what the first left; the result says
how it was split (a note, and `time_split`), and the progress reads as one search over both.  The answer is
the better of the two, priced by the cost model on the real cluster (a pooled stage type draws its GPUs from
its members); it is proven optimal only when both searches are, and the lower bound is the lesser of theirs.
"""

from __future__ import annotations

import time
from dataclasses import replace

from planner.cost.model import CostModel
from planner.errors import InfeasibleError, SearchTimeLimitError
from planner.search.driver import search
from planner.search.settings import ProgressEvent, ProgressFn, SearchResult, SearchSettings
from planner.search.space import SearchSpace, pooled_view, shared_pools


def search_with_pools(cost: CostModel, space: SearchSpace, settings: SearchSettings,
                      progress: ProgressFn | None = None) -> SearchResult:
    """`search`, and again over the pooled view of the cluster when it has pools (module docstring)."""
    pools = [] if space.runtime_spec.per_stage_meshes or not space.shared_types else shared_pools(
        cost.cluster, cost.profiles, cost.training.precision)
    if not pools:
        return search(cost, space, settings, progress=progress)
    start = time.perf_counter()
    end = settings.deadline if settings.deadline is not None else start + settings.time_limit_s
    first_settings = replace(settings, deadline=start + (end - start) / 2, time_limit_s=settings.time_limit_s / 2)
    results: list[SearchResult] = []
    failures: list[Exception] = []
    walls: list[float] = []
    both = _BothSearches(progress) if progress is not None else None
    for view_cost, view_settings in ((cost, first_settings), (None, None)):
        if view_cost is None:
            view_cost = cost.on_cluster(pooled_view(cost.cluster, cost.profiles, pools))
            view_settings = replace(settings, deadline=end, time_limit_s=max(0.1, end - time.perf_counter()))
            if both is not None:
                both.second()
        t = time.perf_counter()
        try:
            results.append(search(view_cost, space, view_settings, progress=both))
        except (InfeasibleError, SearchTimeLimitError) as exc:
            failures.append(exc)
        walls.append(time.perf_counter() - t)
    split = {"limit_s": end - start, "separate_types_s": walls[0], "pooled_s": walls[1], "pools": list(pools)}
    note = (f"the time limit ({end - start:.1f} s for the search) was split between two searches: at most half "
            f"for the cluster with every stage on one device type (it took {walls[0]:.1f} s), the rest for the "
            f"one with {', '.join(pools)} pooled (it took {walls[1]:.1f} s)")
    if not results:
        raise failures[-1]
    if len(results) == 1:
        results[0].notes.append(f"one of the two searches (separate types; {', '.join(pools)} pooled) found no "
                                f"plan: {failures[0]}")
        results[0].notes.append(note)
        return replace(results[0], time_split=split)
    out = _combined(cost, results[0], results[1], pools, settings.top_k, time.perf_counter() - start)
    out.notes.append(note)
    return replace(out, time_split=split)


class _BothSearches:
    """The progress of the two searches as one: configurations of both (the second's once it starts),
    the best plan of either (its objective and the plan), and a bound only once both have one (the lesser: a
    bound on the first search's space is none on the second's), never decreasing."""

    def __init__(self, progress: ProgressFn):
        self.progress = progress
        self.t0 = time.perf_counter()
        self.first: ProgressEvent | None = None  # the first search's last event, once the second runs
        self.last: ProgressEvent | None = None
        self.shown_bound_s: float | None = None

    def second(self) -> None:
        self.first, self.last = self.last, None

    def __call__(self, ev: ProgressEvent) -> None:
        self.last = ev
        elapsed = time.perf_counter() - self.t0
        if self.first is None:  # the first search: the second's space is not bounded yet
            self.progress(replace(ev, bound_s=None, elapsed_s=elapsed,
                                  phase=ev.phase if ev.phase != "done" else "searching"))
            return
        a = self.first
        bests = [(x.best_s, x.best_plan) for x in (a, ev) if x.best_s is not None]
        best_s, best_plan = min(bests, key=lambda b: b[0], default=(None, None))
        bound = None if a.bound_s is None or ev.bound_s is None else min(a.bound_s, ev.bound_s)
        if bound is not None:
            bound = self.shown_bound_s = max(bound, self.shown_bound_s or bound)
        self.progress(replace(ev, done=a.done + ev.done, total=a.total + ev.total, solved=a.solved + ev.solved,
                              elapsed_s=elapsed, best_s=best_s, best_plan=best_plan, bound_s=bound))


def _combined(cost: CostModel, apart: SearchResult, pooled: SearchResult, pools: list[str], top_k: int,
              wall_s: float) -> SearchResult:
    """The better plans of the two searches, priced on the real cluster; proven only if both are."""
    priced = [(cost.evaluate(c.plan), c, r) for r in (apart, pooled) for c in r.best]
    priced.sort(key=lambda t: t[0].iteration_time_s)
    best = priced[:top_k]
    runners_up = sorted([c for _, c, _ in priced[top_k:]] + apart.runners_up + pooled.runners_up,
                        key=lambda c: c.objective_s)
    winner = best[0][2]

    def least(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else min(a, b)

    note = (f"stages whose DP spans {', '.join(pools)} were searched too (the pair as one pool, at the slower "
            f"member's speed and memory): the best plan is {'pooled' if winner is pooled else 'on separate types'}")
    return replace(
        winner, best=[c for _, c, _ in best], costs=[p for p, _, _ in best],
        configs_total=apart.configs_total + pooled.configs_total,
        configs_solved=apart.configs_solved + pooled.configs_solved,
        configs_bounded=apart.configs_bounded + pooled.configs_bounded,
        configs_infeasible=apart.configs_infeasible + pooled.configs_infeasible,
        configs_pruned_memory=apart.configs_pruned_memory + pooled.configs_pruned_memory,
        configs_pruned_cp=apart.configs_pruned_cp + pooled.configs_pruned_cp,
        configs_unsearched=apart.configs_unsearched + pooled.configs_unsearched,
        space_counted=apart.space_counted and pooled.space_counted,
        lower_bound_s=least(apart.lower_bound_s, pooled.lower_bound_s),
        pruned_lower_bound_s=least(apart.pruned_lower_bound_s, pooled.pruned_lower_bound_s),
        certified_optimal=apart.certified_optimal and pooled.certified_optimal,
        pruned_space_optimal=apart.pruned_space_optimal and pooled.pruned_space_optimal,
        timed_out=apart.timed_out or pooled.timed_out, search_time_s=wall_s,
        quantisation_s=max(0.0, best[0][0].iteration_time_s - best[0][1].objective_s), runners_up=runners_up,
        notes=apart.notes + [n for n in pooled.notes if n not in apart.notes] + [note],
    )
