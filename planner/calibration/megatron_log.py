"""Parse a Megatron-LM training log (formats: ../shared/reference/megatron.md section 4), streaming.

Reads four kinds of lines:
- iteration lines (printed by the last rank): elapsed time per iteration (ms), throughput per
  GPU (TFLOP/s/GPU), global batch size and the iterations of the interval that skipped their optimizer step
  (`number of skipped iterations` + `number of nan iterations`: an fp16 loss-scale overflow, a NaN loss; such a
  line's time is short and not the run's: `steady_indices` leaves it out where others remain)
  (`parse_iteration_line` gives every other `key: value |` pair of one line);
- memory lines (`[Rank r] (after it iterations) memory (MB) | allocated: ...`), one per rank
  with DP rank 0;
- timer blocks, in the `(min, max)`, `max` and `all` formats, with or without the
  `INFO:megatron.core.timers:` prefix;
- what the run states about its configuration at start-up: Megatron's `using world size: W,
  data-parallel size: D, context-parallel size: C, ..., tensor-model-parallel size: T,
  pipeline-model-parallel size: P` line and its `------ arguments ------` block (`  name ..... value`,
  one argument a line), both printed by rank 0 (NVIDIA/Megatron-LM@d98e8a64dd
  megatron/training/arguments.py, `validate_args` and `_print_args`).  Only the arguments in
  `STATED_ARGUMENTS` are kept, per run (`ParsedLog.stated_config`).

Lines that look like one of these but do not parse (garbled, truncated) are counted, and the first
`MAX_PROBLEMS_KEPT` kept in `ParsedLog.problems`; they never raise.  Everything else is ignored.

**Bounded memory.**  The file is read line by line (a line longer than `MAX_LINE_BYTES` is cut
there), and what is kept is columns of numbers: per iteration line its number, elapsed time,
throughput and batch (32 bytes); per timer value its block, rank and value (16 bytes); per (run,
rank) only the peak memory record.  A 1 GB log of iteration lines keeps ~100 MB (measured by
tools/bench_calibrate.py).

**Runs.**  A log can hold several runs one after another (a restart, two logs concatenated).  A new
run starts where the iteration number does not increase or the total (`N/ M`) changes; `runs` lists
where each starts.  Every statistic takes `run=` (an index into `runs`; None: the whole log), and
`calibrate` refuses a log of several runs unless one is chosen (planner/calibration/calibrate.py).
"""

from __future__ import annotations

import math
import os
import re
import statistics
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from planner.errors import PlannerInputError
from planner.inputs.files import open_regular

_TIMESTAMP_RE = re.compile(r"^\s*\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?\]\s*")
_ITER_RE = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|")
_PAIR_RE = re.compile(r"\s*([^|:]+?):\s*([^|]+?)\s*\|")
_MEMORY_RE = re.compile(
    r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: ([\d.]+) \| "
    r"max allocated: ([\d.]+) \| reserved: ([\d.]+) \| max reserved: ([\d.]+)"
)
_TIMER_PREFIX = "INFO:megatron.core.timers:"
_TIMER_HEADER_RE = re.compile(
    r"^(?:INFO:megatron\.core\.timers:)?\s*(\(min, max\) time across ranks|max time across ranks|"
    r"times across ranks) \(ms\):\s*$"
)
_TIMER_MINMAX_RE = re.compile(r"^\s+([\w\-.]+?)\s*\.*:\s*\(([\d.]+),\s*([\d.]+)\)\s*$")
_TIMER_MAX_RE = re.compile(r"^\s+([\w\-.]+?)\s*\.*:\s*([\d.]+)\s*$")
_TIMER_ALL_NAME_RE = re.compile(r"^\s+([\w\-.]+):\s*$")
_TIMER_ALL_RANK_RE = re.compile(r"^\s+rank\s+(\d+):\s*([\d.]+)\s*$")

# The start-up line of the parallel sizes; "encoder-tensor-model-parallel size" (older versions) is not TP.
_WORLD_LINE_RE = re.compile(r"using world size:\s*(\d+)")
_WORLD_SIZES_RE = re.compile(r"(?<![\w-])(data-parallel|context-parallel|tensor-model-parallel|"
                             r"pipeline-model-parallel) size:\s*(\d+)")
