"""`cli.py compare`: both backends (and brute force when the case is small) side by side, with the
gap between each plan and the best proven bound.  `--layers N` keeps only the first N decoder
layers of the model, so brute force can run on a reduced preset."""

from __future__ import annotations

import time

import click

from planner.cli_common import FiniteFloat, echo_json, handle_errors
from planner.commands.options import CLUSTER_OPTIONS, MODEL_OPTIONS, TRAINING_OVERRIDES, apply_options, load_inputs
from planner.errors import PlannerInputError

BRUTE_MAX_LAYERS = 12
BRUTE_MAX_GPUS = 32


def reduce_layers(run, layers: int):
    """The run with its model cut to the first `layers` decoder layers (MoE pattern cut alike)."""
    from planner.errors import PlannerInputError

    model = run.model
    if layers > model.num_layers:
        raise PlannerInputError("--layers", f"{layers} is more than the model's {model.num_layers} layers")
    update = {"num_layers": layers}
    if model.moe_layer_pattern is not None:
        update["moe_layer_pattern"] = tuple(model.moe_layer_pattern[:layers])
    reduced = model.model_validate({**model.model_dump(), **update})
    return run.model_copy(update={"model": reduced})


def compare_rows(run, cluster_spec, profiles, *, runtime: str, backends: list[str], time_limit_s: float,
                 delta: float, no_prune: bool, contiguous_types: bool = False) -> list[dict]:
    """Solve with each backend in turn, the time limit shared between them (each gets what is
    left divided by the backends still to run), and return one row per backend."""
    from planner.api import make_space, solve
    from planner.errors import SearchTimeLimitError
    from planner.sanity import check_prediction
    from planner.search.pruning import Pruning
    from planner.search.settings import SearchSettings

    space = make_space(run, runtime, contiguous_types=contiguous_types or None)
    end = time.perf_counter() + time_limit_s
    rows = []
    for k, name in enumerate(backends):
        share = max(0.1, (end - time.perf_counter()) / (len(backends) - k))
        settings = SearchSettings(backend=name, pruning=Pruning(delta=delta), time_limit_s=share)
        if no_prune:
            settings = settings.without_pruning()
        try:
            out = solve(run, cluster_spec, profiles, settings=settings, space=space)
        except SearchTimeLimitError:
            rows.append({"backend": name, "status": "UNKNOWN", "objective_s": None, "iteration_time_s": None,
                         "lower_bound_s": None, "gap": None, "certified_optimal": False, "search_time_s": share,
                         "configs_solved": 0, "plan": "(no plan within its share of the time limit)"})
            continue
        check_prediction(out.costs[0], f"the {name} plan")
        r = out.result
        it = out.costs[0].iteration_time_s
        lb = r.lower_bound_s
        rows.append({
            "backend": name, "status": r.status, "objective_s": it, "iteration_time_s": it,
            "solver_objective_s": r.best[0].objective_s, "lower_bound_s": lb,
            "gap": max(0.0, (it - lb) / it) if lb is not None else None,
            "pruned_space_status": r.pruned_space_status,
            "certified_optimal": r.certified_optimal, "search_time_s": r.search_time_s, "timed_out": r.timed_out,
            "configs_solved": r.configs_solved, "plan": r.best[0].g.label(),
        })
    found = [row["objective_s"] for row in rows if row["objective_s"] is not None]
    ref = min(found) if found else None
    for row in rows:
        row["vs_best"] = row["objective_s"] / ref - 1.0 if ref and row["objective_s"] is not None else None
    return rows


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


@click.command("compare")
@apply_options(MODEL_OPTIONS + CLUSTER_OPTIONS + TRAINING_OVERRIDES)
@click.option("--runtime", type=click.Choice(["megatron", "flagscale"]), default="megatron", show_default=True)
@click.option("--time-limit", "time_limit_s", type=FiniteFloat(min=0.1), default=60.0, show_default=True,
              help="seconds for the whole comparison, shared between the backends")
@click.option("--delta", type=FiniteFloat(min=0.0, max=1.0), default=0.2, show_default=True)
@click.option("--no-prune", is_flag=True, help="compare the exact searches (pruning off)")
@click.option("--contiguous-types", is_flag=True, help="megatron: each device type's stages in one block")
@click.option("--layers", type=click.IntRange(min=1), default=None,
              help="keep only the first N decoder layers of the model (a reduced preset brute force can solve)")
@click.option("--brute/--no-brute", default=None, help="force brute force on or off (default: only when small)")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def command(model, megatron_args, megatron_script, cluster, profile_dirs, mbs, gbs, seq, runtime, time_limit_s,
            delta, no_prune, contiguous_types, layers, brute, as_json):
    """Run cpsat, hsdp (and brute force when small) on one request; print objective, bound, gap, time."""
    run, cluster_spec, profiles = load_inputs(
        model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
        profile_dirs=profile_dirs, overrides={"gbs": gbs, "seq": seq, "mbs": mbs},
    )
    if layers is not None:
        run = reduce_layers(run, layers)
    small = run.model.num_layers <= BRUTE_MAX_LAYERS and cluster_spec.world_size <= BRUTE_MAX_GPUS
    if brute and not small:
        raise PlannerInputError(
            "--brute", f"brute force enumerates every plan and is for small cases (at most {BRUTE_MAX_LAYERS} layers "
                       f"and {BRUTE_MAX_GPUS} GPUs); this one has {run.model.num_layers} layers on "
                       f"{cluster_spec.world_size} GPUs: drop --brute",
        )
    backends = ["hsdp", "cpsat"] + (["brute"] if (brute if brute is not None else small) else [])
    rows = compare_rows(run, cluster_spec, profiles, runtime=runtime, backends=backends, time_limit_s=time_limit_s,
                        delta=delta, no_prune=no_prune, contiguous_types=contiguous_types)
    if as_json:
        echo_json({"model": run.model.name, "num_layers": run.model.num_layers, "cluster": cluster_spec.describe(),
                   "runtime": runtime, "pruning": not no_prune, "results": rows})
        return
    click.echo(f"{run.model.name} ({run.model.num_layers} layers) on {cluster_spec.describe()} ({runtime}; "
               f"pruning {'off' if no_prune else 'on'})")
    for line in gap_lines(rows):
        click.echo(line)
