"""Does every published run get an `estimate` without --allow-invalid?  (issue 20, "done when")

    python -m tools.check_published_runs [CSV ...]

Reads the shipped runs (planner/calibration/published/measured_runs.csv) and the shared tables
(../shared/calibration/measured_runs.csv and measured_runs_new.csv, when present), or the CSV files
given, and prices each row's flags on its cluster the way `cli.py estimate --megatron-args ARGS
--cluster CLUSTER` does, without --allow-invalid.  Prints one line per row (ok with the predicted
iteration time, or the refusal) and a count; exit status 1 when a row is refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner.api import estimate, load_inputs
from planner.calibration.runs import SHARED_RUNS_CSV, SHIPPED_RUNS_CSV, _read_csv
from planner.errors import ImplausiblePredictionError, MissingProfileError
from planner.profile_tables import ProfileSet

DEFAULT_TABLES = (SHIPPED_RUNS_CSV, SHARED_RUNS_CSV, SHARED_RUNS_CSV.with_name("measured_runs_new.csv"))


def check(paths) -> tuple[int, int]:
    """(rows priced, rows refused), printing one line per row."""
    profiles = ProfileSet.load()
    ok = bad = 0
    for path in paths:
        path = Path(path)
        if not path.is_file():
            continue
        for row in _read_csv(path):
            key = f"{path.name}:{row['id']}"
            try:
                inputs = load_inputs(cluster=row["cluster"], megatron_args=row["megatron_args"], profiles=profiles)
                priced = estimate(inputs)
            except (ValueError, MissingProfileError, ImplausiblePredictionError) as exc:
                bad += 1
                print(f"REFUSED {key}: {exc}")
                continue
            ok += 1
            print(f"ok      {key}: {priced.cost.iteration_time_s:.3f} s (measured {row['metric']} {row['value']})")
    return ok, bad


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tools.check_published_runs", description=__doc__.split("\n\n")[0],
                                 epilog="exit status 1 when a row is refused")
    ap.add_argument("csv", nargs="*", metavar="CSV",
                    help="tables of runs to price, in measured_runs.csv's columns (default: the shipped "
                         "planner/calibration/published/measured_runs.csv and, when present, ../shared/calibration/"
                         "measured_runs.csv and measured_runs_new.csv); a path that is not a file is skipped")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    ok, bad = check(args.csv or DEFAULT_TABLES)
    print(f"{ok} rows priced, {bad} refused")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
