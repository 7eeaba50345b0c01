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

The DP over stages (`_StageDP`) works on numpy arrays of all states and labels of a stage at once,
in the order a plain loop would visit them, so ties are broken as that loop breaks them;
tests/helpers/hsdp_reference.py is that loop, and tests/test_hsdp_vectorised.py holds the two equal.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from planner.schemas.pipeline import stage_time_with_links
from solver_models.scaling import INF_US
from solver_models.tables import FIRST, LAST, MID, StageTables, position


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


# ---- the DP over stages, vectorised ----
#
# One DP call walks the stages in order.  Before stage i the states are the distinct
# (layers placed, GPUs used, time of the link in, current unit) with, per state, its labels: the
# Pareto set of (sum of stage times, max sync) (`pareto`), or the one label of least
# sum + v*sync.  A stage expands every (state, layer count n, next unit, label) into a candidate
# and keeps, per next state, the labels no other candidate beats.  The arrays reproduce the order
# a plain loop over states, n, next unit and labels would visit the candidates in (`seq`): among
# equal labels the first one visited is kept, next states are ordered by the first candidate that
# reached them, and the plan chosen among equal objectives is the first one visited.

_CANDIDATES_PER_CHUNK = 1 << 20  # most (state, n, next unit, label) candidates expanded at once (memory)
_PAIRS_PER_CHUNK = 1 << 22  # state pairs compared at once by the dominance test

# columns of a candidate row
_CODE, _SUM, _SYNC, _SEQ, _FIRST, _PARENT, _OPT, _START, _N, _ELL, _LINK, _UNIT, _USED = range(13)


@dataclass
class _Result:
    value_us: int  # sum + v * max sync of the plan
    sum_us: int
    sync_us: int
    stages: list[tuple[int, int, int]]  # (option, start, n)
    actual_us: int  # the plan's largest stage time


