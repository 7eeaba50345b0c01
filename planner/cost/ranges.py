"""A plan's iteration time with its range, and the evidence behind it.

One evaluation, each mechanism with its own low and high.  The cost model splits every stage's time into named
parts, and the parts into mechanisms (planner/cost/mechanisms.py: dense GEMMs, attention, expert GEMMs,
memory-bound passes, expert dispatch, the TP/CP/DP collectives, pipeline sends, the host's overheads, the
recomputed forward).  The ends of the range are that same evaluation with each mechanism's seconds in each stage
multiplied by its own factor (`RangeEnd`): at the top 1 / (1 - u), at the bottom 1 / (1 + u), where u is the
mechanism's held-out relative uncertainty (profiles/uncertainty.yaml, fitted on the calibration runs by
planner/calibration/uncertainty.py).  The stage times so scaled go through the same schedule (a slower stage
also lengthens the bubble) and the same per-iteration sync, so there is no second formula.  Overlap is taken as
the nominal evaluation found it: a mechanism's exposed seconds are scaled (a transfer the model hides stays
hidden).

Where the evidence ends.  Each mechanism's conditions in each stage (device, link, dispatcher, tokens per
expert, ...: planner/cost/mechanisms.py) are compared with the region its calibration runs cover
(planner/uncertainty.py `Region`).  Outside it the mechanism's uncertainty is multiplied by the fitted
extrapolation factor (`time.extrapolation`) and raised to at least the fitted floor (`time.unmeasured_floor`: a
mechanism that fits its own runs closely is no better known where none ran), and when the mechanism carries at
least UNMEASURED_MIN_SHARE of the plan's time the plan is *extrapolated* and the conditions are named
(`Evidence.unmeasured`).

The top end is a CostModel (`RangeEnd`, a view sharing the nominal model's memo tables) whose `stage_core`,
`p2p_parts` and `evaluate` the search tables are built from when `solve` optimises the pessimistic time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from planner.cost.mechanisms import MECHANISM_OF_PART, MECHANISMS, Conditions, chunk_pattern, schedule_conditions, \
    send_conditions, stage_conditions
from planner.cost.model import END_PARTS, CostModel, GlobalShape, StageCore, sync_sum
from planner.megatron.layout import plan_layout
from planner.profile_tables import ProfileSet
from planner.schemas.cluster import ClusterSpec
from planner.schemas.model import ModelSpec
from planner.schemas.plan import Plan, Recompute
from planner.schemas.training import TrainingSpec
from planner.simulate import simulate_pipeline
from planner.uncertainty import Region, Uncertainty, shipped_uncertainty, user_region

MAX_UNCERTAINTY = 0.8  # a mechanism's seconds are never scaled by more than 1/(1 - 0.8) = 5x
SHARE_STEP = 0.01  # the relative step of the finite difference in `RangeModel.shares`
UNMEASURED_MIN_SHARE = 0.03
"""A mechanism outside its region is named (and the plan marked extrapolated) when it carries at least this share
of the plan's time; below it, it only widens the range."""
EVIDENCE_MIN_SHARE = 0.02
"""A calibration run is evidence for a mechanism's conditions when they carry at least this share of its time (a
little below UNMEASURED_MIN_SHARE, so a run priced again as its own plan is never extrapolated)."""

Multiplier = Callable[[Conditions], float]


