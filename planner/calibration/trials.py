"""Calibrate from trials: the logs of the short runs `solve --out DIR` proposed (planner/trials.py), one
multiplier per mechanism (and per device type, where the trials use several) fitted on all of them jointly.

Reading.  DIR/trials/<name>/ (or DIR/<name>/) holds the trial's plan.json (the plan, the run and the cluster it
was made for) and the logs its launch.sh wrote, one per host (`train-<host>.log`).  Megatron's last rank prints
the iteration lines, so the log holding them is the trial's measurement: its median steady iteration time after
TRIAL_SKIP warm-up iterations (planner/calibration/calibrate.py `measurement_from_log`).  A trial without a log
(not run yet) is left out, and said so.

Fitting.  Each mechanism k that correction kinds scale (planner/cost/mechanisms.py) gets one multiplier exp(t_k)
on its kinds' factors, for every device of the trials.  The t_k are the maximum a posteriori estimate under
    log T_j(t) - log M_j ~ N(0, OBSERVATION_SD^2)     (T_j: the cost model's time of trial j, M_j: measured)
    t_k ~ Laplace(0, s_k / sqrt 2),  s_k = -log(1 - u_k)   (u_k: the mechanism's uncertainty on these plans)
where u_k is the largest the range model gives the mechanism in any trial's conditions (`RangeModel.spread`: the
held-out figure, times the extrapolation factor and at least the unmeasured floor where no calibration run measured
them).  So the measured discrepancy goes to the mechanisms the shipped calibration knows least and the trials tell
apart (a mechanism every trial leans on alike is not separated from the others, and stays near 1).  The prior is a
Laplace one (standard deviation s_k): a few trials against eight mechanisms leave the fit underdetermined, and a
Gaussian prior then spreads a discrepancy over every mechanism whose shares vary alike across the trials, with
opposite signs where they cancel (on the test's trials, one mechanism twice as slow came out as x1.41 on it, x1.73
and x0.85 on two others); a mechanism's error is more often one kernel or link off than all of them a little, which
the Laplace prior prefers (the fewest mechanisms that explain the logs).

Gauss-Newton on log T with a finite-difference Jacobian of the one evaluator (each step prices every trial
with each multiplier moved by FD_STEP), the prior's |t_k| made locally quadratic (sqrt(t_k^2 + eps_k^2), eps_k
from s_k down to EPS_FLOOR), each step halved until the objective falls (the evaluator has kinks: the host
floor), until no multiplier moves by more than 0.1%.  `planner/trials.py` chooses the trials so that the fit
can tell the mechanisms apart (`posterior_sd`; with several device types, the parameters below:
`parameters_posterior_sd`).

Several device types.  Where the trials' plans use more than one device type, the mechanisms that run on one
device (their conditions name a stage's device: the GEMMs, attention, the memory-bound passes, expert dispatch and
the TP/CP/DP collectives among one type's GPUs, the host) get a multiplier per type, exp(t_k + t_kd): a part common
to the types and each type's own, each with the Laplace prior above (t_kd's s_kd over the conditions of type d's
stages); the pipeline sends, over the link between the types, keep one (planner/calibration/trial_units.py).  An
A100 whose expert GEMMs run at x1.4 the profile beside an H800 as profiled is then one parameter (t_kd on A100),
not smeared over both (tests/test_trials.py: the single multiplier came out as expert GEMMs x0.76 beside
attention x3.5); a mechanism off alike on every type is one parameter too (t_k).  Trials that do not separate the
types (each with the same share of each) fix the types together, not the split: the fit leaves the split to its
prior and the report says so (`confounded`) rather than present it as measured.  On one device type none of this
applies: the parameters, the fit and the report are the single-type ones.

What the trials could not tell.  A few trials fix a few combinations of the multipliers; the rest stays the
prior's.  From the fit's last Jacobian (`identification`), the report gives each multiplier its sd after the trials
and names the mechanisms no trial has (`absent`), those the trials barely narrow (`uninformed`: a discrepancy of
theirs is credited to the others, as the test's expert GEMMs x1.3 went to TP/CP/DP collectives), and the pairs told
apart only partly (`confounded`), in the JSON and in words.  With several device types each of these names the
device type ("expert GEMMs on A100": the device_* keys, and `devices` in each confounded pair), and a mechanism
whose level the trials fix on the types together but not its split between them is a confounded pair of its own.

Writing (`trial_calibration`): corrections.yaml (each kind of each fitted mechanism, each trial device: the
current factor times the multiplier, that device type's own where it has one), evidence.yaml (the conditions the
trials measured: planner/uncertainty.py reads it from `--profiles DIR`, so the measured plans are no longer
extrapolated), measured_plans.json (each trial's plan, what it was made for and its measured time: `solve
--profiles DIR` proposes no trial of a plan measured already, planner/trials.py) and calibration_report.json.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.calibration.calibrate import STATED_OPTIONS, CalibrationResult, choose_run, evidence_cells, \
    measurement_from_log, skipped_step_warnings, stated_differences
from planner.calibration.megatron_log import parse_megatron_log
from planner.calibration.trial_units import FITTED, Parameters, Unit, parameters, prior_sds, scaled_units
# scaled is re-exported: tests/test_trials.py imports it from here
from planner.calibration.trial_units import scaled  # noqa: F401
from planner.cost.mechanisms import BY_NAME
from planner.cost.model import CostModel
from planner.cost.ranges import RangeModel
from planner.errors import PlannerInputError
from planner.inputs.plan_file import load_plan_file, made_for, resolve_plan_inputs
from planner.profile_tables import TIME_CORRECTION_KINDS, ProfileSet
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan

TRIAL_SKIP = 5
"""Warm-up iterations of a trial left out of its median (data loaders, allocator, NCCL set-up)."""
OBSERVATION_SD = 0.02
"""A trial's measured time against the model's, log scale: run-to-run variation of a steady iteration (about
2%; the calibration report calls plans measured within 3% a tie)."""
FD_STEP = 0.05
MAX_STEPS = 20
MAX_HALVINGS = 6
EPS_SHRINK = 0.3
EPS_FLOOR = 1e-3


@dataclass(frozen=True)
class TrialRun:
    """One trial with its measurement."""

    name: str
    plan: Plan
    run: MegatronRun
    cluster: ClusterSpec
    measured_s: float
    log: str
    steady_iterations: int
    solved_s: float | None = None  # what the solve that proposed it predicted (plan.json's iteration_time_s)


PRICED_AGAIN_TOLERANCE = 0.01
"""A trial priced here more than this share away from what its solve predicted was priced with other profiles."""


def _trial_dirs(directory: Path) -> list[Path]:
    root = directory / "trials" if (directory / "trials").is_dir() else directory
    if not root.is_dir():
        raise PlannerInputError("--trials", f"{directory} is not a directory")
    dirs = sorted(d for d in root.iterdir() if (d / "plan.json").is_file())
    if not dirs:
        raise PlannerInputError("--trials", f"{directory}: no trials/<name>/plan.json (solve --out DIR writes them "
                                            "when the pick needs trials)")
    return dirs


def _measured(d: Path, plan: Plan, run: MegatronRun) -> tuple[float, str, int, list[str]] | None:
    """(median steady seconds, log, steady iterations, warnings on its skipped steps) from the log of `d` that
    holds iteration lines; None without one.  A log that states another configuration than the trial's plan (another run's log copied in)
    is refused, as `calibrate --megatron-log` refuses one (`stated_differences`)."""
    best = None
    priced = {"world_size": plan.world_size, "tp": plan.tp, "pp": plan.pp, "cp": plan.cp, "ep": plan.ep,
              "mbs": plan.mbs, "gbs": plan.gbs, "seq_length": run.model.seq_length,
              "num_layers": run.model.num_layers}
    for log in sorted(d.glob("*.log")):
        try:
            parsed = parse_megatron_log(log)
            if not parsed.it_number:
                continue
            m = measurement_from_log(parsed, TRIAL_SKIP, choose_run(parsed, None))
        except PlannerInputError as exc:  # named for --megatron-log; here the log is a trial's
            raise PlannerInputError("--trials", f"{log}: {str(exc).split(': ', 1)[-1]}") from None
        wrong = stated_differences(m, priced)
        if wrong:
            what = "; ".join(f"{STATED_OPTIONS[k].split(' (')[0].lstrip('-')}: the log states {s}, the trial's "
                             f"plan has {p}" for k, s, p in wrong)
            raise PlannerInputError("--trials", f"{log} was run with another configuration than trial {d.name}'s "
                                                f"plan.json ({what}): put each trial's own log in its directory; "
                                                "nothing was written")
        if best is None or m.steady_iterations > best[2]:
            best = (m.iteration_time_s, str(log), m.steady_iterations, skipped_step_warnings(m))
    return best


def read_trials(directory: str | Path, profiles: ProfileSet) -> tuple[list[TrialRun], list[str]]:
    """The trials of `directory` that have a log, and a note for each that has none."""
    runs, notes = [], []
    for d in _trial_dirs(Path(directory)):
        try:
            data = load_plan_file(d / "plan.json")
            found = resolve_plan_inputs(data, model=None, megatron_args=None, megatron_script=None, cluster=None,
                                        profiles=profiles)
        except PlannerInputError as exc:
            raise PlannerInputError("--trials", f"{d / 'plan.json'}: {exc}") from None
        measured = _measured(d, found.plan, found.run)
        if measured is None:
            notes.append(f"trial {d.name}: no log with iteration lines in {d} (not run yet?): left out")
            continue
        solved = data.get("iteration_time_s")
        *measured, warnings = measured
        notes.extend(f"trial {d.name}: {w}" for w in warnings)
        runs.append(TrialRun(d.name, found.plan, found.run, found.cluster, *measured,
                             solved_s=float(solved) if isinstance(solved, (int, float)) and solved > 0 else None))
    if not runs:
        raise PlannerInputError("--trials", f"{directory}: no trial has a log with iteration lines yet; run each "
                                            "trials/<name>/launch.sh first")
    return runs, notes


def _devices(trials: list[TrialRun], profiles: ProfileSet) -> list[str]:
    return sorted({profiles.canonical_name(t) for tr in trials for t in tr.plan.member_types()})


def _log_times(trials: list[TrialRun], profiles: ProfileSet) -> np.ndarray:
    return np.array([math.log(CostModel(tr.run.model, tr.run.training, tr.cluster, profiles, memory_headroom=0.0)
                              .evaluate(tr.plan).iteration_time_s) for tr in trials])


def _priced(trials: list[TrialRun], profiles: ProfileSet) -> list[tuple[RangeModel, Plan]]:
    return [(RangeModel(tr.run.model, tr.run.training, tr.cluster, profiles), tr.plan) for tr in trials]


def prior_sd(trials: list[TrialRun], profiles: ProfileSet) -> dict[str, float]:
    """Per fitted mechanism, s_k (see the module docstring)."""
    return plans_prior_sd(_priced(trials, profiles))


def plans_prior_sd(priced) -> dict[str, float]:
    """s_k over (RangeModel, Plan) pairs: the largest -log(1 - u) the range model gives the mechanism in any
    plan's conditions."""
    return prior_sds(list(priced))[0]


