"""Megatron log parsing and router statistics (formats from reference/megatron.md section 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.calibration import megatron_log
from planner.calibration.megatron_log import parse_iteration_line, parse_megatron_log, parse_megatron_log_text
from planner.calibration.router_stats import load_router_stats
from planner.errors import PlannerInputError

LOGS = Path(__file__).parent / "data" / "logs"


def test_core018_iteration_lines_and_steady_median():
    """Iteration lines parse; the first two are skipped; median of 1500, 1490, 1502 ms is 1.500 s."""
    log = parse_megatron_log(LOGS / "megatron_core018_minmax.log")
    assert [r.iteration for r in log.iterations] == [1, 10, 20, 30, 40]
    first = next(line for line in (LOGS / "megatron_core018_minmax.log").read_text().splitlines() if "iteration" in line)
    assert parse_iteration_line(first).fields["lm loss"] == "7.500000E+00"
    assert parse_iteration_line(first).fields["load_balancing_loss"] == "1.02"
    assert log.iterations[0].global_batch_size == 64 and log.run_count == 1
    assert log.median_iteration_time_s(skip=2) == pytest.approx(1.500)
    assert log.median_iteration_time_s(skip=0) == pytest.approx(1.502)
    assert log.median_throughput_tflops(skip=2) == pytest.approx(120.0, abs=0.2)
    assert log.first_timestamp == "2025-03-04 10:00:00.000000"


def test_core018_memory_per_rank_takes_latest_peak():
    """Memory lines from ranks 0,1,4,5 parse in MB (1024^2 bytes); the later report wins."""
    log = parse_megatron_log(LOGS / "megatron_core018_minmax.log")
    peaks = log.peak_memory_by_rank()
    assert sorted(peaks) == [0, 1, 4, 5]
    assert peaks[0].iteration == 10
    assert peaks[0].max_reserved_bytes == pytest.approx(37500.0 * 1024**2)
    assert peaks[4].max_allocated_bytes == pytest.approx(30000.0 * 1024**2)


def test_minmax_timers_after_skip():
    """(min, max) timer blocks parse; steady blocks are those after the skipped iteration lines."""
    log = parse_megatron_log(LOGS / "megatron_core018_minmax.log")
    assert len(log.timers) == 5
    assert log.timers[0].minmax_ms["all-grads-sync"] == (40.0, 45.0)
    steady = log.steady_timers(skip=2)
    assert [b.after_iteration for b in steady] == [20, 30, 40]
    # forward-backward max = 0.92 * elapsed: median of 0.92*(1500, 1490, 1502)
    assert log.median_timer_ms("forward-backward", skip=2) == pytest.approx(0.92 * 1500.0, abs=0.01)


def test_garbled_and_truncated_lines_are_reported_not_fatal():
    """The fixture's truncated iteration line, garbled memory line and garbled iteration line are
    counted as problems while every good line still parses."""
    log = parse_megatron_log(LOGS / "megatron_core018_minmax.log")
    kinds = sorted(p.kind for p in log.problems)
    assert kinds == ["iteration", "iteration", "memory"]
    assert all(p.line_no > 0 for p in log.problems)
    assert log.summary()["problems"] == 3


def test_core015_all_option_with_info_prefix():
    """`times across ranks` blocks behind the INFO:megatron.core.timers: prefix give per-rank values;
    timestamps without fractions parse; memory lines with the device-memory field parse."""
    log = parse_megatron_log(LOGS / "megatron_core015_all_timers.log")
    assert [r.iteration for r in log.iterations] == [1, 5, 10, 15]
    assert log.iterations[1].throughput_tflops is None
    assert len(log.timers) == 4 and log.timers[0].option == "all"
    per_rank = log.median_timer_by_rank_ms("backward-compute", skip=2)
    # steady blocks are k=2,3: rank r value = 500 + 10 r + k -> median 500 + 10 r + 2.5
    assert per_rank == pytest.approx({0: 502.5, 1: 512.5, 2: 522.5, 3: 532.5})
    assert log.problems == []
    assert sorted(log.peak_memory_by_rank()) == [0, 2]


def test_cut_off_log_and_noise():
    """A log cut off mid-line and full of unrelated text parses to what is complete."""
    text = (
        "some banner\n"
        " [2025-01-01 00:00:00] iteration        1/      10 | consumed samples:            8 | "
        "elapsed time per iteration (ms): 100.0 | global batch size:     8 |\n"
        "> building dataset: iterations requested\n"
        " [2025-01-01 00:00:01] iteration        2/      10 | consumed samples:           16 | "
        "elapsed time per iteration (ms): 50.0 |\n"
        " [2025-01-01 00:00:02] iteration        3/      10 | consumed sam"
    )
    log = parse_megatron_log_text(text)
    assert [r.iteration for r in log.iterations] == [1, 2]
    assert len(log.problems) == 1
    assert log.median_iteration_time_s(skip=1) == pytest.approx(0.05)
    assert log.median_iteration_time_s(skip=5) is None


def test_missing_log_names_flag(tmp_path):
    """A missing log file raises PlannerInputError naming --megatron-log."""
    with pytest.raises(PlannerInputError, match="--megatron-log"):
        parse_megatron_log(tmp_path / "nope.log")


def test_router_imbalance_hand_computed(tmp_path):
    """Two ranks' counts are summed per expert: layer 0 -> [10,30,20,20] (max/mean 1.5), layer 1 ->
    [25]*4 (1.0); the factor is their mean, 1.25."""
    (tmp_path / "router_stats_rank0.csv").write_text(
        "layer,expert,tokens\n0,0,10\n0,1,10\n0,2,0\n0,3,10\n1,0,10\n1,1,15\n1,2,5\n1,3,20\n"
    )
    (tmp_path / "router_stats_rank1.csv").write_text(
        "layer,expert,tokens\n0,0,0\n0,1,20\n0,2,20\n0,3,10\n1,0,15\n1,1,10\n1,2,20\n1,3,5\n"
    )
    stats = load_router_stats(tmp_path)
    assert stats.layers == [0, 1]
    assert stats.imbalance_factor() == pytest.approx(1.25)


def test_router_csv_with_iterations_and_idle_experts(tmp_path):
    """Per-iteration rows are kept apart; an expert absent from the file counts as 0 tokens when
    num_experts is given: [30, 10, 0, 0] -> max/mean = 30/10 = 3; iteration 2: [20,20,0,0] -> 2."""
    f = tmp_path / "r.csv"
    f.write_text("iteration,layer,expert,tokens\n1,0,0,30\n1,0,1,10\n2,0,0,20\n2,0,1,20\n")
    assert load_router_stats(f).imbalance_factor() == pytest.approx((1.5 + 1.0) / 2)
    assert load_router_stats(f, num_experts=4).imbalance_factor() == pytest.approx((3.0 + 2.0) / 2)


def test_router_bad_csv(tmp_path):
    """Missing columns and non-numeric cells raise PlannerInputError naming --router-stats."""
    f = tmp_path / "bad.csv"
    f.write_text("layer,tokens\n0,5\n")
    with pytest.raises(PlannerInputError, match="--router-stats.*missing columns"):
        load_router_stats(f)
    f.write_text("layer,expert,tokens\n0,x,5\n")
    with pytest.raises(PlannerInputError, match="--router-stats"):
        load_router_stats(f)


def test_the_file_is_streamed_like_the_text(tmp_path, monkeypatch):
    """Reading the file in chunks (lines split across them, a carriage return ending a line, a line far
    longer than MAX_LINE_BYTES cut there) parses as the whole text does; unreadable lines are all counted
    and the first MAX_PROBLEMS_KEPT kept."""
    monkeypatch.setattr(megatron_log, "READ_BYTES", 97)  # chunks end mid-line
    monkeypatch.setattr(megatron_log, "MAX_PROBLEMS_KEPT", 3)
    fixture = (LOGS / "megatron_core018_minmax.log").read_text()
    garbled = "".join(f" iteration {i}/ 40 | elapsed time per iteration (ms): x |\n" for i in range(5))
    text = fixture + "\r\nprogress 1\rprogress 2\n" + "y" * (3 * megatron_log.MAX_LINE_BYTES) + "\n" + garbled
    path = tmp_path / "run.log"
    path.write_text(text)
    from_file = parse_megatron_log(path)
    from_text = parse_megatron_log_text(text)
    assert from_file.steady_iterations() == from_text.steady_iterations() == [20, 30, 40]
    assert from_file.median_iteration_time_s() == from_text.median_iteration_time_s() == pytest.approx(1.5)
    assert from_file.problem_count == from_text.problem_count == 3 + 5
    assert len(from_file.problems) == 3
    assert from_file.lines_read == from_text.lines_read


def test_runs_are_told_apart():
    """A restart (the iteration number goes back) or another total starts a new run; statistics can be
    taken over one run."""
    line = (" iteration {it:>8}/{total:>8} | elapsed time per iteration (ms): {ms} | global batch size: 64 |")
    text = "\n".join([line.format(it=i, total=10, ms=100.0) for i in range(1, 6)]
                     + [line.format(it=i, total=10, ms=300.0) for i in range(3, 8)]  # resumed at 3
                     + [line.format(it=i, total=20, ms=200.0) for i in range(8, 12)])  # the total changed
    log = parse_megatron_log_text(text)
    assert log.run_count == 3 and [r.line_no for r in log.runs] == [1, 6, 11]
    assert [log.median_iteration_time_s(skip=1, run=k) for k in range(3)] == pytest.approx([0.1, 0.3, 0.2])
    assert log.steady_iterations(skip=2, run=1) == [5, 6, 7]


def test_the_configuration_the_log_states():
    """Megatron's start-up lines (NVIDIA/Megatron-LM@d98e8a64dd megatron/training/arguments.py: `using world size:
    ...` and `_print_args`) state the run's configuration; each run of a concatenated log keeps its own, an
    older version's "encoder-tensor-model-parallel size" is not TP, and None values are not stated."""
    assert parse_megatron_log(LOGS / "megatron_core018_minmax.log").stated_config() == {
        "world_size": 8, "dp": 2, "cp": 1, "tp": 2, "pp": 2}
    assert parse_megatron_log(LOGS / "megatron_core015_all_timers.log").stated_config() == {}

    def run(world: int, tp: int, layers: str) -> str:
        return (f"using world size: {world}, data-parallel size: 1, context-parallel size: 1, hierarchical "
                f"context-parallel sizes: None, tensor-model-parallel size: {tp}, encoder-tensor-model-parallel "
                "size: 0, pipeline-model-parallel size: 1, encoder-pipeline-model-parallel size: 0\n"
                "------------------------ arguments ------------------------\n"
                "  expert_model_parallel_size ...................... 2\n"
                f"  num_layers ...................................... {layers}\n"
                "  seq_length ...................................... 4096\n"
                "-------------------- end of arguments ---------------------\n"
                " iteration        1/       2 | elapsed time per iteration (ms): 900.0 | global batch size:    16 |\n"
                " iteration        2/       2 | elapsed time per iteration (ms): 900.0 | global batch size:    16 |\n")

    log = parse_megatron_log_text(run(4, 4, "None") + run(8, 8, "32"))
    assert log.run_count == 2
    assert log.stated_config(0) == {"world_size": 4, "dp": 1, "cp": 1, "tp": 4, "pp": 1, "ep": 2, "seq_length": 4096}
    assert log.stated_config(1) == {"world_size": 8, "dp": 1, "cp": 1, "tp": 8, "pp": 1, "ep": 2, "seq_length": 4096,
                                    "num_layers": 32}
    assert log.problem_count == 0


def _line(it: int, ms: float, skipped: int = 0, nan: int = 0, interval: int = 10) -> str:
    return (f" iteration {it * interval:8d}/     100 | consumed samples: {it * 640:10d} | elapsed time per iteration "
            f"(ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): 100.0 | learning rate: 1.0E-04 | global batch "
            f"size:    64 | lm loss: {'nan' if nan else '7.5E+00'} | loss scale: 65536.0 | number of skipped "
            f"iterations: {skipped:3d} | number of nan iterations: {nan:3d} |")


@pytest.mark.parametrize("fast", [True, False])
def test_lines_whose_interval_skipped_optimizer_steps_are_not_timed(monkeypatch, fast):
    """walk55: an fp16 loss-scale overflow or a NaN loss skips the optimizer step, so its log line's time is short;
    such lines are left out of the median where others remain (1000, 1000, 1010 ms; not 600 and 700), counted, and
    timed only where every line has them.  The count of steady iterations is the iterations the lines average
    (log interval 10), not the lines.  Both the fast and the full line reader."""
    if not fast:
        monkeypatch.setattr(megatron_log, "_ONE_LINE_RE", __import__("re").compile(r"(?!)"))
    text = "\n".join([_line(1, 3000), _line(2, 1500), _line(3, 600, skipped=3), _line(4, 1000), _line(5, 1000),
                      _line(6, 700, nan=1), _line(7, 1010)]) + "\n"
    log = parse_megatron_log_text(text)
    assert log.median_iteration_time_s(skip=2) == pytest.approx(1.000)
    assert log.skipped_lines(skip=2) == 2 and log.steady_iterations(skip=2) == [40, 50, 70]
    assert log.steady_iteration_count(skip=2) == 30
    every = parse_megatron_log_text("\n".join([_line(1, 3000), _line(2, 600, skipped=1), _line(3, 650, nan=1)]))
    assert every.median_iteration_time_s(skip=1) == pytest.approx(0.625) and every.skipped_lines(skip=1) == 2


def test_calibrate_says_what_the_skipped_steps_did():
    """The calibration report warns about the lines left out, and about a median that had to time them."""
    from planner.calibration.calibrate import measurement_from_log, skipped_step_warnings

    some = parse_megatron_log_text("\n".join([_line(1, 3000), _line(2, 1000), _line(3, 600, skipped=2),
                                              _line(4, 1000)]))
    (warning,) = skipped_step_warnings(measurement_from_log(some, skip=1))
    assert warning.startswith("1 log line(s)") and warning.endswith("left out of the median")
    every = parse_megatron_log_text("\n".join([_line(1, 3000), _line(2, 600, skipped=1), _line(3, 650, nan=1)]))
    (warning,) = skipped_step_warnings(measurement_from_log(every, skip=1))
    assert "every one of them" in warning and "shorter than a training step" in warning
    clean = parse_megatron_log_text("\n".join([_line(1, 3000), _line(2, 1000), _line(3, 1000)]))
    assert skipped_step_warnings(measurement_from_log(clean, skip=1)) == []
