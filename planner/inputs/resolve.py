"""One entry point for every way a user describes a run: a preset / YAML / HF config.json
(`model`), a Megatron flag string (`megatron_args`) or a bash launcher (`megatron_script`),
plus CLI overrides (`--tp 2 --pp 2 ...`).  Returns a validated MegatronRun."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from planner.errors import PlannerInputError
from planner.inputs.files import name_from_path, path_kind
from planner.inputs.hf_config import hf_config_notes, hf_dropout, looks_like_hf_config, model_from_hf_config, \
    read_hf_config
from planner.inputs.megatron_flags import RunDraft, build_run, drop_flags, is_flag_token, parse_megatron_draft
from planner.inputs.assumed import input_assumptions
from planner.inputs.presets import list_model_presets, load_model_preset, model_from_mapping
from planner.inputs.shell.flag_string import split_flag_string
from planner.cost.memory import ALLOCATOR_ENV, expandable_segments_of
from planner.inputs.script import LauncherScript, cluster_geometry, flags_with, read_launcher_script, scheduler_fix
from planner.launcher.megatron import EP_OVERLAP_MAX_CONNECTIONS
from planner.megatron.flags import LAYOUT_FLAG, MAX_COUNT, MAX_SIZE, UNPRICED_ENV, unpriced_env
from planner.schemas.cluster import ClusterSpec
from planner.schemas.model import ModelSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import RECOMPUTE_MODULES, Recompute

OVERRIDE_KEYS = ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "gbs", "seq", "recompute", "sequence_parallel", "layout")
_INT_OVERRIDES = {"tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "etp": "etp"}
RECOMPUTE_FORMS = "none | selective[:mod+mod] | full (= full-uniform:1) | full-block:K | full-uniform:K"

# Training defaults for inputs that carry none (HF config.json): the paper's setup
DEFAULT_GLOBAL_BATCH = 1024  # for a HF config.json, which states no batch (the presets use the same)
DEFAULT_TRAINING: dict[str, Any] = {"micro_batch_size": 1, "precision": "bf16", "use_distributed_optimizer": True}


def parse_recompute(value: Any) -> Recompute:
    """A Recompute from a CLI string (RECOMPUTE_FORMS, or a Recompute.label such as
    'full:block:2' / 'selective:core_attn+moe_act'), a mapping, or a Recompute."""
    if isinstance(value, Recompute):
        return value
    if isinstance(value, Mapping):
        try:
            return Recompute(**value)
        except Exception as exc:  # pydantic ValidationError, TypeError
            raise PlannerInputError("--recompute", str(exc)) from None
    if not isinstance(value, str):
        raise PlannerInputError("--recompute", f"expected {RECOMPUTE_FORMS}, got {value!r}")
    text = value.strip().lower()
    if text in ("none", "off", ""):
        return Recompute()
    if text == "selective" or text.startswith("selective:"):
        modules = tuple(m for m in text.partition(":")[2].split("+") if m) or ("core_attn",)
        bad = [m for m in modules if m not in RECOMPUTE_MODULES]
        if bad:
            raise PlannerInputError("--recompute", f"unknown module(s) {bad}; allowed: {', '.join(RECOMPUTE_MODULES)}")
        return Recompute.selective(modules)
    if text == "full":
        return Recompute.full("uniform", 1)
    rest = text.removeprefix("full")
    if rest != text and rest[:1] in ("-", ":"):
        method, _, num = rest[1:].partition(":")
        if method in ("uniform", "block"):
            try:
                k = int(num)
            except ValueError:
                k = -1
            if k >= (1 if method == "uniform" else 0):
                return Recompute.full(method, k)
    raise PlannerInputError("--recompute", f"expected {RECOMPUTE_FORMS}, got {value!r}")


def _positive_int(key: str, value: Any, max_value: int = MAX_SIZE) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        text = value.strip() if isinstance(value, str) else ""
        if not (text.isdigit() and len(text) <= 15):
            raise PlannerInputError(f"--{key}", f"expected a positive integer, got {value!r}")
        value = int(text)
    if not 0 < value <= max_value:
        raise PlannerInputError(f"--{key}", f"expected an integer in 1..{max_value}, got {value}")
    return value


def apply_overrides(draft: RunDraft, overrides: Mapping[str, Any]) -> RunDraft:
    """Apply CLI overrides on top of a draft (in place, returned for chaining).

    Changing PP drops a layout or first/last-stage split given for the old PP; a layout
    override replaces every other pipeline-split setting; a VPP override replaces other VPP
    settings.  A sequence longer than max_position_embeddings raises the latter with it.
    """
    unknown = sorted(set(overrides) - set(OVERRIDE_KEYS))
    if unknown:
        raise PlannerInputError("overrides", f"unknown key(s) {unknown}; allowed: {', '.join(OVERRIDE_KEYS)}")
    ov = {k: v for k, v in overrides.items() if v is not None}
    par, train, model = draft.parallel, draft.training, draft.model
    for key, field in _INT_OVERRIDES.items():
        if key in ov:
            value = _positive_int(key, ov[key], MAX_COUNT if key == "pp" else MAX_SIZE)
            if key == "pp" and value != par.get("pp", 1) and "layout" not in ov:
                for stale in ("layout", "first_stage_layers", "last_stage_layers"):
                    par.pop(stale, None)
            par[field] = value
    if "vpp" in ov:
        vpp = _positive_int("vpp", ov["vpp"], MAX_COUNT)
        par.pop("num_layers_per_virtual_stage", None)
        par.pop("layout", None)
        par["vpp"] = vpp if vpp > 1 else None
    if "layout" in ov:
        layout = ov["layout"]
        if not isinstance(layout, (str, list, tuple)):
            raise PlannerInputError(LAYOUT_FLAG, f"expected a layout string, got {layout!r}")
        for stale in (
            "vpp",
            "num_layers_per_virtual_stage",
            "first_stage_layers",
            "last_stage_layers",
            "account_for_embedding_in_pipeline_split",
            "account_for_loss_in_pipeline_split",
        ):
            par.pop(stale, None)
        par["layout"] = layout if isinstance(layout, str) else tuple(layout)
    if "mbs" in ov:
        train["micro_batch_size"] = _positive_int("mbs", ov["mbs"])
    if "gbs" in ov:
        train["global_batch_size"] = _positive_int("gbs", ov["gbs"])
    if "seq" in ov:
        seq = _positive_int("seq", ov["seq"])
        model["seq_length"] = seq
        max_pos = model.get("max_position_embeddings")
        if max_pos is not None and max_pos < seq:
            model["max_position_embeddings"] = seq
    if "recompute" in ov:
        par["recompute"] = parse_recompute(ov["recompute"])
    if "sequence_parallel" in ov:
        sp = ov["sequence_parallel"]
        if not isinstance(sp, bool):
            raise PlannerInputError("--sequence-parallel", f"expected true or false, got {sp!r}")
        par["sequence_parallel"] = sp
    return draft


def _draft_from_spec(spec: ModelSpec, training: Mapping[str, Any], passthrough: list[str] | None = None) -> RunDraft:
    train = {**DEFAULT_TRAINING, **{k: v for k, v in training.items() if k != "seq_length"}}
    return RunDraft(
        model=spec.model_dump(),
        training=train,
        parallel={"recompute": Recompute()},
        passthrough=list(passthrough or []),
    )


def _draft_from_model(model: str) -> tuple[RunDraft, str, str]:
    """A preset name, a preset-format YAML/JSON file, a HF config.json or a model directory.
    Returns the draft, its source kind (planner.inputs.assumed.SOURCES) and its name."""
    path = Path(model).expanduser()
    kind = path_kind(path, "--model")
    if kind == "dir" or (kind != "missing" and path.suffix.lower() == ".json"):
        data = read_hf_config(path)
        if path.is_dir():
            name = path.resolve().name
        elif path.name == "config.json":
            name = path.resolve().parent.name
        else:
            name = path.stem
        if looks_like_hf_config(data):
            what = "directory" if path.is_dir() or path.name == "config.json" else "file"
            name_from_path(name, "--model", f"the model's name comes from the {what} name (a HF config.json states "
                                            f"none)")
            source = "config.json" if path.is_dir() else path.name  # the file's own name in errors and notes
            spec = model_from_hf_config(data, name, source)
            draft = _draft_from_spec(spec, {"global_batch_size": DEFAULT_GLOBAL_BATCH, **hf_dropout(data, source)})
            draft.notes.extend(hf_config_notes(data, source))
            return draft, "hf-config", str(path)  # the batch is printed as assumed (planner/inputs/assumed.py)
        spec, training = model_from_mapping(data, name=name, where=str(path))
        return _draft_from_spec(spec, training), "model-file", str(path)
    spec, training = load_model_preset(model)
    is_preset = model.strip().lower() in list_model_presets()
    return _draft_from_spec(spec, training), ("preset" if is_preset else "model-file"), (spec.name if is_preset else model)


def read_script(megatron_script: str, script_args: Sequence[str] | None = None, extra_flags: Sequence[str] = (),
                *, cluster: ClusterSpec | None = None, deadline: float | None = None):
    """The launcher script evaluated with its own arguments (planner.inputs.script), as a job on
    `cluster` (its SLURM_* node counts, where the script has no #SBATCH lines) and stopping at
    `deadline` (time.monotonic()); the --megatron-args overrides it was combined with ride along as
    `extra_flags`."""
    script = read_launcher_script(Path(megatron_script).expanduser(), args=list(script_args or []),
                                  scheduler=cluster_geometry(cluster), deadline=deadline)
    script.extra_flags = list(extra_flags)
    return script


# CLI overrides that replace one flag's value: the script's own value is dropped before reading, so
# that an override fixes a value the script gets wrong (GBS 0 from an unset SLURM_NNODES)
_VALUE_OVERRIDES = {"gbs": "--global-batch-size", "mbs": "--micro-batch-size", "seq": "--seq-length"}


def script_environment(script) -> dict[str, str]:
    """The environment the script gives its trainer (`LauncherScript.task_env`): the variables it exports, then those
    assigned before the launcher word (`VAR=value torchrun ...`), which win; under srun, those its --export passes
    to the task (NONE, or a list without ALL, keeps the script's from it; `--export=ALL,NAME=value` sets one:
    planner/inputs/srun_export.py), as torchrun's PET_* counts are read."""
    return script.task_env


def _hidden_env_notes(script) -> list[str]:
    """The settings the estimate reads (the allocator, CUDA_DEVICE_MAX_CONNECTIONS, UNPRICED_ENV's) that the script
    exports but srun's --export keeps from the trainer: read as not set, and a note says why."""
    names, where = script.hidden_env
    read = [name for name in names if name in ALLOCATOR_ENV or name in UNPRICED_ENV
            or name == "CUDA_DEVICE_MAX_CONNECTIONS"]
    if not read:
        return []
    them = ", ".join(read)
    return [f"the script sets {them}, which srun's --export ({where}) keeps from the trainer: read as not set; "
            f"add {'them' if len(read) > 1 else 'it'} to the --export list (or ALL) for the run to get "
            f"{'them' if len(read) > 1 else 'it'}"]


def _allocator_behind_export(script, notes: list[str]) -> bool | None:
    """False where srun's --export (NONE, or a list without ALL) gives the trainer no allocator variable: the task
    runs torch's default allocator (expandable segments off), whatever the script or the planner's launch.sh
    exports around srun, so the memory is priced with it and a note says why.  None elsewhere (the unstated case:
    planner/inputs/assumed.py)."""
    export = script.srun_export
    if export is None or export.all:
        return None
    notes.append(f"srun's --export ({export.where}) gives the trainer no allocator setting: the reserved memory is "
                 "priced with torch's default allocator (expandable segments off, which reserves more); add "
                 "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to the --export list to run with expandable "
                 "segments and price them")
    return False


def _max_connections_notes(env: Mapping[str, str], training: Mapping[str, Any]) -> list[str]:
    """Where the script's own CUDA_DEVICE_MAX_CONNECTIONS keeps the EP all-to-all overlap from happening: it needs
    more than one hardware queue (Megatron's MoE README).  The estimate prices the overlap as the planner's launch.sh
    runs it (planner/launcher/megatron.py `max_connections`)."""
    value = (env.get("CUDA_DEVICE_MAX_CONNECTIONS") or "").strip()
    if value != "1" or not training.get("overlap_moe_expert_parallel_comm"):
        return []
    return ["the script exports CUDA_DEVICE_MAX_CONNECTIONS=1, but --overlap-moe-expert-parallel-comm needs more than "
            "one hardware queue (Megatron's MoE README): run as it is, the EP all-to-all may not overlap; the estimate "
            f"prices the overlap, as the launch.sh the planner writes runs it "
            f"(CUDA_DEVICE_MAX_CONNECTIONS={EP_OVERLAP_MAX_CONNECTIONS})"]


def _script_flags(script, extra: list[str], overrides: Mapping[str, Any]) -> list[str]:
    """The script's flags without those --megatron-args or a value override give again, then the
    --megatron-args (as argparse, the later value wins; the earlier one is not read at all)."""
    given = {tok.split("=", 1)[0] for tok in extra if is_flag_token(tok)}
    given |= {flag for key, flag in _VALUE_OVERRIDES.items() if overrides.get(key) is not None}
    return drop_flags(script.megatron_flags, given) + extra


PROBE_VALUE = "3"
"""The value a scheduler variable read unset is given to see which flags it makes (`_error_depends_on`): a node count
or a rank a job may have, other than the empty value (0 in arithmetic) it read as."""


def _error_depends_on(exc: PlannerInputError, script, name: str) -> bool:
    """Whether the flags an error names (its field; every flag, where it names none) come out otherwise when the
    scheduler variable `name`, read unset, has a value: the script read again with it set.  A reading that fails
    counts as depending on it."""
    again = flags_with(script, name, PROBE_VALUE)
    if again is None:
        return True
    named = {part.strip().partition("=")[0] for part in exc.field.split(",") if is_flag_token(part.strip())}
    return _occurrences(script.megatron_flags, named) != _occurrences(again, named)


def _occurrences(flags: Sequence[str], names: set[str]) -> list[list[str]]:
    """Each occurrence of a flag of `names` in `flags` with the values that follow it (every flag's, for no names);
    the values before the first flag as one occurrence of their own."""
    out: list[list[str]] = []
    for tok in flags:
        if is_flag_token(tok) or not out:
            out.append([tok])
        else:
            out[-1].append(tok)
    return [o for o in out if not names or o[0].partition("=")[0] in names]


def explain_script_error(exc: PlannerInputError, script) -> PlannerInputError:
    """A flag error, with what in the script made the value: an unquoted array element bash split,
    a scheduler variable unset here, a file `source`d that is not here, a command's output."""
    text = str(exc)
    hints: list[str] = []
    for where, array, element, words in script.split_elements:
        if any(f"unexpected value {w!r}" in text for w in element.split()[1:]):
            hints.append(f"bash splits the unquoted ${{{array}[@]}} ({where}): its element {element!r} reaches "
                         f"the entry script as {words} separate words, which Megatron's parser refuses; quote the "
                         f"expansion (\"${{{array}[@]}}\")")
            break
    for name, where in script.scheduler_unset.items():
        if not _error_depends_on(exc, script, name):
            continue
        hints.append(f"the script reads {name} ({where}), which the scheduler sets when the job runs and which is "
                     f"unset here (empty; 0 in arithmetic): {scheduler_fix(name)}")
    literal = [u for u in script.unresolved if u in text]
    for where, target in script.missing_sources:
        if literal:
            hints.append(f"{', '.join(literal)} may come from `source {target}` ({where}), a file that is not "
                         "here; put it next to the script, or give the value with --megatron-args")
    if literal and not script.missing_sources and "where flags go" not in text:  # else said where they stand
        hints.append(f"{', '.join(literal)} is text bash expands when the script runs (a command's output or an "
                     "environment variable the script never sets); give the value with --megatron-args")
    if not hints:
        return exc
    return PlannerInputError(exc.field, str(exc)[len(exc.field) + 2:] + "; " + "; ".join(hints))


def script_override_flags(megatron_args: str | list[str] | None, overrides: Mapping[str, Any] | None = None,
                          max_position_embeddings: int | None = None) -> list[str]:
    """Flags the launcher applies on top of a script's own: the --megatron-args given with it,
    and --seq-length for a --seq override (batch sizes and degrees are the plan's anyway)."""
    flags = _split_args(megatron_args) if megatron_args is not None else []
    seq = (overrides or {}).get("seq")
    if seq is not None:
        flags += ["--seq-length", str(seq)]
        if max_position_embeddings is not None and max_position_embeddings >= int(seq):
            flags += ["--max-position-embeddings", str(max_position_embeddings)]
    return flags


def _split_args(megatron_args: str | list[str]) -> list[str]:
    if isinstance(megatron_args, str):
        return split_flag_string(megatron_args)
    return list(megatron_args)


def resolve_run(**options: Any) -> MegatronRun:
    """The run of resolve_run_script (its keywords), without the script."""
    return resolve_run_script(**options)[0]


def resolve_run_script(
    *,
    model: str | None = None,
    megatron_args: str | list[str] | None = None,
    megatron_script: str | None = None,
    script_args: Sequence[str] | None = None,
    world_size: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    notes: list[str] | None = None,
    allow_invalid: bool = False,
    cluster: ClusterSpec | None = None,
    script_deadline: float | None = None,
    script: LauncherScript | None = None,
) -> tuple[MegatronRun, LauncherScript | None]:
    """Read the run from one source (--model, --megatron-args, or --megatron-script with
    --megatron-args as overrides on top), apply `overrides` (keys: OVERRIDE_KEYS), and validate; with the
    --megatron-script as read (its `extra_flags` the --megatron-args), None for another source.

    A missing global batch size becomes Megatron's default mbs*DP when `world_size` is known; a
    MoE model with TP>1 gets sequence parallelism (Megatron requires it).  What was assumed or
    not modelled (the vocabulary, the global batch, fork flags, undecided script branches) is
    appended to `notes`, one line each, for the caller to print.  Degrees Megatron would refuse
    raise PlannerInputError with Megatron's message, unless `allow_invalid` (then: a note).

    `cluster`: the script is read as a job on it (SLURM_* node counts where it has no #SBATCH lines);
    `script_deadline` (time.monotonic()): reading the script stops there (the command's time limit).
    `script`: the --megatron-script already read as a job on `cluster` (planner.inputs.script `reads_alike`), not
    read again.  A flag the script gets wrong is fixed by an override: --gbs/--mbs/--seq and --megatron-args replace
    the script's own value before it is read; a flag error names what in the script made the value."""
    sources = [n for n, v in (("--model", model), ("--megatron-args", megatron_args), ("--megatron-script", megatron_script)) if v is not None]
    combined = sources == ["--megatron-args", "--megatron-script"]
    if len(sources) != 1 and not combined:
        raise PlannerInputError(
            "--model / --megatron-args / --megatron-script",
            f"give exactly one of them, or --megatron-script with --megatron-args overrides "
            f"({'none' if not sources else ', '.join(sources)} given)",
        )
    if script_args and megatron_script is None:
        raise PlannerInputError("script arguments", "arguments after `--` are passed to --megatron-script; give the script")
    if world_size is not None:
        world_size = _positive_int("world-size", world_size)
    sink = notes if notes is not None else []
    flags: list[str] = []
    given_script, script = script, None
    if model is not None:
        draft, source, source_name = _draft_from_model(model)
    elif megatron_script is None:
        flags = _split_args(megatron_args)  # type: ignore[arg-type]
        draft = parse_megatron_draft(flags, name="megatron-args")
        source, source_name = "flags", "--megatron-args"
    else:
        extra = _split_args(megatron_args) if megatron_args is not None else []
        name = name_from_path(Path(megatron_script).stem, "--megatron-script",
                              "the model's name comes from the script's file name")
        script = read_script(megatron_script, script_args, extra, cluster=cluster, deadline=script_deadline) \
            if given_script is None else replace(given_script, extra_flags=list(extra))
        sink.extend(script.warnings)
        flags = _script_flags(script, extra, overrides or {})
        try:
            draft = parse_megatron_draft(flags, name=name)
        except PlannerInputError as exc:
            raise explain_script_error(exc, script) from None
        source, source_name = "flags", str(megatron_script)
        sink.extend(_apply_script_environment(draft, script))
        ws = script.world_size
        if world_size is None and isinstance(ws, int) and ws > 0:
            world_size = ws
    sink.extend(draft.notes)
    apply_overrides(draft, overrides or {})
    _require_sp_for_moe(draft, explicit=(overrides or {}).get("sequence_parallel"))
    stated_training, stated_model = dict(draft.training), dict(draft.model)
    try:
        run = build_run(draft, world_size=world_size, allow_invalid=allow_invalid)
    except PlannerInputError as exc:
        raise (explain_script_error(exc, script) if script is not None else exc) from None
    sink.extend(n for n in draft.notes if n not in sink)
    assumed = input_assumptions(run, source=source, source_name=source_name, stated_training=stated_training,
                                stated_model=stated_model, flags=flags, overrides=overrides)
    return run.model_copy(update={"assumed": assumed}), script


def _apply_script_environment(draft: RunDraft, script: LauncherScript) -> list[str]:
    """What the script's environment states about the run (the allocator, unpriced settings) set on the draft;
    the notes it calls for."""
    env = script_environment(script)
    notes = _hidden_env_notes(script)
    expandable = expandable_segments_of(env)
    if expandable is None:  # no allocator variable reaches the trainer
        expandable = _allocator_behind_export(script, notes)
    if expandable is not None:
        draft.training["expandable_segments"] = expandable
    notes += _max_connections_notes(env, draft.training)
    env_unpriced = unpriced_env(env)
    if env_unpriced:
        draft.training["unpriced_flags"] = tuple(entry for entry, _ in env_unpriced)
        notes.extend(note for _, note in env_unpriced)
    return notes


def _require_sp_for_moe(draft: RunDraft, *, explicit: Any) -> None:
    """MoE with TP>1 needs --sequence-parallel (reference/megatron.md 2.2 rule 14)."""
    is_moe = draft.model.get("num_experts") is not None
    if not is_moe or draft.parallel.get("tp", 1) <= 1:
        return
    if explicit is False:
        raise PlannerInputError(
            "--sequence-parallel", "a MoE model with TP > 1 needs sequence parallelism (Megatron requires it)"
        )
    draft.parallel["sequence_parallel"] = True

