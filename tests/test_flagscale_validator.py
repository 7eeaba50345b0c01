"""FlagScale's own checks (flag-scale 0.8.0) on what the planner emits for the flagscale runtime.

FlagScale needs Python 3.12, so it runs in a separate environment that `.ci/flagscale_env.sh`
builds once outside the clone (~/.cache/hapmoe/flagscale-venv; torch is borrowed from the Megatron
validator environment).  tools/flagscale_validate.py runs FlagScale's runner (YAML -> per-host
command lines, dry run) and its argument and heterogeneous checks (FSTrainArguments.pre_validate_args,
validate_args, post_validate_args, the micro-batch calculator, ParallelContext) on a fake process
group; tools/flagscale_autotune.py runs FlagScale's heterogeneous auto-tuner without launching jobs.
Without that environment every test here skips, saying why.
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cli import main

from planner.api import load_inputs
from planner.bench_flagscale import run_flagscale_tuner
from planner.cost.model import CostModel, PlanCost
from planner.errors import PlannerInputError
from planner.inputs.cluster import parse_cluster
from planner.inputs.flagscale_config import FlagScaleConfig, read_flagscale_config, train_config_path
from planner.launcher import render_launch_files
from planner.output.run_dir import LAUNCHER_OUTPUT, write_files
from planner.profile_tables import ProfileSet
from planner.runtime import FLAGSCALE

from helpers import flagscale_plans
from helpers.corpus import CORPUS, CORPUS_DIR
from helpers.once import once_per_run

HERE = Path(__file__).parent
ROOT = HERE.parent
VALIDATE = ROOT / "tools" / "flagscale_validate.py"
AUTOTUNE = ROOT / "tools" / "flagscale_autotune.py"
DEFAULT_ENV = Path.home() / ".cache" / "hapmoe" / "flagscale-venv"
GOLDEN = [HERE / "golden" / "dense_flagscale", HERE / "golden" / "moe_flagscale"]


def flagscale_python() -> str | None:
    """$HAPMOE_FLAGSCALE_PYTHON, or the default environment when .ci/flagscale_env.sh built it."""
    explicit = os.environ.get("HAPMOE_FLAGSCALE_PYTHON")
    if explicit:
        return explicit if Path(explicit).exists() else None
    if (DEFAULT_ENV / ".hapmoe-ready").exists() and (DEFAULT_ENV / "bin" / "python").exists():
        return str(DEFAULT_ENV / "bin" / "python")
    return None


PYTHON = flagscale_python()
pytestmark = pytest.mark.skipif(
    PYTHON is None,
    reason="FlagScale's environment is not built (bash .ci/flagscale_env.sh builds it: Python 3.12, "
    "flag-scale 0.8.0); set HAPMOE_FLAGSCALE_PYTHON to use another",
)


# What a user exports before FlagScale's run.py when the input script's positional arguments were not
# given to solve (the YAML reads them as ${oc.env:HAPMOE_SCRIPT_ARG_N}).
SCRIPT_ARGS_ENV = {f"HAPMOE_SCRIPT_ARG_{n}": f"/hapmoe/arg{n}" for n in range(1, 10)}


def run_tool(tool: Path, *args: str, stdin: str | None = None, timeout: int = 900) -> object:
    proc = subprocess.run([PYTHON, str(tool), *args], input=stdin, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **SCRIPT_ARGS_ENV})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@lru_cache(maxsize=None)
def flagscale_root() -> Path:
    out = subprocess.run([PYTHON, "-c", "import os, flag_scale; print(os.path.dirname(flag_scale.__file__))"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def functional_configs() -> list[Path]:
    """FlagScale's own heterogeneous training tests (they come with gold loss curves)."""
    return sorted((flagscale_root() / "tests" / "functional_tests" / "test_cases" / "hetero_train" / "aquila"
                   / "conf").glob("*.yaml"))


_EMITTED = Path(tempfile.mkdtemp(prefix="hapmoe-flagscale-"))
atexit.register(shutil.rmtree, _EMITTED, True)
PROPERTY_PLANS = 24


def _written(name: str, files: dict[str, str]) -> Path:
    out = _EMITTED / name
    write_files(out, files, "--out", LAUNCHER_OUTPUT)
    return out


