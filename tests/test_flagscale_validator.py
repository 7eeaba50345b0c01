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

import json
import os
import shlex
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

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


def run_tool(tool: Path, *args: str, stdin: str | None = None, timeout: int = 600) -> object:
    proc = subprocess.run([PYTHON, str(tool), *args], input=stdin, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@lru_cache(maxsize=None)
def flagscale_root() -> Path:
    out = subprocess.run([PYTHON, "-c", "import os, flag_scale; print(os.path.dirname(flag_scale.__file__))"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@lru_cache(maxsize=None)
def config_results() -> dict[str, dict]:
    """Every YAML input in one process (the imports take ~15 s)."""
    functional = sorted((flagscale_root() / "tests" / "functional_tests" / "test_cases" / "hetero_train" / "aquila"
                         / "conf").glob("*.yaml"))
    results = run_tool(VALIDATE, *map(str, functional + GOLDEN))
    return {Path(r["name"]).stem if r["name"].endswith(".yaml") else Path(r["name"]).name: r for r in results}


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
}


def hostfile_hosts(path: Path) -> list[list]:
    """[[type, slots], ...] of a host file (`NAME slots=N type=T` lines)."""
    hosts = []
    for line in path.read_text().splitlines():
        fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
        if fields:
            hosts.append([fields.get("type"), int(fields["slots"])])
    return hosts


@lru_cache(maxsize=None)
def raw_results() -> dict[str, dict]:
    """The controls and the golden megatron_args.txt (with their host files), in one process."""
    cases = [{"name": name, "argv": argv, "hosts": hosts, "env": ENV} for name, (argv, hosts, _m) in CONTROLS.items()]
    cases += [{"name": g.name, "argv": shlex.split((g / "megatron_args.txt").read_text()),
               "hosts": hostfile_hosts(g / "hostfile"), "env": ENV} for g in GOLDEN]
    return {r["name"]: r for r in run_tool(VALIDATE, "--cases", "-", stdin=json.dumps(cases))}


def test_flagscales_own_hetero_functional_tests_pass_its_checks():
    """The harness accepts FlagScale's own hetero training tests (which have gold loss curves)."""
    results = {k: v for k, v in config_results().items() if k not in {g.name for g in GOLDEN}}
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


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.name)
def test_golden_flagscale_args_pass_flagscales_checks(golden):
    """megatron_args.txt with the host file, as launch.sh runs it (each host its device type)."""
    r = raw_results()[golden.name]
    assert r["ok"], r["error"]
    assert not r["warnings"], r["warnings"]


@pytest.mark.xfail(reason="FlagScale 0.8.0's runner needs a *_VISIBLE_DEVICES variable in experiment.envs "
                   "(runner_train.py:372 UnboundLocalError otherwise), and it always passes --save, so Megatron "
                   "needs --save-interval; the planner's YAML has neither (yet)", strict=False)
@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.name)
def test_golden_flagscale_yaml_runs_through_flagscales_runner_and_checks(golden):
    r = config_results()[golden.name]
    assert r["ok"], (r["stage"], r["error"])


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
