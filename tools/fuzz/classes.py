"""The fuzz classes of issue 23: what a new user does that the first classes (tools/fuzz/cases.py) did
not try.  Each generator returns the parts of a case (see cases.py) plus a dict of extras: `owned`
(files a genuine earlier output holds, which the planner may replace), `signal` (run as a process
and signalled), `timeout_s`.

- user-files: output directories that hold the user's files (and the input script), with and without
  --force, beside or instead of a genuine earlier output (a manifest with the right hashes), with an
  edited earlier file; every one of the user's files must come out byte for byte the same;
- edited-plan: plan.json edited after solve (the model, the cluster, a stage's device type or recompute_label,
  the made_for record), a bare plan that cannot fit (a preset's weights alone exceed the GPU), a plan emitted with
  another model's script or another cluster;
- signal: solve/estimate/emit/calibrate writing an output, sent SIGTERM, SIGINT or SIGHUP at a random
  moment: exit 128+N, no staging directory left, the output either as it was or complete;
- script-loop: launcher scripts that loop (long, nested, with long arithmetic, endless) under solve
  --time-limit: bounded by the limit or by the script reader's step budget;
- extremes: cluster and device figures at and beyond their physical ranges, one node shape per type,
  links given twice or to a missing type, `links: false`, --moe-imbalance at and beyond num_experts/topk;
- poisoned-log: calibrate on logs far faster or slower than the run, or holding two runs, and estimate
  with a corrections file fitted to another run.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from tools.fuzz.inputs import (
    SCRIPT, TINY_CLUSTER, TINY_FILE, TINY_MODEL, base_plan_document, h800_profile_document, log_text,
)
from tools.fuzz.mutations import to_json, to_yaml
from planner.output.manifest import MANIFEST_NAME, manifest_text
from planner.output.run_dir import CALIBRATE_OUTPUT, LAUNCHER_OUTPUT, PLAN_OUTPUT, PLOTS_OUTPUT, OutputKind
from planner.profile_tables import TIME_FACTOR_RANGE
from planner.schemas.types import PHYSICAL_RANGES

TINY_ARGS = ("--model", "{d}/" + TINY_FILE)
_CACHE: dict[str, float] = {}


def tiny_predicted_ms() -> float:
    """The tiny model's predicted iteration on H800:8 at EP 8 (the cost model of this checkout); the
    poisoned logs are built around it."""
    if "ms" not in _CACHE:
        import os
        import tempfile

        from planner.api import estimate, load_inputs

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, TINY_FILE)
            with open(path, "wb") as fh:
                fh.write(to_yaml(TINY_MODEL))
            _CACHE["ms"] = estimate(load_inputs(model=path, cluster="H800:8", overrides={"ep": 8})).cost \
                .iteration_time_s * 1e3
    return _CACHE["ms"]


def _tiny(files: dict[str, bytes]) -> dict[str, bytes]:
    return {TINY_FILE: to_yaml(TINY_MODEL), **files}


# --------------------------------------------------------------------------------------------
# user-files
# --------------------------------------------------------------------------------------------

# per command: (kind, files it certainly writes, files a user might have there that it would not write)
_WRITES: dict[str, tuple[OutputKind, tuple[str, ...]]] = {
    "solve --out": (PLAN_OUTPUT, ("plan.json", "inputs.json", "summary.md", "launch/launch.sh", "launch/hostfile",
                                  "plots/placement.json", "plots/memory.json")),
    "solve --plot": (PLOTS_OUTPUT, ("summary.md", "placement.json", "memory.json", "timeline.json")),
    "estimate --plot": (PLOTS_OUTPUT, ("summary.md", "placement.json", "memory.json", "timeline.json")),
    "emit --out": (LAUNCHER_OUTPUT, ("launch.sh", "megatron_args.txt", "hostfile")),
    "calibrate --out": (CALIBRATE_OUTPUT, ("corrections.yaml", "calibration_report.json")),
}
_OTHERS = ("notes.txt", "data/shard-0.bin", "plots/mine.png", "README", "launch/common.sh", "a/b/c.txt")


def _argv_for(command: str, out: str, force: bool) -> tuple[str, ...]:
    extra = ("--force",) if force and not command.endswith("--plot") else ()
    if command == "solve --out":
        return ("solve", *TINY_ARGS, "--cluster", "H800:8", "--time-limit", "3", "--quiet", "--out", out, *extra)
    if command == "solve --plot":
        return ("solve", *TINY_ARGS, "--cluster", "H800:8", "--time-limit", "3", "--quiet", "--plot", out)
    if command == "estimate --plot":
        return ("estimate", *TINY_ARGS, "--cluster", "H800:8", "--ep", "8", "--plot", out)
    if command == "emit --out":
        return ("emit", "--plan", "{d}/plan.json", "--out", out, *extra)
    return ("calibrate", "--megatron-log", "{d}/run.log", *TINY_ARGS, "--cluster", "H800:8", "--ep", "8", "--out",
            out, *extra)


def _command_files(command: str) -> dict[str, bytes]:
    if command == "emit --out":
        return {"plan.json": to_json(base_plan_document())}
    if command == "calibrate --out":
        return {"run.log": log_text([f"{tiny_predicted_ms() * 1.3:.6f}"] * 8)}
    return {}


def earlier_output(kind: OutputKind, base: str, paths: tuple[str, ...]) -> dict[str, bytes]:
    """A genuine earlier output of `kind` under `base`: the files and a manifest with their hashes."""
    files = {p: f"earlier output: {p}\n".encode() for p in paths}
    entries = [{"path": p, "bytes": len(b), "sha256": hashlib.sha256(b).hexdigest(), "writer": kind.writer}
               for p, b in files.items()]
    out = {f"{base}/{p}": b for p, b in files.items()}
    out[f"{base}/{MANIFEST_NAME}"] = manifest_text(entries, kind.family).encode()
    return out


def gen_user_files(rng: random.Random) -> tuple:
    """An output directory with the user's files (and sometimes a genuine earlier output), or the
    command's input inside it."""
    if rng.random() < 0.25:
        return gen_input_in_out(rng)
    command = rng.choice(sorted(_WRITES))
    kind, certain = _WRITES[command]
    default_plot = command == "estimate --plot" and rng.random() < 0.3
    base = "plots" if default_plot else "out"
    force = rng.random() < 0.5
    files = _tiny(_command_files(command))
    owned: list[str] = []
    genuine = rng.random() < 0.4
    if genuine:
        earlier = earlier_output(kind, base, certain)
        files.update(earlier)
        owned = [p for p in earlier if not p.endswith(MANIFEST_NAME)] + [f"{base}/{MANIFEST_NAME}"]
    collide = rng.sample(certain, rng.randrange(0, 3)) if not genuine or rng.random() < 0.5 else []
    others = rng.sample(_OTHERS, rng.randrange(0 if collide or genuine else 1, 3))
    for p in collide + others:
        files[f"{base}/{p}"] = b"the user's own file\n"
        if f"{base}/{p}" in owned:
            owned.remove(f"{base}/{p}")  # edited since the planner wrote it: the user's now
    garbage = rng.random() < 0.1 and not genuine
    if garbage:  # a file of the manifest's name the planner cannot read: the user's, so never overwritten
        files[f"{base}/{MANIFEST_NAME}"] = rng.choice((b"{}", b"not json", b'{"format": "other"}'))
    users = collide + others
    flag = "--plot" if command.endswith("--plot") else "--out"
    if collide or garbage:
        valid: bool | None = False  # a file the planner did not write (or edited) would be overwritten
    elif genuine:
        valid = None  # an earlier output, the user's files beside it
    else:
        valid = None if (force and flag == "--out") else (False if users else None)
    argv = _argv_for(command, base if default_plot else "{d}/" + base, force)
    what = (f"{command} into {'plots (the default)' if default_plot else base} with "
            f"{', '.join(users) or 'nothing of the user'}{' beside an earlier output' if genuine else ''}"
            f"{' --force' if force and flag == '--out' else ''}")
    if default_plot:
        argv = argv[:-1]  # `--plot` without a directory
    return "user-files:" + what, argv, files, valid, (flag,), base, {"owned": owned, "timeout_s": 60.0}