@lru_cache(maxsize=None)
def round_trip() -> tuple[FlagScaleConfig, PlanCost, Path]:
    """FlagScale's dp2dp4_shared_embedding test read back (model, meshes, batch), priced by the cost model
    and emitted again."""
    cfg = read_flagscale_config(next(p for p in functional_configs() if p.stem == "dp2dp4_shared_embedding"))
    cost = CostModel(cfg.run.model, cfg.run.training, cfg.cluster, ProfileSet.load()).evaluate(cfg.plan)
    return cfg, cost, _written("roundtrip-dp2dp4_shared_embedding", render_launch_files(cfg.run, cfg.plan, cfg.cluster))


def config_results() -> dict[str, dict]:
    """FlagScale's verdict on every YAML input of the default run (`validator_results`): its functional configs,
    the golden configs, the round trip and the property sample."""
    return validator_results()[0]


BASE = shlex.split((HERE / "golden" / "moe_flagscale" / "megatron_args.txt").read_text())
HOSTS = "H800:8,H800:8,MI300X:8"
ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def with_flag(argv: list[str], flag: str, values: list[str] | None) -> list[str]:
    """argv with `flag`'s values replaced (None: the flag removed)."""
    argv = list(argv)
    if flag in argv:
        i = argv.index(flag)
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        del argv[i:j]
        if values is not None:
            argv[i:i] = [flag, *values]
    elif values is not None:
        argv += [flag, *values]
    return argv


# name -> (argv, hosts, the start of FlagScale's message, or None when it must accept)
CONTROLS: dict[str, tuple[list[str], str, str | None]] = {
    "golden args": (BASE, HOSTS, None),
    "DP0*mbs not divisible by a mesh's DP": (
        with_flag(BASE, "--hetero-process-meshes", "2 1 4 4 2 2 1 4 3 1".split()), "H800:16,MI300X:6",
        "AssertionError: data_parallel_size * micro_batch_size 4 should be divisible by all hetero_process_meshes_dp"),
    "tied embeddings, first and last TP differ": (
        with_flag(with_flag(BASE, "--hetero-process-meshes", "2 1 4 4 2 4 1 4 2 1".split()),
                  "--untie-embeddings-and-output-weights", None), HOSTS,
        "AssertionError: if untie_embeddings_and_output_weights is False or mtp_num_layers is not 0, the first and "
        "last stage should have the same tp degree"),
    "layer split does not sum to num_layers": (
        with_flag(BASE, "--hetero-pipeline-layer-split", "6 5 4".split()), HOSTS,
        "AssertionError: sum of hetero_pipeline_layer_split [6, 5, 4] should be equal to num_layers 16"),
    "world size is not the sum of the meshes": (
        BASE, "H800:16,MI300X:16", "RuntimeError: World size mismatch. Expected 32, but got 24"),
    "per-stage recompute over the wrong micro-batch count": (
        with_flag(BASE, "--recompute-granularity-per-stage-micro-batch", ["[1, 31, 1]", "[2, 32, 0]"]), HOSTS,
        "AssertionError: for [recompute_granularity_per_stage_micro_batch] refined recompute configuration, "
        "the sum [31]"),
    "query groups over a mesh's TP (checked on that mesh's rank)": (
        with_flag(BASE, "--hetero-process-meshes", "2 1 4 4 2 8 1 4 1 1".split()), HOSTS,
        "ValueError: num_query_groups (4) must be a multiple of tensor_model_parallel_size (8)"),
    "linear biases in an MoE model (gpt-oss has them)": (
        with_flag(BASE, "--disable-bias-linear", None), HOSTS, "AssertionError: Bias is not supported for MoE"),
}


def hostfile_hosts(path: Path) -> list[list]:
    """[[type, slots], ...] of a host file (`NAME slots=N type=T` lines)."""
    hosts = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            continue
        fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
        if fields:
            hosts.append([fields.get("type"), int(fields["slots"])])
    return hosts


def raw_results() -> dict[str, dict]:
    """FlagScale's verdict on the controls and the golden megatron_args.txt, with their host files
    (`validator_results`)."""
    return validator_results()[1]


@lru_cache(maxsize=None)
def validator_results() -> tuple[dict[str, dict], dict[str, dict]]:
    """Every input of the default run in one FlagScale process, once per test run (its imports take ~8 s; pytest-xdist's
    workers share the run): the YAML inputs of `config_results` by name, the raw cases of `raw_results` by name."""
    return tuple(once_per_run("flagscale-validate", _validate))


