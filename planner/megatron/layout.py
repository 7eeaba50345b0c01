"""Megatron's pipeline layouts: the grammar of --pipeline-model-parallel-layout, the pipeline-split
flags' rules, and the mapping between a plan's stages and those flags.

  * grammar (Megatron's `PipelineParallelLayerLayout.parse_str_to_list`): `layout_stages` (a string
    into one symbol string per virtual stage, empty stages included), `parse_layout`, `format_layout`
    (the inverse, compressed), `layout_of_counts`;
  * run -> plan: `check_pipeline` expands a flag list's layout and collects Megatron's pipeline-split
    refusals (planner/megatron/rules.py `pipeline_flag_violations`: layout grammar, VPP flags,
    first/last-stage flags, account-for flags);
  * plan -> run: `chunk_split`, `plan_layout` and `split_flags`, the flags that give Megatron a plan's
    layers per stage (a user's own layout is kept in the plan and written back as given).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from pydantic import ValidationError

from planner.errors import PlannerInputError
from planner.megatron.flags import LAYERS_PER_VIRTUAL_STAGE_FLAG, LAYOUT_FLAG, VPP_FLAG
from planner.megatron.rules import RuleViolation, pipeline_flag_violations
from planner.schemas.model import ModelSpec
from planner.schemas.parallel import LAYOUT_SYMBOLS, ParallelConfig
from planner.schemas.plan import Plan

_MAX_LAYOUT_CHARS = 200_000  # guard against "t*99999999999"
_FIRST_LAST_FLAGS = "--decoder-first/last-pipeline-num-layers"


# --------------------------------------------------------------------------------------------
# Layout grammar (Megatron's PipelineParallelLayerLayout.parse_str_to_list)
# --------------------------------------------------------------------------------------------

_GROUP_RE = re.compile(r"\(([^)]+)\)\*([0-9]+)")
_CHAR_RE = re.compile(r"(.)\*([0-9]+)")
_KNOWN_SYMBOLS = "['E', 'L', 't', 'm']"  # Megatron's list(char2layer_type.keys())


def _unroll(pattern: re.Pattern[str], text: str) -> str:
    """One left-to-right pass of `pattern` replacing `X*n` by X repeated n times (Megatron's re.sub)."""
    out: list[str] = []
    total = 0
    pos = 0
    for m in pattern.finditer(text):
        if len(m.group(2)) > 7:
            raise PlannerInputError(LAYOUT_FLAG, f"repetition count {m.group(2)[:12]}... is too large")
        count = int(m.group(2))
        total += (m.start() - pos) + len(m.group(1)) * count
        if total > _MAX_LAYOUT_CHARS:
            raise PlannerInputError(LAYOUT_FLAG, f"expands to more than {_MAX_LAYOUT_CHARS} symbols")
        piece = m.group(1) * count
        out.append(text[pos : m.start()])
        out.append(piece)
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def layout_stages(text: str) -> list[str]:
    """Expand a layout string into one symbol string per virtual stage, in layout order, exactly as
    Megatron's `parse_str_to_list` does: commas dropped, `(...)*n` unrolled in one pass (no nesting),
    then `x*n` (any character, n may be 0), then split at `|` (empty stages are stages).  Symbols:
    E embedding, t decoder layer, m MTP layer, L loss; any other character is refused with Megatron's
    message.  Where E, L and m may sit is Megatron's `validate_layer_layout`, checked by
    planner/megatron/rules.py (`layout_violations`)."""
    if not isinstance(text, str) or not text:
        raise PlannerInputError(LAYOUT_FLAG, "expected a layout such as 'Et*3|(tt|)*29,m|L'")
    expanded = _unroll(_CHAR_RE, _unroll(_GROUP_RE, text.replace(",", "")))
    stages = expanded.split("|")
    for stage in stages:
        for c in stage:
            if c not in LAYOUT_SYMBOLS:
                raise PlannerInputError(
                    LAYOUT_FLAG,
                    f"Invalid layer character: {c} (stage={stage!r}, layout_str={expanded!r}), known layer "
                    f"characters: {_KNOWN_SYMBOLS}",
                )
    return stages


def parse_layout(text: str) -> list[int]:
    """Decoder layers (`t`) per virtual stage of a Megatron layout string, in layout order
    (stage i runs on pipeline rank i % PP, virtual chunk i // PP)."""
    return [s.count("t") for s in layout_stages(text)]


def _runs(stage: str) -> str:
    """A stage's symbols with runs of one symbol written `x*n` where that is shorter."""
    out, i = [], 0
    while i < len(stage):
        j = i
        while j < len(stage) and stage[j] == stage[i]:
            j += 1
        n = j - i
        out.append(f"{stage[i]}*{n}" if len(f"{stage[i]}*{n}") < n else stage[i] * n)
        i = j
    return "".join(out)


def layout_of_counts(per_virtual_stage: Sequence[int], *, mtp_num_layers: int = 0) -> list[str]:
    """Symbol strings for decoder layers per virtual stage (layout order): E opens the first stage,
    the MTP layers and L close the last (where Megatron builds them without a layout)."""
    counts = [int(c) for c in per_virtual_stage]
    if not counts or any(c < 0 for c in counts):
        raise PlannerInputError(LAYOUT_FLAG, f"need at least one stage and no negative counts, got {counts}")
    if mtp_num_layers < 0:
        raise PlannerInputError("--mtp-num-layers", f"must be >= 0, got {mtp_num_layers}")
    stages = ["t" * c for c in counts]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "m" * mtp_num_layers + "L"
    return stages


def format_layout(stages: Sequence[str] | Sequence[int], *, mtp_num_layers: int = 0) -> str:
    """A Megatron layout string for the given virtual stages (layout order): symbol strings as
    `layout_stages` returns them, or decoder layers per virtual stage (then `layout_of_counts` places
    E, the MTP layers and L).  Runs of equal stages are written `(...|)*k` and runs of one symbol
    `x*n` where shorter; `layout_stages` of the result gives the stages back, empty ones included."""
    items = list(stages)
    if not items:
        raise PlannerInputError(LAYOUT_FLAG, "need at least one stage")
    if not all(isinstance(s, str) for s in items):
        items = layout_of_counts(items, mtp_num_layers=mtp_num_layers)  # type: ignore[arg-type]
    tokens = [_runs(s) + "|" for s in items[:-1]]
    parts: list[str] = []
    j = 0
    while j < len(tokens):
        k = j
        while k < len(tokens) and tokens[k] == tokens[j]:
            k += 1
        reps = k - j
        grouped = f"({tokens[j]})*{reps}"
        parts.append(grouped if reps > 1 and len(grouped) < len(tokens[j]) * reps else tokens[j] * reps)
        j = k
    parts.append(_runs(items[-1]))
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# Run -> plan: the pipeline split of a flag list
# --------------------------------------------------------------------------------------------
def check_pipeline(parallel: dict[str, Any], model: ModelSpec, deferred: list, *, overlap_p2p_comm: bool = True
                   ) -> dict[str, Any]:
    """A draft's ParallelConfig fields with the layout string expanded into its virtual stages (a
    sequence of decoder-layer counts, e.g. from a plan, gets E, the MTP layers and L placed), and
    --num-virtual-stages-per-pipeline-rank 1 read as no interleaving, as Megatron does.  Megatron's
    pipeline-split rules (rules.pipeline_flag_violations) are added to `deferred` as (flag, RuleViolation):
    the caller refuses them, or notes them under --allow-invalid (the layers are then priced as
    ParallelConfig.stage_layers places them).  A layout with a character Megatron does not know raises
    PlannerInputError."""
    p = dict(parallel)
    layout = p.get("layout")
    if isinstance(layout, str):
        p["layout"] = tuple(layout_stages(layout))
    elif layout is not None:
        items = list(layout)
        p["layout"] = tuple(items) if all(isinstance(x, str) for x in items) else tuple(
            layout_of_counts(items, mtp_num_layers=model.mtp_num_layers))
    try:
        config = ParallelConfig(**p)
    except (ValidationError, TypeError):
        return p  # build_run names the field
    for v in pipeline_flag_violations(model, config, overlap_p2p_comm=overlap_p2p_comm):
        deferred.append((_pipeline_flag(config, v), v))
    if p.get("vpp") == 1:
        p["vpp"] = None  # Megatron: VPP 1 is no interleaving (checked above as given: a VPP flag was set)
    return p


def _pipeline_flag(p: ParallelConfig, v: RuleViolation) -> str:
    """The flag a pipeline-split refusal names."""
    if v.rule == "vpp_flags":
        return " / ".join(f for f, on in ((LAYERS_PER_VIRTUAL_STAGE_FLAG, p.num_layers_per_virtual_stage),
                                          (VPP_FLAG, p.vpp), (LAYOUT_FLAG, p.layout)) if on is not None)
    if p.layout is not None:
        return LAYOUT_FLAG
    if v.rule in ("vpp_needs_pp", "pipeline_split_vpp") or (v.rule == "pipeline_split_build" and "vp_size" in v.message):
        return LAYERS_PER_VIRTUAL_STAGE_FLAG if p.num_layers_per_virtual_stage is not None else VPP_FLAG
    if p.first_stage_layers is not None or p.last_stage_layers is not None:
        return _FIRST_LAST_FLAGS
    return "--pipeline-model-parallel-size"


# --------------------------------------------------------------------------------------------
# Plan -> run: the flags that place a plan's layers
# --------------------------------------------------------------------------------------------
def chunk_split(stage_layers: Sequence[int], vpp: int) -> list[int]:
    """Decoder layers per virtual stage in layout order (stage index i runs on pipeline rank i % PP
    as virtual chunk i // PP) for a plan without its own layout.  Every rank follows one pattern: the
    layers of the ranks that hold the most, split over vpp chunks as evenly as possible with the spare
    layers in the first chunks; a rank holding fewer takes its missing layers off its largest chunks,
    nearest the embedding on the first rank and nearest the loss on the others.  So chunk c holds about
    the same layers on every rank: Megatron's interleaved schedule runs chunk c of PP micro-batches on
    every rank in turn, and a rank whose chunk c is larger than its neighbours' stalls them (12 layers
    per rank on PP 8 with VPP 8, as [1,1,1,1,2,2,2,2] on the first rank and [2,2,2,2,1,1,1,1] on the
    others, simulates 16% slower than even chunks; aligned, 3%: tests/test_simulate.py).  Ranks that
    hold one layer fewer than the others, as the search balances the embedding and the loss, get an
    embedding-only first chunk and a loss-only last chunk: 94 layers as [2, 3 x 30, 2] on PP 32 with
    VPP 3 are NVIDIA's `E|(t|)*94L`."""
    pp = len(stage_layers)
    most = max(int(n) for n in stage_layers)
    base, extra = divmod(most, vpp)
    pattern = [base + (1 if chunk < extra else 0) for chunk in range(vpp)]
    out = [0] * (pp * vpp)
    for rank, n in enumerate(stage_layers):
        chunks = list(pattern)
        nearest = range(vpp) if rank == 0 and pp > 1 else range(vpp - 1, -1, -1)
        for _ in range(most - int(n)):
            chunks[max(nearest, key=lambda c: chunks[c])] -= 1  # the first largest, nearest the end
        for chunk in range(vpp):
            out[chunk * pp + rank] = chunks[chunk]
    return out


virtual_stage_layers = chunk_split


def plan_layout(plan: Plan, mtp_num_layers: int = 0) -> list[str]:
    """The plan's virtual stages as symbol strings: its own layout, else `chunk_split`'s."""
    if plan.layout is not None:
        return list(plan.layout)
    return layout_of_counts(chunk_split([s.num_layers for s in plan.stages], plan.vpp), mtp_num_layers=mtp_num_layers)


def split_flags(plan: Plan, mtp_num_layers: int = 0) -> list[tuple[str, list[str]]]:
    """(flag, values) of the plan's pipeline split: its own layout (a user's, written back as Megatron
    reads it), else, for the decoder layers per stage: nothing when uniform, the first/last-stage flags
    when only the end stages differ, --pipeline-model-parallel-layout otherwise (always with
    interleaving)."""
    counts = [s.num_layers for s in plan.stages]
    pp, vpp = len(counts), plan.vpp
    if plan.layout is not None:
        if plan.layout == tuple(layout_of_counts(chunk_split(counts, vpp), mtp_num_layers=mtp_num_layers)) \
                and vpp == 1 and (pp == 1 or len(set(counts)) == 1):
            return []  # Megatron's default split: no flag needed
        return [(LAYOUT_FLAG, [format_layout(plan.layout)])]
    if vpp > 1:
        return [(LAYOUT_FLAG, [format_layout(plan_layout(plan, mtp_num_layers))])]
    if pp == 1 or len(set(counts)) == 1:
        return []
    middle = counts[1:-1]
    if 0 not in counts and len(set(middle)) <= 1:
        if not middle:  # PP == 2: the first-stage count fixes the last
            return [("--decoder-first-pipeline-num-layers", [str(counts[0])])]
        mid = middle[0]
        items: list[tuple[str, list[str]]] = []
        if counts[0] != mid:
            items.append(("--decoder-first-pipeline-num-layers", [str(counts[0])]))
        if counts[-1] != mid:
            items.append(("--decoder-last-pipeline-num-layers", [str(counts[-1])]))
        return items
    return [(LAYOUT_FLAG, [format_layout(counts, mtp_num_layers=mtp_num_layers)])]