def gen_input_in_out(rng: random.Random) -> tuple:
    """The input script (or plan, model) lives in the output directory: never a write target."""
    form = rng.choice(("emit script", "emit saved script", "solve script", "emit plan"))
    script = SCRIPT.format(extra="", layers="4").encode()
    force = rng.random() < 0.5
    extra = ("--force",) if force else ()
    if form == "emit script":
        files = {"scripts/launch.sh": script, "plan.json": to_json(base_plan_document())}
        argv = ("emit", "--plan", "{d}/plan.json", "--out", "{d}/scripts", "--megatron-script",
                rng.choice(("{d}/scripts/launch.sh", "scripts/launch.sh", "scripts/../scripts/launch.sh")), *extra)
    elif form == "emit saved script":
        doc = base_plan_document()
        doc["inputs"]["script"] = {"path": "scripts/launch.sh", "args": [], "extra_flags": [], "text": script.decode()}
        files = {"scripts/launch.sh": script, "plan.json": to_json(doc)}
        argv = ("emit", "--plan", "{d}/plan.json", "--out", "scripts", *extra)
    elif form == "solve script":
        files = {"plan/launch/launch.sh": script}
        argv = ("solve", "--megatron-script", "{d}/plan/launch/launch.sh", "--cluster", "H800:8", "--time-limit", "3",
                "--quiet", "--out", "{d}/plan", *extra)
    else:
        files = {"launch/plan.json": to_json(base_plan_document()), "launch/launch.sh": script}
        argv = ("emit", "--plan", "{d}/launch/plan.json", "--out", "{d}/launch", *extra)
    return "user-files:input in the output directory: " + form + (" --force" if force else ""), argv, files, False, \
        ("--out",), None, {"timeout_s": 60.0}


