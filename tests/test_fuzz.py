"""The fuzzer in CI: a few hundred bounded cases of every input kind, on two worker processes.

The benchmark is `python -m tools.fuzz --cases 10000`; this runs the first cases of a fixed seed
(a different seed from the benchmark's default, so that the two together cover more ground), and
checks that the harness itself can tell a hang, a traceback and a silent accept from a clean refusal.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tools.fuzz.cases import KINDS, Case, make_case
from tools.fuzz.runner import classify, run_cases

CI_SEED = 13
CI_CASES = 400
CI_KINDS = tuple(k for k in KINDS if k != "solve-large")  # presets on 1,000s of GPUs: seconds each, benchmark only


@pytest.mark.slow
def test_a_few_hundred_cases_of_every_kind_are_refused_cleanly_or_accepted():
    cases = [make_case(CI_SEED, i, CI_KINDS) for i in range(CI_CASES)]
    kinds = Counter(c.kind for c in cases)
    assert set(kinds) == set(CI_KINDS), kinds  # every input kind is exercised
    assert sum(c.expect == "reject" for c in cases) > CI_CASES // 2
    summary = run_cases(cases, jobs=2)
    assert len(summary.outcomes) == CI_CASES
    report = "\n".join(f"{o.verdict}: {o.case.describe()}\n    {o.detail[-400:]}" for o in summary.failures)
    assert not summary.failures, report


def test_cases_are_reproducible():
    assert make_case(CI_SEED, 7) == make_case(CI_SEED, 7)
    assert make_case(CI_SEED, 7) != make_case(CI_SEED + 1, 7)


def test_the_harness_sees_hangs_tracebacks_and_silent_accepts():
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