class RangeEnd(CostModel):
    """The nominal cost model's evaluation with each mechanism's seconds in each stage multiplied by
    `multiplier(conditions)`: a view that shares the nominal model's specs and memo tables (one evaluator)."""

    def __init__(self, nominal: CostModel, multiplier: Multiplier) -> None:  # shares the nominal's state instead
        self.__dict__.update(nominal.__dict__)
        self._multiplier = multiplier
        self._ends: dict = {}
        self._part_factors: dict = {}

    @property
    def multiplier(self) -> Multiplier:
        """What each mechanism's seconds are multiplied by, from its conditions."""
        return self._multiplier

    def on_cluster(self, cluster: ClusterSpec) -> "RangeEnd":
        """The same range end on another cluster: the nominal model there, each mechanism's seconds multiplied
        as here."""
        return RangeEnd(super().on_cluster(cluster), self._multiplier)

    def part_factors(self, g: GlobalShape, device_type: str, dp: int, recompute: Recompute) -> dict[str, float]:
        """Per time part of a stage of `device_type` with `dp` and `recompute`, its mechanism's multiplier.
        Memoised by what the stage's conditions read (mechanisms.stage_conditions: the degrees below, the samples
        per micro-batch of one DP rank, the recompute's granularity), not by the whole shape: the search asks for
        the same stage under many PP, VPP and global-batch values."""
        key = (g.tp, g.cp, g.ep, g.etp, g.sequence_parallel, self.stage_mbs(g, dp), device_type, dp,
               recompute.granularity)
        hit = self._part_factors.get(key)
        if hit is None:
            conditions = stage_conditions(self, g, device_type, dp, recompute)
            hit = self._part_factors[key] = {part: self._multiplier(conditions[m])
                                             for part, m in MECHANISM_OF_PART.items() if m in conditions}
        return hit

    def stage_core(self, g: GlobalShape, *, device_type: str, start: int, end: int, dp: int, recompute: Recompute,
                   is_first: bool, is_last: bool) -> StageCore:
        key = (g, device_type, self._layer_is_moe[start:end], dp, recompute.label, is_first, is_last)
        hit = self._ends.get(key)
        if hit is None:
            core = super().stage_core(g, device_type=device_type, start=start, end=end, dp=dp, recompute=recompute,
                                      is_first=is_first, is_last=is_last)
            hit = self._ends[key] = _scaled(core, self.part_factors(g, device_type, dp, recompute))
        return hit

    def _sync_total(self, g: GlobalShape, device_type: str, dp: int, recompute: Recompute, dp_s: float,
                    optimizer_s: float, overhead_s: float) -> float:
        """The scaled sync parts (as `_scaled` scales a core's), summed as StageCore.sync_s sums them."""
        return sync_sum(*_scaled_sync(self.part_factors(g, device_type, dp, recompute), dp_s, optimizer_s,
                                      overhead_s))

    def chunk_stall_share(self, g: GlobalShape, num_layers: int) -> float:
        share = super().chunk_stall_share(g, num_layers)  # of this end's own (scaled) stage time
        return share * self._multiplier(schedule_conditions(g, num_layers)) if share else 0.0

    def p2p_parts(self, g: GlobalShape, a_type: str, a_dp: int, b_type: str, b_dp: int, *,
                  crosses_nodes: bool | None) -> tuple[float, float]:
        floor, traffic = super().p2p_parts(g, a_type, a_dp, b_type, b_dp, crosses_nodes=crosses_nodes)
        f = self._multiplier(send_conditions(self, g, a_type, a_dp, b_type))
        return floor * f, traffic * f


def _scaled(core: StageCore, factor: dict[str, float]) -> StageCore:
    """`core` with each time part's seconds multiplied by `factor` (a part not in it keeps its seconds), the
    forward and backward in proportion, the per-iteration sync by its parts' factors."""
    parts = tuple((name, sec * factor.get(name, 1.0)) for name, sec in core.parts)
    before = sum(sec for _, sec in core.parts)
    ratio = sum(sec for _, sec in parts) / before if before > 0 else 1.0
    f = factor.get
    dp_s, optimizer_s, overhead_s = _scaled_sync(factor, core.dp_comm_s, core.optimizer_s, core.iteration_overhead_s)
    return StageCore(**{  # dataclasses.replace, without its per-field introspection (the search calls this a lot)
        **core.__dict__, "parts": parts, "forward_s": core.forward_s * ratio, "backward_s": core.backward_s * ratio,
        "compute_s": core.compute_s * ratio, "recompute_s": core.recompute_s * f("recompute", 1.0),
        "tp_comm_s": core.tp_comm_s * f("tp_comm", 1.0), "cp_comm_s": core.cp_comm_s * f("cp_comm", 1.0),
        "ep_comm_s": core.ep_comm_s * f("ep_comm", 1.0), "dp_comm_s": dp_s,
        "ep_hidden_s": (core.ep_hidden_s[0] * f("ep_comm", 1.0), core.ep_hidden_s[1] * f("ep_comm", 1.0)),
        "optimizer_s": optimizer_s, "iteration_overhead_s": overhead_s})


def _scaled_sync(factor: dict[str, float], dp_comm_s: float, optimizer_s: float,
                 overhead_s: float) -> tuple[float, float, float]:
    """A stage's per-iteration sync parts (exposed DP sync, optimizer step, fixed host time) each multiplied by its
    mechanism's factor: the one scaling of them, for a scaled core (_scaled) and a sync alone (_sync_total)."""
    f = factor.get
    return dp_comm_s * f("dp_sync", 1.0), optimizer_s * f("optimizer", 1.0), overhead_s * f("iteration_overhead", 1.0)


