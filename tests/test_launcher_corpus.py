"""The launcher corpus (tests/launchers/corpus.yaml): real-style scripts in, faithful launchers out.

For every script: `solve --megatron-script SCRIPT --out DIR -- ARGS` plans it; then the input script
and the emitted launch.sh both run under bash with stub `torchrun`/`python`/`srun`/`mpirun` that record
the command they are given.  The emitted launcher must pass every flag of the user's command that
the plan does not decide, unchanged and in order, followed by the plan's flags, exactly the flags
of megatron_args.txt; the interpreter must read the same flags bash passes.  The input script is
never modified.  (Megatron's own validator checks the same files in test_megatron_validator.py.)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from planner.inputs.script import read_launcher_script
from planner.launcher.common import group_flag_items, is_flag_token
from planner.megatron.flags import PLAN_DECIDED_FLAGS

from helpers.corpus import CORPUS_DIR, NAMES, entry, solved

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

# Stubs: record the command (program name, then its arguments, NUL-separated) once, and exit 0.
# srun / mpirun drop their own options and run the rest, as they would on every node.
_RECORD = '[ -e "$HAPMOE_ARGS_OUT" ] || printf "%s\\0" "$(basename "$0")" "$@" > "$HAPMOE_ARGS_OUT"\n'
_STUBS = {
    "torchrun": "#!/bin/bash\n" + _RECORD,
    # `python -c` asks torch for the node's GPU count (Pai-Megatron-Patch): a node of 8 answers
    "python": "#!/bin/bash\nif [ \"$1\" = -c ]; then echo 8; exit 0; fi\n" + _RECORD,
    "python3": "#!/bin/bash\nif [ \"$1\" = -c ]; then echo 8; exit 0; fi\n" + _RECORD,
    "srun": "#!/bin/bash\nwhile [[ \"$1\" == -* ]]; do case \"$1\" in -N|-n|-p|--nodes|--ntasks|--ntasks-per-node) shift 2 ;;"
            " *) shift ;; esac; done\nexec \"$@\"\n",
    "mpirun": "#!/bin/bash\nwhile [[ \"$1\" == -* ]]; do case \"$1\" in -np|-n|-H|-x|--hostfile|--bind-to|-map-by|--map-by) shift 2 ;;"
              " *) shift ;; esac; done\nexec \"$@\"\n",
    "scontrol": "#!/bin/bash\necho node0\n",
    # `uv run CMD` runs CMD in the project's environment
    "uv": "#!/bin/bash\nif [[ \"$1\" == run ]]; then shift; fi\nexec \"$@\"\n",
    # sbatch runs the job script (a file, or its standard input) here, in the submitting environment
    "sbatch": "#!/bin/bash\nwhile [[ \"$1\" == -* ]]; do shift; done\nif [[ $# -gt 0 ]]; then exec bash \"$@\"; fi\n"
              "exec bash -s\n",
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    bindir = root / "bin"
    bindir.mkdir()
    # `date` at one fixed instant: a launcher that names its output by the time (Pai-Megatron-Patch's
    # --tensorboard-dir) gives the input script and the emitted launcher the same name, whatever second each runs in
    stubs = {**_STUBS, "date": f"#!/bin/bash\nexec {shutil.which('date')} -d @1764892800 \"$@\"\n"}
    for prog, text in stubs.items():
        (bindir / prog).write_text(text)
        (bindir / prog).chmod(0o755)
    return root


def run_recorded(script: Path, args: list[str], workdir: Path, tag: str, env: dict | None = None,
                 files: tuple[str, ...] = ()) -> list[str]:
    """Run a script under bash with the stubs first on PATH, from a directory per corpus script
    (the same for the input and the emitted launcher); the recorded command."""
    cwd = workdir / f"cwd-{tag.split('-', 1)[-1]}"
    cwd.mkdir(exist_ok=True)
    for f in files:
        (cwd / f).write_text("")
    out = workdir / f"rec-{tag}"
    out.unlink(missing_ok=True)
    environ = {"PATH": f"{workdir / 'bin'}:{os.environ['PATH']}", "HOME": str(workdir), "HAPMOE_ARGS_OUT": str(out),
               "HAPMOE_SKIP_NODE_CHECK": "1",  # no GPUs here; the node check has tests of its own
               **(env or {})}  # a clean environment: what the planner reads as unset is unset here too
    proc = subprocess.run(["bash", str(script), *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=60)
    assert out.exists(), f"{script.name} launched nothing (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return out.read_bytes().decode().split("\0")[:-1]


def split_at_entry(rec: list[str], entry_name: str) -> tuple[list[str], list[str]]:
    k = next(i for i, tok in enumerate(rec) if tok.rsplit("/", 1)[-1] == entry_name)
    return rec[:k], rec[k + 1 :]


def same_tokens(expected: list[str], got: list[str], unresolved: list[str]) -> bool:
    """Token lists equal, where a token holding text the planner left for bash (`$(hostname)`,
    `${PWD}`) matches whatever bash made of it."""
    if len(expected) != len(got):
        return False
    for e, g in zip(expected, got):
        if e == g:
            continue
        pattern = re.escape(e)
        for ref in sorted(unresolved, key=len, reverse=True):
            pattern = pattern.replace(re.escape(ref), ".*")
        if not re.fullmatch(pattern, g):
            return False
    return True


@pytest.mark.parametrize("name", NAMES)
def test_corpus_script_is_read_as_bash_runs_it(name, workdir):
    """The interpreter reads the flags bash passes to the entry script, and the model facts."""
    c = entry(name)
    script = read_launcher_script(CORPUS_DIR / name, args=c["args"])
    rec = run_recorded(CORPUS_DIR / name, c["args"], workdir, f"user-{name}", env=c.get("env"),
                       files=tuple(c.get("needs_files", ())))
    _, user_flags = split_at_entry(rec, script.entry_script.rsplit("/", 1)[-1])
    assert same_tokens(script.megatron_flags, user_flags, script.unresolved), (script.megatron_flags, user_flags)
    from planner.inputs.resolve import resolve_run

    notes: list[str] = []
    run = resolve_run(megatron_script=str(CORPUS_DIR / name), script_args=c["args"], notes=notes)
    for key, value in c["expect"].items():
        got = run.training.precision if key == "precision" else getattr(run.model, key)
        assert got == value, (key, got, value)
    for flag in c.get("fork_flags", ()):
        assert flag in run.passthrough and any(flag in n and "not modelled" in n for n in notes)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_emitted_launcher_is_the_users_command_with_the_plan(name, workdir):
    """launch.sh passes the user's flags that the plan does not decide, unchanged and in order,
    then the plan's flags: exactly megatron_args.txt.  torchrun gets the plan's placement; the
    input script is left as it was."""
    c = entry(name)
    src = CORPUS_DIR / name
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    out = solved(name)
    script = read_launcher_script(src, args=c["args"])
    entry_name = script.entry_script.rsplit("/", 1)[-1]
    files = tuple(c.get("needs_files", ()))
    env = c.get("env", {})
    user_launcher, user_flags = split_at_entry(run_recorded(src, c["args"], workdir, f"u-{name}", env=env, files=files),
                                               entry_name)
    plan_launcher, plan_flags = split_at_entry(
        run_recorded(out / "launch" / "launch.sh", c["args"], workdir, f"p-{name}",
                     env={**env, "HAPMOE_NODE_RANK": "0"}, files=files),
        entry_name,
    )
    args_file = shlex.split((out / "launch" / "megatron_args.txt").read_text())
    assert same_tokens(args_file, plan_flags, script.unresolved), (args_file, plan_flags)

    # Directly against what bash passed for the input script: kept flags first, in order, then the plan's.
    plan_items = group_flag_items(plan_flags)
    decided = set(PLAN_DECIDED_FLAGS) | {i.name for i in plan_items[-_applied_count(out):]}
    kept = [i.tokens() for i in group_flag_items(user_flags) if i.name not in decided]
    assert [i.tokens() for i in plan_items[: len(kept)]] == kept
    doc = json.loads((out / "plan.json").read_text())
    plan = doc["plan"]
    got = {i.name: i.values for i in plan_items}
    assert got["--tensor-model-parallel-size"] == [str(plan["tp"])]
    assert got["--pipeline-model-parallel-size"] == [str(plan["pp"])]
    assert got["--global-batch-size"] == [str(plan["gbs"])] and got["--micro-batch-size"] == [str(plan["mbs"])]

    if user_launcher and user_launcher[0] in ("torchrun",) or "torch.distributed.run" in user_launcher \
            or "torch.distributed.launch" in user_launcher:
        opts = {i.name.replace("_", "-"): i.values for i in group_flag_items(plan_launcher[1:]) if is_flag_token(i.name)}
        hosts = [ln for ln in (out / "launch" / "hostfile").read_text().splitlines() if not ln.startswith("#")]
        assert opts["--node-rank"] == ["0"] and opts["--rdzv-backend"] == ["static"]
        assert int(opts["--nnodes"][0]) * int(opts["--nproc-per-node"][0]) == plan["world_size"]
        assert len(hosts) <= int(opts["--nnodes"][0])
        user_opts = {i.name.replace("_", "-"): i.values for i in group_flag_items(user_launcher[1:]) if is_flag_token(i.name)}
        read = {i.name.replace("_", "-"): i.values for i in group_flag_items(script.launcher_args) if is_flag_token(i.name)}
        for key in ("--master-addr", "--master-port"):
            if key in user_opts:  # the script's own master address and port are kept (as bash expands them) ...
                assert same_tokens(read[key], user_opts[key], script.unresolved), (key, read[key], user_opts[key])
                if key == "--master-addr" and user_opts[key] == ["localhost"] and len(hosts) > 1:
                    # ... except a one-node address in a multi-node plan: node 0's host, named on stderr
                    assert opts[key] == [hosts[0].split()[0]]
                    continue
                assert same_tokens(read[key], opts[key], script.unresolved), (key, read[key], opts[key])
    else:  # srun / mpirun / python: the scheduler's own options are the user's
        assert plan_launcher == user_launcher
    assert hashlib.sha256(src.read_bytes()).hexdigest() == digest


def _applied_count(out: Path) -> int:
    """How many flag items launch.sh appends (the plan's, plus overrides): read from launch.sh."""
    text = (out / "launch" / "launch.sh").read_text()
    m = re.search(r"\n    plan=\((.*)\)\n", text)
    assert m, "launch.sh has no plan array"
    return len(group_flag_items(shlex.split(m.group(1))))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mixtral_8x7b_distributed.sh", "pai_megatron_patch_eval.sh", "pai_megatron_patch_qwen3.sh",
                                  "slurm_srun_fsdp_string.sh", "rocm_mixtral_eval_arrays.sh"])
