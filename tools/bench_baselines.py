"""Baseline-search benchmark: `python -m tools.bench_baselines [--repeats R] [--only NAME...] [--dump PATH]` from
the repository root.

Prints, per case, the median wall seconds over R runs of one baseline search on the scenarios of
tests/test_baselines.py (mixtral-s on H800:16,A100:16 and on h800-16, the 16-layer cut on H800:8, mixtral-s on
H800:8,MI300X:8 for the flagscale runtime), and of planner/baselines/hapmoe.py `uniform_enumeration` on
H800:16,A100:16 alone (the ablation's enumeration).  `--dump PATH` writes each case's result as JSON (the plan,
repr() of its iteration time and peak memory, the notes without their wall times) so that two versions of the
code can be diffed; `--hapmoe-plan PATH` reads (or, when absent, writes) HAPMoE's megatron plan on H800:16,A100:16
that the ablation re-splits, so that both versions re-split the same plan.  The figures depend on how busy the
machine is.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path
from typing import Callable

from planner.baselines import (
    search_ablation, search_alpa, search_deepspeed, search_hapmoe, search_hetermoe, search_metis, search_mi,
)
from planner.baselines.common import PricedPlan
from planner.baselines.hapmoe import uniform_enumeration
from planner.inputs.cluster import parse_cluster
from planner.inputs.resolve import resolve_run
from planner.profile_tables import ProfileSet
from planner.schemas.plan import Plan

LIMIT_S = 60.0
"""Each search's time limit (tests/test_baselines.py's)."""


def scenario(profiles: ProfileSet, model: str, cluster_name: str, layers: int | None = None):
    """tests/test_baselines.py `scenario` (GBS 16 per GPU), optionally cut to `layers` dense-pattern-free layers."""
    cluster = parse_cluster(cluster_name, profiles)
    run = resolve_run(model=model, world_size=cluster.world_size, overrides={"gbs": 16 * cluster.world_size})
    if layers is not None:
        cut = run.model.model_validate({**run.model.model_dump(), "num_layers": layers, "moe_layer_pattern": None})
        run = run.model_copy(update={"model": cut})
    return run, cluster


def outcome(priced: PricedPlan | None, notes: list[str]) -> dict:
    """What a search returned, in a form two versions of the code can be diffed on (wall times dropped)."""
    kept = [re.sub(r"\d+(\.\d+)? s\b", "<t> s", n) for n in notes]
    if priced is None:
        return {"plan": None, "notes": kept}
    return {"plan": priced.plan.model_dump(mode="json"), "iteration_time_s": repr(priced.cost.iteration_time_s),
            "max_memory_gib": repr(priced.cost.max_memory_gib), "mixed_stages": list(priced.mixed_stages),
            "plan_notes": list(priced.notes), "notes": kept}


def cases(profiles: ProfileSet, hapmoe_plan: Callable[[], Plan]) -> dict[str, Callable[[list[str]], object]]:
    """name -> a call taking the notes list and returning a PricedPlan or None."""
    hetero = scenario(profiles, "mixtral-s", "H800:16,A100:16")
    homo = scenario(profiles, "mixtral-s", "h800-16")
    cut = scenario(profiles, "mixtral-s", "H800:8", layers=16)
    vendors = scenario(profiles, "mixtral-s", "H800:8,MI300X:8")
    out: dict[str, Callable[[list[str]], object]] = {
        "uniform_enumeration@hetero": lambda notes: uniform_enumeration(*hetero, profiles),
        "ablation@hetero": lambda notes: search_ablation(*hetero, profiles, notes=notes, hapmoe_plan=hapmoe_plan()),
    }
    for name, search in (("mi", search_mi), ("hetermoe", search_hetermoe), ("deepspeed", search_deepspeed),
                         ("metis", search_metis), ("alpa", search_alpa)):
        out[f"{name}@hetero"] = lambda notes, s=search: s(*hetero, profiles, notes=notes, time_limit_s=LIMIT_S)
    for name, search in (("mi", search_mi), ("deepspeed", search_deepspeed)):
        out[f"{name}@homo"] = lambda notes, s=search: s(*homo, profiles, notes=notes)
    for name, search in (("alpa", search_alpa), ("metis", search_metis)):
        out[f"{name}@cut"] = lambda notes, s=search: s(*cut, profiles, notes=notes, time_limit_s=LIMIT_S)
    for name, search in (("mi", search_mi), ("alpa", search_alpa), ("metis", search_metis),
                         ("hetermoe", search_hetermoe), ("deepspeed", search_deepspeed),
                         ("ablation", search_ablation)):
        out[f"{name}@vendors-flagscale"] = lambda notes, s=search: s(*vendors, profiles, notes=notes,
                                                                     time_limit_s=LIMIT_S, runtime="flagscale")
    return out


def hapmoe_plan_loader(profiles: ProfileSet, path: Path | None) -> Callable[[], Plan]:
    """HAPMoE's megatron plan on H800:16,A100:16, read from `path` if it exists, else searched (and written there)."""
    held: list[Plan] = []

    def load() -> Plan:
        if held:
            return held[0]
        if path is not None and path.is_file():
            held.append(Plan.model_validate_json(path.read_text()))
            return held[0]
        priced = search_hapmoe(*scenario(profiles, "mixtral-s", "H800:16,A100:16"), profiles,
                               runtimes=("megatron",), time_limit_s=LIMIT_S)
        held.append(priced.plan)
        if path is not None:
            path.write_text(priced.plan.model_dump_json())
        return held[0]

    return load


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help="case names (prefixes) to run")
    parser.add_argument("--dump", type=Path, default=None)
    parser.add_argument("--hapmoe-plan", type=Path, default=None)
    args = parser.parse_args(argv)
    profiles = ProfileSet.load()
    table = cases(profiles, hapmoe_plan_loader(profiles, args.hapmoe_plan))
    dumped: dict[str, dict] = {}
    print(f"{'case':32s} {'median s':>9s}  runs")
    for name, call in table.items():
        if args.only is not None and not any(name.startswith(p) for p in args.only):
            continue
        walls, results = [], []
        for _ in range(args.repeats):
            notes: list[str] = []
            t0 = time.perf_counter()
            priced = call(notes)
            walls.append(time.perf_counter() - t0)
            results.append(outcome(priced, notes))
        if any(r != results[0] for r in results[1:]):
            print(f"  {name}: the runs disagree")
        dumped[name] = results[0]
        print(f"{name:32s} {statistics.median(walls):9.2f}  {' '.join(f'{w:.2f}' for w in walls)}", flush=True)
    if args.dump is not None:
        args.dump.write_text(json.dumps(dumped, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
