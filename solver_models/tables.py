"""Integer cost tables for one global choice G, built once from the cost model and read by every
backend (HS-DP, CP-SAT, brute force).  Neither backend calls the cost model.

Index convention: [option o, position p, start layer, layer count n], with position
0 = middle stage, 1 = first stage, 2 = last stage, 3 = the only stage (PP = 1).  A stage's
per-micro-batch time is core[o, p, start, n] + p2p[o_prev, o] + p2p[o, o_next] (both pipeline
links, as the evaluator charges them); it fits in memory when
static[o, p, start, n] + inflight[i] * act[o, p, start, n] <= capacity[o].

Search-space rule carried with the tables (every backend applies it): with `contiguous_types` the
stages of one device type form one contiguous block of the pipeline.  FlagScale requires it of its
meshes; on upstream Megatron it only rules out pipelines that cross between device types more than
once, each crossing paying the slowest link.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.cost.model import CostModel, GlobalShape
from planner.search.space import GlobalChoice, StageOption
from solver_models.scaling import INF_US, QUANTUM_S, to_us

MID, FIRST, LAST, ONLY = 0, 1, 2, 3


def position(i: int, pp: int) -> int:
    if pp == 1:
        return ONLY
    if i == 0:
        return FIRST
    if i == pp - 1:
        return LAST
    return MID


@dataclass
class StageTables:
    g: GlobalChoice
    options: list[StageOption]
    num_layers: int
    num_microbatches: int
    core_us: np.ndarray  # int64 [O, 4, N+1, N+1]; INF_US where not applicable
    sync_us: np.ndarray  # int64 [O, 4, N+1, N+1]  exposed DP sync + optimizer step, per iteration
    static_bytes: np.ndarray  # float [O, 4, N+1, N+1]
    act_bytes: np.ndarray  # float [O, 4, N+1, N+1]  per in-flight micro-batch
    capacity_bytes: np.ndarray  # float [O]
    p2p_us: np.ndarray  # int64 [O, O]  one pipeline link, both directions' share as charged per stage
    inflight: np.ndarray  # float [PP]
    option_type: np.ndarray  # int [O]  index into `types`
    option_gpus: np.ndarray  # int [O]
    types: list[str]
    budget: np.ndarray  # int [num types]  GPUs available per type
    min_layer_us: np.ndarray  # int [O]  least per-layer time of option o (for bounds)
    contiguous_types: bool = True  # rule: each device type's stages form one contiguous block
    memory_prune: bool = False  # paper's pruning 2: a stage takes the least recompute that fits
    shared: dict = field(default_factory=dict)  # per-array-set caches shared across global choices

    def first_stage_ok(self, o: int) -> bool:
        """Options stage 0 may take.  megatron: every stage has the global DP.  flagscale: G fixes
        the samples per micro-batch B = DP0 * mbs (carried as g.mbs with g.dp0 = 1), so stage 0 may
        take any DP dividing B and its micro-batch is B / DP."""
        return self.g.runtime == "flagscale" or self.options[o].dp == self.g.dp0

    def type_sequence_ok(self, opts: list[int] | tuple[int, ...]) -> bool:
        """The contiguity rule on a full option sequence (each type appears in one block)."""
        if not self.contiguous_types:
            return True
        seen, prev = set(), None
        for o in opts:
            ty = int(self.option_type[o])
            if ty != prev:
                if ty in seen:
                    return False
                seen.add(ty)
                prev = ty
        return True

    @property
    def pp(self) -> int:
        return self.g.pp

    @property
    def num_options(self) -> int:
        return len(self.options)

    def fits(self, o: int, i: int, start: int, n: int) -> bool:
        lo, hi = self.fit_range()
        return bool(lo[o, i, start] <= n <= hi[o, i, start])

    @property
    def fits_table(self) -> np.ndarray:
        """bool [O, PP, N+1, N+1]: the cells a stage may use (memory fits; with memory pruning, no
        lesser recompute of the same device type and DP fits there)."""
        lo, hi = self.fit_range()
        n = np.arange(self.num_layers + 1)[None, None, None, :]
        return (n >= lo[..., None]) & (n <= hi[..., None])

    def fit_range(self) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) int [O, PP, N+1]: stage i on option o starting at `start` may hold n layers
        exactly for lo <= n <= hi (and n >= VPP, one layer per virtual chunk).  Memory grows with
        n, so the fitting n form an interval; with
        memory pruning, an option starts where every lesser-recompute option of the same (type,
        DP) stops fitting (lo = their hi + 1).  Equivalent to fits_table, without materialising it."""
        cached = getattr(self, "_fit_range", None)
        if cached is None:
            pos = np.array([position(i, self.pp) for i in range(self.pp)])
            need = self.static_bytes[:, pos] + self.inflight[None, :, None, None] * self.act_bytes[:, pos]
            ok = need <= self.capacity_bytes[:, None, None, None]
            # fitting cells of one (o, i, start) form an interval of n: valid cells are contiguous
            # (any n for middle stages, one n for the last) and memory grows with n
            n_idx = np.arange(self.num_layers + 1)
            any_ok = ok.any(axis=3)
            hi = np.where(any_ok, np.where(ok, n_idx, -1).max(axis=3), 0).astype(np.int64)
            lo = np.where(any_ok, np.where(ok, n_idx, 10**9).min(axis=3), 1).astype(np.int64)
            lo = np.maximum(lo, self.g.vpp)  # each virtual chunk holds at least one layer
            if self.memory_prune:
                seen: dict[tuple, np.ndarray] = {}
                for o, opt in enumerate(self.options):
                    key = (opt.device_type, opt.dp)
                    if key in seen:
                        lo[o] = seen[key] + 1
                        seen[key] = np.maximum(seen[key], hi[o])
                    else:
                        seen[key] = hi[o].copy()
            cached = (lo, hi)
            self._fit_range = cached
        return cached

    def as_lists(self) -> tuple:
        """(core, sync, p2p, fit_lo, fit_hi) as nested Python lists: the DP's inner loop indexes
        lists much faster than numpy scalars.  Core/sync/p2p lists are shared by every G that
        shares these arrays (see TableBuilder)."""
        cached = getattr(self, "_lists", None)
        if cached is None:
            shared = self.shared
            if "core" not in shared:
                shared["core"] = self.core_us.tolist()
                shared["sync"] = self.sync_us.tolist()
                shared["p2p"] = self.p2p_us.tolist()
            lo, hi = self.fit_range()
            cached = (shared["core"], shared["sync"], shared["p2p"], lo.tolist(), hi.tolist())
            self._lists = cached
        return cached

    def stage_us(self, o_prev: int | None, o: int, o_next: int | None, i: int, start: int, n: int) -> int:
        t = int(self.core_us[o, position(i, self.pp), start, n])
        if o_prev is not None:
            t += int(self.p2p_us[o_prev, o])
        if o_next is not None:
            t += int(self.p2p_us[o, o_next])
        return t

    def objective_us(self, sum_us: int, max_us: int, max_sync_us: int) -> int:
        """v x iteration time in integer us: sum t_i + (m*v - 1) * max t_i + v * max sync_i."""
        v = self.g.vpp
        return sum_us + (self.num_microbatches * v - 1) * max_us + v * max_sync_us


