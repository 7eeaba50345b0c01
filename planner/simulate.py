"""Discrete-event simulation of Megatron's pipeline schedules (1F1B and interleaved 1F1B).

This is an independent check on the analytic iteration-time formula of the cost model.  Instead of a
closed form, each pipeline rank executes its operations (forward or backward of one micro-batch on one
model chunk) one at a time, in exactly the order Megatron-LM issues them, and an operation starts only
when (a) the rank has finished its previous operation and (b) its cross-stage inputs have arrived:

* forward of micro-batch j on virtual stage g waits for the forward of j on virtual stage g-1, plus the
  point-to-point transfer time when the two stages sit on different ranks;
* backward of j on virtual stage g waits for the backward of j on virtual stage g+1 (plus p2p); on the
  last virtual stage it waits for its own forward of j.

Sends are modelled as non-blocking (the sender moves on at once; the receiver sees the data `p2p_s` later), or,
with `wait_for_sends`, as Megatron waits for them: under 1F1B a rank's send finishes before its next operation
starts; interleaved (overlap_p2p_comm), a forward's send runs during the next backward and must finish before the
rank's next forward, a backward's likewise before its next backward.  Then a rank can go no faster than its own
sends, which is what the cost model's exposed sends price (CostModel.p2p_s).
Data-parallel gradient reduction and the optimizer step are not part of the schedule and not simulated.

The analytic comparison `analytic_1f1b_s` is the textbook form the cost model uses
(DESIGN.md §3): T = sum_i t_i + (m - 1) * max_i t_i, t_i the forward+backward time of stage i per
micro-batch with its p2p included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from planner.errors import PlannerInputError

ScheduleName = Literal["1f1b", "interleaved"]
SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved")

# One operation of a rank's program: (kind 'F' or 'B', micro-batch, model chunk).
_Op = tuple[str, int, int]


@dataclass(frozen=True)
class ScheduleEvent:
    """One executed operation: `stage` is the pipeline rank, `chunk` its model chunk (0 unless interleaved)."""

    stage: int
    kind: Literal["F", "B"]
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class ScheduleResult:
    """Outcome of one simulated iteration (the pipeline part of it only)."""

    schedule: str
    num_stages: int
    num_microbatches: int
    vpp: int
    iteration_time_s: float
    busy_s: list[float]
    bubble_fraction: list[float]
    events: list[ScheduleEvent] = field(repr=False)

    @property
    def mean_bubble_fraction(self) -> float:
        """Idle share of all ranks together: 1 - sum(busy) / (PP * makespan)."""
        if self.iteration_time_s <= 0:
            return 0.0
        return 1.0 - sum(self.busy_s) / (self.num_stages * self.iteration_time_s)


# ----------------------------------------------------------------------------------------------------------
# Validation


def _check_times(name: str, values: list[float], length: int | None = None) -> list[float]:
    """Return `values` as floats after checking they are finite, non-negative and (optionally) of `length`."""
    out = [float(v) for v in values]
    if length is not None and len(out) != length:
        raise PlannerInputError(name, f"expected {length} values, got {len(out)}")
    for i, v in enumerate(out):
        if not v >= 0.0 or v == float("inf"):
            raise PlannerInputError(name, f"entry {i} is {v!r}; times must be finite and >= 0 seconds")
    return out


def _check_p2p(p2p_s: list[float] | None, num_stages: int) -> list[float]:
    """Per-boundary send times, length PP-1 (stage i -> i+1); zeros when not given."""
    if p2p_s is None:
        return [0.0] * max(num_stages - 1, 0)
    return _check_times("p2p_s", p2p_s, max(num_stages - 1, 0))


# ----------------------------------------------------------------------------------------------------------
# Per-rank programs, in Megatron's issue order


def one_f_one_b_order(num_stages: int, stage: int, num_microbatches: int) -> list[_Op]:
    """Megatron's non-interleaved 1F1B program for `stage`: warm-up forwards, 1F1B pairs, cool-down backwards."""
    num_warmup = min(num_stages - stage - 1, num_microbatches)
    num_remaining = num_microbatches - num_warmup
    ops: list[_Op] = [("F", j, 0) for j in range(num_warmup)]
    for k in range(num_remaining):
        ops.append(("F", num_warmup + k, 0))
        ops.append(("B", k, 0))
    ops.extend(("B", k, 0) for k in range(num_remaining, num_microbatches))
    return ops


