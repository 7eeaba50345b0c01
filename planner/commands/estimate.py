"""`cli.py estimate`: price one given parallel configuration, no search."""

from __future__ import annotations

from pathlib import Path

import click

from planner.api import estimate, load_inputs
from planner.cli_common import echo_json, handle_errors
from planner.commands.options import (
    ASSUMPTION_OPTIONS, CLUSTER_OPTIONS, DISPLAY_OPTIONS, HEADROOM_OPTIONS, MODEL_OPTIONS, PARALLEL_OVERRIDES,
    SCRIPT_ARGS, TRAINING_OVERRIDES, apply_options, check_plot_dir, note_printer,
)
from planner.output.plan_dir import write_estimate_plots
from planner.output.report import estimate_json, render_estimate


@click.command("estimate")
@apply_options(MODEL_OPTIONS + CLUSTER_OPTIONS + PARALLEL_OVERRIDES + TRAINING_OVERRIDES + ASSUMPTION_OPTIONS
               + HEADROOM_OPTIONS + DISPLAY_OPTIONS + SCRIPT_ARGS)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of tables")
@click.option("--quiet", is_flag=True, help="nothing on stderr but errors (no 'wrote N files')")
@click.option("--allow-invalid", is_flag=True,
              help="price a configuration Megatron would refuse (its refusal is printed as a note)")
@handle_errors
def command(model, megatron_args, megatron_script, cluster, profile_dirs, moe_imbalance, memory_headroom, plot_dir,
            wide, as_json, quiet, allow_invalid, script_args, **overrides):
    """Price one configuration: iteration time, TFLOP/s/GPU, MFU and memory per stage.

    \b
    python cli.py estimate --megatron-args "--num-layers 32 ... --tensor-model-parallel-size 2" --cluster H100:96
    python cli.py estimate --model mixtral-s --cluster H800:32 --tp 2 --pp 4 --ep 4 --recompute selective
    python cli.py estimate --model mixtral-s --cluster H800:32 --tp 2 --pp 4 --ep 4 --plot plots/mixtral
    """
    plot_dir = check_plot_dir(plot_dir, None)
    inputs = load_inputs(
        model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
        profile_dirs=profile_dirs, overrides=overrides, moe_imbalance=moe_imbalance, script_args=script_args,
        allow_invalid=allow_invalid, on_note=note_printer(),
    )
    priced = estimate(inputs, allow_invalid=allow_invalid, memory_headroom=memory_headroom)
    payload = estimate_json(inputs.run, inputs.cluster, priced.plan, priced.cost, notes=priced.notes,
                            time_range=priced.time_range)
    if plot_dir:
        written = write_estimate_plots(Path(plot_dir), payload, priced.plan, priced.cost, inputs.cluster)
        if not quiet:
            click.echo(f"wrote {len(written)} files to {plot_dir}", err=True)
    if as_json:
        echo_json(payload)
    else:
        render_estimate(payload, wide=wide)