def _validate() -> tuple[dict[str, dict], dict[str, dict]]:
    configs = functional_configs() + GOLDEN + [round_trip()[2]] + [
        _written(name, files) for name, files in flagscale_plans.sample(PROPERTY_PLANS)]
    cases = [{"name": name, "argv": argv, "hosts": hosts, "env": ENV} for name, (argv, hosts, _m) in CONTROLS.items()]
    cases += [{"name": g.name, "argv": shlex.split((g / "megatron_args.txt").read_text()),
               "hosts": hostfile_hosts(g / "hostfile"), "env": ENV} for g in GOLDEN]
    results = run_tool(VALIDATE, *map(str, configs), "--cases", "-", stdin=json.dumps(cases))
    assert len(results) == len(configs) + len(cases), [r["name"] for r in results]
    yaml_part, raw_part = results[:len(configs)], results[len(configs):]
    return ({Path(r["name"]).stem if r["name"].endswith(".yaml") else Path(r["name"]).name: r for r in yaml_part},
            {r["name"]: r for r in raw_part})


def test_flagscales_own_hetero_functional_tests_pass_its_checks():
    """The harness accepts FlagScale's own hetero training tests (which have gold loss curves)."""
    results = {p.stem: config_results()[p.stem] for p in functional_configs()}
    assert len(results) == 3
    for name, r in results.items():
        assert r["ok"], (name, r["error"])
        assert len(r["checked"]) == len(r["placement"])  # one rank per mesh


@pytest.mark.parametrize("name", list(CONTROLS))
def test_flagscale_refuses_bad_meshes_with_its_own_message(name):
    r = raw_results()[name]
    expected = CONTROLS[name][2]
    if expected is None:
        assert r["ok"], r["error"]
    else:
        assert not r["ok"]
        assert r["error"].startswith(expected), r["error"]


def test_the_planner_refuses_flagscale_for_an_moe_model_with_biases_as_flagscale_does():
    """FlagScale's fork refuses linear biases in an MoE model (the control above); the planner's rule says the same
    words, `solve --runtime flagscale` refuses with them (exit 2, nothing written), and `auto` plans such a model on a
    runtime that runs it, saying why FlagScale could not."""
    from planner.megatron.rules import flagscale_model_violations
    from planner.inputs.megatron_flags import parse_megatron_flags

    fs = raw_results()["linear biases in an MoE model (gpt-oss has them)"]
    assert not fs["ok"]
    flags = "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 " \
            "--max-position-embeddings 1024 --global-batch-size 64 --num-experts 8 --moe-router-topk 2"
    (v,) = flagscale_model_violations(parse_megatron_flags(shlex.split(flags), world_size=16).model)
    assert v.rule == "flagscale_moe_bias" and fs["error"].startswith(f"AssertionError: {v.message} ("), fs["error"]
    without = parse_megatron_flags(shlex.split(flags + " --disable-bias-linear"), world_size=16)
    assert not flagscale_model_violations(without.model)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan"
        res = CliRunner().invoke(main, ["solve", "--megatron-args", flags, "--cluster", "H800:8,MI300X:8",
                                        "--runtime", "flagscale", "--time-limit", "10", "--out", str(out)])
        assert res.exit_code == 2 and "--runtime" in res.output and "Bias is not supported for MoE" in res.output
        assert not out.exists()
        res = CliRunner().invoke(main, ["solve", "--megatron-args", flags, "--cluster", "H800:8,MI300X:8",
                                        "--time-limit", "10"])
        assert res.exit_code == 0, res.output
        assert "runtime=megatron" in res.output and "Bias is not supported for MoE" in res.output


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.name)
def test_golden_flagscale_args_pass_flagscales_checks(golden):
    """megatron_args.txt with the host file, as launch.sh runs it (each host its device type)."""
    r = raw_results()[golden.name]
    assert r["ok"], r["error"]
    assert not r["warnings"], r["warnings"]


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.name)
def test_golden_flagscale_yaml_runs_through_flagscales_runner_and_checks(golden):
    """FlagScale's runner turns the golden YAML into each host's command (a *_VISIBLE_DEVICES per device
    type, --save-interval under system.checkpoint), and FlagScale's checks accept every mesh."""
    r = config_results()[golden.name]
    assert r["ok"], (r["stage"], r["error"])
    assert not r.get("runner_error"), r["runner_error"]


