"""ParallelConfig: one fixed parallel configuration as Megatron's flags give it (for `estimate`),
and MegatronRun: everything read from a Megatron flag list."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from planner.schemas.model import ModelSpec
from planner.schemas.plan import Recompute
from planner.schemas.training import TrainingSpec
from planner.schemas.types import StrictModel


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
    layout: tuple[int, ...] | None = Field(
        None, description="decoder layers per virtual stage, in layout order (length pp*vpp)"
    )
    first_stage_layers: int | None = Field(None, gt=0)
    last_stage_layers: int | None = Field(None, gt=0)
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    sequence_parallel: bool = False
    recompute: Recompute = Recompute()

    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else self.tp

    def virtual_size(self, num_layers: int) -> int:
        if self.layout is not None:
            return len(self.layout) // self.pp
        if self.vpp is not None:
            return self.vpp
        if self.num_layers_per_virtual_stage is not None:
            per_stage = num_layers // self.pp
            return max(1, per_stage // self.num_layers_per_virtual_stage)
        return 1

    def stage_layers(self, num_layers: int) -> list[int]:
        """Decoder layers per pipeline rank (all virtual chunks together).

        Raises ValueError naming the flag when the layout does not add up.
        """
        pp = self.pp
        if self.layout is not None:
            if len(self.layout) % pp:
                raise ValueError(
                    f"--pipeline-model-parallel-layout has {len(self.layout)} stages, not a multiple of "
                    f"--pipeline-model-parallel-size {pp}"
                )
            if sum(self.layout) != num_layers:
                raise ValueError(
                    f"--pipeline-model-parallel-layout places {sum(self.layout)} decoder layers but "
                    f"--num-layers is {num_layers}"
                )
            out = [0] * pp
            for i, n in enumerate(self.layout):
                out[i % pp] += n
            return out
        if self.first_stage_layers is not None or self.last_stage_layers is not None:
            first = self.first_stage_layers or 0
            last = self.last_stage_layers or 0
            middle_stages = pp - (self.first_stage_layers is not None) - (self.last_stage_layers is not None)
            rest = num_layers - first - last
            if pp == 1:
                raise ValueError("--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1")
            if rest < 0 or (middle_stages == 0 and rest != 0) or (middle_stages > 0 and rest % middle_stages):
                raise ValueError(
                    f"--decoder-first/last-pipeline-num-layers ({first}/{last}) leave {rest} layers for "
                    f"{middle_stages} middle stages of --num-layers {num_layers}; they must divide evenly"
                )
            per = rest // middle_stages if middle_stages else 0
            out = [per] * pp
            if self.first_stage_layers is not None:
                out[0] = first
            if self.last_stage_layers is not None:
                out[-1] = last
            return out
        extra = int(self.account_for_embedding_in_pipeline_split) + int(self.account_for_loss_in_pipeline_split)
        if (num_layers + extra) % pp:
            raise ValueError(
                f"--num-layers {num_layers} (+{extra} accounted) is not divisible by "
                f"--pipeline-model-parallel-size {pp}; give --pipeline-model-parallel-layout or "
                "--decoder-first/last-pipeline-num-layers"
            )
        per = (num_layers + extra) // pp
        out = [per] * pp
        if self.account_for_embedding_in_pipeline_split:
            out[0] -= 1
        if self.account_for_loss_in_pipeline_split:
            out[-1] -= 1
        return out


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
