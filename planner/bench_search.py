"""Search-time benchmark (issue 3's speed table): `python -m planner.bench_search [--repeats R] [--quick]`.

Prints one row per scenario with the median wall time over R runs, the plan's predicted
iteration time and the search status.  Targets (2-core machine): mixtral-l on
H800:16,MI300X:16,910B:16 with HS-DP under 2 s (megatron runtime) and under 10 s (flagscale), a
certified CP-SAT optimum under 30 s; 1024 GPUs of three types under 30 s; 4096 under 60 s.
"""

from __future__ import annotations

import argparse
import statistics
import time

SCENARIOS = [
    # (label, model, cluster, backend, runtime, prune, time limit s); global batch 16 per GPU unless
    # the label says "preset" (the model preset's own global batch)
    ("48 GPUs megatron hsdp", "mixtral-l", "H800:16,MI300X:16,910B:16", "hsdp", "megatron", True, 60),
    ("48 GPUs megatron hsdp, preset batch", "mixtral-l", "H800:16,MI300X:16,910B:16", "hsdp", "megatron", True, 60),
    ("48 GPUs flagscale hsdp", "mixtral-l", "H800:16,MI300X:16,910B:16", "hsdp", "flagscale", True, 120),
    ("48 GPUs megatron cpsat certified", "mixtral-l", "H800:16,MI300X:16,910B:16", "cpsat", "megatron", False, 120),
    ("48 GPUs flagscale hsdp certified", "mixtral-l", "H800:16,MI300X:16,910B:16", "hsdp", "flagscale", False, 120),
    ("1024 GPUs megatron hsdp", "mixtral-l", "H800:344,MI300X:344,910B:336", "hsdp", "megatron", True, 120),
    ("4096 GPUs megatron hsdp", "mixtral-l", "H800:1368,MI300X:1368,910B:1360", "hsdp", "megatron", True, 180),
]


def run_one(model: str, cluster: str, backend: str, runtime: str, prune: bool, limit: float,
            preset_batch: bool = False) -> dict:
    from planner.api import make_space, solve
    from planner.inputs.cluster import parse_cluster
    from planner.inputs.resolve import resolve_run
    from planner.profile_tables import ProfileSet
    from planner.search.driver import SearchSettings

    profiles = ProfileSet.load()
    cl = parse_cluster(cluster, profiles)
    overrides = {} if preset_batch else {"gbs": 16 * cl.world_size}
    run = resolve_run(model=model, world_size=cl.world_size, overrides=overrides)
    settings = SearchSettings(backend=backend, delta=0.2 if prune else None, memory_prune=prune, time_limit_s=limit)
    t0 = time.perf_counter()
    out = solve(run, cl, profiles, settings=settings, space=make_space(run, runtime))
    wall = time.perf_counter() - t0
    r = out.result
    return {"wall_s": wall, "iteration_time_s": out.costs[0].iteration_time_s, "status": r.status,
            "certified": r.certified_optimal, "solved": r.configs_solved, "total": r.configs_total,
            "notes": "; ".join(r.notes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="only the 48-GPU megatron rows")
    args = ap.parse_args()
    rows = SCENARIOS[:2] if args.quick else SCENARIOS
    print(f"{'scenario':40s} {'median s':>9s} {'runs':>4s} {'iter s':>9s} {'status':9s} {'solved/total':>13s}")
    for label, model, cluster, backend, runtime, prune, limit in rows:
        reps = args.repeats if "4096" not in label and "1024" not in label else 1
        results = [run_one(model, cluster, backend, runtime, prune, limit, preset_batch="preset" in label)
                   for _ in range(reps)]
        med = statistics.median(r["wall_s"] for r in results)
        r = results[-1]
        status = r["status"] + ("*" if r["certified"] else "")
        print(f"{label:40s} {med:9.2f} {reps:4d} {r['iteration_time_s']:9.3f} {status:9s} "
              f"{r['solved']:6d}/{r['total']:<6d} {r['notes']}", flush=True)
    print("* certified optimal under the cost model (every configuration solved exactly or bounded out)")


if __name__ == "__main__":
    main()
