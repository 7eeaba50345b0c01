"""`calibrate` on a large generated Megatron log: wall time and peak memory (RSS) of the command.

    python tools/bench_calibrate.py                      # a 1 GiB log, the calibrate of this checkout
    python tools/bench_calibrate.py --size-mb 100 --cli /path/to/other/cli.py

The log is a run of the fuzzer's tiny MoE model (tools/fuzz/inputs.py) on H800:8 with log-interval 1:
one iteration line per iteration (its elapsed time 1.2x the cost model's prediction, so that the fit is
plausible), a (min, max) timer block of ten timers every 10 iterations, three lines of unrelated
output every 100 iterations, and memory lines after the first iteration.  Each command runs in a fresh
process; its peak RSS comes from wait4 (the kernel's figure for that process).  The limit from issue 23
is 4 GiB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.fuzz.inputs import LOG_LINE, MEMORY_LINE, TINY_FILE, TINY_MODEL  # noqa: E402
from tools.fuzz.mutations import to_yaml  # noqa: E402

TIMERS = ("forward-backward", "forward-compute", "backward-compute", "batch-generator", "layernorm-grads-all-reduce",
          "embedding-grads-all-reduce", "all-grads-sync", "params-all-gather", "optimizer-copy-to-main-grad",
          "optimizer")
NOISE = ("WARNING: the dataloader is slow; consider more workers",
         "[rank0]: saving checkpoint at iteration   1000 to /ckpt in torch_dist format",
         "> finished creating GPT datasets ...")
LIMIT_BYTES = 4 << 30


def predicted_ms(model_path: Path) -> float:
    from planner.api import estimate, load_inputs

    inputs = load_inputs(model=str(model_path), cluster="H800:8", overrides={"ep": 8})
    return estimate(inputs).cost.iteration_time_s * 1e3


def write_log(path: Path, size_bytes: int, elapsed_ms: float) -> int:
    """Write the log until it reaches `size_bytes`; returns the iteration lines written."""
    total = max(1, size_bytes // 330)
    written = 0
    it = 0
    with open(path, "w") as fh:
        while written < size_bytes:
            it += 1
            lines = [LOG_LINE.format(minute=it % 60, it=it, total=total, samples=it * 64,
                                     elapsed=f"{elapsed_ms * (1 + 0.01 * (it % 7)):.1f}", gbs=64)]
            if it == 1:
                lines += [MEMORY_LINE.format(rank=r, it=1, a="3000.00", r="3600.00") for r in range(8)]
            if it % 10 == 0:
                lines.append("(min, max) time across ranks (ms):")
                lines += [f"    {name} {'.' * (40 - len(name))}: ({elapsed_ms * 0.3:.2f}, {elapsed_ms * 0.31:.2f})"
                          for name in TIMERS]
            if it % 100 == 0:
                lines += NOISE
            block = "\n".join(lines) + "\n"
            fh.write(block)
            written += len(block)
    return it


def run_calibrate(cli: Path, log: Path, model: Path, out: Path) -> tuple[int, float, int, str]:
    """(exit status, wall seconds, peak RSS bytes, last stderr line) of one calibrate in a fresh process."""
    argv = [sys.executable, str(cli), "calibrate", "--megatron-log", str(log), "--model", str(model),
            "--cluster", "H800:8", "--ep", "8", "--out", str(out)]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cli.parent)
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    last = next((ln for ln in reversed(err.splitlines()) if ln.strip()), "")
    return proc.returncode, wall, usage.ru_maxrss * 1024, last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/bench_calibrate.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="log size in MiB (default 1024)")
    parser.add_argument("--cli", type=Path, default=ROOT / "cli.py", help="the cli.py to measure (default: this one)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the log here and keep it (a log already there is reused, to measure another --cli "
                             "on the same bytes)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hapmoe-bench-cal-") as tmp:
        d = Path(tmp)
        model = d / TINY_FILE
        model.write_bytes(to_yaml(TINY_MODEL))
        log = args.keep or d / "run.log"
        t0 = time.perf_counter()
        if args.keep is not None and args.keep.is_file():
            print(f"log: {log.stat().st_size / 2**20:.0f} MiB, reused from {log}")
        else:
            iterations = write_log(log, args.size_mb << 20, predicted_ms(model) * 1.2)
            print(f"log: {log.stat().st_size / 2**20:.0f} MiB, {iterations} iterations, written in "
                  f"{time.perf_counter() - t0:.1f} s")
        code, wall, rss, last = run_calibrate(args.cli.resolve(), log, model, d / "cal")
        print(f"calibrate ({args.cli}): exit {code}, wall {wall:.1f} s, peak RSS {rss / 2**30:.2f} GiB "
              f"({'within' if rss <= LIMIT_BYTES else 'ABOVE'} the 4 GiB limit)")
        if code != 0:
            print(f"  {last}")
    return 0 if code == 0 and rss <= LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
