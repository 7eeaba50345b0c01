"""plan.json as `solve --out` writes it (or a bare Plan), read back for `emit`: the plan, the run
and cluster it was made for (from the file, or from --model/--megatron-args/--cluster), the input
launcher it saved, and a check that what the file states besides the plan agrees with the plan."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.cli_common import format_validation_error
from planner.errors import PlannerInputError
from planner.inputs.cluster import describe_cluster, parse_cluster
from planner.inputs.files import parse_json, read_text
from planner.inputs.resolve import read_script, resolve_run_script
from planner.inputs.script import LauncherScript, cluster_geometry, parse_launcher_script
from planner.profile_tables import ProfileSet
from planner.schemas import ClusterSpec, Plan
from planner.schemas.model import ModelSpec
from planner.schemas.parallel import MegatronRun


def load_plan_file(path: Path) -> dict[str, Any]:
    data = parse_json(read_text(path, "--plan"), "--plan", str(path))
    if not isinstance(data, dict):
        raise PlannerInputError("--plan", f"{path}: expected a JSON object")
    return data


def check_plan_document(data: dict[str, Any], plan, run, cluster_spec, profiles: ProfileSet) -> None:
    """Re-derive what plan.json states besides the plan itself and refuse any contradiction: the
    derived keys (pp, dp, num_microbatches, world_size), the top-level summary keys, and the fit of the
    plan to its model (layers, global batch) and its cluster (device types, GPUs per type).  The `cluster`
    key may also hold the description of earlier versions (`ClusterSpec.legacy_description`)."""
    raw_plan = data.get("plan", data)
    derived = {
        "pp": plan.pp,
        "dp": [s.dp for s in plan.stages],
        "num_microbatches": plan.num_microbatches,
        "world_size": plan.world_size,
    }
    wrong = []  # every derived or summary key that contradicts the stages, so one edit fixes them all
    for key, value in derived.items():
        stated = raw_plan.get(key) if isinstance(raw_plan, dict) else None
        if key == "dp" and isinstance(stated, int) and not isinstance(stated, bool):
            stated = [stated] * plan.pp if len(set(derived["dp"])) == 1 else stated
        if stated is not None and stated != value:
            wrong.append(f"plan.{key} is {stated!r} but the stages give {value!r}")
    if "plan" in data:
        top = {"world_size": plan.world_size, "num_microbatches": plan.num_microbatches, "runtime": plan.runtime,
               "model": run.model.name, "cluster": describe_cluster(cluster_spec, profiles),
               "cluster_gpus": cluster_spec.world_size}
        if data.get("cluster") == cluster_spec.legacy_description():
            top.pop("cluster")
        for key, value in top.items():
            if key not in data or data[key] == value:
                continue
            same = f"plan.{key} is {data[key]!r} but the stages give {value!r}"
            if same in wrong:  # plan.world_size and world_size, one edit: said once
                wrong[wrong.index(same)] = f"plan.{key} and {key} are {data[key]!r} but the stages give {value!r}"
            else:
                wrong.append(f"{key} is {data[key]!r} but the plan and its inputs give {value!r}")
    if wrong:
        raise PlannerInputError("--plan", "; ".join(wrong) + "; the file was edited inconsistently: set "
                                + ("these keys" if len(wrong) > 1 else "it") + " to the values given (or delete "
                                "the derived ones: pp, dp, num_microbatches, world_size), or re-run solve")
    _check_recompute_labels(raw_plan, plan)
    layers = sum(s.num_layers for s in plan.stages)
    if layers != run.model.num_layers:
        raise PlannerInputError("--plan", f"the stages hold {layers} layers but the model "
                                          f"{run.model.name} has {run.model.num_layers}")
    if plan.gbs != run.training.global_batch_size:
        raise PlannerInputError("--plan", f"plan.gbs: the plan's global batch size ({plan.gbs}) is not the run's "
                                          f"({run.training.global_batch_size})")
    for problem in cluster_spec.shortfalls(plan.gpus_by_type()):  # a pooled type ("H100+H200") uses its members'
        raise PlannerInputError("--plan", problem)


def _label_key(label: str) -> str:
    """A recompute label with its selective modules in a fixed order (Megatron's --recompute-modules is a set), and
    the --recompute spelling of full recompute (full, full-uniform:K, full-block:K) read as the label's
    (full:uniform:1, full:uniform:K, full:block:K)."""
    if label == "full":
        return "full:uniform:1"
    if label.startswith(("full-uniform:", "full-block:")):
        return "full:" + label.removeprefix("full-")
    if label.startswith("selective:"):
        return "selective:" + "+".join(sorted(label.removeprefix("selective:").split("+")))
    return label


def _check_recompute_labels(raw_plan: Any, plan: Plan) -> None:
    """Each stage's `recompute_label` (what solve writes beside `recompute`, derived from it and never read)
    must name that stage's `recompute`: a label edited alone was silently ignored (walk53b #4).  The label
    cannot stand for `recompute` ("none" drops the modules), so a disagreement is refused, not resolved."""
    stages = raw_plan.get("stages") if isinstance(raw_plan, dict) else None
    if not isinstance(stages, list):
        return
    for i, (raw, stage) in enumerate(zip(stages, plan.stages)):
        if not isinstance(raw, dict) or "recompute_label" not in raw:
            continue
        stated, derived = raw["recompute_label"], stage.recompute.label
        if not isinstance(stated, str) or _label_key(stated) != _label_key(derived):
            text = repr(stated) if len(repr(stated)) <= 60 else repr(stated)[:57] + "..."
            raise PlannerInputError(
                "--plan", f"stage {i}: plan.stages[{i}].recompute_label is {text} but its recompute "
                          f"{_recompute_text(stage.recompute)} gives {derived!r}; recompute_label only describes "
                          "recompute, which is what the launcher and the prices use: edit recompute (and the "
                          "label to match, or delete the label), or re-run solve")


def _recompute_text(recompute) -> str:
    return json.dumps(recompute.model_dump(mode="json", exclude_none=True), separators=(", ", ": "))


MADE_FOR_KEYS = ("model", "run_sha256", "cluster", "cluster_sha256")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def made_for(run: MegatronRun, cluster: ClusterSpec, profiles: ProfileSet) -> dict[str, str]:
    """What a plan was made for, as plan.json records it: the model's name and a SHA-256 of the whole
    run (model, training, flags) and of the cluster, each as inputs.run / inputs.cluster hold them, and the
    cluster's description (its --cluster text)."""
    return {"model": run.model.name, "run_sha256": _digest(run.model_dump(mode="json")),
            "cluster": describe_cluster(cluster, profiles), "cluster_sha256": _digest(cluster.model_dump(mode="json"))}


def same_made_for(record: Any, run: MegatronRun, cluster: ClusterSpec, profiles: ProfileSet) -> bool:
    """Whether a made_for record is this run's on this cluster: the model and both digests as made_for gives
    them, the description its own or the one earlier versions wrote (`ClusterSpec.legacy_description`), and
    for a shorthand cluster (named by its description) the digest of the name those versions gave it."""
    want = made_for(run, cluster, profiles)
    if not isinstance(record, dict) or set(record) != set(want) or record["cluster"] not in \
            (want["cluster"], cluster.legacy_description()):
        return False
    digests = {want["cluster_sha256"]}
    if cluster.name == want["cluster"]:
        legacy = cluster.model_copy(update={"name": cluster.legacy_description()})
        digests.add(_digest(legacy.model_dump(mode="json")))
    return all(record[k] == want[k] for k in ("model", "run_sha256")) and record["cluster_sha256"] in digests


@dataclass
class PlanInputs:
    """What `emit` reads: the plan, the run and cluster it is emitted for, and what the file says it
    was made for (`edited`: inputs plan.json holds that differ from its made_for record); `script`: the
    --megatron-script given, as read once on that cluster (the run's model check and the launcher), None without
    one."""

    plan: Plan
    run: MegatronRun
    cluster: ClusterSpec
    edited: list[str] = field(default_factory=list)
    has_record: bool = False
    script: LauncherScript | None = None


def _plan_of(raw_plan: Any) -> Plan:
    try:
        return Plan.from_json(raw_plan) if isinstance(raw_plan, dict) else Plan.model_validate(raw_plan)
    except ValidationError as exc:
        raise PlannerInputError("--plan", f"not a plan: {format_validation_error(exc)}") from None


def _canonical_types(plan: Plan, profiles: ProfileSet) -> Plan:
    """The plan with each stage's device type spelled as the profiles name it (device names are case-insensitive
    and take aliases everywhere else: an edited "h800" is H800)."""
    stages = []
    for i, st in enumerate(plan.stages):
        try:
            name = profiles.canonical_name(st.device_type)
        except PlannerInputError as exc:
            raise PlannerInputError("--plan", f"plan.stages[{i}].device_type: {str(exc).split(': ', 1)[-1]}") \
                from None
        stages.append(st if name == st.device_type else st.model_copy(update={"device_type": name}))
    return plan.model_copy(update={"stages": tuple(stages)})


def _saved_inputs(data: dict[str, Any], profiles: ProfileSet) -> tuple[MegatronRun | None, ClusterSpec | None]:
    """inputs.run and inputs.cluster of plan.json, typed (None where absent)."""
    if "inputs" in data and not isinstance(data["inputs"], dict):
        raise PlannerInputError("--plan", "inputs must be an object with run and cluster")
    inputs = data.get("inputs") or {}
    run = cluster_spec = None
    if inputs.get("run") is not None:
        try:
            run = MegatronRun.model_validate(inputs["run"])
        except ValidationError as exc:
            raise PlannerInputError("--plan", f"inputs.run: {format_validation_error(exc)}") from None
    if inputs.get("cluster") is not None:
        try:
            cluster_spec = ClusterSpec.model_validate(inputs["cluster"])
        except ValidationError as exc:
            raise PlannerInputError("--plan", f"inputs.cluster: {format_validation_error(exc)}") from None
        for device_type in cluster_spec.device_types:
            try:
                known = profiles.canonical_name(device_type) == device_type
            except PlannerInputError:
                known = False
            if not known:
                raise PlannerInputError("--plan", f"inputs.cluster: unknown device type {device_type!r}; known: "
                                                  f"{', '.join(profiles.names())} (a measured device: --profiles DIR)")
    return run, cluster_spec


def _edited(data: dict[str, Any], run: MegatronRun | None, cluster_spec: ClusterSpec | None) -> tuple[list[str], bool]:
    """The parts of plan.json's inputs that no longer match its made_for record, and whether it has one."""
    record = data.get("made_for")
    if record is None:
        return [], False
    if not (isinstance(record, dict) and all(isinstance(record.get(k), str) for k in MADE_FOR_KEYS)):
        raise PlannerInputError("--plan", f"made_for must be an object with {', '.join(MADE_FOR_KEYS)} (as solve "
                                          "writes it)")
    edited = []
    if run is not None and _digest(run.model_dump(mode="json")) != record["run_sha256"]:
        edited.append(f"inputs.run (made for {record['model']})")
    if cluster_spec is not None and _digest(cluster_spec.model_dump(mode="json")) != record["cluster_sha256"]:
        edited.append(f"inputs.cluster (made for {record['cluster']})")
    return edited, True


def model_differences(a: ModelSpec, b: ModelSpec, limit: int = 4) -> list[str]:
    """The fields (name aside) in which two models differ, as 'field B vs A'; a field one of them leaves
    unstated (None) is no difference (the checker prices the given one anyway)."""
    da, db = a.model_dump(mode="json"), b.model_dump(mode="json")
    keys = [k for k in da if k != "name" and da[k] is not None and db.get(k) is not None and da[k] != db.get(k)]
    return [f"{k} {db.get(k)!r} vs {da[k]!r}" for k in keys[:limit]] + (["..."] if len(keys) > limit else [])


def resolve_plan_inputs(
    data: dict[str, Any],
    *,
    model: str | None,
    megatron_args: str | None,
    megatron_script: str | None,
    cluster: str | None,
    script_args: tuple[str, ...] = (),
    profiles: ProfileSet | None = None,
) -> PlanInputs:
    """The plan of a plan.json object ({"plan": ..., "inputs": {"run": ..., "cluster": ...}, "made_for": ...}
    as `solve --out` writes it, or a bare Plan), the run and cluster to emit it for (those given on the
    command line, else those the file holds), and what no longer matches what it was made for.  A model
    or cluster given on the command line that differs from the one the plan was made for is refused.  A
    --megatron-script is read once, as a job on that cluster: its model is checked and its launcher written from
    that one reading (PlanInputs.script; a script that counts SLURM_NNODES gets the same count for both)."""
    profiles = profiles or ProfileSet.load()
    plan = _canonical_types(_plan_of(data.get("plan", data)), profiles)
    saved_run, saved_cluster = _saved_inputs(data, profiles)
    edited, has_record = _edited(data, saved_run, saved_cluster)
    cluster_spec = _plan_cluster(saved_cluster, cluster, profiles)
    script = _given_script(data, megatron_script, script_args, cluster_spec) \
        if megatron_script is not None and model is None else None  # with --model too, resolve_run_script refuses
    run = saved_run
    if model is not None or megatron_args is not None or megatron_script is not None:
        given, _ = resolve_run_script(
            model=model, megatron_args=megatron_args, megatron_script=megatron_script,
            script_args=list(script_args) if megatron_script else None, world_size=plan.world_size,
            allow_invalid=True, cluster=cluster_spec, script=script)
        if saved_run is not None:
            _same_model(saved_run, given, "--model" if model else "--megatron-script" if megatron_script
                        else "--megatron-args")
            given = given.model_copy(update={"model": given.model.model_copy(update={"name": saved_run.model.name})})
        run = given
    if run is None:
        raise PlannerInputError("--model / --megatron-args / --megatron-script",
                                "the plan file has no inputs.run; give the model the plan was made for")
    if cluster_spec is None:
        raise PlannerInputError("--cluster", "the plan file has no inputs.cluster; give --cluster")
    return PlanInputs(plan=plan, run=run, cluster=cluster_spec, edited=edited, has_record=has_record, script=script)


def _plan_cluster(saved: ClusterSpec | None, cluster: str | None, profiles: ProfileSet) -> ClusterSpec | None:
    """The cluster to emit for: --cluster, which must be the one plan.json holds (if it holds one), else that one;
    None: neither."""
    if cluster is None:
        return saved
    given_cluster = parse_cluster(cluster, profiles)
    if saved is not None and saved.model_copy(update={"name": ""}) != given_cluster.model_copy(update={"name": ""}):
        given_text = describe_cluster(given_cluster, profiles)
        given = given_text + ("" if cluster == given_text else f" ({cluster})")
        reordered = sorted(g.model_dump_json() for g in saved.groups) == \
            sorted(g.model_dump_json() for g in given_cluster.groups)
        raise PlannerInputError("--cluster", f"the plan was made for {describe_cluster(saved, profiles)}, "
                                             f"not {given}; "
                                + ("the same groups in another order, which orders the ranks: give them in the "
                                   "plan's order, or drop --cluster" if reordered else
                                   "re-run solve for that cluster, or drop --cluster"))
    return given_cluster


def _same_model(saved: MegatronRun, given: MegatronRun, flag: str) -> None:
    diff = model_differences(saved.model, given.model)
    if diff:
        raise PlannerInputError(flag, f"describes another model than the plan was made for ({saved.model.name}): "
                                      f"{'; '.join(diff)} (given vs planned); re-run solve with it, or drop {flag}")


def _saved_script(data: dict[str, Any]) -> dict[str, Any] | None:
    """plan.json's inputs.script (the input launcher `solve --out` saved), None where absent."""
    inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
    return inputs.get("script") if isinstance(inputs.get("script"), dict) else None


def _given_script(data: dict[str, Any], megatron_script: str, script_args: tuple[str, ...],
                  cluster: ClusterSpec | None) -> LauncherScript:
    """The --megatron-script file read once, as a job on `cluster` (the one the launcher is for), with the
    arguments after `--` (else those plan.json saved) and the --megatron-args solve applied on top riding along."""
    saved = _saved_script(data)
    extra = saved.get("extra_flags", []) if saved else []
    return read_script(megatron_script, script_args or (saved or {}).get("args", []), extra, cluster=cluster)


def script_from_plan(data: dict[str, Any], found: PlanInputs) -> LauncherScript | None:
    """The input launcher: the --megatron-script file as resolve_plan_inputs read it (`found.script`), or
    the script `solve --out` saved in plan.json's inputs.script read as a job on `found.cluster`, or None."""
    if found.script is not None:
        return found.script
    saved = _saved_script(data)
    if saved is None:
        return None
    text, args = saved.get("text"), saved.get("args", [])
    if not isinstance(text, str) or not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise PlannerInputError("--plan", "inputs.script must hold the script's text and its arguments")
    script = parse_launcher_script(text, args=args, path=saved.get("path"), scheduler=cluster_geometry(found.cluster))
    script.extra_flags = [str(f) for f in saved.get("extra_flags", [])]
    return script