def test_a_flagscale_functional_config_round_trips_through_estimate_and_emit():
    """dp2dp4_shared_embedding (A800 DP 2 then A800 DP 4, 4+4 layers, tied embeddings with partial reduce):
    read into a run and a plan, priced, emitted, and the emitted YAML passes FlagScale's runner and checks
    with the same meshes, layer split and device types."""
    cfg, cost, out = round_trip()
    assert cfg.plan.runtime == "flagscale" and [s.dp for s in cfg.plan.stages] == [2, 4]
    assert cfg.run.model.num_layers == 8 and (cfg.plan.mbs, cfg.plan.gbs) == (4, 1024)
    assert cost.fits and cost.iteration_time_s > 0
    r = config_results()[out.name]
    assert r["ok"], (r["stage"], r["error"])
    train = yaml.safe_load((out / "flagscale" / "conf" / "train" / "hapmoe.yaml").read_text())["system"]["hetero"]
    original = yaml.safe_load(train_config_path(next(p for p in functional_configs()
                                                     if p.stem == "dp2dp4_shared_embedding")).read_text())
    for key in ("hetero_process_meshes", "hetero_pipeline_layer_split", "hetero_device_types",
                "use_partial_reduce_for_shared_embedding"):
        assert train[key] == original["system"]["hetero"][key], key


def test_per_mesh_tp_configs_are_refused_with_the_reason():
    """FlagScale's other two functional configs give each mesh its own TP, which a plan cannot say."""
    for path in functional_configs():
        if path.stem != "dp2dp4_shared_embedding":
            with pytest.raises(PlannerInputError, match="TP/CP differ"):
                read_flagscale_config(path)


def test_flagscale_accepts_every_plan_the_planners_rules_accept():
    """A property sample: random flagscale plans the planner's rules accept, emitted; FlagScale's runner and
    checks accept every one."""
    names = [n for n in config_results() if n.startswith("property-")]
    assert len(names) == PROPERTY_PLANS
    refused = {n: (config_results()[n]["stage"], config_results()[n]["error"]) for n in names
               if not config_results()[n]["ok"]}
    assert not refused, refused


def test_flagscales_auto_tuner_runs_standalone():
    """Search space, strategies and pruning of FlagScale's hetero auto-tuner, no job launched; its
    first candidate through FlagScale's own checks."""
    r = run_tool(AUTOTUNE, "--train", str(GOLDEN[0] / "flagscale" / "conf" / "train" / "hapmoe.yaml"),
                 "--cluster", "A100:8,910B:8", "--skip-history-rules", "--limit", "5", "--validate", "1",
                 "--space", json.dumps({"use_recompute": [False], "sequence_parallel": [True]}))
    assert r["ok"], r["error"]
    assert r["counts"]["candidates"] > 0 and r["seconds"]["search"] > 0
    assert r["first"]["hetero_device_types"] == ["A100", "910B"]
    assert r["validated"][0]["ok"], r["validated"][0]["error"]


# --------------------------------------------------------------------------------------------------
# Every FlagScale config `solve` writes: preset runs and the launcher corpus (slow: each one is a search)
SOLVES: dict[str, list[str]] = {
    "solve-readme": ["--model", "mixtral-l", "--cluster", "H800:16,MI300X:16,910B:16"],  # auto: FlagScale, 910B idle
    "solve-mixtral-s-h800-mi300x": ["--model", "mixtral-s", "--cluster", "H800:8,MI300X:8", "--runtime", "flagscale"],
    "solve-llama2-7b-a100-mi300x": ["--model", "llama2-7b", "--cluster", "A100:8,MI300X:8", "--runtime", "flagscale"],
    "solve-qwen3-30b-h100-h800": ["--model", "qwen3-30b-a3b", "--cluster", "H100:8,H800:8", "--runtime", "flagscale"],
    "solve-dsv2-lite-h800-mi300x": ["--model", "deepseek-v2-lite", "--cluster", "H800:8,MI300X:8",
                                    "--runtime", "flagscale"],
}


SOLVE_LIMIT_S = "3"
"""Each solve's time limit: FlagScale judges the config of whatever plan solve returns (the flagscale runtime's search
starts from the best uniform-DP plan: every one had a plan at --time-limit 1 on a 2-core machine at load 4; at 10 s
the 22 solves took 93 s, at 6 s 73 s)."""


def _solve_out(name: str, args: list[str]) -> Path | str:
    """solve's launch/ directory, or the planner's one-line refusal (exit 2)."""
    out = _EMITTED / name
    own, script_args = (args[:args.index("--")], args[args.index("--"):]) if "--" in args else (args, [])
    res = CliRunner().invoke(main, ["solve", *own, "--backend", "hsdp", "--time-limit", SOLVE_LIMIT_S, "--quiet",
                                    "--out", str(out), *script_args])
    if res.exit_code == 2:
        return res.output.strip()
    assert res.exit_code == 0, res.output
    return out / "launch"