def _expand(start: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ragged ranges [start[k], start[k] + count[k]) laid end to end: (indices, k of each)."""
    k = np.repeat(np.arange(count.size), count)
    if k.size == 0:
        return k, k
    offset = np.cumsum(count) - count
    return start[k] + (np.arange(k.size) - offset[k]), k


def _encode(cols: list[np.ndarray], radices: list[int]) -> np.ndarray:
    """One int64 per row, equal exactly when every column is (mixed radix; rows ranked when the
    radices overflow int64)."""
    if math.prod(radices) < 2**62:
        code = np.zeros(cols[0].size, dtype=np.int64)
        for c, r in zip(cols, radices):
            code = code * r + c
        return code
    return np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _compact(code: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes as indices into a small array: (index per row, array size)."""
    lo = int(code.min())
    span = int(code.max()) - lo + 1
    if span <= 4 * code.size + 1024:
        return code - lo, span
    values, index = np.unique(code, return_inverse=True)
    return index.reshape(-1), values.size


def _below_earlier(values: np.ndarray, start: np.ndarray) -> np.ndarray:
    """For rows sorted into groups (`start` marks each group's first row): whether each value is
    below every earlier value of its group (true for a group's first row).  A running minimum
    over the values offset so that each group starts below every group before it."""
    if values.size == 0:
        return np.zeros(0, dtype=bool)
    group = np.cumsum(start) - 1
    lo, hi = int(values.min()), int(values.max())
    if (hi - lo + 1) * (int(group[-1]) + 2) >= 2**62:
        values = np.unique(values, return_inverse=True)[1].reshape(-1).astype(np.int64)
        lo, hi = 0, int(values.max())
    shifted = (values - lo) - group * (hi - lo + 1)
    run = np.minimum.accumulate(shifted)
    below = np.empty(values.size, dtype=bool)
    below[1:] = shifted[1:] < run[:-1]
    return below | start


def _first_per_group(sorted_code: np.ndarray) -> np.ndarray:
    start = np.empty(sorted_code.size, dtype=bool)
    start[:1] = True
    start[1:] = sorted_code[1:] != sorted_code[:-1]
    return start


class _StageDP:
    """The DP over stages for one tables object and pruning, reused for every cap."""

    def __init__(self, t: StageTables, windows: np.ndarray | None, pareto: bool):
        self.t, self.pareto = t, pareto
        self.contiguous = t.contiguous_types
        # Units the DP chooses between.  With memory pruning, the recompute variants of one (type, DP)
        # have disjoint fitting ranges (the least recompute that fits), so they collapse into one unit
        # and the layer count picks the variant: the DP sees a third of the options.
        if t.memory_prune:
            by_key: dict[tuple, list[int]] = {}
            for o, opt in enumerate(t.options):
                by_key.setdefault((opt.device_type, opt.dp), []).append(o)
            self.units = list(by_key.values())
        else:
            self.units = [[o] for o in range(t.num_options)]
        lead = [m[0] for m in self.units]
        self.unit_type = t.option_type[lead].astype(np.int64)
        self.unit_gpus = t.option_gpus[lead].astype(np.int64)
        self.budget = t.budget.astype(np.int64)
        # links as ids into link_pairs, rows (L, M, X) (tables.link); zeros is "no link".  A link depends on where the
        # boundary lands (the near prices when the two stages' ranks share a node), which follows from the GPUs
        # of the type used so far (in the state)
        self.positional = t.positional_links
        self.gpn = t.gpus_per_node.astype(np.int64) if self.positional else None
        ix = np.ix_(lead, lead)
        zeros = np.zeros((2,) + t.p2p_us.shape, dtype=np.int64)
        traffic = t.traffic_us if t.traffic_us is not None else zeros
        fill = t.fill_us if t.fill_us is not None else zeros
        pairs = np.stack([np.stack([t.p2p_us[ix], traffic[0][ix], fill[0][ix]], axis=-1),
                          np.stack([t.near_us[ix], traffic[1][ix], fill[1][ix]], axis=-1)])  # [far/near, U, U, 3]
        self.link_pairs, ids = np.unique(np.concatenate([pairs.reshape(-1, 3), [[0, 0, 0]]]), axis=0,
                                         return_inverse=True)
        ids = ids.reshape(-1)
        self.far_id, self.near_id = ids[:-1].reshape(pairs.shape[:3])
        self.no_link = int(ids[-1])
        self.fwd_us = t.fwd_us if t.fwd_us is not None else t.core_us  # F (without traffic: F = core, B = 0)
        self.first_ok = [u for u in range(len(lead)) if t.first_stage_ok(lead[u])]
        self.last_ok = np.array([t.last_stage_ok(o) for o in lead], dtype=bool)
        self.windows = windows[lead] if windows is not None else None
        lo, hi = t.fit_range()
        # memory: n must lie in a member's [lo, hi] (fits grow monotone with n; pruning makes the
        # members' ranges disjoint)
        self.unit_lo = np.stack([lo[m].min(axis=0) for m in self.units])  # [U, PP, N+1]
        self.unit_hi = np.stack([hi[m].max(axis=0) for m in self.units])
        self.min_layer = int(t.min_layer_us.min())
        self._members: dict[int, np.ndarray] = {}

    def members(self, i: int) -> np.ndarray:
        """[unit, start, n] -> the option stage i takes for n layers from `start` (the first member
        of the unit whose fitting range holds n), or -1."""
        hit = self._members.get(i)
        if hit is None:
            lo, hi = self.t.fit_range()
            n = np.arange(self.t.num_layers + 1)[None, :]
            hit = np.full((len(self.units), n.size, n.size), -1, dtype=np.int64)
            for u, members in enumerate(self.units):
                for o in reversed(members):  # the first member that fits wins
                    hit[u][(lo[o, i][:, None] <= n) & (n <= hi[o, i][:, None])] = o
            self._members[i] = hit
        return hit

    def used_radices(self) -> list[int]:
        if self.contiguous:
            return [1 << len(self.budget), int(self.budget.max()) + 1]
        return [int(b) + 1 for b in self.budget]

    def solve(self, cap: int, stats: DPStats, max_states: int, deadline: float, prune_above: float
              ) -> _Result | None:
        """Min over plans with every stage time <= cap of (sum + v*max sync), or None when nothing
        fits under the cap."""
        stats.dp_calls += 1
        t = self.t
        pp = t.pp
        # states: ell, used [S, K] (GPUs per type; with the contiguity rule (finished types mask,
        # GPUs of the current type's block)), link in, unit; labels by state: sum, sync, start, count
        init = []
        for u in self.first_ok:
            ty, gpus = self.unit_type[u], self.unit_gpus[u]
            if gpus > self.budget[ty] or (pp == 1 and not self.last_ok[u]):
                continue
            if self.contiguous:
                used = [0, gpus]
            else:
                used = [0] * len(self.budget)
                used[ty] = gpus
            init.append((u, used))
        S = len(init)
        width = 2 if self.contiguous else len(self.budget)
        st = {"ell": np.zeros(S, dtype=np.int64), "link": np.full(S, self.no_link, dtype=np.int64),
              "unit": np.array([u for u, _ in init], dtype=np.int64),
              "used": np.array([used for _, used in init], dtype=np.int64).reshape(S, width)}
        labels = {"sum": np.zeros(S, dtype=np.int64), "sync": np.zeros(S, dtype=np.int64),
                  "start": np.arange(S, dtype=np.int64), "count": np.ones(S, dtype=np.int64)}
        history: list[np.ndarray] = []  # per stage: the rows that made the labels of the next states
        for i in range(pp):
            stats.states += S
            if stats.states > max_states or time.perf_counter() > deadline:
                raise _Budget()
            if S == 0:
                return None
            if i == pp - 1:
                final = self._last_stage(i, cap, st, labels)
                if final is None:
                    return None
                return self._result(final, history)
            rows = self._expand_stage(i, cap, st, labels, prune_above)
            if rows is None:
                return None
            st, labels, rows = self._next_states(rows)
            history.append(rows)
            S = st["ell"].size
        return None

    def _cells(self, i: int, cap: int, st: dict, active: np.ndarray, min_out: np.ndarray, fanout: np.ndarray):
        """The (state, n) a stage may take, in visiting order, per chunk of states: (state, n,
        option, forward, backward, sync time), the stage's time being stage_time_with_links of them and its
        links (tables.stage_us).  n runs up from its least value and stops at the first n whose stage time
        with the least link out (`min_out` [S, 2]: the least L and the least M over the next units) exceeds
        the cap (stage time grows with n, and with L and M); n that fit no member are skipped.  A chunk holds at most _CANDIDATES_PER_CHUNK cells times `fanout` (the candidates
        each of a state's cells makes)."""
        t, pp, N = self.t, self.t.pp, self.t.num_layers
        last = i == pp - 1
        idx = np.flatnonzero(active)
        if idx.size == 0:
            return
        ell, unit = st["ell"][idx], st["unit"][idx]
        if last:
            n_lo = N - ell
            n_hi = n_lo.copy()
        else:
            n_lo = np.ones_like(ell)
            n_hi = N - ell - (pp - 1 - i)
        if self.windows is not None:
            n_lo = np.maximum(n_lo, self.windows[unit, 0])
            n_hi = np.minimum(n_hi, self.windows[unit, 1])
        n_lo = np.maximum(n_lo, self.unit_lo[unit, i, ell])
        n_hi = np.minimum(n_hi, self.unit_hi[unit, i, ell])
        lo_all, hi_all = int(n_lo.min()), int(n_hi.max())
        if hi_all < lo_all:
            return
        ns = np.arange(lo_all, hi_all + 1)
        width = ns.size
        pos = position(i, pp)
        core, sync, fwd = t.core_us[:, pos], t.sync_us[:, pos], self.fwd_us[:, pos]
        members = self.members(i)
        link_in = self.link_pairs[st["link"][idx]]
        weight = np.cumsum(width * np.maximum(fanout[idx], 1))
        a = 0
        while a < idx.size:
            z = max(a + 1, int(np.searchsorted(weight, (weight[a - 1] if a else 0) + _CANDIDATES_PER_CHUNK, "right")))
            e = ell[a:z, None]
            mem = members[unit[a:z, None], e, ns[None, :]]
            valid = (ns >= n_lo[a:z, None]) & (ns <= n_hi[a:z, None]) & (mem >= 0)
            c = core[np.where(valid, mem, 0), e, ns[None, :]]
            f = fwd[np.where(valid, mem, 0), e, ns[None, :]]
            least = stage_time_with_links(f, c - f, (link_in[a:z, 0, None], link_in[a:z, 1, None]),
                                          (min_out[idx[a:z], 0, None], min_out[idx[a:z], 1, None]))
            over = valid & ((c >= INF_US) | (least > cap))
            stop = np.where(over.any(axis=1), over.argmax(axis=1), width)
            r, k = np.nonzero(valid & (np.arange(width)[None, :] < stop[:, None]))
            o = mem[r, k]
            s = idx[a + r]
            n = ns[k]
            yield s, n, o, f[r, k], (c - f)[r, k], sync[o, st["ell"][s], n]
            a = z

    def _last_stage(self, i: int, cap: int, st: dict, labels: dict):
        """The best final label: (value, sum, sync, parent label, option, start, n), first visited
        among equals."""
        v = self.t.g.vpp
        best = None
        S = st["ell"].size
        for s, n, o, f, back, s_i in self._cells(i, cap, st, np.ones(S, dtype=bool),
                                                 np.zeros((S, 2), dtype=np.int64), labels["count"]):
            li, k = _expand(labels["start"][s], labels["count"][s])
            if li.size == 0:
                continue
            link_in = self.link_pairs[st["link"][s]]
            tt = stage_time_with_links(f, back, (link_in[:, 0], link_in[:, 1]), (0, 0))
            total = labels["sum"][li] + tt[k]
            sync = np.maximum(labels["sync"][li], s_i[k])
            value = total + v * sync
            j = int(np.argmin(value))
            if best is None or value[j] < best[0]:
                best = (int(value[j]), int(total[j]), int(sync[j]), int(li[j]), int(o[k[j]]), int(st["ell"][s[k[j]]]),
                        int(n[k[j]]))
        return best

    def _next_units(self, i: int, st: dict):
        """Per state and next unit: allowed (GPU budget, contiguity, last-stage rule), the link time
        and the GPUs used after it (used [S, U, K])."""
        ty = self.unit_type[None, :]
        gpus = self.unit_gpus[None, :]
        cap = self.budget[ty]
        used, unit = st["used"], st["unit"]
        if self.contiguous:
            mask, cnt = used[:, :1], used[:, 1:]
            cur = self.unit_type[unit][:, None]
            same = ty == cur
            ok = np.where(same, cnt + gpus <= cap, (((mask >> ty) & 1) == 0) & (gpus <= cap))
            new_used = np.stack([np.where(same, mask, mask | (1 << cur)), np.where(same, cnt + gpus, gpus)], axis=2)
        else:
            ok = used[:, self.unit_type] + gpus <= cap
            add = np.zeros((len(self.unit_type), len(self.budget)), dtype=np.int64)
            add[np.arange(len(self.unit_type)), self.unit_type] = self.unit_gpus
            new_used = used[:, None, :] + add[None, :, :]
        if i + 1 == self.t.pp - 1:
            ok = ok & self.last_ok[None, :]
        return ok, self._out_links(st), new_used

    def _out_links(self, st: dict) -> np.ndarray:
        """[S, U]: the link (an id into link_pairs) from each state's current stage to a next stage on each unit
        (tables.link)."""
        unit = st["unit"]
        far = self.far_id[unit]
        if not self.positional:
            return far
        ty = self.unit_type[unit]
        mine = self.unit_gpus[unit]
        offset = (st["used"][:, 1] if self.contiguous else st["used"][np.arange(unit.size), ty]) - mine
        gpn = self.gpn[ty][:, None]
        end = offset[:, None] + mine[:, None] + self.unit_gpus[None, :] - 1
        stays = (self.unit_type[None, :] == ty[:, None]) & (offset[:, None] // gpn == end // gpn)
        return np.where(stays, self.near_id[unit], far)

    def residues(self, used: np.ndarray, unit: np.ndarray) -> list[np.ndarray]:
        """With positional links, where each type's next stage would start inside a node (GPUs used mod GPUs
        per node; with the contiguity rule, of the current block's type only): states that differ there face
        different links, so neither dominates the other.  [] otherwise."""
        if not self.positional:
            return []
        if self.contiguous:
            return [used[:, 1] % self.gpn[self.unit_type[unit]]]
        return [used[:, k] % self.gpn[k] for k in range(used.shape[1])]

    def _expand_stage(self, i: int, cap: int, st: dict, labels: dict, prune_above: float) -> np.ndarray | None:
        """Every candidate (state, n, next unit, label) of stage i that fits the cap and may still
        beat `prune_above`, reduced to the labels each next state keeps (rows, columns _CODE...)."""
        N, v = self.t.num_layers, self.t.g.vpp
        ok, out_link, new_used = self._next_units(i, st)
        has_next = ok.any(axis=1)
        out_pair = self.link_pairs[out_link]  # [S, U, 3]
        min_out = np.where(has_next[:, None], np.where(ok[:, :, None], out_pair, INF_US).min(axis=1), 0)
        radices = [N + 1, *self.used_radices(), len(self.link_pairs), len(self.units)]
        parts, seq0 = [], 0
        fanout = ok.sum(axis=1) * labels["count"]
        for s, n, o, f, back, s_i in self._cells(i, cap, st, has_next, min_out, fanout):
            link_in = self.link_pairs[st["link"][s]]
            tt = stage_time_with_links(f[:, None], back[:, None], (link_in[:, 0, None], link_in[:, 1, None]),
                                       (out_pair[s, :, 0], out_pair[s, :, 1]))
            q, nxt = np.nonzero(ok[s] & (tt <= cap))
            li, k = _expand(labels["start"][s[q]], labels["count"][s[q]])
            if li.size == 0:
                continue
            q, nxt = q[k], nxt[k]
            total = labels["sum"][li] + tt[q, nxt] + v * out_pair[s[q], nxt, 2]  # the label sums the links' fill too
            sync = np.maximum(labels["sync"][li], s_i[q])
            seq = seq0 + np.arange(li.size)
            seq0 += li.size
            if math.isfinite(prune_above):  # cannot beat the best plan known
                rest_lb = (N - st["ell"][s[q]] - n[q]) * self.min_layer
                keep = np.flatnonzero(total + rest_lb + v * sync < prune_above)
                q, nxt, li, total, sync, seq = q[keep], nxt[keep], li[keep], total[keep], sync[keep], seq[keep]
            if q.size == 0:
                continue
            sq = s[q]
            code = _encode([st["ell"][sq] + n[q], *new_used[sq, nxt].T, out_link[sq, nxt], nxt], radices)
            kept, first = self._keep(code, total, sync, seq, seq)
            q, nxt, sq = q[kept], nxt[kept], sq[kept]
            rows = np.empty((kept.size, _USED + new_used.shape[2]), dtype=np.int64)
            rows[:, _CODE], rows[:, _SUM], rows[:, _SYNC] = code[kept], total[kept], sync[kept]
            rows[:, _SEQ], rows[:, _FIRST], rows[:, _PARENT] = seq[kept], first, li[kept]
            rows[:, _OPT], rows[:, _START], rows[:, _N] = o[q], st["ell"][sq], n[q]
            rows[:, _ELL] = st["ell"][sq] + n[q]
            rows[:, _LINK], rows[:, _UNIT], rows[:, _USED:] = out_link[sq, nxt], nxt, new_used[sq, nxt]
            parts.append(rows)
        if not parts:
            return None
        rows = parts[0]
        if len(parts) > 1:
            rows = np.concatenate(parts)
            kept, first = self._keep(rows[:, _CODE], rows[:, _SUM], rows[:, _SYNC], rows[:, _SEQ], rows[:, _FIRST])
            rows = rows[kept]
            rows[:, _FIRST] = first
        return rows if rows.size else None

    def _keep(self, code: np.ndarray, total: np.ndarray, sync: np.ndarray, seq: np.ndarray, first: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """The labels each next state (`code`) keeps, as indices: the Pareto set of (sum, sync), or
        the least sum + v*sync; among equal labels the first visited (least `seq`).  With each, the
        next state's first visit (least `first` of its labels, kept or not)."""
        key, n_keys = _compact(code)
        big = np.iinfo(np.int64).max

        def least(values: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
            out = np.full(n_keys, big, dtype=np.int64)
            if where is None:
                np.minimum.at(out, key, values)
            else:
                np.minimum.at(out, key[where], values[where])
            return out[key]

        def first_least(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """Mask of the label with the least a, then b, then seq of each key; and that b."""
            at_a = a == least(a)
            b_min = least(b, at_a)
            at_b = at_a & (b == b_min)
            return at_b & (seq == least(seq, at_b)), b_min

        first_of = least(first)
        if not self.pareto:
            kept = np.flatnonzero(first_least(total + self.t.g.vpp * sync, seq)[0])
            return kept, first_of[kept]
        # the least-sum and the least-sync labels stay; any other that stays has a smaller sync
        # than the first and a smaller sum than the second
        least_sum, sync_there = first_least(total, sync)
        least_sync, sum_there = first_least(sync, total)
        rest = np.flatnonzero(least_sum | least_sync | ((sync < sync_there) & (total < sum_there)))
        # among those, exactly: sorted by key, sum, sync and seq, a label stays when its sync is
        # below every earlier one's of its key
        rest = rest[np.lexsort((seq[rest], sync[rest], total[rest], key[rest]))]
        kept = np.sort(rest[_below_earlier(sync[rest], _first_per_group(key[rest]))])
        return kept, first_of[kept]

    def _next_states(self, rows: np.ndarray):
        """States and labels for the next stage, ordered as the DP visits them, with dominated
        states dropped; and the label rows in that order (for unwinding)."""
        rows = rows[np.lexsort((rows[:, _SEQ], rows[:, _FIRST]))]
        start = _first_per_group(rows[:, _FIRST])
        starts = np.flatnonzero(start)
        counts = np.diff(np.append(starts, rows.shape[0]))
        keep = self._undominated(rows, starts, counts)
        starts, counts = starts[keep], counts[keep]
        li, _ = _expand(starts, counts)
        rows = rows[li]
        heads = rows[np.cumsum(counts) - counts]
        st = {"ell": heads[:, _ELL], "link": heads[:, _LINK], "unit": heads[:, _UNIT], "used": heads[:, _USED:]}
        labels = {"sum": rows[:, _SUM], "sync": rows[:, _SYNC], "start": np.cumsum(counts) - counts, "count": counts}
        return st, labels, rows

    def _undominated(self, rows: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The states to keep, in the order the DP visits them next.  A state is dominated by one
        with the same (layers, link in, unit; with the contiguity rule also the finished types; with
        positional links also the `residues`) that has used no more GPUs of any type (of the current type)
        and whose labels cover its
        labels (each of its labels is no better in sum and sync than one of the other's): whatever
        the first can still do, the second can do at least as well.  States are grouped in order of
        first appearance and, within a group, taken by GPUs used (then visiting order); one is
        dropped when an earlier one of its group dominates it (dominance is transitive, so an
        earlier kept one then does too)."""
        heads = rows[starts]
        N = self.t.num_layers
        used = heads[:, _USED:]
        if self.contiguous:
            gcols, vec = [heads[:, _USED]], used[:, 1:]
            gradix = [1 << len(self.budget)]
        else:
            gcols, vec, gradix = [], used, []
        residues = self.residues(used, heads[:, _UNIT])
        gcols += residues
        gradix += [int(self.gpn.max()) if self.gpn is not None else 1] * len(residues)
        gcode = _encode([heads[:, _ELL], *gcols, heads[:, _LINK], heads[:, _UNIT]],
                        [N + 1, *gradix, len(self.link_pairs), len(self.units)])
        _, first, inverse = np.unique(gcode, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        S = starts.size
        if first.size == S:
            return np.arange(S)
        order = np.lexsort((np.arange(S), vec.sum(axis=1), first[inverse]))
        in_group = _first_per_group(inverse[order])
        gstart = np.flatnonzero(in_group)
        earlier = np.arange(S) - np.repeat(gstart, np.diff(np.append(gstart, S)))  # earlier states in group
        mins_sum = np.minimum.reduceat(rows[:, _SUM], starts)
        mins_sync = np.minimum.reduceat(rows[:, _SYNC], starts)
        # only an earlier state with no larger least sum and no larger least sync can dominate
        dropped = np.zeros(S, dtype=bool)  # by position in `order`
        p_all = np.flatnonzero(~(_below_earlier(mins_sum[order], in_group) | _below_earlier(mins_sync[order], in_group)))
        cum = np.cumsum(earlier[p_all])
        a = 0
        while a < p_all.size:
            b = int(np.searchsorted(cum, (cum[a] - earlier[p_all[a]]) + _PAIRS_PER_CHUNK, side="right"))
            b = max(b, a + 1)
            sel = p_all[a:b]
            earlier_pos, k = _expand(sel - earlier[sel], earlier[sel])
            later_pos = sel[k]
            a = b
            x, y = order[earlier_pos], order[later_pos]
            # cheap necessary conditions first, then label cover on the pairs left
            cand = (vec[x] <= vec[y]).all(axis=1) & (mins_sum[x] <= mins_sum[y]) & (mins_sync[x] <= mins_sync[y])
            x, y, ypos = x[cand], y[cand], later_pos[cand]
            if x.size == 0:
                continue
            lb, kb = _expand(starts[y], counts[y])  # each label of the later state
            la, ka = _expand(starts[x][kb], counts[x][kb])  # against each label of the earlier one
            beats = (rows[la, _SUM] <= rows[lb, _SUM][ka]) & (rows[la, _SYNC] <= rows[lb, _SYNC][ka])
            covered = np.bincount(ka, weights=beats.astype(float), minlength=lb.size) > 0
            uncovered = np.bincount(kb, weights=(~covered).astype(float), minlength=x.size)
            dropped[ypos[uncovered == 0]] = True
        return order[~dropped]

    def _result(self, final: tuple, history: list[np.ndarray]) -> _Result:
        value, total, sync, parent, o, s, n = final
        stages = [(o, s, n)]
        for rows in reversed(history):
            r = rows[parent]
            stages.append((int(r[_OPT]), int(r[_START]), int(r[_N])))
            parent = int(r[_PARENT])
        stages.reverse()
        return _Result(value, total, sync, stages, max(self.t.plan_stage_us(stages)))


def candidate_caps(t: StageTables) -> np.ndarray:
    """Every value a stage time can take (its cells with every link (L, M) its position can have, across
    nodes or inside one: tables.stage_us), sorted."""
    O = t.num_options
    traffic = t.traffic_us if t.traffic_us is not None else np.zeros((2, O, O), dtype=np.int64)
    floors = (t.p2p_us, t.near_us)
    vals = []
    for o in range(O):
        into = sorted({(int(floors[k][a, o]), int(traffic[k][a, o])) for k in (0, 1) for a in range(O)})
        out = sorted({(int(floors[k][o, b]), int(traffic[k][o, b])) for k in (0, 1) for b in range(O)})
        for pos in range(4):
            core = t.core_us[o, pos]
            finite = core < INF_US
            if not finite.any():
                continue
            ins = into if pos in (MID, LAST) else [(0, 0)]
            outs = out if pos in (MID, FIRST) else [(0, 0)]
            if t.traffic_us is None:
                cores = np.unique(core[finite])
                for l_in, _ in ins:
                    for l_out, _ in outs:
                        vals.append(cores + l_in + l_out)
                continue
            cells = np.unique(np.stack([t.fwd_us[o, pos][finite], core[finite]], axis=1), axis=0)
            f, back = cells[:, 0], cells[:, 1] - cells[:, 0]
            for link_in in ins:
                for link_out in outs:
                    vals.append(stage_time_with_links(f, back, link_in, link_out))
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
    dp = _StageDP(t, t.windows, pareto=exact_sync)
    stack: list[tuple[int, int, int]] = [(0, top, sum_lb)]
    while stack:
        lo, hi, g_lb = stack.pop()
        if lo > hi:
            continue
        if mv1 * int(caps[lo]) + g_lb >= best_obj:
            stats.caps_pruned += 1
            continue
        try:
            res = dp.solve(int(caps[hi]), stats, max_states=max_states, deadline=deadline,
                           prune_above=best_obj - mv1 * int(caps[lo]))
        except _Budget:
            stats.complete = False
            break
        if res is None:
            continue  # nothing with every stage <= caps[hi]: the whole interval is empty
        g_val, actual = res.value_us, res.actual_us
        obj = mv1 * actual + g_val
        if obj < best_obj:
            best_obj = obj
            best = DPSolution(objective_us=obj, max_us=actual, sum_us=res.sum_us, sync_us=res.sync_us,
                              stages=res.stages)
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