# One line of Megatron's arguments block: two spaces, the name, a run of dots, the value.
_ARGUMENT_RE = re.compile(r"^\s+([a-z_]+) \.+ (\S+)\s*$")
STATED_ARGUMENTS = {  # Megatron's argument name -> the key in ParsedLog.stated_config
    "world_size": "world_size", "data_parallel_size": "dp", "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp", "context_parallel_size": "cp", "expert_model_parallel_size": "ep",
    "micro_batch_size": "mbs", "global_batch_size": "gbs", "seq_length": "seq_length", "num_layers": "num_layers",
}
_WORLD_LINE_KEYS = {"data-parallel": "dp", "context-parallel": "cp", "tensor-model-parallel": "tp",
                    "pipeline-model-parallel": "pp"}

ELAPSED_KEY = "elapsed time per iteration (ms)"
THROUGHPUT_KEY = "throughput per GPU (TFLOP/s/GPU)"
_FIELD_RES = {key: re.compile(re.escape(key) + r":\s*([^|]*?)\s*\|") for key in
              (ELAPSED_KEY, THROUGHPUT_KEY, "global batch size")}
MAX_LOG_BYTES = 4 << 30
MAX_LINE_BYTES = 1 << 16  # a longer line is read up to here (real lines: < 1 KB)
MAX_PROBLEMS_KEPT = 100  # unreadable lines kept with their text (all are counted)
MAX_RUNS = 1000  # runs whose memory records are kept (all are counted)
MAX_RANK = 1 << 17  # the planner's GPU limit
MAX_TIMER_NAMES = 64  # distinct timer names kept (real logs: ~30)
MAX_ELAPSED_MS = 1e9  # 11.6 days per iteration: anything above is not a real iteration time
MAX_MEMORY_MB = 1e9  # 1 PB per GPU: anything above is not a real memory figure
_OPTIONS = ("minmax", "max", "all")
NONE = float("nan")  # "not in the line" in the float columns


@dataclass(frozen=True)
class IterationRecord:
    """One iteration line: the iteration number and every `key: value` pair as text."""

    iteration: int
    train_iters: int
    fields: dict[str, str]
    line_no: int

    @property
    def elapsed_s(self) -> float | None:
        value = _to_float(self.fields.get(ELAPSED_KEY))
        return None if value is None else value / 1e3

    @property
    def throughput_tflops(self) -> float | None:
        return _to_float(self.fields.get(THROUGHPUT_KEY))

    @property
    def global_batch_size(self) -> int | None:
        value = _to_float(self.fields.get("global batch size"))
        return None if value is None else int(value)


@dataclass(frozen=True)
class MemoryRecord:
    """One `[Rank r] (after it iterations) memory (MB)` line, converted to bytes."""

    rank: int
    iteration: int
    allocated_bytes: float
    max_allocated_bytes: float
    reserved_bytes: float
    max_reserved_bytes: float
    line_no: int


@dataclass(frozen=True)
class TimerBlock:
    """One timer block, as `ParsedLog.timers` rebuilds it from the columns.  `minmax_ms` maps a timer
    name to (min ms, max ms) across ranks; `per_rank_ms` (option `all`) a name to {rank: ms}.  Values
    are ms per iteration (Megatron divides by log_interval).  `after_iteration`: the last iteration
    line seen before the block (0 if none)."""

    option: str  # "minmax", "max" or "all"
    after_iteration: int
    minmax_ms: dict[str, tuple[float, float]] = field(default_factory=dict)
    per_rank_ms: dict[str, dict[int, float]] = field(default_factory=dict)
    line_no: int = 0
    run: int = 0

    def max_ms(self, name: str) -> float | None:
        """The largest value of a timer across ranks, in ms, whatever the option."""
        if name in self.minmax_ms:
            return self.minmax_ms[name][1]
        if name in self.per_rank_ms and self.per_rank_ms[name]:
            return max(self.per_rank_ms[name].values())
        return None


@dataclass(frozen=True)
class LogProblem:
    """A line that looked like a Megatron report but did not parse."""

    line_no: int
    kind: str  # iteration, memory, timer
    reason: str
    text: str


@dataclass(frozen=True)
class RunStart:
    """Where one run of the log starts: its first iteration line (`index` into the iteration columns)."""

    index: int
    line_no: int
    iteration: int
    train_iters: int


