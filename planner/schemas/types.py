"""`StrictModel`, the base of every schema, and the planner's size limits.

Every number a user gives (in a YAML or JSON file, a plan.json, a cluster or profile file) is
checked here before the planner computes with it:

- **No coercion.** An `int` field takes an integer only: not `true`, not `"4096"`, not `2.0`.  A
  `bool` takes `true`/`false` only: not `"no"`, not `1`.  A `float` takes an int or a float, never a
  bool or a string.  The same holds inside `tuple[int, ...]` and `dict[str, float]` fields.
- **Finite.** Floats must be finite (no NaN, no infinity).
- **Bounded.** Integer fields named in `FIELD_LIMITS` have that upper limit; every other integer at
  most `MAX_INT`.  The limits are far above any real model or cluster, so that a typo such as 10^9
  layers or 10^6 nodes is refused in one line instead of exhausting memory in the search or writing
  a million-line host file.

The check reads each field's annotation, so a field added to a schema later is covered without
changes here.  Integers from numpy (`numbers.Integral`) are accepted: the search builds plans from
solver values.
"""

from __future__ import annotations

import math
import numbers
import re
import types
from typing import Annotated, Any, Callable, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ValidationInfo, field_validator

# ---- limits (each far above what a real run uses) ----
MAX_LAYERS = 1_024  # decoder layers (DeepSeek-V3: 61, LLaMA-3-405B: 126); the search's tables grow with its square
MAX_EXPERTS = 65_536  # routed experts per MoE layer (DeepSeek-V3: 256)
MAX_GPUS = 131_072  # GPUs in one cluster or plan (2^17; the largest published training runs use ~10^5)
MAX_GPUS_PER_NODE = 1_024  # GPUs per node (NVL72 racks are 72)
MAX_SIZE = 1 << 24  # hidden/FFN/head sizes, vocabulary, ranks (16.7 M; real: <= 10^6)
MAX_SEQ_LENGTH = 1 << 24  # tokens per sequence (16.7 M)
MAX_BATCH = 1 << 24  # global/micro batch in sequences
MAX_DEGREE = MAX_GPUS  # one parallel degree (TP, CP, EP, ETP, DP, PP)
MAX_INT = 1 << 40  # any other integer field

FIELD_LIMITS: dict[str, int] = {
    # layers and stages
    "num_layers": MAX_LAYERS, "mtp_num_layers": MAX_LAYERS, "vpp": MAX_LAYERS,
    "num_layers_per_virtual_stage": MAX_LAYERS, "first_stage_layers": MAX_LAYERS, "last_stage_layers": MAX_LAYERS,
    "layout": MAX_LAYERS,
    # experts
    "num_experts": MAX_EXPERTS, "moe_router_topk": MAX_EXPERTS,
    # GPUs and degrees
    "num_nodes": MAX_GPUS, "gpus_per_node": MAX_GPUS_PER_NODE,
    "tp": MAX_DEGREE, "pp": MAX_DEGREE, "cp": MAX_DEGREE, "ep": MAX_DEGREE, "etp": MAX_DEGREE, "dp": MAX_DEGREE,
    # shapes
    "hidden_size": MAX_SIZE, "ffn_hidden_size": MAX_SIZE, "num_attention_heads": MAX_SIZE,
    "num_query_groups": MAX_SIZE, "kv_channels": MAX_SIZE, "vocab_size": MAX_SIZE,
    "make_vocab_size_divisible_by": MAX_SIZE, "q_lora_rank": MAX_SIZE, "kv_lora_rank": MAX_SIZE,
    "qk_head_dim": MAX_SIZE, "qk_pos_emb_head_dim": MAX_SIZE, "v_head_dim": MAX_SIZE,
    "moe_ffn_hidden_size": MAX_SIZE, "moe_shared_expert_intermediate_size": MAX_SIZE,
    "seq_length": MAX_SEQ_LENGTH, "max_position_embeddings": MAX_SEQ_LENGTH,
    # batch
    "micro_batch_size": MAX_BATCH, "global_batch_size": MAX_BATCH, "mbs": MAX_BATCH, "gbs": MAX_BATCH,
}


# ---- physical ranges of hardware figures: far outside real hardware on both sides, so that only a typo
# or a unit mix-up is refused (one line naming the field), and the cost model's times stay far inside
# the search's integer microseconds (planner/../solver_models/scaling.py)
PHYSICAL_RANGES: dict[str, tuple[float, float, str, str]] = {
    # name: (low, high, unit, what real hardware has)
    "bandwidth": (0.1, 10_000.0, "GB/s", "per GPU per direction; 1 GbE is 0.125, NVLink 5 900"),
    "latency": (0.0, 100_000.0, "us", "real links: 1-50 us"),
    "memory": (0.25, 65_536.0, "GiB", "per device; real: 16-288 GiB"),
    "peak": (1e-3, 1e5, "TFLOP/s", "per device; real: 15-10,000"),
    "hbm": (1e-3, 1e3, "TB/s", "per device; real: 0.3-8"),
}


