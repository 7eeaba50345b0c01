"""`cli.py solve`: search the 6D space for the fastest plan that fits, and (with --out) write it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from planner.cli_common import echo_json, handle_errors
from planner.commands.options import CLUSTER_OPTIONS, MODEL_OPTIONS, TRAINING_OVERRIDES, apply_options, load_inputs

OUTPUT_RESERVE_S = 0.5  # of --time-limit, kept for pricing, checking and writing the plan

SEARCH_OPTIONS = [
    click.option("--backend", type=click.Choice(["cpsat", "hsdp"]), default="cpsat", show_default=True,
                 help="cpsat: HS-DP screens the configurations, then a CP-SAT master over the degrees, with "
                      "CP-SAT stage subproblems, certifies the answer; hsdp: the dynamic program alone"),
    click.option("--runtime", type=click.Choice(["megatron", "flagscale"]), default="megatron", show_default=True,
                 help="megatron: one DP/recompute for all stages; flagscale: per-stage DP and recompute"),
    click.option("--time-limit", "time_limit_s", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
                 help="seconds for the whole search"),
    click.option("--delta", type=click.FloatRange(min=0.0, max=1.0), default=0.2, show_default=True,
                 help="load-balance tolerance of the paper's pruning"),
    click.option("--no-prune", is_flag=True,
                 help="turn every pruning off (load balance, memory, CP on short sequences): the whole space, "
                      "certified optimum"),
    click.option("--contiguous-types", is_flag=True,
                 help="megatron runtime: keep each device type's stages in one contiguous block (FlagScale "
                      "always does; upstream Megatron does not need it)"),
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
        best, bound = d.get("best_s"), d.get("bound_s")
        msg = (f"searching ({d.get('phase', '')}, {d.get('elapsed_s', 0.0):.1f} s): "
               f"{d['tried']}/{d['total']} configurations")
        if best is not None:
            msg += f", {d['solved']} solved, best {best:.3f} s"
        if bound is not None and not done:
            msg += f", bound {bound:.3f} s"
        if tty:
            sys.stderr.write("\r" + msg[:150].ljust(150) + ("\n" if done else ""))
        else:
            sys.stderr.write(msg + "\n")
        sys.stderr.flush()

    return show


def write_outputs(out_dir: Path, payload: dict, outcome) -> list[Path]:
    """plan.json, inputs.json, summary.md and the launcher files, written all-or-nothing."""
    import shutil
    import tempfile

    from planner.report import summary_markdown

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".hapmoe-", dir=out_dir.parent))
    try:
        plan_doc = dict(payload)
        plan_doc["inputs"] = {"run": outcome.run.model_dump(mode="json"),
                              "cluster": outcome.cluster.model_dump(mode="json")}
        (tmp / "plan.json").write_text(json.dumps(plan_doc, indent=2, default=str))
        (tmp / "inputs.json").write_text(json.dumps(plan_doc["inputs"], indent=2, default=str))
        (tmp / "summary.md").write_text(summary_markdown(payload))
        from planner.launcher import write_launch_files

        write_launch_files(outcome.run, outcome.plans[0], outcome.cluster, tmp / "launch",
                           script=getattr(outcome, "script", None))
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for item in sorted(tmp.rglob("*")):
            if item.is_file():
                dest = out_dir / item.relative_to(tmp)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(item), dest)
                written.append(dest)
        return written
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@click.command("solve")
@apply_options(MODEL_OPTIONS + CLUSTER_OPTIONS + TRAINING_OVERRIDES + SEARCH_OPTIONS)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="write plan.json, inputs.json, summary.md and the launcher (launch/) here")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of tables")
@click.option("--quiet", is_flag=True, help="no progress on stderr")
@handle_errors
def command(model, megatron_args, megatron_script, cluster, profile_dirs, mbs, gbs, seq, backend, runtime,
            time_limit_s, delta, no_prune, contiguous_types, top_k, out_dir, as_json, quiet):
    """Find the fastest plan that fits: degrees, layers and device type per stage, recompute.

    \b
    python cli.py solve --model mixtral-l --cluster H800:16,MI300X:16,910B:16
    python cli.py solve --model mixtral-s --cluster h800-mi300x --backend hsdp --runtime flagscale --json
    """
    from planner.api import make_space, solve
    from planner.report import render_solve, solve_json
    from planner.search.driver import SearchSettings

    # the time limit counts from here (reading the inputs included), less a little for the output
    deadline = time.perf_counter() + time_limit_s - min(OUTPUT_RESERVE_S, 0.02 * time_limit_s)
    run, cluster_spec, profiles = load_inputs(
        model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
        profile_dirs=profile_dirs, overrides={"gbs": gbs, "seq": seq, "mbs": mbs},
    )
    settings = SearchSettings(backend=backend, delta=delta, time_limit_s=time_limit_s, top_k=top_k, deadline=deadline)
    if no_prune:
        settings = settings.without_pruning()
    space = make_space(run, runtime, mbs=mbs, contiguous_types=contiguous_types or None)
    outcome = solve(run, cluster_spec, profiles, settings=settings, space=space, progress=progress_printer(quiet))
    if megatron_script:
        from planner.inputs.script import read_launcher_script

        outcome.script = read_launcher_script(megatron_script)
    payload = solve_json(outcome, settings, runtime)
    if out_dir:
        written = write_outputs(Path(out_dir), payload, outcome)
        if not as_json:
            click.echo(f"wrote {len(written)} files to {out_dir}", err=True)
    if as_json:
        echo_json(payload)
    else:
        render_solve(payload)
