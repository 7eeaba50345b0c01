"""The fuzzer in CI: a few hundred bounded cases of every input kind, on two worker processes.

The benchmark is `python -m tools.fuzz --cases 10000`; this runs the first cases of a fixed seed
(a different seed from the benchmark's default, so that the two together cover more ground), and
checks that the harness itself can tell a hang, a traceback and a silent accept from a clean refusal.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from tools.fuzz.cases import KINDS, Case, distinct, make_case
from tools.fuzz.inputs import HF_CONFIGS
from tools.fuzz.runner import _lost, _materialise, _protected, classify, run_cases

CI_SEED = 13
CI_CASES = 400
CI_KINDS = tuple(k for k in KINDS if k != "solve-large")  # presets on 1,000s of GPUs: seconds each, benchmark only


@pytest.mark.slow
def test_a_few_hundred_cases_of_every_kind_are_refused_cleanly_or_accepted():
    """The first CI_CASES cases of CI_SEED, each distinct case once (46 of the 400 repeat an earlier one)."""
    cases = distinct([make_case(CI_SEED, i, CI_KINDS) for i in range(CI_CASES)])
    kinds = Counter(c.kind for c in cases)
    assert set(kinds) == set(CI_KINDS), kinds  # every input kind is exercised
    assert len(cases) > 0.8 * CI_CASES and sum(c.expect == "reject" for c in cases) > len(cases) // 2
    summary = run_cases(cases, jobs=2)
    assert len(summary.outcomes) == len(cases)
    report = "\n".join(f"{o.verdict}: {o.case.describe()}\n    {o.detail[-400:]}" for o in summary.failures)
    assert not summary.failures, report


def test_the_ci_sample_fuzzes_every_hf_config_family_including_glm_and_olmoe():
    """The CI sample changes keys of a config of each family in tools/fuzz/inputs.py HF_CONFIGS, GLM-4.5 (glm4_moe)
    and OLMoE among them, so that their readers' refusals run in CI."""
    cases = [make_case(CI_SEED, i, CI_KINDS) for i in range(CI_CASES)]
    families = {f for c in cases if c.kind == "hf-config" for f in HF_CONFIGS if c.what.startswith(f + ".")}
    assert families == set(HF_CONFIGS) and {"glm4_moe", "olmoe"} <= families, families


def test_distinct_leaves_out_the_repeats_of_an_earlier_case_only():
    a = Case(index=0, kind="flags", what="", argv=("estimate", "--tp", "0"), expect="reject", names=("--tp",))
    other_signal = Case(index=3, kind="signal", what="", argv=("solve",), signal=("SIGTERM", 1.0))
    kept = distinct([a, replace(a, index=1), other_signal, replace(other_signal, index=4, signal=("SIGTERM", 2.0)),
                     replace(a, index=5, argv=("estimate", "--tp", "-1"))])
    assert [c.index for c in kept] == [0, 3, 4, 5]


def test_cases_are_reproducible():
    assert make_case(CI_SEED, 7) == make_case(CI_SEED, 7)
    assert make_case(CI_SEED, 7) != make_case(CI_SEED + 1, 7)


def test_the_harness_sees_hangs_tracebacks_and_silent_accepts():
    import cli

    cli.load_every_command()  # loaded before the workers fork, so that a 1 s limit measures the cases only

    cases = [Case(index=i, kind="flags", what="", argv=("--help",)) for i in range(3)]

    def stuck_on_the_second(case: Case):
        if case.index == 1:
            time.sleep(600)
        return 0, "", "", 0.0, False

    hung = run_cases(cases, jobs=1, timeout_s=1.0, executor=stuck_on_the_second)
    assert [o.verdict for o in hung.outcomes] == ["ok", "hang", "ok"]  # the worker was replaced
    bad = Case(index=1, kind="flags", what="invalid", argv=("--help",), expect="reject", names=("--tp",))
    assert classify(bad, 0, "", "", False)[0] == "silent_accept"
    assert classify(bad, 1, "error: internal error (KeyError: 'x')", "", False)[0] == "traceback"
    assert classify(bad, None, "", "Traceback ...\nKeyError: 'x'", False)[0] == "traceback"
    assert classify(bad, 2, "error: --pp: no", "", False)[0] == "unclear"
    assert classify(bad, 2, "Usage: x\nerror: --tp: no", "", False)[0] == "unclear"
    assert classify(bad, 2, "error: --tp: must be >= 1", "", False)[0] == "ok"
    assert classify(bad, 2, "error: --tp: must be >= 1", "", True)[0] == "half_written"


ISSUE_23_FAST_KINDS = ("user-files", "edited-plan", "extremes", "poisoned-log")


def test_the_new_classes_run_clean_on_a_small_sample():
    """Issue 23's in-process classes (the user's files in output directories, edited plans, physical
    extremes, poisoned logs): 48 cases, none loses a file, none is accepted though invalid."""
    cases = [make_case(CI_SEED, i, ISSUE_23_FAST_KINDS) for i in range(48)]
    assert {c.kind for c in cases} == set(ISSUE_23_FAST_KINDS)
    assert sum(c.expect == "reject" for c in cases) > 16
    summary = run_cases(cases, jobs=2)
    report = "\n".join(f"{o.verdict}: {o.case.describe()}\n    {o.detail[-400:]}" for o in summary.failures)
    assert not summary.failures, report


def test_the_harness_sees_data_loss_and_judges_signalled_exits(tmp_path):
    case = Case(index=0, kind="user-files", what="", argv=("--help",),
                files=(("out/notes.txt", b"mine"), ("out/plan.json", b"old"), ("out/hapmoe-manifest.json", b"{}")),
                owned=("out/plan.json", "out/hapmoe-manifest.json"))
    _materialise(case, tmp_path)
    protected = _protected(case)
    assert set(protected) == {"out/notes.txt"}  # the genuine earlier output may be replaced
    (tmp_path / "out" / "plan.json").write_text("new")
    assert _lost(tmp_path, protected) == []
    (tmp_path / "out" / "notes.txt").write_text("overwritten")
    assert _lost(tmp_path, protected) == ["out/notes.txt"]
    (tmp_path / "out" / "notes.txt").unlink()
    assert _lost(tmp_path, protected) == ["out/notes.txt"]
    assert classify(case, 0, "", "", False, ["out/notes.txt"])[0] == "data_loss"
    assert classify(case, 2, "error: --out: x", "", False, ["out/notes.txt"])[0] == "data_loss"
    signalled = Case(index=0, kind="signal", what="", argv=("--help",), signal=("SIGTERM", 1.0))
    assert classify(signalled, 143, "error: interrupted by SIGTERM", "", False)[0] == "ok"
    assert classify(signalled, 143, "error: interrupted by SIGTERM", "", True)[0] == "half_written"
    assert classify(signalled, 130, "", "", False)[0] == "traceback"  # not the signal it was sent
    assert classify(signalled, None, "", "hang: still running 54 s after SIGTERM", False)[0] == "hang"


@pytest.mark.parametrize("module", ["planner.fuzz", "tools.fuzz"])
def test_the_usage_names_the_module_run(module, tmp_path):
    """`python -m planner.fuzz --help` (the documented command, forwarded to tools/fuzz) said `usage: python -m
    tools.fuzz`; each names itself, and a usage error still exits 2 through the forwarding module."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root}
    shown = subprocess.run([sys.executable, "-m", module, "--help"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0 and shown.stdout.startswith(f"usage: python -m {module} "), shown.stdout
    wrong = subprocess.run([sys.executable, "-m", module, "--cases", "0"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and f"python -m {module}: error: --cases and --jobs must be >= 1" in wrong.stderr
