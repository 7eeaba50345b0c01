"""Inputs the tests build again and again: a preset cut to a few layers, and a run given as Megatron
flags with its one-stage plan, each with its cost model on the shipped profiles."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from planner.cost.estimate import plan_from_run
from planner.cost.model import CostModel
from planner.inputs.cluster import parse_cluster
from planner.inputs.megatron_flags import parse_megatron_flags
from planner.inputs.resolve import resolve_run
from planner.profile_tables import ProfileSet


def reduced_cost_model(preset: str, layers: int, cluster: str, gbs: int, *, pattern: Sequence[int] | None = None,
                       tied: bool = False, seq: int | None = None, fsdp: str | None = None,
                       memory_headroom: float | None = None) -> CostModel:
    """The preset with its first `layers` decoder layers (as `sed s/^num_layers: .*/num_layers: N/`) on
    `cluster` with global batch `gbs`: MoE layers where `pattern` says, else every layer of an MoE
    model; with `tied`, its embeddings tied to the output layer (FlagScale's first and last stage DPs
    must then divide one another); `seq` sets the sequence length; `fsdp` trains with Megatron-FSDP and
    that --data-parallel-sharding-strategy (with the distributed optimizer and the fsdp_dtensor checkpoint
    format it asks for); `memory_headroom` as --memory-headroom (a fraction; None: the shipped default)."""
    profiles = ProfileSet.load()
    cl = parse_cluster(cluster, profiles)
    overrides: dict[str, int] = {"gbs": gbs} if seq is None else {"gbs": gbs, "seq": seq}
    run = resolve_run(model=preset, world_size=cl.world_size, overrides=overrides)
    update = {"num_layers": layers, "moe_layer_pattern": None if pattern is None else tuple(pattern)}
    if tied:
        update["untie_embeddings_and_output_weights"] = False
    model = run.model.model_validate({**run.model.model_dump(), **update})
    training = run.training
    if fsdp is not None:
        megatron = {**training.megatron.model_dump(), "ckpt_format": "fsdp_dtensor"}
        training = training.model_validate({**training.model_dump(), "use_megatron_fsdp": True,
                                            "data_parallel_sharding_strategy": fsdp, "use_distributed_optimizer": True,
                                            "megatron": megatron})
    return CostModel(model, training, cl, profiles, memory_headroom=memory_headroom)


def flags_cost_model(flags: str, cluster: str):
    """(run, plan, cost model) of a run given as Megatron flags on `cluster`: the plan is the one the
    flags describe (`estimate`'s)."""
    profiles = ProfileSet.load()
    cl = parse_cluster(cluster, profiles)
    run = parse_megatron_flags(shlex.split(flags), world_size=cl.world_size)
    plan, _ = plan_from_run(run, cl, profiles)
    return run, plan, CostModel(run.model, run.training, cl, profiles)


def memory_row_stub(id_: str, metric: str, measured: float, predicted: float, *, source: str = "org/x",
                    free: float = 0.0, vary: bool = False):
    """A measured-memory row priced by hand (planner/calibration/memory.py MemoryRow): `predicted` stands for the
    allocated and the needed reserved peak alike, `free` for the device memory left above it."""
    from planner.calibration.memory import MemoryRow

    return MemoryRow(id=id_, metric=metric, measured_gib=measured, predicted_gib=predicted, stage=0,
                     weights_grads_optimizer_gib=0.0, activations_gib=0.0, outside_allocator_gib=0.0, source=source,
                     predicted_allocated_gib=predicted, predicted_reserved_gib=predicted, free_gib=free,
                     shapes_vary=vary)
