"""`cli.py calibrate`: fit cost-model corrections from a real Megatron run's log."""

from __future__ import annotations

import click

from planner.api import load_estimate_inputs
from planner.calibration.calibrate import (
    CalibrationResult, calibrate, read_measurement, read_router_stats, render_report, write_corrections,
)
from planner.cli_common import echo_json, handle_errors
from planner.commands.options import (
    MODEL_OPTIONS, PARALLEL_OVERRIDES, SCRIPT_ARGS, TRAINING_OVERRIDES, apply_options, cluster_options, input_files,
    note_printer,
)
from planner.calibration.trials import render_trial_report, trial_calibration
from planner.errors import PlannerInputError
from planner.output.report import SCHEMA_VERSION
from planner.profile_tables import ProfileSet
from planner.output.run_dir import CALIBRATE_OUTPUT, check_out_dir


@click.command("calibrate")
@click.option("--megatron-log", type=click.Path(dir_okay=False), default=None, help="the run's stdout log")
@click.option("--trials", "trials_dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="the --out directory of a solve that proposed trials, after running them: every trials/<name>/ "
                   "with a log is read, one multiplier per mechanism is fitted on them jointly (their plans, "
                   "models and cluster come from their plan.json)")
@click.option("--instrument-dir", type=click.Path(file_okay=False), default=None,
              help="output of python -m planner.instrument.megatron_wrapper (instead of, or beside, the log)")
@apply_options(MODEL_OPTIONS + cluster_options(required=False) + PARALLEL_OVERRIDES + TRAINING_OVERRIDES + SCRIPT_ARGS)
@click.option("--router-stats", type=click.Path(), default=None,
              help="CSV layer,expert,tokens[,iteration,rank] or an instrumentation directory")
@click.option("--skip-iterations", type=click.IntRange(min=0), default=2, show_default=True,
              help="iteration lines ignored at the start of the run (they include start-up time)")
@click.option("--log-run", type=click.IntRange(min=1), default=None, metavar="N",
              help="calibrate on the N-th run of a log that holds several (a restart, logs concatenated); such a "
                   "log is refused without it")
@click.option("--out", "out_dir", required=True, metavar="DIR",
              help="directory for corrections.yaml and calibration_report.json (pass it as --profiles); a "
                   "profiles directory is updated, any other non-empty directory is refused")
@click.option("--force", is_flag=True, help="write into a non-empty --out directory that is no profiles directory")
@click.option("--allow-memory-excess", is_flag=True,
              help="write a memory correction beyond the bound (measured above 1.5x the prediction by more than 10% "
                   "of the device's memory: likely another run than the one priced), with a warning")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@handle_errors
def command(megatron_log, trials_dir, instrument_dir, model, megatron_args, megatron_script, cluster, profile_dirs,
            router_stats, skip_iterations, log_run, out_dir, force, allow_memory_excess, as_json, script_args,
            **overrides):
    """Compare a real run with the cost model and write corrections (provenance calibrated).

    \b
    python cli.py calibrate --megatron-log train.log --megatron-script run.sh --cluster H800:16 --out calib/
    python cli.py calibrate --megatron-log train.log --megatron-script run.sh --cluster H800:16 --out calib/ -- 70B 16
    python cli.py estimate --megatron-script run.sh --cluster H800:64 --profiles calib/
    python cli.py calibrate --trials plan/ --out calib/     # after running plan/trials/*/launch.sh
    """
    given = input_files(megatron_log, router_stats, model, megatron_script, cluster)
    check_out_dir(out_dir, "--out", CALIBRATE_OUTPUT, force=force, inputs=given + ([trials_dir] if trials_dir else []))
    if trials_dir is not None:
        single = {"--megatron-log": megatron_log, "--instrument-dir": instrument_dir, "--model": model,
                  "--megatron-args": megatron_args, "--megatron-script": megatron_script, "--cluster": cluster,
                  "--router-stats": router_stats, **{f"--{k}": v for k, v in overrides.items()},
                  "arguments after `--`": script_args or None}
        _calibrate_trials(trials_dir, [k for k, v in single.items() if v is not None], profile_dirs, out_dir,
                          force, as_json)
        return
    if megatron_log is None and instrument_dir is None:
        raise PlannerInputError("--megatron-log", "give the run's log (or --instrument-dir, or --trials DIR)")
    if cluster is None:
        raise PlannerInputError("--cluster", "give the cluster the logged run ran on (TYPE:COUNT[,...], a preset or "
                                             "a YAML file)")
    # a --megatron-script's flags are priced on the GPUs its own launch uses, as `estimate` prices them
    say = note_printer()
    inputs, _, priced = load_estimate_inputs(
        model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
        profile_dirs=profile_dirs, overrides=overrides, script_args=script_args, on_note=say,
    )
    for note in priced:  # which GPUs of --cluster the logged run is priced on
        say(note)
    run, cluster_spec, profiles = inputs.run, inputs.cluster, inputs.profiles
    measurement, parsed = read_measurement(megatron_log, instrument_dir, skip_iterations, log_run)
    if parsed is not None:
        for problem in parsed.problems[:10]:
            click.echo(f"warning: {parsed.source} line {problem.line_no} ({problem.kind}): {problem.reason}", err=True)
        if parsed.problem_count > 10:
            click.echo(f"warning: {parsed.problem_count - 10} more unreadable lines", err=True)
    router = read_router_stats(router_stats, instrument_dir, run.model.num_experts)
    result = _versioned(calibrate(measurement, run, cluster_spec, profiles, router, allow_memory_excess=allow_memory_excess))
    paths = write_corrections(result, out_dir, force=force, inputs=given)
    if as_json:
        echo_json({**result.report, "written": [str(p) for p in paths]})
    else:
        click.echo(render_report(result.report))
        click.echo("wrote " + ", ".join(str(p) for p in paths))


def _calibrate_trials(trials_dir: str, single: list[str], profile_dirs, out_dir: str, force: bool,
                      as_json: bool) -> None:
    """`--trials DIR`: the joint fit on the trials' logs (planner/calibration/trials.py); `single`: the options of
    the one-log calibration given beside it (refused)."""
    if single:
        raise PlannerInputError("--trials", f"reads each trial's plan, model and cluster from its plan.json; drop "
                                            f"{', '.join(single)}")
    profiles = ProfileSet.load(extra_dirs=list(profile_dirs or ()))
    result, _ = trial_calibration(trials_dir, profiles)
    result = _versioned(result)
    paths = write_corrections(result, out_dir, force=force, inputs=[trials_dir])
    if as_json:
        echo_json({**result.report, "written": [str(p) for p in paths]})
    else:
        click.echo(render_trial_report(result.report))
        click.echo("wrote " + ", ".join(str(p) for p in paths))


def _versioned(result: CalibrationResult) -> CalibrationResult:
    """The report with `schema_version` first (docs/schema/calibrate.json), as --json prints it and
    calibration_report.json holds it."""
    result.report = {"schema_version": SCHEMA_VERSION, **result.report}
    return result
