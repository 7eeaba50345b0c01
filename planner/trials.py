"""Trials instead of faith: the few plans to run briefly when the cost model cannot vouch for its pick.

`solve` proposes trials when its pick rests on mechanisms the calibration runs never measured (its range's
evidence is extrapolated, planner/cost/ranges.py), or when its range overlaps the user's plan's or that of
another plan the search found: then the predicted gain is not one the model can tell from its error.  The
trials are the pick, the user's plan (when Megatron would start it, even if the model predicts it does not fit
in memory: the run tells), and up to TRIAL_CANDIDATES other plans, each of another shape (TP, CP, EP, PP, VPP,
micro-batch): from the plans the search kept (`SearchResult.runners_up`, one per configuration) and the pick at
other EP sizes and micro-batches (`_probes`), one at a time the one that most narrows the mechanisms the fit
could not tell apart from the trials chosen so far (the sum over mechanisms of log(posterior sd / prior sd),
planner/calibration/trials.py `posterior_sd`; the search's order breaks ties).  Trials whose mechanisms'
shares vary alike (the pick at EP 8 and at EP 4: expert dispatch and the expert GEMMs each about 13%) cannot
tell which one is off; the pick at EP 1 (no dispatch) can.  FlagScale's auto-tuner and NeMo's auto-configurator run
grids of trials; this runs only the few the model cannot separate.

On a mixed cluster the fit has a part per device type for each mechanism that runs on one device
(planner/calibration/trial_units.py), and the candidates are scored on those parameters, with each plan's shares
per mechanism and type (`unit_shares`: a type whose stage is the slowest carries its share m times over, the
others' stages only the pipeline's fill), averaged over multipliers drawn from the prior: a plan whose stages are
near a tie rests on one type or the other depending on the truth, and trials that all rest on one type leave the
split between the types to the fit's prior.  The pool then also holds the pick with a decoder layer moved across
each boundary between two types' stages (`_split_probes`, where the checker accepts it), and trials differ by
shape or by the layers each type holds (`_kind`).  On one device type nothing of this applies.

`solve --out DIR` writes each as DIR/trials/<name>/: the launcher files (planner/launcher/, the same flags as
the plan's launch, with TRIAL_OVERRIDES: a few dozen iterations, no checkpoint saved or loaded, one log per
host, `train-<host>.log` beside launch.sh) and a plan.json (as `solve --out` writes one, so `emit` and
`calibrate --trials` read it).  `cli.py calibrate --trials DIR --out CALIB` reads the logs, fits one
multiplier per mechanism on them jointly (planner/calibration/trials.py) and `solve --profiles CALIB` re-prices
and re-picks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.calibration.trial_units import Parameters, parameters, prior_sds, unit_shares
from planner.calibration.trials import parameters_posterior_sd
from planner.checker import plan_problems
from planner.cost.mechanisms import MECHANISM_OF_PART
from planner.cost.model import PlanCost
from planner.cost.ranges import TimeRange
from planner.launcher import LaunchOverrides
from planner.errors import PlannerInputError
from planner.inputs.files import parse_json, read_text
from planner.inputs.plan_file import same_made_for
from planner.schemas.plan import Plan

TRIAL_ITERATIONS = 30
"""Iterations of a trial: the first few are warm-up (calibrate skips them), the rest give a median."""
TRIAL_CANDIDATES = 2
"""Plans besides the pick and the user's plan."""
PRIOR_DRAWS = 32
"""On several device types, the multipliers from the fit's prior at which `_candidate_trials` takes each plan's
shares (seeded: the same inputs propose the same trials)."""
TRIAL_LOG = "train"
TRIAL_OVERRIDES = LaunchOverrides(
    added=("--train-iters", str(TRIAL_ITERATIONS), "--eval-iters", "0", "--log-interval", "1", "--log-throughput"),
    removed=frozenset({"--save", "--save-interval", "--non-persistent-save-interval", "--load",
                       "--pretrained-checkpoint", "--train-samples", "--lr-decay-samples", "--lr-warmup-samples",
                       "--lr-wsd-decay-samples", "--rampup-batch-size", "--exit-interval", "--exit-duration-in-mins",
                       "--eval-interval"}),
    log_name=TRIAL_LOG,
)
"""What a trial's launch changes: TRIAL_ITERATIONS iterations, every one logged with its throughput, no
evaluation; no checkpoint saved (Megatron saves only with --save) or loaded (a loaded iteration count would end
the trial before it starts); the sample-based schedule flags Megatron refuses beside --train-iters
(arguments.py: "expected iteration-based training") and a batch ramp-up dropped."""