def physical(name: str) -> AfterValidator:
    """A pydantic validator: the value must lie in PHYSICAL_RANGES[name]."""
    low, high, unit, real = PHYSICAL_RANGES[name]

    def check(value: float) -> float:
        if not low <= value <= high:
            raise ValueError(f"{value:g} {unit} is outside the physical range {low:g} to {high:g} {unit} ({real})")
        return value

    return AfterValidator(check)


BandwidthGBps = Annotated[float, physical("bandwidth")]
LatencyUs = Annotated[float, physical("latency")]
MemoryGiB = Annotated[float, physical("memory")]
PeakTflops = Annotated[float, physical("peak")]
HbmTBps = Annotated[float, physical("hbm")]


# ---- free text that reaches the terminal, summary.md and plot titles (names, device types, link kinds)
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""A character a terminal, a Markdown heading or a plot title does not show as itself: C0 (\\x00-\\x1f: ESC,
newline, carriage return, tab, ...), DEL (\\x7f), C1 (\\x80-\\x9f) and the Unicode line and paragraph separators."""
NOT_ALLOWED = ("control characters are not allowed: C0 \\x00-\\x1f (ESC, newline, carriage return, tab, ...), "
               "DEL \\x7f, C1 \\x80-\\x9f, and \\u2028/\\u2029")
_CHARACTER_NAMES = {"\x1b": "ESC", "\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x7f": "DEL",
                    "\x00": "NUL"}
_SHOWN = 60  # characters of the refused text the message shows (escaped)


def control_character_problem(text: str) -> str | None:
    """Why `text` may not be shown as it is (its first control character, escaped, and what is not allowed), or
    None.  The one check of every free-text name the planner prints (DisplayText; planner/inputs/files.py
    name_from_path for a name taken from a path)."""
    found = CONTROL_CHARACTER.search(text)
    if found is None:
        return None
    char = found.group(0)
    code = ascii(char)[1:-1]  # \x1b, \n, \u2028: never the raw character
    what = f"{_CHARACTER_NAMES[char]} ({code})" if char in _CHARACTER_NAMES else code
    # repr escapes every control character (and keeps other letters readable)
    shown = repr(text[:_SHOWN]) + (" ..." if len(text) > _SHOWN else "")
    return f"{shown} holds {what} at character {found.start() + 1}; {NOT_ALLOWED}"


def _display_text(value: str) -> str:
    problem = control_character_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


DisplayText = Annotated[str, AfterValidator(_display_text)]
"""A name the output shows (model, cluster, device, vendor, link kind): no control character (NOT_ALLOWED)."""


def _reject_bool_and_text(value: Any, expected: str) -> None:
    if isinstance(value, bool):
        raise ValueError(f"expected {expected}, got the boolean {str(value).lower()}")
    if isinstance(value, (str, bytes)):
        raise ValueError(f"expected {expected}, got the string {value!r} (write it without quotes)")


def _strict_int(value: Any, limit: int) -> Any:
    """An integer only (bools, strings and floats are refused; numpy integers pass), at most `limit`."""
    _reject_bool_and_text(value, "an integer")
    if isinstance(value, numbers.Integral):
        value = int(value)
        if value > limit:
            raise ValueError(f"at most {limit} (the planner's limit), got {value}")
        return value
    if isinstance(value, float):
        raise ValueError(f"expected an integer, got {value!r}")
    return value  # anything else: pydantic's own check names the type


def _strict_float(value: Any) -> Any:
    """An int or a finite float (bools and strings are refused)."""
    _reject_bool_and_text(value, "a number")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value}")
    return value


def _strict_bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":  # numpy.bool_
        return bool(value)
    raise ValueError(f"expected true or false, got {value!r}")


Check = Callable[[Any], Any]


def _check_for(annotation: Any, limit: int) -> Check | None:
    """The strict check for one annotation (None: pydantic's own validation is strict enough)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _check_for(get_args(annotation)[0], limit)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        return _check_for(options[0], limit) if len(options) == 1 else None
    if annotation is bool:
        return _strict_bool
    if annotation is int:
        return lambda v: _strict_int(v, limit)
    if annotation is float:
        return _strict_float
    args = get_args(annotation)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        inner = _check_for(args[0], limit)
        if inner is not None:
            return lambda v: type(v)(inner(x) for x in v) if isinstance(v, (list, tuple)) else v
    if origin is dict and len(args) == 2:
        inner = _check_for(args[1], limit)
        if inner is not None:
            return lambda v: {k: inner(x) for k, x in v.items()} if isinstance(v, dict) else v
    return None


class StrictModel(BaseModel):
    """Base of every schema: the checks of the module docstring, before pydantic's own validation."""

    @field_validator("*", mode="before")
    @classmethod
    def _strict(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or info.field_name is None:
            return value
        key = (cls, info.field_name)
        if key not in _CHECKS:
            _CHECKS[key] = _check_for(cls.model_fields[info.field_name].annotation,
                                      FIELD_LIMITS.get(info.field_name, MAX_INT))
        check = _CHECKS[key]
        return check(value) if check is not None else value


_CHECKS: dict[tuple[type, str], Check | None] = {}  # (schema, field) -> its check, built on first use