# Corpus scripts the planner refuses to write a FlagScale launcher for, and why (FlagScale's own validator
# refused them first: its parser does not know other forks' flags; its Megatron fork refuses a batch ramp-up
# with --train-iters).
PLANNER_REFUSES = {"corpus-pai_megatron_patch_eval.sh": "does not take another fork's flags",
                   "corpus-pai_megatron_patch_qwen3.sh": "does not take another fork's flags",
                   "corpus-pai_megatron_patch_moe_offload.sh": "does not take another fork's flags",
                   "corpus-gpt3_175b_distributed.sh": "refuses --rampup-batch-size with --train-iters"}


@lru_cache(maxsize=None)
def emitted_slow_results() -> tuple[dict[str, dict], dict[str, str]]:
    """Every emitted FlagScale config of the slow set, in one process: solve on presets, and every corpus
    script FlagScale can run planned for it (the mixtral script also on H800 + MI300X).  Also the planner's
    refusals, by name."""
    outs = {name: _solve_out(name, args) for name, args in SOLVES.items()}
    for c in CORPUS:
        script = ["--megatron-script", str(CORPUS_DIR / c["script"])]
        if FLAGSCALE_CAN_RUN(c["cluster"]):
            outs[f"corpus-{c['script']}"] = _solve_out(f"corpus-{c['script']}", [
                *script, "--cluster", c["cluster"], "--runtime", "flagscale", "--", *c["args"]])
        if c.get("cross_vendor_cluster"):
            outs[f"corpus-{c['script']}-cross"] = _solve_out(f"corpus-{c['script']}-cross", [
                *script, "--cluster", c["cross_vendor_cluster"], "--runtime", "flagscale", "--", *c["args"]])
    dirs = {n: d for n, d in outs.items() if isinstance(d, Path)}
    results = run_tool(VALIDATE, *map(str, dirs.values()))
    by_dir = {r["name"]: r for r in results}
    return {name: by_dir[str(d)] for name, d in dirs.items()}, {n: d for n, d in outs.items() if isinstance(d, str)}


def FLAGSCALE_CAN_RUN(cluster: str) -> bool:
    profiles = ProfileSet.load()
    return FLAGSCALE.can_run(parse_cluster(cluster, profiles), profiles).ok


@pytest.mark.slow
def test_every_flagscale_config_solve_writes_passes_flagscales_checks():
    """solve's FlagScale YAML for presets (the README's cluster among them) and for the launcher corpus:
    FlagScale's runner builds every host's command and its checks accept every mesh."""
    results, planner_refused = emitted_slow_results()
    assert len(results) >= len(SOLVES) + 10
    refused = {n: (r["stage"], r["error"]) for n, r in results.items() if not r["ok"]}
    assert not refused, refused
    assert sorted(planner_refused) == sorted(PLANNER_REFUSES)
    for name, why in PLANNER_REFUSES.items():
        assert why in planner_refused[name] and "\n" not in planner_refused[name], planner_refused[name]
    readme = yaml.safe_load((_EMITTED / "solve-readme" / "launch" / "flagscale" / "conf" / "train" / "hapmoe.yaml")
                            .read_text())
    assert readme["system"]["distributed_backend"] == "flagcx"
    assert set(readme["system"]["hetero"]["hetero_device_types"]) == {"H800", "MI300X"}


@pytest.mark.slow
def test_flagscales_auto_tuner_runs_beside_hapmoe_in_bench():
    """bench's tuner column: FlagScale's auto-tuner on Mixtral-S over 16 H800, its candidates priced by the
    cost model; the fastest one that fits is a plan whose emitted config FlagScale's validator accepts."""
    inputs = load_inputs(model="mixtral-s", cluster="H800:16", overrides={"gbs": 256})
    out = run_flagscale_tuner(inputs.run, inputs.cluster, inputs.profiles, time_limit_s=120)
    assert out.status == "ok", out.why
    c = out.counts
    assert c["candidates"] >= c["full"] >= c.get("expressible", 0) >= c.get("fits", 0) >= 1
    assert out.best is not None and out.best.cost.fits and out.best.plan.runtime == "flagscale"
    assert out.validated == "ok", out.validated
    assert out.search_time_s > 0
