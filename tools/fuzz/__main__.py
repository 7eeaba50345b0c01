"""`python -m tools.fuzz --cases 10000`: the hardening benchmark (see tools/fuzz/__init__.py)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from tools.fuzz.cases import KINDS, make_case
from tools.fuzz.runner import FAILURES, Outcome, run_cases


def main(argv: list[str] | None = None, prog: str = "python -m tools.fuzz") -> int:
    """The fuzzer's command line; `prog`: the command its usage names (`python -m planner.fuzz` forwards here)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--cases", type=int, default=1000, help="number of cases (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="case stream (default 0); case i of a seed never changes")
    parser.add_argument("--start", type=int, default=0, help="first case index (to rerun a range)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="worker processes (default: CPUs)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds before a case counts as a hang (default: 30, 60 for solve/compare)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated input kinds ({', '.join(KINDS)})")
    parser.add_argument("--show", type=int, default=5, help="reproducers printed per failure class (default 5)")
    parser.add_argument("--show-all", action="store_true", help="print every case and its outcome")
    args = parser.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or args.cases < 1 or args.jobs < 1:
        parser.error(f"--kinds: unknown {unknown}; known: {', '.join(KINDS)}" if unknown else
                     "--cases and --jobs must be >= 1")
    t0 = time.monotonic()
    cases = [make_case(args.seed, i, kinds) for i in range(args.start, args.start + args.cases)]
    gen_s = time.monotonic() - t0
    tty = sys.stderr.isatty()
    last = [0.0]

    def progress(done: int, outcome: Outcome) -> None:
        if args.show_all:
            print(f"{outcome.verdict:14s} exit={outcome.exit_code} {outcome.seconds:6.2f}s {outcome.case.describe()}"
                  + (f"\n    {outcome.detail}" if outcome.detail else ""), flush=True)
        now = time.monotonic()
        if done == len(cases) or now - last[0] > (0.5 if tty else 15):
            last[0] = now
            sys.stderr.write(("\r" if tty else "") + f"fuzz: {done}/{len(cases)} cases" + ("" if tty else "\n"))
            sys.stderr.flush()

    summary = run_cases(cases, jobs=args.jobs, timeout_s=args.timeout, progress=progress)
    if tty:
        sys.stderr.write("\n")
    n = len(summary.outcomes)
    print(f"fuzz: {n} cases (seed {args.seed}, start {args.start}), {args.jobs} workers, wall {summary.wall_s:.1f} s "
          f"({n / max(summary.wall_s, 1e-9):.1f} cases/s; generating {gen_s:.1f} s)")
    expected_rejects = sum(1 for o in summary.outcomes if o.case.expect == "reject")
    print(f"inputs known to be invalid: {expected_rejects}; refused with exit 2: "
          f"{sum(1 for o in summary.outcomes if o.exit_code == 2)}; exit 0: "
          f"{sum(1 for o in summary.outcomes if o.exit_code == 0)}; exit 3: "
          f"{sum(1 for o in summary.outcomes if o.exit_code == 3)}")
    for verdict in FAILURES:
        print(f"  {verdict:14s} {summary.count(verdict):6d} of {n}")
    times = sorted(o.seconds for o in summary.outcomes)
    if times:
        print(f"case time: median {times[len(times) // 2]:.3f} s, p99 {times[int(len(times) * 0.99)]:.2f} s, "
              f"max {times[-1]:.2f} s")
    slow = sorted(summary.outcomes, key=lambda o: -o.seconds)[:5]
    print("slowest: " + "; ".join(f"#{o.case.index} {o.case.kind} {o.seconds:.1f} s ({o.case.what[:40]})" for o in slow))
    over = [o for o in summary.outcomes if o.verdict != "hang" and _over_time_limit(o)]
    print(f"over --time-limit x1.1 + 1 s (the search's own budget; not counted above): {len(over)}"
          + "".join(f"\n  #{o.case.index} {o.seconds:.1f} s: {o.case.command_line()[:160]}" for o in over[:5]))
    print("\nper input kind:")
    header = f"  {'kind':14s} {'cases':>6s} {'exit 2':>7s} " + " ".join(f"{f:>13s}" for f in FAILURES)
    print(header)
    for kind, row in summary.by_kind().items():
        print(f"  {kind:14s} {row['cases']:6d} {row['rejected']:7d} " + " ".join(f"{row[f]:13d}" for f in FAILURES))
    for verdict in FAILURES:
        found = [o for o in summary.outcomes if o.verdict == verdict]
        if not found:
            continue
        print(f"\n{verdict} ({len(found)}), first {min(args.show, len(found))} (rerun: --seed {args.seed} "
              f"--start INDEX --cases 1 --show-all):")
        for o in found[: args.show]:
            print(f"  {o.case.describe()}")
            for line in (o.detail or "").strip().splitlines()[-4:]:
                print(f"      {line[:300]}")
    return 1 if summary.failures else 0


def _over_time_limit(outcome: Outcome) -> bool:
    argv = list(outcome.case.argv)
    if "--time-limit" not in argv or argv[0] not in ("solve", "compare") or outcome.case.signal is not None:
        return False
    try:
        limit = float(argv[argv.index("--time-limit") + 1])
    except (IndexError, ValueError):
        return False
    runs = 3 if argv[0] == "compare" else 1  # compare runs each backend with the limit
    return limit == limit and outcome.seconds > runs * limit * 1.1 + 1.0


if __name__ == "__main__":
    sys.exit(main())
