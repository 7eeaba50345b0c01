"""HS-DP: the paper's heterogeneity-sensitive dynamic program (section 3.4), exact when pruning is off.

For one global choice G (fixed PP, micro-batches m, virtual chunks v) it minimises
    v * T = sum_i t_i + (m*v - 1) * max_i t_i + v * max_i sync_i
over the stage sequence (option o_i, layer count n_i), with GPUs per device type as a budget and
every stage fitting in memory.

Bottleneck search (Alpa's stage construction, bounded): for a cap c on max_i t_i, a DP over stages
with state (layers placed, GPUs used per type, time of the link in, current option) keeps, per state,
the Pareto set of (sum of t_i, max sync_i).  G(c) = min over plans with every t_i <= c of
sum + v*sync is non-increasing in c, and a DP solution whose actual bottleneck is a <= c settles
every cap in [a, c].  Caps are explored by interval bisection with the lower bound
(m*v-1)*c_lo + G(c_hi); the candidate caps are every value a stage time can take, so the search is
exact.

Pruning is table data (solver_models/tables.py: `windows` for load balance, `memory_prune` for the
least recompute that fits); with either on, each DP state keeps one label instead of the Pareto set.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from solver_models.scaling import INF_US
from solver_models.tables import StageTables, position


@dataclass
class DPSolution:
    objective_us: int  # v x iteration time, integer us
    max_us: int
    sum_us: int
    sync_us: int
    stages: list[tuple[int, int, int]]  # (option, start, n)


@dataclass
class DPStats:
    dp_calls: int = 0
    states: int = 0
    caps_pruned: int = 0
    complete: bool = True  # False when a state or time budget cut the search short


class _Budget(Exception):
    """Raised inside the DP when the state or time budget is spent."""


@dataclass
class _Label:
    sum_us: int
    sync_us: int
    parent: object = field(default=None, repr=False)  # (_Label of previous stage) or None
    stage: tuple[int, int, int] | None = None  # (option, start, n) of the stage this label added


def _dp(t: StageTables, cap: int, windows: np.ndarray | None, stats: DPStats, max_states: int = 10**9,
        deadline: float = math.inf, prune_above: float = math.inf, pareto: bool = True
        ) -> tuple[int, _Label, int] | None:
    """Min over plans with every stage time <= cap of (sum + v*max sync); returns
    (value, final label, actual max stage time) or None when nothing fits under the cap."""
    stats.dp_calls += 1
    pp, N, O = t.pp, t.num_layers, t.num_options
    v = t.g.vpp
    n_types = len(t.types)
    core, sync, p2p_o, fit_lo, fit_hi = t.as_lists()
    min_layer = int(t.min_layer_us.min())
    # Units the DP chooses between.  With memory pruning, the recompute variants of one (type, DP)
    # have disjoint fitting ranges (the least recompute that fits), so they collapse into one unit
    # and the layer count picks the variant: the DP sees a third of the options.
    if t.memory_prune:
        by_key: dict[tuple, list[int]] = {}
        for o, opt in enumerate(t.options):
            by_key.setdefault((opt.device_type, opt.dp), []).append(o)
        units = list(by_key.values())
    else:
        units = [[o] for o in range(O)]
    U = len(units)
    lead = [m[0] for m in units]
    option_type = [int(t.option_type[m]) for m in lead]
    option_gpus = [int(t.option_gpus[m]) for m in lead]
    budget = t.budget.tolist()
    p2p = [[p2p_o[a][b] for b in lead] for a in lead]
    first_ok = [u for u in range(U) if t.first_stage_ok(lead[u])]
    last_ok = [t.last_stage_ok(lead[u]) for u in range(U)]
    if windows is not None:
        windows = windows[lead]
    # state: (layers placed, GPUs used, time of the link in, current unit) -> Pareto labels.
    # `used` is the GPUs used per type; with the contiguity rule it is instead
    # (bitmask of finished types, GPUs used by the current type's block)
    contiguous = t.contiguous_types
    states: dict[tuple, list[_Label]] = {}
    for o in first_ok:
        ty = option_type[o]
        if option_gpus[o] > budget[ty] or (pp == 1 and not last_ok[o]):
            continue
        if contiguous:
            used: tuple = (0, option_gpus[o])
        else:
            u = [0] * n_types
            u[ty] = option_gpus[o]
            used = tuple(u)
        states[(0, used, 0, o)] = [_Label(0, 0)]
    finals: list[_Label] = []
    next_cache: dict = {}
    for i in range(pp):
        pos = position(i, pp)
        last = i == pp - 1
        nxt: dict[tuple, list[_Label]] = {}
        stats.states += len(states)
        if stats.states > max_states or time.perf_counter() > deadline:
            raise _Budget()
        # the previous option matters only through the link into the current stage, so states
        # carry that link's time instead of the option (merging equivalent predecessors)
        for (ell, used, in_link, oc), labels in states.items():
            remaining_stages = pp - 1 - i
            n_lo, n_hi = 1, N - ell - remaining_stages
            if last:
                n_lo = n_hi = N - ell
            if windows is not None:
                n_lo, n_hi = max(n_lo, windows[oc, 0]), min(n_hi, windows[oc, 1])
            members = units[oc]
            # memory: n must lie in a member's [fit_lo, fit_hi] (fits grow monotone with n;
            # pruning makes the members' ranges disjoint)
            n_lo = max(n_lo, min(fit_lo[o][i][ell] for o in members))
            n_hi = min(n_hi, max(fit_hi[o][i][ell] for o in members))
            if last:
                next_opts, min_out = [], 0
            else:
                nk = (oc, used)
                hit = next_cache.get(nk)
                if hit is None:
                    hit = next_cache[nk] = _next_options(oc, used, U, option_type, option_gpus, budget, p2p,
                                                         contiguous)
                next_opts, min_out = hit
                if i + 1 == pp - 1:
                    next_opts = [x for x in next_opts if last_ok[x[0]]]
                    min_out = min((x[1] for x in next_opts), default=0)
                if not next_opts:
                    continue
            for n in range(n_lo, n_hi + 1):
                o = members[0]
                if len(members) > 1:
                    for o in members:
                        if fit_lo[o][i][ell] <= n <= fit_hi[o][i][ell]:
                            break
                    else:
                        continue
                elif not fit_lo[o][i][ell] <= n:
                    continue
                c = core[o][pos][ell][n]
                if c >= INF_US or c + in_link + min_out > cap:
                    break  # stage time grows with n
                s_i = sync[o][pos][ell][n]
                if last:
                    tt = c + in_link
                    for lab in labels:
                        finals.append(_Label(lab.sum_us + tt, max(lab.sync_us, s_i), lab, (o, ell, n)))
                    continue
                rest_lb = (N - ell - n) * min_layer
                for on, out_link, u in next_opts:
                    tt = c + in_link + out_link
                    if tt > cap:
                        continue
                    key = (ell + n, u, out_link, on)
                    bucket = None
                    for lab in labels:
                        new_sum = lab.sum_us + tt
                        new_sync = max(lab.sync_us, s_i)
                        if new_sum + rest_lb + v * new_sync >= prune_above:
                            continue  # cannot beat the best plan known
                        if bucket is None:
                            bucket = nxt.setdefault(key, [])
                        if pareto:
                            _add_pareto(bucket, _Label(new_sum, new_sync, lab, (o, ell, n)))
                        elif not bucket or new_sum + v * new_sync < bucket[0].sum_us + v * bucket[0].sync_us:
                            bucket[:] = [_Label(new_sum, new_sync, lab, (o, ell, n))]
        if last:
            break
        nxt = _drop_dominated_states(nxt, contiguous)
        states = nxt
        if not states:
            return None
    if not finals:
        return None
    best = min(finals, key=lambda L: L.sum_us + v * L.sync_us)
    # actual bottleneck of the chosen plan
    stages = _unwind(best)
    actual = max(t.stage_us(stages[k - 1][0] if k else None, o, stages[k + 1][0] if k + 1 < len(stages) else None,
                            k, s, n) for k, (o, s, n) in enumerate(stages))
    return best.sum_us + v * best.sync_us, best, actual


def _drop_dominated_states(states: dict, contiguous: bool) -> dict:
    """A state is dominated by one with the same (layers, link in, unit; with the contiguity rule
    also the finished types) that has used no more GPUs of any type (of the current type) and
    whose labels cover its labels (each of its labels is no better in sum and sync than one of
    the other's): whatever the first can still do, the second can do at least as well."""
    groups: dict[tuple, list] = {}
    for key, labels in states.items():
        ell, used, in_link, unit = key
        if contiguous:
            gkey, vec = (ell, used[0], in_link, unit), (used[1],)
        else:
            gkey, vec = (ell, in_link, unit), used
        groups.setdefault(gkey, []).append((sum(vec), vec, key, labels))
    out = {}
    for items in groups.values():
        if len(items) == 1:
            out[items[0][2]] = items[0][3]
            continue
        items.sort(key=lambda x: x[0])
        kept: list = []
        for _, vec, key, labels in items:
            if any(all(a <= b for a, b in zip(kvec, vec)) and _covers(klabels, labels) for kvec, klabels in kept):
                continue
            kept.append((vec, labels))
            out[key] = labels
    return out


def _covers(ours: list[_Label], theirs: list[_Label]) -> bool:
    return all(any(a.sum_us <= b.sum_us and a.sync_us <= b.sync_us for a in ours) for b in theirs)


def _next_options(oc: int, used: tuple, O: int, option_type, option_gpus, budget, p2p, contiguous: bool):
    """Options the next stage may take after option `oc` with GPUs `used` (budget and contiguity),
    as (option, link time oc -> option, new used), and the least link time."""
    out = []
    cur_ty = option_type[oc]
    for on in range(O):
        ty = option_type[on]
        if contiguous:
            mask, cur_used = used
            if ty == cur_ty:
                if cur_used + option_gpus[on] > budget[ty]:
                    continue
                u = (mask, cur_used + option_gpus[on])
            else:
                if (mask >> ty) & 1 or option_gpus[on] > budget[ty]:
                    continue
                u = (mask | (1 << cur_ty), option_gpus[on])
        else:
            if used[ty] + option_gpus[on] > budget[ty]:
                continue
            lst = list(used)
            lst[ty] += option_gpus[on]
            u = tuple(lst)
        out.append((on, p2p[oc][on], u))
    return out, min((x[1] for x in out), default=0)


def has_fitting_layout(t: StageTables) -> bool:
    """Whether any layout fits at all, time aside: layers split over the PP stages with every stage
    in memory, GPUs per type within budget and the contiguity rule.  A reachability DP over stages
    whose state after each stage is the GPU use, holding the set of layer counts placed so far as
    a bitmask.  With the contiguity rule the GPU use is (finished types, current type, GPUs of the
    current type); without it, the GPUs used per type.  The memory-pruning rule asks this of a
    lesser recompute."""
    pp, N, O = t.pp, t.num_layers, t.num_options
    lo, hi = t.fit_range()
    lo, hi = lo.tolist(), hi.tolist()
    option_type = t.option_type.tolist()
    option_gpus = t.option_gpus.tolist()
    budget = t.budget.tolist()
    contiguous = t.contiguous_types
    reach_cache: dict = {}

    def reach(o: int, i: int) -> list[int]:
        """[ell] -> bitmask of the layers placed after stage i on option o starting at ell (the
        last stage takes the rest; every later stage keeps at least one layer)."""
        key = (o, i)
        hit = reach_cache.get(key)
        if hit is None:
            hit = []
            for ell in range(N + 1):
                a, b = lo[o][i][ell], hi[o][i][ell]
                if i == pp - 1:
                    a, b = max(a, N - ell), min(b, N - ell)
                else:
                    b = min(b, N - ell - (pp - 1 - i))
                hit.append(((1 << (b - a + 1)) - 1) << (ell + a) if b >= a else 0)
            reach_cache[key] = hit
        return hit

    def advance(use: tuple, o: int):
        """GPU use after a stage on option o, or None when the budget or the contiguity rule forbids it."""
        ty, gpus = option_type[o], option_gpus[o]
        if contiguous:
            mask, cur, count = use
            if ty == cur:
                new = (mask, cur, count + gpus)
            elif (mask >> ty) & 1:
                return None
            else:
                new = (mask | (1 << cur) if cur >= 0 else mask, ty, gpus)
            return new if new[2] <= budget[ty] else None
        if use[ty] + gpus > budget[ty]:
            return None
        return use[:ty] + (use[ty] + gpus,) + use[ty + 1:]

    start = (0, -1, 0) if contiguous else tuple(0 for _ in budget)
    states: dict = {start: 1}  # use -> bitmask of layers placed (bit 0: none yet)
    for i in range(pp):
        nxt: dict = {}
        for use, placed in states.items():
            for o in range(O):
                if (i == 0 and not t.first_stage_ok(o)) or (i == pp - 1 and not t.last_stage_ok(o)):
                    continue
                new_use = advance(use, o)
                if new_use is None:
                    continue
                table = reach(o, i)
                out, bits = 0, placed
                while bits:
                    low = bits & -bits
                    out |= table[low.bit_length() - 1]
                    bits ^= low
                if not out:
                    continue
                if i == pp - 1:
                    if (out >> N) & 1:
                        return True
                    continue
                nxt[new_use] = nxt.get(new_use, 0) | out
        if not nxt:
            return False
        states = nxt
    return False


def _add_pareto(bucket: list[_Label], lab: _Label) -> None:
    for other in bucket:
        if other.sum_us <= lab.sum_us and other.sync_us <= lab.sync_us:
            return
    bucket[:] = [o for o in bucket if not (lab.sum_us <= o.sum_us and lab.sync_us <= o.sync_us)]
    bucket.append(lab)


def _unwind(lab: _Label) -> list[tuple[int, int, int]]:
    out = []
    while lab is not None and lab.stage is not None:
        out.append(lab.stage)
        lab = lab.parent
    return out[::-1]


def candidate_caps(t: StageTables) -> np.ndarray:
    """Every value a stage time can take (core + the p2p links its position can have), sorted."""
    O = t.num_options
    vals = []
    for o in range(O):
        for pos in range(4):
            core = t.core_us[o, pos]
            finite = np.unique(core[core < INF_US])
            if finite.size == 0:
                continue
            if pos == 3:
                offsets = {0}
            elif pos == 1:
                offsets = {int(t.p2p_us[o, b]) for b in range(O)}
            elif pos == 2:
                offsets = {int(t.p2p_us[a, o]) for a in range(O)}
            else:
                offsets = {int(t.p2p_us[a, o] + t.p2p_us[o, b]) for a in range(O) for b in range(O)}
            for off in offsets:
                vals.append(finite + off)
    if not vals:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.concatenate(vals))


