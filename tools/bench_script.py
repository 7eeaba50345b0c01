"""Time the launcher-script reader on growing inputs: it must stay linear in the script's size.

    python tools/bench_script.py            # every case below
    python tools/bench_script.py --arrays   # only the two large data-path arrays

Prints, for a long single line, for many array lines and for the large arrays of generated launchers
(a literal 200,000-element array, a 20,000-file `--data-path` list appended in 5,000 `DATA+=(...)`
lines), the median wall time (and CPU time, for the arrays) of
planner.inputs.script.parse_launcher_script over 3 runs and the time per MB / per 1000 lines.  Each
run reads the script from scratch (the syntax-tree cache is emptied first), as the first read of a
`solve` does.
"""

from __future__ import annotations

import argparse
import statistics
import time

from planner.inputs import script as script_module
from planner.inputs.script import parse_launcher_script

LAUNCH = "torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2"


def _median_s(text: str, repeats: int = 3) -> float:
    return _medians_s(text, repeats)[0]


def _medians_s(text: str, repeats: int = 3) -> tuple[float, float]:
    """(wall, CPU) seconds, the median of `repeats` reads (CPU time: steadier on a shared machine)."""
    walls, cpus = [], []
    for _ in range(repeats):
        script_module._PARSED.clear()  # each run lexes and parses too
        w0, c0 = time.perf_counter(), time.process_time()
        parse_launcher_script(text)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def literal_array(elements: int) -> str:
    """`A=(x0 x1 ...)` on one line, passed whole to the entry script."""
    return "A=(" + " ".join(f"x{i}" for i in range(elements)) + f')\n{LAUNCH} "${{A[@]}}"\n'


def data_path_appends(lines: int, files_per_line: int = 4) -> str:
    """A weighted `--data-path` list built by `DATA+=(1.0 /path/file_i ...)` lines, no loop."""
    appends = "\n".join(
        "DATA+=(" + " ".join(f"1.0 /data/corpus/file_{k}_text_document"
                             for k in range(i * files_per_line, (i + 1) * files_per_line)) + ")"
        for i in range(lines))
    return f'DATA=()\n{appends}\n{LAUNCH} --data-path "${{DATA[@]}}"\n'


def _arrays() -> None:
    for label, text, unit in (("literal array of 200,000 elements", literal_array(200_000), 200),
                              ("5,000 lines DATA+=(4 files)", data_path_appends(5_000), 20)):
        s, cpu_s = _medians_s(text)
        print(f"{label:<36}{len(text):>10,d}  {s:9.3f}   {s / unit:.3f} s/1000 files or elements (CPU {cpu_s:.3f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arrays", action="store_true", help="only the large data-path arrays")
    only_arrays = parser.parse_args().arrays
    print("input                                     size   median s   per unit")
    _arrays()
    if only_arrays:
        return
    for mb in (0.5, 1, 2):
        n = int(mb * 1_000_000)
        text = 'A="' + "a" * n + '"\ntorchrun train.py --x "$A"\n'
        s = _median_s(text)
        print(f"one line of {mb:>4} MB                {len(text):>10,d}  {s:9.3f}   {s / mb:.3f} s/MB")
    for lines in (50_000, 100_000, 150_000):  # one statement a line: 200,000 are past MAX_STEPS
        text = "\n".join(f"A+=(--x{i})" for i in range(lines)) + '\ntorchrun train.py "${A[@]}"\n'
        s = _median_s(text, repeats=1 if lines > 100_000 else 3)
        print(f"{lines:>7,d} array lines A+=(...)   {len(text):>10,d}  {s:9.3f}   {1000 * s / lines:.3f} s/1000 lines")
    for lines in (50_000, 100_000, 200_000):
        text = "A=(\n" + "\n".join(f"  --x{i}" for i in range(lines)) + '\n)\ntorchrun train.py "${A[@]}"\n'
        s = _median_s(text)
        print(f"{lines:>7,d} lines in one A=( ... )  {len(text):>10,d}  {s:9.3f}   {1000 * s / lines:.3f} s/1000 lines")


if __name__ == "__main__":
    main()
