"""`cli.py estimate`: price one given parallel configuration, no search."""

from __future__ import annotations

import click

from planner.cli_common import echo_json, handle_errors
from planner.commands.options import (
    CLUSTER_OPTIONS, MODEL_OPTIONS, PARALLEL_OVERRIDES, TRAINING_OVERRIDES, apply_options, load_inputs,
)
from planner.errors import PlannerInputError

# The option (CLI override or Megatron flag) behind each rule of planner/rules.py, for the message.
RULE_FLAGS = {
    "heads_tp": "--tp", "query_groups_tp": "--tp", "ep_needs_experts": "--ep", "experts_ep": "--ep",
    "expert_folding": "--ep/--etp", "seq_cp": "--cp/--seq", "moe_tp_sequence_parallel": "--sequence-parallel",
    "moe_etp_bias": "--etp", "gbs_microbatch": "--gbs/--mbs", "vpp_needs_pp": "--vpp", "vpp_microbatches": "--vpp",
    "layout_layers": "--layout", "layout_stage_count": "--layout", "tp_comm_overlap_sp": "--tp-comm-overlap",
    "overlap_param_gather": "--overlap-param-gather",
}


@click.command("estimate")
@apply_options(MODEL_OPTIONS + CLUSTER_OPTIONS + PARALLEL_OVERRIDES + TRAINING_OVERRIDES)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of tables")
@handle_errors
def command(model, megatron_args, megatron_script, cluster, profile_dirs, as_json, **overrides):
    """Price one configuration: iteration time, TFLOP/s/GPU, MFU and memory per stage.

    \b
    python cli.py estimate --megatron-args "--num-layers 32 ... --tensor-model-parallel-size 2" --cluster H100:96
    python cli.py estimate --model mixtral-s --cluster H800:32 --tp 2 --pp 4 --ep 4 --recompute selective
    """
    run, cluster_spec, profiles = load_inputs(
        model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster,
        profile_dirs=profile_dirs, overrides=overrides,
    )
    from planner.cost.estimate import plan_from_run
    from planner.cost.model import CostModel
    from planner.report import estimate_json, render_estimate
    from planner.rules import check_plan
    from planner.sanity import check_prediction

    plan, notes = plan_from_run(run, cluster_spec, profiles)
    violations = check_plan(run.model, plan, run.training)
    if violations:
        flags = sorted({RULE_FLAGS.get(v.rule, "--megatron-args") for v in violations})
        raise PlannerInputError(
            " / ".join(flags),
            f"the configuration breaks {len(violations)} rule(s) Megatron enforces: "
            + "; ".join(f"{v.message} ({v.hint})" for v in violations),
        )
    cost = CostModel(run.model, run.training, cluster_spec, profiles).evaluate(plan)
    check_prediction(cost, "the configuration")
    payload = estimate_json(run, cluster_spec, plan, cost, notes=notes)
    if as_json:
        echo_json(payload)
    else:
        render_estimate(payload)