def test_dry_run_prints_every_nodes_command_and_runs_nothing(name, workdir, tmp_path):
    """`launch.sh --dry-run ARGS` prints one command per node (torchrun), with the plan's node count and
    nothing else in torchrun's options, and launches nothing, copies nothing, makes no directory (the
    Pai-Megatron-Patch qwen3 script makes its output directories and copies files with `xargs cp` first).  The ROCm
    script's `if [$X = true]` fails in the dry run as bash fails it (the dry run once ran its branch, whose flags the
    plan was not priced with, and printed launch.sh's refusal instead of the nodes' commands)."""
    c = entry(name)
    out = solved(name)
    rec = workdir / f"dry-{name}"
    rec.unlink(missing_ok=True)
    for f in c.get("needs_files", ()):
        (tmp_path / f).write_text("{}")
    before = sorted(p.name for p in tmp_path.iterdir())
    env = {"PATH": f"{workdir / 'bin'}:{os.environ['PATH']}", "HOME": str(workdir), "HAPMOE_ARGS_OUT": str(rec),
           **c.get("env", {})}
    proc = subprocess.run(["bash", str(out / "launch" / "launch.sh"), "--dry-run", *c["args"]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing made, nothing copied
    hosts = [ln for ln in (out / "launch" / "hostfile").read_text().splitlines() if not ln.startswith("#")]
    lines = proc.stdout.splitlines()
    nodes = [k for k, ln in enumerate(lines) if ln.startswith("# node ")]
    commands = [lines[k + 1] for k in nodes]
    assert len(nodes) == len(commands) >= len(hosts)
    entry_name = read_launcher_script(CORPUS_DIR / name, args=c["args"]).entry_script.rsplit("/", 1)[-1]
    for k, line in enumerate(commands):
        words = shlex.split(line)
        assert words[words.index("--node-rank") + 1] == str(k)
        assert words[words.index("--nnodes") + 1] == str(len(commands))
        launcher = words[1 : words.index(entry_name)]
        stray = [w for i, w in enumerate(launcher) if not w.startswith("-") and (i == 0 or not launcher[i - 1].startswith("-"))]
        assert not stray, (stray, line)  # every word of torchrun's options is an option or its value
    assert not rec.exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mixtral_8x7b_distributed.sh", "case_loop_options.sh"])
def test_flagscale_yaml_keeps_the_users_flags(name, workdir):
    """With --runtime flagscale the train YAML holds every flag of the user's command that the
    plan does not decide, with its value (FlagScale turns the keys back into flags)."""
    c = entry(name)
    out = solved(name, "flagscale")
    script = read_launcher_script(CORPUS_DIR / name, args=c["args"])
    train = yaml.safe_load((out / "launch" / "flagscale" / "conf" / "train" / "hapmoe.yaml").read_text())
    flat: dict[str, object] = {}

    def walk(node: dict) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value)
            else:
                flat["--" + key.replace("_", "-")] = value

    walk(train)
    args_items = {i.name: i.values for i in group_flag_items(shlex.split((out / "launch" / "megatron_args.txt").read_text()))}
    for item in group_flag_items(script.megatron_flags):
        if item.name in PLAN_DECIDED_FLAGS or item.name in ("--bf16",) and "--fp8-format" in args_items:
            continue
        assert item.name in flat, item.name
        value = flat[item.name]
        if item.values:
            assert [str(v) for v in (value if isinstance(value, list) else [value])] == item.values or \
                args_items[item.name] == item.values
        else:
            assert value is True


# Programs that touch the cluster, the files or the network: under `launch.sh --dry-run` none may run.
_SIDE_EFFECTS = ("srun", "mpirun", "mpiexec", "sbatch", "mkdir", "python", "python3", "torchrun", "rm", "cp", "mv",
                 "tee", "ssh", "curl", "wget", "pip", "uv")


@pytest.fixture(scope="module")
def recording_bin(tmp_path_factory) -> Path:
    """Stubs that only record that they were called (program and arguments, one line each)."""
    bindir = tmp_path_factory.mktemp("recording") / "bin"
    bindir.mkdir()
    for prog in _SIDE_EFFECTS:
        (bindir / prog).write_text('#!/bin/bash\necho "$(basename "$0") $*" >> "$HAPMOE_CALLS"\n')
        (bindir / prog).chmod(0o755)
    (bindir / "scontrol").write_text("#!/bin/bash\necho node0\n")  # read-only: allowed
    (bindir / "scontrol").chmod(0o755)
    return bindir


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_dry_run_of_every_corpus_launcher_runs_nothing(name, recording_bin, tmp_path):
    """`launch.sh --dry-run ARGS` on every corpus script: no srun, mpirun, mkdir, python, torchrun, ...
    runs (stubs on PATH record any call), yet the commands are printed (every node's, or the scheduler's)."""
    c = entry(name)
    out = solved(name)
    calls = tmp_path / "calls"
    for f in c.get("needs_files", ()):
        (tmp_path / f).write_text("")
    env = {"PATH": f"{recording_bin}:{os.environ['PATH']}", "HOME": str(tmp_path), "HAPMOE_CALLS": str(calls),
           **c.get("env", {})}
    proc = subprocess.run(["bash", str(out / "launch" / "launch.sh"), "--dry-run", *c["args"]], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not calls.exists(), calls.read_text()
    script = read_launcher_script(CORPUS_DIR / name, args=c["args"])
    entry_name = script.entry_script.rsplit("/", 1)[-1]
    assert any(entry_name in line for line in proc.stdout.splitlines()), proc.stdout + proc.stderr


def test_solve_out_refuses_what_flagscale_refuses_before_searching(tmp_path, monkeypatch):
    """A script FlagScale's fork cannot take whatever the plan (here --rampup-batch-size with --train-iters) is
    refused by `solve --out --runtime flagscale` before the search, which ran its whole time limit first: exit 2,
    the reason and what would help, and no --out directory."""
    import planner.commands.solve as solve_command
    from click.testing import CliRunner

    from cli import main

    def no_search(*args, **kwargs):
        raise AssertionError("the search ran")

    monkeypatch.setattr(solve_command, "solve", no_search)
    c = entry("gpt3_175b_distributed.sh")
    out = tmp_path / "plan"
    res = CliRunner().invoke(main, ["solve", "--megatron-script", str(CORPUS_DIR / c["script"]), "--cluster",
                                    c["cluster"], "--runtime", "flagscale", "--quiet", "--out", str(out), "--",
                                    *c["args"]])
    assert res.exit_code == 2, res.output
    assert "refuses --rampup-batch-size with --train-iters" in res.output and "--train-samples" in res.output
    assert not out.exists()
