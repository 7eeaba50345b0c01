"""Issue 23, item 1: the user's files are sacred.  Output directories carry a manifest of what the
planner wrote (planner/output/manifest.py); nothing else there is overwritten or deleted, with or
without --force; the input script is never a write target; a signal leaves no staging directory and
the directory either as it was or complete.  Each example of the issue is a test here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cli import refused, run, tree
from planner.cli_group import signals_raise_interrupted
from planner.errors import Interrupted, PlannerInputError
from planner.output import run_dir
from planner.output.manifest import MANIFEST_NAME, survey
from planner.output.run_dir import LAUNCHER_OUTPUT, PLAN_OUTPUT, StagedOutput, check_out_dir, write_files
from tools.fuzz.inputs import SCRIPT

ROOT = Path(__file__).resolve().parents[1]


CLUSTER = "H800:2"
"""The solves here only need a plan to write: on two GPUs the tiny model's search certifies in a fraction of a
second (on H800:8 it took 3 s of CPU, and 5 s, the time limit, on a loaded 2-core machine)."""


def solve_args(model: Path, *extra: str) -> list[str]:
    return ["solve", "--model", str(model), "--cluster", CLUSTER, "--quiet", "--time-limit", "5", *extra]


def no_staging_left(*dirs: Path) -> bool:
    return not [p for d in dirs if d.is_dir() for p in d.iterdir() if p.name.startswith(".hapmoe-")]


# ---- the data-loss examples ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["same path", "relative path", "through a symlink", "with --force"])
def test_emit_never_writes_over_the_input_script(tmp_path, how):
    """`solve --megatron-script scripts/launch.sh --out plan/`, then `emit --plan plan/plan.json --out scripts/
    --megatron-script scripts/launch.sh` overwrote the user's script (issue 23); now it is refused and the
    script is byte for byte the same, however the path is spelled."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    script = scripts / "launch.sh"
    script.write_text(SCRIPT.format(extra="", layers="4"))
    original = script.read_bytes()
    assert run(["solve", "--megatron-script", str(script), "--cluster", CLUSTER, "--quiet", "--time-limit", "5",
                "--out", str(tmp_path / "plan")]).exit_code == 0
    given = {"same path": str(script), "relative path": "scripts/../scripts/launch.sh",
             "through a symlink": str(tmp_path / "link.sh"), "with --force": str(script)}[how]
    if how == "through a symlink":
        (tmp_path / "link.sh").symlink_to(script)
    args = ["emit", "--plan", str(tmp_path / "plan" / "plan.json"), "--out", "scripts", "--megatron-script", given]
    line = refused(run(args + (["--force"] if how == "with --force" else []), cwd=tmp_path), "--out")
    assert "launch.sh" in line
    assert script.read_bytes() == original and sorted(p.name for p in scripts.iterdir()) == ["launch.sh"]
    # the script plan.json saved is the input too: emitting it into its own directory is refused as well
    refused(run(["emit", "--plan", str(tmp_path / "plan" / "plan.json"), "--out", str(scripts), "--force"]), "--out")
    assert script.read_bytes() == original


def test_solve_out_is_no_earlier_plan_without_the_manifest(tmp_path, tiny):
    """A directory with the user's summary.md, plots/ and notes.txt was taken for an earlier plan: summary.md
    overwritten, plots/ deleted, exit 0 (issue 23).  Without the planner's manifest it is the user's."""
    out = tmp_path / "mine"
    (out / "plots").mkdir(parents=True)
    (out / "summary.md").write_text("my summary")
    (out / "plots" / "loss.png").write_bytes(b"\x89PNG my plot")
    (out / "notes.txt").write_text("my notes")
    before = tree(out)
    for extra in ([], ["--force"]):  # summary.md would be overwritten: refused, --force or not
        assert "summary.md was not written by the planner" in refused(run(solve_args(tiny, "--out", str(out), *extra)),
                                                                      "--out")
    assert tree(out) == before and no_staging_left(tmp_path)
    # --force beside the user's files, none of which it writes: accepted, every one of them kept
    (out / "summary.md").rename(tmp_path / "summary.md")
    before = tree(out)
    assert "non-empty" in refused(run(solve_args(tiny, "--out", str(out))), "--out")
    assert run(solve_args(tiny, "--out", str(out), "--force")).exit_code == 0
    after = tree(out)
    assert {k: v for k, v in after.items() if k in before} == before
    assert "plan.json" in after and MANIFEST_NAME in after


