"""`cli.py estimate`: price one given parallel configuration, no search."""

from __future__ import annotations

import click

from planner.cli_common import echo_json, handle_errors
from planner.commands.options import (
    CLUSTER_OPTIONS, MODEL_OPTIONS, PARALLEL_OVERRIDES, SCRIPT_ARGS, TRAINING_OVERRIDES, apply_options, load_inputs,
)
from planner.errors import PlannerInputError


@click.command("estimate")
@apply_options(MODEL_OPTIONS + CLUSTER_OPTIONS + PARALLEL_OVERRIDES + TRAINING_OVERRIDES + SCRIPT_ARGS)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of tables")
@click.option("--allow-invalid", is_flag=True,
              help="price a configuration Megatron would refuse (its refusal is printed as a note)")
@handle_errors
def command(model, megatron_args, megatron_script, cluster, profile_dirs, as_json, allow_invalid, script_args,
            **overrides):
    """Price one configuration: iteration time, TFLOP/s/GPU, MFU and memory per stage.

    \b
    python cli.py estimate --megatron-args "--num-layers 32 ... --tensor-model-parallel-size 2" --cluster H100:96
    python cli.py estimate --model mixtral-s --cluster H800:32 --tp 2 --pp 4 --ep 4 --recompute selective
    """
    from planner.cost.estimate import plan_from_run
    from planner.cost.model import CostModel
    from planner.report import estimate_json, render_estimate

    run, cluster_spec, profiles = load_inputs(
        model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
        profile_dirs=profile_dirs, overrides=overrides, script_args=script_args, allow_invalid=allow_invalid,
    )
    plan, notes = plan_from_run(run, cluster_spec, profiles)
    from planner.rules import check_plan, format_violations

    violations = check_plan(run.model, plan, run.training)
    if violations and not allow_invalid:
        raise PlannerInputError(
            "configuration", "Megatron would refuse it: " + format_violations(violations)
            + "; --allow-invalid prices it anyway",
        )
    cost = CostModel(run.model, run.training, cluster_spec, profiles).evaluate(plan)
    payload = estimate_json(run, cluster_spec, plan, cost, notes=notes + [f"rule {v.rule}: {v.message}" for v in violations])
    if as_json:
        echo_json(payload)
    else:
        render_estimate(payload)
