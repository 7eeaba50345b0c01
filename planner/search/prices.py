"""The prices of the CP-SAT master (solver_models/cpsat/master.py): per stage class (a device type;
flagscale: a device type and a DP) and per price key (the degrees a stage's per-layer figures
depend on, and the recompute setting), the figures the master's relaxation reads, from the cost
model:

    tau_us      least time of one layer on one stage of the class, per layer group (all layers,
                then each layer kind when the model mixes dense and MoE layers): a one-layer middle
                stage, as bounds.option_bound prices it
    stage_us    per-stage time not in the layers (full block recompute)
    first_us    the first stage's extra time (the embedding): a one-layer first stage minus a one-layer
                middle stage; last_us likewise (output layer, loss, MTP)
    max_layers  most layers one stage holds with one micro-batch in flight, against the capacity less
                the framework's overhead and what any stage holds once beside its layers (every stage holds
                at least that many micro-batches; each layer at what it adds: bounds.layer_static_split)
    units       the stage budget of the class's type (megatron: GPUs // (TP x CP x DP) stages;
                flagscale: GPUs // (TP x CP), each stage taking its DP of them, less what no sum of the
                type's stage DPs fills: space.fillable)

Every figure is rounded towards the optimistic side (times down, room up), so the master's value
of a configuration never exceeds its optimum over the integer tables.

The degree master reads, per shape, the prices every recompute setting shares (the least time:
no recompute; the most room: the least activations any setting keeps); a pipeline block reads the
prices per recompute setting, computed when the block is first built.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace
from typing import Callable

from planner.cost.model import CostModel, recomputed_layer_count
from planner.errors import SearchTimeLimitError
from planner.schemas.plan import Recompute
from planner.schemas.search import GlobalChoice, StageOption
from planner.search.bounds import OptionBound, option_bound
from planner.search.space import SearchSpace, Shape, enumerate_shapes, fillable, flagscale_modes, recompute_ladder, \
    stage_options
from planner.search.tables import TableBuilder
from solver_models.cpsat.master import Price, Room, StageClass
from solver_models.tables import check_deadline
from solver_models.scaling import to_us

NONE = Recompute.none()
FULL = Recompute.full("uniform", 1)


class PriceBook:
    """The stage classes and prices of one search (module docstring): `master` holds, per shape,
    the prices every recompute setting shares (for the degree master), `block(key)` the prices per
    recompute setting (for the shape's pipeline block, computed when first asked)."""

    def __init__(self, cost: CostModel, space: SearchSpace, builder: TableBuilder, deadline: float | None = None):
        """`deadline` (time.perf_counter()): building the space past it is SearchTimeLimitError; pricing a
        block past it raises DeadlinePassed."""
        self.cost, self.space, self.builder = cost, space, builder
        self.deadline = deadline
        model = cost.model
        self.budget = cost.cluster.gpus_by_type()
        self.types = list(self.budget)
        self.gpn = {h: cost.domain_gpus(h) for h in self.types}
        self.flagscale = space.runtime_spec.per_stage_meshes
        self.n_layers = model.num_layers
        kinds = sorted(set(model.layer_is_moe))
        self.groups = (self.n_layers,) + (tuple(model.layer_is_moe.count(k) for k in kinds) if len(kinds) > 1 else ())
        self.v_max = max(space.vpp) if not self.flagscale else 1
        if self.flagscale:
            self.settings = flagscale_modes(model, space, cost.training)  # None: none/full per stage
        else:
            self.settings = recompute_ladder(model, space.recompute, cost.training)
        self.shapes: dict[tuple, Shape] = {}
        started = time.perf_counter()
        for shape in enumerate_shapes(model, cost.training, cost.cluster, space, self.gpn):
            self.shapes[self.key(shape.base)] = shape
            if deadline is not None and time.perf_counter() > deadline:
                raise SearchTimeLimitError(
                    f"building the search space ({len(self.shapes)} configuration shapes so far) took "
                    f"{time.perf_counter() - started:.1f} s and reached the time limit; raise --time-limit")
        self.classes = self._classes()
        self.class_of = {c.name: k for k, c in enumerate(self.classes)}
        self.master: dict[tuple, dict[int, Price]] = {}
        self._blocks: dict[tuple, list[dict[int, Price]]] = {}
        self.pricing_s = 0.0

    # ---- keys and classes ----
    def key(self, g: GlobalChoice) -> tuple:
        """The shape degrees of a configuration (the degree master's families, in order)."""
        if self.flagscale:
            return (g.tp, g.cp, g.ep, g.etp, g.samples_per_microbatch)
        return (g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0)

    def _classes(self) -> list[StageClass]:
        if not self.flagscale:
            return [StageClass(h, k) for k, h in enumerate(self.types)]
        pairs = {(o.device_type, o.dp) for s in self.shapes.values() for o in self._options(s.base, None)}
        pairs = sorted(pairs, key=lambda p: (self.types.index(p[0]), p[1]))
        return [StageClass(f"{h} dp{d}", self.types.index(h), d) for h, d in pairs]

    def _options(self, base: GlobalChoice, setting) -> list[StageOption]:
        c = self.cost
        g = replace(base, recompute=setting)
        return stage_options(g, c.model, c.training, c.cluster, self.space, self.gpn)

    def _class_index(self, o: StageOption) -> int:
        return self.class_of[o.device_type if not self.flagscale else f"{o.device_type} dp{o.dp}"]

    def _units(self, g: GlobalChoice, h: str, opts: list[StageOption]) -> int:
        """The stage budget of type h (module docstring); flagscale: what its stages' DPs (those of `opts`
        on h) can fill of it (space.fillable: stages of DP 32, 64 or 128 fill 320 of 344 units)."""
        per = g.tp * g.cp * (1 if self.flagscale else g.dp0)
        units = self.budget[h] // per
        if not self.flagscale:
            return units
        return fillable(tuple(sorted({o.dp for o in opts if o.device_type == h})), units)

    # ---- the degree master's prices: what every recompute setting shares ----
    def price_master(self, deadline: float, priced: Callable[[tuple], None] | None = None) -> bool:
        """Price every shape for the degree master (least time per layer: no recompute; most room:
        the least activations a recompute setting keeps); False if `deadline` passed first.  `priced`: called
        with each shape's key once it is priced (its time not counted in pricing_s)."""
        t0 = time.perf_counter()
        rooms = [r for r in self.settings if r is not None and r.granularity != "none"]
        roomiest = FULL if rooms or self.flagscale else NONE
        for key, shape in self.shapes.items():
            if key in self.master:
                continue
            if time.perf_counter() > deadline:
                self.pricing_s += time.perf_counter() - t0
                return False
            base = shape.base
            gs = replace(self.builder.shape(base), vpp=1, pp=2)
            row = {}
            by_class: dict[int, list[StageOption]] = {}
            options = self._options(base, None if self.flagscale else NONE)
            for o in options:
                by_class.setdefault(self._class_index(o), []).append(o)
            for c, opts in by_class.items():
                # least time per layer: no recompute (flagscale: the least of the stage modes when none is
                # among them)
                fastest = [o for o in opts if o.recompute == NONE] or opts
                taus = [_taus(option_bound(self.cost, gs, o), len(self.groups)) for o in fastest]
                tau = tuple(min(to_us(t[k]) for t in taus) for k in range(len(self.groups)))
                o = opts[0]
                room = option_bound(self.cost, gs, StageOption(o.device_type, o.dp, roomiest), memory_only=True)
                row[c] = Price(
                    tau, 0, 0, 0, _max_layers(room, self.v_max, self.n_layers),
                    self._units(base, o.device_type, options),
                    room=_room(room, len(self.groups), 0.0, None, 0.0))
            self.master[key] = row
            if priced is not None:
                t1 = time.perf_counter()
                priced(key)
                t0 += time.perf_counter() - t1
        self.pricing_s += time.perf_counter() - t0
        return True

    # ---- a pipeline block's prices: per recompute setting ----
    def block(self, key: tuple) -> list[dict[int, Price]]:
        """Per recompute setting (flagscale: mode), the classes' prices under the shape `key`."""
        hit = self._blocks.get(key)
        if hit is None:
            t0 = time.perf_counter()
            base = self.shapes[key].base
            hit = self._blocks[key] = [self._price_setting(base, s) for s in self.settings]
            self.pricing_s += time.perf_counter() - t0
        return hit

    def _price_setting(self, base: GlobalChoice, setting: Recompute | None) -> dict[int, Price]:
        g = replace(base, recompute=setting)
        gs = replace(self.builder.shape(g), vpp=1, pp=2)
        by_class: dict[int, list[StageOption]] = {}
        options = self._options(base, setting)
        for o in options:
            by_class.setdefault(self._class_index(o), []).append(o)
        return {c: self._class_price(g, gs, opts, options) for c, opts in by_class.items()}

    def _class_price(self, g: GlobalChoice, gs, opts: list[StageOption], options: list[StageOption]) -> Price:
        """One class's price: the best of its options (flagscale: the per-stage recompute choices;
        memory: the roomiest option's figures)."""
        bounds = [option_bound(self.cost, gs, o) for o in opts]
        taus = [_taus(b, len(self.groups)) for b in bounds]
        tau = tuple(min(to_us(t[k]) for t in taus) for k in range(len(self.groups)))
        roomy = _least_memory(bounds)
        # the only stage of a pipeline (PP = 1) has no pipeline buffers: the bytes it has beyond
        single = max(0.0, max(option_bound(self.cost, replace(gs, pp=1), o).free_bytes for o in opts)
                     - roomy.free_bytes)
        room = max(_max_layers(replace(b, free_bytes=b.free_bytes + single), self.v_max, self.n_layers)
                   for b in bounds)
        first, last, ends = self._ends(gs, opts[0])
        link_in, link_out, links_by_vpp = self._links(gs, g, opts[0])
        saved = roomy.act_saved_bytes
        k, reruns = self._reruns(opts)
        return Price(tau, min(to_us(b.stage_extra_s) for b in bounds), first, last, room,
                     self._units(g, opts[0].device_type, options), link_in, link_out,
                     room=replace(_room(roomy, len(self.groups), saved, ends,
                                        min(self._transient(gs, o) for o in opts), roomy.block_layers),
                                  single_bytes=single),
                     links_by_vpp=links_by_vpp, block_layers=k, rerun_by_vpp=reruns)

    def _reruns(self, opts: list[StageOption]) -> tuple[int, tuple[tuple[int, tuple[int, ...]], ...]]:
        """Full block recompute of k layers on every option of a class: k, and the layers a stage of
        n layers re-runs per VPP value (the cost model's count).  (0, ()) otherwise: the price's
        per-stage time is then paid once."""
        ks = {o.recompute.num_layers if o.recompute.granularity == "full" and o.recompute.method == "block"
              else None for o in opts}
        if len(ks) != 1 or None in ks or not next(iter(ks)):
            return 0, ()
        rc = opts[0].recompute
        vpps = (1,) if self.flagscale else tuple(sorted(set(self.space.vpp)))
        return int(rc.num_layers), tuple((v, tuple(recomputed_layer_count(rc, n, v) for n in range(self.n_layers + 1)))
                                         for v in vpps)

    def with_sync(self, key: tuple, settings: list[int]) -> list[dict[int, Price]]:
        """The block prices of a shape with the sync bound (Price.sync_us) for the recompute
        settings `settings` (the others keep none: the block allows only these)."""
        rows = self.block(key)
        out = []
        t0 = time.perf_counter()
        base = self.shapes[key].base
        for r, row in enumerate(rows):
            if r not in settings:
                out.append(row)
                continue
            g = replace(base, recompute=self.settings[r])
            opts: dict[int, list[StageOption]] = {}
            for o in self._options(base, self.settings[r]):
                opts.setdefault(self._class_index(o), []).append(o)
            out.append({c: replace(p, sync_us=self._sync(g, opts[c], self._most_layers(p))) for c, p in row.items()})
        self.pricing_s += time.perf_counter() - t0
        return out

    def _transient(self, gs, o: StageOption) -> float:
        """The least buffers a stage on option o keeps once, whatever layers it holds: a one-layer
        middle stage's (the least over the layer kinds)."""
        cores = [self.cost.stage_core(gs, device_type=o.device_type, start=j, end=j + 1, dp=o.dp, recompute=o.recompute,
                                      is_first=False, is_last=False)
                 for j in sorted({self.cost.model.layer_is_moe.index(k) for k in set(self.cost.model.layer_is_moe)})]
        return min(c.fixed_act_bytes * (1.0 + c.cache_fraction) for c in cores)  # with the allocator's cache

    @property
    def prefix(self) -> tuple[tuple[int, ...], ...]:
        """Per layer kind (groups 1..): [n] = its layers among the model's first n layers."""
        return self._ends_counts(list(self.cost.model.layer_is_moe))

    @property
    def suffix(self) -> tuple[tuple[int, ...], ...]:
        """Per layer kind: [n] = its layers among the model's last n layers."""
        return self._ends_counts(list(reversed(self.cost.model.layer_is_moe)))

    def _ends_counts(self, kinds: list[bool]) -> tuple[tuple[int, ...], ...]:
        if len(self.groups) == 1:
            return ()
        return tuple(tuple(sum(1 for x in kinds[:n] if x == kind) for n in range(len(kinds) + 1))
                     for kind in sorted(set(kinds)))

    @property
    def sync_group(self) -> int:
        """The layer group the sync bound counts: the kind with the most layers (all layers when
        the model has one kind)."""
        if len(self.groups) == 1:
            return 0
        return 1 + max(range(len(self.groups) - 1), key=lambda k: self.groups[1 + k])

    def _most_layers(self, p: Price) -> int:
        """Most layers of the sync group a middle stage of the class holds in memory (one micro-batch
        in flight, every chunk's block recompute savings)."""
        return p.holds(1.0, self.groups[self.sync_group], self.sync_group, vpp=self.v_max)

    def _sync(self, g: GlobalChoice, opts: list[StageOption], most: int) -> tuple[int, ...]:
        """[k]: the least exposed DP sync + optimizer step of a middle stage holding exactly k layers
        of the sync group, over the layer ranges that do (and the class's options), from the cost
        model; a plan's busiest middle stage of the class pays at least that.  Only up to `most`
        layers (a stage holds no more in memory); 0 beyond."""
        kinds = self.cost.model.layer_is_moe
        group = self.sync_group
        want = None if group == 0 else sorted(set(kinds))[group - 1]
        best: dict[int, float] = {}
        seen: set = set()
        block = any(o.recompute.granularity == "full" and o.recompute.method == "block" for o in opts)
        shapes = [self.builder.shape(replace(g, pp=3, vpp=v)) for v in (self.space.vpp if block else (1,))]
        # one layer kind: every range of n layers is the same stage, so the ranges from layer 0 are all of them
        # (a 1024-layer model had 524,800 ranges to look at, 15 s, ignoring the time limit)
        for start in (range(len(kinds)) if len(set(kinds)) > 1 else (0,)):
            for end in range(start + 1, len(kinds) + 1):
                key = kinds[start:end]
                if key in seen:
                    continue
                seen.add(key)
                k = len(key) if want is None else sum(1 for x in key if x == want)
                if k > most:
                    continue
                check_deadline(self.deadline)
                for o, gs in itertools.product(opts, shapes):
                    sync_s = self.cost.stage_sync_s(gs, device_type=o.device_type, start=start, end=end, dp=o.dp,
                                                    recompute=o.recompute, is_first=False, is_last=False)
                    best[k] = min(best.get(k, math.inf), sync_s)
        top = self.groups[group]
        return tuple(to_us(best[k]) if k in best else 0 for k in range(top + 1))

    def _links(self, gs, g: GlobalChoice, o: StageOption) -> tuple[int, int, tuple[tuple[int, int, int], ...]]:
        """The least pipeline link into and out of a stage on option o's type and DP (from or to any
        stage class), per micro-batch with all its virtual chunks: the least over the space's VPP values,
        and per VPP value (v, into, out).  A link's L (CostModel.p2p_parts: the message under 1F1B, v
        latencies interleaved; a stage takes at least its core + both L, schemas.pipeline.stage_time_with_links), the
        least over where the boundary lands (the node's own link wherever two stages may share a node)."""
        ends = [(self.types[c.type_index], c.weight if self.flagscale else g.dp0) for c in self.classes]
        mine = (o.device_type, o.dp)
        per_v = []
        for v in ((1,) if self.flagscale else tuple(sorted(set(self.space.vpp)))):
            sv = replace(gs, vpp=v)

            def floor_s(a: tuple[str, int], b: tuple[str, int]) -> float:
                return self.cost.p2p_parts(sv, *a, *b, crosses_nodes=None)[0]
            per_v.append((v, to_us(min(floor_s(end, mine) for end in ends)),
                          to_us(min(floor_s(mine, end) for end in ends))))
        return min(x[1] for x in per_v), min(x[2] for x in per_v), tuple(per_v)

    def _ends(self, gs, o: StageOption) -> tuple[int, int, tuple[float, float, float, float]]:
        """The first and the last stage's extra time over a middle stage, one layer each, and their
        extra bytes (static, per micro-batch in flight: first, then last), the least of them that
        any layer kind shows; the static bytes also the least over stages of one layer and of all the
        model's layers (with Megatron-FSDP an end's unsharded copy in flight is spread over the
        stage's layers: the more layers, the less it adds).  The ends do not depend on the recompute
        setting."""
        def core(first: bool, last: bool, kind: bool, n: int = 1):
            return self.cost.stage_core_of_kinds(gs, device_type=o.device_type, kinds=(kind,) * n, dp=o.dp,
                                                 recompute=NONE, is_first=first, is_last=last)
        sizes = sorted({1, self.n_layers})
        times, ends = [], []
        for kind in sorted(set(self.cost.model.layer_is_moe)):
            mid, first, last = core(False, False, kind), core(True, False, kind), core(False, True, kind)
            times.append((first.time_s - mid.time_s, last.time_s - mid.time_s))

            def static(first_: bool, last_: bool, kind=kind) -> float:
                return min(core(first_, last_, kind, n).held_static_bytes
                           - core(False, False, kind, n).held_static_bytes for n in sizes)
            ends.append((static(True, False), first.held_act_per_microbatch_bytes - mid.held_act_per_microbatch_bytes,
                         static(False, True), last.held_act_per_microbatch_bytes - mid.held_act_per_microbatch_bytes))
        t_first, t_last = (min(t[k] for t in times) for k in range(2))
        extra = tuple(min(e[k] for e in ends) for k in range(4))
        return to_us(t_first), to_us(t_last), extra

    # ---- configurations ----
    def configs_total(self) -> int:
        return sum(s.size for s in self.shapes.values())

    def choice(self, shape: dict[str, int], block: dict[str, int]) -> GlobalChoice:
        """The configuration of a degree-master choice and a pipeline-block choice."""
        d = {**shape, **block}
        setting = self.settings[d["recompute"]]
        if self.flagscale:
            return GlobalChoice("flagscale", d["tp"], d["cp"], d["ep"], d["etp"], d["samples"], d["pp"], 1, 1,
                                setting, first_dp=d.get("first_dp") or None)
        return GlobalChoice("megatron", d["tp"], d["cp"], d["ep"], d["etp"], d["mbs"], d["pp"], d["vpp"], d["dp"],
                            setting)

    def block_degrees(self, g: GlobalChoice) -> dict[str, int]:
        """A configuration's pipeline-block degrees."""
        r = self.settings.index(g.recompute)
        if self.flagscale:
            return {"recompute": r, "pp": g.pp, "first_dp": g.first_dp or 0}
        return {"recompute": r, "pp": g.pp, "vpp": g.vpp}


def _room(b, groups: int, saved: float, ends: tuple[float, float, float, float] | None, transient: float,
          block_layers: int = 0) -> Room:
    """The memory figures of an option bound (bounds.OptionBound) per layer group."""
    static = (b.layer_static_bytes,) + (tuple(k[2] for k in b.kinds) if groups > 1 else ())
    act = (b.layer_act_bytes,) + (tuple(k[3] for k in b.kinds) if groups > 1 else ())
    fs, fa, ls, la = ends or (0.0, 0.0, 0.0, 0.0)
    return Room(b.free_bytes, static, act, saved, transient, fs, fa, ls, la, block_layers)


def _least_memory(bounds: list[OptionBound]) -> OptionBound:
    """One option bound whose memory figures are every option's least (its free bytes the most): the room of a
    class whose stages each choose among the options (FlagScale: a recompute mode per stage) holds at least
    what a stage on any of them holds.  Taking one option's figures is not enough: the option that holds the
    most layers by one count may keep more bytes per layer than another at a different count."""
    kinds = tuple((k[0], k[1], min(b.kinds[i][2] for b in bounds), min(b.kinds[i][3] for b in bounds))
                  for i, k in enumerate(bounds[0].kinds))
    most_saved = max(bounds, key=lambda b: b.block_layers * b.act_saved_bytes)
    return replace(bounds[0], layer_static_bytes=min(b.layer_static_bytes for b in bounds),
                   layer_act_bytes=min(b.layer_act_bytes for b in bounds),
                   free_bytes=max(b.free_bytes for b in bounds), kinds=kinds,
                   block_layers=most_saved.block_layers, act_saved_bytes=most_saved.act_saved_bytes)


def _taus(b, groups: int) -> list[float]:
    """Least time per layer per group: all layers, then each kind (OptionBound.kinds, by kind)."""
    return [b.layer_s] + ([k[1] for k in b.kinds] if groups > 1 else [])


def _max_layers(b, v_max: int, n_layers: int) -> int:
    """Most layers one stage holds with one micro-batch in flight (bounds._room's test at load 1;
    full block recompute spares at most its k x VPP layers' activations)."""
    per = b.layer_static_bytes + b.layer_act_bytes
    room = b.free_bytes + b.block_layers * v_max * b.act_saved_bytes
    if per <= 0:
        return n_layers
    return int(min(n_layers, math.floor(max(room, 0.0) / per * (1 + 1e-12))))
