"""Integer cost tables for one global choice G, built once from the cost model
(planner/search/tables.py) and read by every backend (HS-DP, CP-SAT, brute force).  No backend
calls the cost model.

Index convention: [option o, position p, start layer, layer count n], with position
0 = middle stage, 1 = first stage, 2 = last stage, 3 = the only stage (PP = 1).  A stage's
per-micro-batch time is core[o, p, start, n] + link[i-1] + link[i] (both pipeline links, as the
evaluator charges them); it fits in memory when
static[o, p, start, n] + inflight[i] * act[o, p, start, n] <= capacity[o].

A link is a pair (L, M) (`link`, CostModel.p2p_parts): under 1F1B L is the message and M is 0; interleaved, L is
v latencies and M the v messages, which the compute overlaps.  With its forward F and backward B (core = F + B) a
stage takes planner/schemas/pipeline.py `stage_time_with_links` (F, B, link in, link out), which is
core + L_in + L_out unless a link's M outlasts the compute beside it.  `traffic_us` (M) and `fwd_us` (F) are
present only when some M can (else M never binds).  Interleaved, a link also adds X to the pipeline's fill
(`fill_us`, model.link_fill_s): the objective counts it v times per boundary (`objective_us`).  The link depends on where the boundary lands: the near
prices when the two stages' ranks share a node, the others when they do not (always between device types).
Stage i's ranks start `offset` GPUs into its type's GPUs (the GPUs of that type the stages before it use), and the
boundary to the next stage leaves a node exactly when a node boundary falls inside the two blocks
(planner/schemas/pipeline.py `pipeline_boundary_crosses_nodes`), so a plan's links follow from its option
sequence (`plan_links`).

Quantisation (solver_models/scaling.py): every time is rounded DOWN to whole microseconds, so a
plan's table objective never exceeds its float cost and falls short of it by less than
`quantisation_us` (in v x T units).  A bound on the tables is a bound on the float costs.

Rules carried with the tables (every backend applies them):
  - `contiguous_types`: the stages of one device type form one contiguous block of the pipeline
    (FlagScale requires it of its meshes; on upstream Megatron it is the --contiguous-types option);
  - `first_stage_ok` / `last_stage_ok`: the options stage 0 and the last stage may take.
Prunings carried with the tables (switchable; a pruned table's optimum is not the configuration's):
  - `windows`: the paper's load balance, layers of option o within [windows[o, 0], windows[o, 1]];
  - `memory_prune`: a stage takes the least recompute of its (type, DP) that fits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from planner.schemas.pipeline import pipeline_boundary_crosses_nodes, stage_time_with_links
from planner.schemas.search import GlobalChoice, StageOption, stage_min_layers

MID, FIRST, LAST, ONLY = 0, 1, 2, 3


class DeadlinePassed(Exception):
    """The search's deadline passed while building or reading tables (work that runs for seconds
    on models with hundreds of layers).  The search treats the configuration as not reached."""


def check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.perf_counter() > deadline:
        raise DeadlinePassed()


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
    p2p_us: np.ndarray  # int64 [O, O]  one pipeline link as charged to each of its stages, across nodes
    inflight: np.ndarray  # float [PP]
    option_type: np.ndarray  # int [O]  index into `types`
    option_gpus: np.ndarray  # int [O]
    types: list[str]
    budget: np.ndarray  # int [num types]  GPUs available per type
    min_layer_us: np.ndarray  # int [O]  least per-layer time of option o (for bounds and load balance)
    contiguous_types: bool = True  # rule: each device type's stages form one contiguous block
    memory_prune: bool = False  # pruning: a stage takes the least recompute that fits
    windows: np.ndarray | None = None  # pruning: int [O, 2] load-balance layer counts (inclusive)
    deadline: float | None = None  # time.perf_counter() value: fit_range raises DeadlinePassed after it
    p2p_near_us: np.ndarray | None = None  # int64 [O, O]  L when both stages' ranks share a node (None: p2p_us)
    gpus_per_node: np.ndarray | None = None  # int [num types]: GPUs sharing the intra-node link (cost.domain_gpus)
    traffic_us: np.ndarray | None = None  # int64 [2, O, O]  M across nodes, then inside one (None: M never binds)
    fwd_us: np.ndarray | None = None  # int64 [O, 4, N+1, N+1]  F, the forward part of core (with traffic_us)
    fill_us: np.ndarray | None = None  # int64 [2, O, O]  X across nodes, then inside one (None: 1F1B, X = 0)

    def pruned(self, *, delta: float | None, memory: bool) -> "StageTables":
        """These tables with the paper's prunings set: load balance with tolerance `delta` (None:
        off) and memory (the least recompute that fits).  A new object; the arrays are shared."""
        out = replace(self, memory_prune=memory, windows=None)
        out.__dict__.pop("_fit_range", None)
        out.windows = balance_windows(out, delta)
        return out

    @property
    def exact(self) -> bool:
        """Whether the tables' optimum is the configuration's optimum (no pruning on them)."""
        return self.windows is None and not self.memory_prune

    @property
    def near_us(self) -> np.ndarray:
        """int64 [O, O]: L when both stages' ranks share a node (p2p_us where that cannot happen)."""
        return self.p2p_us if self.p2p_near_us is None else self.p2p_near_us

    @property
    def positional_links(self) -> bool:
        """Whether some link depends on where the boundary lands."""
        if self.p2p_near_us is None:
            return False
        return bool((self.p2p_near_us != self.p2p_us).any()) or any(
            x is not None and bool((x[0] != x[1]).any()) for x in (self.traffic_us, self.fill_us))

    def link_rows(self, o: int) -> tuple[tuple[int, ...], ...]:
        """Every price of the links out of and into option o (L, M and X, across nodes and inside one): options
        with equal rows pay equal links wherever they stand."""
        tables = [self.p2p_us, self.near_us] + [x[k] for x in (self.traffic_us, self.fill_us) if x is not None
                                                 for k in (0, 1)]
        return tuple(tuple(int(v) for v in row) for table in tables for row in (table[o, :], table[:, o]))

    def crosses_nodes(self, a: int, b: int, offset: int) -> bool:
        """Whether the boundary from a stage on option a starting `offset` GPUs into its type's GPUs to the next
        stage, on option b, leaves a node (always between two types)."""
        ty = int(self.option_type[a])
        if ty != int(self.option_type[b]) or self.gpus_per_node is None:
            return True
        return pipeline_boundary_crosses_nodes(offset, int(self.option_gpus[a]), int(self.option_gpus[b]),
                                               int(self.gpus_per_node[ty]))

    def link(self, a: int, b: int, offset: int) -> tuple[int, int, int]:
        """(L, M, X) of the link from a stage on option a (starting `offset` GPUs into its type's) to the next,
        on b."""
        near = self.p2p_near_us is not None and not self.crosses_nodes(a, b, offset)
        l_us = int((self.p2p_near_us if near else self.p2p_us)[a, b])
        return (l_us, 0 if self.traffic_us is None else int(self.traffic_us[int(near), a, b]),
                0 if self.fill_us is None else int(self.fill_us[int(near), a, b]))

    def plan_links(self, opts: list[int] | tuple[int, ...]) -> list[tuple[int, int, int]]:
        """The links (L, M, X) of a full option sequence, boundary by boundary."""
        used: dict[int, int] = {}
        out = []
        for i, o in enumerate(opts):
            ty = int(self.option_type[o])
            offset = used.get(ty, 0)
            used[ty] = offset + int(self.option_gpus[o])
            if i + 1 < len(opts):
                out.append(self.link(o, opts[i + 1], offset))
        return out

    @property
    def quantisation_us(self) -> int:
        """Most a plan's float cost exceeds its table objective, in v x T microseconds (`quantisation_us`)."""
        return quantisation_us(self.pp, self.num_microbatches, self.g.vpp, traffic=self.traffic_us is not None,
                               fill=self.fill_us is not None)

    def first_stage_ok(self, o: int) -> bool:
        """Options stage 0 may take.  megatron: every stage has the global DP.  flagscale: G fixes
        the samples per micro-batch B (carried as g.mbs with g.dp0 = 1), so stage 0 may take any
        DP the options allow, unless G fixes it (g.first_dp, the tied-embedding rule)."""
        opt = self.options[o]
        if not self.g.per_stage_meshes:
            return opt.dp == self.g.dp0
        return self.g.first_dp is None or opt.dp == self.g.first_dp

    def last_stage_ok(self, o: int) -> bool:
        """Options the last stage may take: with the tied-embedding rule (flagscale, g.first_dp
        set), a DP that divides stage 0's or is a multiple of it."""
        first = self.g.first_dp
        if first is None:
            return True
        dp = self.options[o].dp
        return dp % first == 0 or first % dp == 0

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

    def in_window(self, o: int, n: int) -> bool:
        """The load-balance pruning (True when it is off)."""
        return self.windows is None or bool(self.windows[o, 0] <= n <= self.windows[o, 1])

    @property
    def fits_table(self) -> np.ndarray:
        """bool [O, PP, N+1, N+1]: the cells a stage may use (memory fits; with memory pruning, no
        lesser recompute of the same device type and DP fits there)."""
        lo, hi = self.fit_range()
        n = np.arange(self.num_layers + 1)[None, None, None, :]
        return (n >= lo[..., None]) & (n <= hi[..., None])

    def fit_range(self) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) int [O, PP, N+1]: stage i on option o starting at `start` may hold n layers
        exactly for lo <= n <= hi (and n >= stage_min_layers: a layer per virtual chunk, but an
        embedding-only first chunk and a loss-only last chunk).  Memory grows with
        n, so the fitting n form an interval; with memory pruning, an option starts where every
        lesser-recompute option of the same (type, DP) stops fitting (lo = their hi + 1).
        Equivalent to fits_table, without materialising it."""
        cached = self.__dict__.get("_fit_range")
        if cached is None:
            O, N = self.num_options, self.num_layers
            hi = np.zeros((O, self.pp, N + 1), dtype=np.int64)
            lo = np.ones((O, self.pp, N + 1), dtype=np.int64)
            n_idx = np.arange(N + 1)
            done: dict[tuple, int] = {}  # (position, in-flight micro-batches) -> a stage already done
            for i in range(self.pp):  # one stage at a time: [O, N+1, N+1] temporaries, not [O, PP, ...]
                p = position(i, self.pp)
                twin = done.setdefault((p, float(self.inflight[i])), i)
                if twin != i:
                    hi[:, i], lo[:, i] = hi[:, twin], lo[:, twin]
                    continue
                check_deadline(self.deadline)
                need = self.static_bytes[:, p] + self.inflight[i] * self.act_bytes[:, p]
                ok = need <= self.capacity_bytes[:, None, None]
                any_ok = ok.any(axis=2)
                hi[:, i] = np.where(any_ok, np.where(ok, n_idx, -1).max(axis=2), 0)
                lo[:, i] = np.where(any_ok, np.where(ok, n_idx, 10**9).min(axis=2), 1)
            least = np.array([stage_min_layers(i, self.pp, self.g.vpp) for i in range(self.pp)], dtype=np.int64)
            lo = np.maximum(lo, least[None, :, None])  # a layer per virtual chunk but E-only/L-only ones
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
            self.__dict__["_fit_range"] = cached
        return cached

    def stage_us(self, o: int, i: int, start: int, n: int, link_in: tuple[int, ...] = (0, 0),
                 link_out: tuple[int, ...] = (0, 0)) -> int:
        """Stage i's time on option o with layers [start, start + n) and the given links (L, M, ...) ((0, 0):
        none)."""
        p = position(i, self.pp)
        core = int(self.core_us[o, p, start, n])
        if self.traffic_us is None:
            return core + link_in[0] + link_out[0]
        fwd = int(self.fwd_us[o, p, start, n])
        return int(stage_time_with_links(fwd, core - fwd, link_in[:2], link_out[:2]))

    def plan_stage_us(self, stages: list[tuple[int, int, int]]) -> list[int]:
        """Every stage's time of a plan [(option, start, n)], its links from its option sequence."""
        links = [(0, 0)] + self.plan_links([o for o, _, _ in stages]) + [(0, 0)]
        return [self.stage_us(o, i, s, n, links[i], links[i + 1]) for i, (o, s, n) in enumerate(stages)]

    def objective_us(self, sum_us: int, max_us: int, max_sync_us: int, fill_us: int = 0) -> int:
        """v x iteration time in integer us: sum t_i + (m*v - 1) * max t_i + v * max sync_i + v * the links' fill."""
        v = self.g.vpp
        return sum_us + (self.num_microbatches * v - 1) * max_us + v * max_sync_us + v * fill_us

    def plan_objective_us(self, stages: list[tuple[int, int, int]]) -> int:
        """The objective of a plan [(option, start, n)]."""
        pp = self.pp
        times = self.plan_stage_us(stages)
        syncs = [int(self.sync_us[o, position(i, pp), s, n]) for i, (o, s, n) in enumerate(stages)]
        fill = sum(x for _, _, x in self.plan_links([o for o, _, _ in stages]))
        return self.objective_us(sum(times), max(times), max(syncs), fill)


