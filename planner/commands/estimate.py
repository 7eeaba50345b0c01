"""`cli.py estimate`: price one given parallel configuration, no search."""

from __future__ import annotations

from pathlib import Path

import click

from planner.cli_common import echo_json, handle_errors
from planner.commands.options import (
    ASSUMPTION_OPTIONS, CLUSTER_OPTIONS, DISPLAY_OPTIONS, MODEL_OPTIONS, PARALLEL_OVERRIDES, SCRIPT_ARGS,
    TRAINING_OVERRIDES, apply_options, check_plot_dir, load_inputs,
)
from planner.errors import PlannerInputError
from planner.output.plan_dir import write_estimate_plots

# The option (CLI override or Megatron flag) behind each rule of planner/rules.py, for the message.
RULE_FLAGS = {
    "heads_tp": "--tp", "query_groups_tp": "--tp", "ep_needs_experts": "--ep", "experts_ep": "--ep",
    "expert_folding": "--ep/--etp", "seq_cp": "--cp/--seq", "moe_tp_sequence_parallel": "--sequence-parallel",
    "moe_etp_bias": "--etp", "gbs_microbatch": "--gbs/--mbs", "vpp_needs_pp": "--vpp", "vpp_microbatches": "--vpp",
    "layout_layers": "--layout", "layout_stage_count": "--layout", "tp_comm_overlap_sp": "--tp-comm-overlap",
    "overlap_param_gather": "--overlap-param-gather",
}

@click.command("estimate")
@apply_options(MODEL_OPTIONS + CLUSTER_OPTIONS + PARALLEL_OVERRIDES + TRAINING_OVERRIDES + ASSUMPTION_OPTIONS
               + DISPLAY_OPTIONS + SCRIPT_ARGS)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of tables")
@click.option("--quiet", is_flag=True, help="nothing on stderr but errors (no 'wrote N files')")
@click.option("--allow-invalid", is_flag=True,
              help="price a configuration Megatron would refuse (its refusal is printed as a note)")
@handle_errors
def command(model, megatron_args, megatron_script, cluster, profile_dirs, moe_imbalance, plot_dir, wide, as_json,
            quiet, allow_invalid, script_args, **overrides):
    """Price one configuration: iteration time, TFLOP/s/GPU, MFU and memory per stage.

    \b
    python cli.py estimate --megatron-args "--num-layers 32 ... --tensor-model-parallel-size 2" --cluster H100:96
    python cli.py estimate --model mixtral-s --cluster H800:32 --tp 2 --pp 4 --ep 4 --recompute selective
    python cli.py estimate --model mixtral-s --cluster H800:32 --tp 2 --pp 4 --ep 4 --plot plots/mixtral
    """
    from planner.cost.estimate import plan_from_run
    from planner.cost.model import CostModel
    from planner.output.report import estimate_json, render_estimate

    plot_dir = check_plot_dir(plot_dir, None)
    run, cluster_spec, profiles = load_inputs(
        model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
        profile_dirs=profile_dirs, overrides=overrides, moe_imbalance=moe_imbalance, script_args=script_args,
        allow_invalid=allow_invalid,
    )
    plan, notes = plan_from_run(run, cluster_spec, profiles)
    from planner.rules import check_plan, format_violations

    violations = check_plan(run.model, plan, run.training)
    if violations and not allow_invalid:
        raise PlannerInputError(
            " / ".join(sorted({RULE_FLAGS.get(v.rule, "configuration") for v in violations})),
            "Megatron would refuse it: " + format_violations(violations)
            + "; --allow-invalid prices it anyway",
        )
    cost = CostModel(run.model, run.training, cluster_spec, profiles).evaluate(plan)
    from planner.sanity import check_prediction

    check_prediction(cost, "the configuration")
    from planner.cost.notes import unmodelled_notes

    notes = notes + [f"rule {v.rule}: {v.message}" for v in violations] + unmodelled_notes(run.passthrough)
    payload = estimate_json(run, cluster_spec, plan, cost, notes=notes)
    if plot_dir:
        written = write_estimate_plots(Path(plot_dir), payload, plan, cost, cluster_spec)
        if not quiet:
            click.echo(f"wrote {len(written)} files to {plot_dir}", err=True)
    if as_json:
        echo_json(payload)
    else:
        render_estimate(payload, wide=wide)
