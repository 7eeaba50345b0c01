"""Model presets: profiles/models/<name>.yaml, a ModelSpec as YAML plus an optional `training:` block.

Format: ModelSpec fields at the top level (`moe_layer_freq` may stand in for `moe_layer_pattern`,
in Megatron's --moe-layer-freq syntax), and

    training:            # optional; TrainingSpec fields plus seq_length
      micro_batch_size: 1
      global_batch_size: 1024
      seq_length: 4096

`seq_length` in the training block sets ModelSpec.seq_length (the trained sequence).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.errors import PlannerInputError
from planner.inputs.files import load_document, name_from_path, path_kind, require_string_keys
from planner.inputs.megatron_flags import moe_pattern_from_flag
from planner.schemas.model import ModelSpec, moe_pattern_from_freq
from planner.schemas.types import MAX_LAYERS
from planner.schemas.training import TrainingSpec

PRESET_DIR = Path(__file__).resolve().parents[2] / "profiles" / "models"
TRAINING_KEYS = frozenset(TrainingSpec.model_fields) | {"seq_length"}


def list_model_presets() -> list[str]:
    """Names of the bundled presets, sorted."""
    if not PRESET_DIR.is_dir():
        return []
    return sorted(p.stem.lower() for p in PRESET_DIR.glob("*.yaml"))


def _preset_path(name: str) -> Path | None:
    wanted = name.strip().lower()
    if PRESET_DIR.is_dir():
        for p in PRESET_DIR.glob("*.yaml"):
            if p.stem.lower() == wanted:
                return p
    return None


def model_from_mapping(data: Any, *, name: str, where: str) -> tuple[ModelSpec, dict[str, Any]]:
    """ModelSpec and training block from a parsed preset document; errors name `where` and the key."""
    if not isinstance(data, dict):
        raise PlannerInputError(where, "expected a mapping of ModelSpec fields")
    require_string_keys(data, where, "the model")
    fields = dict(data)
    training = fields.pop("training", None)
    if training is None:
        training = {}
    if not isinstance(training, dict):
        raise PlannerInputError(f"{where}:training", "expected a mapping")
    require_string_keys(training, f"{where}:training", "the training block")
    unknown = sorted(set(training) - TRAINING_KEYS)
    if unknown:
        raise PlannerInputError(
            f"{where}:training", f"unknown key(s) {unknown}; allowed: {', '.join(sorted(TRAINING_KEYS))}"
        )
    _check_training(training, where)
    if "name" not in fields:  # a name stated in the file is checked by ModelSpec (errors name `where`:name)
        fields["name"] = name_from_path(name, "--model", "the model's name comes from its path (the file states no "
                                                         "`name:`)")
    if "moe_layer_freq" in fields:
        if "moe_layer_pattern" in fields:
            raise PlannerInputError(f"{where}:moe_layer_freq", "give moe_layer_freq or moe_layer_pattern, not both")
        freq = fields.pop("moe_layer_freq")
        num_layers = fields.get("num_layers")
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 0 < num_layers <= MAX_LAYERS:
            raise PlannerInputError(f"{where}:num_layers", f"expected an integer in 1..{MAX_LAYERS}, got {num_layers!r}")
        fields["moe_layer_pattern"] = _pattern_from_freq(freq, num_layers, f"{where}:moe_layer_freq")
    if "seq_length" in training:
        fields["seq_length"] = training["seq_length"]
    if "moe_router_pre_softmax" not in fields and needs_pre_softmax(fields):
        fields["moe_router_pre_softmax"] = True  # Megatron: "Please use --moe-router-pre-softmax when topk is 1."
    try:
        model = ModelSpec(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg")).removeprefix("Value error, ")
        raise PlannerInputError(f"{where}:{key}" if key else where, msg) from None
    return model, dict(training)


def needs_pre_softmax(fields: dict[str, Any]) -> bool:
    """A softmax top-1 router (not sinkhorn): Megatron computes the softmax before the top-k there
    (a softmax over one score has no gradient), so a model file that does not say gets it."""
    return (bool(fields.get("num_experts")) and fields.get("moe_router_topk", 2) == 1
            and fields.get("moe_router_score_function", "softmax") == "softmax"
            and fields.get("moe_router_load_balancing_type", "aux_loss") != "sinkhorn")


def _check_training(training: dict[str, Any], where: str) -> None:
    """The training block's values, checked against TrainingSpec here so that an error names the file
    and the key (the values are applied later, under the names of the Megatron flags)."""
    values = {k: v for k, v in training.items() if k != "seq_length"}
    values.setdefault("global_batch_size", 1)  # required by TrainingSpec; the preset may leave it to --gbs
    try:
        TrainingSpec(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg")).removeprefix("Value error, ")
        raise PlannerInputError(f"{where}:training.{key}", msg) from None


def _pattern_from_freq(freq: Any, num_layers: int, where: str) -> tuple[int, ...] | None:
    """`moe_layer_freq` as Megatron reads it: an int N, a list of 0/1 per layer, or a list
    expression such as "([0]+[1]*23)".  None when every layer is MoE."""
    try:
        if isinstance(freq, bool):
            raise ValueError(f"expected an integer, a 0/1 list or a list expression, got {freq!r}")
        if isinstance(freq, int):
            pattern = moe_pattern_from_freq(freq, num_layers)
        elif isinstance(freq, list):
            if any(isinstance(v, bool) or v not in (0, 1) for v in freq):
                raise ValueError("list entries must be 0 (dense) or 1 (MoE)")
            pattern = moe_pattern_from_freq(freq, num_layers)
        elif isinstance(freq, str):
            pattern = moe_pattern_from_flag(freq, num_layers)
        else:
            raise ValueError(f"expected an integer, a 0/1 list or a list expression, got {freq!r}")
    except (ValueError, TypeError) as exc:
        raise PlannerInputError(where, str(exc)) from None
    return None if all(pattern) else pattern


def load_model_file(path: str | Path) -> tuple[ModelSpec, dict[str, Any]]:
    """Load a preset-format YAML (or JSON) file from any path."""
    p = Path(path)
    data = load_document(p, "--model")
    return model_from_mapping(data, name=p.stem, where=str(p))


def load_model_preset(name: str) -> tuple[ModelSpec, dict[str, Any]]:
    """A bundled preset by name (case-insensitive) or a preset-format YAML path.

    Returns the ModelSpec and the preset's training block (a dict, possibly empty).
    """
    if not isinstance(name, str) or not name.strip():
        raise PlannerInputError("--model", f"expected a preset name or file path; known: {', '.join(list_model_presets())}")
    found = _preset_path(name)
    if found is not None:
        return load_model_file(found)
    p = Path(name).expanduser()
    kind = path_kind(p, "--model")
    if p.suffix.lower() in (".yaml", ".yml") or kind != "missing":
        return load_model_file(p)
    raise PlannerInputError(
        "--model",
        f"unknown model preset {name!r}; known presets: {', '.join(list_model_presets())} "
        "(or give a preset YAML or a HuggingFace config.json path)",
    )