def quantisation_us(pp: int, microbatches: int, vpp: int, *, traffic: bool = True, fill: bool = True) -> int:
    """Most a plan's float cost exceeds its table objective, in v x T microseconds: each stage time has three
    rounded-down terms (core and two links; with traffic at most four: F, B and two L; interleaved, up to two
    more: the middle stages' schedule stall on unequal chunks and its forward part), the sync one, and the
    objective counts stage times PP + m*v - 1 times, the sync v times and, interleaved (`fill`), each boundary's
    fill v times.  With the defaults, the most over any tables of (PP, m, v): a bound on the float costs less
    this (divided by v) is a bound on the tables."""
    per_stage = (4 if traffic else 3) + (2 if vpp > 1 else 0)
    fills = vpp * (pp - 1) if fill else 0  # one rounded X per boundary, counted v times
    return per_stage * (pp + microbatches * vpp - 1) + vpp + fills


def balance_windows(t: StageTables, delta: float | None) -> np.ndarray | None:
    """The paper's load-balance pruning as [O, 2] inclusive (lo, hi) layer counts per option:
    n within [(1 - delta), (1 + delta)] x w_o x N, w_o the option's share of the cluster's
    profiled speed (per-layer speed of one stage of o over the cluster's summed speed, each GPU
    running its type's fastest option).  None when delta is None (pruning off)."""
    if delta is None:
        return None
    N = t.num_layers
    speed = 1.0 / np.maximum(t.min_layer_us.astype(float), 1.0)  # layers per us of one stage of option o
    total = 0.0
    for ti in range(len(t.types)):
        mask = t.option_type == ti
        if not mask.any():
            continue
        best = max(speed[o] / t.option_gpus[o] for o in np.nonzero(mask)[0])  # per GPU
        total += best * t.budget[ti]
    w = speed / total
    lo = np.floor((1 - delta) * w * N).astype(int)
    hi = np.ceil((1 + delta) * w * N).astype(int)
    return np.stack([np.maximum(lo, 1), np.maximum(hi, 1)], axis=1)