def interleaved_order(num_stages: int, stage: int, num_microbatches: int, vpp: int) -> list[_Op]:
    """Megatron's interleaved 1F1B program for rank `stage` with `vpp` model chunks (groups of PP micro-batches).

    Virtual micro-batch k (0 <= k < m * vpp) maps to model chunk (k mod PP*vpp) // PP (reversed for backward)
    and micro-batch (k // (PP*vpp)) * PP + k mod PP.  Warm-up: all forwards when m == PP, otherwise
    (PP - rank - 1) * 2 + (vpp - 1) * PP, capped at m * vpp.
    """
    total = num_microbatches * vpp
    group = num_stages * vpp

    def chunk_of(k: int, forward: bool) -> int:
        chunk = (k % group) // num_stages
        return chunk if forward else vpp - 1 - chunk

    def microbatch_of(k: int) -> int:
        return (k // group) * num_stages + k % num_stages

    if num_microbatches == num_stages:
        num_warmup = total
    else:
        num_warmup = min((num_stages - stage - 1) * 2 + (vpp - 1) * num_stages, total)
    num_remaining = total - num_warmup
    ops: list[_Op] = [("F", microbatch_of(k), chunk_of(k, True)) for k in range(num_warmup)]
    for k in range(num_remaining):
        fk = num_warmup + k
        ops.append(("F", microbatch_of(fk), chunk_of(fk, True)))
        ops.append(("B", microbatch_of(k), chunk_of(k, False)))
    ops.extend(("B", microbatch_of(k), chunk_of(k, False)) for k in range(num_remaining, total))
    return ops


# ----------------------------------------------------------------------------------------------------------
# The simulation


def _link_s(p2p_s: list[float], from_rank: int, to_rank: int, wrap_s: float) -> float:
    """Transfer time between two ranks that hold consecutive virtual stages."""
    if from_rank == to_rank:
        return 0.0
    low = min(from_rank, to_rank)
    if abs(from_rank - to_rank) == 1:
        return p2p_s[low]
    return wrap_s  # last rank <-> first rank, only under interleaving


def simulate_pipeline(
    forward_s: list[float],
    backward_s: list[float],
    num_microbatches: int,
    *,
    p2p_s: list[float] | None = None,
    schedule: ScheduleName = "1f1b",
    vpp: int = 1,
    wait_for_sends: bool = False,
) -> ScheduleResult:
    """Simulate one iteration of Megatron's pipeline schedule and return its timeline.

    forward_s[i] / backward_s[i]: per-micro-batch forward / backward seconds of pipeline rank i (for
    `interleaved`, of the whole rank: each of its `vpp` chunks takes 1/vpp of it).  p2p_s[i]: seconds to send
    one activation (or its gradient) from rank i to rank i+1, length PP-1, same in both directions; under
    interleaving the wrap-around link from the last rank to the first takes max(p2p_s).  `wait_for_sends`: a
    rank waits for its own sends as Megatron does (see the module docstring).
    Raises PlannerInputError (a ValueError) on bad input, including m % PP != 0 for `interleaved`.
    """
    if schedule not in SCHEDULES:
        raise PlannerInputError("schedule", f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    if len(forward_s) == 0:
        raise PlannerInputError("forward_s", "need at least one pipeline stage")
    num_stages = len(forward_s)
    fwd_s = _check_times("forward_s", forward_s)
    bwd_s = _check_times("backward_s", backward_s, num_stages)
    links_s = _check_p2p(p2p_s, num_stages)
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise PlannerInputError("num_microbatches", f"must be an integer >= 1, got {num_microbatches!r}")
    if isinstance(vpp, bool) or not isinstance(vpp, int) or vpp < 1:
        raise PlannerInputError("vpp", f"must be an integer >= 1, got {vpp!r}")
    if schedule == "1f1b" and vpp != 1:
        raise PlannerInputError("vpp", f"the 1f1b schedule has one chunk per rank (vpp=1), got {vpp}")
    if schedule == "interleaved" and num_microbatches % num_stages != 0:
        raise PlannerInputError(
            "num_microbatches",
            f"the interleaved schedule needs a multiple of PP={num_stages} micro-batches, got {num_microbatches}",
        )

    chunks = vpp if schedule == "interleaved" else 1
    if schedule == "interleaved":
        programs = [interleaved_order(num_stages, r, num_microbatches, chunks) for r in range(num_stages)]
    else:
        programs = [one_f_one_b_order(num_stages, r, num_microbatches) for r in range(num_stages)]
    return _run(programs, fwd_s, bwd_s, links_s, num_microbatches, chunks, schedule, wait_for_sends)


def _ready_s(done_s: dict, links_s: list[float], wrap_s: float, num_stages: int, num_virtual: int, rank: int,
             kind: str, mb: int, chunk: int) -> float | None:
    """Arrival time of an op's inputs (`done_s`: end time of each finished op by (kind, micro-batch, virtual
    stage)), or None if a producer has not run yet."""
    g = chunk * num_stages + rank
    if kind == "F":
        if g == 0:
            return 0.0
        prev = done_s.get(("F", mb, g - 1))
        if prev is None:
            return None
        return prev + _link_s(links_s, (g - 1) % num_stages, rank, wrap_s)
    if g == num_virtual - 1:
        return done_s.get(("F", mb, g))
    nxt = done_s.get(("B", mb, g + 1))
    if nxt is None:
        return None
    return nxt + _link_s(links_s, (g + 1) % num_stages, rank, wrap_s)


def _run(
    programs: list[list[_Op]],
    fwd_s: list[float],
    bwd_s: list[float],
    links_s: list[float],
    num_microbatches: int,
    chunks: int,
    schedule: str,
    wait_for_sends: bool = False,
) -> ScheduleResult:
    """Execute the rank programs: each op starts at max(rank free, inputs arrived, and with `wait_for_sends` the
    rank's earlier send it must wait for); event-driven, O(#ops)."""
    num_stages = len(programs)
    num_virtual = num_stages * chunks
    wrap_s = max(links_s) if links_s else 0.0
    # end time of each finished op, keyed by (kind, microbatch, virtual stage)
    done_s: dict[tuple[str, int, int], float] = {}
    next_index = [0] * num_stages
    free_at_s = [0.0] * num_stages
    busy_s = [0.0] * num_stages
    events: list[ScheduleEvent] = []
    pending = list(range(num_stages))  # ranks that may be able to make progress
    remaining = sum(len(p) for p in programs)
    sent_s = [{"F": 0.0, "B": 0.0} for _ in range(num_stages)]  # when each rank's last send of a kind finished

    while pending:
        rank = pending.pop()
        program = programs[rank]
        while next_index[rank] < len(program):
            kind, mb, chunk = program[next_index[rank]]
            arrive_s = _ready_s(done_s, links_s, wrap_s, num_stages, num_virtual, rank, kind, mb, chunk)
            if arrive_s is None:
                break
            duration_s = (fwd_s[rank] if kind == "F" else bwd_s[rank]) / chunks
            start_s = max(free_at_s[rank], arrive_s)
            if wait_for_sends:
                start_s = max(start_s, sent_s[rank][kind] if schedule == "interleaved" else max(sent_s[rank].values()))
            end_s = start_s + duration_s
            g = chunk * num_stages + rank
            if wait_for_sends:
                to = g + 1 if kind == "F" else g - 1
                if 0 <= to < num_virtual:
                    sent_s[rank][kind] = end_s + _link_s(links_s, rank, to % num_stages, wrap_s)
            done_s[(kind, mb, g)] = end_s
            free_at_s[rank] = end_s
            busy_s[rank] += duration_s
            events.append(ScheduleEvent(rank, kind, mb, chunk, start_s, end_s))  # type: ignore[arg-type]
            next_index[rank] += 1
            remaining -= 1
            # wake the ranks that consume this op's output
            if kind == "F" and g + 1 < num_virtual:
                pending.append((g + 1) % num_stages)
            elif kind == "B" and g > 0:
                pending.append((g - 1) % num_stages)
    if remaining:
        stuck = {r: programs[r][next_index[r]] for r in range(num_stages) if next_index[r] < len(programs[r])}
        raise RuntimeError(f"pipeline schedule deadlocked; next op per rank: {stuck}")

    makespan_s = max(free_at_s)
    bubble = [(1.0 - b / makespan_s) if makespan_s > 0 else 0.0 for b in busy_s]
    return ScheduleResult(
        schedule=schedule,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        vpp=chunks,
        iteration_time_s=makespan_s,
        busy_s=busy_s,
        bubble_fraction=bubble,
        events=events,
    )


# ----------------------------------------------------------------------------------------------------------
# The analytic formula, for comparison


def analytic_1f1b_s(
    forward_s: list[float],
    backward_s: list[float],
    m: int,
    p2p_s: list[float] | None = None,
) -> float:
    """Textbook 1F1B time: sum_i t_i + (m - 1) * max_i t_i, t_i = f_i + b_i + p2p_s[i-1] + p2p_s[i].

    This is the form the cost model uses for the pipeline part of the iteration (DESIGN.md §3), with stage i
    charged both of its neighbouring links once per micro-batch (it receives an activation and sends one, sends
    a gradient and receives one; the first/last stage have one neighbour).  Then sum_i t_i is exactly the
    first micro-batch's round trip, every link crossed once each way.  For uniform stages the simulated steady
    state advances by f + b + 2 * p2p * (PP - 1) / PP per micro-batch, so this form is slightly pessimistic
    there (by about 2 * p2p / PP per micro-batch); `simulate_pipeline` gives the exact schedule.
    """
    if len(forward_s) == 0:
        raise PlannerInputError("forward_s", "need at least one pipeline stage")
    fwd_s = _check_times("forward_s", forward_s)
    bwd_s = _check_times("backward_s", backward_s, len(fwd_s))
    links_s = [0.0] + _check_p2p(p2p_s, len(fwd_s)) + [0.0]  # links_s[i], links_s[i+1]: stage i's neighbours
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise PlannerInputError("num_microbatches", f"must be an integer >= 1, got {m!r}")
    stage_s = [f + b + links_s[i] + links_s[i + 1] for i, (f, b) in enumerate(zip(fwd_s, bwd_s))]
    return sum(stage_s) + (m - 1) * max(stage_s)


# ----------------------------------------------------------------------------------------------------------
# Drawing

_COLOURS = {"F": ("#4C72B0", "#8FAADC"), "B": ("#DD8452", "#F2B48A")}  # (even chunk, odd chunk)
_MAX_LABELS = 4000


def plot_timeline(result: ScheduleResult, path: Path, title: str = "") -> Path:
    """Draw the schedule as a Gantt chart (one row per stage, forward/backward in two colours) into a PNG.

    Micro-batch numbers are written inside boxes wide enough to hold them.  Uses the Agg canvas directly, so
    the global matplotlib backend is left alone.  Returns `path`.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    num_stages = result.num_stages
    width_in = 14.0
    height_in = max(2.5, 0.45 * num_stages + 1.5)
    fig = Figure(figsize=(width_in, height_in), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    makespan_s = result.iteration_time_s or 1.0
    bar_h = 0.8

    # Odd model chunks (interleaved schedule) are drawn in a lighter shade of the same colour.
    spans: dict[tuple[int, str, int], list[tuple[float, float]]] = {}
    for e in result.events:
        spans.setdefault((e.stage, e.kind, e.chunk % 2), []).append((e.start_s, e.end_s - e.start_s))
    for (stage, kind, shade), boxes in spans.items():
        ax.broken_barh(boxes, (stage - bar_h / 2, bar_h), facecolors=_COLOURS[kind][shade], edgecolors="white",
                       linewidth=0.3)

    # Label boxes whose on-screen width fits the number (about 7 px per digit at fontsize 7).
    axes_px = width_in * 100 * 0.75
    if len(result.events) <= _MAX_LABELS:
        for e in result.events:
            text = str(e.microbatch)
            box_px = (e.end_s - e.start_s) / makespan_s * axes_px
            if box_px >= 6.0 * len(text) + 4.0:
                ax.text((e.start_s + e.end_s) / 2, e.stage, text, ha="center", va="center", fontsize=7,
                        color="white")

    ax.set_ylim(num_stages - 0.5, -0.5)
    ax.set_yticks(range(num_stages))
    ax.set_yticklabels([f"stage {i}" for i in range(num_stages)])
    ax.set_xlim(0, makespan_s)
    ax.set_xlabel("time (s)")
    default_title = (f"{result.schedule} schedule, PP={num_stages}, m={result.num_microbatches}"
                     + (f", vpp={result.vpp}" if result.vpp > 1 else "")
                     + f": {result.iteration_time_s:.4g} s, bubble {result.mean_bubble_fraction:.1%}")
    ax.set_title(title or default_title)
    handles = [Patch(color=_COLOURS["F"][0], label="forward"), Patch(color=_COLOURS["B"][0], label="backward")]
    if result.vpp > 1:
        handles += [Patch(color=_COLOURS["F"][1], label="forward, odd chunk"),
                    Patch(color=_COLOURS["B"][1], label="backward, odd chunk")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
