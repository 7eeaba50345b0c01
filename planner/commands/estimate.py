"""`cli.py estimate`: price one given parallel configuration, no search."""

from __future__ import annotations

from pathlib import Path

import click

from planner.api import estimate, load_estimate_inputs, load_plan_inputs, price_plan
from planner.cli_common import echo_json, handle_errors
from planner.commands.options import (
    ASSUMPTION_OPTIONS, HEADROOM_OPTIONS, MODEL_OPTIONS, PARALLEL_OVERRIDES, SCRIPT_ARGS, TRAINING_OVERRIDES,
    apply_options, check_plot_dir, cluster_options, display_options, input_files, note_printer,
)
from planner.errors import PlannerInputError
from planner.output.plan_dir import write_estimate_plots
from planner.output.report import estimate_json, render_estimate


@click.command("estimate")
@apply_options(MODEL_OPTIONS + cluster_options(required=False) + PARALLEL_OVERRIDES + TRAINING_OVERRIDES
               + ASSUMPTION_OPTIONS + HEADROOM_OPTIONS + display_options(with_out=False) + SCRIPT_ARGS)
@click.option("--plan", "plan_path", default=None, type=click.Path(dir_okay=False), metavar="PLAN.JSON",
              help="price a saved plan instead of the flags' (plan.json of solve --out, a solve --json output, or "
                   "a bare Plan with --model/--cluster); its model and cluster come from the file, --profiles "
                   "re-prices it (e.g. after calibrate); edit its stages to price another plan")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of tables")
@click.option("--quiet", is_flag=True, help="nothing on stderr but errors (no 'wrote N files')")
@click.option("--allow-invalid", is_flag=True,
              help="price a configuration Megatron would refuse (its refusal is printed as a note)")
@handle_errors
def command(model, megatron_args, megatron_script, cluster, profile_dirs, moe_imbalance, memory_headroom, plot_dir,
            wide, as_json, quiet, allow_invalid, script_args, plan_path, **overrides):
    """Price one configuration: iteration time, TFLOP/s/GPU, MFU and memory per stage.

    \b
    python cli.py estimate --megatron-args "--num-layers 32 ... --tensor-model-parallel-size 2" --cluster H100:96
    python cli.py estimate --model mixtral-s --cluster H800:32 --tp 2 --pp 4 --ep 4 --recompute selective
    python cli.py estimate --model mixtral-s --cluster H800:32 --tp 2 --pp 4 --ep 4 --plot plots/mixtral
    python cli.py estimate --plan out/plan.json --profiles calib/      # re-price solve's pick
    """
    given = input_files(model, megatron_script, cluster) + ([plan_path] if plan_path else [])
    plot_dir = check_plot_dir(plot_dir, None, given)
    if plan_path is None:
        if cluster is None:
            raise PlannerInputError("--cluster", "required: the cluster to price on (or --plan with a saved plan "
                                                 "that holds its cluster)")
        inputs, whole, priced_on = load_estimate_inputs(
            model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
            profile_dirs=profile_dirs, overrides=overrides, moe_imbalance=moe_imbalance, script_args=script_args,
            allow_invalid=allow_invalid, on_note=note_printer(quiet),
        )
        priced = estimate(inputs, allow_invalid=allow_invalid, memory_headroom=memory_headroom)
    else:
        changed = sorted(f"--{k.replace('_', '-')}" for k, v in overrides.items() if v is not None)
        if changed:
            raise PlannerInputError("--plan", f"prices the plan and run the file holds; {', '.join(changed)} would "
                                              "change them: edit the file (its plan, or inputs.run), or give them "
                                              "without --plan")
        inputs, plan, data, priced_on = load_plan_inputs(
            plan_path, model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
            script_args=script_args, profile_dirs=profile_dirs, moe_imbalance=moe_imbalance)
        headroom = memory_headroom if memory_headroom is not None else data.get("memory_headroom")
        priced = price_plan(inputs, plan, [], allow_invalid=allow_invalid, memory_headroom=headroom, saved=True)
        whole = inputs.cluster
    # what is priced (a --megatron-script's GPUs, a saved plan's edited inputs) is part of the result: in `notes`
    payload = estimate_json(inputs.run, whole, priced.plan, priced.cost, notes=priced_on + priced.notes,
                            time_range=priced.time_range, profiles=inputs.profiles)
    if plot_dir:
        written = write_estimate_plots(Path(plot_dir), payload, priced.plan, priced.cost, inputs.cluster,
                                       inputs=given, saved=plan_path is not None)
        if not quiet:
            click.echo(f"wrote {len(written)} files to {plot_dir}", err=True)
    if as_json:
        echo_json(payload)
    else:
        render_estimate(payload, wide=wide)