class _Timers:
    """Timer values as columns: per block (after_iteration, run, line, option), per value (block,
    rank, ms) by timer name; min/max blocks keep (block, min, max)."""

    def __init__(self) -> None:
        self.after, self.run, self.line, self.option = array("q"), array("q"), array("q"), array("b")
        self.pairs: dict[str, tuple[array, array, array]] = {}  # name -> block, min, max
        self.ranks: dict[str, tuple[array, array, array]] = {}  # name -> block, rank, value

    def start(self, option: str, after: int, run: int, line_no: int) -> int:
        self.after.append(after)
        self.run.append(run)
        self.line.append(line_no)
        self.option.append(_OPTIONS.index(option))
        return len(self.after) - 1

    def add_pair(self, name: str, block: int, low: float, high: float) -> bool:
        return self._add(self.pairs, "d", name, block, low, high)

    def add_rank(self, name: str, block: int, rank: int, value: float) -> bool:
        return self._add(self.ranks, "q", name, block, rank, value)

    def _add(self, table: dict, middle: str, name: str, block: int, second: float, third: float) -> bool:
        """Append (block, second, third) to the timer's columns; False past MAX_TIMER_NAMES names."""
        cols = table.get(name)
        if cols is None:
            if len(self.pairs) + len(self.ranks) >= MAX_TIMER_NAMES:
                return False
            cols = table[name] = (array("i"), array(middle), array("d"))
        cols[0].append(block)
        cols[1].append(second)
        cols[2].append(third)
        return True