def posterior_covariance(jac: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """The covariance of t the fit has after trials with log-time sensitivities `jac` (trials x mechanisms) and
    prior sds `sd`: the module docstring's model linearised, its prior taken as the Gaussian of the same variance."""
    return np.linalg.inv(jac.T @ jac / OBSERVATION_SD ** 2 + np.diag(1.0 / sd ** 2))


def posterior_sd(shares: list[dict[str, float]], sd: dict[str, float]) -> dict[str, float]:
    """Per fitted mechanism, the sd of t_k the fit would have after trials whose log-time sensitivities are
    `shares` (d log T_j / d t_k: to first order, the mechanisms' shares of each trial's time), with prior sds
    `sd` (`posterior_covariance`).  Mechanisms every trial leans on alike keep their prior sd; trials that vary
    them apart narrow it."""
    return parameters_posterior_sd(shares, parameters([], sd, {}))


def parameters_posterior_sd(shares: list[dict[str, float]], params: Parameters) -> dict[str, float]:
    """Per parameter of `params` (trial_units.py `Parameters.keys`), its sd after trials whose log-time
    sensitivities to the units are `shares` (keyed by `Unit.key`: trial_units.py `unit_shares` on several device
    types, the mechanisms' shares on one), as `posterior_sd` for one type: on several, a type's own part t_kd
    narrows only where the trials' shares of that type vary apart from the other types'."""
    keys = [u.key for u in params.units]
    jac = np.array([[s.get(k, 0.0) for k in keys] for s in shares]).reshape(len(shares), len(keys))
    cov = posterior_covariance(params.jacobian(jac), params.prior_sd)
    return {n: float(math.sqrt(cov[k, k])) for k, n in enumerate(params.keys)}


UNINFORMED_RATIO = 0.7
"""A mechanism whose sd after the trials is still this share of its prior sd or more is one the trials barely
inform: its multiplier stays where the shipped calibration put it, and a discrepancy of its own goes to the
mechanisms the trials do inform (a test: expert GEMMs x1.3 slower beside dispatch x1.8 came out as TP/CP/DP
collectives x1.14).  With several device types the same ratio on the difference of two types' multipliers of one
mechanism, whose level the trials do inform, says that they do not tell the types apart."""
ABSENT_SHARE = 0.01
"""A mechanism below this share of every trial's time is not in the trials at all."""
CONFOUNDED_CORRELATION = 0.6
"""Two mechanisms in the trials whose multipliers' correlation after the trials reaches this (either sign) are told
apart only partly: the trials fix a combination of the two better than either."""


@dataclass(frozen=True)
class Identification:
    """What the trials tell about each fitted unit, a mechanism or, with several device types, a mechanism on one
    type (planner/calibration/trial_units.py `Unit.key`), from the fit's last Jacobian (`posterior_covariance`)."""

    posterior_sd: dict[str, float]  # per unit, log scale
    absent: list[str]  # units no trial spends time on
    uninformed: list[str]  # in the trials, but the trials barely narrow them (UNINFORMED_RATIO)
    confounded: list[tuple[str, str, float]]  # pairs told apart only partly, with their correlation
    parameter_sd: dict[str, float] | None = None  # per parameter (trial_units.py `Parameters.keys`), log scale


def identification(jac: np.ndarray, sd: dict[str, float], params: Parameters | None = None) -> Identification:
    """From the sensitivities `jac` (trials x units) and the prior sds `sd` per mechanism (or, with several device
    types, `params`'s)."""
    params = params or parameters([], sd, {})
    cov_p = posterior_covariance(params.jacobian(jac), params.prior_sd)
    cov = params.unit_covariance(cov_p)
    names = [u.key for u in params.units]
    prior, post = params.unit_prior_sd(), np.sqrt(np.diag(cov))
    absent = [n for k, n in enumerate(names) if np.max(np.abs(jac[:, k]), initial=0.0) < ABSENT_SHARE]
    uninformed = [n for k, n in enumerate(names) if n not in absent and post[k] >= UNINFORMED_RATIO * prior[k]]
    present = [k for k, n in enumerate(names) if n not in absent]
    confounded = [(names[a], names[b], float(cov[a, b] / (post[a] * post[b])))
                  for i, a in enumerate(present) for b in present[i + 1:]
                  if params.units[a].mechanism != params.units[b].mechanism
                  and abs(cov[a, b]) >= CONFOUNDED_CORRELATION * post[a] * post[b]]
    confounded += _types_confounded(params, cov, present)
    return Identification({n: float(post[k]) for k, n in enumerate(names)}, absent, uninformed, confounded,
                          {n: float(math.sqrt(cov_p[k, k])) for k, n in enumerate(params.keys)}
                          if params.per_device else None)


def _types_confounded(params: Parameters, cov: np.ndarray, present: list[int]) -> list[tuple[str, str, float]]:
    """Pairs of one mechanism's units on two device types that the trials do not tell apart: their mean is
    informed, their difference is not (UNINFORMED_RATIO), so the fit's split between the types is its prior's."""
    prior_cov = params.unit_covariance(np.diag(params.prior_sd ** 2))
    out = []
    for i, a in enumerate(present):
        for b in present[i + 1:]:
            if params.units[a].mechanism != params.units[b].mechanism:
                continue
            diff, mean = np.zeros(len(params.units)), np.zeros(len(params.units))
            diff[[a, b]], mean[[a, b]] = (1.0, -1.0), (0.5, 0.5)
            ratio = [math.sqrt((v @ cov @ v) / (v @ prior_cov @ v)) for v in (diff, mean)]
            if ratio[0] >= UNINFORMED_RATIO > ratio[1]:
                out.append((params.units[a].key, params.units[b].key,
                            float(cov[a, b] / math.sqrt(cov[a, a] * cov[b, b]))))
    return out


@dataclass(frozen=True)
class TrialFit:
    multipliers: dict[str, float]  # per fitted mechanism (with several device types: its part common to them)
    prior_sd: dict[str, float]
    before_s: list[float]
    after_s: list[float]
    devices: list[str]
    identified: Identification
    params: Parameters | None = None  # the parameters (trial_units.py)
    unit_multipliers: dict[str, float] | None = None  # per unit (`Unit.key`): what the evaluator applies

    def unit_multiplier(self, key: str) -> float:
        return (self.unit_multipliers or self.multipliers)[key]


def _gauss_newton(measured: np.ndarray, before: np.ndarray, scale: np.ndarray, log_times, jacobian):
    """The module docstring's maximum a posteriori parameters, from the measured and the unfitted log times:
    (parameters, log times there, the last Jacobian over the units)."""

    def objective(t: np.ndarray, logs: np.ndarray, eps: np.ndarray) -> float:
        return float(np.sum(((measured - logs) / OBSERVATION_SD) ** 2)
                     + 2 * math.sqrt(2) * np.sum(np.sqrt(t ** 2 + eps ** 2) / scale))

    t, base, eps = np.zeros(len(scale)), before, scale.copy()
    unit_jac = np.zeros((len(measured), 0))
    for _ in range(MAX_STEPS):
        unit_jac, jac = jacobian(t, base)
        weight = np.diag(math.sqrt(2) / (scale * np.sqrt(t ** 2 + eps ** 2)))  # the Laplace prior, locally quadratic
        a = jac.T @ jac / OBSERVATION_SD ** 2 + weight
        b = jac.T @ (measured - base) / OBSERVATION_SD ** 2 - weight @ t
        step = np.linalg.solve(a, b)
        for _ in range(MAX_HALVINGS):  # kinks (the host floor): take the step only as far as it helps
            logs = log_times(t + step)
            if objective(t + step, logs, eps) < objective(t, base, eps):
                break
            step = step / 2
        else:
            step = np.zeros(len(scale))
            logs = base
        t, base = t + step, logs
        done = np.max(np.abs(step)) < 1e-3 and np.all(eps <= EPS_FLOOR)
        eps = np.maximum(EPS_FLOOR, eps * EPS_SHRINK)
        if done:
            break
    return t, base, unit_jac


def fit_trials(trials: list[TrialRun], profiles: ProfileSet) -> TrialFit:
    """The maximum a posteriori multipliers (see the module docstring)."""
    devices = _devices(trials, profiles)
    sd, device_sd = prior_sds(_priced(trials, profiles))
    params = parameters(devices, sd, device_sd)
    measured = np.log([tr.measured_s for tr in trials])
    before = _log_times(trials, profiles)
    n_units = len(params.units)

    def unit_log_times(u: np.ndarray) -> np.ndarray:
        return _log_times(trials, scaled_units(profiles, params.units, u, devices, "fit"))

    def jacobian(t: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        u = params.unit_values(t)
        unit_jac = np.column_stack([(unit_log_times(u + FD_STEP * np.eye(n_units)[k]) - base) / FD_STEP
                                    for k in range(n_units)])
        return unit_jac, params.jacobian(unit_jac)

    t, after, unit_jac = _gauss_newton(measured, before, params.prior_sd,
                                       lambda p: unit_log_times(params.unit_values(p)), jacobian)
    names = [m.name for m in FITTED]
    return TrialFit(multipliers={n: float(math.exp(v)) for n, v in zip(names, t)}, prior_sd=sd,
                    before_s=[float(math.exp(v)) for v in before], after_s=[float(math.exp(v)) for v in after],
                    devices=devices, identified=identification(unit_jac, sd, params), params=params,
                    unit_multipliers={u.key: float(math.exp(v)) for u, v in zip(params.units, params.unit_values(t))}
                    if params.per_device else None)


def _corrections(fit: TrialFit, profiles: ProfileSet, source: str) -> tuple[list[dict], ProfileSet]:
    """corrections.yaml's entries (each kind of each unit the fit moved, on its devices: the current factor times
    the unit's multiplier), and the profiles with them."""
    units = fit.params.units if fit.params is not None else tuple(Unit(m.name) for m in FITTED)
    logs = [math.log(fit.unit_multiplier(u.key)) for u in units]
    fitted = scaled_units(profiles, units, logs, fit.devices, source)
    return [{"device": d, "kind": kind, "factor": round(fitted.correction(d, kind), 6),
             "provenance": {"kind": "calibrated", "source": source}}
            for u in units if abs(fit.unit_multiplier(u.key) - 1.0) > 1e-4
            for kind in BY_NAME[u.mechanism].kinds if kind in TIME_CORRECTION_KINDS
            for d in (fit.devices if u.device is None else [u.device])], fitted


def trial_calibration(directory: str | Path, profiles: ProfileSet) -> tuple[CalibrationResult, list[str]]:
    """Read the trials of `directory`, fit, and the corrections, evidence and report to write (with the notes
    on trials left out)."""
    trials, notes = read_trials(directory, profiles)
    fit = fit_trials(trials, profiles)
    again = [(tr, b) for tr, b in zip(trials, fit.before_s)
             if tr.solved_s is not None and abs(b / tr.solved_s - 1.0) > PRICED_AGAIN_TOLERANCE]
    if again:
        notes.append("the solve that proposed these trials priced them otherwise ("
                     + ", ".join(f"{tr.name} {tr.solved_s:.3f} s there, {b:.3f} s here" for tr, b in again)
                     + "): it was given other profiles than this command's; to fit on top of them, as that solve "
                       "priced, pass the same --profiles here, then both to solve (--profiles OLD --profiles NEW)")
    per_type = fit.unit_multipliers is not None
    what = ("one multiplier per mechanism, per device type for those that run on one device,"
            if per_type else "one multiplier per mechanism")
    source = (f"cli.py calibrate --trials {directory}: {what} fitted jointly on {len(trials)} "
              f"trial log(s) ({', '.join(tr.name for tr in trials)})")
    corrections, fitted = _corrections(fit, profiles, source)
    faster = fitted.faster_than_peak(fit.devices)
    if faster:  # what `--profiles` would refuse (as calibrate --megatron-log refuses it): write nothing
        raise PlannerInputError(
            "--trials", f"{directory}: fitting the trials' logs would make {faster[0]}, which no kernel does: a log "
                        "claims an impossible speed, or a trial's log is not of the plan its plan.json describes "
                        "(model, batch, cluster); nothing was written")
    evidence = [cell for tr in trials
                for cell in evidence_cells(tr.run, tr.cluster, tr.plan, fitted, f"trial {tr.name} ({tr.log})")]
    notes.extend(identification_notes(fit))
    report = {
        "method": f"joint maximum a posteriori fit of {what.rstrip(',')} on the trials' logs "
                  "(planner/calibration/trials.py)",
        "multipliers": fit.multipliers, "prior_sd": fit.prior_sd, "devices": fit.devices, "notes": notes,
        **_identification_report(fit),
        "trials": [{"name": tr.name, "log": tr.log, "steady_iterations": tr.steady_iterations,
                    "measured_s": tr.measured_s, "predicted_before_s": b, "predicted_after_s": a,
                    "error_before": b / tr.measured_s - 1.0, "error_after": a / tr.measured_s - 1.0}
                   for tr, b, a in zip(trials, fit.before_s, fit.after_s)],
    }
    measured = [{"name": tr.name, "plan": tr.plan.model_dump(mode="json"),
                 "made_for": made_for(tr.run, tr.cluster, profiles), "measured_s": tr.measured_s,
                 "steady_iterations": tr.steady_iterations, "log": tr.log}
                for tr in trials]
    return CalibrationResult(corrections=corrections, report=report, evidence=evidence,
                             measured_plans=measured), notes


def _identification_report(fit: TrialFit) -> dict:
    """The report's identification keys.  One device type: per mechanism.  Several: `posterior_sd` per mechanism
    is its common part's (trial_units.py), `absent` the mechanisms absent on every type, `uninformed` those
    barely informed on some type, each `confounded` pair also names its `devices` (null: every type), and the
    device_* keys give each per-device mechanism per type."""
    ident = fit.identified
    if fit.params is None or not fit.params.per_device:
        return {"posterior_sd": ident.posterior_sd, "absent": ident.absent, "uninformed": ident.uninformed,
                "confounded": [{"mechanisms": [a, b], "correlation": r} for a, b, r in ident.confounded]}
    units = {u.key: u for u in fit.params.units}
    per_device = [u for u in fit.params.units if u.device is not None]

    def by_mechanism(values) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for u in per_device:
            out.setdefault(u.mechanism, {})[u.device] = values(u)
        return out

    def listed(keys: list[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for k in keys:
            if units[k].device is not None:
                out.setdefault(units[k].mechanism, []).append(units[k].device)
        return out

    prior = dict(zip(units, fit.params.unit_prior_sd()))
    absent_units = set(ident.absent)
    return {
        "posterior_sd": {m.name: ident.parameter_sd[m.name] for m in FITTED},
        "absent": [m.name for m in FITTED if all(k in absent_units for k, u in units.items()
                                                   if u.mechanism == m.name)],
        "uninformed": list(dict.fromkeys(units[k].mechanism for k in ident.uninformed)),
        "confounded": [{"mechanisms": [units[a].mechanism, units[b].mechanism], "correlation": r,
                        "devices": [units[a].device, units[b].device]} for a, b, r in ident.confounded],
        "device_multipliers": by_mechanism(lambda u: fit.unit_multiplier(u.key)),
        "device_prior_sd": by_mechanism(lambda u: float(prior[u.key])),
        "device_posterior_sd": by_mechanism(lambda u: ident.posterior_sd[u.key]),
        "device_absent": listed(ident.absent), "device_uninformed": listed(ident.uninformed),
    }


def _unit_words(key: str) -> str:
    mechanism, _, device = key.partition("@")
    return Unit(mechanism, device or None).words()


def identification_notes(fit: TrialFit) -> list[str]:
    """What the trials could not tell, in words: the mechanisms (with several device types, a mechanism on one
    type: "expert GEMMs on A100") they barely inform and the pairs they tell apart only partly
    (`Identification`)."""
    ident, out = fit.identified, []
    if ident.uninformed:
        out.append(f"these trials barely inform {', '.join(_unit_words(n) for n in ident.uninformed)}: the fit "
                   "leaves their multipliers near the shipped calibration's, and a discrepancy of theirs is credited "
                   "to the mechanisms the trials do inform; to measure one, add a trial whose share of time in it "
                   "differs from these trials' (another EP, micro-batch or device)")
    for a, b, r in ident.confounded:
        if a.partition("@")[0] == b.partition("@")[0]:
            out.append(f"these trials do not tell {_unit_words(a)} from {_unit_words(b)}: they fix the two "
                       "together, not the split between the types (their shares of the trials' times vary alike), "
                       f"so the fit's x{fit.unit_multiplier(a):.3f} and x{fit.unit_multiplier(b):.3f} "
                       "split them as its prior does, not as measured; to measure the split, add a trial with "
                       "another share of each type (another layer split between the types' stages, or a trial on "
                       "one type)")
            continue
        out.append(f"these trials tell {_unit_words(a)} and {_unit_words(b)} apart only partly (correlation "
                   f"{r:+.2f} after the fit): their multipliers x{fit.unit_multiplier(a):.3f} and "
                   f"x{fit.unit_multiplier(b):.3f} are surer together than apart")
    return out


def render_trial_report(report: dict) -> str:
    lines = [f"note: {n}" for n in report["notes"]]
    for t in report["trials"]:
        lines.append(f"trial {t['name']:12s} measured {t['measured_s']:.4f} s over {t['steady_iterations']} steady "
                     f"iterations; predicted {t['predicted_before_s']:.4f} s before ({t['error_before']:+.1%}), "
                     f"{t['predicted_after_s']:.4f} s after ({t['error_after']:+.1%})")
    per_device = report.get("device_multipliers", {})
    factors = [(n, f, report["posterior_sd"][n]) for n, f in report["multipliers"].items() if n not in per_device]
    factors += [(f"{n} on {d}", f, report["device_posterior_sd"][n][d])
                for n, by_type in per_device.items() for d, f in by_type.items()]
    moved = [(n, f, sd) for n, f, sd in factors if abs(f - 1.0) > 1e-3]
    lines.append("fitted multipliers: " + (", ".join(f"{n} x{f:.3f} (+-{math.expm1(sd):.0%})" for n, f, sd in moved)
                                           or "none moved"))
    return "\n".join(lines)