def test_an_earlier_plan_is_replaced_and_the_users_files_beside_it_stay(tmp_path, tiny):
    out = tmp_path / "plan"
    assert run(solve_args(tiny, "--out", str(out))).exit_code == 0
    found = survey(out)
    assert found.family == "plan" and not found.others and not found.changed
    (out / "notes.txt").write_text("mine")
    (out / "plots" / "mine.png").write_bytes(b"mine")
    assert run(solve_args(tiny, "--out", str(out), "--mbs", "2")).exit_code == 0  # no --force needed
    assert (out / "notes.txt").read_text() == "mine" and (out / "plots" / "mine.png").read_bytes() == b"mine"
    assert json.loads((out / "plan.json").read_text())["plan"]["mbs"] == 2
    # a file of the earlier plan the user edited is theirs now: never overwritten, --force neither
    (out / "summary.md").write_text("my edits")
    for extra in ([], ["--force"]):
        assert "changed after the planner wrote it" in refused(run(solve_args(tiny, "--out", str(out), *extra)), "--out")
    assert (out / "summary.md").read_text() == "my edits"


@pytest.mark.parametrize("where", ["plotdir", "default"])
def test_estimate_plot_never_overwrites_the_users_pictures(tmp_path, tiny, where):
    """`estimate --plot DIR`, and the default ./plots, overwrote the user's PNGs and summary.md (issue 23)."""
    plots = tmp_path / ("plots" if where == "default" else "plotdir")
    plots.mkdir()
    (plots / "memory.png").write_bytes(b"\x89PNG mine")
    (plots / "summary.md").write_text("mine")
    before = tree(plots)
    args = ["estimate", "--model", str(tiny), "--cluster", "H800:8", "--plot"] + ([] if where == "default" else [str(plots)])
    refused(run(args, cwd=tmp_path), "--plot")
    assert tree(plots) == before and no_staging_left(tmp_path)
    # a new directory, then the same command again: the earlier pictures are replaced
    fresh = tmp_path / "fresh"
    for _ in range(2):
        assert run(["estimate", "--model", str(tiny), "--cluster", "H800:8", "--plot", str(fresh)]).exit_code == 0
    assert survey(fresh).family == "plots" and (fresh / "placement.json").is_file()


def test_a_dangling_out_symlink_is_refused_before_the_search(tmp_path, tiny, monkeypatch):
    """It was refused only after the search (issue 23)."""
    (tmp_path / "out").symlink_to(tmp_path / "nowhere")
    monkeypatch.setattr("planner.commands.solve.load_inputs",
                        lambda **kw: pytest.fail("the inputs were read before --out was checked"))
    assert "does not exist" in refused(run(solve_args(tiny, "--out", str(tmp_path / "out"))), "--out")
    assert not (tmp_path / "nowhere").exists()


def test_bench_and_profile_out_follow_the_same_rules(tmp_path):
    foreign = tmp_path / "results"
    foreign.mkdir()
    (foreign / "results.csv").write_text("mine")
    refused(run(["bench", "--quick", "--scenario", "mixtral", "--out", str(foreign)]), "--out")
    refused(run(["bench", "--quick", "--scenario", "mixtral", "--out", str(foreign), "--force"]), "--out")
    (foreign / "results.csv").unlink()
    (foreign / "profile_report.json").write_text("mine")
    refused(run(["profile", "--model", "mixtral-s", "--device", "cpu", "--quick", "--out", str(foreign)]), "--out")
    assert (foreign / "profile_report.json").read_text() == "mine"


# ---- the staged writer ------------------------------------------------------------------------------