@dataclass(frozen=True)
class Evidence:
    """Whether the plan leans on mechanisms outside what the calibration runs measured, and which: per
    mechanism its conditions in words a user can act on, and what the runs nearest to them measured."""

    extrapolated: bool
    unmeasured: tuple[tuple[str, str], ...] = ()  # (conditions, what the calibration runs cover instead)

    def to_json(self) -> dict:
        return {"extrapolated": self.extrapolated, "unmeasured": [f"{what} ({why})" for what, why in self.unmeasured]}


@dataclass(frozen=True)
class TimeRange:
    """Iteration time: the nominal (the cost model's) and the range around it, seconds; with the evidence and,
    per mechanism, the seconds its uncertainty alone adds at the top of the range (largest first)."""

    low_s: float
    nominal_s: float
    high_s: float
    evidence: Evidence | None = None
    widening_s: tuple[tuple[str, float], ...] = ()

    def contains(self, seconds: float) -> bool:
        return self.low_s <= seconds <= self.high_s

    def overlaps(self, other: "TimeRange") -> bool:
        return self.low_s <= other.high_s and other.low_s <= self.high_s


class RangeModel:
    """The nominal cost model and the two ends of its range over the same inputs, with the evidence region
    (the shipped calibration's and the user's own measured runs from `--profiles`)."""

    def __init__(self, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, profiles: ProfileSet, *,
                 memory_headroom: float | None = None, uncertainty: Uncertainty | None = None) -> None:
        self.uncertainty = uncertainty or shipped_uncertainty()
        self.region: Region = self.uncertainty.region + user_region(profiles.evidence_files)
        self.nominal = CostModel(model, training, cluster, profiles, memory_headroom=memory_headroom)
        self._spreads: dict[Conditions, float] = {}
        self.high = RangeEnd(self.nominal, lambda c: 1.0 / (1.0 - self.spread(c)))
        self.low = RangeEnd(self.nominal, lambda c: 1.0 / (1.0 + self.spread(c)))

    def spread(self, c: Conditions) -> float:
        """The relative uncertainty of the mechanism's seconds in conditions `c`: its held-out figure; outside the
        region that times the extrapolation factor, and at least the unmeasured floor."""
        hit = self._spreads.get(c)
        if hit is None:
            u = self.uncertainty.mechanisms.get(c.mechanism, 0.0)
            if not self.region.covers(c):
                u = max(u * self.uncertainty.extrapolation, self.uncertainty.unmeasured_floor)
            hit = self._spreads[c] = min(MAX_UNCERTAINTY, u)
        return hit

    def plan_conditions(self, plan: Plan) -> list[Conditions]:
        """Every mechanism's conditions in every place of the plan (stages, pipeline links), each once."""
        g = GlobalShape.of(plan)
        out: dict[Conditions, None] = {}
        for i, st in enumerate(plan.stages):
            out.update(dict.fromkeys(stage_conditions(self.nominal, g, st.device_type, st.dp, st.recompute).values()))
            out[schedule_conditions(g, st.num_layers)] = None
            if i + 1 < plan.pp:
                out[send_conditions(self.nominal, g, st.device_type, st.dp, plan.stages[i + 1].device_type)] = None
        return list(out)

    def shares(self, plan: Plan, nominal_s: float | None = None) -> dict[Conditions, float]:
        """Per conditions of the plan, the share of its iteration time they carry: d ln T / d ln(seconds), by a
        finite difference of the one evaluation (overlaps, the bubble and the sync count as they do in T)."""
        base = nominal_s if nominal_s is not None else self.nominal.evaluate(plan).iteration_time_s
        out = {}
        for c in self.plan_conditions(plan):
            t = RangeEnd(self.nominal, lambda x, c=c: 1.0 + SHARE_STEP if x == c else 1.0).evaluate(plan)
            out[c] = max(0.0, (t.iteration_time_s / base - 1.0) / SHARE_STEP)
        return out

    def evidence(self, plan: Plan, shares: dict[Conditions, float]) -> Evidence:
        out = [(self._words(plan, c), self.region.why_not(c))
               for c, s in sorted(shares.items(), key=lambda kv: -kv[1])
               if s >= UNMEASURED_MIN_SHARE and not self.region.covers(c)]
        return Evidence(extrapolated=bool(out), unmeasured=tuple(out))

    def _words(self, plan: Plan, c: Conditions) -> str:
        """The conditions in words; an unequal-chunk schedule with its chunks and this plan's simulated stall."""
        if c.mechanism != "pipeline_schedule" or plan.vpp == 1:
            return c.words()
        pattern = "/".join(map(str, chunk_pattern(plan)))
        return (f"{c.words()} (VPP {plan.vpp}, {pattern} layers per chunk on the fullest rank): Megatron's schedule "
                f"stalls on them, priced from its simulation on equal ranks; simulated with this plan's own stages, "
                f"{100 * schedule_stall(self.nominal, plan):.0f}% of the pipeline")

    def widening(self, plan: Plan, nominal_s: float) -> tuple[tuple[str, float], ...]:
        """Per mechanism, the seconds its uncertainty alone adds at the top of the range, largest first."""
        out = []
        for mech in MECHANISMS:
            end = RangeEnd(self.nominal,
                           lambda c, n=mech.name: 1.0 / (1.0 - self.spread(c)) if c.mechanism == n else 1.0)
            added = end.evaluate(plan).iteration_time_s - nominal_s
            if added > 0:
                out.append((mech.name, added))
        return tuple(sorted(out, key=lambda kv: -kv[1]))

    def time_range(self, plan: Plan, nominal=None) -> TimeRange:
        """The plan's range, with its evidence and what widens it (`nominal`: its PlanCost, when known)."""
        nominal_s = (nominal or self.nominal.evaluate(plan)).iteration_time_s
        return TimeRange(low_s=self.low.evaluate(plan).iteration_time_s, nominal_s=nominal_s,
                         high_s=self.high.evaluate(plan).iteration_time_s,
                         evidence=self.evidence(plan, self.shares(plan, nominal_s)),
                         widening_s=self.widening(plan, nominal_s))



