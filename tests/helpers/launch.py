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


EP_OVERLAP_MOE = (
    "--num-layers 4 --hidden-size 1024 --ffn-hidden-size 4096 --moe-ffn-hidden-size 512 --num-attention-heads 8 "
    "--swiglu --normalization RMSNorm --disable-bias-linear --vocab-size 32000 --seq-length 2048 "
    "--max-position-embeddings 2048 --num-experts 16 --moe-router-topk 2 --moe-grouped-gemm "
    "--moe-router-force-load-balancing --moe-token-dispatcher-type alltoall --bf16 --micro-batch-size 1 "
    "--global-batch-size 64 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
    "--expert-model-parallel-size 4 --expert-tensor-parallel-size 1"
)
"""A small MoE on one node of 8 H100 (PP2 VPP2 EP4) for the CUDA_DEVICE_MAX_CONNECTIONS cases."""


def ep_overlap_launch(tp: int, overlap: bool) -> tuple[dict[str, str], int]:
    """(launch files, world size) of EP_OVERLAP_MOE at TP `tp`, with or without --overlap-moe-expert-parallel-comm,
    rendered as `estimate`'s plan of those flags."""
    from planner.api import load_inputs
    from planner.cost.estimate import plan_from_run
    from planner.launcher import render_launch_files
    from planner.profile_tables import ProfileSet

    flags = EP_OVERLAP_MOE + f" --tensor-model-parallel-size {tp}" + (" --sequence-parallel" if tp > 1 else "")
    flags += " --overlap-moe-expert-parallel-comm" if overlap else ""
    profiles = ProfileSet.load()
    inputs = load_inputs(cluster="H100:8", megatron_args=flags, profiles=profiles)
    plan, _ = plan_from_run(inputs.run, inputs.cluster, profiles)
    return render_launch_files(inputs.run, plan, inputs.cluster), plan.world_size


def hf_config_launch(config: dict, cluster: str, overrides: dict, tmp_dir) -> tuple[dict[str, str], int]:
    """(launch files, world size) of a HuggingFace config.json (written under `tmp_dir`) at the degrees in
    `overrides` (load_inputs' names: tp, pp, ep, mbs, gbs, seq, ...), rendered as `estimate`'s plan of them."""
    import json
    from pathlib import Path

    from planner.api import load_inputs
    from planner.cost.estimate import plan_from_run
    from planner.launcher import render_launch_files
    from planner.profile_tables import ProfileSet

    path = Path(tmp_dir) / "config.json"
    path.write_text(json.dumps(config))
    profiles = ProfileSet.load()
    inputs = load_inputs(cluster=cluster, model=str(path), overrides=overrides, profiles=profiles)
    plan, _ = plan_from_run(inputs.run, inputs.cluster, profiles)
    return render_launch_files(inputs.run, plan, inputs.cluster), plan.world_size