def test_force_never_deletes_what_the_planner_did_not_write(tmp_path):
    out = tmp_path / "launch"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "flagscale").mkdir()
    (out / "flagscale" / "my.yaml").write_text("mine")
    first = write_files(out, {"launch.sh": "a", "hostfile": "b", "flagscale/plan.yaml": "c"}, "--out",
                        LAUNCHER_OUTPUT, force=True)
    assert len(first) == 3
    # the next output has no flagscale/plan.yaml: the planner's own stale file goes, the user's stay
    write_files(out, {"launch.sh": "a2", "hostfile": "b2"}, "--out", LAUNCHER_OUTPUT)
    assert not (out / "flagscale" / "plan.yaml").exists()
    assert (out / "flagscale" / "my.yaml").read_text() == "mine" and (out / "notes.txt").read_text() == "mine"
    assert (out / "launch.sh").read_text() == "a2"
    listed = {e["path"] for e in json.loads((out / MANIFEST_NAME).read_text())["files"]}
    assert listed == {"launch.sh", "hostfile"}


def test_another_commands_output_or_a_garbled_manifest_is_not_an_earlier_output(tmp_path):
    out = tmp_path / "d"
    write_files(out, {"launch.sh": "a"}, "--out", LAUNCHER_OUTPUT)
    with pytest.raises(PlannerInputError, match="launcher files, not a plan"):
        check_out_dir(out, "--out", PLAN_OUTPUT)
    (out / MANIFEST_NAME).write_text("{garbled")  # unreadable: launch.sh is no longer known to be the planner's
    with pytest.raises(PlannerInputError, match="launch.sh was not written by the planner"):
        check_out_dir(out, "--out", LAUNCHER_OUTPUT)
    with pytest.raises(PlannerInputError, match="not written by the planner"):  # --force neither
        write_files(out, {"launch.sh": "b"}, "--out", LAUNCHER_OUTPUT, force=True)
    assert (out / "launch.sh").read_text() == "a"


def test_an_interrupted_staging_leaves_nothing_behind(tmp_path):
    out = tmp_path / "out"
    write_files(out, {"launch.sh": "old"}, "--out", LAUNCHER_OUTPUT)
    before = tree(out)
    with pytest.raises(Interrupted):
        with StagedOutput(out, "--out", LAUNCHER_OUTPUT) as tmp:
            (tmp / "launch.sh").write_text("half")
            raise Interrupted(signal.SIGTERM)
    assert tree(out) == before and no_staging_left(tmp_path, out)


def test_a_signal_while_files_are_moved_waits_until_the_output_is_complete(tmp_path, monkeypatch):
    """SIGTERM arriving in the middle of the moves is held: the directory ends complete (its manifest
    verifies), then the signal is delivered."""
    out = tmp_path / "out"
    write_files(out, {"launch.sh": "old", "hostfile": "old"}, "--out", LAUNCHER_OUTPUT)
    real = run_dir._make_parents

    def signal_midway(o, rel):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(o, rel)

    monkeypatch.setattr(run_dir, "_make_parents", signal_midway)
    with signals_raise_interrupted(), pytest.raises(Interrupted):
        write_files(out, {"launch.sh": "new", "hostfile": "new"}, "--out", LAUNCHER_OUTPUT)
    found = survey(out)
    assert (out / "launch.sh").read_text() == "new" and set(found.listed) == found.ours == {"launch.sh", "hostfile"}
    assert no_staging_left(tmp_path, out)


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_solve_interrupted_exits_128_plus_the_signal_and_leaves_no_staging(tmp_path, signum, code):
    """SIGTERM or Ctrl-C during `solve --out` left a hidden .hapmoe-* directory and the process died by
    the signal (issue 23).  Sent 6 s into a search of a minute (or while it still imports, on a loaded
    machine: the exit status is the same)."""
    out = tmp_path / "plan"
    proc = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "solve", "--model", "qwen3-235b-a22b", "--cluster",
                             "H800:1024,MI300X:1024,910B:1024", "--time-limit", "60", "--out", str(out)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)
    assert proc.poll() is None
    proc.send_signal(signum)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "interrupted by" in err and "Traceback" not in err
    assert not out.exists() and no_staging_left(tmp_path)