# --------------------------------------------------------------------------------------------
# edited-plan
# --------------------------------------------------------------------------------------------

# presets whose weights alone (2 bytes a parameter, no sharding) exceed an 80 GB GPU
_TOO_BIG = (("deepseek-v3", 61), ("mixtral-l", 56), ("qwen3-235b-a22b", 94), ("llama2-70b", 80))


def gen_edited_plan(rng: random.Random) -> tuple:
    """plan.json edited after solve, a plan that cannot fit, a plan for another model or cluster."""
    doc = base_plan_document()
    form = rng.choice(("model field", "cluster field", "stage type", "made_for", "no made_for", "bare too big",
                       "another script", "same script", "another cluster", "same", "layers", "recompute",
                       "recompute label"))
    argv: tuple[str, ...] = ("emit", "--plan", "{d}/plan.json", "--out", "{d}/launch")
    files: dict[str, bytes] = {}
    names: tuple[str, ...] = ("--plan",)
    valid: bool | None = False
    if form == "model field":
        key, value = rng.choice((("num_experts", 16), ("hidden_size", 512), ("num_layers", 8), ("vocab_size", 2048),
                                 ("moe_router_topk", 1), ("ffn_hidden_size", 1024)))
        doc["inputs"]["run"]["model"][key] = value
        what = f"inputs.run.model.{key} = {value}"
    elif form == "cluster field":
        doc["inputs"]["cluster"]["groups"][0]["intra_node_bandwidth_gb_per_s"] = 100.0
        what = "inputs.cluster.groups[0].intra_node_bandwidth_gb_per_s = 100"
    elif form == "stage type":
        doc["plan"]["stages"][0]["device_type"] = "MI300X"
        what = "plan.stages[0].device_type = MI300X (not in the cluster)"
    elif form == "made_for":
        doc["made_for"]["run_sha256"] = "0" * 64
        what = "made_for.run_sha256 changed"
    elif form == "no made_for":
        del doc["made_for"]
        valid, what = None, "no made_for record (an older plan.json)"
    elif form == "bare too big":
        model, layers = rng.choice(_TOO_BIG)
        plan = {"runtime": "megatron", "tp": 1, "cp": 1, "ep": 1, "etp": 1, "vpp": 1, "mbs": 1, "gbs": 1024,
                "stages": [{"device_type": "H800", "num_layers": layers, "dp": 8, "recompute": {"granularity": "none"}}]}
        doc = plan
        argv += ("--model", model, "--cluster", "H800:8")
        what = f"a bare plan of {model} on H800:8 without sharding (its weights alone exceed 80 GB)"
    elif form in ("another script", "same script"):
        hidden = "512" if form == "another script" else "256"
        files["train.sh"] = SCRIPT.format(extra="", layers="4").replace("--hidden-size 256", f"--hidden-size {hidden}") \
            .encode()
        argv += ("--megatron-script", "{d}/train.sh")
        valid = False if form == "another script" else None
        names = ("--megatron-script",) if valid is False else names
        what = f"emitted with a script of hidden size {hidden}"
    elif form == "another cluster":
        argv += ("--cluster", rng.choice(("H800:16", "MI300X:8", "H800:8,MI300X:8")))
        names, what = ("--cluster",), "emitted for another cluster"
    elif form == "layers":
        doc["plan"]["stages"][0]["num_layers"] = rng.choice((3, 5))
        what = f"plan.stages[0].num_layers = {doc['plan']['stages'][0]['num_layers']} (the model has 4)"
    elif form == "recompute":
        doc["plan"]["stages"][0]["recompute"] = {"granularity": "full", "method": "uniform", "num_layers": 1}
        doc["plan"]["stages"][0]["recompute_label"] = "full:uniform:1"
        valid, what = None, "recompute full (a hand-tuned plan the checker decides on)"
    elif form == "recompute label":
        doc["plan"]["stages"][0]["recompute_label"] = "full:uniform:1"  # recompute left at none
        what = "plan.stages[0].recompute_label = full:uniform:1 (its recompute is none)"
    else:
        valid, what = None, "the untouched plan"
    files["plan.json"] = to_json(doc)
    return "edited-plan:" + what, argv, files, valid, names, "launch"