@dataclass
class ParsedLog:
    """Everything read from one log.  Use `steady_iterations(skip)` for timing."""

    source: str
    problems: list[LogProblem] = field(default_factory=list)
    problem_count: int = 0
    first_timestamp: str | None = None
    lines_read: int = 0
    memory_lines: int = 0
    runs: list[RunStart] = field(default_factory=list)
    run_count: int = 0
    # iteration columns: number, elapsed seconds, TFLOP/s per GPU, global batch, skipped + nan iterations of the
    # interval (nan / -1: not in the line)
    it_number: array = field(default_factory=lambda: array("q"))
    it_elapsed_s: array = field(default_factory=lambda: array("d"))
    it_tflops: array = field(default_factory=lambda: array("d"))
    it_gbs: array = field(default_factory=lambda: array("q"))
    it_skipped: array = field(default_factory=lambda: array("q"))
    it_line: array = field(default_factory=lambda: array("q"))
    peaks: dict[tuple[int, int], MemoryRecord] = field(default_factory=dict)  # (run, rank) -> peak record
    timer_cols: _Timers = field(default_factory=_Timers)
    # per run (the run whose iterations follow the lines), what its start-up lines state: STATED_ARGUMENTS' keys
    stated: dict[int, dict[str, int]] = field(default_factory=dict)

    def stated_config(self, run: int | None = None) -> dict[str, int]:
        """What the log's start-up lines state about the run's configuration (world size, tp, pp, cp, ep,
        dp, mbs, gbs, seq_length, num_layers; only those printed), for one run (0-based; None: the
        first, which is the whole log when it holds one)."""
        return dict(self.stated.get(run or 0, {}))

    # ---- runs

    def _run_range(self, run: int | None) -> range:
        """Iteration-column indices of one run (None: all)."""
        if run is None or not self.runs:
            return range(len(self.it_number))
        if not 0 <= run < len(self.runs):
            raise PlannerInputError("--log-run", f"{self.source} holds {self.run_count} run(s); got run {run + 1}")
        end = self.runs[run + 1].index if run + 1 < len(self.runs) else len(self.it_number)
        return range(self.runs[run].index, end)

    def run_of_iteration(self, index: int) -> int:
        k = 0
        while k + 1 < len(self.runs) and self.runs[k + 1].index <= index:
            k += 1
        return k

    # ---- iterations

    @property
    def iterations(self) -> list[IterationRecord]:
        """Every iteration line, rebuilt from the columns (numbers only; for small logs and tests)."""
        out = []
        for i in range(len(self.it_number)):
            fields = {}
            if not math.isnan(self.it_elapsed_s[i]):
                fields[ELAPSED_KEY] = repr(self.it_elapsed_s[i] * 1e3)
            if not math.isnan(self.it_tflops[i]):
                fields[THROUGHPUT_KEY] = repr(self.it_tflops[i])
            if self.it_gbs[i] >= 0:
                fields["global batch size"] = str(self.it_gbs[i])
            out.append(IterationRecord(self.it_number[i], 0, fields, self.it_line[i]))
        return out

    def after_warmup(self, skip: int = 2, run: int | None = None) -> range:
        """Indices of the iteration lines after the first `skip` ones of the run (the first lines
        include start-up time; megatron.md section 4)."""
        if skip < 0:
            raise PlannerInputError("--skip-iterations", f"must be >= 0, got {skip}")
        return self._run_range(run)[skip:]

    def skipped_lines(self, skip: int = 2, run: int | None = None) -> int:
        """Lines after the warm-up whose interval holds iterations that skipped their optimizer step."""
        after = self.after_warmup(skip, run)
        return int(np.count_nonzero(self._skip_counts(after) > 0))

    def _skip_counts(self, indices: range) -> np.ndarray:
        return (np.frombuffer(self.it_skipped, dtype=np.int64)[indices.start:indices.stop] if len(self.it_skipped)
                else np.empty(0, dtype=np.int64))

    def steady_indices(self, skip: int = 2, run: int | None = None) -> np.ndarray:
        """The lines timed (an index array, 8 bytes a line: a 1 GiB log holds millions): those after the warm-up,
        less those whose interval skipped optimizer steps (their time is not the run's) unless every line did."""
        after = self.after_warmup(skip, run)
        indices = np.arange(after.start, after.stop, dtype=np.int64)
        clean = self._skip_counts(after) <= 0
        if clean.size == 0 or clean.all() or not clean.any():
            return indices
        return indices[clean]

    def steady_iterations(self, skip: int = 2, run: int | None = None) -> list[int]:
        """The iteration numbers of the steady lines."""
        return self._numbers()[self.steady_indices(skip, run)].tolist()

    def steady_iteration_count(self, skip: int = 2, run: int | None = None) -> int:
        """The iterations the steady lines time: a line averages the iterations since the line before it (the
        log interval), one where it opens its run."""
        idx = self.steady_indices(skip, run)
        numbers = self._numbers()
        opens = np.isin(idx, [r.index for r in self.runs]) | (idx == 0)
        interval = np.maximum(1, numbers[idx] - numbers[np.maximum(idx - 1, 0)])
        return int(np.where(opens, 1, interval).sum())

    def _numbers(self) -> np.ndarray:
        return np.frombuffer(self.it_number, dtype=np.int64) if len(self.it_number) else np.empty(0, dtype=np.int64)

    def _steady_column(self, column: array, skip: int, run: int | None) -> np.ndarray:
        steady = self.steady_indices(skip, run)
        values = np.frombuffer(column, dtype=np.float64)[steady] if len(column) and steady.size else np.empty(0)
        return values[~np.isnan(values)]

    def median_iteration_time_s(self, skip: int = 2, run: int | None = None) -> float | None:
        """Median elapsed time per iteration over the steady lines, seconds; None if none."""
        times = self._steady_column(self.it_elapsed_s, skip, run)
        return float(np.median(times)) if times.size else None

    def median_throughput_tflops(self, skip: int = 2, run: int | None = None) -> float | None:
        values = self._steady_column(self.it_tflops, skip, run)
        return float(np.median(values)) if values.size else None

    def global_batch_size(self, skip: int = 2, run: int | None = None) -> int | None:
        return next((g for g in (self.it_gbs[i] for i in self.after_warmup(skip, run)) if g >= 0), None)

    # ---- memory

    def peak_memory_by_rank(self, run: int | None = None) -> dict[int, MemoryRecord]:
        """Per rank, the memory record with the largest max-reserved figure (the latest report
        includes optimizer state), over one run (None: all)."""
        out: dict[int, MemoryRecord] = {}
        for (r, rank), rec in sorted(self.peaks.items(), key=lambda kv: kv[1].line_no):
            if run is not None and r != run:
                continue
            best = out.get(rank)
            if best is None or rec.max_reserved_bytes >= best.max_reserved_bytes:
                out[rank] = rec
        return out

    # ---- timers

    @property
    def timers(self) -> list[TimerBlock]:
        """Every timer block, rebuilt from the columns (for small logs and tests)."""
        t = self.timer_cols
        blocks = [TimerBlock(_OPTIONS[t.option[b]], t.after[b], {}, {}, t.line[b], t.run[b]) for b in range(len(t.after))]
        for name, (blk, low, high) in t.pairs.items():
            for b, lo, hi in zip(blk, low, high):
                blocks[b].minmax_ms[name] = (lo, hi)
        for name, (blk, rank, value) in t.ranks.items():
            for b, r, v in zip(blk, rank, value):
                blocks[b].per_rank_ms.setdefault(name, {})[r] = v
        return blocks

    def _steady_blocks(self, skip: int, run: int | None) -> set[int]:
        """Timer blocks printed after the skipped iteration lines (of the run)."""
        indices = self._run_range(run)
        if len(indices) <= skip:
            return set()
        threshold = self.it_number[indices[skip - 1]] if skip > 0 else -1
        t = self.timer_cols
        return {b for b in range(len(t.after))
                if t.after[b] > threshold and (run is None or t.run[b] == run)}

    def steady_timers(self, skip: int = 2, run: int | None = None) -> list[TimerBlock]:
        steady = self._steady_blocks(skip, run)
        return [b for k, b in enumerate(self.timers) if k in steady]

    def median_timer_ms(self, name: str, skip: int = 2, run: int | None = None) -> float | None:
        """Median over steady timer blocks of the max-across-ranks value of one timer, ms."""
        steady = self._steady_blocks(skip, run)
        per_block: dict[int, float] = {}
        if name in self.timer_cols.pairs:
            blk, _low, high = self.timer_cols.pairs[name]
            per_block.update((b, h) for b, h in zip(blk, high) if b in steady)
        paired = set(per_block)
        if name in self.timer_cols.ranks:
            blk, _rank, value = self.timer_cols.ranks[name]
            for b, v in zip(blk, value):
                if b in steady and b not in paired:
                    per_block[b] = max(per_block.get(b, v), v)
        return statistics.median(per_block.values()) if per_block else None

    def median_timer_by_rank_ms(self, name: str, skip: int = 2, run: int | None = None) -> dict[int, float]:
        """Per rank (option `all` only), the median of one timer over steady blocks, ms."""
        steady = self._steady_blocks(skip, run)
        per_rank: dict[int, list[float]] = {}
        if name in self.timer_cols.ranks:
            blk, rank, value = self.timer_cols.ranks[name]
            for b, r, v in zip(blk, rank, value):
                if b in steady:
                    per_rank.setdefault(r, []).append(v)
        return {r: statistics.median(vals) for r, vals in sorted(per_rank.items())}

    def summary(self, skip: int = 2, run: int | None = None) -> dict:
        """A JSON-ready digest for reports."""
        return {
            "source": self.source,
            "lines_read": self.lines_read,
            "iteration_lines": len(self.it_number),
            "steady_iteration_lines": len(self.steady_indices(skip, run)),
            "skipped_iteration_lines": skip,
            "memory_lines": self.memory_lines,
            "timer_blocks": len(self.timer_cols.after),
            "problems": self.problem_count,
            "runs": self.run_count,
            "median_iteration_time_s": self.median_iteration_time_s(skip, run),
            "median_throughput_tflops": self.median_throughput_tflops(skip, run),
            "first_timestamp": self.first_timestamp,
        }