STALL_MICROBATCH_ROUNDS = 4
"""`schedule_stall` simulates at most this many rounds of PP micro-batches: the stall per micro-batch is a steady
state, so its share settles within a few rounds and a long iteration is not simulated op by op."""


def schedule_stall(cost: CostModel, plan: Plan) -> float:
    """How much slower Megatron's interleaved schedule runs the plan's pipeline than the schedule formula without
    the stall (planner/cost/model.py `combine`, each stage's `chunk_stall` left out), as a fraction, by simulating
    the plan's own stages with their chunks (planner/simulate.py, sends left out): each chunk takes its decoder
    layers' share of its rank's layer time, the embedding the first rank's first chunk, the output layer and loss
    the last rank's last; 0 under 1F1B.  What the estimate prices for the stall is the simulation on equal ranks
    (`chunk_stall_layers`); this is the plan's own, which unequal ranks can raise."""
    if plan.vpp == 1 or plan.pp == 1:
        return 0.0
    m = min(plan.num_microbatches, STALL_MICROBATCH_ROUNDS * plan.pp)
    m -= m % plan.pp
    if m < plan.pp:
        return 0.0
    stages = cost.evaluate(plan).stages
    layers = [stage.count("t") for stage in plan_layout(plan)]
    pp, v = plan.pp, plan.vpp
    weights = [0.0] * (pp * v)
    fwd, bwd = [], []
    for r, st in enumerate(stages):
        parts = dict(st.parts)
        stall = parts.get("chunk_stall", 0.0)
        keep = (st.time_s - stall) / st.time_s if st.time_s > 0 else 1.0
        fwd.append(st.forward_s * keep)
        bwd.append(st.backward_s * keep)
        ends = {name: parts.get(name, 0.0) for name in END_PARTS}
        mine = [layers[c * pp + r] for c in range(v)]
        body = st.time_s - stall - sum(ends.values())
        for c in range(v):
            weights[c * pp + r] = body * mine[c] / sum(mine) if sum(mine) else body / v
        weights[r] += ends["embedding"]  # chunk 0 of rank r
        weights[(v - 1) * pp + r] += ends["logits_loss"] + ends["mtp_proj"]
    times = [f + b for f, b in zip(fwd, bwd)]
    formula = sum(times) / v + (m - 1.0 / v) * max(times)
    simulated = simulate_pipeline(fwd, bwd, m, schedule="interleaved", vpp=v, chunk_layers=weights).iteration_time_s
    return simulated / formula - 1.0