# --------------------------------------------------------------------------------------------
# signal
# --------------------------------------------------------------------------------------------


def gen_signal(rng: random.Random) -> tuple:
    """A command writing an output, signalled at a random moment (run as a process)."""
    command = rng.choice(("solve --out", "solve --out", "estimate --plot", "emit --out", "calibrate --out"))
    kind, certain = _WRITES[command]
    files = _tiny(_command_files(command))
    owned: list[str] = []
    if rng.random() < 0.5:  # replacing an earlier output, with the user's notes beside it
        earlier = earlier_output(kind, "out", certain)
        files.update(earlier)
        owned = list(earlier)
        files["out/notes.txt"] = b"the user's notes\n"
    argv = _argv_for(command, "{d}/out", False)
    name = rng.choice(("SIGTERM", "SIGTERM", "SIGINT", "SIGHUP"))
    delay = round(rng.uniform(0.2, 6.0), 2)
    what = f"{command} sent {name} after {delay} s{' (over an earlier output)' if owned else ''}"
    return "signal:" + what, argv, files, None, (), "out", {"owned": owned, "signal": (name, delay), "timeout_s": 90.0}


# --------------------------------------------------------------------------------------------
# script-loop
# --------------------------------------------------------------------------------------------


def gen_script_loop(rng: random.Random) -> tuple:
    """A launcher script that loops before it launches, under solve --time-limit."""
    n = rng.choice((1000, 100_000, 1_000_000, 5_000_000))
    body_terms = rng.choice((1, 50, 500))
    body = "X=$(( " + " + ".join(["i*3"] * body_terms) + " ))"
    form = rng.choice(("for", "while", "nested", "endless", "function"))
    if form == "for":
        loop = f"X=0\nfor ((i=0;i<{n};i++)); do {body}; done"
    elif form == "while":
        loop = f"i=0\nwhile [ $i -lt {n} ]; do {body}; i=$((i+1)); done"
    elif form == "nested":
        k = max(1, int(n ** 0.5))
        loop = f"for ((j=0;j<{k};j++)); do for ((i=0;i<{k};i++)); do {body}; done; done"
    elif form == "endless":
        loop = "i=0\nwhile true; do i=$((i+1)); done"
    else:
        loop = f"f() {{ {body}; }}\nfor ((i=0;i<{n};i++)); do f; done"
    limit = rng.choice(("1", "2", "3", "5"))
    text = SCRIPT.format(extra=loop, layers="4").encode()
    argv = ("solve", "--megatron-script", "{d}/train.sh", "--cluster", "H800:8", "--time-limit", limit, "--quiet",
            "--backend", rng.choice(("hsdp", "cpsat")))
    what = f"{form} loop, {n} rounds, {body_terms}-term body, --time-limit {limit}"
    return "script-loop:" + what, argv, {"train.sh": text}, None, (), None, {"timeout_s": 60.0}


