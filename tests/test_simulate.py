"""Tests for the discrete-event pipeline schedule simulator (planner/simulate.py)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import PlannerInputError
from planner.simulate import (
    ScheduleResult,
    analytic_1f1b_s,
    interleaved_order,
    one_f_one_b_order,
    plot_timeline,
    simulate_pipeline,
)

EPS_S = 1e-9


# ---------------------------------------------------------------------------------------------------------
# An independent checker of the event list


def link_s(p2p_s: list[float], a: int, b: int) -> float:
    """Transfer time between ranks a and b as the simulator documents it (wrap-around link = max)."""
    if a == b:
        return 0.0
    if abs(a - b) == 1:
        return p2p_s[min(a, b)]
    return max(p2p_s)


def check_dependencies(result: ScheduleResult, p2p_s: list[float] | None = None) -> None:
    """Assert every op ran once, ranks never overlap, and each op started after its inputs arrived."""
    pp, vpp, m = result.num_stages, result.vpp, result.num_microbatches
    p2p_s = p2p_s if p2p_s is not None else [0.0] * (pp - 1)
    ops = {}
    for e in result.events:
        key = (e.kind, e.microbatch, e.chunk * pp + e.stage)
        assert key not in ops, f"op {key} ran twice"
        assert e.end_s >= e.start_s >= 0.0
        ops[key] = e
    assert len(ops) == 2 * m * vpp * pp
    last_g = vpp * pp - 1
    for (kind, j, g), e in ops.items():
        if kind == "F" and g > 0:
            prev = ops[("F", j, g - 1)]
            assert e.start_s >= prev.end_s + link_s(p2p_s, prev.stage, e.stage) - EPS_S, (kind, j, g)
        if kind == "B" and g < last_g:
            nxt = ops[("B", j, g + 1)]
            assert e.start_s >= nxt.end_s + link_s(p2p_s, nxt.stage, e.stage) - EPS_S, (kind, j, g)
        if kind == "B" and g == last_g:
            assert e.start_s >= ops[("F", j, g)].end_s - EPS_S, (kind, j, g)
    for stage in range(pp):
        mine = sorted((e for e in result.events if e.stage == stage), key=lambda e: e.start_s)
        for a, b in zip(mine, mine[1:]):
            assert b.start_s >= a.end_s - EPS_S, f"stage {stage} runs two ops at once"
    assert result.iteration_time_s == pytest.approx(max(e.end_s for e in result.events))


def stagewise_lower_bound_s(f: list[float], b: list[float], m: int, p2p_s: list[float]) -> float:
    """A bound any 1F1B run obeys: stage s cannot start before micro-batch 0 reaches it, does m*(f_s+b_s) of
    work, and its final backward must still travel back to stage 0; also one micro-batch's full round trip."""
    pp = len(f)
    best = sum(f) + sum(b) + 2 * sum(p2p_s)
    for s in range(pp):
        before = sum(f[k] + b[k] for k in range(s)) + 2 * sum(p2p_s[k] for k in range(s))
        best = max(best, before + m * (f[s] + b[s]))
    return best


# ---------------------------------------------------------------------------------------------------------
# 1F1B, uniform stages


@pytest.mark.parametrize("pp,m", [(2, 1), (2, 4), (3, 3), (4, 2), (4, 8), (8, 32), (16, 64)])
def test_uniform_1f1b_makespan_is_m_plus_pp_minus_1_slots(pp: int, m: int) -> None:
    """Equal stages, no p2p: makespan is exactly (m + PP - 1)(f + b) and within 1% of the analytic formula."""
    f_s, b_s = 1.25, 2.5
    result = simulate_pipeline([f_s] * pp, [b_s] * pp, m)
    expected_s = (m + pp - 1) * (f_s + b_s)
    assert result.iteration_time_s == pytest.approx(expected_s, rel=1e-12)
    analytic_s = analytic_1f1b_s([f_s] * pp, [b_s] * pp, m)
    assert abs(result.iteration_time_s - analytic_s) <= 0.01 * analytic_s
    # every stage does the same work, so every stage idles (PP - 1) slots
    for busy_s, bubble in zip(result.busy_s, result.bubble_fraction):
        assert busy_s == pytest.approx(m * (f_s + b_s))
        assert bubble == pytest.approx((pp - 1) / (m + pp - 1))
    check_dependencies(result)


