"""`cli.py solve`: search the 6D space for the fastest plan that fits, and (with --out) write it."""

from __future__ import annotations

from pathlib import Path

import click

from planner.api import (
    OBJECTIVES, check_predictions, hosts_notes, input_plan, input_script, load_inputs, make_space, price_input_plan,
    runtime_choice,
)
from planner.api_search import solve
from planner.inputs.hosts import check_hosts_cover, read_hosts
from planner.launcher import refuse_unlaunchable_inputs
from planner.cli_common import FiniteFloat, echo_json, handle_errors
from planner.inputs.script_gpus import check_launch, solve_note
from planner.commands.options import (
    ASSUMPTION_OPTIONS, CLUSTER_OPTIONS, HEADROOM_OPTIONS, MODEL_OPTIONS, SCRIPT_ARGS, TIME_LIMIT_ENV,
    TRAINING_OVERRIDES, apply_options, check_plot_dir, display_options, input_files, launcher_inputs, note_printer,
    time_limit_option,
)
from planner.errors import Interrupted, PlannerInputError
from planner.output.plan_dir import plan_record, write_plan_dir, write_solve_plots
from planner.output.report import best_so_far_text, render_solve, solve_json, trials_json
from planner.output.run_dir import PLAN_OUTPUT, check_out_dir
from planner.progress import ProgressDisplay
from planner.runtime import AUTO, RUNTIME_CHOICES
from planner.search.pruning import Pruning
from planner.search.settings import SearchSettings
from planner.time_budget import Budget, reading_within
from planner.trials import propose_trials

SEARCH_OPTIONS = [
    click.option("--backend", type=click.Choice(["cpsat", "hsdp"]), default="cpsat", show_default=True,
                 help="cpsat: logic-based Benders, CP-SAT throughout (a screen over the shapes' price tables, a "
                      "CP-SAT pipeline block per shape deciding recompute, PP, VPP and the stages, the CP-SAT "
                      "stage model as cuts); hsdp: best-first screening with the dynamic program (the "
                      "independent reference)"),
    click.option("--runtime", type=click.Choice(list(RUNTIME_CHOICES)), default=AUTO, show_default=True,
                 help="auto: upstream Megatron-LM when it runs the whole cluster (one vendor), else FlagScale "
                      "(NVIDIA+AMD through FlagCX), else the part of the cluster one job can span, the rest idle "
                      "(profiles/runtimes.yaml); megatron: one DP/recompute for all stages; flagscale: per-stage DP "
                      "and recompute"),
    time_limit_option("seconds for the whole command: reading the inputs, the search, drawing and writing"),
    click.option("--delta", type=FiniteFloat(min=0.0, max=1.0), default=0.2, show_default=True,
                 help="load-balance tolerance of the paper's pruning; by default the prunings only order the work "
                      "(the whole space is searched and certified when the time limit allows), with --prune they "
                      "restrict the space"),
    click.option("--prune", is_flag=True,
                 help="search only the pruned space (load balance, least recompute that fits, CP on long "
                      "sequences): faster, never certifies the whole space's optimum"),
    click.option("--no-prune", is_flag=True,
                 help="no pruning at all, not even to order the work: the whole space, exactly, certified optimum "
                      "when the time limit allows"),
    click.option("--contiguous-types", is_flag=True,
                 help="megatron runtime: keep each device type's stages in one contiguous block (FlagScale "
                      "always does; upstream Megatron does not need it)"),
    click.option("--top", "top_k", type=click.IntRange(min=1), default=1, show_default=True, metavar="K",
                 help="plans to report: the pick and the next K-1 by the objective (a table after the pick, in "
                      "summary.md, and `alternatives` in --json)"),
    click.option("--objective", type=click.Choice(list(OBJECTIVES)), default="pessimistic", show_default=True,
                 help="pessimistic: the plan whose time at the top of its range is best (each mechanism at its "
                      "held-out uncertainty, profiles/uncertainty.yaml); nominal: the cost model's time alone"),
]


@click.command("solve")
@apply_options(MODEL_OPTIONS + CLUSTER_OPTIONS + TRAINING_OVERRIDES + SEARCH_OPTIONS + SCRIPT_ARGS)
@click.option("--out", "out_dir", default=None, metavar="DIR",
              help="write plan.json, inputs.json, summary.md, the launcher (launch/) and, when the pick needs "
                   "them, short trials (trials/<name>/launch.sh) here: a new or empty directory, or an earlier "
                   "plan's (replaced; its manifest says so); files the planner did not write are never "
                   "overwritten or deleted")
@click.option("--force", is_flag=True, help="write into a non-empty --out directory that holds no earlier plan "
                                            "(beside its files, which are never overwritten or deleted)")
@click.option("--hosts", "hosts_path", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="the real nodes, one line each: NAME TYPE [GPUS] (or NAME slots=N type=T); checked against "
                   "the plan, and the launcher (--out) places the stages on them (without it: a template)")
