"""`cli.py compare`: both backends (and brute force when the case is small) side by side."""

from __future__ import annotations

import click

from planner.cli_common import FiniteFloat, echo_json, handle_errors
from planner.commands.options import CLUSTER_OPTIONS, MODEL_OPTIONS, TRAINING_OVERRIDES, apply_options, load_inputs
from planner.errors import PlannerInputError

BRUTE_MAX_LAYERS = 12
BRUTE_MAX_GPUS = 32


@click.command("compare")
@apply_options(MODEL_OPTIONS + CLUSTER_OPTIONS + TRAINING_OVERRIDES)
@click.option("--runtime", type=click.Choice(["megatron", "flagscale"]), default="megatron", show_default=True)
@click.option("--time-limit", "time_limit_s", type=FiniteFloat(min=0.1), default=60.0, show_default=True)
@click.option("--delta", type=FiniteFloat(min=0.0, max=1.0), default=0.2, show_default=True)
@click.option("--no-prune", is_flag=True, help="compare the exact searches (pruning off)")
@click.option("--brute/--no-brute", default=None, help="force brute force on or off (default: only when small)")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def command(model, megatron_args, megatron_script, cluster, profile_dirs, mbs, gbs, seq, runtime, time_limit_s,
            delta, no_prune, brute, as_json):
    """Run cpsat, hsdp (and brute force when small) on one request; print objective, bound, gap, time."""
    run, cluster_spec, profiles = load_inputs(
        model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
        profile_dirs=profile_dirs, overrides={"gbs": gbs, "seq": seq, "mbs": mbs},
    )
    from planner.api import make_space, solve
    from planner.sanity import check_prediction
    from planner.search.driver import SearchSettings

    small = run.model.num_layers <= BRUTE_MAX_LAYERS and cluster_spec.world_size <= BRUTE_MAX_GPUS
    if brute and not small:
        raise PlannerInputError(
            "--brute", f"brute force enumerates every plan and is for small cases (at most {BRUTE_MAX_LAYERS} layers "
                       f"and {BRUTE_MAX_GPUS} GPUs); this one has {run.model.num_layers} layers on "
                       f"{cluster_spec.world_size} GPUs: drop --brute",
        )
    backends = ["hsdp", "cpsat"] + (["brute"] if (brute if brute is not None else small) else [])
    space = make_space(run, runtime, mbs=mbs)
    rows = []
    for name in backends:
        settings = SearchSettings(backend=name, delta=None if no_prune else delta, memory_prune=not no_prune,
                                  time_limit_s=time_limit_s)
        out = solve(run, cluster_spec, profiles, settings=settings, space=space)
        check_prediction(out.costs[0], f"the {name} plan")
        r = out.result
        rows.append({
            "backend": name, "status": r.status, "objective_s": r.best[0].objective_s,
            "iteration_time_s": out.costs[0].iteration_time_s, "lower_bound_s": r.lower_bound_s,
            "gap": max(0.0, (r.best[0].objective_s - r.lower_bound_s) / r.best[0].objective_s),
            "certified_optimal": r.certified_optimal, "search_time_s": r.search_time_s,
            "configs_solved": r.configs_solved, "plan": r.best[0].g.label(),
        })
    ref = min(row["objective_s"] for row in rows)
    for row in rows:
        row["vs_best"] = row["objective_s"] / ref - 1.0
    if as_json:
        echo_json({"model": run.model.name, "cluster": cluster_spec.describe(), "runtime": runtime,
                   "pruning": not no_prune, "results": rows})
        return
    click.echo(f"{run.model.name} on {cluster_spec.describe()} ({runtime}; pruning {'off' if no_prune else 'on'})")
    click.echo(f"{'backend':8s} {'status':9s} {'objective s':>12s} {'bound s':>12s} {'gap':>7s} {'vs best':>8s} "
               f"{'time s':>8s} {'solved':>7s}  configuration")
    for row in rows:
        status = "OPTIMAL" if row["certified_optimal"] else "FEASIBLE"  # one vocabulary (planner.report)
        click.echo(f"{row['backend']:8s} {status:9s} {row['objective_s']:12.4f} {row['lower_bound_s']:12.4f} "
                   f"{row['gap'] * 100:6.2f}% {row['vs_best'] * 100:7.2f}% {row['search_time_s']:8.2f} "
                   f"{row['configs_solved']:7d}  {row['plan']}")
