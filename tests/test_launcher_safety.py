"""Issue 33, items 1-3: what the user runs is what was priced, and no input can subvert it.

  * Every value from the input (model name, device type, host names, flag values, the script's file name,
    its entry script, its arguments, the flags given on top of it) reaches launch.sh, megatron_args.txt and
    FlagScale's files through one quoting function (planner/launcher/quoting.py): a property test puts
    hostile strings in each field and checks that every file parses, that `launch.sh --dry-run` creates
    nothing and runs nothing injected, and that the values it prints (and passes, under a stub torchrun)
    are the input values.  A device type (and a model name read from a file) with a control character is refused
    at input (planner/schemas/types.py DisplayText; tests/test_hardening.py), so device types here have none; the
    model name, set on the run directly, keeps them (the launcher escapes them all the same).
  * Run-time references in --megatron-args (`${DATA_DIR}`) stay references that launch.sh expands and checks;
    `$(...)` and backquotes there are refused.
  * `launch.sh --dry-run` of a Pai-Megatron-Patch style script (GPU count from python, `xargs cp`, eval)
    copies nothing and prints the plan's node count.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from cli import main
from planner.errors import PlannerInputError
from planner.inputs.hosts import Host
from planner.inputs.megatron_flags import parse_megatron_flags
from planner.inputs.resolve import resolve_run
from planner.inputs.script import parse_launcher_script
from planner.launcher import render_launch_files
from planner.launcher.common import host_file_type
from planner.launcher.quoting import RUNTIME_REF
from planner.profile_tables import ProfileSet, name_key
from planner.schemas import ClusterSpec, NodeGroup, Plan, StagePlan
from planner.schemas.types import CONTROL_CHARACTER
from tools.fuzz.inputs import TINY_FLAGS, TINY_MODEL

from helpers.corpus import CORPUS_DIR, entry

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

ROOT = Path(__file__).resolve().parents[1]
FLAGSCALE_ENTRY = "flagscale/train/train_gpt.py"

# Pieces of hostile text: each one would run a command, end a line, split a word or change a pattern if it
# reached the shell unquoted (a `PWNED` file in the working directory is the canary).
PIECES = ("\n", "\r", "\t", " ", "$(touch PWNED)", "`touch PWNED`", "'", '"', "$'\\n'", "\\", "é", "模型", "-",
          "--x", "#", ";", "&", "|", ">PWNED", "<", "*", "?", "[ab]", "~", "!", "$HOME", "{a,b}", "%q", "\x1b",
          "\u2028", "=", "${HOME}", "; touch PWNED #")


def hostile(extra: str = "", *, controls: bool = True) -> st.SearchStrategy[str]:
    """Hostile text; `controls=False`: without control characters (CONTROL_CHARACTER), as a field the input refuses
    them in (a device type, planner/schemas/types.py DisplayText) can only be."""
    pieces = PIECES if controls else tuple(p for p in PIECES if not CONTROL_CHARACTER.search(p))
    chars = st.characters(exclude_characters="\x00/" + extra,
                          **({} if controls else {"exclude_categories": ("Cc", "Cs", "Zl", "Zp")}))
    return st.lists(st.one_of(st.sampled_from(pieces), st.text(chars, max_size=3)), min_size=1, max_size=4).map("".join)


KNOWN_KEYS = {name_key(n) for n in ProfileSet.load().names()}
device_types = hostile("+", controls=False).filter(lambda t: name_key(t) not in KNOWN_KEYS and name_key(t) != "")
# a flag's value: what bash passes (not blank, not an option itself); `${NAME}` is a reference (tested below)
flag_values = hostile().filter(lambda v: v.strip() and not v.startswith("-") and not RUNTIME_REF.search(v))
host_names = hostile().map(lambda h: "".join(h.split()) or "h")  # --hosts names are one word
entries = hostile().map(lambda e: e.lstrip("-") + ".py")


def profiles_with(device_type: str, where: Path) -> ProfileSet:
    """The shipped profiles plus one NVIDIA device named `device_type` (an L40S's numbers), as --profiles reads it."""
    raw = yaml.safe_load((ROOT / "profiles" / "devices" / "L40S.yaml").read_text())
    raw.update(name=device_type, aliases=[])
    (where / "devices").mkdir(parents=True)
    (where / "devices" / "odd.yaml").write_text(yaml.safe_dump(raw))
    return ProfileSet.load(extra_dirs=[str(where)])


SCRIPT = """#!/bin/bash
SAVE={save}
torchrun --nproc_per_node 8 --nnodes 1 {entry} {flags} \\
    --save "$SAVE" --load "$1"
"""


def dry_run_words(stdout: str, agents: list[tuple[str, str]]) -> list[list[str]]:
    """Each node's command from `launch.sh --dry-run` output, split as bash splits it: `# node K (HOST, TYPE)`,
    then the command as printf %q writes it (which bash reads back with eval)."""
    commands, pos = [], 0
    for k, (host, device_type) in enumerate(agents):
        header = f"# node {k} ({host}, {device_type})\n"
        assert stdout.startswith(header, pos), (header, stdout[pos : pos + 300])
        pos += len(header)
        end = stdout.index("\n", pos)
        split = subprocess.run(["bash", "-c", 'eval "set -- $1"; printf "%s\\0" "$@"', "_", stdout[pos:end]],
                               capture_output=True, timeout=30)
        commands.append(split.stdout.decode().split("\0")[:-1])
        pos = end + 1
    assert pos == len(stdout)
    return commands


def check_files(files: dict[str, str], out: Path, hosts: list[str], device_type: str) -> None:
    """Write the files; every shell file parses (bash -n), the YAML loads, the host file has one line per host."""
    for rel, text in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    for rel in files:
        if rel.endswith((".sh", ".txt")):
            proc = subprocess.run(["bash", "-n", str(out / rel)], capture_output=True, text=True, timeout=30)
            assert proc.returncode == 0, (rel, proc.stderr)
    lines = [ln.split() for ln in files["hostfile"].splitlines() if not ln.startswith("#")]
    assert [ln[0] for ln in lines] == hosts and all(ln[2] == "type=" + host_file_type(device_type) for ln in lines)
    assert name_key(host_file_type(device_type)) == name_key(device_type)  # --hosts reads the type back
    for rel in files:
        if rel.endswith(".yaml"):
            cfg = yaml.safe_load(files[rel])
            hetero = (cfg.get("system") or {}).get("hetero", {})
            if "hetero_device_types" in hetero:
                assert [t.replace("\\${", "${") for t in hetero["hetero_device_types"]] == [host_file_type(device_type)]


# derandomized (the same examples on every run), and no shrinking: a failure is reported as drawn (shrinking
# these inputs can take minutes, more than CI allows)
@settings(max_examples=14, deadline=None, derandomize=True, database=None, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(runtime=st.sampled_from(["megatron", "flagscale"]), with_script=st.booleans(), model_name=hostile(),
       device_type=device_types, host=host_names, save=flag_values, load=flag_values, tensorboard=flag_values,
       script_name=hostile(), entry_name=entries)
@example(runtime="megatron", with_script=False, model_name="tiny\ntouch PWNED", device_type="RTX 4090",
         host="h1", save="/ckpt/a\tb", load="x", tensorboard="$'..'", script_name="a", entry_name="pretrain_gpt.py")
@example(runtime="flagscale", with_script=True, model_name="m", device_type="XPU$(touch PWNED)", host="h$(touch${IFS}PWNED);`x`#",
         save="core_attn\necho>PWNED\n#", load="`touch PWNED`", tensorboard="'; touch PWNED; '",
         script_name="train\ntouch PWNED", entry_name="pretrain_gpt.py")
def test_no_input_value_runs_or_breaks_the_launcher(runtime, with_script, model_name, device_type, host, save, load,
                                                    tensorboard, script_name, entry_name):
    """Hostile strings in every field that reaches the output: every file parses, `launch.sh --dry-run` leaves
    its working directory empty (no `touch PWNED`, no `>PWNED`), and the values it prints, and the values a
    real launch passes to torchrun, are the input values exactly."""
    with tempfile.TemporaryDirectory() as tmp_text:
        tmp = Path(tmp_text)
        profiles = profiles_with(device_type, tmp / "profiles")
        hosts = [host + "1", host + "2"]
        if with_script:
            path = tmp / (script_name[:200] + ".sh")
            path.write_text(SCRIPT.format(save=shlex.quote(save), entry=shlex.quote(entry_name), flags=TINY_FLAGS))
            script = parse_launcher_script(path.read_text(), args=[load], path=str(path))
            script.extra_flags = ["--tensorboard-dir", tensorboard]  # --megatron-args given with the script
            run = parse_megatron_flags(script.megatron_flags + script.extra_flags)
        else:
            script = None
            run = parse_megatron_flags(shlex.split(TINY_FLAGS) + ["--save", save, "--load", load,
                                                                  "--tensorboard-dir", tensorboard])
        run = run.model_copy(update={"model": run.model.model_copy(update={"name": model_name})})
        plan = Plan(runtime=runtime, mbs=1, gbs=64, stages=tuple(StagePlan(device_type=device_type, num_layers=2, dp=8)
                                                                  for _ in range(2)))
        cluster = ClusterSpec(groups=(NodeGroup(device_type=device_type, num_nodes=2, gpus_per_node=8),))
        files = render_launch_files(run, plan, cluster, script, profiles=profiles,
                                    hosts=[Host(h, device_type, 8, k) for k, h in enumerate(hosts, 1)])
        out = tmp / "out"
        check_files(files, out, hosts, device_type)
        args_file = shlex.split(files["megatron_args.txt"])
        values = {"--save": save, "--load": load, "--tensorboard-dir": tensorboard}
        for flag, value in values.items():
            assert args_file[args_file.index(flag) + 1] == value

        cwd = tmp / "cwd"
        cwd.mkdir()
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "LC_ALL": "C.UTF-8"}
        proc = subprocess.run(["bash", str(out / "launch.sh"), "--dry-run", *([load] if with_script else [])], cwd=cwd,
                              env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert list(cwd.iterdir()) == []  # nothing created, nothing injected ran
        entry_word = FLAGSCALE_ENTRY if runtime == "flagscale" else (entry_name if with_script else "pretrain_gpt.py")
        for k, words in enumerate(dry_run_words(proc.stdout, [(h, device_type) for h in hosts])):
            assert words[0] == "torchrun" and words[words.index("--master-addr") + 1] == hosts[0]
            flags = words[words.index(entry_word) + 1:]
            if runtime == "flagscale":
                assert flags[-2:] == ["--hetero-current-device-type", host_file_type(device_type)]
                flags = flags[:-2]
            assert flags == args_file
            for flag, value in values.items():
                assert flags[flags.index(flag) + 1] == value

        bindir = tmp / "bin"  # a real launch of node 1, under a torchrun that records what it is given
        bindir.mkdir()
        (bindir / "torchrun").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$ARGV_OUT"\n')
        (bindir / "torchrun").chmod(0o755)
        env.update(PATH=f"{bindir}:{env['PATH']}", ARGV_OUT=str(tmp / "argv"), HAPMOE_NODE_RANK="1",
                   HAPMOE_SKIP_NODE_CHECK="1")
        proc = subprocess.run(["bash", str(out / "launch.sh"), *([load] if with_script else [])], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert list(cwd.iterdir()) == []
        argv = (tmp / "argv").read_bytes().decode().split("\0")[:-1]
        passed = argv[argv.index(entry_word) + 1:]
        assert passed[: len(args_file)] == args_file


# ---- the issue's cases through the command line -------------------------------------------------------------


def test_the_issues_injections_through_solve_and_emit_run_nothing(tmp_path):
    """A model YAML whose name holds a command, a device type `XPU$(...)` from --profiles, a launcher script whose
    file name holds a command, then `emit` of a plan.json whose inputs.script.path holds a newline and a command:
    every launch.sh parses, and its dry run creates nothing.  A name with a newline (the model's, or a script's
    file name the model's name comes from) is refused at input: exit 2, nothing written."""
    profiles = tmp_path / "prof"
    profiles_with("XPU$(touch PWNED)", profiles)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    common = ["--cluster", "XPU$(touch PWNED):8", "--profiles", str(profiles), "--backend", "hsdp", "--quiet",
              "--time-limit", "3"]  # a short limit: the plots are skipped (the launcher is what is tested)
    (tmp_path / "nl.yaml").write_text(yaml.safe_dump(dict(TINY_MODEL, name="tiny\ntouch PWNED")))
    newline_script = tmp_path / "train\ntouch PWNED.sh"
    newline_script.write_text(SCRIPT.format(save="/ckpt", entry="pretrain_gpt.py", flags=TINY_FLAGS))
    for refused_input, field in ((["--model", str(tmp_path / "nl.yaml")], "name"),
                                 (["--megatron-script", str(newline_script), "--", "/load"], "--megatron-script")):
        res = CliRunner().invoke(main, ["solve", *common, "--out", str(tmp_path / "x"), *refused_input])
        assert res.exit_code == 2 and field in res.output and "control characters" in res.output, res.output
        assert not (tmp_path / "x").exists() and list(cwd.iterdir()) == []
    model = dict(TINY_MODEL, name="tiny;touch PWNED`touch PWNED`$(touch PWNED)")
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(model))
    script = tmp_path / "train;touch PWNED$(touch PWNED).sh"
    script.write_text(SCRIPT.format(save="/ckpt", entry="pretrain_gpt.py", flags=TINY_FLAGS))
    res = CliRunner().invoke(main, ["solve", "--model", str(tmp_path / "m.yaml"), *common, "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["solve", "--megatron-script", str(script), *common, "--out", str(tmp_path / "b"),
                                    "--", "/load"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "b" / "plan.json").read_text())
    doc["inputs"]["script"]["path"] = "x\ntouch PWNED\n"
    (tmp_path / "edited.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(main, ["emit", "--plan", str(tmp_path / "edited.json"), "--profiles", str(profiles),
                                    "--out", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    for launch in (tmp_path / "a" / "launch" / "launch.sh", tmp_path / "b" / "launch" / "launch.sh",
                   tmp_path / "c" / "launch.sh"):
        assert subprocess.run(["bash", "-n", str(launch)], capture_output=True).returncode == 0
        proc = subprocess.run(["bash", str(launch), "--dry-run", "/load"], cwd=cwd, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "XPU$(touch PWNED)" in proc.stdout and list(cwd.iterdir()) == []
    assert "# This is x\\ntouch PWNED\\n with the plan applied" in (tmp_path / "c" / "launch.sh").read_text()


def test_a_device_type_with_a_space_works(tmp_path):
    """`RTX 4090` (a --profiles device): launch.sh parses, checks the node by that name, prints it; the host
    file writes it as one word (RTX_4090), which --hosts reads back."""
    profiles = profiles_with("RTX 4090", tmp_path / "prof")
    run = parse_megatron_flags(shlex.split(TINY_FLAGS))
    plan = Plan(mbs=1, gbs=64, stages=(StagePlan(device_type="RTX 4090", num_layers=4, dp=8),))
    cluster = ClusterSpec(groups=(NodeGroup(device_type="RTX 4090", num_nodes=1, gpus_per_node=8),))
    files = render_launch_files(run, plan, cluster, profiles=profiles)
    check_files(files, tmp_path / "out", ["rtx-4090-node0"], "RTX 4090")
    assert profiles.canonical_name("RTX_4090") == "RTX 4090"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text("#!/bin/bash\necho 'NVIDIA GeForce RTX 4090'\n")
    (bindir / "torchrun").write_text("#!/bin/bash\necho started\n")
    for tool in ("nvidia-smi", "torchrun"):
        (bindir / tool).chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "HAPMOE_NODE_RANK": "0"}
    proc = subprocess.run(["bash", str(tmp_path / "out" / "launch.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout == "started\n", proc.stderr  # the node check found an RTX 4090


# ---- run-time references in --megatron-args -----------------------------------------------------------------


def _launch_dir(tmp_path: Path, megatron_args: str, script: Path | None = None) -> Path:
    run = resolve_run(megatron_args=megatron_args) if script is None else \
        resolve_run(megatron_script=str(script), megatron_args=megatron_args)
    parsed = None
    if script is not None:
        parsed = parse_launcher_script(script.read_text(), path=str(script))
        parsed.extra_flags = ["--data-path", "${DATA_DIR}/x"]
    plan = Plan(mbs=1, gbs=64, stages=(StagePlan(device_type="H800", num_layers=4, dp=8),))
    cluster = ClusterSpec(groups=(NodeGroup(device_type="H800", num_nodes=1, gpus_per_node=8),))
    out = tmp_path / ("script" if script else "flags")
    for rel, text in render_launch_files(run, plan, cluster, parsed).items():
        out.mkdir(exist_ok=True)
        (out / rel).write_text(text)
    return out


@pytest.mark.parametrize("with_script", [False, True])
def test_a_variable_in_megatron_args_is_expanded_by_launch_sh(tmp_path, with_script):
    """`--megatron-args "... --data-path ${DATA_DIR}/x"` (the user's variable): launch.sh parses, megatron_args.txt
    writes it as a reference ("${DATA_DIR}"/x), launch.sh stops naming DATA_DIR when it is unset and passes the
    expanded path when it is set; with a script, the script's own assignment counts."""
    script = None
    if with_script:
        script = tmp_path / "train.sh"
        script.write_text(SCRIPT.format(save="/ckpt", entry="pretrain_gpt.py", flags=TINY_FLAGS))
    out = _launch_dir(tmp_path, ("" if with_script else TINY_FLAGS) + " --data-path ${DATA_DIR}/x", script)
    assert subprocess.run(["bash", "-n", str(out / "launch.sh")]).returncode == 0
    assert '--data-path "${DATA_DIR}"/x' in (out / "megatron_args.txt").read_text().splitlines()
    launch = ["bash", str(out / "launch.sh"), "--dry-run", "/load"]
    unset = subprocess.run(launch, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert unset.returncode == 2 and "launch.sh: set DATA_DIR: the flags refer to ${DATA_DIR}" in unset.stderr
    given = subprocess.run(launch, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "DATA_DIR": "/my data"})
    assert given.returncode == 0, given.stderr
    command = shlex.split(given.stdout.splitlines()[1])
    assert command[command.index("--data-path") + 1] == "/my data/x"


@pytest.mark.parametrize("args, message", [
    ("--data-path $(touch PWNED)", "command substitution is never run"),
    ("--data-path `touch PWNED`", "command substitution is never run"),
    ('--data-path "$(touch PWNED)"', "command substitution is never run"),
    ("--data-path ${DATA:-/d}", "only $NAME and ${NAME} stay references"),
    ("--data-path $1", "only $NAME and ${NAME} stay references"),
    ("--data-path '$DATA'", "quoted or escaped `$` before a name"),
])
def test_megatron_args_refuse_what_would_run_or_be_misread(tmp_path, args, message):
    """`$(...)` and backquotes in --megatron-args are refused (exit 2, the flag named), never run; so are
    expansions with no value here and a quoted `$NAME` that everything after would read as a variable."""
    res = CliRunner().invoke(main, ["estimate", "--megatron-args", TINY_FLAGS + " " + args, "--cluster", "H800:8"])
    assert res.exit_code == 2 and "--megatron-args" in res.output and message in res.output, res.output
    assert "Traceback" not in res.output and not Path("PWNED").exists()


def test_megatron_args_read_values_as_bash_passes_them():
    """ANSI-C quoting, double quotes and escapes in --megatron-args give what bash would pass."""
    run = resolve_run(megatron_args=TINY_FLAGS + " --save $'/ckpt/a\\tb' --load \"/x y\" --tensorboard-dir a\\ b")
    got = dict(zip(run.passthrough[::2], run.passthrough[1::2]))
    assert got["--save"] == "/ckpt/a\tb" and got["--load"] == "/x y" and got["--tensorboard-dir"] == "a b"
    with pytest.raises(PlannerInputError, match="unterminated"):
        resolve_run(megatron_args=TINY_FLAGS + " --save $'/ckpt")


# ---- a dry run with no side effects --------------------------------------------------------------------------


def test_pai_style_dry_run_copies_nothing_and_prints_the_plans_node_count(tmp_path):
    """Pai-Megatron-Patch's qwen3 script (tests/launchers/pai_megatron_patch_qwen3.sh) asks python for the GPU
    count, makes its output directories and copies the checkpoint's JSON files with `find | xargs cp` before
    `eval` runs torchrun.  Its dry run copies nothing, makes nothing, and prints --nnodes 2 for the plan's two
    nodes, with nothing stray in torchrun's options."""
    c = entry("pai_megatron_patch_qwen3.sh")
    path = CORPUS_DIR / "pai_megatron_patch_qwen3.sh"
    script = parse_launcher_script(path.read_text(), args=c["args"], path=str(path))
    run = parse_megatron_flags(script.megatron_flags)
    plan = Plan(ep=8, mbs=1, gbs=64, stages=tuple(StagePlan(device_type="H800", num_layers=24, dp=8) for _ in range(2)))
    cluster = ClusterSpec(groups=(NodeGroup(device_type="H800", num_nodes=2, gpus_per_node=8),))
    out = tmp_path / "out"
    out.mkdir()
    for rel, text in render_launch_files(run, plan, cluster, script).items():
        (out / rel).write_text(text)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "config.json").write_text("{}")  # the checkpoint directory is `.`: its JSON files would be copied
    bindir = tmp_path / "bin"  # a cp that could be reached would leave a trace
    bindir.mkdir()
    (bindir / "cp").write_text(f"#!/bin/bash\ntouch {shlex.quote(str(tmp_path / 'CP_RAN'))}\n")
    (bindir / "cp").chmod(0o755)
    proc = subprocess.run(["bash", str(out / "launch.sh"), "--dry-run", *c["args"]], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in cwd.iterdir()) == ["config.json"] and not (tmp_path / "CP_RAN").exists()
    assert "[dry-run, not run] xargs -0 cp -t ./out/checkpoint/" in proc.stderr
    assert "[dry-run, not run] mkdir -p ./out/tensorboard/" in proc.stderr
    lines = proc.stdout.splitlines()  # the script echoes its command first; then each node's, after `# node K`
    commands = [shlex.split(lines[k + 1]) for k, ln in enumerate(lines) if ln.startswith("# node ")]
    assert len(commands) == 2
    for k, words in enumerate(commands):
        launcher = words[1 : words.index("pretrain_qwen.py")]
        assert launcher[launcher.index("--nnodes") + 1] == "2" and launcher[launcher.index("--node-rank") + 1] == str(k)
        assert launcher[launcher.index("--nproc-per-node") + 1] == "8"
        assert all(w.startswith("-") or launcher[i - 1].startswith("-") for i, w in enumerate(launcher) if i), launcher


def _tiny_launch(script: Path, out: Path) -> Path:
    """The launcher files of one 4-layer stage of DP 8 on one H800 node for `script`, written into `out`."""
    run = resolve_run(megatron_script=str(script))
    plan = Plan(mbs=1, gbs=64, stages=(StagePlan(device_type="H800", num_layers=4, dp=8),))
    cluster = ClusterSpec(groups=(NodeGroup(device_type="H800", num_nodes=1, gpus_per_node=8),))
    out.mkdir()
    parsed = parse_launcher_script(script.read_text(), path=str(script))
    for rel, text in render_launch_files(run, plan, cluster, parsed).items():
        (out / rel).write_text(text)
    return out


PRICED_SCRIPT = """#!/bin/bash
MORE=$(cat "$(dirname "$0")/more_args.txt" 2>/dev/null)
torchrun --nproc_per_node 8 pretrain_gpt.py {flags} --global-batch-size ${{GBS:-64}} --seq-length ${{SEQ:-1024}} \\
    --tensor-model-parallel-size ${{TP:-1}} $MORE
"""


def test_launch_sh_stops_when_the_run_passes_flags_other_than_those_priced(tmp_path):
    """The planner reads a script without the environment it runs in: `${GBS:-64}` at its default, `$(cat FILE)` not
    at all.  A run that passes another global batch or sequence, or a priced switch the planner never saw (--fp16 from
    the file), was not priced, and launch.sh would replace the batch with the plan's without a word: it stops (exit
    2) naming each flag and the value priced, unless HAPMOE_ALLOW_UNPRICED=1.  A decided flag (TP) the plan replaces
    anyway is not in the way; the run the planner read starts."""
    flags = TINY_FLAGS.replace(" --global-batch-size 64", "").replace(" --seq-length 1024", "")
    script = tmp_path / "train.sh"
    script.write_text(PRICED_SCRIPT.format(flags=flags))
    out = _tiny_launch(script, tmp_path / "launch")

    def dry(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(out / "launch.sh"), "--dry-run"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, env={**os.environ, **env})

    as_read = dry(TP="2")
    assert as_read.returncode == 0 and "--global-batch-size 64" in as_read.stdout, as_read.stderr
    changed = dry(GBS="512", SEQ="2048")
    assert changed.returncode == 2 and not changed.stdout, changed.stdout
    assert "--global-batch-size 512 (priced: --global-batch-size 64)" in changed.stderr, changed.stderr
    assert "--seq-length 2048 (priced: --seq-length 1024)" in changed.stderr
    (out / "more_args.txt").write_text("--fp16 --global-batch-size 128\n")
    from_file = dry()
    assert from_file.returncode == 2 and "--fp16 (priced without it)" in from_file.stderr, from_file.stderr
    assert "--global-batch-size 128 (priced: --global-batch-size 64)" in from_file.stderr
    anyway = dry(HAPMOE_ALLOW_UNPRICED="1")
    assert anyway.returncode == 0 and "--fp16" in anyway.stdout and "--global-batch-size 64" in anyway.stdout


def test_dry_run_prints_the_command_of_a_launch_whose_output_the_script_redirects(tmp_path):
    """`nohup torchrun ... > train.log 2>&1 &` (and `2>&1 > log`): `launch.sh --dry-run` prints each node's command and
    what it did not run where launch.sh's own output goes, not into the script's log (it printed nothing: the
    command went to train.log).  The redirection itself still creates the (empty) log, as docs/running.md says."""
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\nmkdir -p logs > /dev/null 2>&1\nnohup torchrun --nproc_per_node 8 pretrain_gpt.py "
                      f"{TINY_FLAGS} > logs/train.log 2>&1 &\nwait\n")
    out = _tiny_launch(script, tmp_path / "launch")
    cwd = tmp_path / "cwd"
    (cwd / "logs").mkdir(parents=True)
    proc = subprocess.run(["bash", str(out / "launch.sh"), "--dry-run"], cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# node 0 (h800-node0, H800)\nnohup torchrun ") and "--global-batch-size 64" in proc.stdout
    assert "[dry-run, not run] mkdir -p logs" in proc.stderr
    assert (cwd / "logs" / "train.log").read_text() == ""