def test_single_stage_is_serial_work() -> None:
    """One stage: makespan is m*(f+b) with no bubble, for both schedules."""
    for schedule, vpp in (("1f1b", 1), ("interleaved", 2)):
        result = simulate_pipeline([0.3], [0.7], 9, schedule=schedule, vpp=vpp)
        assert result.iteration_time_s == pytest.approx(9 * 1.0)
        assert result.bubble_fraction == [pytest.approx(0.0)]
        check_dependencies(result)


def test_hand_traced_two_stages_with_p2p() -> None:
    """PP=2, m=4, f=1, b=2, p2p=0.5: event times match a timeline traced by hand from the 1F1B rules."""
    result = simulate_pipeline([1.0, 1.0], [2.0, 2.0], 4, p2p_s=[0.5])
    # stage 0 runs F0 F1 B0 F2 B1 F3 B2 B3, stage 1 runs F0 B0 F1 B1 F2 B2 F3 B3; each op waits for its
    # producer's end + 0.5 s.  Traced on paper:
    expected = {
        (0, "F", 0): (0.0, 1.0), (0, "F", 1): (1.0, 2.0),
        (1, "F", 0): (1.5, 2.5), (1, "B", 0): (2.5, 4.5),
        (1, "F", 1): (4.5, 5.5), (0, "B", 0): (5.0, 7.0),
        (1, "B", 1): (5.5, 7.5), (0, "F", 2): (7.0, 8.0),
        (0, "B", 1): (8.0, 10.0), (1, "F", 2): (8.5, 9.5),
        (1, "B", 2): (9.5, 11.5), (0, "F", 3): (10.0, 11.0),
        (1, "F", 3): (11.5, 12.5), (0, "B", 2): (12.0, 14.0),
        (1, "B", 3): (12.5, 14.5), (0, "B", 3): (15.0, 17.0),
    }
    got = {(e.stage, e.kind, e.microbatch): (e.start_s, e.end_s) for e in result.events}
    assert got.keys() == expected.keys()
    for key, times_s in expected.items():
        assert got[key] == pytest.approx(times_s), key
    assert result.iteration_time_s == pytest.approx(17.0)


