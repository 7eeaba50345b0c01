"""TrainingSpec: batch, precision and optimizer/overlap settings of the run."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.schemas.types import MAX_BATCH, MAX_EXPERTS, StrictBool, StrictFloat, StrictInt

Precision = Literal["bf16", "fp16", "fp8", "fp32"]


class TrainingSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    micro_batch_size: StrictInt = Field(1, gt=0, le=MAX_BATCH, description="--micro-batch-size (per DP rank of stage 0)")
    global_batch_size: StrictInt = Field(gt=0, le=MAX_BATCH, description="--global-batch-size")
    precision: Precision = "bf16"
    use_distributed_optimizer: StrictBool = False
    overlap_grad_reduce: StrictBool = False
    overlap_param_gather: StrictBool = False
    tp_comm_overlap: StrictBool = False
    moe_imbalance_factor: StrictFloat | None = Field(
        None,
        ge=1.0,
        le=MAX_EXPERTS,
        description="max tokens per expert over the mean; None: 1.0 with forced balancing, else the"
        " profile default",
    )