# --------------------------------------------------------------------------------------------
# extremes
# --------------------------------------------------------------------------------------------


def _edge_values(name: str) -> list[tuple[float, bool | None]]:
    """(value, valid) at and around the ends of a physical range: False outside, None inside."""
    low, high, _unit, _real = PHYSICAL_RANGES[name]
    inside = [low, high, low * 1.001 if low else 1e-9, high * 0.999]
    outside = [high * 1.01, 1e300, -1.0] + ([low * 0.99, 1e-300, 1e-12] if low else [])
    return [(v, None) for v in inside] + [(v, False) for v in outside]


def _extreme_cluster(rng: random.Random) -> tuple[dict[str, Any], str, bool | None, tuple[str, ...]]:
    doc = json.loads(json.dumps(TINY_CLUSTER))
    where = rng.choice(("link bandwidth", "link latency", "intra", "inter", "two shapes", "same shape twice",
                        "link twice", "link to a missing type", "link to itself", "links false", "links text"))
    valid: bool | None = False
    if where in ("link bandwidth", "link latency"):
        key = "bandwidth_gb_per_s" if where == "link bandwidth" else "latency_us"
        value, valid = rng.choice(_edge_values("bandwidth" if key.startswith("band") else "latency"))
        doc["links"][0].update({"bandwidth_gb_per_s": 25.0, "latency_us": 10.0, key: value})
        return doc, f"links[0].{key} = {value:g}", valid, (key,)
    if where in ("intra", "inter"):
        key = f"{where}_node_bandwidth_gb_per_s"
        value, valid = rng.choice(_edge_values("bandwidth"))
        doc["groups"][rng.randrange(2)][key] = value
        return doc, f"groups[].{key} = {value:g}", valid, (key,)
    if where == "two shapes":
        doc["groups"].append({"device_type": "H800", "num_nodes": 2, "gpus_per_node": 4})
        return doc, "H800 in two groups of 8 and 4 GPUs per node", False, ("gpus_per_node",)
    if where == "same shape twice":
        doc["groups"].append({"device_type": "H800", "num_nodes": 1, "gpus_per_node": 8})
        return doc, "H800 in two groups of the same shape", None, ()
    if where == "link twice":
        doc["links"].append({"between": ["MI300X", "H800"], "kind": "ethernet"})
        return doc, "a link pair given twice", False, ("links[1]", "between")
    if where == "link to a missing type":
        doc["links"].append({"between": ["H800", "910B"], "kind": "ethernet"})
        return doc, "a link to 910B, which the cluster lacks", False, ("910B", "between")
    if where == "link to itself":
        doc["links"] = [{"between": ["H800", "H800"], "kind": "ethernet"}]
        return doc, "a link from H800 to H800", False, ("between",)
    doc["links"] = False if where == "links false" else "host-memory"
    return doc, f"links: {doc['links']!r}", False, ("links",)


