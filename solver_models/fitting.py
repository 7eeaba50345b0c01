"""Whether any layout of one configuration fits at all, time aside: a property of the integer
tables every backend reads (the memory pruning asks it of a lesser recompute setting; the
screening asks it before a solve).  Not a solver: no backend's search runs here."""

from __future__ import annotations

from solver_models.tables import StageTables


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