def test_a_signal_inside_a_librarys_import_exits_as_interrupted(capsys):
    """Ctrl-C while a command still loads its libraries (a loaded machine, fuzz seed 20261208 case 847): the
    Interrupted raised inside a C extension's initialization reached the CLI as "ImportError: initialization
    failed", a traceback.  It now exits as the signal (130), one line on stderr."""
    from planner.cli_group import OneLineErrorsGroup
    from planner.signals import deliver

    group = OneLineErrorsGroup()

    @group.command("load")
    def load() -> None:
        try:
            deliver(signal.SIGINT)  # what the handler does when the signal arrives mid-import
        except Interrupted:
            raise ImportError("initialization failed") from None

    @group.command("broken")
    def broken() -> None:
        raise ImportError("a genuine import error")

    with pytest.raises(SystemExit) as done:
        group.main(["load"], prog_name="cli.py")
    assert done.value.code == 130 and "interrupted by SIGINT" in capsys.readouterr().err
    with pytest.raises(ImportError, match="genuine"):  # no signal: the error is the error
        group.main(["broken"], prog_name="cli.py")


def test_an_interrupted_solve_names_the_best_plan_it_had_found(tmp_path):
    """Ctrl-C during a search printed only "interrupted by SIGINT": what the search had found was lost.  Once
    the live progress shows a best plan (stderr a terminal), SIGINT still exits 130 with nothing written and the
    --json stdout empty, and a second line on stderr names that plan (its time and degrees), says it was not
    written and how --time-limit returns the best plan within a time."""
    import pty
    import select

    out = tmp_path / "plan"
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "solve", "--model", "qwen3-30b-a3b", "--cluster",
                             "H800:32,MI300X:32", "--time-limit", "60", "--json", "--out", str(out)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=child, text=True,
                            env={**os.environ, "COLUMNS": "200"})  # the bar's best plan is never cut off
    os.close(child)
    seen, deadline = b"", time.monotonic() + 60
    while b"best " not in seen and time.monotonic() < deadline and proc.poll() is None:
        if select.select([main], [], [], 0.2)[0]:
            seen += os.read(main, 65536)
    assert proc.poll() is None, seen.decode(errors="replace")  # the search is still on: interrupt it
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=60)
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal's other end is closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    err = seen.decode(errors="replace")
    assert proc.returncode == 130, err
    lines = [ln.strip() for ln in err.splitlines() if "not written" in ln]
    assert len(lines) == 1 and lines[0].startswith("best plan found so far, not written: TP"), err
    assert "s per iteration" in lines[0] and "--time-limit N" in lines[0] and "HAPMOE_TIME_LIMIT" in lines[0]
    assert "interrupted by SIGINT" in err and "Traceback" not in err
    assert stdout == "" and not out.exists() and no_staging_left(tmp_path)


def test_the_best_plan_of_an_interrupted_solve_is_kept_under_quiet():
    """--quiet prints no progress, yet the display keeps the search's best plan for the interrupted solve's line
    (which is about the result, not the progress)."""
    from planner.commands.solve import interrupted_line
    from planner.progress import ProgressDisplay
    from planner.schemas.plan import Plan, Recompute, StagePlan
    from planner.search.settings import ProgressEvent

    stages = tuple(StagePlan(device_type="H800", num_layers=2, dp=2, recompute=Recompute.none()) for _ in range(2))
    plan = Plan(runtime="megatron", tp=1, cp=1, ep=1, etp=1, vpp=1, mbs=1, gbs=8, stages=stages)
    with ProgressDisplay(quiet=True) as progress:
        assert interrupted_line(progress, "nominal") is None  # no plan yet: no line
        progress(ProgressEvent(done=1, total=9, solved=1, elapsed_s=1.0, best_s=2.5, bound_s=None, phase="searching",
                               best_plan=plan))
    line = interrupted_line(progress, "nominal")
    assert line is not None and "not written: TP1 PP2 CP1 EP1 ETP1 DP2 VPP1 mbs1 " in line
    assert "nominal time 2.500 s per iteration" in line