def _to_float(text: str | None) -> float | None:
    """A finite number, or None (unreadable, NaN or infinite values are not measurements)."""
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _timer_ms(text: str) -> float:
    """A timer value in ms; ValueError when it is not a finite number >= 0."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"timer value {text!r} is not a finite number >= 0")
    return value


def parse_iteration_line(line: str, line_no: int = 0) -> IterationRecord | LogProblem:
    """One iteration line with every `key: value` pair, or the problem with it."""
    body = _TIMESTAMP_RE.sub("", line)
    match = _ITER_RE.search(body)
    if match is None:
        return LogProblem(line_no, "iteration", "no 'iteration N/ M |' header", line.strip()[:200])
    rest = body[match.end():]
    fields = {k.strip(): v.strip() for k, v in _PAIR_RE.findall(rest)}
    return _checked_record(line, line_no, match, rest, fields)


def _checked_record(line: str, line_no: int, match: re.Match, rest: str,
                    fields: dict[str, str]) -> IterationRecord | LogProblem:
    try:
        record = IterationRecord(int(match.group(1)), int(match.group(2)), fields, line_no)
        if max(record.iteration, record.train_iters) >= 1 << 62:
            raise ValueError
    except ValueError:
        return LogProblem(line_no, "iteration", "unreadable iteration number", line.strip()[:200])
    if ELAPSED_KEY in rest and record.elapsed_s is None:
        return LogProblem(line_no, "iteration", "elapsed time present but not a finite number", line.strip()[:200])
    if record.elapsed_s is not None and not 0 < record.elapsed_s * 1e3 <= MAX_ELAPSED_MS:
        return LogProblem(line_no, "iteration", f"elapsed time {record.elapsed_s * 1e3:g} ms is not in "
                                                f"(0, {MAX_ELAPSED_MS:g}] ms", line.strip()[:200])
    if ELAPSED_KEY not in fields:
        return LogProblem(line_no, "iteration", "no elapsed time per iteration (truncated?)", line.strip()[:200])
    return record


_Figures = tuple  # (iteration, total, elapsed s, TFLOP/s per GPU or nan, global batch or -1, skipped or -1, line)
_SKIPPED_RE = re.compile(r"number of (?:skipped|nan) iterations:\s*(\d{1,18})\s*\|")


_ONE_LINE_RE = re.compile(  # Megatron's iteration line with the three figures in its order, in one search
    r"iteration\s+(\d{1,18})/\s*(\d{1,18})\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9.eE+-]+)\s*\|"
    r"(?:.*?throughput per GPU \(TFLOP/s/GPU\):\s*([0-9.eE+-]+)\s*\|)?(?:.*?global batch size:\s*(\d{1,18})\s*\|)?")
_SKIPPED_TAIL_RE = re.compile(  # after them, Megatron's skipped and nan counts (searched apart: 2x faster than optional
    # groups in _ONE_LINE_RE)
    r"number of skipped iterations:\s*(\d{1,18})\s*\|(?:.*?number of nan iterations:\s*(\d{1,18})\s*\|)?")


def _fast_iteration(line: str, line_no: int) -> _Figures | LogProblem:
    """parse_iteration_line for the figures the calibration reads, without the full field table
    (the same checks, in the same order)."""
    quick = _ONE_LINE_RE.search(line)
    if quick is not None:
        try:
            elapsed = float(quick.group(3))
            tflops = float(quick.group(4)) if quick.group(4) else NONE
        except ValueError:
            elapsed = NONE
        if 0 < elapsed <= MAX_ELAPSED_MS and (tflops != tflops or math.isfinite(tflops)):
            gbs = int(quick.group(5)) if quick.group(5) else -1
            tail = _SKIPPED_TAIL_RE.search(line, quick.end())
            skipped = -1 if tail is None else int(tail.group(1)) + int(tail.group(2) or 0)
            return int(quick.group(1)), int(quick.group(2)), elapsed / 1e3, tflops, gbs, skipped, line_no
    return _slow_iteration(line, line_no)


def _slow_iteration(line: str, line_no: int) -> _Figures | LogProblem:
    match = _ITER_RE.search(line)
    if match is None:
        return LogProblem(line_no, "iteration", "no 'iteration N/ M |' header", line.strip()[:200])
    rest = line[match.end():]
    found = _FIELD_RES[ELAPSED_KEY].search(rest)
    if found is None or not 0 < len(match.group(1)) < 19 or not 0 < len(match.group(2)) < 19:
        fields = {key: m.group(1) for key, rx in _FIELD_RES.items() if (m := rx.search(rest))}
        problem = _checked_record(line, line_no, match, rest, fields)
        if isinstance(problem, LogProblem):
            return problem
    elapsed = _to_float(found.group(1)) if found is not None else None
    if elapsed is None or not 0 < elapsed <= MAX_ELAPSED_MS:
        fields = {key: m.group(1) for key, rx in _FIELD_RES.items() if (m := rx.search(rest))}
        result = _checked_record(line, line_no, match, rest, fields)
        assert isinstance(result, LogProblem)
        return result
    tput = _FIELD_RES[THROUGHPUT_KEY].search(rest)
    tflops = _to_float(tput.group(1)) if tput is not None else None
    batch = _FIELD_RES["global batch size"].search(rest)
    gbs = _to_float(batch.group(1)) if batch is not None else None
    skipped = [int(n) for n in _SKIPPED_RE.findall(rest)]
    return (int(match.group(1)), int(match.group(2)), elapsed / 1e3, NONE if tflops is None else tflops,
            int(gbs) if gbs is not None and 0 <= gbs < 2.0**62 else -1, sum(skipped) if skipped else -1, line_no)


def _parse_memory(line: str, line_no: int) -> MemoryRecord | LogProblem:
    match = _MEMORY_RE.search(line)
    if match is None:
        return LogProblem(line_no, "memory", "memory line does not match the documented format", line.strip()[:200])
    rank, it, alloc, max_alloc, reserved, max_reserved = match.groups()
    mb = 1024.0 * 1024.0  # Megatron divides bytes by 1024*1024 and labels it MB
    try:
        values_mb = [float(v) for v in (alloc, max_alloc, reserved, max_reserved)]
        if not all(math.isfinite(v) and v <= MAX_MEMORY_MB for v in values_mb) or int(rank) > MAX_RANK:
            raise ValueError
        return MemoryRecord(int(rank), int(it), *(v * mb for v in values_mb), line_no)
    except ValueError:
        return LogProblem(line_no, "memory", f"unreadable number (or above {MAX_MEMORY_MB:g} MB, or a rank above "
                                             f"{MAX_RANK})", line.strip()[:200])


class _Reader:
    """The parser's state while lines stream by (one log)."""

    def __init__(self, log: ParsedLog):
        self.log = log
        self.last_iteration = 0
        self.last_total = -1
        self.block: int | None = None  # the timer block being read
        self.block_option = ""
        self.current_name: str | None = None

    def problem(self, line_no: int, kind: str, reason: str, text: str) -> None:
        self.log.problem_count += 1
        if len(self.log.problems) < MAX_PROBLEMS_KEPT:
            self.log.problems.append(LogProblem(line_no, kind, reason, text.strip()[:200]))

    def feed(self, line: str, line_no: int) -> None:
        log = self.log
        log.lines_read = line_no
        if self.block is not None:
            if self._timer_line(line, line_no):
                return
            self.block = None
        if log.first_timestamp is None:
            ts = _TIMESTAMP_RE.match(line)
            if ts:
                log.first_timestamp = ts.group(0).strip().strip("[]")
        if "iteration" in line and "memory (MB)" not in line and (
                "elapsed time per iteration" in line or _ITER_RE.search(line)):
            self._iteration(_fast_iteration(_TIMESTAMP_RE.sub("", line), line_no))
            return
        if "memory (MB)" in line:
            rec = _parse_memory(line, line_no)
            if isinstance(rec, LogProblem):
                self.problem(rec.line_no, rec.kind, rec.reason, rec.text)
            else:
                self._memory(rec)
            return
        if " ..." in line or "using world size" in line:
            self._stated(line)
            return
        if "across ranks" in line:
            header = _TIMER_HEADER_RE.match(line)
            if header:
                self.block_option = {"(min, max) time across ranks": "minmax",
                                     "max time across ranks": "max"}.get(header.group(1), "all")
                self.block = log.timer_cols.start(self.block_option, self.last_iteration, max(0, log.run_count - 1),
                                                  line_no)
                self.current_name = None
            else:
                self.problem(line_no, "timer", "timer header does not match", line)

    def _iteration(self, parsed: _Figures | LogProblem) -> None:
        log = self.log
        if isinstance(parsed, LogProblem):
            self.problem(parsed.line_no, parsed.kind, parsed.reason, parsed.text)
            return
        iteration, total, elapsed_s, tflops, gbs, skipped, line_no = parsed
        if not log.it_number or iteration <= self.last_iteration or total != self.last_total:
            log.run_count += 1
            if len(log.runs) < MAX_RUNS:
                log.runs.append(RunStart(len(log.it_number), line_no, iteration, total))
        self.last_iteration, self.last_total = iteration, total
        log.it_number.append(iteration)
        log.it_elapsed_s.append(elapsed_s)
        log.it_tflops.append(tflops)
        log.it_gbs.append(gbs)
        log.it_skipped.append(skipped)
        log.it_line.append(line_no)

    def _stated(self, line: str) -> None:
        """A start-up line stating the configuration: kept for the run that starts next (the first value
        of each key wins: the two start-up reports state the same arguments)."""
        log = self.log
        if log.run_count >= MAX_RUNS:
            return
        found: dict[str, int] = {}
        world = _WORLD_LINE_RE.search(line)
        if world is not None:
            found["world_size"] = int(world.group(1))
            found.update((_WORLD_LINE_KEYS[name], int(v)) for name, v in _WORLD_SIZES_RE.findall(line))
        else:
            arg = _ARGUMENT_RE.match(_TIMESTAMP_RE.sub("", line))
            if arg is None or arg.group(1) not in STATED_ARGUMENTS or not arg.group(2).isdigit():
                return  # another argument, or None
            found[STATED_ARGUMENTS[arg.group(1)]] = int(arg.group(2))
        kept = log.stated.setdefault(log.run_count, {})
        for key, value in found.items():
            if 0 < value < 1 << 62:
                kept.setdefault(key, value)

    def _memory(self, rec: MemoryRecord) -> None:
        log = self.log
        log.memory_lines += 1
        run = max(0, log.run_count - 1)
        if run >= MAX_RUNS:
            return
        key = (run, rec.rank)
        best = log.peaks.get(key)
        if best is None or rec.max_reserved_bytes >= best.max_reserved_bytes:
            log.peaks[key] = rec

    def _timer_line(self, raw: str, line_no: int) -> bool:
        """Read one line of the open timer block; False when the line ends the block."""
        line = raw[len(_TIMER_PREFIX):] if raw.startswith(_TIMER_PREFIX) else raw
        if not line.strip() or not line[:1].isspace() or _ends_timer_block(line):
            return False
        cols, block = self.log.timer_cols, self.block
        assert block is not None
        try:
            if self.block_option == "all":
                name_m = _TIMER_ALL_NAME_RE.match(line)
                rank_m = _TIMER_ALL_RANK_RE.match(line)
                if name_m:
                    self.current_name = name_m.group(1)
                elif rank_m and self.current_name is not None:
                    rank = int(rank_m.group(1))
                    if rank > MAX_RANK:
                        raise ValueError(f"rank above {MAX_RANK}")
                    if not cols.add_rank(self.current_name, block, rank, _timer_ms(rank_m.group(2))):
                        raise ValueError(f"more than {MAX_TIMER_NAMES} timer names")
                else:
                    raise ValueError("unreadable timer line")
            else:
                m = (_TIMER_MINMAX_RE if self.block_option == "minmax" else _TIMER_MAX_RE).match(line)
                if not m:
                    raise ValueError("unreadable timer line")
                low = _timer_ms(m.group(2))
                high = _timer_ms(m.group(3)) if self.block_option == "minmax" else low
                if not cols.add_pair(m.group(1), block, low, high):
                    raise ValueError(f"more than {MAX_TIMER_NAMES} timer names")
        except ValueError as exc:
            self.problem(line_no, "timer", str(exc), raw)
        return True