def gen_extremes(rng: random.Random) -> tuple:
    """Physical figures at and beyond their ranges (cluster, device profile), --moe-imbalance limits."""
    r = rng.random()
    cmd = rng.choice(("estimate", "solve"))
    tail: tuple[str, ...] = ("--time-limit", "2", "--quiet", "--backend", rng.choice(("hsdp", "cpsat"))) \
        if cmd == "solve" else ("--ep", "8")
    if r < 0.55:
        doc, what, valid, names = _extreme_cluster(rng)
        files = _tiny({"cluster.yaml": to_yaml(doc)})
        argv = (cmd, *TINY_ARGS, "--cluster", "{d}/cluster.yaml", *(tail if cmd == "solve" else ()))
        return "extremes:" + what, argv, files, valid, ("--cluster",) + names, None
    if r < 0.8:
        doc = h800_profile_document()
        key = rng.choice(("memory_gib", "hbm_bandwidth_tb_per_s", "peak_tflops", "intra_node", "inter_node"))
        rng_name = {"memory_gib": "memory", "hbm_bandwidth_tb_per_s": "hbm", "peak_tflops": "peak"}.get(key, "bandwidth")
        value, valid = rng.choice(_edge_values(rng_name))
        if key == "peak_tflops":
            doc["peak_tflops"] = {k: value for k in doc["peak_tflops"]}
        elif key in ("intra_node", "inter_node"):
            doc[key]["bandwidth_gb_per_s"] = value
        else:
            doc[key] = value
        if key == "memory_gib" and valid is None and value <= doc["memory_overhead_gib"]:
            valid = False  # no memory left beside the overhead
        files = _tiny({"prof/devices/H800.yaml": to_yaml(doc)})
        argv = (cmd, *TINY_ARGS, "--cluster", "H800:8", "--profiles", "{d}/prof", *tail)
        return f"extremes:device {key} = {value:g}", argv, files, valid, ("--profiles", "H800.yaml"), None
    value, valid = rng.choice(((1.0, None), (4.0, None), (4.0001, False), (1e300, False), (0.5, False),
                               (1e-300, False), (2.5, None)))
    argv = (cmd, *TINY_ARGS, "--cluster", "H800:8", "--moe-imbalance", repr(value), *tail)
    return f"extremes:--moe-imbalance {value!r} (the tiny model's num_experts/topk is 4)", argv, _tiny({}), valid, \
        ("--moe-imbalance",), None


# --------------------------------------------------------------------------------------------
# poisoned-log
# --------------------------------------------------------------------------------------------


def gen_poisoned_log(rng: random.Random) -> tuple:
    """calibrate on a log of another run, and estimate with corrections fitted to one."""
    low, high = TIME_FACTOR_RANGE
    r = rng.random()
    base = ("calibrate", "--megatron-log", "{d}/run.log", *TINY_ARGS, "--cluster", "H800:8", "--ep", "8", "--out",
            "{d}/cal")
    if r < 0.45:
        ratio = rng.choice((0.005, 0.01, 0.05, 0.2, 0.5, 1.0, 1.3, 3.0, 8.0, 20.0, 50.0, 1000.0))
        text = log_text([f"{tiny_predicted_ms() * ratio * (1 + 0.01 * (i % 3)):.6f}" for i in range(8)])
        valid = False if ratio < low * 0.8 or ratio > high * 1.5 else None
        return f"poisoned-log:a log {ratio:g}x the prediction", base, _tiny({"run.log": text}), valid, \
            ("--megatron-log",), "cal"
    if r < 0.7:
        first, second = rng.choice(((1.0, 1.0), (1.0, 3.0), (1.0, 0.1), (2.0, 1.0)))
        a = log_text([f"{tiny_predicted_ms() * first:.6f}"] * 8)
        b = log_text([f"{tiny_predicted_ms() * second:.6f}"] * rng.choice((8, 12)))
        pick = rng.random() < 0.4
        argv = base + (("--log-run", "2") if pick else ())
        valid = None if pick else False
        what = f"two runs ({first:g}x then {second:g}x){' with --log-run 2' if pick else ''}"
        return "poisoned-log:" + what, argv, _tiny({"run.log": a + b}), valid, ("--megatron-log",), "cal"
    kind = rng.choice(("gemm", "attention", "all_to_all", "moe_imbalance_factor"))
    if kind == "moe_imbalance_factor":
        factor, valid = rng.choice(((1.5, None), (4.0, None), (100.0, False), (1e300, False), (0.5, False)))
        device = "*"
    else:
        factor, valid = rng.choice(((0.11, None), (9.0, None), (0.05, False), (20.0, False), (47.9, False),
                                    (1e300, False)))
        device = "H800"
    rows = [{"device": device, "kind": kind, "factor": factor,
             "provenance": {"kind": "calibrated", "source": "cli.py calibrate on another run's log"}}]
    argv = ("estimate", *TINY_ARGS, "--cluster", "H800:8", "--ep", "8", "--profiles", "{d}/prof")
    return f"poisoned-log:corrections {device} {kind} x{factor:g}", argv, \
        _tiny({"prof/corrections.yaml": to_yaml(rows)}), valid, ("corrections.yaml", "--profiles"), None


__all__ = ["earlier_output", "gen_edited_plan", "gen_extremes", "gen_input_in_out", "gen_poisoned_log", "gen_script_loop",
           "gen_signal", "gen_user_files"]