# ---- output where users write (issue 33) --------------------------------------------------------------


def manifest_writers(out: Path) -> dict[str, str]:
    found = survey(out)
    assert found.ours == set(found.listed), (found.changed, found.listed)  # every listed file verifies
    return {rel: found.writer_of(rel) for rel in found.listed}


def test_emit_into_the_launch_directory_solve_wrote_and_solve_again(tmp_path, tiny):
    """The README's workflow was refused ("launch.sh belongs to the planner's output ..."): `solve --out P`,
    `emit --plan P/plan.json --out P/launch`; and `emit --out P` then `solve --out P` again was
    refused ("holds no earlier plan").  Now each works without --force (walk53b #3: the launcher files solve
    wrote into P/launch are emit's earlier output), P's manifest records who wrote what, and a file the user
    edited is still never overwritten."""
    plan = tmp_path / "plans" / "tiny"
    assert run(solve_args(tiny, "--out", str(plan))).exit_code == 0
    emit = ["emit", "--plan", str(plan / "plan.json"), "--out", str(plan / "launch")]
    res = run(emit)  # solve's launcher files: replaced, as docs/running.md writes it (no --force)
    assert res.exit_code == 0, res.output
    assert run(emit + ["--force"]).exit_code == 0  # --force changes nothing here
    assert run(emit).exit_code == 0
    assert not (plan / "launch" / MANIFEST_NAME).exists() and no_staging_left(plan, plan / "launch")
    writers = manifest_writers(plan)
    assert writers["launch/launch.sh"] == "emit --out" and writers["plan.json"] == "solve --out"
    emit_here = ["emit", "--plan", str(plan / "plan.json"), "--out", str(plan), "--force"]
    assert run(emit_here).exit_code == 0
    assert run(emit_here[:-1]).exit_code == 0  # no --force the second time
    assert run(solve_args(tiny, "--out", str(plan), "--mbs", "2")).exit_code == 0
    writers = manifest_writers(plan)
    assert survey(plan).family == "plan" and writers["launch.sh"] == "emit --out"
    assert writers["launch/launch.sh"] == "solve --out"
    assert json.loads((plan / "plan.json").read_text())["plan"]["mbs"] == 2
    (plan / "launch" / "launch.sh").write_text("# my edits\n")
    for extra in ([], ["--force"]):
        assert "changed after the planner wrote it" in refused(run(emit + extra), "--out")
        refused(run(solve_args(tiny, "--out", str(plan), *extra)), "--out")
    assert (plan / "launch" / "launch.sh").read_text() == "# my edits\n"


