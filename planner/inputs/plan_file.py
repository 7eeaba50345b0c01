"""plan.json as `solve --out` writes it (or a bare Plan), read back for `emit`: the plan, the run
and cluster it was made for (from the file, or from --model/--megatron-args/--cluster), the input
launcher it saved, and a check that what the file states besides the plan agrees with the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.cli_common import format_validation_error
from planner.errors import PlannerInputError
from planner.inputs.cluster import parse_cluster
from planner.inputs.files import parse_json, read_text
from planner.inputs.resolve import read_script, resolve_run
from planner.inputs.script import LauncherScript, cluster_geometry, parse_launcher_script
from planner.profile_tables import ProfileSet
from planner.schemas import ClusterSpec, Plan
from planner.schemas.parallel import MegatronRun


def load_plan_file(path: Path) -> dict[str, Any]:
    data = parse_json(read_text(path, "--plan"), "--plan", str(path))
    if not isinstance(data, dict):
        raise PlannerInputError("--plan", f"{path}: expected a JSON object")
    return data


def check_plan_document(data: dict[str, Any], plan, run, cluster_spec) -> None:
    """Re-derive what plan.json states besides the plan itself and refuse any contradiction: the
    derived keys (pp, dp, num_microbatches, world_size), the top-level summary keys, and the fit of the
    plan to its model (layers, global batch) and its cluster (device types, GPUs per type)."""
    raw_plan = data.get("plan", data)
    derived = {
        "pp": plan.pp,
        "dp": [s.dp for s in plan.stages],
        "num_microbatches": plan.num_microbatches,
        "world_size": plan.world_size,
    }
    for key, value in derived.items():
        stated = raw_plan.get(key) if isinstance(raw_plan, dict) else None
        if key == "dp" and isinstance(stated, int) and not isinstance(stated, bool):
            stated = [stated] * plan.pp if len(set(derived["dp"])) == 1 else stated
        if stated is not None and stated != value:
            raise PlannerInputError("--plan", f"plan.{key} is {stated!r} but the stages give {value!r}; "
                                              "the file was edited inconsistently (fix it or re-run solve)")
    if "plan" in data:
        top = {"world_size": plan.world_size, "num_microbatches": plan.num_microbatches, "runtime": plan.runtime,
               "model": run.model.name, "cluster": cluster_spec.describe(), "cluster_gpus": cluster_spec.world_size}
        for key, value in top.items():
            if key in data and data[key] != value:
                raise PlannerInputError("--plan", f"{key} is {data[key]!r} but the plan and its inputs give "
                                                  f"{value!r}; the file was edited inconsistently")
    layers = sum(s.num_layers for s in plan.stages)
    if layers != run.model.num_layers:
        raise PlannerInputError("--plan", f"the stages hold {layers} layers but the model "
                                          f"{run.model.name} has {run.model.num_layers}")
    if plan.gbs != run.training.global_batch_size:
        raise PlannerInputError("--plan", f"plan.gbs: the plan's global batch size ({plan.gbs}) is not the run's "
                                          f"({run.training.global_batch_size})")
    for problem in cluster_spec.shortfalls(plan.gpus_by_type()):  # a pooled type ("H100+H200") uses its members'
        raise PlannerInputError("--plan", problem)


def resolve_plan_inputs(
    data: dict[str, Any],
    *,
    model: str | None,
    megatron_args: str | None,
    megatron_script: str | None,
    cluster: str | None,
):
    """(run, plan, cluster) from a plan.json object: {"plan": ..., "inputs": {"run": ...,
    "cluster": ...}} as `solve --out` writes it, or a bare Plan plus --model/--cluster."""
    raw_plan = data.get("plan", data)
    if "inputs" in data and not isinstance(data["inputs"], dict):
        raise PlannerInputError("--plan", "inputs must be an object with run and cluster")
    inputs = data.get("inputs") or {}
    try:
        plan = Plan.from_json(raw_plan) if isinstance(raw_plan, dict) else Plan.model_validate(raw_plan)
    except ValidationError as exc:
        raise PlannerInputError("--plan", f"not a plan: {format_validation_error(exc)}") from None

    if model is not None or megatron_args is not None:
        source = {"model": model, "megatron_args": megatron_args}
    elif inputs.get("run") is not None:
        source = None
    elif megatron_script is not None:
        source = {"megatron_script": megatron_script}
    else:
        raise PlannerInputError(
            "--model / --megatron-args / --megatron-script",
            "the plan file has no inputs.run; give the model the plan was made for",
        )
    if source is None:
        try:
            run = MegatronRun.model_validate(inputs["run"])
        except ValidationError as exc:
            raise PlannerInputError("--plan", f"inputs.run: {format_validation_error(exc)}") from None
    else:
        run = resolve_run(**source, world_size=plan.world_size)

    if cluster is not None:
        cluster_spec = parse_cluster(cluster, ProfileSet.load())
    elif inputs.get("cluster") is not None:
        try:
            cluster_spec = ClusterSpec.model_validate(inputs["cluster"])
        except ValidationError as exc:
            raise PlannerInputError("--plan", f"inputs.cluster: {format_validation_error(exc)}") from None
        profiles = ProfileSet.load()
        for device_type in cluster_spec.device_types:
            try:
                known = profiles.canonical_name(device_type) == device_type
            except PlannerInputError:
                known = False
            if not known:
                raise PlannerInputError("--plan", f"inputs.cluster: unknown device type {device_type!r}; known: "
                                                  f"{', '.join(profiles.names())}")
    else:
        raise PlannerInputError("--cluster", "the plan file has no inputs.cluster; give --cluster")
    return run, plan, cluster_spec


def script_from_plan(data: dict[str, Any], megatron_script: str | None,
                     script_args: tuple[str, ...], cluster: ClusterSpec | None = None) -> LauncherScript | None:
    """The input launcher: the --megatron-script file (read with the arguments after `--`), or
    the script `solve --out` saved in plan.json's inputs.script, or None; read as a job on `cluster`."""
    inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
    saved = inputs.get("script") if isinstance(inputs.get("script"), dict) else None
    if megatron_script is not None:
        extra = saved.get("extra_flags", []) if saved else []
        return read_script(megatron_script, script_args or (saved or {}).get("args", []), extra, cluster=cluster)
    if saved is None:
        return None
    text, args = saved.get("text"), saved.get("args", [])
    if not isinstance(text, str) or not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise PlannerInputError("--plan", "inputs.script must hold the script's text and its arguments")
    script = parse_launcher_script(text, args=args, path=saved.get("path"), scheduler=cluster_geometry(cluster))
    script.extra_flags = [str(f) for f in saved.get("extra_flags", [])]
    return script
