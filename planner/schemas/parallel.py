"""ParallelConfig: one fixed parallel configuration as Megatron's flags give it (for `estimate`),
and MegatronRun: everything read from a Megatron flag list."""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from planner.schemas.model import ModelSpec
from planner.schemas.plan import Recompute
from planner.schemas.training import TrainingSpec
from planner.schemas.types import MAX_LAYERS, StrictModel

LAYOUT_SYMBOLS = "EtmL"
"""Megatron's layout symbols: embedding, decoder layer ("transformer"), MTP layer, loss."""
LAYOUT_MAX_STAGES = 2 * MAX_LAYERS + 2


class ParallelConfig(StrictModel):
    """Megatron's global degrees and pipeline layout.  DP is derived from the world size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int = Field(1, gt=0, description="--tensor-model-parallel-size")
    pp: int = Field(1, gt=0, description="--pipeline-model-parallel-size")
    cp: int = Field(1, gt=0, description="--context-parallel-size")
    ep: int = Field(1, gt=0, description="--expert-model-parallel-size")
    etp: int | None = Field(None, gt=0, description="--expert-tensor-parallel-size; None: = tp")
    vpp: int | None = Field(None, gt=0, description="virtual stages per pipeline rank")
    num_layers_per_virtual_stage: int | None = Field(None, gt=0)
    layout: tuple[str, ...] | None = Field(
        None, description="--pipeline-model-parallel-layout expanded: one string of symbols per virtual stage, in "
        "layout order (E embedding, t decoder layer, m MTP layer, L loss; stage i runs on pipeline rank i % pp as "
        "virtual chunk i // pp)"
    )
    first_stage_layers: int | None = Field(None, gt=0)
    last_stage_layers: int | None = Field(None, gt=0)
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    sequence_parallel: bool = False
    recompute: Recompute = Recompute()

    @model_validator(mode="after")
    def _check(self) -> "ParallelConfig":
        if self.layout is not None:
            if not 0 < len(self.layout) <= LAYOUT_MAX_STAGES:
                raise ValueError(f"layout: 1 to {LAYOUT_MAX_STAGES} virtual stages, got {len(self.layout)}")
            bad = sorted({c for stage in self.layout for c in stage} - set(LAYOUT_SYMBOLS))
            if bad:
                raise ValueError(f"layout: unknown symbol(s) {''.join(bad)!r}; allowed: {' '.join(LAYOUT_SYMBOLS)}")
        return self

    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else self.tp

    def virtual_size(self, num_layers: int) -> int:
        """Virtual chunks per pipeline rank: the layout's stages over PP, --num-virtual-stages-per-pipeline-rank,
        or each rank's layers over --num-layers-per-virtual-pipeline-stage (1 when the flags do not divide)."""
        if self.layout is not None:
            return max(1, len(self.layout) // self.pp) if len(self.layout) % self.pp == 0 else 1
        if self.vpp is not None:
            return self.vpp
        if self.num_layers_per_virtual_stage is not None:
            per_stage = self.accounted_layers(num_layers) // self.pp
            return max(1, per_stage // self.num_layers_per_virtual_stage)
        return 1

    def accounted_layers(self, num_layers: int) -> int:
        """--num-layers plus one per --account-for-embedding/loss-in-pipeline-split flag."""
        return num_layers + int(self.account_for_embedding_in_pipeline_split) + int(
            self.account_for_loss_in_pipeline_split)

    def stage_layers(self, num_layers: int) -> list[int]:
        """Decoder layers per pipeline rank (all virtual chunks together), as the flags place them.

        Flags that do not place `num_layers` over PP (Megatron refuses them; planner/megatron/rules.py
        `pipeline_flag_violations` says why) get the even split, earlier ranks taking the remainder: the
        planner's stand-in, so that a refused plan can still be priced (`--allow-invalid`)."""
        placed = self._placed(num_layers)
        if placed is None or len(placed) != self.pp or sum(placed) != num_layers or min(placed) < 0:
            return even_split(num_layers, self.pp)
        return placed

    def _placed(self, num_layers: int) -> list[int] | None:
        pp = self.pp
        if self.layout is not None:
            if len(self.layout) % pp:
                return None
            out = [0] * pp
            for i, stage in enumerate(self.layout):
                out[i % pp] += stage.count("t")
            return out
        if self.first_stage_layers is not None or self.last_stage_layers is not None:
            if pp == 1:
                return [num_layers]
            first, last = self.first_stage_layers or 0, self.last_stage_layers or 0
            middle = pp - (self.first_stage_layers is not None) - (self.last_stage_layers is not None)
            rest = num_layers - first - last
            if rest < 0 or (middle == 0 and rest) or (middle and rest % middle):
                return None
            out = [rest // middle if middle else 0] * pp
            if self.first_stage_layers is not None:
                out[0] = first
            if self.last_stage_layers is not None:
                out[-1] = last
            return out
        total = self.accounted_layers(num_layers)
        if total % pp:
            return None
        out = [total // pp] * pp
        if self.account_for_embedding_in_pipeline_split:
            out[0] -= 1
        if self.account_for_loss_in_pipeline_split:
            out[-1] -= 1
        return out


def even_split(num_layers: int, pp: int) -> list[int]:
    """num_layers over pp ranks as evenly as possible, earlier ranks taking the remainder."""
    base, extra = divmod(num_layers, pp)
    return [base + (1 if i < extra else 0) for i in range(pp)]


class Assumption(StrictModel):
    """A value the input did not state, which the planner filled in (printed as "assumed")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="what was assumed, e.g. 'global batch size'")
    value: str | int | float
    flag: str = Field(description="the option (or key) that sets it")
    source: str = Field(description="where the assumed value comes from, e.g. 'preset mixtral-s'")


class MegatronRun(StrictModel):
    """Everything the planner reads from a Megatron flag list, plus the flags it does not use."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelSpec
    training: TrainingSpec
    parallel: ParallelConfig
    passthrough: tuple[str, ...] = Field((), description="flags the planner does not decide, in order")
    assumed: tuple[Assumption, ...] = Field((), description="values the input did not state (see Assumption)")
