"""TrainingSpec: batch, precision and optimizer/overlap settings of the run."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from planner.schemas.types import StrictModel

Precision = Literal["bf16", "fp16", "fp8", "fp32"]


class TrainingSpec(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    micro_batch_size: int = Field(1, gt=0, description="--micro-batch-size (per DP rank of stage 0)")
    global_batch_size: int = Field(gt=0, description="--global-batch-size")
    precision: Precision = "bf16"
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    moe_imbalance_factor: float | None = Field(
        None,
        ge=1.0,
        description="max tokens per expert over the mean; None: 1.0 with forced balancing, else the"
        " profile default",
    )
