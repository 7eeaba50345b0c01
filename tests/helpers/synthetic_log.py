"""Megatron-format training logs written from the cost model's own timeline: what a trial would print if the
cluster ran exactly as a given cost model says (the end-to-end test of `solve` -> trials -> `calibrate --trials`
-> `solve --profiles`).

The iteration time is the pipeline schedule simulated from the model's per-stage forward and backward times
(planner/simulate.py, 1F1B or interleaved, the stages' pipeline sends included) plus the slowest stage's
per-iteration sync; the first iterations are slower (warm-up), the rest vary by a seeded +-`noise`.  The lines
follow Megatron-LM's `training_log` and `report_memory` formats (../shared/reference/megatron.md section 4).
"""

from __future__ import annotations

import random

from planner.cost.model import PlanCost
from planner.simulate import simulate_pipeline

WARMUP = (3.0, 1.5, 1.2)
"""The first iterations' time over a steady one (start-up, allocator, NCCL set-up)."""


def simulated_iteration_s(cost: PlanCost, vpp: int) -> float:
    """One iteration on the simulated pipeline schedule plus the slowest stage's sync."""
    stages = cost.stages
    sim = simulate_pipeline([s.forward_s for s in stages], [s.backward_s for s in stages], cost.num_microbatches,
                            schedule="interleaved" if vpp > 1 else "1f1b", vpp=vpp)
    return sim.iteration_time_s + max(s.sync_s for s in stages)


def megatron_log(cost: PlanCost, *, vpp: int, global_batch_size: int, iterations: int, seed: int = 0,
                 noise: float = 0.005) -> str:
    """The log of `iterations` iterations of a run the cost `cost` describes."""
    rng = random.Random(seed)
    steady_s = simulated_iteration_s(cost, vpp)
    flop_per_gpu = cost.model_flop_per_iteration / cost.world_size
    peak = max(cost.stages, key=lambda s: s.memory_bytes)
    mb = peak.memory_bytes / 2 ** 20
    lines = ["using world size: %d" % cost.world_size, "training ..."]
    for it in range(1, iterations + 1):
        warm = WARMUP[it - 1] if it <= len(WARMUP) else 1.0
        t = steady_s * warm * (1.0 + rng.uniform(-noise, noise))
        lines.append(
            f" [2026-01-01 00:{it // 60:02d}:{it % 60:02d}] iteration {it:8d}/{iterations:8d} | consumed samples: "
            f"{it * global_batch_size:12d} | elapsed time per iteration (ms): {t * 1e3:.1f} | throughput per GPU "
            f"(TFLOP/s/GPU): {flop_per_gpu / t / 1e12:.1f} | learning rate: 1.000000E-04 | global batch size: "
            f"{global_batch_size:5d} | lm loss: 1.000000E+01 | loss scale: 1.0 | grad norm: 1.000 | number of "
            f"skipped iterations:   0 | number of nan iterations:   0 |")
        if it == 1:
            lines.append(f"[Rank 0] (after 1 iterations) memory (MB) | allocated: {0.6 * mb:.1f} | max allocated: "
                         f"{mb:.1f} | reserved: {1.05 * mb:.1f} | max reserved: {1.05 * mb:.1f}")
    return "\n".join(lines) + "\n"
