"""Parse a Megatron-LM training log (formats: ../shared/reference/megatron.md section 4).

Reads three kinds of lines:
- iteration lines (printed by the last rank): elapsed time per iteration (ms), throughput per
  GPU (TFLOP/s/GPU), global batch size, and every other `key: value |` pair;
- memory lines (`[Rank r] (after it iterations) memory (MB) | allocated: ...`), one per rank
  with DP rank 0;
- timer blocks, in the `(min, max)`, `max` and `all` formats, with or without the
  `INFO:megatron.core.timers:` prefix.

Lines that look like one of these but do not parse (garbled, truncated) are counted and kept
in `ParsedLog.problems`; they never raise.  Everything else in the log is ignored.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import PlannerInputError
from planner.inputs.files import path_kind

_TIMESTAMP_RE = re.compile(r"^\s*\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?\]\s*")
_ITER_RE = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|")
_PAIR_RE = re.compile(r"\s*([^|:]+?):\s*([^|]+?)\s*\|")
_MEMORY_RE = re.compile(
    r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: ([\d.]+) \| "
    r"max allocated: ([\d.]+) \| reserved: ([\d.]+) \| max reserved: ([\d.]+)"
)
_TIMER_PREFIX_RE = re.compile(r"^(?:INFO:megatron\.core\.timers:)?")
_TIMER_HEADER_RE = re.compile(
    r"^(?:INFO:megatron\.core\.timers:)?\s*(\(min, max\) time across ranks|max time across ranks|"
    r"times across ranks) \(ms\):\s*$"
)
_TIMER_MINMAX_RE = re.compile(r"^\s+([\w\-.]+?)\s*\.*:\s*\(([\d.]+),\s*([\d.]+)\)\s*$")
_TIMER_MAX_RE = re.compile(r"^\s+([\w\-.]+?)\s*\.*:\s*([\d.]+)\s*$")
_TIMER_ALL_NAME_RE = re.compile(r"^\s+([\w\-.]+):\s*$")
_TIMER_ALL_RANK_RE = re.compile(r"^\s+rank\s+(\d+):\s*([\d.]+)\s*$")

ELAPSED_KEY = "elapsed time per iteration (ms)"
MAX_LOG_BYTES = 4 << 30  # a log is read whole
THROUGHPUT_KEY = "throughput per GPU (TFLOP/s/GPU)"


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
    """One timer block.  `minmax` maps a timer name to (min ms, max ms) across ranks; `per_rank`
    (option `all`) maps a name to {rank: ms}.  Values are ms per iteration (Megatron divides by
    log_interval).  `after_iteration` is the last iteration line seen before the block (0 if none)."""

    option: str  # "minmax", "max" or "all"
    after_iteration: int
    minmax_ms: dict[str, tuple[float, float]] = field(default_factory=dict)
    per_rank_ms: dict[str, dict[int, float]] = field(default_factory=dict)
    line_no: int = 0

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


@dataclass
class ParsedLog:
    """Everything read from one log.  Use `steady_iterations(skip)` for timing."""

    source: str
    iterations: list[IterationRecord] = field(default_factory=list)
    memory: list[MemoryRecord] = field(default_factory=list)
    timers: list[TimerBlock] = field(default_factory=list)
    problems: list[LogProblem] = field(default_factory=list)
    first_timestamp: str | None = None
    lines_read: int = 0

    def steady_iterations(self, skip: int = 2) -> list[IterationRecord]:
        """Iteration lines after the first `skip` ones that carry an elapsed time (the first
        lines include start-up time; megatron.md section 4)."""
        if skip < 0:
            raise PlannerInputError("--skip-iterations", f"must be >= 0, got {skip}")
        timed = [r for r in self.iterations if r.elapsed_s is not None]
        return timed[skip:]

    def median_iteration_time_s(self, skip: int = 2) -> float | None:
        """Median elapsed time per iteration over the steady lines, seconds; None if none."""
        times = [r.elapsed_s for r in self.steady_iterations(skip) if r.elapsed_s is not None]
        return statistics.median(times) if times else None

    def median_throughput_tflops(self, skip: int = 2) -> float | None:
        values = [r.throughput_tflops for r in self.steady_iterations(skip) if r.throughput_tflops is not None]
        return statistics.median(values) if values else None

    def peak_memory_by_rank(self) -> dict[int, MemoryRecord]:
        """Per rank, the memory record with the largest max-reserved figure (the latest report
        includes optimizer state)."""
        out: dict[int, MemoryRecord] = {}
        for rec in self.memory:
            best = out.get(rec.rank)
            if best is None or rec.max_reserved_bytes >= best.max_reserved_bytes:
                out[rec.rank] = rec
        return out

    def steady_timers(self, skip: int = 2) -> list[TimerBlock]:
        """Timer blocks printed after the skipped iteration lines."""
        timed = [r.iteration for r in self.iterations if r.elapsed_s is not None]
        if len(timed) <= skip:
            return []
        threshold = timed[skip - 1] if skip > 0 else -1
        return [b for b in self.timers if b.after_iteration > threshold]

    def median_timer_ms(self, name: str, skip: int = 2) -> float | None:
        """Median over steady timer blocks of the max-across-ranks value of one timer, ms."""
        values = [v for b in self.steady_timers(skip) if (v := b.max_ms(name)) is not None]
        return statistics.median(values) if values else None

    def median_timer_by_rank_ms(self, name: str, skip: int = 2) -> dict[int, float]:
        """Per rank (option `all` only), the median of one timer over steady blocks, ms."""
        per_rank: dict[int, list[float]] = {}
        for block in self.steady_timers(skip):
            for rank, value in block.per_rank_ms.get(name, {}).items():
                per_rank.setdefault(rank, []).append(value)
        return {rank: statistics.median(vals) for rank, vals in sorted(per_rank.items())}

    def summary(self, skip: int = 2) -> dict:
        """A JSON-ready digest for reports."""
        return {
            "source": self.source,
            "lines_read": self.lines_read,
            "iteration_lines": len(self.iterations),
            "steady_iteration_lines": len(self.steady_iterations(skip)),
            "skipped_iteration_lines": skip,
            "memory_lines": len(self.memory),
            "timer_blocks": len(self.timers),
            "problems": len(self.problems),
            "median_iteration_time_s": self.median_iteration_time_s(skip),
            "median_throughput_tflops": self.median_throughput_tflops(skip),
            "first_timestamp": self.first_timestamp,
        }


MAX_ELAPSED_MS = 1e9  # 11.6 days per iteration: anything above is not a real iteration time
MAX_MEMORY_MB = 1e9  # 1 PB per GPU: anything above is not a real memory figure


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


def _parse_iteration(line: str, line_no: int) -> IterationRecord | LogProblem:
    body = _TIMESTAMP_RE.sub("", line)
    match = _ITER_RE.search(body)
    if match is None:
        return LogProblem(line_no, "iteration", "no 'iteration N/ M |' header", line.strip()[:200])
    rest = body[match.end():]
    fields = {k.strip(): v.strip() for k, v in _PAIR_RE.findall(rest)}
    try:
        record = IterationRecord(int(match.group(1)), int(match.group(2)), fields, line_no)
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


def _parse_memory(line: str, line_no: int) -> MemoryRecord | LogProblem:
    match = _MEMORY_RE.search(line)
    if match is None:
        return LogProblem(line_no, "memory", "memory line does not match the documented format", line.strip()[:200])
    rank, it, alloc, max_alloc, reserved, max_reserved = match.groups()
    mb = 1024.0 * 1024.0  # Megatron divides bytes by 1024*1024 and labels it MB
    try:
        values_mb = [float(v) for v in (alloc, max_alloc, reserved, max_reserved)]
        if not all(math.isfinite(v) and v <= MAX_MEMORY_MB for v in values_mb):
            raise ValueError
        return MemoryRecord(int(rank), int(it), *(v * mb for v in values_mb), line_no)
    except ValueError:
        return LogProblem(line_no, "memory", f"unreadable number (or above {MAX_MEMORY_MB:g} MB)", line.strip()[:200])


def parse_megatron_log_text(text: str, source: str = "<text>") -> ParsedLog:
    """Parse the text of a Megatron log; never raises on malformed lines (see ParsedLog.problems)."""
    log = ParsedLog(source=source)
    lines = text.splitlines()
    log.lines_read = len(lines)
    last_iteration = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        line_no = i + 1
        if log.first_timestamp is None:
            ts = _TIMESTAMP_RE.match(line)
            if ts:
                log.first_timestamp = ts.group(0).strip().strip("[]")
        if "iteration" in line and ("elapsed time per iteration" in line or _ITER_RE.search(line)):
            if "memory (MB)" not in line:
                parsed = _parse_iteration(line, line_no)
                if isinstance(parsed, IterationRecord):
                    log.iterations.append(parsed)
                    last_iteration = parsed.iteration
                else:
                    log.problems.append(parsed)
                i += 1
                continue
        if "memory (MB)" in line:
            parsed_mem = _parse_memory(line, line_no)
            (log.memory if isinstance(parsed_mem, MemoryRecord) else log.problems).append(parsed_mem)
            i += 1
            continue
        header = _TIMER_HEADER_RE.match(line)
        if header:
            block, i = _parse_timer_block(lines, i, header.group(1), last_iteration, log.problems)
            log.timers.append(block)
            continue
        if "time across ranks" in line or "times across ranks" in line:
            log.problems.append(LogProblem(line_no, "timer", "timer header does not match", line.strip()[:200]))
        i += 1
    return log


def _ends_timer_block(line: str) -> bool:
    """An indented line that starts another report (iteration lines begin with a space)."""
    return bool(_TIMESTAMP_RE.match(line) or _ITER_RE.search(line) or "[Rank " in line)


def _parse_timer_block(
    lines: list[str], start: int, header: str, after_iteration: int, problems: list[LogProblem]
) -> tuple[TimerBlock, int]:
    """Read the indented lines after a timer header; return the block and the next line index."""
    option = {"(min, max) time across ranks": "minmax", "max time across ranks": "max"}.get(header, "all")
    minmax: dict[str, tuple[float, float]] = {}
    per_rank: dict[str, dict[int, float]] = {}
    current: str | None = None
    i = start + 1
    while i < len(lines):
        line = _TIMER_PREFIX_RE.sub("", lines[i], count=1)
        if not line.strip() or not line[:1].isspace() or _ends_timer_block(line):
            break
        if option == "all":
            name_m = _TIMER_ALL_NAME_RE.match(line)
            rank_m = _TIMER_ALL_RANK_RE.match(line)
            if name_m:
                current = name_m.group(1)
                per_rank[current] = {}
            else:
                try:
                    if not (rank_m and current is not None):
                        raise ValueError("unreadable timer line")
                    per_rank[current][int(rank_m.group(1))] = _timer_ms(rank_m.group(2))
                except ValueError as exc:
                    problems.append(LogProblem(i + 1, "timer", str(exc), lines[i].strip()[:200]))
        else:
            mm = _TIMER_MINMAX_RE.match(line)
            mx = _TIMER_MAX_RE.match(line)
            try:
                if option == "minmax" and mm:
                    minmax[mm.group(1)] = (_timer_ms(mm.group(2)), _timer_ms(mm.group(3)))
                elif option == "max" and mx:
                    minmax[mx.group(1)] = (_timer_ms(mx.group(2)), _timer_ms(mx.group(2)))
                else:
                    raise ValueError("unreadable timer line")
            except ValueError as exc:
                problems.append(LogProblem(i + 1, "timer", str(exc), lines[i].strip()[:200]))
        i += 1
    block = TimerBlock(option, after_iteration, minmax, per_rank, start + 1)
    return block, i


def parse_megatron_log(path: str | Path) -> ParsedLog:
    """Read and parse a log file (utf-8, undecodable bytes replaced)."""
    p = Path(path)
    kind = path_kind(p, "--megatron-log")
    if kind != "file":
        raise PlannerInputError("--megatron-log", f"no such file: {p}" if kind == "missing" else f"{p} is not a file")
    if p.stat().st_size > MAX_LOG_BYTES:
        raise PlannerInputError("--megatron-log", f"{p} is larger than {MAX_LOG_BYTES >> 30} GiB; give the part of "
                                                  "the log with the steady iterations")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise PlannerInputError("--megatron-log", f"cannot read {p}: {exc.strerror or exc}") from None
    return parse_megatron_log_text(text, source=p.name)
