"""Flags that change time or memory but that the cost model does not price.

The planner never ignores such a flag silently: `unmodelled_notes` names each one present in a run's
flags, with what it changes, and `estimate`/`solve` print the notes beside the prediction.  When a flag
here becomes modelled, move it into the cost model and out of this table.
"""

from __future__ import annotations

from typing import Iterable

UNMODELLED_FLAGS: dict[str, str] = {
    "--use-megatron-fsdp": "shards parameters, gradients and optimizer states (FSDP): memory lower and extra "
                           "parameter all-gathers per layer",
    "--use-torch-fsdp2": "PyTorch FSDP2 sharding: memory lower, extra all-gathers per layer",
    "--data-parallel-sharding-strategy": "FSDP sharding strategy: memory and communication",
    "--fine-grained-activation-offloading": "offloads activations to host memory: activation memory lower, "
                                            "PCIe traffic added",
    "--cpu-offloading": "offloads activations or weights to host memory",
    "--optimizer-cpu-offload": "runs the optimizer step on the CPU: optimizer memory lower, step time different",
    "--cuda-graph-impl": "CUDA graphs: less launch overhead, more memory for graph pools",
    "--enable-cuda-graph": "CUDA graphs: less launch overhead, more memory for graph pools",
    "--external-cuda-graph": "CUDA graphs: less launch overhead, more memory for graph pools",
    "--cuda-graph-scope": "CUDA graphs: less launch overhead, more memory for graph pools",
    "--moe-router-padding-for-fp8": "pads expert inputs to FP8 GEMM alignment: slightly more expert work",
    "--moe-permute-fusion": "fused permute/unpermute kernels: fewer memory passes than priced",
    "--moe-router-fusion": "fused router kernels: fewer memory passes than priced",
    "--cross-entropy-loss-fusion": "fused cross-entropy: less logits memory and time than priced",
    "--moe-upcycling-granularity": "upcycled experts: expert shapes differ from --moe-ffn-hidden-size",
    "--moe-latent-size": "latent MoE: expert inputs projected to a smaller size",
    "--swap-attention": "MindSpeed: swaps attention activations to host memory",
    "--use-mc2": "MindSpeed: fuses TP communication into compute (mc2): TP time lower than priced",
    "--moe-alltoall-overlap-comm": "MindSpeed: overlaps the EP all-to-all with compute",
    "--use-fused-rmsnorm": "MindSpeed fused kernel: norm time lower than priced",
    "--use-fused-swiglu": "MindSpeed fused kernel: activation time lower than priced",
    "--use-distributed-optimizer-offload": "offloads optimizer states",
    "--hybrid-context-parallel": "hybrid context parallelism: attention communication differs from the CP model",
    "--hierarchical-context-parallel-sizes": "hierarchical CP: attention communication differs from the CP model",
    "--manual-gc": "Python garbage collection at fixed intervals: small time effect",
    "--empty-unused-memory-level": "frees cached memory between phases: small time and peak-memory effect",
    "--use-cpu-initialization": "initialisation only",
    "--sequence-packing": "packed variable-length sequences: attention work differs from full-length sequences",
    "--window-size": "sliding-window attention: attention work lower than the full causal count priced",
    "--delay-param-gather": "parameter gather scheduling differs from the priced overlap",
}
"""Flag -> what it changes and the prediction does not include."""


def unmodelled_notes(passthrough: Iterable[str]) -> list[str]:
    """One note per flag in `passthrough` (the run's flags the planner does not read) that changes time
    or memory but is not priced."""
    seen: list[str] = []
    for tok in passthrough:
        name = tok.split("=", 1)[0]
        if name in UNMODELLED_FLAGS and name not in seen:
            seen.append(name)
    return [f"{name} is not modelled: {UNMODELLED_FLAGS[name]}; the prediction ignores it" for name in seen]
