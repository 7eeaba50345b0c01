"""Builds the integer cost tables (solver_models/tables.py) for many global choices from the cost
model, sharing per-layer and per-stage work.  The only place the search turns cost-model floats
into the integers every backend reads (rounded down: solver_models/scaling.py)."""

from __future__ import annotations

import numpy as np

from planner.schemas.pipeline import pipeline_boundary_may_stay_in_node
from planner.cost.model import CostModel, GlobalShape, link_fill_s
from planner.schemas.plan import Recompute
from planner.schemas.search import GlobalChoice, StageOption
from solver_models.scaling import INF_US, to_us, to_us_array
from solver_models.tables import FIRST, LAST, MID, ONLY, StageTables, check_deadline

CACHE_BYTES = 1 << 30  # tables kept for reuse (screening, then the CP-SAT certificate, revisit configurations)


class TableBuilder:
    """Builds StageTables for many global choices, sharing per-layer and per-stage work.

    `contiguous_types`: the rule each table carries (SearchSpace.contiguous)."""

    def __init__(self, cost: CostModel, *, contiguous_types: bool = True):
        self.cost = cost
        self.contiguous_types = contiguous_types
        self._cache: dict = {}
        self._cache_sizes: dict = {}  # bytes of each cached entry, and their sum: kept as entries come and go
        self._cache_bytes = 0
        types = list(cost.cluster.gpus_by_type().keys())
        self._types = types
        self._budget = np.array([cost.cluster.gpus_by_type()[t] for t in types], dtype=np.int64)

    def shape(self, g: GlobalChoice) -> GlobalShape:
        return GlobalShape(tp=g.tp, cp=g.cp, ep=g.ep, etp=g.etp, vpp=g.vpp, mbs=g.mbs,
                           gbs=self.cost.training.global_batch_size, dp0=g.dp0, pp=g.pp,
                           sequence_parallel=g.tp > 1)

    def build(self, g: GlobalChoice, options: list[StageOption], deadline: float | None = None) -> StageTables:
        """The tables of G over `options`.  `deadline` (a time.perf_counter() value): raise
        DeadlinePassed once it passes, between options (a build runs for seconds on models with
        hundreds of layers); the tables carry it to fit_range."""
        cost = self.cost
        n_layers = cost.model.num_layers
        gs = self.shape(g)
        key = (g.tp, g.cp, g.ep, g.etp, g.vpp, g.mbs, g.dp0, g.pp > 1, tuple(options))
        arrays = self._cache.pop(key, None)
        if arrays is None:
            arrays = self._build_arrays(gs, options, n_layers, multi_stage=g.pp > 1, deadline=deadline)
            self._cache_sizes[key] = size = sum(a.nbytes for a in arrays)
            self._cache_bytes += size
        self._cache[key] = arrays  # most recently used last
        self._trim_cache()
        core, sync, static, act, cap, p2p, near, traffic, fill, fwd, min_layer, hidden, hidden_fwd = arrays
        if g.vpp > 1 and g.pp > 2:
            core, fwd = self._with_stall(gs, core, fwd)
        if hidden.size:
            core, fwd = self._with_ep_unpaired(gs, core, fwd, hidden, hidden_fwd)
        types = self._types
        inflight = np.array([cost.inflight_microbatches(gs, i) for i in range(g.pp)])
        return StageTables(
            g=g, options=list(options), num_layers=n_layers, num_microbatches=gs.num_microbatches,
            core_us=core, sync_us=sync, static_bytes=static, act_bytes=act, capacity_bytes=cap, p2p_us=p2p,
            inflight=inflight,
            option_type=np.array([types.index(o.device_type) for o in options], dtype=np.int64),
            option_gpus=np.array([g.tp * g.cp * o.dp for o in options], dtype=np.int64),
            types=types, budget=self._budget, min_layer_us=min_layer,
            contiguous_types=self.contiguous_types, deadline=deadline,
            p2p_near_us=near, gpus_per_node=np.array([cost.domain_gpus(t) for t in types], dtype=np.int64),
            traffic_us=traffic if traffic.size else None, fwd_us=fwd if fwd.size else None,
            fill_us=fill if fill.size else None,
        )

    def _with_stall(self, gs: GlobalShape, core: np.ndarray, fwd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The middle stages' times with the interleaved schedule's stall on unequal chunks added, as
        CostModel.stage adds it (`chunk_stall_share` of a middle stage's time, which is all its decoder layers');
        copies, since the cached arrays serve every PP and the stall depends on it.  Rounded down like the rest."""
        share = np.array([self.cost.chunk_stall_share(gs, n) for n in range(core.shape[-1])])
        if not share.any():
            return core, fwd
        mid = core[:, MID]
        ok = mid < INF_US
        stall = np.where(ok, np.floor(mid * share[None, None, :]), 0).astype(np.int64)
        core = core.copy()
        core[:, MID] = np.where(ok, mid + stall, mid)
        if fwd.size:
            f = fwd[:, MID]
            part = np.where(ok, np.floor(stall * (f / np.maximum(mid, 1))), 0).astype(np.int64)
            fwd = fwd.copy()
            fwd[:, MID] = np.where(ok, f + part, f)
        return core, fwd

    def _with_ep_unpaired(self, gs: GlobalShape, core: np.ndarray, fwd: np.ndarray, hidden: np.ndarray,
                          hidden_fwd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every stage's time with the EP communication the schedule's unpaired steps leave exposed added, as
        CostModel.stage adds it (`ep_unpaired_share` of the seconds the EP overlap hid: the same share at every
        position, since it depends on PP, VPP and the micro-batches only); copies, since the cached arrays serve
        every PP.  Rounded down like the rest."""
        share = self.cost.ep_unpaired_share(gs)
        if not share:
            return core, fwd
        ok = core < INF_US
        core = np.where(ok, core + np.floor(share * hidden.astype(np.int64)).astype(np.int64), core)
        if fwd.size:
            fwd = np.where(ok, fwd + np.floor(share * hidden_fwd.astype(np.int64)).astype(np.int64), fwd)
        return core, fwd

    def _trim_cache(self) -> None:
        """Least recently used tables out while the cache holds more than CACHE_BYTES (a model with
        hundreds of layers takes hundreds of MB per configuration); the newest always stays.  The sizes are
        counted as entries come and go (summing every entry's arrays at every build took a fifth of a search
        that builds a thousand tables)."""
        while self._cache_bytes > CACHE_BYTES and len(self._cache) > 1:
            oldest = next(iter(self._cache))
            del self._cache[oldest]
            self._cache_bytes -= self._cache_sizes.pop(oldest)

    def _signatures(self) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """sig[start, n]: an id per distinct layer-kind sequence of the range [start, start+n),
        with one representative (start, n) per id.  Stage costs depend on the range only through
        its layer kinds, so each id is priced once and broadcast."""
        if not hasattr(self, "_sig"):
            kinds = self.cost.model.layer_is_moe
            N = len(kinds)
            sig = np.full((N + 1, N + 1), -1, dtype=np.int64)
            # ids through a trie: the sequence [start, start+n) is the node reached from the one of
            # [start, start+n-1) by the kind of layer start+n-1 (O(N^2), not O(N^3) tuple slices)
            child: dict[tuple[int, bool], int] = {}
            reps: list[tuple[int, int]] = []
            for start in range(N):
                node = -1
                for n in range(1, N - start + 1):
                    edge = (node, kinds[start + n - 1])
                    k = child.get(edge)
                    if k is None:
                        k = child[edge] = len(reps)
                        reps.append((start, n))
                    sig[start, n] = node = k
            self._sig = (sig, reps)
        return self._sig

    def _build_arrays(self, gs: GlobalShape, options: list[StageOption], n_layers: int, multi_stage: bool,
                      deadline: float | None = None):
        cost = self.cost
        check_deadline(deadline)
        num_o = len(options)
        N = n_layers
        shape = (num_o, 4, N + 1, N + 1)
        far, near, traffic, fill = pipeline_links(cost, gs, options)
        # with traffic the tables keep each cell's forward apart (rounded down apart from its backward, so that
        # core = F + B stays a lower bound of both)
        fwd = np.empty(shape if traffic.size else (0,), dtype=np.int64)
        # filled option by option below (with a deadline check between): on a model with hundreds
        # of layers these arrays take gigabytes, and writing them is most of a build's time
        core = np.empty(shape, dtype=np.int64)
        # the EP seconds --overlap-moe-expert-parallel-comm hid per cell (and their forward part), which `build`
        # charges at the PP's unpaired share (`_with_ep_unpaired`); empty without the overlap
        overlap = cost.model.is_moe and cost.training.overlap_moe_expert_parallel_comm
        # (int32: microseconds of one stage's hidden dispatch per micro-batch stay far below 2^31; half the memory)
        hidden = np.zeros(shape if overlap else (0,), dtype=np.int32)
        hidden_fwd = np.zeros(shape if overlap and traffic.size else (0,), dtype=np.int32)
        sync = np.empty(shape, dtype=np.int64)
        static = np.empty(shape)
        act = np.empty(shape)
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
        for o, opt in enumerate(options):
            check_deadline(deadline)
            core[o].fill(INF_US)
            sync[o].fill(INF_US)
            if traffic.size:
                fwd[o].fill(INF_US)
            static[o].fill(np.inf)
            act[o].fill(np.inf)
            for p, mask in regions.items():
                check_deadline(deadline)
                ids = np.unique(sig[mask])
                vals = np.zeros((len(reps), 7))
                for j, k in enumerate(ids):
                    if j % 64 == 63:
                        check_deadline(deadline)
                    st, n = reps[k]
                    c = cost.stage_core(gs, device_type=opt.device_type, start=st, end=st + n, dp=opt.dp,
                                        recompute=opt.recompute, is_first=p in (FIRST, ONLY),
                                        is_last=p in (LAST, ONLY))
                    vals[k] = (c.time_s, c.sync_s, c.held_static_bytes, c.held_act_per_microbatch_bytes, c.forward_s,
                               sum(c.ep_hidden_s), c.ep_hidden_s[0])
                    cap[o] = c.capacity_bytes
                cells = sig[mask]
                if traffic.size:
                    fwd[o, p][mask] = to_us_array(vals[cells, 4])
                    core[o, p][mask] = fwd[o, p][mask] + to_us_array(vals[cells, 0] - vals[cells, 4])
                else:
                    core[o, p][mask] = to_us_array(vals[cells, 0])
                sync[o, p][mask] = to_us_array(vals[cells, 1])
                if hidden.size:
                    hidden[o, p][mask] = to_us_array(vals[cells, 5])
                if hidden_fwd.size:
                    hidden_fwd[o, p][mask] = to_us_array(vals[cells, 6])
                static[o, p][mask] = vals[cells, 2]
                act[o, p][mask] = vals[cells, 3]
            # least per-layer time (for lower bounds): a one-layer middle stage without recompute,
            # which no layer of this option can undercut (recompute and stage extras only add)
            per = [cost.stage_core(gs, device_type=opt.device_type, start=j, end=j + 1, dp=opt.dp,
                                   recompute=Recompute.none(), is_first=False, is_last=False).time_s
                   for j in _distinct_layer_starts(cost)]
            min_layer[o] = to_us(min(per))
        return core, sync, static, act, cap, far, near, traffic, fill, fwd, min_layer, hidden, hidden_fwd


def pipeline_links(cost: CostModel, gs: GlobalShape, options: list[StageOption]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(L, L near, M, X) of every option pair: int [O, O] and [2, O, O] (across nodes, then inside one), the link
    as each of its two stages pays it (CostModel.p2p_parts) and what it adds to the pipeline's fill
    (model.link_fill_s; solver_models/tables.py), when the boundary leaves a node and when both stages share one.
    M is empty when it can never outlast the compute beside it (a stage's forward and backward are at least a
    one-layer stage's: `least_compute`); X without interleaving (it is 0)."""
    n = len(options)
    floor = np.zeros((2, n, n), dtype=np.int64)
    traffic = np.zeros((2, n, n), dtype=np.int64)
    fill = np.zeros((2, n, n), dtype=np.int64)
    for a, oa in enumerate(options):
        for b, ob in enumerate(options):
            may_stay = oa.device_type == ob.device_type and pipeline_boundary_may_stay_in_node(
                gs.tp * gs.cp * oa.dp, gs.tp * gs.cp * ob.dp, cost.domain_gpus(oa.device_type))
            for near in (0, 1):
                parts = cost.p2p_parts(gs, oa.device_type, oa.dp, ob.device_type, ob.dp,
                                       crosses_nodes=not (near and may_stay))
                floor[near, a, b], traffic[near, a, b] = to_us(parts[0]), to_us(parts[1])
                fill[near, a, b] = to_us(link_fill_s(gs.vpp, *parts))
    least = min((least_compute(cost, gs, o) for o in options), default=0.0)
    if not (traffic - floor > to_us(least)).any():
        traffic = np.zeros((0,), dtype=np.int64)
    if gs.vpp == 1:
        fill = np.zeros((0,), dtype=np.int64)
    return floor[0], floor[1], traffic, fill


def least_compute(cost: CostModel, gs: GlobalShape, o: StageOption) -> float:
    """The least forward or backward per micro-batch of any stage on option o: a one-layer middle stage's without
    recompute (the least over the layer kinds)."""
    cores = [cost.stage_core(gs, device_type=o.device_type, start=j, end=j + 1, dp=o.dp,
                             recompute=Recompute.none(), is_first=False, is_last=False)
             for j in _distinct_layer_starts(cost)]
    return min(min(c.forward_s, c.backward_s) for c in cores)


def _distinct_layer_starts(cost: CostModel) -> list[int]:
    """One representative layer index per layer kind (dense, MoE)."""
    seen: dict[bool, int] = {}
    for j, k in enumerate(cost.model.layer_is_moe):
        seen.setdefault(k, j)
    return sorted(seen.values())
