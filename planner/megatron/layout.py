"""Megatron's pipeline layouts: the grammar of --pipeline-model-parallel-layout, the pipeline-split
flags' rules, and the mapping between a plan's stages and those flags.

  * grammar (Megatron's `PipelineParallelLayerLayout.parse_str_to_list`): `layout_stages`,
    `parse_layout`, `format_layout`;
  * run -> plan: `check_pipeline` checks a flag list's pipeline split (layout string, VPP flags,
    first/last-stage flags, account-for flags) under Megatron's rules and turns a layout string
    into decoder layers per virtual stage;
  * plan -> run: `virtual_stage_layers` and `split_flags`, the flags that give Megatron a plan's
    layers per stage.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from planner.errors import PlannerInputError
from planner.megatron.flags import LAYERS_PER_VIRTUAL_STAGE_FLAG, LAYOUT_FLAG, VPP_FLAG
from planner.megatron.rules import interleave_violations, pipeline_split_violations
from planner.schemas.model import ModelSpec

_MAX_LAYOUT_CHARS = 200_000  # guard against "t*99999999999"
_FIRST_LAST_FLAGS = "--decoder-first/last-pipeline-num-layers"


# --------------------------------------------------------------------------------------------
# Layout grammar
# --------------------------------------------------------------------------------------------

_LAYOUT_SYMBOLS = "EtmL"
_GROUP_RE = re.compile(r"\(([^)]+)\)\*([0-9]+)")
_CHAR_RE = re.compile(r"(.)\*([0-9]+)")


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
    """Expand a layout string into one symbol string per virtual stage, in layout order.

    Grammar (Megatron's `parse_str_to_list`): commas are dropped, then `(...)*n` is unrolled in
    one pass, then `x*n`; `|` separates stages; symbols E (embedding), t (decoder layer),
    m (MTP layer), L (loss).  Checked as `validate_layer_layout` does: E first and L last in the
    flattened order, each exactly once; every t before every m.  Stricter than Megatron: E must
    be in the first stage and L in the last, as the planner assumes.
    """
    if not isinstance(text, str) or not text.strip():
        raise PlannerInputError(LAYOUT_FLAG, "expected a layout such as 'Et*3|(tt|)*29,m|L'")
    expanded = _unroll(_CHAR_RE, _unroll(_GROUP_RE, text.replace(",", "")))
    bad = sorted({c for c in expanded if c not in _LAYOUT_SYMBOLS + "|"})
    if bad:
        raise PlannerInputError(
            LAYOUT_FLAG,
            f"invalid character(s) {''.join(bad)!r} in {text!r}; allowed: E t m L, '|' between "
            "stages, ',' (ignored), (...)*n and x*n repetition",
        )
    stages = expanded.split("|")
    flat = "".join(stages)
    if flat.count("E") != 1 or flat.count("L") != 1:
        raise PlannerInputError(LAYOUT_FLAG, f"{text!r}: E and L must each appear exactly once")
    if not stages[0].startswith("E"):
        raise PlannerInputError(LAYOUT_FLAG, f"{text!r}: the first stage must start with E (embedding)")
    if not stages[-1].endswith("L"):
        raise PlannerInputError(LAYOUT_FLAG, f"{text!r}: the last stage must end with L (loss)")
    if "m" in flat and "t" in flat[flat.index("m") :]:
        raise PlannerInputError(LAYOUT_FLAG, f"{text!r}: every decoder layer t must come before every MTP layer m")
    return stages


def parse_layout(text: str) -> list[int]:
    """Decoder layers (`t`) per virtual stage of a Megatron layout string, in layout order
    (stage i runs on pipeline rank i % PP, virtual chunk i // PP)."""
    return [s.count("t") for s in layout_stages(text)]


def _t_run(n: int) -> str:
    """n decoder layers, as `ttt` or `t*n`, whichever is shorter (ties: the literal)."""
    literal = "t" * n
    short = f"t*{n}"
    return short if len(short) < len(literal) else literal


def format_layout(per_virtual_stage: Sequence[int], *, mtp_num_layers: int = 0) -> str:
    """A Megatron layout string for the given decoder layers per virtual stage (layout order).

    E opens the first stage, L closes the last (after `mtp_num_layers` m symbols, which sit in
    the last stage); runs of equal middle stages are compressed as `(t*n|)*k`.
    Inverse of `parse_layout`.
    """
    counts = [int(c) for c in per_virtual_stage]
    if not counts or any(c < 0 for c in counts):
        raise PlannerInputError(LAYOUT_FLAG, f"need at least one stage and no negative counts, got {counts}")
    if mtp_num_layers < 0:
        raise PlannerInputError("--mtp-num-layers", f"must be >= 0, got {mtp_num_layers}")
    tail = "m" * mtp_num_layers + "L"
    if len(counts) == 1:
        return "E" + _t_run(counts[0]) + tail
    parts = ["E" + _t_run(counts[0]) + "|"]
    middle = counts[1:-1]
    j = 0
    while j < len(middle):
        k = j
        while k < len(middle) and middle[k] == middle[j]:
            k += 1
        body = _t_run(middle[j]) + "|"
        reps = k - j
        literal = body * reps
        grouped = f"({body})*{reps}"
        parts.append(grouped if reps > 1 and len(grouped) < len(literal) else literal)
        j = k
    parts.append(_t_run(counts[-1]) + tail)
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# Run -> plan: the pipeline split of a flag list
# --------------------------------------------------------------------------------------------
def check_pipeline(parallel: dict[str, Any], model: ModelSpec, deferred: list) -> dict[str, Any]:
    """Megatron's pipeline-split rules (reference/megatron.md 2.3, rules 20-26) on a draft's
    ParallelConfig fields; returns them with the layout string replaced by decoder layers per
    virtual stage.  Layers that cannot be placed raise PlannerInputError; VPP over each rank's
    layers, which Megatron refuses only when it builds the model, is added to `deferred` as
    (flag, RuleViolation)."""
    p = dict(parallel)
    vpp_ways = [flag for flag, key in ((LAYERS_PER_VIRTUAL_STAGE_FLAG, "num_layers_per_virtual_stage"),
                                       (VPP_FLAG, "vpp"), (LAYOUT_FLAG, "layout")) if p.get(key) is not None]
    if len(vpp_ways) > 1:
        raise PlannerInputError(" / ".join(vpp_ways), "no more than one of these can be set at the same time")
    if p.get("layout") is not None:
        return _check_layout(p, model)
    return _check_split(p, model, deferred)


def _check_layout(p: dict[str, Any], model: ModelSpec) -> dict[str, Any]:
    """check_pipeline with --pipeline-model-parallel-layout (a string, or already a sequence of
    counts, e.g. a draft built from a plan)."""
    pp = p.get("pp", 1)
    layout = p["layout"]
    accounted = p.get("account_for_embedding_in_pipeline_split") or p.get("account_for_loss_in_pipeline_split")
    if p.get("first_stage_layers") is not None or p.get("last_stage_layers") is not None or accounted:
        raise PlannerInputError(
            LAYOUT_FLAG,
            "cannot be set with --decoder-first/last-pipeline-num-layers or --account-for-*-in-pipeline-split",
        )
    if isinstance(layout, str):
        stages = layout_stages(layout)
    else:
        stages = list(layout_stages(format_layout(list(layout), mtp_num_layers=model.mtp_num_layers)))
    counts = [s.count("t") for s in stages]
    if len(stages) % pp:
        raise PlannerInputError(
            LAYOUT_FLAG,
            f"has {len(stages)} stages, not a multiple of --pipeline-model-parallel-size {pp}",
        )
    if sum(counts) != model.num_layers:
        raise PlannerInputError(
            LAYOUT_FLAG, f"places {sum(counts)} decoder layers (t) but --num-layers is {model.num_layers}"
        )
    mtp = sum(s.count("m") for s in stages)
    if mtp != model.mtp_num_layers:
        raise PlannerInputError(
            LAYOUT_FLAG, f"places {mtp} MTP layers (m) but --mtp-num-layers is {model.mtp_num_layers}"
        )
    vpp_layout = len(stages) // pp
    for idx, s in enumerate(stages):
        if "m" in s and idx // pp != vpp_layout - 1:
            raise PlannerInputError(
                LAYOUT_FLAG, f"MTP layers must sit in the last virtual stage of their pipeline rank (stage {idx})"
            )
    p["layout"] = tuple(counts)
    if vpp_layout > 1 and pp == 1:
        raise PlannerInputError(LAYOUT_FLAG, "virtual stages (more stages than PP) need --pipeline-model-parallel-size > 1")
    return p


def _check_split(p: dict[str, Any], model: ModelSpec, deferred: list) -> dict[str, Any]:
    """check_pipeline without a layout: the VPP flags, first/last-stage flags and account-for flags
    (rules.pipeline_split_violations)."""
    pp = p.get("pp", 1)
    first, last = p.get("first_stage_layers"), p.get("last_stage_layers")
    if p.get("vpp") == 1:
        p["vpp"] = None  # Megatron: VPP 1 is no interleaving
    nlpv = p.get("num_layers_per_virtual_stage")
    if nlpv is not None and (first is not None or last is not None):
        raise PlannerInputError(
            LAYERS_PER_VIRTUAL_STAGE_FLAG,
            "please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline parallel degree when "
            "enable uneven pipeline parallelism",
        )
    embed = bool(p.get("account_for_embedding_in_pipeline_split"))
    loss = bool(p.get("account_for_loss_in_pipeline_split"))
    vpp = p.get("vpp") or 1
    if nlpv is not None:
        vpp = _vpp_of_layers_per_virtual_stage(p, model, pp, int(embed) + int(loss), nlpv)
    vpp_flag = LAYERS_PER_VIRTUAL_STAGE_FLAG if nlpv is not None else VPP_FLAG
    needs_pp = interleave_violations(None, pp=pp, vpp=vpp)  # vpp_needs_pp; M is the batch rules' concern
    if needs_pp:
        raise PlannerInputError(vpp_flag, needs_pp[0].message)
    for v in pipeline_split_violations(model.num_layers, pp, vpp, first=first, last=last,
                                       account_for_embedding=embed, account_for_loss=loss):
        if v.rule != "pipeline_split_vpp":  # the layers cannot be placed at all
            flag = _FIRST_LAST_FLAGS if first is not None or last is not None else "--pipeline-model-parallel-size"
            raise PlannerInputError(flag, f"{v.message} ({v.hint})")
        deferred.append((vpp_flag, v))
    return p


def _vpp_of_layers_per_virtual_stage(p: dict[str, Any], model: ModelSpec, pp: int, extra: int, nlpv: int) -> int:
    """VPP from --num-layers-per-virtual-pipeline-stage (Megatron's messages); drops the flag from
    `p` when it means no interleaving."""
    if (model.num_layers + extra) % pp:
        raise PlannerInputError("--pipeline-model-parallel-size",
                                "number of layers of the model must be divisible pipeline model parallel size")
    per_stage = (model.num_layers + extra) // pp
    if per_stage % nlpv:
        raise PlannerInputError(
            LAYERS_PER_VIRTUAL_STAGE_FLAG,
            "number of layers per pipeline stage must be divisible number of layers per virtual pipeline stage "
            f"({per_stage} layers per stage, {nlpv} per virtual stage)",
        )
    vpp = per_stage // nlpv
    if vpp == 1:
        p["num_layers_per_virtual_stage"] = None
    return vpp


# --------------------------------------------------------------------------------------------
# Plan -> run: the flags that place a plan's layers
# --------------------------------------------------------------------------------------------
def virtual_stage_layers(stage_layers: list[int], vpp: int) -> list[int]:
    """Decoder layers per virtual stage in layout order: stage index i runs on pipeline rank
    i % PP as virtual chunk i // PP.  Each rank's layers are split over its vpp chunks as evenly
    as possible, earlier chunks taking the remainder."""
    pp = len(stage_layers)
    out = [0] * (pp * vpp)
    for rank, n in enumerate(stage_layers):
        base, extra = divmod(n, vpp)
        for chunk in range(vpp):
            out[chunk * pp + rank] = base + (1 if chunk < extra else 0)
    return out


def split_flags(stage_layers: list[int], vpp: int, mtp_num_layers: int = 0) -> list[tuple[str, list[str]]]:
    """(flag, values) of the pipeline split for decoder layers per stage (pipeline rank): nothing
    when uniform, the first/last-stage flags when only the end stages differ, else
    --pipeline-model-parallel-layout (always with interleaving)."""
    counts = list(stage_layers)
    pp = len(counts)
    if vpp > 1:
        return [(LAYOUT_FLAG, [format_layout(virtual_stage_layers(counts, vpp), mtp_num_layers=mtp_num_layers)])]
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
