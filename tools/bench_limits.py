"""How long the time-limit examples of issues 23 and 33 take: `python cli.py solve ...` wall time (the process,
imports included) against --time-limit x 1.1 + 1 s.

    python tools/bench_limits.py                      # this checkout
    python tools/bench_limits.py --cli /path/to/other/cli.py --repeats 1

Cases (issue 23, "Limits that do not hold"):
- qwen3-235b-a22b on 3,072 GPUs (1,024 each of H800, MI300X, 910B), --time-limit 5 --plot (took 21 s);
- a launcher script with a loop of 900,000 rounds, --time-limit 5 (14-36 s);
- a loop with a 500-term arithmetic body, --time-limit 10 (over 120 s);
issue 33: the limit covers building the search space and writing the output at any size:
- mixtral-s on 100,000 H800, --time-limit 8 (took 19.2 s; 78 s on a loaded 2-core machine);
- mixtral-s on 16 H800 with a global batch of 2^24 and --out, --time-limit 30 (the timeline simulated
  2,097,152 micro-batches: minutes; 11 s to over 60 s with --time-limit 5).
Each runs --repeats times (default 3) in a fresh process; the median is printed with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.fuzz.inputs import SCRIPT  # noqa: E402

LOOP = "X=0\nfor ((i=0;i<900000;i++)); do X=$((X+1)); done"
LONG_BODY = "for ((i=0;i<3000;i++)); do Y=$(( " + " + ".join(["i*3"] * 500) + " )); done"


def cases(d: Path) -> list[tuple[str, list[str], float]]:
    (d / "loop.sh").write_text(SCRIPT.format(extra=LOOP, layers="4"))
    (d / "long.sh").write_text(SCRIPT.format(extra=LONG_BODY, layers="4"))
    return [
        ("qwen3-235b on 3,072 GPUs, --plot", ["solve", "--model", "qwen3-235b-a22b", "--cluster",
                                              "H800:1024,MI300X:1024,910B:1024", "--quiet", "--plot", str(d / "plots")],
         5.0),
        ("script loop of 900,000 rounds", ["solve", "--megatron-script", str(d / "loop.sh"), "--cluster", "H800:8",
                                           "--quiet"], 5.0),
        ("loop with a 500-term arithmetic body", ["solve", "--megatron-script", str(d / "long.sh"), "--cluster",
                                                  "H800:8", "--quiet"], 10.0),
        ("mixtral-s on 100,000 H800", ["solve", "--model", "mixtral-s", "--cluster", "H800:100000", "--quiet"], 8.0),
        ("GBS 2^24 with --out", ["solve", "--model", "mixtral-s", "--cluster", "H800:16", "--gbs", str(1 << 24),
                                 "--quiet", "--out", str(d / "big-batch")], 30.0),
    ]


def one(cli: Path, argv: list[str], limit: float, cwd: Path) -> tuple[float, int, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(cli), *argv, "--time-limit", f"{limit:g}"], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    last = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.startswith(("error:", "note:"))), "")
    return wall, proc.returncode, last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/bench_limits.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cli", type=Path, default=ROOT / "cli.py", help="the cli.py to measure (default: this one)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="hapmoe-bench-limits-") as tmp:
        d = Path(tmp)
        print(f"{args.cli} (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
        for name, case_argv, limit in cases(d):
            runs = []
            for _ in range(args.repeats):
                runs.append(one(args.cli.resolve(), case_argv, limit, d))
            walls = [w for w, _, _ in runs]
            bound = limit * 1.1 + 1.0
            med = statistics.median(walls)
            worst = max(worst, med / bound)
            print(f"  {name}: --time-limit {limit:g}: median {med:.1f} s (runs {', '.join(f'{w:.1f}' for w in walls)}; "
                  f"bound {bound:.1f} s: {'within' if med <= bound else 'OVER'}), exit {runs[-1][1]}"
                  + (f"\n      {runs[-1][2][:160]}" if runs[-1][2] else ""))
    return 0 if worst <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
