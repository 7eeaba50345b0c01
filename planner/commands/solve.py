"""`cli.py solve`: search the 6D space for the fastest plan that fits, and (with --out) write it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from planner.cli_common import FiniteFloat, echo_json, handle_errors, json_text
from planner.commands.options import CLUSTER_OPTIONS, MODEL_OPTIONS, TRAINING_OVERRIDES, apply_options, load_inputs
from planner.output_dir import PLAN_OUTPUT, check_out_dir, write_files

SEARCH_OPTIONS = [
    click.option("--backend", type=click.Choice(["cpsat", "hsdp"]), default="cpsat", show_default=True,
                 help="cpsat: HS-DP screening, then CP-SAT proves the best configurations; hsdp: the DP alone"),
    click.option("--runtime", type=click.Choice(["megatron", "flagscale"]), default="megatron", show_default=True,
                 help="megatron: one DP/recompute for all stages; flagscale: per-stage DP and recompute"),
    click.option("--time-limit", "time_limit_s", type=FiniteFloat(min=0.1), default=60.0, show_default=True,
                 help="seconds for the whole search"),
    click.option("--delta", type=FiniteFloat(min=0.0, max=1.0), default=0.2, show_default=True,
                 help="load-balance tolerance of the paper's pruning"),
    click.option("--no-prune", is_flag=True, help="turn the paper's pruning off (exact search, certified optimum)"),
    click.option("--top", "top_k", type=click.IntRange(min=1), default=1, show_default=True, help="plans to report"),
]


def progress_printer(quiet: bool):
    """Progress on stderr: one updating line on a terminal, a line every few seconds otherwise."""
    tty = sys.stderr.isatty()
    state = {"last": 0.0}

    def show(d: dict) -> None:
        if quiet:
            return
        now = time.monotonic()
        done = d.get("config") == "done"
        if not tty and not done and now - state["last"] < 3.0:
            return
        state["last"] = now
        best = d.get("best_s")
        msg = (f"searching: {d['tried']}/{d['total']} configurations tried, {d['solved']} solved, best "
               f"{best:.3f} s" if best is not None else f"searching: {d['tried']}/{d['total']} configurations tried")
        if tty:
            sys.stderr.write("\r" + msg[:150].ljust(150) + ("\n" if done else ""))
        else:
            sys.stderr.write(msg + "\n")
        sys.stderr.flush()

    return show


def write_outputs(out_dir: Path, payload: dict, outcome) -> list[Path]:
    """plan.json, inputs.json, summary.md and the launcher files (launch/), written all-or-nothing;
    an earlier plan in `out_dir` is replaced as a whole."""
    from planner.launcher import render_launch_files
    from planner.report import summary_markdown

    plan_doc = dict(payload)
    plan_doc["inputs"] = {"run": outcome.run.model_dump(mode="json"),
                          "cluster": outcome.cluster.model_dump(mode="json")}
    files = {
        "plan.json": json_text(plan_doc),
        "inputs.json": json_text(plan_doc["inputs"]),
        "summary.md": summary_markdown(payload),
    }
    launch = render_launch_files(outcome.run, outcome.plans[0], outcome.cluster, getattr(outcome, "script", None))
    files.update({f"launch/{rel}": text for rel, text in launch.items()})
    return write_files(out_dir, files, "--out", PLAN_OUTPUT)


@click.command("solve")
@apply_options(MODEL_OPTIONS + CLUSTER_OPTIONS + TRAINING_OVERRIDES + SEARCH_OPTIONS)
@click.option("--out", "out_dir", default=None, metavar="DIR",
              help="write plan.json, inputs.json, summary.md and the launcher (launch/) here; an earlier plan "
                   "there is replaced, any other non-empty directory is refused")
@click.option("--force", is_flag=True, help="write into a non-empty --out directory that holds no earlier plan")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of tables")
@click.option("--quiet", is_flag=True, help="no progress on stderr")
@handle_errors
def command(model, megatron_args, megatron_script, cluster, profile_dirs, mbs, gbs, seq, backend, runtime,
            time_limit_s, delta, no_prune, top_k, out_dir, force, as_json, quiet):
    """Find the fastest plan that fits: degrees, layers and device type per stage, recompute.

    \b
    python cli.py solve --model mixtral-l --cluster H800:16,MI300X:16,910B:16
    python cli.py solve --model mixtral-s --cluster h800-mi300x --backend hsdp --runtime flagscale --json
    """
    if out_dir is not None:
        check_out_dir(out_dir, "--out", PLAN_OUTPUT, force=force)
    run, cluster_spec, profiles = load_inputs(
        model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
        profile_dirs=profile_dirs, overrides={"gbs": gbs, "seq": seq, "mbs": mbs},
    )
    from planner.api import make_space, solve
    from planner.report import render_solve, solve_json
    from planner.sanity import check_prediction
    from planner.search.driver import SearchSettings

    settings = SearchSettings(backend=backend, delta=None if no_prune else delta, memory_prune=not no_prune,
                              time_limit_s=time_limit_s, top_k=top_k)
    space = make_space(run, runtime, mbs=mbs)
    outcome = solve(run, cluster_spec, profiles, settings=settings, space=space, progress=progress_printer(quiet))
    for rank, cost in enumerate(outcome.costs):
        check_prediction(cost, "the best plan" if rank == 0 else f"plan {rank + 1}")
    if megatron_script:
        from planner.inputs.resolve import load_launcher_script

        outcome.script = load_launcher_script(megatron_script)
    payload = solve_json(outcome, settings, runtime)
    if out_dir is not None:
        written = write_outputs(Path(out_dir), payload, outcome)
        if not as_json:
            click.echo(f"wrote {len(written)} files to {out_dir}", err=True)
    if as_json:
        echo_json(payload)
    else:
        render_solve(payload)
