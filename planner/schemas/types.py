"""Field types shared by the schemas, and the planner's size limits.

Every number a user gives (in a YAML or JSON file, a plan.json, a cluster file) is checked here
before the planner computes with it:

- **No coercion.** An integer field takes an integer only: not `true`, not `"4096"`, not `2.0`.
  A boolean takes `true`/`false` only: not `"no"`, not `1`.  A float takes an int or a float, never
  a bool or a string.
- **Finite.** Floats must be finite (no NaN, no infinity).
- **Bounded.** Counts have an upper limit (`MAX_*` below) far above any real model or cluster, so
  that a typo such as 10^9 layers or 10^6 nodes is refused in one line instead of hanging the search
  or writing a million-line host file.

Integers from numpy (`numbers.Integral`) are accepted, so the search may build plans from solver values.
"""

from __future__ import annotations

import numbers
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

# ---- limits (each is far above what a real run uses; the message names the limit) ----
MAX_LAYERS = 1_024  # decoder layers (DeepSeek-V3: 61, LLaMA-3-405B: 126); the search's tables grow with its square
MAX_EXPERTS = 65_536  # routed experts per MoE layer (DeepSeek-V3: 256)
MAX_GPUS = 131_072  # GPUs in one cluster or plan (2^17; the largest published training runs use ~10^5)
MAX_GPUS_PER_NODE = 1_024  # GPUs per node (NVL72 racks are 72)
MAX_SIZE = 1 << 24  # hidden/FFN/head sizes, vocabulary, ranks (16.7 M; real: <= 10^6)
MAX_SEQ_LENGTH = 1 << 24  # tokens per sequence (16.7 M)
MAX_BATCH = 1 << 24  # global/micro batch in sequences
MAX_DEGREE = MAX_GPUS  # one parallel degree (TP, CP, EP, ETP, DP, VPP)


def _reject_bool_and_text(value: Any, expected: str) -> None:
    if isinstance(value, bool):
        raise ValueError(f"expected {expected}, got the boolean {str(value).lower()}")
    if isinstance(value, (str, bytes)):
        raise ValueError(f"expected {expected}, got the string {value!r} (write the number without quotes)")


def _strict_int(value: Any) -> Any:
    """An integer only: bools, strings and floats are refused, numpy integers pass."""
    _reject_bool_and_text(value, "an integer")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float):
        raise ValueError(f"expected an integer, got {value!r}")
    return value  # anything else: pydantic's own int check names the type


def _strict_float(value: Any) -> Any:
    """An int or a float: bools and strings are refused."""
    _reject_bool_and_text(value, "a number")
    if isinstance(value, numbers.Integral):
        return int(value)
    return value


def _strict_bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":  # numpy.bool_
        return bool(value)
    raise ValueError(f"expected true or false, got {value!r}")


def _finite(value: float) -> float:
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"expected a finite number, got {value}")
    return value


StrictInt = Annotated[int, BeforeValidator(_strict_int)]
StrictFloat = Annotated[float, BeforeValidator(_strict_float), AfterValidator(_finite)]
StrictBool = Annotated[bool, BeforeValidator(_strict_bool)]