@pytest.mark.parametrize("pp,m", [(2, 16), (3, 24), (4, 9), (4, 32), (8, 17), (8, 64), (16, 128)])
def test_uniform_1f1b_with_p2p_matches_hand_formula_and_analytic(pp: int, m: int) -> None:
    """Uniform stages with p2p c: makespan equals the hand-derived schedule value, within 1% of the formula.

    Derivation: micro-batch 0 makes the round trip PP(f+b) + 2(PP-1)c; each later micro-batch adds f+b on
    every stage.  Stage 0 issues F(k+PP) only after B(k), and that chain crosses all 2(PP-1) links, so every
    PP micro-batches cost PP(f+b) + 2(PP-1)c, i.e. an extra 2c of idle on (PP-1) of every PP micro-batches
    (idle comes in whole 2c gaps): T = PP(f+b) + 2(PP-1)c + (m-1)(f+b) + 2c*floor((PP-1)(m-1)/PP).
    """
    f_s, b_s, c_s = 1.0, 2.0, 0.02
    result = simulate_pipeline([f_s] * pp, [b_s] * pp, m, p2p_s=[c_s] * (pp - 1))
    expected_s = (pp * (f_s + b_s) + 2 * (pp - 1) * c_s + (m - 1) * (f_s + b_s)
                  + 2 * c_s * ((pp - 1) * (m - 1) // pp))
    assert result.iteration_time_s == pytest.approx(expected_s, rel=1e-9)
    analytic_s = analytic_1f1b_s([f_s] * pp, [b_s] * pp, m, [c_s] * (pp - 1))
    print(f"PP={pp} m={m}: simulated {result.iteration_time_s:.4f} s, analytic {analytic_s:.4f} s, "
          f"diff {(result.iteration_time_s - analytic_s) / analytic_s:+.3%}")
    assert abs(result.iteration_time_s - analytic_s) <= 0.01 * analytic_s
    check_dependencies(result, [c_s] * (pp - 1))


def test_analytic_formula_by_hand() -> None:
    """analytic_1f1b_s charges each stage both neighbouring links: checked on a 3-stage example by hand."""
    # t = [1+2+0.1, 2+3+0.1+0.2, 1+1+0.2] = [3.1, 5.3, 2.2]; T = 10.6 + 4 * 5.3
    assert analytic_1f1b_s([1, 2, 1], [2, 3, 1], 5, [0.1, 0.2]) == pytest.approx(10.6 + 4 * 5.3)
    assert analytic_1f1b_s([1, 2, 1], [2, 3, 1], 5) == pytest.approx(10.0 + 4 * 5.0)


# ---------------------------------------------------------------------------------------------------------
# 1F1B, non-uniform stages


def test_slow_first_stage_hand_traced() -> None:
    """PP=2, stage 0 ten times slower, m=4: hand trace gives 80 s (the formula says 82 s)."""
    result = simulate_pipeline([10.0, 1.0], [10.0, 1.0], 4)
    # stage 0 never idles after F0: F0 F1 B0 F2 B1 F3 B2 B3 back to back (stage 1 always answers in 2 s,
    # well inside stage 0's 10 s forward), so T = 4 * 20 = 80.
    assert result.iteration_time_s == pytest.approx(80.0)
    assert analytic_1f1b_s([10.0, 1.0], [10.0, 1.0], 4) == pytest.approx(82.0)
    check_dependencies(result)


def test_non_uniform_stages_bounded_and_reported() -> None:
    """Mildly non-uniform stages: sim >= slowest stage's work and proven bounds, and within -25%/+5% of the formula."""
    rng = random.Random(20240611)
    worst_low, worst_high = 0.0, 0.0
    for _ in range(60):
        pp = rng.choice([2, 3, 4, 8, 16])
        m = pp * rng.randint(1, 6)
        f = [rng.uniform(0.5, 1.5) for _ in range(pp)]
        b = [x * rng.uniform(1.5, 2.5) for x in f]
        p2p = [rng.uniform(0.0, 0.05) for _ in range(pp - 1)]
        result = simulate_pipeline(f, b, m, p2p_s=p2p)
        check_dependencies(result, p2p)
        slowest_work_s = max(m * (x + y) for x, y in zip(f, b))
        assert result.iteration_time_s >= slowest_work_s - EPS_S
        assert result.iteration_time_s >= stagewise_lower_bound_s(f, b, m, p2p) - EPS_S
        analytic_s = analytic_1f1b_s(f, b, m, p2p)
        rel = (result.iteration_time_s - analytic_s) / analytic_s
        worst_low, worst_high = min(worst_low, rel), max(worst_high, rel)
        # The formula assumes the slowest stage never idles after its first forward and that all other
        # stages' work is exposed once; 1F1B lets fast stages overlap with it (sim below) and can make the
        # slowest stage wait (sim above).  With stages within 3x of each other both effects stay modest.
        assert -0.25 <= rel <= 0.05, (pp, m, rel)
    print(f"non-uniform 1F1B: simulated vs analytic ranges {worst_low:+.2%} .. {worst_high:+.2%}")


# ---------------------------------------------------------------------------------------------------------
# Interleaved


def test_interleaved_program_order_matches_megatron_rules() -> None:
    """Rank 0 of PP=2, vpp=2, m=4 issues ops in the order derived by hand from Megatron's interleaved rules."""
    # warm-up = (2-0-1)*2 + (2-1)*2 = 4 virtual micro-batches; forward chunk = (k mod 4)//2, backward reversed;
    # micro-batch = (k//4)*2 + k mod 2.
    expected = [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1),
        ("F", 2, 0), ("B", 0, 1), ("F", 3, 0), ("B", 1, 1),
        ("F", 2, 1), ("B", 0, 0), ("F", 3, 1), ("B", 1, 0),
        ("B", 2, 1), ("B", 3, 1), ("B", 2, 0), ("B", 3, 0),
    ]
    assert interleaved_order(2, 0, 4, 2) == expected
    # the last rank warms up only (vpp-1)*PP = 2
    assert interleaved_order(2, 1, 4, 2)[:4] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("B", 0, 1)]
    # m == PP: Megatron runs all forwards first
    assert [op[0] for op in interleaved_order(2, 1, 2, 2)] == ["F"] * 4 + ["B"] * 4