@apply_options(ASSUMPTION_OPTIONS + HEADROOM_OPTIONS + display_options(with_out=True))
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of tables")
@click.option("--quiet", is_flag=True, help="nothing on stderr but errors (no progress, no 'wrote N files')")
@handle_errors
def command(model, megatron_args, megatron_script, cluster, profile_dirs, mbs, gbs, seq, backend, runtime,
            time_limit_s, delta, prune, no_prune, contiguous_types, top_k, objective, out_dir, force, hosts_path,
            moe_imbalance, memory_headroom, plot_dir, wide, as_json, quiet, script_args):
    """Find the fastest plan that fits: degrees, layers and device type per stage, recompute.

    \b
    python cli.py solve --model mixtral-l --cluster H800:16,MI300X:16,910B:16
    python cli.py solve --model mixtral-s --cluster h800-mi300x --backend hsdp --runtime flagscale --json
    python cli.py solve --megatron-script train.sh --cluster H800:16 --out plan/ -- /ckpt /tokenizer /data
    """
    # the time limit counts from here: reading the inputs, the search, drawing and writing
    budget = Budget.start(time_limit_s, drawing=out_dir is not None or plot_dir is not None)
    given = input_files(model, megatron_script, cluster, hosts_path)
    if out_dir is not None:
        check_out_dir(out_dir, "--out", PLAN_OUTPUT, force=force, inputs=given)
    plot_dir = check_plot_dir(plot_dir, out_dir, given)
    if prune and no_prune:
        raise PlannerInputError("--prune", "--prune restricts the search to the pruned space and --no-prune turns "
                                           "every pruning off: give one of them")
    with reading_within(budget):
        inputs = load_inputs(
            model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
            profile_dirs=profile_dirs, overrides={"gbs": gbs, "seq": seq, "mbs": mbs}, moe_imbalance=moe_imbalance,
            script_args=script_args, on_note=note_printer(quiet), script_deadline=budget.reading_deadline_monotonic(),
            allow_invalid=True,  # the plan replaces the input's degrees; a refusal Megatron would give is a note
        )
    script = input_script(inputs, megatron_args, {"seq": seq})  # the script as load_inputs read it
    if script is not None:  # a launch that is not one rank on each GPU: refused as estimate and calibrate refuse it
        check_launch(script)
    hosts = None
    if hosts_path:  # checked before the search: the file's nodes against the cluster's
        hosts = read_hosts(hosts_path, inputs.cluster, inputs.profiles)
        check_hosts_cover(hosts, inputs.cluster, hosts_path, inputs.profiles)
    yours = input_plan(inputs, megatron_script, megatron_args)  # the search starts from the user's own plan
    settings = SearchSettings(backend=backend, pruning=Pruning(delta=delta, restrict=prune), time_limit_s=time_limit_s,
                              top_k=top_k, deadline=budget.search_deadline, seed_plans=(yours,) if yours else ())
    if no_prune:
        settings = settings.without_pruning()
    choice = runtime_choice(runtime, inputs.cluster, inputs.profiles, inputs.run, memory_headroom)
    if out_dir:
        refuse_unlaunchable_inputs(choice.runtime.name, inputs.run, script)
    space = make_space(inputs.run, choice.runtime.name, mbs=mbs, contiguous_types=contiguous_types or None)
    progress = ProgressDisplay(quiet=quiet, time_limit_s=time_limit_s)
    try:
        with progress:
            outcome = solve(inputs.run, inputs.cluster, inputs.profiles, settings=settings, space=space,
                            progress=progress, memory_headroom=memory_headroom, objective=objective, choice=choice)
    except Interrupted as exc:  # nothing is written: say what the search had found (stderr, --quiet or not)
        exc.found = interrupted_line(progress, objective)
        raise
    # the same gap as the live bar and the report: the searched objective against the searched space's bound
    progress.finish(best_s=outcome.objective_s, lower_bound_s=outcome.result.pruned_lower_bound_s)
    check_predictions(outcome, inputs.profiles)
    outcome.hosts = hosts
    outcome.script = script
    user = price_input_plan(inputs, megatron_script, megatron_args, outcome)
    if user is not None and script is not None and (note := solve_note(script, inputs.cluster, inputs.profiles)):
        user.notes.append(note)
    trials, trials_why = propose_trials(outcome, user)
    payload = (solve_json(outcome, settings, choice.runtime.name, user=user) | trials_json(trials, trials_why)
               | plan_record(outcome))  # inputs and made_for, as plan.json: emit takes solve --json's output too
    payload["notes"] += hosts_notes(outcome)  # --hosts' nodes the plan leaves unused, the script's srun nodes
    written: list[Path] = []
    where = out_dir or plot_dir
    protected = given + launcher_inputs(script)
    if out_dir:
        written = write_plan_dir(Path(out_dir), payload, outcome, user, force=force, inputs=protected,
                                 time_left=budget.remaining_s, trials=trials, top_k=top_k)
    elif plot_dir:
        written = write_solve_plots(Path(plot_dir), payload, outcome, user, inputs=protected,
                                    time_left=budget.remaining_s, top_k=top_k)
    if written and not quiet:
        click.echo(f"wrote {len(written)} files to {where}", err=True)
    if as_json:
        echo_json(payload)
    else:
        render_solve(payload, wide=wide, out_dir=out_dir, top_k=top_k)


def interrupted_line(progress: ProgressDisplay, objective: str) -> str | None:
    """An interrupted search's best plan so far (None before any), which is not written, and how to get it."""
    plan, best_s = progress.best_plan, progress.last.get("best_s")
    if plan is None or best_s is None:
        return None
    return (f"best plan found so far, not written: {best_so_far_text(plan, best_s, objective)}; `--time-limit N` "
            f"(or {TIME_LIMIT_ENV}=N) returns the best plan found within N seconds")
