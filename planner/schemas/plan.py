"""Plan: what every search backend returns and every consumer (cost model, launcher, checker) reads.

Conventions: stages are 0-based and ordered along the pipeline; `num_layers` counts decoder
layers on that pipeline rank (all its virtual chunks together); the embedding sits on stage 0
and the output layer / loss on the last stage.  Degrees use Megatron's short names, defined
in the README glossary: tp, cp, ep, etp (expert tensor parallel), dp, pp, vpp.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from planner.runtime import RuntimeName
from planner.schemas.cluster import pool_members
from planner.schemas.types import MAX_GPUS, MAX_LAYERS, StrictModel


RECOMPUTE_MODULES = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "shared_experts",
)


class Recompute(StrictModel):
    """Megatron's recompute knobs for one pipeline stage.

    granularity none: keep every activation; selective: recompute `modules`;
    full + uniform: recompute every layer, checkpointing each chunk of `num_layers` layers;
    full + block: recompute the first `num_layers` layers of the stage, keep the rest.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    granularity: Literal["none", "selective", "full"] = "none"
    method: Literal["uniform", "block"] | None = None
    num_layers: int | None = Field(None, ge=0)
    modules: tuple[str, ...] = ("core_attn",)

    @model_validator(mode="after")
    def _check(self) -> "Recompute":
        if self.granularity == "full":
            if self.method is None or self.num_layers is None:
                raise ValueError(
                    "recompute granularity full needs a method (uniform|block) and num_layers"
                )
        elif self.method is not None or self.num_layers is not None:
            raise ValueError(f"recompute method/num_layers are only allowed with granularity full, not {self.granularity}")
        bad = [m for m in self.modules if m not in RECOMPUTE_MODULES]
        if bad:
            raise ValueError(f"unknown recompute modules {bad}; allowed: {', '.join(RECOMPUTE_MODULES)}")
        return self

    @property
    def label(self) -> str:
        if self.granularity == "none":
            return "none"
        if self.granularity == "selective":
            return "selective:" + "+".join(self.modules)
        return f"full:{self.method}:{self.num_layers}"

    @classmethod
    def none(cls) -> "Recompute":
        return cls()

    @classmethod
    def selective(cls, modules: tuple[str, ...] = ("core_attn",)) -> "Recompute":
        return cls(granularity="selective", modules=tuple(modules))

    @classmethod
    def full(cls, method: str = "uniform", num_layers: int = 1) -> "Recompute":
        return cls(granularity="full", method=method, num_layers=num_layers)


class StagePlan(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    device_type: str
    num_layers: int = Field(ge=0, description="decoder layers on this pipeline rank")
    dp: int = Field(1, gt=0, description="data-parallel size of this stage")
    recompute: Recompute = Recompute()

    def member_types(self) -> tuple[str, ...]:
        """The device types the stage's GPUs come from: its type, or a pooled type's members."""
        return pool_members(self.device_type)


class Plan(StrictModel):
    """A complete parallel plan: global degrees plus one entry per pipeline stage."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: RuntimeName = "megatron"
    tp: int = Field(1, gt=0)
    cp: int = Field(1, gt=0)
    ep: int = Field(1, gt=0)
    etp: int = Field(1, gt=0)
    vpp: int = Field(1, gt=0, description="virtual pipeline chunks per rank (interleaving)")
    mbs: int = Field(1, gt=0, description="micro-batch size (per DP rank of stage 0)")
    gbs: int = Field(gt=0)
    sequence_parallel: bool = True
    stages: tuple[StagePlan, ...]
    layout: tuple[str, ...] | None = Field(
        None, description="Megatron's pipeline layout, where the plan fixes one: one string of symbols per virtual "
        "stage in layout order (E embedding, t decoder layer, m MTP layer, L loss; stage i runs on pipeline rank "
        "i % pp as virtual chunk i // pp), pp * vpp of them.  None: each rank's layers split over its vpp chunks "
        "by planner/megatron/layout.py (chunk_split)"
    )

    @model_validator(mode="after")
    def _check(self) -> "Plan":
        if not self.stages:
            raise ValueError("a plan needs at least one stage")
        if len(self.stages) > MAX_LAYERS:
            raise ValueError(f"the plan has {len(self.stages)} pipeline stages; at most {MAX_LAYERS} are allowed")
        if self.world_size > MAX_GPUS:
            raise ValueError(f"the plan uses {self.world_size} GPUs; the planner handles at most {MAX_GPUS}")
        if self.layout is not None:
            self._check_layout(self.layout)
        return self

    def _check_layout(self, layout: tuple[str, ...]) -> None:
        if len(layout) != self.pp * self.vpp:
            raise ValueError(f"layout: {len(layout)} virtual stages, expected pp * vpp = {self.pp * self.vpp}")
        bad = sorted({c for stage in layout for c in stage} - set("EtmL"))
        if bad:
            raise ValueError(f"layout: unknown symbol(s) {''.join(bad)!r}; allowed: E t m L")
        per_rank = [sum(layout[c * self.pp + r].count("t") for c in range(self.vpp)) for r in range(self.pp)]
        if per_rank != [s.num_layers for s in self.stages]:
            raise ValueError(f"layout: places {per_rank} decoder layers per pipeline rank, but the stages hold "
                             f"{[s.num_layers for s in self.stages]}")

    DERIVED_KEYS: ClassVar[tuple[str, ...]] = ("pp", "dp", "num_microbatches", "world_size")

    @classmethod
    def from_json(cls, data: dict) -> "Plan":
        """Read a plan as `solve` writes it: derived keys (pp, dp, world_size, ...) are ignored."""
        clean = {k: v for k, v in data.items() if k not in cls.DERIVED_KEYS}
        if isinstance(clean.get("stages"), list):
            clean["stages"] = [
                {k: v for k, v in st.items() if k != "recompute_label"} if isinstance(st, dict) else st
                for st in clean["stages"]
            ]
        return cls.model_validate(clean)

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def dp0(self) -> int:
        return self.stages[0].dp

    @property
    def world_size(self) -> int:
        return sum(self.tp * self.cp * s.dp for s in self.stages)

    @property
    def num_microbatches(self) -> int:
        """GBS / (mbs * DP of stage 0); every stage sees the same count (FlagScale rule)."""
        return self.gbs // (self.mbs * self.dp0)

    def stage_mbs(self, i: int) -> int:
        """Samples per micro-batch on one DP rank of stage i (FlagScale: DP0*mbs/DP_i)."""
        return self.mbs * self.dp0 // self.stages[i].dp

    def layer_ranges(self) -> list[tuple[int, int]]:
        """Half-open [start, end) decoder-layer range of every stage."""
        out, start = [], 0
        for s in self.stages:
            out.append((start, start + s.num_layers))
            start += s.num_layers
        return out

    def gpus_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.stages:
            out[s.device_type] = out.get(s.device_type, 0) + self.tp * self.cp * s.dp
        return out

    def member_types(self) -> list[str]:
        """The device types the stages run on, in stage order, once each; a pooled stage type ("H100+H200")
        counts as its members (what a runtime must hold in one job)."""
        return list(dict.fromkeys(m for s in self.stages for m in s.member_types()))
