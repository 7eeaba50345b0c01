"""Router statistics -> MoE imbalance factor.

Input: tokens routed to each expert of each MoE layer, from a CSV with columns
`layer,expert,tokens` (optional `iteration` and `rank` columns), or from a directory written by
`planner.instrument` (files `router_stats_rank*.csv` in the same format).

Imbalance of one layer (in one iteration) = max tokens per expert / mean tokens per expert, with
counts summed over ranks first (every rank routes its own tokens to the same global experts).
The factor the cost model uses is the mean of that ratio over layers (and iterations).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from planner.errors import PlannerInputError
from planner.inputs.files import open_regular, path_kind

REQUIRED_COLUMNS = ("layer", "expert", "tokens")


@dataclass(frozen=True)
class RouterStats:
    """Token counts keyed by (iteration, layer) -> {expert: tokens}.  iteration is -1 when the
    input has no iteration column."""

    counts: dict[tuple[int, int], dict[int, float]]
    source: str

    @property
    def layers(self) -> list[int]:
        return sorted({layer for _, layer in self.counts})

    def layer_imbalance(self) -> dict[tuple[int, int], float]:
        """max/mean tokens per expert for every (iteration, layer) with routed tokens."""
        out: dict[tuple[int, int], float] = {}
        for key, per_expert in sorted(self.counts.items()):
            values = list(per_expert.values())
            mean = sum(values) / len(values) if values else 0.0
            if mean > 0:
                out[key] = max(values) / mean
        return out

    def imbalance_factor(self) -> float:
        """Mean over layers (and iterations) of max/mean tokens per expert; >= 1."""
        ratios = list(self.layer_imbalance().values())
        if not ratios:
            raise PlannerInputError("--router-stats", f"{self.source}: no layer with routed tokens")
        return statistics.fmean(ratios)


def _read_rows(path: Path, counts: dict[tuple[int, int], dict[int, float]], num_experts: int | None) -> None:
    try:
        _read_csv(path, counts, num_experts)
    except UnicodeDecodeError as exc:
        raise PlannerInputError("--router-stats", f"{path} is not UTF-8 text (byte offset {exc.start})") from None
    except (csv.Error, OSError) as exc:
        raise PlannerInputError("--router-stats", f"{path}: unreadable CSV ({exc})") from None


def _read_csv(path: Path, counts: dict[tuple[int, int], dict[int, float]], num_experts: int | None) -> None:
    with io.TextIOWrapper(open_regular(path, "--router-stats"), encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        columns = [c.strip() for c in (reader.fieldnames or [])]
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise PlannerInputError(
                "--router-stats", f"{path.name}: missing columns {missing}; expected layer,expert,tokens"
                " (optional iteration, rank)"
            )
        for line_no, row in enumerate(reader, start=2):
            row = {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
            try:
                layer = int(row["layer"])
                expert = int(row["expert"])
                tokens = float(row["tokens"])
                iteration = int(row["iteration"]) if row.get("iteration") else -1
            except ValueError:
                raise PlannerInputError(
                    "--router-stats", f"{path.name} line {line_no}: layer, expert, iteration must be integers "
                    f"and tokens a number, got {row}"
                ) from None
            if not math.isfinite(tokens) or tokens < 0 or expert < 0 or layer < 0:
                raise PlannerInputError(
                    "--router-stats", f"{path.name} line {line_no}: tokens must be a finite number >= 0 and layer, "
                    f"expert >= 0, got {row}"
                )
            if num_experts is not None and expert >= num_experts:
                raise PlannerInputError(
                    "--router-stats", f"{path.name} line {line_no}: expert {expert} but the model has {num_experts} "
                    f"experts (0..{num_experts - 1})"
                )
            per_expert = counts.setdefault((iteration, layer), {})
            per_expert[expert] = per_expert.get(expert, 0.0) + tokens
            if not math.isfinite(per_expert[expert]):
                raise _overflow(f"{path.name} line {line_no}", f"expert {expert} of layer {layer}")
    if num_experts is not None:
        for per_expert in counts.values():
            for e in range(num_experts):
                per_expert.setdefault(e, 0.0)


def load_router_stats(path: str | Path, num_experts: int | None = None) -> RouterStats:
    """Read a CSV file or an instrumentation directory.  `num_experts`, when given, adds experts
    that received no token (they count in the mean)."""
    p = Path(path)
    counts: dict[tuple[int, int], dict[int, float]] = {}
    kind = path_kind(p, "--router-stats")
    if kind == "dir":
        files = sorted(p.glob("router_stats_rank*.csv")) or sorted(p.glob("*.csv"))
        if not files:
            raise PlannerInputError("--router-stats", f"{p}: no router_stats_rank*.csv files")
        for f in files:
            _read_rows(f, counts, num_experts)
    elif kind == "missing":
        raise PlannerInputError("--router-stats", f"no such file or directory: {p}")
    else:
        _read_rows(p, counts, num_experts)
    if not counts:
        raise PlannerInputError("--router-stats", f"{p}: no rows")
    for (_iteration, layer), per_expert in counts.items():
        if not math.isfinite(sum(per_expert.values())):
            raise _overflow(p.name, f"the experts of layer {layer}")
    return RouterStats(counts=counts, source=p.name)


def _overflow(where: str, what: str) -> PlannerInputError:
    return PlannerInputError("--router-stats", f"{where}: the tokens routed to {what} add up to more than a number "
                                               f"holds ({sys.float_info.max:.3g}); these are not token counts")