def solve_hsdp(
    t: StageTables, *, upper_bound_us: int | None = None,
    stats: DPStats | None = None, max_states: int = 2_000_000, deadline: float = math.inf,
    exact_sync: bool | None = None,
) -> DPSolution | None:
    """Best plan for G under the tables, their prunings included (None if nothing fits, or
    nothing beats upper_bound_us).

    If `max_states` DP states or the `deadline` (time.perf_counter() value) is reached, the best
    plan found so far is returned and `stats.complete` is False: the result is then not proven."""
    stats = stats if stats is not None else DPStats()
    if exact_sync is None:
        # Pareto labels (sum, max sync) make the DP exact; with pruning on, one label per state
        # (least sum + v*sync) is kept instead: much faster, and exact whenever sync ties do not
        # decide the plan
        exact_sync = t.exact
    windows = t.windows
    caps = candidate_caps(t)
    if caps.size == 0:
        return None
    mv1 = t.num_microbatches * t.g.vpp - 1
    n_layers = t.num_layers
    sum_lb = int(n_layers * int(t.min_layer_us.min()))
    best_obj = upper_bound_us if upper_bound_us is not None else math.inf
    best: DPSolution | None = None
    # intervals of cap indices with a known lower bound on G over them
    top = caps.size - 1
    if math.isfinite(best_obj) and mv1 > 0:
        # a plan that beats the bound has max t_i < (bound - sum lower bound) / (m*v - 1)
        limit = (best_obj - sum_lb) / mv1
        top = int(np.searchsorted(caps, limit, side="left")) - 1
    stack: list[tuple[int, int, int]] = [(0, top, sum_lb)]
    while stack:
        lo, hi, g_lb = stack.pop()
        if lo > hi:
            continue
        if mv1 * int(caps[lo]) + g_lb >= best_obj:
            stats.caps_pruned += 1
            continue
        try:
            res = _dp(t, int(caps[hi]), windows, stats, max_states=max_states, deadline=deadline,
                      prune_above=best_obj - mv1 * int(caps[lo]), pareto=exact_sync)
        except _Budget:
            stats.complete = False
            break
        if res is None:
            continue  # nothing with every stage <= caps[hi]: the whole interval is empty
        g_val, lab, actual = res
        obj = mv1 * actual + g_val
        if obj < best_obj:
            best_obj = obj
            stages = _unwind(lab)
            best = DPSolution(objective_us=obj, max_us=actual, sum_us=lab.sum_us, sync_us=lab.sync_us,
                              stages=stages)
        a_idx = int(np.searchsorted(caps, actual, side="left"))
        new_hi = a_idx - 1
        if new_hi < lo:
            continue
        if new_hi - lo > 8:
            mid = (lo + new_hi) // 2
            stack.append((mid + 1, new_hi, g_val))  # processed after the lower half
            stack.append((lo, mid, g_val))
        else:
            stack.append((lo, new_hi, g_val))
    return best
