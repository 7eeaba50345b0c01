"""Issue 19's "done when" solve check: `solve` on the model, cluster and batch of published runs.

    python -m tools.bench_published [--ids ID,ID] [--time-limit S] [--no-validate] [--json]

For each published run of the calibration set named in CASES (the measured runs of
planner/calibration/published/measured_runs.csv, with their sources), this reads the run's own Megatron flags
and cluster through the planner's one input path, prices the published plan (the plan those flags run, as
`solve --megatron-args` does for "your plan"), runs `solve` on the same model, cluster and batch, and prints:

* published: the published plan's predicted iteration time and its measured one;
* picked: the plan `solve` picks (by default the best pessimistic time, `--objective nominal` for the nominal),
  its predicted time and its range;
* ratio: published predicted / picked predicted (nominal), how much faster the planner says its pick is
  (the issue's bar: <= 1.25); pess.: the same at the top of both ranges;
* memory: peak memory as a percentage of the device's memory (published and picked), and whether the pick stays
  within the memory headroom (capacity x (1 - headroom));
* keep yours: whether `solve` tells the user to keep the published plan (its predicted time lies within the
  pick's range), and why;
* evidence and trials: whether the pick is extrapolated (mechanisms or a schedule no calibration run measured,
  named) and the trials `solve` proposes; the issue's bar is a claim within 1.25x, or an extrapolated pick whose
  trials include the published plan;
* validator: Megatron's own validator (tools/megatron_validate.py, in the environment `.ci/megatron_env.sh`
  builds, or $HAPMOE_MEGATRON_PYTHON) on the flags the planner's launcher writes for the pick.  Flags only a
  fork knows are removed first; `--moe-permute-fusion` and `--delay-wgrad-compute` (they need Transformer Engine,
  absent on the CPU validator) are removed and `--cross-entropy-fusion-impl te` (refused by megatron-core 0.19) is
  checked as `native`, as the calibration README does for the published rows themselves.

A benchmark, not a test: it prints figures (the medians and the worst ratio at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from planner.api import OBJECTIVES, load_inputs, make_space, price_input_plan
from planner.api_search import solve
from planner.calibration.runs import load_annotations, load_runs, priced_argv
from planner.inputs.megatron_flags import known_flags
from planner.launcher import render_launch_files
from planner.output.report import degrees_short, plan_json
from planner.profile_tables import ProfileSet
from planner.search.settings import SearchSettings
from planner.trials import propose_trials
from tools.megatron_validate import megatron_python

ROOT = Path(__file__).resolve().parents[1]
VALIDATE = ROOT / "tools" / "megatron_validate.py"
RATIO_TARGET = 1.25

CASES = (
    "H100-qwen3-235B-ep32",  # Qwen3-235B, EP32 DeepEP, 256 H100 (Model Zoo)
    "H100-dsv3-671B-1024-bf16-tp2pp16",  # DeepSeek-V3, TP2 PP16 EP64, 1024 H100
    "H100-mixtral-8x22B-128-bf16-dropless",  # Mixtral-8x22B, 128 H100
    "H100-grok1-314B-512-bf16",  # Grok-1, 512 H100
    "H100-mixtral-8x7B",  # Mixtral-8x7B, 64 H100
    "B200-gptoss-120B-64-bf16",  # gpt-oss-120B, 64 B200
)


NEEDS_TE = ("--moe-permute-fusion", "--delay-wgrad-compute")
"""Flags Megatron refuses without Transformer Engine, which the CPU validator lacks (the calibration README removes
them from the published rows' check the same way)."""


def upstream_argv(argv: list[str]) -> list[str]:
    """The flags upstream Megatron's CPU validator can judge (see the module docstring)."""
    table = known_flags()
    out, skip = [], False
    for tok in argv:
        name = tok.partition("=")[0]
        if tok.startswith("--"):
            skip = name in NEEDS_TE or (name in table and table[name].source != "megatron")
            if skip:
                continue
        elif skip:
            continue
        out.append(tok)
    return ["native" if (a == "te" and i and out[i - 1] == "--cross-entropy-fusion-impl") else a
            for i, a in enumerate(out)]


def validate(cases: list[dict]) -> dict[str, dict]:
    python = megatron_python()
    if python is None or not cases:
        return {}
    proc = subprocess.run([python, str(VALIDATE)], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=1800, cwd=ROOT)
    if proc.returncode != 0:
        return {c["name"]: {"ok": None, "error": proc.stderr[-300:]} for c in cases}
    return {r["name"]: r for r in json.loads(proc.stdout)}


def run_case(row: dict, profiles: ProfileSet, time_limit_s: float, objective: str) -> dict:
    # the published run's flags as the calibration prices them (annotations.csv: what its software did that its
    # listed flags leave out, such as the dropout its recipe turned off)
    megatron_args = shlex.join(priced_argv(row, load_annotations()))
    inputs = load_inputs(cluster=row["cluster"], megatron_args=megatron_args, profiles=profiles, allow_invalid=True)
    settings = SearchSettings(backend="cpsat", time_limit_s=time_limit_s,
                              deadline=time.perf_counter() + time_limit_s)
    started = time.perf_counter()
    outcome = solve(inputs.run, inputs.cluster, inputs.profiles, settings=settings,
                    space=make_space(inputs.run, "megatron"), objective=objective)
    wall = time.perf_counter() - started
    user = price_input_plan(inputs, None, megatron_args, outcome)
    pick, cost, rng = outcome.plans[0], outcome.costs[0], outcome.ranges[0]
    files = render_launch_files(inputs.run, pick, inputs.cluster)
    trials, _ = propose_trials(outcome, user)
    evidence = rng.evidence.to_json() if rng.evidence else {"extrapolated": False, "unmeasured": []}
    pub = user.cost if user and user.cost else None
    h = outcome.memory_headroom
    return {
        "id": row["id"], "cluster": row["cluster"], "search_s": wall, "status": outcome.result.status,
        "objective": objective, "memory_headroom": h,
        "measured_s": float(row["value"]) if row["metric"] == "iteration_time_s" else None,
        "published_plan": degrees_short(plan_json(user.plan)) if user and user.plan else None,
        "published_predicted_s": pub.iteration_time_s if pub else None,
        "published_range_s": [user.time_range.low_s, user.time_range.high_s] if user and user.time_range else None,
        "published_memory_pct": 100 * max(s.memory_bytes / s.device_memory_bytes for s in pub.stages) if pub else None,
        "published_runs": bool(user and user.runs),
        "picked_plan": degrees_short(plan_json(pick)), "picked_predicted_s": cost.iteration_time_s,
        "picked_range_s": [rng.low_s, rng.high_s],
        "picked_memory_pct": 100 * max(s.memory_bytes / s.device_memory_bytes for s in cost.stages),
        "within_headroom": all(s.memory_bytes <= s.device_memory_bytes * (1 - h) for s in cost.stages),
        "ratio": (pub.iteration_time_s / cost.iteration_time_s) if pub else None,
        "pessimistic_ratio": (user.time_range.high_s / rng.high_s) if user and user.time_range else None,
        "keep_yours": bool(user and user.keep_yours), "keep_yours_why": user.keep_why if user else "",
        "extrapolated": evidence["extrapolated"], "unmeasured": evidence["unmeasured"],
        "trials": [t.name for t in trials], "trials_include_published": any(t.role == "yours" for t in trials),
        "argv": upstream_argv(shlex.split(files["megatron_args.txt"])), "world_size": pick.world_size,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ids", default=",".join(CASES), help="comma-separated calibration row ids")
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per solve")
    ap.add_argument("--no-validate", action="store_true", help="skip Megatron's validator")
    ap.add_argument("--objective", choices=OBJECTIVES, default="pessimistic", help="what solve minimises")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = {r["id"]: r for r in load_runs()}
    profiles = ProfileSet.load()
    results = []
    for rid in args.ids.split(","):
        if rid not in rows:
            print(f"--ids: no calibration row {rid!r}", file=sys.stderr)
            return 2
        results.append(run_case(rows[rid], profiles, args.time_limit, args.objective))
        print(f"  {rid}: solved in {results[-1]['search_s']:.1f} s", file=sys.stderr)
    verdicts = {} if args.no_validate else validate(
        [{"name": r["id"], "argv": r["argv"], "world_size": r["world_size"],
          "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}} for r in results])
    for r in results:
        v = verdicts.get(r["id"])
        r["validator"] = None if v is None else ("ok" if v["ok"] else "refused: " + (v["error"] or "")[:160])
        del r["argv"]
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print_table(results)
    return 0


def print_table(results: list[dict]) -> None:
    print(f"{'run':38} {'meas s':>7} {'pub s':>7} {'pick s':>7} {'ratio':>6} {'pess.':>6} {'pub mem%':>8} "
          f"{'pick mem%':>9} {'headroom':>8} {'keep':>5}  validator")
    for r in results:
        def f(key, fmt):
            return format(r[key], fmt) if r.get(key) is not None else "-"
        head = f"{'ok' if r['within_headroom'] else 'OVER'} {100 * r['memory_headroom']:.0f}%"
        print(f"{r['id']:38} {f('measured_s', '7.2f')} {f('published_predicted_s', '7.2f')} "
              f"{f('picked_predicted_s', '7.2f')} {f('ratio', '6.3f')} {f('pessimistic_ratio', '6.3f')} "
              f"{f('published_memory_pct', '8.1f')} {f('picked_memory_pct', '9.1f')} {head:>8} "
              f"{'yes' if r['keep_yours'] else 'no':>5}  {r['validator'] or 'not run'}")
        pr, kr = r.get("published_range_s"), r["picked_range_s"]
        print(f"{'':38} published {r['published_plan']}" + (f"  range {pr[0]:.2f}-{pr[1]:.2f} s" if pr else ""))
        print(f"{'':38} picked    {r['picked_plan']}  range {kr[0]:.2f}-{kr[1]:.2f} s")
        print(f"{'':38} {'keep yours' if r['keep_yours'] else 'switch'}: {r['keep_yours_why']}")
        if r["extrapolated"]:
            print(f"{'':38} pick extrapolated: " + "; ".join(r["unmeasured"]))
        print(f"{'':38} trials: {', '.join(r['trials']) or 'none'}")
    ratios = [r["ratio"] for r in results if r.get("ratio")]
    if ratios:
        print(f"ratio published/picked (nominal): median {statistics.median(ratios):.3f}, worst {max(ratios):.3f} "
              f"(target <= {RATIO_TARGET}); {sum(x <= RATIO_TARGET for x in ratios)} of {len(ratios)} within; "
              f"picks within the headroom: {sum(r['within_headroom'] for r in results)} of {len(results)}; "
              f"validator ok: {sum(r['validator'] == 'ok' for r in results)} of {len(results)}; keep yours: "
              f"{sum(r['keep_yours'] for r in results)} of {len(results)}")
        held = [r for r in results if r.get("ratio")]
        ok = sum(r["ratio"] <= RATIO_TARGET or (r["extrapolated"] and r["trials_include_published"]) for r in held)
        print(f"claims within {RATIO_TARGET}x, or the pick marked extrapolated with a trial of the published plan: "
              f"{ok} of {len(held)}")


if __name__ == "__main__":
    sys.exit(main())
