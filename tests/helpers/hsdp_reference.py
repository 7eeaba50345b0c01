"""The HS-DP stage DP as a plain loop: the reference solver_models/hsdp.py's vectorised `_StageDP`
must equal exactly (same value, same plan among equal ones, same state counts).

It visits states in order, then layer counts n upwards (stopping at the first n over the cap),
then next units, then labels; keeps per next state the Pareto set of (sum, max sync) (or the one
label of least sum + v*sync), the first visited among equal labels; and drops a state when an
earlier one of its group (same layers, link in, unit, finished types) with no more GPUs has labels
covering its labels (with positional links, also where each type's next stage would start inside a
node).  Slow (a Python loop per label) but obviously what the docstring says."""

from __future__ import annotations

import time

from planner.schemas.pipeline import stage_time_with_links
from solver_models.hsdp import DPStats, _Budget, _Result, _StageDP
from solver_models.scaling import INF_US
from solver_models.tables import position


class ReferenceStageDP(_StageDP):
    """Same set-up (units, fitting ranges, links) as _StageDP; `solve` is the plain loop."""

    def solve(self, cap: int, stats: DPStats, max_states: int, deadline: float, prune_above: float
              ) -> _Result | None:
        stats.dp_calls += 1
        t = self.t
        pp, N, v = t.pp, t.num_layers, t.g.vpp
        core, sync, fwd = t.core_us.tolist(), t.sync_us.tolist(), self.fwd_us.tolist()
        units = self.units
        types, gpus, budget = self.unit_type.tolist(), self.unit_gpus.tolist(), self.budget.tolist()
        last_ok = self.last_ok.tolist()
        lo, hi = t.fit_range()
        lo, hi = lo.tolist(), hi.tolist()
        # a label: (sum, sync, parent label, (option, start, n))
        states: dict[tuple, list[tuple]] = {}
        for u in self.first_ok:
            if gpus[u] > budget[types[u]] or (pp == 1 and not last_ok[u]):
                continue
            used = [0] * len(budget)
            used[types[u]] = gpus[u]
            states[(0, (0, gpus[u]) if self.contiguous else tuple(used), (0, 0, 0), u)] = [(0, 0, None, None)]
        finals = []
        for i in range(pp):
            pos, last = position(i, pp), i == pp - 1
            stats.states += len(states)
            if stats.states > max_states or time.perf_counter() > deadline:
                raise _Budget()
            nxt: dict[tuple, list[tuple]] = {}
            for (ell, used, link, unit), labels in states.items():
                n_lo, n_hi = (N - ell, N - ell) if last else (1, N - ell - (pp - 1 - i))
                if self.windows is not None:
                    n_lo, n_hi = max(n_lo, self.windows[unit, 0]), min(n_hi, self.windows[unit, 1])
                n_lo = max(n_lo, min(lo[o][i][ell] for o in units[unit]))
                n_hi = min(n_hi, max(hi[o][i][ell] for o in units[unit]))
                nexts = [] if last else self._nexts(unit, used, types, gpus, budget, last_ok, i)
                if not last and not nexts:
                    continue
                min_l, min_m = (min((x[1][k] for x in nexts), default=0) for k in (0, 1))
                for n in range(n_lo, n_hi + 1):
                    fitting = [o for o in units[unit] if lo[o][i][ell] <= n <= hi[o][i][ell]]
                    if not fitting:
                        continue
                    o = fitting[0]
                    c, f = core[o][pos][ell][n], fwd[o][pos][ell][n]
                    if c >= INF_US or stage_time_with_links(f, c - f, link[:2], (min_l, min_m)) > cap:
                        break  # stage time grows with n
                    s_i = sync[o][pos][ell][n]
                    for on, out_link, new_used in nexts or [(None, (0, 0, 0), None)]:
                        tt = int(stage_time_with_links(f, c - f, link[:2], out_link[:2]))
                        if tt > cap:
                            continue
                        for lab in labels:
                            new = (lab[0] + tt + v * out_link[2], max(lab[1], s_i), lab, (o, ell, n))
                            if last:
                                finals.append(new)
                                continue
                            if new[0] + (N - ell - n) * self.min_layer + v * new[1] >= prune_above:
                                continue  # cannot beat the best plan known
                            self._add(nxt.setdefault((ell + n, new_used, out_link, on), []), new, v)
            if last:
                break
            states = self._undominated_states(nxt)
            if not states:
                return None
        if not finals:
            return None
        best = min(finals, key=lambda lab: lab[0] + v * lab[1])
        stages, lab = [], best
        while lab is not None and lab[3] is not None:
            stages.append(lab[3])
            lab = lab[2]
        stages.reverse()
        actual = max(t.plan_stage_us(stages))
        return _Result(best[0] + v * best[1], best[0], best[1], stages, actual)

    def _nexts(self, unit, used, types, gpus, budget, last_ok, i):
        out = []
        for on in range(len(types)):
            ty = types[on]
            if self.contiguous:
                mask, count = used
                if ty == types[unit]:
                    new = (mask, count + gpus[on])
                elif (mask >> ty) & 1:
                    continue
                else:
                    new = (mask | (1 << types[unit]), gpus[on])
                if new[1] > budget[ty]:
                    continue
            else:
                if used[ty] + gpus[on] > budget[ty]:
                    continue
                new = used[:ty] + (used[ty] + gpus[on],) + used[ty + 1:]
            if i + 1 == self.t.pp - 1 and not last_ok[on]:
                continue
            out.append((on, self._link(unit, on, used, types, gpus), new))
        return out

    def _link(self, unit, on, used, types, gpus):
        """The link (L, M, X) to the next stage: the near prices when both stages' ranks share a node."""
        stays = False
        if self.positional and types[on] == types[unit]:
            gpn = int(self.gpn[types[unit]])
            offset = (used[1] if self.contiguous else used[types[unit]]) - gpus[unit]
            stays = offset // gpn == (offset + gpus[unit] + gpus[on] - 1) // gpn
        return tuple(int(x) for x in self.link_pairs[(self.near_id if stays else self.far_id)[unit][on]])

    def _add(self, bucket: list, new: tuple, v: int) -> None:
        if not self.pareto:
            if not bucket or new[0] + v * new[1] < bucket[0][0] + v * bucket[0][1]:
                bucket[:] = [new]
            return
        if any(b[0] <= new[0] and b[1] <= new[1] for b in bucket):
            return
        bucket[:] = [b for b in bucket if not (new[0] <= b[0] and new[1] <= b[1])] + [new]

    def _undominated_states(self, states: dict) -> dict:
        groups: dict[tuple, list] = {}
        for key, labels in states.items():
            ell, used, link, unit = key
            gkey, vec = ((ell, used[0], link, unit), used[1:]) if self.contiguous else ((ell, link, unit), used)
            if self.positional:  # states whose next stages would start elsewhere in a node face other links
                types = self.unit_type.tolist()
                gkey += ((used[1] % int(self.gpn[types[unit]]),) if self.contiguous
                         else tuple(u % int(g) for u, g in zip(used, self.gpn)))
            groups.setdefault(gkey, []).append((vec, key, labels))
        out = {}
        for items in groups.values():
            items.sort(key=lambda x: sum(x[0]))
            kept: list = []
            for vec, key, labels in items:
                if any(all(a <= b for a, b in zip(kvec, vec))
                       and all(any(a[0] <= b[0] and a[1] <= b[1] for a in klabels) for b in labels)
                       for kvec, klabels in kept):
                    continue
                kept.append((vec, labels))
                out[key] = labels
        return out
