"""FlagScale's own heterogeneous auto-tuner beside HAPMoE in `bench` (issue 21 item 4).

FlagScale 0.8.0 ships a hetero auto-tuner (flagscale/runner/auto_tuner/hetero/): a grid over per-device-type
process meshes, layer splits, micro-batch and recompute, pruned by rules, whose candidates it would launch one
by one and time on the cluster.  It has no cost model.  tools/flagscale_autotune.py runs it standalone in
FlagScale's own environment (.ci/flagscale_env.sh; HAPMOE_FLAGSCALE_PYTHON) on the bench scenario's model and
the part of the cluster the runtime choice plans on, with the space narrowed to what the run fixes
(distributed optimizer and sequence parallelism on, micro-batch 1) and a time limit.  Here each candidate that
uses every GPU and that a plan can say (one TP, CP 1 and one EP for every mesh: the planner's schema) becomes
a flagscale Plan, is checked by the planner's rules and priced by the one cost model.  Reported: the tuner's
search time, its candidate counts, the first candidate (what it would launch first) and the fastest candidate
that fits under the cost model (what timing all of them could find, were the cost model the cluster);
FlagScale's validator then checks that plan's emitted config.  Without FlagScale's environment the column is
skipped and says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from planner.baselines.common import PricedPlan
from planner.cost.model import CostModel
from planner.launcher import render_launch_files
from planner.launcher.flagscale import train_config_text
from planner.megatron.rules import check_plan
from planner.output.run_dir import LAUNCHER_OUTPUT, write_files
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan, Recompute, StagePlan

ROOT = Path(__file__).resolve().parent.parent
AUTOTUNE_TOOL = ROOT / "tools" / "flagscale_autotune.py"
VALIDATE_TOOL = ROOT / "tools" / "flagscale_validate.py"
DEFAULT_ENV = Path.home() / ".cache" / "hapmoe" / "flagscale-venv"
TUNER = "flagscale-tuner"
TUNER_LABEL = "FlagScale auto-tuner"
# What the run fixes, so the tuner does not search it (FlagScale's defaults try both values of each).
NARROWED_SPACE = {"use_distributed_optimizer": [True], "sequence_parallel": [True], "micro_batch_size": [1]}


def flagscale_python() -> tuple[str | None, str]:
    """(python of FlagScale's environment, or None; why not)."""
    explicit = os.environ.get("HAPMOE_FLAGSCALE_PYTHON")
    if explicit:
        return (explicit, "") if Path(explicit).exists() else (None, f"HAPMOE_FLAGSCALE_PYTHON={explicit} does not exist")
    if (DEFAULT_ENV / ".hapmoe-ready").exists() and (DEFAULT_ENV / "bin" / "python").exists():
        return str(DEFAULT_ENV / "bin" / "python"), ""
    return None, ("FlagScale's environment is not built (bash .ci/flagscale_env.sh builds it: Python 3.12, "
                  "flag-scale 0.8.0; or set HAPMOE_FLAGSCALE_PYTHON)")


@dataclass
class TunerOutcome:
    """The auto-tuner on one scenario: its status, time, counts, first candidate and best priced one."""

    status: str  # ok | skipped | error | timeout
    why: str = ""
    search_time_s: float = float("nan")
    counts: dict = field(default_factory=dict)
    first: str = ""  # the first candidate, as the tuner writes it
    best: PricedPlan | None = None
    validated: str = ""  # FlagScale's validator on the best plan's emitted config: ok, or its refusal

    def notes(self) -> list[str]:
        c = self.counts
        if self.status != "ok":
            return [f"{TUNER_LABEL}: {self.status}: {self.why}"]
        out = [f"{TUNER_LABEL}: {self.why}"] if self.why else []
        out += [f"{TUNER_LABEL}: {c.get('strategies')} strategies, {c.get('candidates')} candidates, "
               f"{c.get('full')} on every GPU, {c.get('expressible')} with one TP/EP (a plan), {c.get('fits')} fit "
               f"under the cost model; search {self.search_time_s:.1f} s (imports excluded)",
               f"{TUNER_LABEL}: first candidate (what it launches first): {self.first}"]
        if self.validated:
            out.append(f"{TUNER_LABEL}: FlagScale's validator on the best plan's config: {self.validated}")
        return out


def candidate_plan(cand: dict, run: MegatronRun) -> Plan | str:
    """A tuner candidate as a flagscale Plan, or why a plan cannot say it."""
    meshes = cand.get("hetero_process_meshes") or []
    if not meshes or len({m[0] for m in meshes}) > 1 or len({m[2] for m in meshes}) > 1 or any(m[1] != 1 for m in meshes):
        return "per-mesh TP/EP differ or CP > 1"
    if cand.get("num_layers_per_virtual_pipeline_stage"):
        return "interleaving"
    rc = Recompute.none()
    if cand.get("use_recompute"):
        if cand.get("recompute_granularity") == "full":
            rc = Recompute.full(cand.get("recompute_method") or "uniform", int(cand.get("recompute_num_layers") or 1))
        else:
            rc = Recompute.selective(("core_attn",))
    types = cand["hetero_device_types"]
    dps = [m[3] for m in meshes for _ in range(m[4])]
    stage_types = [t for m, t in zip(meshes, types) for _ in range(m[4])]
    split = cand["hetero_pipeline_layer_split"]
    if len(split) != len(dps):
        return "layer split and meshes disagree"
    return Plan(runtime="flagscale", tp=meshes[0][0], cp=1, ep=meshes[0][2], etp=1, vpp=1,
                mbs=int(cand.get("micro_batch_size") or 1), gbs=run.training.global_batch_size,
                sequence_parallel=bool(cand.get("sequence_parallel")) and meshes[0][0] > 1,
                stages=tuple(StagePlan(device_type=t, num_layers=n, dp=d, recompute=rc)
                             for t, n, d in zip(stage_types, split, dps)))


def _tool(python: str, tool: Path, args: list[str], timeout_s: float) -> dict:
    proc = subprocess.run([python, str(tool), *args], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    return json.loads(proc.stdout)


def _price(cands: list[dict], run: MegatronRun, cluster: ClusterSpec, profiles, counts: dict) -> PricedPlan | None:
    cost = CostModel(run.model, run.training, cluster, profiles)
    best: PricedPlan | None = None
    seen: set[str] = set()
    for cand in cands:
        plan = candidate_plan(cand, run)
        if isinstance(plan, str) or check_plan(run.model, plan, run.training):
            continue
        key = plan.model_dump_json()
        if key in seen:
            continue
        seen.add(key)
        counts["expressible"] = counts.get("expressible", 0) + 1
        try:
            pc = cost.evaluate(plan)
        except (ValueError, KeyError):
            continue
        if pc.fits:
            counts["fits"] = counts.get("fits", 0) + 1
            if best is None or pc.iteration_time_s < best.cost.iteration_time_s:
                best = PricedPlan(plan=plan, cost=pc)
    return best


def _validate(python: str, run: MegatronRun, plan: Plan, cluster: ClusterSpec, profiles, timeout_s: float) -> str:
    """FlagScale's validator on the emitted config of `plan`: "ok" or its refusal."""
    with tempfile.TemporaryDirectory(prefix="hapmoe-tuner-") as tmp:
        out = Path(tmp) / "launch"
        write_files(out, render_launch_files(run, plan, cluster, profiles=profiles), "--out", LAUNCHER_OUTPUT)
        res = _tool(python, VALIDATE_TOOL, [str(out)], timeout_s)[0]
    return "ok" if res["ok"] else f"refused at {res['stage']}: {res['error']}"


def run_flagscale_tuner(run: MegatronRun, cluster: ClusterSpec, profiles, *, time_limit_s: float = 60.0,
                        validate: bool = True) -> TunerOutcome:
    """FlagScale's auto-tuner on `cluster` (the part of the bench cluster the runtime choice plans on)."""
    python, why = flagscale_python()
    if python is None or not AUTOTUNE_TOOL.exists():
        return TunerOutcome("skipped", why or f"{AUTOTUNE_TOOL} is not here (a source checkout has it)")
    spec = ",".join(f"{t}:{n}" for t, n in cluster.gpus_by_type().items())
    nproc = min(g.gpus_per_node for g in cluster.groups)
    with tempfile.TemporaryDirectory(prefix="hapmoe-tuner-") as tmp:
        train = Path(tmp) / "train.yaml"
        train.write_text(train_config_text(run))
        args = ["--train", str(train), "--cluster", spec, "--nproc-per-node", str(nproc), "--skip-history-rules",
                "--full-only", "--limit", "0", "--time-limit", f"{time_limit_s:g}", "--space", json.dumps(NARROWED_SPACE)]
        t0 = time.perf_counter()
        try:
            res = _tool(python, AUTOTUNE_TOOL, args, time_limit_s + 120)
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
            return TunerOutcome("error", f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)
    if not res.get("ok") and not (res.get("timed_out") and res.get("candidates")):
        status = "timeout" if res.get("timed_out") else "error"
        return TunerOutcome(status, res.get("error") or "no result", time_limit_s if res.get("timed_out") else
                            res.get("seconds", {}).get("search", float("nan")))
    counts = dict(res["counts"])
    counts["full"] = len(res["candidates"])
    first = res["candidates"][0] if res["candidates"] else None
    stopped = bool(res.get("timed_out"))
    out = TunerOutcome("ok", search_time_s=time_limit_s if stopped else res["seconds"]["search"], counts=counts,
                       why=f"stopped at the {time_limit_s:g} s time limit with the candidates found so far" if stopped
                       else "",
                       first=(f"meshes {first['hetero_process_meshes']} types {first['hetero_device_types']} split "
                              f"{first['hetero_pipeline_layer_split']} recompute {first.get('use_recompute')}")
                       if first else "none")
    out.best = _price(res["candidates"], run, cluster, profiles, counts)
    if out.best is not None and validate:
        try:
            out.validated = _validate(python, run, out.best.plan, cluster, profiles, 600)
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError, ValueError) as exc:
            out.validated = f"not checked ({type(exc).__name__}: {exc})"
    return out