def test_emit_replaces_the_launcher_files_solve_wrote_and_keeps_the_users(tmp_path, tiny):
    """walk53b #3: `emit --plan S/plan.json --out S/launch` (docs/running.md) said S/launch "holds no earlier
    launcher files" though solve had written launch.sh, hostfile and megatron_args.txt there (S's manifest
    lists them).  Now emit replaces solve's launcher files (their stale slurm_hostfile.* included), keeps a
    file of the user's beside them, and an edited launcher file still stops it, --force or not."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("n0 H800 2\n")
    plan = tmp_path / "S"
    res = run(solve_args(tiny, "--out", str(plan), "--hosts", str(hosts)))
    assert res.exit_code == 0, res.output
    launch = plan / "launch"
    assert {"launch.sh", "hostfile", "megatron_args.txt", "slurm_hostfile.nodes"} <= {p.name for p in launch.iterdir()}
    (launch / "notes.txt").write_text("mine")
    res = run(["emit", "--plan", str(plan / "plan.json"), "--out", str(launch)])  # no --hosts this time
    assert res.exit_code == 0, res.output
    writers = manifest_writers(plan)
    assert {r: w for r, w in writers.items() if r.startswith("launch/")} == {
        f"launch/{n}": "emit --out" for n in ("launch.sh", "hostfile", "megatron_args.txt")}
    assert not (launch / "slurm_hostfile.nodes").exists() and (launch / "notes.txt").read_text() == "mine"
    assert "template" in (launch / "hostfile").read_text().lower()
    assert writers["plan.json"] == "solve --out" and survey(plan).family == "plan"
    (launch / "hostfile").write_text("n0 slots=8 type=H800\n")  # the user's now
    for extra in ([], ["--force"]):
        line = refused(run(["emit", "--plan", str(plan / "plan.json"), "--out", str(launch), *extra]), "--out")
        assert "hostfile was changed after the planner wrote it" in line
    assert (launch / "hostfile").read_text() == "n0 slots=8 type=H800\n"
    # solve's launcher files elsewhere in S are not emit's: writing into S itself still asks for --force
    assert "--force" in refused(run(["emit", "--plan", str(plan / "plan.json"), "--out", str(plan / "plots")]),
                                "--out")



def test_emit_into_the_solve_directory_itself_keeps_its_launch_directory(tmp_path, tiny):
    """walk55: `emit --plan S/plan.json --out S` (S, not S/launch) was taken without --force as a replacement of
    solve's launcher files: it deleted S/launch/ and wrote launch.sh beside plan.json, leaving summary.md and
    docs/running.md pointing at a launch/ that was gone.  S holds a plan, not launcher files: it asks for --force,
    and with it emit's files go beside solve's, whose launch/ stays as solve wrote it."""
    plan = tmp_path / "S"
    assert run(solve_args(tiny, "--out", str(plan))).exit_code == 0
    before = (plan / "launch" / "launch.sh").read_bytes()
    emit = ["emit", "--plan", str(plan / "plan.json"), "--out", str(plan)]
    assert "--force" in refused(run(emit), "--out")
    assert not (plan / "launch.sh").exists() and (plan / "launch" / "launch.sh").read_bytes() == before
    assert run(emit + ["--force"]).exit_code == 0
    writers = manifest_writers(plan)
    assert writers["launch.sh"] == "emit --out" and writers["launch/launch.sh"] == "solve --out"
    assert (plan / "launch" / "launch.sh").read_bytes() == before and no_staging_left(plan)

def test_solve_again_replaces_what_emit_wrote_into_its_launch_directory(tmp_path, tiny):
    """The reverse of the test above: after `emit --out S/launch --hosts` (Slurm host files beside launch.sh),
    `solve --out S` again without --hosts replaces emit's files as its own earlier output: no stale
    slurm_hostfile.* is left beside the new launch.sh, and a file of the user's stays."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("n0 H800 2\n")
    plan = tmp_path / "S"
    assert run(solve_args(tiny, "--out", str(plan))).exit_code == 0
    launch = plan / "launch"
    res = run(["emit", "--plan", str(plan / "plan.json"), "--out", str(launch), "--hosts", str(hosts)])
    assert res.exit_code == 0, res.output
    assert (launch / "slurm_hostfile.nodes").exists()
    (launch / "notes.txt").write_text("mine")
    res = run(solve_args(tiny, "--out", str(plan)))
    assert res.exit_code == 0, res.output
    assert not any(p.name.startswith("slurm_hostfile") for p in launch.iterdir())
    assert (launch / "notes.txt").read_text() == "mine" and (launch / "launch.sh").exists()
    assert {r: w for r, w in manifest_writers(plan).items() if r.startswith("launch/")} == {
        f"launch/{n}": "solve --out" for n in ("launch.sh", "hostfile", "megatron_args.txt")}


