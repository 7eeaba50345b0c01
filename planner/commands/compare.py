"""`cli.py compare`: both backends (and brute force when the case is small) side by side, with the
gap between each plan and the best proven bound.  `--layers N` keeps only the first N decoder
layers of the model, so brute force can run on a reduced preset.  Results that contradict each other (a
backend's lower bound above another backend's plan: a false certificate) are named, one line each, and
the command exits with status 1."""

from __future__ import annotations

import time

import click

from planner.api import (
    OBJECTIVES, compare_backends, contradictions, left_out_json, left_out_lines, load_inputs, reduce_layers,
    runtime_choice,
)
from planner.api_search import compare_rows
from planner.cli_common import FiniteFloat, echo_json, handle_errors
from planner.commands.options import (
    CLUSTER_OPTIONS, HEADROOM_OPTIONS, MODEL_OPTIONS, SCRIPT_ARGS, TRAINING_OVERRIDES, apply_options, note_printer,
    time_limit_option,
)
from planner.inputs.cluster import describe_cluster
from planner.output.report import SCHEMA_VERSION, recompute_short
from planner.runtime import AUTO, RUNTIME_CHOICES
from planner.time_budget import Budget, reading_within


def gap_lines(rows: list[dict]) -> list[str]:
    """The table, one line per backend: status, objective, bound, gap, time."""
    def f(x, fmt):
        return format(x, fmt) if x is not None else "-"

    out = [f"{'backend':8s} {'status':9s} {'objective s':>12s} {'bound s':>12s} {'gap':>8s} {'vs best':>8s} "
           f"{'time s':>8s} {'solved':>7s}  configuration"]
    for row in rows:
        gap = f"{row['gap'] * 100:7.3f}%" if row["gap"] is not None else f"{'-':>8s}"
        vs = f"{row['vs_best'] * 100:7.2f}%" if row["vs_best"] is not None else f"{'-':>8s}"
        out.append(f"{row['backend']:8s} {row['status']:9s} {f(row['objective_s'], '12.4f'):>12s} "
                   f"{f(row['lower_bound_s'], '12.4f'):>12s} {gap} {vs} {row['search_time_s']:8.2f} "
                   f"{row['configs_solved']:7d}  {row['plan']}")
    return out


def stage_lines(rows: list[dict]) -> list[str]:
    """Each plan's stages (device type, layers, DP, micro-batch, recompute), one line per distinct plan naming the
    backends that found it: the table's configuration leaves them out under FlagScale's per-stage meshes."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        if row.get("stages"):
            text = " | ".join(f"S{s['index']} {s['device_type']} {s['num_layers']} layer{'' if s['num_layers'] == 1 else 's'} DP{s['dp']} "
                              f"mbs{s['micro_batch_size']} {recompute_short(s['recompute'])}" for s in row["stages"])
            groups.setdefault(text, []).append(row["backend"])
    return [f"stages ({', '.join(names)}): {text}" for text, names in groups.items()]


@click.command("compare")
@apply_options(MODEL_OPTIONS + CLUSTER_OPTIONS + TRAINING_OVERRIDES)
@click.option("--runtime", type=click.Choice(list(RUNTIME_CHOICES)), default=AUTO, show_default=True,
              help="as solve's --runtime (profiles/runtimes.yaml)")
@time_limit_option("seconds for the whole comparison, shared between the backends")
@click.option("--delta", type=FiniteFloat(min=0.0, max=1.0), default=0.2, show_default=True,
              help="load-balance tolerance of the paper's pruning, as solve's --delta (with pruning on)")
@click.option("--no-prune", is_flag=True, help="compare the exact searches (pruning off)")
@click.option("--contiguous-types", is_flag=True, help="megatron: each device type's stages in one block")
@click.option("--layers", type=click.IntRange(min=1), default=None,
              help="keep only the first N decoder layers of the model (a reduced preset brute force can solve)")
@click.option("--brute/--no-brute", default=None, help="force brute force on or off (default: only when small)")
@click.option("--objective", type=click.Choice(list(OBJECTIVES)), default="pessimistic", show_default=True,
              help="what the backends minimise: the top of each plan's range, or the nominal time")
@apply_options(HEADROOM_OPTIONS + SCRIPT_ARGS)
@click.option("--json", "as_json", is_flag=True,
              help="print one JSON object instead of tables (contradictions still go to stderr)")
@handle_errors
def command(model, megatron_args, megatron_script, cluster, profile_dirs, mbs, gbs, seq, runtime, time_limit_s,
            delta, no_prune, contiguous_types, layers, brute, objective, memory_headroom, as_json, script_args):
    """Run cpsat, hsdp (and brute force when small) on one request; print objective, bound, gap, time.

    \b
    python cli.py compare --model mixtral-s --cluster H800:8 --layers 4
    python cli.py compare --megatron-script train.sh --cluster H800:8 --layers 4 -- /ckpt /tokenizer /data

    Exit status 1 when the results contradict each other (a backend's lower bound above another's plan)."""
    budget = Budget.start(time_limit_s)  # reading the inputs counts too
    with reading_within(budget):
        inputs = load_inputs(
            model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
            profile_dirs=profile_dirs, overrides={"gbs": gbs, "seq": seq, "mbs": mbs}, script_args=script_args,
            on_note=note_printer(), script_deadline=budget.reading_deadline_monotonic(),
        )
    run, cluster_spec, profiles = inputs.run, inputs.cluster, inputs.profiles
    if layers is not None:
        run = reduce_layers(run, layers)
    backends = compare_backends(run, cluster_spec, brute)
    left_s = max(0.1, budget.search_deadline - time.perf_counter())
    choice = runtime_choice(runtime, cluster_spec, profiles, run, memory_headroom)
    rows = compare_rows(run, cluster_spec, profiles, runtime=runtime, backends=backends, time_limit_s=left_s,
                        delta=delta, no_prune=no_prune, contiguous_types=contiguous_types, objective=objective,
                        memory_headroom=memory_headroom, choice=choice)
    left_out = left_out_json(choice, cluster_spec)
    runtime = rows[0].get("runtime", runtime) if rows else runtime
    false = contradictions(rows)
    if as_json:
        echo_json({"schema_version": SCHEMA_VERSION, "model": run.model.name,
                   "num_layers": run.model.num_layers, "cluster": describe_cluster(cluster_spec, profiles),
                   "runtime": runtime, "pruning": not no_prune, "objective": objective, "results": rows,
                   "contradictions": false, "left_out": left_out})
    else:
        click.echo(f"{run.model.name} ({run.model.num_layers} layers) on {describe_cluster(cluster_spec, profiles)} "
                   f"({runtime}; pruning {'off' if no_prune else 'on'}; objective: {objective} time)")
        for line in gap_lines(rows) + stage_lines(rows):
            click.echo(line)
        for line in left_out_lines(choice, cluster_spec, profiles):
            click.echo(f"note: {line}")
    for line in false:  # a false bound is a bug of the planner: a line each (on stderr beside the JSON), exit status 1
        click.echo(f"contradiction: {line}", err=as_json)
    if false:
        raise SystemExit(1)
