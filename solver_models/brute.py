"""Brute force over one global choice: every option sequence and every layer split, under the
tables' rules and prunings.  The per-configuration oracle the tests hold HS-DP and CP-SAT to;
exponential, for small cases only.  (tests/helpers/oracle.py is the whole-space oracle, which knows no
tables.)"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

from solver_models.scaling import INF_US
from solver_models.tables import StageTables, position


@dataclass
class BruteSolution:
    objective_us: int
    stages: list[tuple[int, int, int]]
    count: int  # plans enumerated
    complete: bool = True  # False: the deadline stopped it


def compositions(n: int, k: int):
    """Every way to write n as an ordered sum of k positive integers."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        prev = 0
        out = []
        for c in cuts + (n,):
            out.append(c - prev)
            prev = c
        yield out


def solve_brute(t: StageTables, *, limit: int = 2_000_000, deadline: float = math.inf) -> BruteSolution | None:
    """The best plan of the tables (None: nothing fits).  At the `deadline` (time.perf_counter()
    value) it stops with the best so far and `complete` False."""
    pp, N, O = t.pp, t.num_layers, t.num_options
    best: BruteSolution | None = None
    count = 0
    for k, opts in enumerate(itertools.product(range(O), repeat=pp)):
        if k % 1024 == 0 and time.perf_counter() > deadline:
            if best is not None:
                best.complete = False
            return best if best is not None else BruteSolution(0, [], count, complete=False)
        if not t.first_stage_ok(opts[0]) or not t.last_stage_ok(opts[-1]) or not t.type_sequence_ok(opts):
            continue
        used = [0] * len(t.types)
        for o in opts:
            used[t.option_type[o]] += t.option_gpus[o]
        if any(u > b for u, b in zip(used, t.budget)):
            continue
        links = [(0, 0)] + t.plan_links(opts) + [(0, 0)]
        fill = sum(link[2] for link in links[1:-1])
        for split in compositions(N, pp):
            count += 1
            if count > limit:
                raise RuntimeError(f"brute force exceeded {limit} plans")
            if count % 4096 == 0 and time.perf_counter() > deadline:
                if best is not None:
                    best.complete = False
                return best if best is not None else BruteSolution(0, [], count, complete=False)
            start = 0
            total = mx = sy = 0
            ok = True
            for i, (o, n) in enumerate(zip(opts, split)):
                if (t.core_us[o, position(i, pp), start, n] >= INF_US or not t.fits(o, i, start, n)
                        or not t.in_window(o, n)):
                    ok = False
                    break
                ti = t.stage_us(o, i, start, n, links[i], links[i + 1])
                total += ti
                mx = max(mx, ti)
                sy = max(sy, int(t.sync_us[o, position(i, pp), start, n]))
                start += n
            if not ok:
                continue
            obj = t.objective_us(total, mx, sy, fill)
            if best is None or obj < best.objective_us:
                stages, s0 = [], 0
                for o, n in zip(opts, split):
                    stages.append((o, s0, n))
                    s0 += n
                best = BruteSolution(obj, stages, 0)
    if best is not None:
        best.count = count
    return best