def test_one_f_one_b_program_order() -> None:
    """1F1B warm-up is min(PP-i-1, m) forwards, then F/B pairs, then the remaining backwards."""
    assert one_f_one_b_order(4, 0, 5) == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("F", 3, 0), ("B", 0, 0),
                                          ("F", 4, 0), ("B", 1, 0), ("B", 2, 0), ("B", 3, 0), ("B", 4, 0)]
    assert one_f_one_b_order(4, 0, 2) == [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("B", 1, 0)]


@pytest.mark.parametrize("pp,m,vpp", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (8, 32, 2), (4, 4, 2)])
def test_interleaving_shrinks_bubble_by_vpp(pp: int, m: int, vpp: int) -> None:
    """Uniform stages, same total work: interleaved idle time is (PP-1)(f+b)/vpp (Narayanan et al. 2021)."""
    f_s, b_s = 1.0, 2.0
    plain = simulate_pipeline([f_s] * pp, [b_s] * pp, m)
    inter = simulate_pipeline([f_s] * pp, [b_s] * pp, m, schedule="interleaved", vpp=vpp)
    check_dependencies(inter)
    for busy_s in inter.busy_s:
        assert busy_s == pytest.approx(m * (f_s + b_s))
    plain_bubble_s = plain.iteration_time_s - m * (f_s + b_s)
    inter_bubble_s = inter.iteration_time_s - m * (f_s + b_s)
    assert plain_bubble_s == pytest.approx((pp - 1) * (f_s + b_s))
    assert inter_bubble_s < plain_bubble_s
    assert inter_bubble_s == pytest.approx((pp - 1) * (f_s + b_s) / vpp, rel=1e-9)
    assert inter.mean_bubble_fraction < plain.mean_bubble_fraction


def test_interleaved_with_p2p_respects_dependencies() -> None:
    """Interleaved with unequal links (wrap-around link included) keeps every dependency."""
    p2p = [0.1, 0.3, 0.05]
    result = simulate_pipeline([1.0, 1.2, 0.8, 1.1], [2.0, 2.5, 1.5, 2.2], 8, p2p_s=p2p,
                               schedule="interleaved", vpp=2)
    check_dependencies(result, p2p)


# ---------------------------------------------------------------------------------------------------------
# Input checks


def test_interleaved_needs_multiple_of_pp() -> None:
    """Megatron's rule: interleaving needs m % PP == 0; the simulator raises ValueError naming the field."""
    with pytest.raises(ValueError, match="num_microbatches"):
        simulate_pipeline([1.0] * 4, [2.0] * 4, 6, schedule="interleaved", vpp=2)


@pytest.mark.parametrize("kwargs,field", [
    ({"forward_s": [1.0, -1.0]}, "forward_s"),
    ({"backward_s": [1.0]}, "backward_s"),
    ({"p2p_s": [0.1, 0.1]}, "p2p_s"),
    ({"num_microbatches": 0}, "num_microbatches"),
    ({"schedule": "zero-bubble"}, "schedule"),
    ({"vpp": 2}, "vpp"),
    ({"forward_s": [math.nan, 1.0]}, "forward_s"),
])
def test_bad_input_raises_planner_input_error(kwargs: dict, field: str) -> None:
    """Bad arguments raise PlannerInputError naming the offending argument."""
    args = {"forward_s": [1.0, 1.0], "backward_s": [2.0, 2.0], "num_microbatches": 4}
    args.update(kwargs)
    with pytest.raises(PlannerInputError) as info:
        simulate_pipeline(args.pop("forward_s"), args.pop("backward_s"), args.pop("num_microbatches"), **args)
    assert info.value.field == field


# ---------------------------------------------------------------------------------------------------------
# Drawing