@dataclass(frozen=True)
class Trial:
    """One plan to measure: `name` (its directory under trials/), `role` (pick, yours, candidate)."""

    name: str
    role: str
    plan: Plan
    cost: PlanCost
    time_range: TimeRange
    why: str


def _shape(plan: Plan) -> tuple:
    return (plan.tp, plan.cp, plan.ep, plan.pp, plan.vpp, plan.mbs)


@dataclass(frozen=True)
class MeasuredPlan:
    """A plan a trial measured (`calibrate --trials` wrote it into measured_plans.json of a --profiles directory)."""

    name: str
    measured_s: float
    source: str


def measured_plans(outcome) -> dict[Plan, MeasuredPlan]:
    """The plans trials measured for this run on this cluster (the same `made_for` record as the outcome's: model,
    run and cluster digests), from measured_plans.json of the --profiles directories; a later directory's
    measurement of a plan replaces an earlier one's."""
    profiles = outcome.profiles
    if profiles is None or not profiles.measured_plan_files:
        return {}
    out: dict[Plan, MeasuredPlan] = {}
    for path in profiles.measured_plan_files:
        doc = parse_json(read_text(path, "--profiles"), "--profiles", path)
        entries = doc.get("measured_plans") if isinstance(doc, dict) else None
        if not isinstance(entries, list):
            raise PlannerInputError("--profiles", f"{path}: expected an object with a measured_plans list (as "
                                                  "calibrate --trials writes it)")
        for k, e in enumerate(entries):
            if not isinstance(e, dict) or not same_made_for(e.get("made_for"), outcome.run, outcome.cluster, profiles):
                continue
            try:
                plan, seconds = Plan.from_json(e["plan"]), float(e["measured_s"])
            except (KeyError, TypeError, ValueError) as exc:
                raise PlannerInputError("--profiles", f"{path}: measured_plans[{k}] is not a measured plan ({exc}); "
                                                      "write it again with calibrate --trials") from None
            if not (math.isfinite(seconds) and seconds > 0):
                raise PlannerInputError("--profiles", f"{path}: measured_plans[{k}].measured_s must be a positive "
                                                      f"number of seconds, not {e['measured_s']!r}")
            out[plan] = MeasuredPlan(str(e.get("name", k)), seconds, path)
    return out


def trial_reasons(pick: TimeRange, yours: TimeRange | None, others: list[TimeRange], *,
                  measured: bool = False) -> list[str]:
    """Why the pick needs a trial (empty: it does not): unmeasured mechanisms (unless a trial measured the pick
    itself, `measured`), ranges that overlap."""
    out = []
    if pick.evidence is not None and pick.evidence.extrapolated and not measured:
        out.append("the pick rests on mechanisms no calibration run measured ("
                   + "; ".join(what for what, _ in pick.evidence.unmeasured) + ")")
    if yours is not None and yours.overlaps(pick):
        out.append("its range overlaps your plan's")
    close = sum(r.overlaps(pick) for r in others)
    if close:
        out.append(f"its range overlaps that of {close} other plan(s) the search found")
    return out