def test_solve_into_the_launch_directory_of_an_earlier_plan_is_refused(tmp_path, tiny):
    """`solve --out S/launch` (a typo for `emit --out S/launch`) took S's own launcher files in S/launch for an
    earlier output of solve: it deleted launch.sh, megatron_args.txt and hostfile and put a whole plan directory
    there.  S/launch is part of S's plan: refused before the search, naming `emit`, with nothing written or
    deleted; with --force the plan goes beside S's files, and every file of S stays as it was."""
    plan = tmp_path / "S"
    assert run(solve_args(tiny, "--out", str(plan))).exit_code == 0
    before = tree(plan)
    line = refused(run(solve_args(tiny, "--out", str(plan / "launch"))), "--out")
    assert f"{plan / 'launch'} is the launch/ directory of the planner's plan in {plan}" in line
    assert f"`emit --out {plan / 'launch'}`" in line and "another directory" in line
    assert tree(plan) == before and no_staging_left(plan, plan / "launch")
    assert run(solve_args(tiny, "--out", str(plan / "launch"), "--force")).exit_code == 0
    after = tree(plan)
    assert {rel: after.get(rel) for rel in before if rel != MANIFEST_NAME} == {
        rel: data for rel, data in before.items() if rel != MANIFEST_NAME}
    assert (plan / "launch" / "plan.json").exists() and manifest_writers(plan)["launch/launch.sh"] == "solve --out"


def other_file_system(tmp_path: Path) -> Path:
    """An empty directory on another file system than tmp_path (/dev/shm is usually tmpfs)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no writable file system other than the temporary directory's")
    import tempfile
    return Path(tempfile.mkdtemp(prefix="hapmoe-test-", dir=shm))


def test_out_through_a_link_to_another_file_system(tmp_path, tiny):
    """`--out` a symbolic link to an empty directory on another file system: "Invalid cross-device link"."""
    elsewhere = other_file_system(tmp_path)
    try:
        (tmp_path / "scratch").symlink_to(elsewhere)
        out = tmp_path / "scratch"
        for mbs in ("1", "2"):  # a new output, then the earlier one replaced
            res = run(solve_args(tiny, "--out", str(out), "--mbs", mbs))
            assert res.exit_code == 0, res.output
        assert json.loads((elsewhere / "plan.json").read_text())["plan"]["mbs"] == 2
        assert manifest_writers(elsewhere)["launch/launch.sh"] == "solve --out"
        res = run(["emit", "--plan", str(out / "plan.json"), "--out", str(out / "launch"), "--force"])
        assert res.exit_code == 0, res.output
        assert no_staging_left(tmp_path, elsewhere, elsewhere / "launch")
    finally:
        subprocess.run(["rm", "-rf", str(elsewhere)], check=False)


@pytest.fixture
def mount_point(tmp_path):
    """An empty tmpfs mounted at tmp_path/mnt (root only; skipped elsewhere)."""
    where = tmp_path / "mnt"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "hapmoe-test", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def test_out_at_a_mount_point_and_a_mount_point_inside_an_earlier_output(tmp_path, tiny, mount_point):
    """An empty mount point as --out (refused with "Invalid cross-device link"); and an earlier output whose
    launch/ is a mount point, replaced: files cross file systems by a copy beside each one, then a rename."""
    plan = tmp_path / "p"
    assert run(solve_args(tiny, "--out", str(mount_point))).exit_code == 0
    assert manifest_writers(mount_point)["plan.json"] == "solve --out"
    assert run(solve_args(tiny, "--out", str(plan))).exit_code == 0
    inner, shelf = plan / "launch", mount_point / "shelf"
    shelf.mkdir()
    for p in inner.iterdir():  # the same files, now on another file system
        (shelf / p.name).write_bytes(p.read_bytes())
        p.unlink()
    inner.rmdir()
    inner.symlink_to(shelf)  # a link is a user's: refused ...
    assert "launch" in refused(run(solve_args(tiny, "--out", str(plan), "--mbs", "2")), "--out")
    inner.unlink()
    inner.mkdir()
    assert subprocess.run(["mount", "--bind", str(shelf), str(inner)]).returncode == 0
    try:
        res = run(solve_args(tiny, "--out", str(plan), "--mbs", "2"))  # ... a mount point is not
        assert res.exit_code == 0, res.output
        assert manifest_writers(plan)["launch/launch.sh"] == "solve --out"
        assert no_staging_left(plan) and not [p for p in inner.iterdir() if p.name.startswith(".hapmoe-")]
    finally:
        subprocess.run(["umount", "-l", str(inner)], check=False)