def test_plot_timeline_writes_png(tmp_path: Path) -> None:
    """The timeline PNG is written, non-empty, and really a PNG, for both schedules."""
    for name, result in (
        ("plain", simulate_pipeline([1.0, 1.5, 1.0, 0.8], [2.0, 3.0, 2.0, 1.6], 8, p2p_s=[0.1] * 3)),
        ("inter", simulate_pipeline([1.0] * 4, [2.0] * 4, 8, schedule="interleaved", vpp=2)),
    ):
        path = plot_timeline(result, tmp_path / "sub" / f"{name}.png", title=name)
        assert path.exists()
        data = path.read_bytes()
        assert len(data) > 1000
        assert data[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------------------
# Properties


@st.composite
def pipelines(draw: st.DrawFn) -> dict:
    """Random stage times, links, micro-batch counts and schedules."""
    pp = draw(st.integers(1, 6))
    times = st.floats(0.01, 10.0, allow_nan=False, allow_infinity=False)
    schedule = draw(st.sampled_from(["1f1b", "interleaved"]))
    if schedule == "interleaved":
        vpp = draw(st.integers(1, 3))
        m = pp * draw(st.integers(1, 4))
    else:
        vpp = 1
        m = draw(st.integers(1, 12))
    return {
        "forward_s": draw(st.lists(times, min_size=pp, max_size=pp)),
        "backward_s": draw(st.lists(times, min_size=pp, max_size=pp)),
        "num_microbatches": m,
        "p2p_s": draw(st.lists(st.floats(0.0, 2.0), min_size=pp - 1, max_size=pp - 1)),
        "schedule": schedule,
        "vpp": vpp,
    }


@settings(max_examples=150, deadline=None)
@given(pipelines())
def test_random_pipelines_never_violate_dependencies(case: dict) -> None:
    """Random positive times: dependencies hold, makespan >= every stage's busy time, busy = its work."""
    result = simulate_pipeline(case["forward_s"], case["backward_s"], case["num_microbatches"],
                               p2p_s=case["p2p_s"], schedule=case["schedule"], vpp=case["vpp"])
    check_dependencies(result, case["p2p_s"])
    assert result.iteration_time_s >= max(result.busy_s) - EPS_S
    m = case["num_microbatches"]
    for i, busy_s in enumerate(result.busy_s):
        assert busy_s == pytest.approx(m * (case["forward_s"][i] + case["backward_s"][i]))
    if case["schedule"] == "1f1b":
        assert result.iteration_time_s >= stagewise_lower_bound_s(
            case["forward_s"], case["backward_s"], m, case["p2p_s"]) - 1e-6


def test_large_pipeline_is_fast() -> None:
    """PP=32, m=256, vpp=4 (65,536 ops) simulates and checks out in well under a few seconds."""
    import time

    start = time.perf_counter()
    result = simulate_pipeline([1.0] * 32, [2.0] * 32, 256, schedule="interleaved", vpp=4)
    elapsed_s = time.perf_counter() - start
    assert len(result.events) == 2 * 256 * 4 * 32
    assert result.iteration_time_s == pytest.approx(256 * 3.0 + 31 * 3.0 / 4)
    assert elapsed_s < 5.0


@settings(max_examples=60, deadline=None)
@given(pipelines())
def test_waiting_for_sends_is_never_faster(case: dict) -> None:
    """Megatron's waits for its own sends (wait_for_sends) only add to the non-blocking schedule: never faster,
    and equal without sends; dependencies still hold."""
    kw = dict(p2p_s=case["p2p_s"], schedule=case["schedule"], vpp=case["vpp"])
    free = simulate_pipeline(case["forward_s"], case["backward_s"], case["num_microbatches"], **kw)
    waits = simulate_pipeline(case["forward_s"], case["backward_s"], case["num_microbatches"], wait_for_sends=True,
                              **kw)
    check_dependencies(waits, case["p2p_s"])
    assert waits.iteration_time_s >= free.iteration_time_s - 1e-9
    if not any(case["p2p_s"]):
        assert waits.iteration_time_s == pytest.approx(free.iteration_time_s)
