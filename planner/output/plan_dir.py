"""What `solve` and `estimate` write: the plan directory of `solve --out` and the picture
directories of `--plot DIR`, each filled in a staging directory (planner/output/run_dir.py)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from planner.cli_common import json_text
from planner.inputs.plan_file import made_for
from planner.launcher import render_launch_files
from planner.output.plots import write_plots
from planner.output.report import estimate_summary_markdown, summary_markdown
from planner.output.run_dir import PLAN_OUTPUT, PLOTS_OUTPUT, StagedOutput, fill
from planner.trials import TRIAL_OVERRIDES


def plot_files(tmp: Path, payload: dict, outcome, user, *, prefix: str = "",
               time_left: Callable[[], float] | None = None) -> dict[str, str]:
    """Draw the plan's pictures into `tmp`; returns {plot name: path relative to summary.md} (and
    adds notes for plots that could not be drawn, or were not for want of time, to the payload)."""
    title = f"{payload['model']} on {payload['cluster']}"
    mine = (user.plan, user.cost, user.source) if user is not None and user.cost is not None else None
    images, notes = write_plots(tmp, outcome.plans[0], outcome.costs[0], outcome.cluster, title=title, user=mine,
                                time_left=time_left, hosts=outcome.hosts)
    payload["notes"] = list(payload["notes"]) + notes
    return {name: prefix + rel for name, rel in images.items()}


def plan_record(outcome) -> dict:
    """What `emit` reads besides the plan: `inputs` (the resolved run and cluster, and the input launcher, from
    which emit rebuilds the launcher without the file) and `made_for` (their SHA-256, to tell an edit).  plan.json
    and `solve --json` both carry it, so that emit takes either."""
    inputs = {"run": outcome.run.model_dump(mode="json"), "cluster": outcome.cluster.model_dump(mode="json")}
    script = outcome.script
    if script is not None:
        inputs["script"] = {"path": script.path, "args": list(script.args), "extra_flags": list(script.extra_flags),
                            "text": script.text}
    return {"inputs": inputs, "made_for": made_for(outcome.run, outcome.cluster, outcome.profiles)}


def write_plan_dir(out_dir: Path, payload: dict, outcome, user=None, *, force: bool = False,
                   inputs: Sequence[Path | str] = (), time_left: Callable[[], float] | None = None,
                   trials: Sequence = (), top_k: int = 1) -> list[Path]:
    """plan.json, inputs.json, summary.md, the plots (plots/), the launcher files (launch/) and each trial's
    launcher and plan.json (trials/<name>/, planner/trials.py), written all-or-nothing (never over a file the
    planner did not write, nor over an input)."""
    staged = StagedOutput(out_dir, "--out", PLAN_OUTPUT, force=force, inputs=inputs)
    with staged as tmp:
        images = plot_files(tmp / "plots", payload, outcome, user, prefix="plots/", time_left=time_left)
        payload["plots"] = images
        plan_doc = dict(payload) | plan_record(outcome)
        script = outcome.script
        (tmp / "plan.json").write_text(json_text(plan_doc))
        (tmp / "inputs.json").write_text(json_text(plan_doc["inputs"]))
        (tmp / "summary.md").write_text(summary_markdown(payload, images, top_k))
        fill(tmp / "launch", render_launch_files(outcome.run, outcome.plans[0], outcome.cluster, script,
                                                  profiles=outcome.profiles, hosts=outcome.hosts))
        for trial, entry in zip(trials, payload.get("trials", [])):
            written = os.path.abspath(Path(out_dir) / "trials" / trial.name)  # the log's place for a spool copy
            fill(tmp / "trials" / trial.name, {
                **render_launch_files(outcome.run, trial.plan, outcome.cluster, script, profiles=outcome.profiles,
                                      hosts=outcome.hosts, overrides=replace(TRIAL_OVERRIDES, log_dir=written)),
                "plan.json": json_text({**entry, "model": payload["model"], "cluster": payload["cluster"],
                                        "inputs": plan_doc["inputs"], "made_for": plan_doc["made_for"]}),
            })
    return staged.written


def write_solve_plots(plot_dir: Path, payload: dict, outcome, user=None, *, inputs: Sequence[Path | str] = (),
                      time_left: Callable[[], float] | None = None, top_k: int = 1) -> list[Path]:
    """`solve --plot DIR` without --out: the pictures, their data and a summary.md that shows them."""
    plot_dir = Path(plot_dir)
    staged = StagedOutput(plot_dir, "--plot", PLOTS_OUTPUT, inputs=inputs)
    with staged as tmp:
        images = plot_files(tmp, payload, outcome, user, time_left=time_left)
        payload["plots"] = {name: str(plot_dir / rel) for name, rel in images.items()}
        (tmp / "summary.md").write_text(summary_markdown(payload, images, top_k))
    return staged.written


def write_estimate_plots(plot_dir: Path, payload: dict, plan, cost, cluster, *,
                         inputs: Sequence[Path | str] = (), saved: bool = False) -> list[Path]:
    """The estimate's pictures, their data and a summary.md, written all-or-nothing into `plot_dir`: the flags'
    plan placed in Megatron's rank order (as the flags run it), a `saved` plan (estimate --plan) as its launcher
    places it (a FlagScale plan's stages on their own device types)."""
    plot_dir = Path(plot_dir)
    staged = StagedOutput(plot_dir, "--plot", PLOTS_OUTPUT, inputs=inputs)
    with staged as tmp:
        images, notes = write_plots(tmp, plan, cost, cluster, title=f"{payload['model']} on {payload['cluster']}",
                                    rank_order=not saved)
        payload["notes"] = list(payload["notes"]) + notes
        payload["plots"] = {name: str(plot_dir / rel) for name, rel in images.items()}
        (tmp / "summary.md").write_text(estimate_summary_markdown(payload, images))
    return staged.written
