"""The calibration report with every source held out (`build_report(loso=True)`, what
`python -m planner.calibration.report --loso` prints: ~15 s), built once per test run for the tests in several
files that read it (test_calibration_runs' leave-one-source-out target, test_ranges' held-out range tests).  Under
pytest-xdist the workers share it (tests/helpers/run_dir.py): the first to need it builds it under a lock and leaves
it pickled, the others wait and read it, as tests/helpers/corpus.py does for the launcher corpus.  It depends on the
shipped files alone: never build it under a monkeypatch."""

from __future__ import annotations

import fcntl
import pickle
from functools import lru_cache

from planner.calibration.report import Report, build_report
from helpers.run_dir import worker_run_dir


@lru_cache(maxsize=1)
def loso_report() -> Report:
    """The report of `build_report(loso=True)`, built once per test run."""
    root = worker_run_dir()
    if root is None:  # one process: once per session (the lru_cache)
        return build_report(loso=True)[0]
    saved = root / "loso-report.pickle"
    with open(root / "loso-report.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker building it: wait, then read what it left
        if not saved.exists():
            report, _ = build_report(loso=True)
            tmp = saved.with_suffix(".tmp")
            tmp.write_bytes(pickle.dumps(report))
            tmp.rename(saved)
    return pickle.loads(saved.read_bytes())