def propose_trials(outcome, user=None) -> tuple[list[Trial], str]:
    """The trials for a `solve` outcome (planner/api.py SolveOutcome) and the user's plan (planner/user_plan.py
    UserPlan, or None), and why (see the module docstring).  No trials when the pick is measured and no range
    overlaps it."""
    pick_plan, pick_cost, pick_range = outcome.plans[0], outcome.costs[0], outcome.ranges[0]
    mine = user if (user is not None and user.time_range is not None and not user.violations
                    and user.cannot_run is None) else None
    candidates = _candidates(outcome)
    measured = measured_plans(outcome)  # a plan a trial measured needs none again
    others = [o for o in candidates if o[0] not in measured]
    settled = pick_plan in measured  # then only plans no trial measured can still call for one
    if settled:
        known = [(p, r) for p, _, r in candidates if p in measured]
        if mine is not None and mine.plan in measured:
            known, mine = known + [(mine.plan, mine.time_range)], None
    reasons = trial_reasons(pick_range, mine.time_range if mine else None,
                            [r for _, _, r in (others if settled else candidates)], measured=settled)
    if not reasons:
        if settled:
            return [], "no trial needed: " + _measured_text(measured, pick_plan, pick_range, known)
        return [], ("no trial needed: the pick's mechanisms were all measured and its range overlaps no other "
                    "plan's")
    trials = [Trial("pick", "pick", pick_plan, pick_cost, pick_range, "the plan solve picked")]
    short = outcome.cluster.shortfalls(mine.plan.gpus_by_type()) if mine is not None else []
    if short and mine.plan != pick_plan and mine.plan not in measured:
        # a stage over two types that pool into none (H800 and A100 in one DP group) is priced on the slower, which
        # places no launcher: the user's own script measures it
        reasons.append(f"your plan is not among the trials: a stage of it spans two device types and is priced on "
                       f"the slower, so that {short[0].replace('the plan uses', 'it uses')}, and no launcher the "
                       f"planner writes can place it; measure it with your own script for {TRIAL_ITERATIONS} "
                       "iterations")
        mine = None
    if mine is not None and mine.plan != pick_plan and mine.plan not in measured:
        fit = "" if mine.cost.fits else ("; predicted not to fit the usable memory, which the trial measures too "
                                         "(a run that ran says more than the memory model)")
        trials.append(Trial("yours", "yours", mine.plan, mine.cost, mine.time_range, f"your plan ({user.source}){fit}"))
    kinds = {_kind(t.plan) for t in trials}
    pool = [(p, c, "its range overlaps the pick's" if r.overlaps(pick_range) else "another shape the search found")
            for p, c, r in others if _kind(p) not in kinds]
    pool += [o for o in _probes(outcome) + _split_probes(outcome)
             if _kind(o[0]) not in kinds | {_kind(p) for p, _, _ in pool} and o[0] not in measured]
    trials += _candidate_trials(outcome, trials, pool)
    trials = [_beyond_the_search(outcome, t) for t in trials]
    return trials, "; ".join(reasons)


def _candidate_trials(outcome, trials: list[Trial], pool: list[tuple[Plan, PlanCost, str]]) -> list[Trial]:
    """Up to TRIAL_CANDIDATES plans of `pool`, one at a time the one that most narrows the parameters the fit
    would have after `trials` and the ones chosen so far (`_narrowing`, with the fit's own parameters and priors:
    planner/calibration/trial_units.py `parameters`, `prior_sds`); the first of equals (the search's order).  On
    one device type the parameters are the mechanisms and a plan's sensitivities its mechanisms' shares
    (`_mechanism_shares`).  On several, a mechanism that runs on one device has a part per type, a plan's
    sensitivities are its shares per mechanism and type (trial_units.py `unit_shares`), and the narrowing is the
    mean over PRIOR_DRAWS multipliers drawn from the prior: which stage is the slowest, and so which type a plan's
    time rests on, can change within it (a 6/2 H800/A100 split whose H800 stage is 5% the slower rests on the
    A100 once its expert GEMMs are x1.2), and a trial that informs a type only at the shipped multipliers would
    leave the fit's split to its prior."""
    ranges = outcome.range_model
    profiles = ranges.nominal.profiles
    plans = [t.plan for t in trials] + [p for p, _, _ in pool]
    sd, device_sd = prior_sds([(ranges, p) for p in plans])
    params = parameters(sorted({profiles.canonical_name(d) for p in plans for d in p.member_types()}), sd, device_sd)
    priced = [(t.plan, t.cost) for t in trials] + [o[:2] for o in pool]
    if params.per_device:
        draws = _prior_draws(params)
        shares = {p: [unit_shares(c, p, profiles, d) for d in draws] for p, c in priced}
    else:
        shares = {p: [_mechanism_shares(c)] for p, c in priced}
    chosen: list[Trial] = []
    while pool and len(chosen) < TRIAL_CANDIDATES:
        before = [shares[t.plan] for t in trials + chosen]

        def narrowing(p: Plan) -> float:
            each = [_narrowing([s[k] for s in before] + [shares[p][k]], params) for k in range(len(shares[p]))]
            return sum(each) / len(each)

        plan, cost, why = min(pool, key=lambda o: narrowing(o[0]))  # the first of equals: the search's order
        pool = [o for o in pool if o[0] is not plan]
        chosen.append(Trial(f"candidate-{len(chosen) + 1}", "candidate", plan, cost, ranges.time_range(plan, cost),
                            why))
    return chosen