def _ends_timer_block(line: str) -> bool:
    """An indented line that starts another report (iteration lines begin with a space)."""
    return ("[Rank " in line or ("iteration" in line and _ITER_RE.search(line) is not None)
            or (line.lstrip().startswith("[") and _TIMESTAMP_RE.match(line) is not None))


def _feed_all(log: ParsedLog, lines: Iterator[str]) -> ParsedLog:
    reader = _Reader(log)
    for line_no, line in enumerate(lines, 1):
        reader.feed(line, line_no)
    return log


def parse_megatron_log_text(text: str, source: str = "<text>") -> ParsedLog:
    """Parse the text of a Megatron log; never raises on malformed lines (see ParsedLog.problems)."""
    return _feed_all(ParsedLog(source=source), iter(text.splitlines()))


READ_BYTES = 1 << 20


def _file_lines(fh: BinaryIO) -> Iterator[str]:
    """The file's lines, decoded (undecodable bytes replaced), each cut at MAX_LINE_BYTES, split as
    str.splitlines does (a carriage return ends a line too); read 1 MiB at a time."""
    tail = b""
    skipping = False  # inside an over-long line, after its first MAX_LINE_BYTES
    with fh:
        while chunk := fh.read(READ_BYTES):
            parts = (tail + chunk).split(b"\n")
            tail = parts.pop()
            if skipping and parts:  # the end of the over-long line
                del parts[0]
                skipping = False
            if parts:  # the final newline keeps an empty last line a line
                yield from (b"\n".join(parts) + b"\n").decode("utf-8", errors="replace").splitlines()
            if len(tail) > MAX_LINE_BYTES:
                if not skipping:
                    yield from tail[:MAX_LINE_BYTES].decode("utf-8", errors="replace").splitlines()
                tail, skipping = b"", True
    if tail and not skipping:
        yield from tail.decode("utf-8", errors="replace").splitlines()


def parse_megatron_log(path: str | Path) -> ParsedLog:
    """Read and parse a log file, streaming (see the module docstring)."""
    p = Path(path)
    fh = open_regular(p, "--megatron-log")
    if os.fstat(fh.fileno()).st_size > MAX_LOG_BYTES:
        fh.close()
        raise PlannerInputError("--megatron-log", f"{p} is larger than {MAX_LOG_BYTES >> 30} GiB; give the part of "
                                                  "the log with the steady iterations")
    try:
        return _feed_all(ParsedLog(source=p.name), _file_lines(fh))
    except OSError as exc:
        raise PlannerInputError("--megatron-log", f"cannot read {p}: {exc.strerror or exc}") from None