class TableBuilder:
    """Builds StageTables for many global choices, sharing per-layer and per-stage work."""

    def __init__(self, cost: CostModel):
        self.cost = cost
        self._cache: dict = {}

    def shape(self, g: GlobalChoice) -> GlobalShape:
        return GlobalShape(tp=g.tp, cp=g.cp, ep=g.ep, etp=g.etp, vpp=g.vpp, mbs=g.mbs,
                           gbs=self.cost.training.global_batch_size, dp0=g.dp0, pp=g.pp,
                           sequence_parallel=g.tp > 1)

    def build(self, g: GlobalChoice, options: list[StageOption]) -> StageTables:
        cost = self.cost
        n_layers = cost.model.num_layers
        gs = self.shape(g)
        key = (g.tp, g.cp, g.ep, g.etp, g.vpp, g.mbs, g.dp0, g.pp > 1, tuple(options))
        arrays = self._cache.get(key)
        if arrays is None:
            arrays = self._build_arrays(gs, options, n_layers, multi_stage=g.pp > 1) + ({},)
            self._cache[key] = arrays
        core, sync, static, act, cap, p2p, min_layer, shared = arrays
        types = list(cost.cluster.gpus_by_type().keys())
        budget = np.array([cost.cluster.gpus_by_type()[t] for t in types], dtype=np.int64)
        inflight = np.array([cost.inflight_microbatches(gs, i) for i in range(g.pp)])
        return StageTables(
            g=g, options=list(options), num_layers=n_layers, num_microbatches=gs.num_microbatches,
            core_us=core, sync_us=sync, static_bytes=static, act_bytes=act, capacity_bytes=cap, p2p_us=p2p,
            inflight=inflight,
            option_type=np.array([types.index(o.device_type) for o in options], dtype=np.int64),
            option_gpus=np.array([g.tp * g.cp * o.dp for o in options], dtype=np.int64),
            types=types, budget=budget, min_layer_us=min_layer, shared=shared,
        )

    def _signatures(self) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """sig[start, n]: an id per distinct layer-kind sequence of the range [start, start+n),
        with one representative (start, n) per id.  Stage costs depend on the range only through
        its layer kinds, so each id is priced once and broadcast."""
        if not hasattr(self, "_sig"):
            kinds = self.cost.model.layer_is_moe
            N = len(kinds)
            sig = np.full((N + 1, N + 1), -1, dtype=np.int64)
            ids: dict[tuple, int] = {}
            reps: list[tuple[int, int]] = []
            for start in range(N):
                for n in range(1, N - start + 1):
                    key = kinds[start:start + n]
                    k = ids.get(key)
                    if k is None:
                        k = ids[key] = len(reps)
                        reps.append((start, n))
                    sig[start, n] = k
            self._sig = (sig, reps)
        return self._sig

    def _build_arrays(self, gs: GlobalShape, options: list[StageOption], n_layers: int, multi_stage: bool):
        cost = self.cost
        num_o = len(options)
        N = n_layers
        shape = (num_o, 4, N + 1, N + 1)
        core = np.full(shape, INF_US, dtype=np.int64)
        sync = np.full(shape, INF_US, dtype=np.int64)
        static = np.full(shape, np.inf)
        act = np.full(shape, np.inf)
        cap = np.zeros(num_o)
        min_layer = np.zeros(num_o, dtype=np.int64)
        sig, reps = self._signatures()
        # which (start, n) cells each position uses
        starts = np.arange(N + 1)[:, None]
        ns = np.arange(N + 1)[None, :]
        valid = (ns >= 1) & (starts + ns <= N)
        if multi_stage:
            regions = {FIRST: valid & (starts == 0) & (ns < N), LAST: valid & (starts + ns == N) & (starts > 0),
                       MID: valid & (starts > 0) & (starts + ns < N)}
        else:
            regions = {ONLY: valid & (starts == 0) & (ns == N)}
        from planner.schemas.plan import Recompute

        for o, opt in enumerate(options):
            for p, mask in regions.items():
                ids = np.unique(sig[mask])
                vals = np.zeros((len(reps), 4))
                for k in ids:
                    st, n = reps[k]
                    c = cost.stage_core(gs, device_type=opt.device_type, start=st, end=st + n, dp=opt.dp,
                                        recompute=opt.recompute, is_first=p in (FIRST, ONLY),
                                        is_last=p in (LAST, ONLY))
                    vals[k] = (c.time_s, c.sync_s, c.static_bytes, c.act_per_microbatch_bytes)
                    cap[o] = c.capacity_bytes
                cells = sig[mask]
                core[o, p][mask] = np.rint(vals[cells, 0] / QUANTUM_S).astype(np.int64)
                sync[o, p][mask] = np.rint(vals[cells, 1] / QUANTUM_S).astype(np.int64)
                static[o, p][mask] = vals[cells, 2]
                act[o, p][mask] = vals[cells, 3]
            # least per-layer time (for lower bounds): a one-layer middle stage without recompute,
            # which no layer of this option can undercut (recompute and stage extras only add)
            per = [cost.stage_core(gs, device_type=opt.device_type, start=j, end=j + 1, dp=opt.dp,
                                   recompute=Recompute.none(), is_first=False, is_last=False).time_s
                   for j in _distinct_layer_starts(cost)]
            min_layer[o] = to_us(min(per))
        p2p = np.zeros((num_o, num_o), dtype=np.int64)
        for a, oa in enumerate(options):
            for b, ob in enumerate(options):
                p2p[a, b] = to_us(cost.p2p_s(gs, oa.device_type, oa.dp, ob.device_type, ob.dp))
        return core, sync, static, act, cap, p2p, min_layer


def _distinct_layer_starts(cost: CostModel) -> list[int]:
    """One representative layer index per layer kind (dense, MoE)."""
    seen: dict[bool, int] = {}
    for j, k in enumerate(cost.model.layer_is_moe):
        seen.setdefault(k, j)
    return sorted(seen.values())
