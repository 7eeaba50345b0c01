"""Calibrate from trials: the logs of the short runs `solve --out DIR` proposed (planner/trials.py), one
multiplier per mechanism fitted on all of them jointly.

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
can tell the mechanisms apart (`posterior_sd`).

What the trials could not tell.  A few trials fix a few combinations of the multipliers; the rest stays the
prior's.  From the fit's last Jacobian (`identification`), the report gives each multiplier its sd after the trials
and names the mechanisms no trial has (`absent`), those the trials barely narrow (`uninformed`: a discrepancy of
theirs is credited to the others, as the test's expert GEMMs x1.3 went to TP/CP/DP collectives), and the pairs told
apart only partly (`confounded`), in the JSON and in words.

Writing (`trial_calibration`): corrections.yaml (each kind of each fitted mechanism, each trial device: the
current factor times the multiplier), evidence.yaml (the conditions the trials measured: planner/uncertainty.py
reads it from `--profiles DIR`, so the measured plans are no longer extrapolated), measured_plans.json (each trial's
plan, what it was made for and its measured time: `solve --profiles DIR` proposes no trial of a plan measured
already, planner/trials.py) and calibration_report.json.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.calibration.calibrate import STATED_OPTIONS, CalibrationResult, choose_run, evidence_cells, \
    measurement_from_log, skipped_step_warnings, stated_differences
from planner.calibration.megatron_log import parse_megatron_log
from planner.cost.mechanisms import MECHANISMS
from planner.cost.model import CostModel
from planner.cost.ranges import RangeModel
from planner.errors import PlannerInputError
from planner.inputs.plan_file import load_plan_file, made_for, resolve_plan_inputs
from planner.profile_tables import TIME_CORRECTION_KINDS, ProfileSet
from planner.schemas.cluster import ClusterSpec
from planner.schemas.device import Provenance
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan

TRIAL_SKIP = 5
"""Warm-up iterations of a trial left out of its median (data loaders, allocator, NCCL set-up)."""
OBSERVATION_SD = 0.02
"""A trial's measured time against the model's, log scale: run-to-run variation of a steady iteration (about
2%; the calibration report calls plans measured within 3% a tie)."""
MIN_PRIOR_SD = 0.02
FD_STEP = 0.05
MAX_STEPS = 20
MAX_HALVINGS = 6
EPS_SHRINK = 0.3
EPS_FLOOR = 1e-3
FITTED = tuple(m for m in MECHANISMS if any(k in TIME_CORRECTION_KINDS for k in m.kinds))
"""The mechanisms correction kinds scale (the recomputed forward runs the others' kernels: it has none)."""


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


def scaled(profiles: ProfileSet, t: dict[str, float], devices: list[str], why: str) -> ProfileSet:
    """`profiles` with each fitted mechanism's correction kinds multiplied by exp(t[mechanism]) on `devices`."""
    entries = {(d, kind): profiles.correction(d, kind) * math.exp(t[m.name])
               for m in FITTED if t.get(m.name) for kind in m.kinds if kind in TIME_CORRECTION_KINDS for d in devices}
    return profiles.with_corrections(entries, Provenance(kind="calibrated", source=why)) if entries else profiles


def _log_times(trials: list[TrialRun], profiles: ProfileSet) -> np.ndarray:
    return np.array([math.log(CostModel(tr.run.model, tr.run.training, tr.cluster, profiles, memory_headroom=0.0)
                              .evaluate(tr.plan).iteration_time_s) for tr in trials])


def prior_sd(trials: list[TrialRun], profiles: ProfileSet) -> dict[str, float]:
    """Per fitted mechanism, s_k (see the module docstring)."""
    return plans_prior_sd((RangeModel(tr.run.model, tr.run.training, tr.cluster, profiles), tr.plan) for tr in trials)


def plans_prior_sd(priced) -> dict[str, float]:
    """s_k over (RangeModel, Plan) pairs: the largest -log(1 - u) the range model gives the mechanism in any
    plan's conditions."""
    out = {m.name: MIN_PRIOR_SD for m in FITTED}
    for rm, plan in priced:
        for c in rm.plan_conditions(plan):
            if c.mechanism in out:
                out[c.mechanism] = max(out[c.mechanism], -math.log(1.0 - rm.spread(c)))
    return out


def posterior_covariance(jac: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """The covariance of t the fit has after trials with log-time sensitivities `jac` (trials x mechanisms) and
    prior sds `sd`: the module docstring's model linearised, its prior taken as the Gaussian of the same variance."""
    return np.linalg.inv(jac.T @ jac / OBSERVATION_SD ** 2 + np.diag(1.0 / sd ** 2))


def posterior_sd(shares: list[dict[str, float]], sd: dict[str, float]) -> dict[str, float]:
    """Per fitted mechanism, the sd of t_k the fit would have after trials whose log-time sensitivities are
    `shares` (d log T_j / d t_k: to first order, the mechanisms' shares of each trial's time), with prior sds
    `sd` (`posterior_covariance`).  Mechanisms every trial leans on alike keep their prior sd; trials that vary
    them apart narrow it."""
    names = [m.name for m in FITTED]
    jac = np.array([[s.get(n, 0.0) for n in names] for s in shares]).reshape(len(shares), len(names))
    cov = posterior_covariance(jac, np.array([sd[n] for n in names]))
    return {n: float(math.sqrt(cov[k, k])) for k, n in enumerate(names)}


UNINFORMED_RATIO = 0.7
"""A mechanism whose sd after the trials is still this share of its prior sd or more is one the trials barely
inform: its multiplier stays where the shipped calibration put it, and a discrepancy of its own goes to the
mechanisms the trials do inform (a test: expert GEMMs x1.3 slower beside dispatch x1.8 came out as TP/CP/DP
collectives x1.14)."""
ABSENT_SHARE = 0.01
"""A mechanism below this share of every trial's time is not in the trials at all."""
CONFOUNDED_CORRELATION = 0.6
"""Two mechanisms in the trials whose multipliers' correlation after the trials reaches this (either sign) are told
apart only partly: the trials fix a combination of the two better than either."""


@dataclass(frozen=True)
class Identification:
    """What the trials tell about each fitted mechanism (from the fit's last Jacobian, `posterior_covariance`)."""

    posterior_sd: dict[str, float]  # per fitted mechanism, log scale
    absent: list[str]  # mechanisms no trial spends time on
    uninformed: list[str]  # in the trials, but the trials barely narrow them (UNINFORMED_RATIO)
    confounded: list[tuple[str, str, float]]  # pairs told apart only partly, with their correlation


def identification(jac: np.ndarray, sd: dict[str, float]) -> Identification:
    names = [m.name for m in FITTED]
    prior = np.array([sd[n] for n in names])
    cov = posterior_covariance(jac, prior)
    post = np.sqrt(np.diag(cov))
    absent = [n for k, n in enumerate(names) if np.max(np.abs(jac[:, k]), initial=0.0) < ABSENT_SHARE]
    uninformed = [n for k, n in enumerate(names) if n not in absent and post[k] >= UNINFORMED_RATIO * prior[k]]
    present = [k for k, n in enumerate(names) if n not in absent]
    confounded = [(names[a], names[b], float(cov[a, b] / (post[a] * post[b])))
                  for i, a in enumerate(present) for b in present[i + 1:]
                  if abs(cov[a, b]) >= CONFOUNDED_CORRELATION * post[a] * post[b]]
    return Identification({n: float(post[k]) for k, n in enumerate(names)}, absent, uninformed, confounded)


@dataclass(frozen=True)
class TrialFit:
    multipliers: dict[str, float]  # per fitted mechanism
    prior_sd: dict[str, float]
    before_s: list[float]
    after_s: list[float]
    devices: list[str]
    identified: Identification


def fit_trials(trials: list[TrialRun], profiles: ProfileSet) -> TrialFit:
    """The maximum a posteriori multipliers (see the module docstring)."""
    devices = _devices(trials, profiles)
    sd = prior_sd(trials, profiles)
    names = [m.name for m in FITTED]
    scale = np.array([sd[n] for n in names])
    measured = np.log([tr.measured_s for tr in trials])
    before = _log_times(trials, profiles)

    def log_times(t: np.ndarray) -> np.ndarray:
        return _log_times(trials, scaled(profiles, dict(zip(names, t)), devices, "fit"))

    def objective(t: np.ndarray, logs: np.ndarray, eps: np.ndarray) -> float:
        return float(np.sum(((measured - logs) / OBSERVATION_SD) ** 2)
                     + 2 * math.sqrt(2) * np.sum(np.sqrt(t ** 2 + eps ** 2) / scale))

    t, base, eps = np.zeros(len(names)), before, scale.copy()
    jac = np.zeros((len(trials), len(names)))
    for _ in range(MAX_STEPS):
        jac = np.column_stack([(log_times(t + FD_STEP * np.eye(len(names))[k]) - base) / FD_STEP
                               for k in range(len(names))])
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
            step = np.zeros(len(names))
            logs = base
        t, base = t + step, logs
        done = np.max(np.abs(step)) < 1e-3 and np.all(eps <= EPS_FLOOR)
        eps = np.maximum(EPS_FLOOR, eps * EPS_SHRINK)
        if done:
            break
    after = base
    return TrialFit(multipliers={n: float(math.exp(v)) for n, v in zip(names, t)}, prior_sd=sd,
                    before_s=[float(math.exp(v)) for v in before], after_s=[float(math.exp(v)) for v in after],
                    devices=devices, identified=identification(jac, sd))


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
    source = (f"cli.py calibrate --trials {directory}: one multiplier per mechanism fitted jointly on {len(trials)} "
              f"trial log(s) ({', '.join(tr.name for tr in trials)})")
    fitted = scaled(profiles, {n: math.log(f) for n, f in fit.multipliers.items()}, fit.devices, source)
    corrections = [{"device": d, "kind": kind, "factor": round(fitted.correction(d, kind), 6),
                    "provenance": {"kind": "calibrated", "source": source}}
                   for m in FITTED if abs(fit.multipliers[m.name] - 1.0) > 1e-4
                   for kind in m.kinds if kind in TIME_CORRECTION_KINDS for d in fit.devices]
    evidence = [cell for tr in trials
                for cell in evidence_cells(tr.run, tr.cluster, tr.plan, fitted, f"trial {tr.name} ({tr.log})")]
    notes.extend(identification_notes(fit))
    ident = fit.identified
    report = {
        "method": "joint maximum a posteriori fit of one multiplier per mechanism on the trials' logs "
                  "(planner/calibration/trials.py)",
        "multipliers": fit.multipliers, "prior_sd": fit.prior_sd, "devices": fit.devices, "notes": notes,
        "posterior_sd": ident.posterior_sd, "absent": ident.absent, "uninformed": ident.uninformed,
        "confounded": [{"mechanisms": [a, b], "correlation": r} for a, b, r in ident.confounded],
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


def identification_notes(fit: TrialFit) -> list[str]:
    """What the trials could not tell, in words: the mechanisms they barely inform and the pairs they tell
    apart only partly (`Identification`)."""
    words = {m.name: m.words for m in FITTED}
    ident, out = fit.identified, []
    if ident.uninformed:
        out.append(f"these trials barely inform {', '.join(words[n] for n in ident.uninformed)}: the fit leaves "
                   "their multipliers near the shipped calibration's, and a discrepancy of theirs is credited to "
                   "the mechanisms the trials do inform; to measure one, add a trial whose share of time in it "
                   "differs from these trials' (another EP, micro-batch or device)")
    for a, b, r in ident.confounded:
        out.append(f"these trials tell {words[a]} and {words[b]} apart only partly (correlation {r:+.2f} after the "
                   f"fit): their multipliers x{fit.multipliers[a]:.3f} and x{fit.multipliers[b]:.3f} are surer "
                   "together than apart")
    return out


def render_trial_report(report: dict) -> str:
    lines = [f"note: {n}" for n in report["notes"]]
    for t in report["trials"]:
        lines.append(f"trial {t['name']:12s} measured {t['measured_s']:.4f} s over {t['steady_iterations']} steady "
                     f"iterations; predicted {t['predicted_before_s']:.4f} s before ({t['error_before']:+.1%}), "
                     f"{t['predicted_after_s']:.4f} s after ({t['error_after']:+.1%})")
    moved = {n: f for n, f in report["multipliers"].items() if abs(f - 1.0) > 1e-3}
    sd = report["posterior_sd"]
    lines.append("fitted multipliers: " + (", ".join(f"{n} x{f:.3f} (+-{math.expm1(sd[n]):.0%})"
                                                     for n, f in moved.items()) or "none moved"))
    return "\n".join(lines)
