"""Time the launcher-script reader on growing inputs: it must stay linear in the script's size.

    python tools/bench_script.py

Prints, for a long single line and for many array lines, the median wall time of
planner.inputs.script.parse_launcher_script over 3 runs and the time per MB / per 1000 lines.
"""

from __future__ import annotations

import statistics
import time

from planner.inputs.script import parse_launcher_script


def _median_s(text: str, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        parse_launcher_script(text)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    print("input                               size        median s   per unit")
    for mb in (0.5, 1, 2):
        n = int(mb * 1_000_000)
        text = 'A="' + "a" * n + '"\ntorchrun train.py --x "$A"\n'
        s = _median_s(text)
        print(f"one line of {mb:>4} MB                {len(text):>10,d}  {s:9.3f}   {s / mb:.3f} s/MB")
    for lines in (50_000, 100_000, 200_000):
        text = "\n".join(f"A+=(--x{i})" for i in range(lines)) + '\ntorchrun train.py "${A[@]}"\n'
        s = _median_s(text, repeats=1 if lines > 100_000 else 3)
        print(f"{lines:>7,d} array lines A+=(...)   {len(text):>10,d}  {s:9.3f}   {1000 * s / lines:.3f} s/1000 lines")
    for lines in (50_000, 100_000, 200_000):
        text = "A=(\n" + "\n".join(f"  --x{i}" for i in range(lines)) + '\n)\ntorchrun train.py "${A[@]}"\n'
        s = _median_s(text)
        print(f"{lines:>7,d} lines in one A=( ... )  {len(text):>10,d}  {s:9.3f}   {1000 * s / lines:.3f} s/1000 lines")


if __name__ == "__main__":
    main()
