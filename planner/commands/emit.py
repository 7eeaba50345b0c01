"""`cli.py emit`: write the launcher files (megatron_args.txt, launch.sh, hostfile, FlagScale YAML)
for a solved plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from planner.cli_common import handle_errors
from planner.errors import PlannerInputError


def _load_plan_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlannerInputError("--plan", f"file not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlannerInputError("--plan", f"cannot read {path} as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PlannerInputError("--plan", f"{path}: expected a JSON object")
    return data


def resolve_emit_inputs(
    data: dict[str, Any],
    *,
    model: str | None,
    megatron_args: str | None,
    megatron_script: str | None,
    cluster: str | None,
):
    """(run, plan, cluster) from a plan.json object: {"plan": ..., "inputs": {"run": ...,
    "cluster": ...}} as `solve --out` writes it, or a bare Plan plus --model/--cluster."""
    from pydantic import ValidationError

    from planner.cli_common import format_validation_error
    from planner.schemas import ClusterSpec, Plan
    from planner.schemas.parallel import MegatronRun

    raw_plan = data.get("plan", data)
    inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
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
        from planner.inputs.resolve import resolve_run

        run = resolve_run(**source, world_size=plan.world_size)

    if cluster is not None:
        from planner.inputs.cluster import parse_cluster
        from planner.profile_tables import ProfileSet

        cluster_spec = parse_cluster(cluster, ProfileSet.load())
    elif inputs.get("cluster") is not None:
        try:
            cluster_spec = ClusterSpec.model_validate(inputs["cluster"])
        except ValidationError as exc:
            raise PlannerInputError("--plan", f"inputs.cluster: {format_validation_error(exc)}") from None
    else:
        raise PlannerInputError("--cluster", "the plan file has no inputs.cluster; give --cluster")
    return run, plan, cluster_spec


def script_from_plan(data: dict[str, Any], megatron_script: str | None, script_args: tuple[str, ...]):
    """The input launcher: the --megatron-script file (read with the arguments after `--`), or
    the script `solve --out` saved in plan.json's inputs.script, or None."""
    from planner.inputs.script import parse_launcher_script

    inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
    saved = inputs.get("script") if isinstance(inputs.get("script"), dict) else None
    if megatron_script is not None:
        from planner.inputs.resolve import read_script

        extra = saved.get("extra_flags", []) if saved else []
        return read_script(megatron_script, script_args or (saved or {}).get("args", []), extra)
    if saved is None:
        return None
    text, args = saved.get("text"), saved.get("args", [])
    if not isinstance(text, str) or not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise PlannerInputError("--plan", "inputs.script must hold the script's text and its arguments")
    script = parse_launcher_script(text, args=args, path=saved.get("path"))
    script.extra_flags = [str(f) for f in saved.get("extra_flags", [])]
    return script


@click.command("emit")
@click.option("--plan", "plan_path", required=True, type=click.Path(dir_okay=False), metavar="PLAN.JSON",
              help="plan.json as `solve --out` writes it (or a bare Plan with --model/--cluster)")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), metavar="DIR",
              help="directory for the launcher files (created if needed)")
@click.option("--megatron-script", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="the user's launcher (default: the one plan.json saved); launch.sh is it with the plan applied")
@click.option("--model", default=None, metavar="PRESET|FILE", help="model, when the plan file has no inputs.run")
@click.option("--megatron-args", default=None, metavar='"FLAGS"', help="Megatron flags, when the plan file has no inputs.run")
@click.option("--cluster", default=None, metavar="SPEC", help="cluster, when the plan file has no inputs.cluster")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT_ARG...]")
@handle_errors
def command(plan_path, out_dir, megatron_script, model, megatron_args, cluster, script_args):
    """Write megatron_args.txt, launch.sh and hostfile (plus FlagScale's YAML for the flagscale
    runtime) for a plan.  The input script is never modified.

    \b
    python cli.py emit --plan out/plan.json --out launch/ --megatron-script train.sh
    """
    from planner.launcher import write_launch_files

    data = _load_plan_file(Path(plan_path))
    run, plan, cluster_spec = resolve_emit_inputs(
        data, model=model, megatron_args=megatron_args, megatron_script=megatron_script, cluster=cluster
    )
    script = script_from_plan(data, megatron_script, tuple(script_args))
    paths = write_launch_files(run, plan, cluster_spec, Path(out_dir), script)
    for p in paths:
        click.echo(str(p))
