"""The runtimes a plan can be written for, and what each can express.

A runtime is the training system that runs the plan: upstream Megatron-LM, or FlagScale's heterogeneous
process meshes.  The search, the rules, the launchers and the reports ask a `Runtime` what it can express
(one DP for the whole job or one per stage, CP, interleaving, ...) instead of comparing runtime names.
Plans, search choices and JSON carry the runtime by name (`Plan.runtime`, `GlobalChoice.runtime`);
`runtime_of(name)` turns a name into its Runtime.

To add a runtime: a `Runtime` here, its rules in planner/megatron/rules.py (`runtime_violations`), its
launcher in planner/launcher/ (`LAUNCHERS`), and its stage shapes in planner/search/space.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RuntimeName = Literal["megatron", "flagscale"]


@dataclass(frozen=True)
class Runtime:
    """What one runtime can run.

    `per_stage_meshes`: every pipeline stage is a process mesh of its own, with its own DP (and its own
    micro-batch split), as FlagScale's `--hetero-process-meshes`; otherwise one (TP, CP, DP, EP, ETP) for
    the whole job, as upstream Megatron-LM.
    `per_stage_recompute`: each stage may choose its recompute (FlagScale's per-stage lists: full or none);
    otherwise one recompute setting for every stage.
    `contiguous_types`: each device type's stages must form one block of the pipeline (FlagScale orders
    ranks by device type); otherwise any order (`--contiguous-types` asks for blocks).
    `context_parallel`, `interleaving`: whether CP > 1 and VPP > 1 are available."""

    name: RuntimeName
    title: str
    per_stage_meshes: bool
    per_stage_recompute: bool
    contiguous_types: bool
    context_parallel: bool
    interleaving: bool


MEGATRON = Runtime(
    name="megatron", title="upstream Megatron-LM", per_stage_meshes=False, per_stage_recompute=False,
    contiguous_types=False, context_parallel=True, interleaving=True,
)
FLAGSCALE = Runtime(
    name="flagscale", title="FlagScale heterogeneous meshes", per_stage_meshes=True, per_stage_recompute=True,
    contiguous_types=True, context_parallel=False, interleaving=False,
)
RUNTIMES: dict[str, Runtime] = {r.name: r for r in (MEGATRON, FLAGSCALE)}
RUNTIME_NAMES: tuple[str, ...] = tuple(RUNTIMES)


def runtime_of(name: str) -> Runtime:
    """The Runtime called `name`; ValueError naming the known ones otherwise."""
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ValueError(f"unknown runtime {name!r}; allowed: {', '.join(RUNTIME_NAMES)}") from None
