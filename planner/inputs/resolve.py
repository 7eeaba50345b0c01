"""One entry point for every way a user describes a run: a preset / YAML / HF config.json
(`model`), a Megatron flag string (`megatron_args`) or a bash launcher (`megatron_script`),
plus CLI overrides (`--tp 2 --pp 2 ...`).  Returns a validated MegatronRun."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Mapping

from planner.errors import PlannerInputError
from planner.inputs.files import path_kind, read_text
from planner.inputs.hf_config import looks_like_hf_config, model_from_hf_config, read_hf_config
from planner.inputs.megatron_flags import (
    LAYOUT_FLAG,
    MAX_COUNT,
    MAX_SIZE,
    RunDraft,
    build_run,
    parse_megatron_draft,
)
from planner.inputs.presets import load_model_preset, model_from_mapping
from planner.schemas.model import ModelSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import RECOMPUTE_MODULES, Recompute

OVERRIDE_KEYS = ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "gbs", "seq", "recompute", "sequence_parallel", "layout")
_INT_OVERRIDES = {"tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "etp": "etp"}
RECOMPUTE_FORMS = "none | selective[:mod+mod] | full (= full-uniform:1) | full-block:K | full-uniform:K"

# Training defaults for inputs that carry none (HF config.json): the paper's setup
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


def _draft_from_model(model: str) -> RunDraft:
    """A preset name, a preset-format YAML/JSON file, a HF config.json or a model directory."""
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
            return _draft_from_spec(model_from_hf_config(data, name), {})
        spec, training = model_from_mapping(data, name=name, where=str(path))
        return _draft_from_spec(spec, training)
    spec, training = load_model_preset(model)
    return _draft_from_spec(spec, training)


def load_launcher_script(megatron_script: str | Path):
    """Read and parse a launcher script (planner.inputs.script).  Every reading problem is one
    PlannerInputError naming --megatron-script; so is a construct nested too deeply for the
    interpreter's recursion or an expression too large for Python's parser."""
    from planner.inputs.script import parse_launcher_script  # lazy: written by another helper

    path = Path(megatron_script).expanduser()
    text = read_text(path, "--megatron-script")
    try:
        return parse_launcher_script(text)
    except (RecursionError, MemoryError):
        raise PlannerInputError(
            "--megatron-script", f"{path}: a construct is nested too deeply, or an expression is too large, to read"
        ) from None


def _script_flags(megatron_script: str) -> tuple[list[str], str, int | None]:
    """Flags given to pretrain_gpt.py in a bash launcher (via planner.inputs.script)."""
    path = Path(megatron_script).expanduser()
    script = load_launcher_script(path)
    flags = list(getattr(script, "megatron_flags"))
    ws = getattr(script, "world_size", None)
    return flags, path.stem, ws if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0 else None


def resolve_run(
    *,
    model: str | None = None,
    megatron_args: str | list[str] | None = None,
    megatron_script: str | None = None,
    world_size: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> MegatronRun:
    """Read the run from exactly one source, apply `overrides` (keys: OVERRIDE_KEYS), and
    validate.  A missing global batch size becomes mbs*DP when `world_size` is known; a MoE
    model with TP>1 gets sequence parallelism (Megatron requires it)."""
    given = [n for n, v in (("--model", model), ("--megatron-args", megatron_args), ("--megatron-script", megatron_script)) if v is not None]
    if len(given) != 1:
        raise PlannerInputError(
            "--model / --megatron-args / --megatron-script",
            f"give exactly one of them ({'none' if not given else ', '.join(given)} given)",
        )
    if world_size is not None:
        world_size = _positive_int("world-size", world_size)
    if model is not None:
        draft = _draft_from_model(model)
    elif megatron_args is not None:
        if isinstance(megatron_args, str):
            try:
                argv = shlex.split(megatron_args, comments=False)
            except ValueError as exc:
                raise PlannerInputError("--megatron-args", f"cannot split the flag string: {exc}") from None
        else:
            argv = list(megatron_args)
        draft = parse_megatron_draft(argv, name="megatron-args")
    else:
        flags, name, script_ws = _script_flags(megatron_script)  # type: ignore[arg-type]
        draft = parse_megatron_draft(flags, name=name)
        world_size = world_size if world_size is not None else script_ws
    apply_overrides(draft, overrides or {})
    _require_sp_for_moe(draft, explicit=(overrides or {}).get("sequence_parallel"))
    return build_run(draft, world_size=world_size)


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