def _prior_draws(params: Parameters) -> list[dict[str, float]]:
    """PRIOR_DRAWS log multipliers per unit (`Unit.key`), the parameters drawn from the Gaussian of the prior's
    sds (as `posterior_covariance` takes the prior)."""
    draws = np.random.default_rng(0).standard_normal((PRIOR_DRAWS, len(params.keys))) * params.prior_sd
    return [{u.key: float(v) for u, v in zip(params.units, params.unit_values(d))} for d in draws]


def _narrowing(shares: list[dict[str, float]], params: Parameters) -> float:
    """The sum over the fit's parameters of log(posterior sd / prior sd) after trials of these sensitivities
    (planner/calibration/trials.py `parameters_posterior_sd`): the more negative, the more the trials tell."""
    post = parameters_posterior_sd(shares, params)
    return sum(math.log(post[n] / float(s)) for n, s in zip(params.keys, params.prior_sd))


def _measured_text(measured: dict[Plan, MeasuredPlan], pick: Plan, pick_range: TimeRange,
                   known: list[tuple[Plan, TimeRange]]) -> str:
    """The pick's measurement and those of the measured plans whose ranges overlap the pick's, and where from."""
    m = measured[pick]
    close = [measured[p] for p, r in known if r.overlaps(pick_range)]
    text = f"trial {m.name} measured the pick at {m.measured_s:.3f} s ({m.source})"
    if close:
        text += ("; the plans whose ranges overlap the pick's were measured too (" + ", ".join(
            f"{o.name} at {o.measured_s:.3f} s" for o in close) + "): the measurements decide between them")
    return text


def _beyond_the_search(outcome, trial: Trial) -> Trial:
    """A candidate predicted better than the pick on the searched objective lies outside the space the search
    covered (its certificate, OPTIMAL included, says nothing beyond it): its `why` says so, and for a micro-batch
    the search did not try, how to search it."""
    if trial.role != "candidate":
        return trial
    pick = outcome.ranges[0]
    pessimistic = outcome.objective == "pessimistic"
    mine, theirs = ((trial.time_range.high_s, pick.high_s) if pessimistic
                    else (trial.cost.iteration_time_s, outcome.costs[0].iteration_time_s))
    if mine >= theirs:
        return trial
    what = "the top of its range" if pessimistic else "its time"
    extra = (f"; {what} ({mine:.3f} s) is below the pick's ({theirs:.3f} s): it lies outside the space the search "
             "covered, whose certificate says nothing beyond it")
    space = outcome.space
    if space is not None and trial.plan.mbs not in space.mbs:
        extra += (f" (micro-batch {trial.plan.mbs}; the search tried {', '.join(map(str, space.mbs))}: "
                  f"`solve --mbs {trial.plan.mbs}` searches it)")
    return Trial(trial.name, trial.role, trial.plan, trial.cost, trial.time_range, trial.why + extra)


def _mechanism_shares(cost: PlanCost) -> dict[str, float]:
    """The share of the plan's time each mechanism carries, from its priced breakdown (first order: one
    evaluation, where `RangeModel.shares` prices one per conditions)."""
    out: dict[str, float] = {}
    for part, s in cost.time_shares().items():
        if part in MECHANISM_OF_PART:
            out[MECHANISM_OF_PART[part]] = out.get(MECHANISM_OF_PART[part], 0.0) + s
    return out


