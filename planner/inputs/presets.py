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

import yaml
from pydantic import ValidationError

from planner.errors import PlannerInputError
from planner.inputs.megatron_flags import moe_pattern_from_flag
from planner.schemas.model import ModelSpec
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
    fields = dict(data)
    training = fields.pop("training", None) or {}
    if not isinstance(training, dict):
        raise PlannerInputError(f"{where}:training", "expected a mapping")
    unknown = sorted(set(training) - TRAINING_KEYS)
    if unknown:
        raise PlannerInputError(
            f"{where}:training", f"unknown key(s) {unknown}; allowed: {', '.join(sorted(TRAINING_KEYS))}"
        )
    fields.setdefault("name", name)
    if "moe_layer_freq" in fields:
        if "moe_layer_pattern" in fields:
            raise PlannerInputError(f"{where}:moe_layer_freq", "give moe_layer_freq or moe_layer_pattern, not both")
        freq = fields.pop("moe_layer_freq")
        if "num_layers" not in fields:
            raise PlannerInputError(f"{where}:num_layers", "missing")
        try:
            pattern = moe_pattern_from_flag(freq, fields["num_layers"])
        except (ValueError, TypeError) as exc:
            raise PlannerInputError(f"{where}:moe_layer_freq", str(exc)) from None
        fields["moe_layer_pattern"] = None if all(pattern) else pattern
    if "seq_length" in training:
        fields["seq_length"] = training["seq_length"]
    try:
        model = ModelSpec(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg")).removeprefix("Value error, ")
        raise PlannerInputError(f"{where}:{key}" if key else where, msg) from None
    return model, dict(training)


def load_model_file(path: str | Path) -> tuple[ModelSpec, dict[str, Any]]:
    """Load a preset-format YAML file from any path."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise PlannerInputError("--model", f"file not found: {p}") from None
    except yaml.YAMLError as exc:
        raise PlannerInputError("--model", f"{p} is not valid YAML: {exc}") from None
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
    if p.suffix.lower() in (".yaml", ".yml") or p.is_file():
        if not p.is_file():
            raise PlannerInputError("--model", f"file not found: {p}")
        return load_model_file(p)
    raise PlannerInputError(
        "--model",
        f"unknown model preset {name!r}; known presets: {', '.join(list_model_presets())} "
        "(or give a preset YAML or a HuggingFace config.json path)",
    )
