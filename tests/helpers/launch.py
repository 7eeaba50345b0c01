"""Small plans the launcher tests render (and Megatron's validator then checks): a 22-layer dense model,
clusters of 8-GPU nodes, and the flags a rendered launcher passes."""

from __future__ import annotations

import shlex

from planner.schemas import ClusterSpec, ModelSpec, NodeGroup, Plan, StagePlan, TrainingSpec
from planner.schemas.parallel import MegatronRun, ParallelConfig

DENSE = ModelSpec(
    name="dense-22l", num_layers=22, hidden_size=2048, num_attention_heads=16, vocab_size=32000,
    seq_length=2048, swiglu=True, normalization="RMSNorm",
)  # fmt: skip


def cluster_of(*groups: tuple[str, int]) -> ClusterSpec:
    """Node groups of (device type, nodes), 8 GPUs a node."""
    return ClusterSpec(groups=tuple(NodeGroup(device_type=t, num_nodes=n, gpus_per_node=8) for t, n in groups))


def dense_plan(counts, vpp=1, **kw) -> tuple[MegatronRun, Plan, ClusterSpec]:
    """DENSE with sum(counts) layers on one A100 node, one stage of DP 1 per entry of `counts`."""
    model = DENSE.model_copy(update={"num_layers": sum(counts)})
    run = MegatronRun(model=model, training=TrainingSpec(global_batch_size=64), parallel=ParallelConfig())
    plan = Plan(gbs=64, vpp=vpp, stages=tuple(StagePlan(device_type="A100", num_layers=n, dp=1) for n in counts), **kw)
    return run, plan, cluster_of(("A100", 1))


def args_of(files: dict[str, str]) -> list[str]:
    """The Megatron flags of rendered launch files (megatron_args.txt, split as bash would)."""
    return shlex.split(files["megatron_args.txt"])