def _kind(plan: Plan) -> tuple:
    """What makes two trials different: the shape, and for a plan on several device types, the decoder layers
    each type holds (its share of the plan's time)."""
    layers: dict[str, int] = {}
    for s in plan.stages:
        layers[s.device_type] = layers.get(s.device_type, 0) + s.num_layers
    return _shape(plan) + (tuple(sorted(layers.items())) if len(layers) > 1 else ())


def _split_probes(outcome) -> list[tuple[Plan, PlanCost, str]]:
    """The pick with one decoder layer moved across each boundary between two stages of different device types,
    each way, where the checker accepts it (Megatron's rules, the runtime's, memory): plans with another share of
    each type, where the search's other plans and the probes often keep the pick's split, so that the trials can
    tell a mechanism's multiplier on one type from the other's (planner/calibration/trial_units.py)."""
    pick, cost_model = outcome.plans[0], outcome.range_model.nominal
    limiting = cost_model.profiles.limiting_member
    out = []
    for i in range(pick.pp - 1):
        if limiting(pick.stages[i].device_type) == limiting(pick.stages[i + 1].device_type):
            continue
        for src, dst in ((i, i + 1), (i + 1, i)):
            layers = [s.num_layers + (k == dst) - (k == src) for k, s in enumerate(pick.stages)]
            try:
                plan = Plan.from_json({**pick.model_dump(), "layout": None, "stages": [
                    {**s.model_dump(), "num_layers": n} for s, n in zip(pick.stages, layers)]})
            except ValueError:
                continue
            problems, cost = plan_problems(cost_model, plan)
            if not problems:
                out.append((plan, cost, f"the pick with a decoder layer moved from its {pick.stages[src].device_type} "
                                        f"stage to its {pick.stages[dst].device_type} stage: measures each device "
                                        "type's mechanisms in another proportion"))
    return out


def _probes(outcome) -> list[tuple[Plan, PlanCost, str]]:
    """The pick at each other expert-parallel size and at half and twice its micro-batch, where the checker
    accepts it: plans the search need not have kept, which move expert dispatch, the expert GEMMs' shape and the
    host's share apart from the rest, so that the trials can tell those mechanisms apart."""
    pick, cost_model = outcome.plans[0], outcome.range_model.nominal
    experts = cost_model.model.num_experts or 1
    variants = [("EP", {"ep": e}) for e in range(1, experts + 1) if experts % e == 0 and e != pick.ep]
    variants += [("micro-batch", {"mbs": m}) for m in (pick.mbs // 2, 2 * pick.mbs) if m >= 1 and m != pick.mbs]
    out = []
    for what, change in variants:
        try:
            plan = Plan.from_json({**pick.model_dump(), **change})
        except ValueError:
            continue
        problems, cost = plan_problems(cost_model, plan)
        if not problems:
            out.append((plan, cost, f"the pick at {what} {next(iter(change.values()))}: measures what the "
                                    f"pick's mechanisms cost in another proportion"))
    return out


def _candidates(outcome) -> list[tuple[Plan, PlanCost, TimeRange]]:
    """The other plans of the outcome (the alternatives of --top, then the search's runners-up) that the
    checker accepts, each with its cost and the ends of its range (no evidence: that is priced for the chosen
    ones only)."""
    ranges = outcome.range_model
    out, seen = [], {_shape(outcome.plans[0])}
    plans = list(zip(outcome.plans[1:], outcome.costs[1:])) + [(c.plan, None) for c in outcome.result.runners_up]
    for plan, cost in plans:
        if _shape(plan) in seen:
            continue
        problems, cost = plan_problems(ranges.nominal, plan) if cost is None else ([], cost)
        if problems:
            continue
        seen.add(_shape(plan))
        out.append((plan, cost, TimeRange(low_s=ranges.low.evaluate(plan).iteration_time_s,
                                          nominal_s=cost.iteration_time_s,
                                          high_s=ranges.high.evaluate(plan).iteration_time_s)))
    return out
