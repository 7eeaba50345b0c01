"""Calibration against the cost model: corrections round-trip, per-device factors, and profile scaling."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("planner.cost.estimate")

from planner.calibration.calibrate import calibrate, measurement_from_log, write_corrections  # noqa: E402
from planner.calibration.megatron_log import parse_megatron_log, parse_megatron_log_text  # noqa: E402
from planner.calibration.router_stats import load_router_stats  # noqa: E402
from planner.cost.estimate import estimate_run  # noqa: E402
from planner.inputs.cluster import parse_cluster  # noqa: E402
from planner.inputs.resolve import resolve_run  # noqa: E402
from planner.profile_tables import ProfileSet  # noqa: E402
from planner.errors import PlannerInputError  # noqa: E402

LOGS = Path(__file__).parent / "data" / "logs"


def _eight_layers(tmp_path: Path, preset: str = "llama2-7b") -> str:
    """The preset cut to 8 layers: the fixture log (1.5 s per iteration of 64 x 4096 tokens on 8 GPUs) is 25%
    MFU for it; for the whole llama2-7b it would be 93%, which the fit can only match with GEMMs faster than the
    devices' peak (calibrate refuses that)."""
    return _cut(tmp_path, preset, 8)


def _cut(tmp_path: Path, preset: str, layers: int) -> str:
    """The preset cut to `layers` layers, as a model file."""
    text = (Path(__file__).resolve().parents[1] / "profiles" / "models" / f"{preset}.yaml").read_text()
    path = tmp_path / "models" / f"{preset}-{layers}l.yaml"
    path.parent.mkdir(exist_ok=True)
    text = re.sub(r"(?m)^num_layers: \d+", f"num_layers: {layers}", text)
    path.write_text(text.replace(f"name: {preset}", f"name: {preset}-{layers}l"))
    return str(path)


def _inputs(cluster: str, profiles: ProfileSet, **overrides):
    spec = parse_cluster(cluster, profiles)
    run = resolve_run(model=overrides.pop("model", "llama2-7b"), world_size=spec.world_size, overrides=overrides)
    return run, spec


def test_log_calibration_round_trip(tmp_path, profiles):
    """Corrections fitted on the fixture log (1.500 s/iteration, TP2 PP2 DP2 on 8 H100) load with
    --profiles and make the cost model reproduce the measured iteration time and stage memory.  The fixture's
    memory (2.7x the 8-layer model's) is beyond the bound calibrate writes unasked: forced here (--allow-memory-excess)."""
    base = profiles
    run, cluster = _inputs("H100:8", base, model=_eight_layers(tmp_path), tp=2, pp=2, gbs=64)
    meas = measurement_from_log(parse_megatron_log(LOGS / "megatron_core018_minmax.log"), skip=2)
    result = calibrate(meas, run, cluster, base, allow_memory_excess=True)
    assert len(result.report["warnings"]) == 1 and "written because of --allow-memory-excess" in result.report["warnings"][0]
    write_corrections(result, tmp_path / "cal")
    loaded = ProfileSet.load(extra_dirs=[tmp_path / "cal"])
    assert loaded.correction("H100", "gemm") == pytest.approx(
        base.correction("H100", "gemm") * result.report["global_factor"], rel=1e-5)
    cost = estimate_run(run, cluster, loaded)
    assert cost.iteration_time_s == pytest.approx(1.500, rel=1e-3)
    # memory: the mean excess of max reserved over the prediction is added (both stages under-predicted here)
    before = estimate_run(run, cluster, base)
    measured_gib = [37510.0 / 1024, 32505.0 / 1024]  # largest max reserved of ranks {0,1} and {4,5}
    diffs = [m - s.memory_gib for m, s in zip(measured_gib, before.stages)]
    if all(d > 0 for d in diffs):
        expected = sum(diffs) / 2
        assert loaded.correction("H100", "memory_overhead_gib") == pytest.approx(expected, abs=1e-3)
        assert [s.memory_gib for s in cost.stages] == pytest.approx([s.memory_gib + expected for s in before.stages],
                                                                    abs=1e-3)
    assert all(e["provenance"]["kind"] == "calibrated" for e in result.corrections)
    assert "megatron_core018_minmax.log (2025-03-04)" in result.corrections[0]["provenance"]["source"]


def test_gbs_mismatch_is_refused(profiles):
    """A run whose GBS differs from the log's is refused (it was calibrated with a warning: walk53b item 2),
    naming --gbs and both values, whether the fit would be plausible (16) or not (128: MFU above 100%)."""
    base = profiles
    meas = measurement_from_log(parse_megatron_log(LOGS / "megatron_core018_minmax.log"))
    for gbs in (16, 128):
        run, cluster = _inputs("H100:8", base, tp=2, pp=2, gbs=gbs)
        with pytest.raises(PlannerInputError, match=rf"^--gbs: .*the log states 64, the run priced has {gbs}"):
            calibrate(meas, run, cluster, base)


# ------------------------------------------------------------------------------------------------
# synthetic measurements: the cost model with known perturbations plays the real cluster


def _render_log(cost, ranks_per_stage: int, global_batch_size: int, fwd_share: float = 0.4) -> str:
    """A Megatron log (reference/megatron.md section 4 formats) of a run that took `cost`: 5 iteration
    lines (of the run's global batch: calibrate refuses another), per-rank compute timers (option all), memory
    lines from the first rank of every stage."""
    lines = []
    m = cost.num_microbatches
    for k, it in enumerate((1, 10, 20, 30, 40)):
        ms = cost.iteration_time_s * 1e3 * (3.0 if it == 1 else 1.0)
        lines.append(f" [2026-01-0{1 + k % 5} 00:00:00.000000] iteration {it:8d}/{40:8d} | consumed samples: "
                     f"{it:12d} | elapsed time per iteration (ms): {ms:.1f} | "
                     f"global batch size: {global_batch_size:5d} | "
                     f"lm loss: {1.0:.6E} | loss scale: {1.0:.1f} | number of skipped iterations: {0:3d} | "
                     f"number of nan iterations: {0:3d} |")
        lines.append("INFO:megatron.core.timers:times across ranks (ms):")
        for name, share in (("forward-compute", fwd_share), ("backward-compute", 1 - fwd_share)):
            lines.append(f"  {name}:")
            for st in cost.stages:
                for r in range(st.index * ranks_per_stage, (st.index + 1) * ranks_per_stage):
                    lines.append(f"     rank {r:2d}: {m * (st.time_s - st.pp_comm_s) * share * 1e3:.3f}")
        if it == 10:
            for st in cost.stages:
                mb = st.memory_gib * 1024
                lines.append(f"[Rank {st.index * ranks_per_stage}] (after {it} iterations) memory (MB) | allocated: "
                             f"{mb:.2f} | max allocated: {mb:.2f} | reserved: {mb:.2f} | max reserved: {mb:.2f}")
    return "\n".join(lines) + "\n"


def _truth_dir(tmp_path: Path, factors: dict[tuple[str, str], float]) -> Path:
    """A --profiles dir whose corrections are the 'real' hardware's deviation from the shipped tables."""
    import yaml

    d = tmp_path / "truth"
    d.mkdir()
    rows = [{"device": dev, "kind": kind, "factor": f, "provenance": {"kind": "calibrated", "source": "synthetic"}}
            for (dev, kind), f in factors.items()]
    (d / "corrections.yaml").write_text(yaml.safe_dump(rows))
    return d


SCALING_CASES = {
    # homogeneous: 4 nodes of H800 -> 16 nodes; the real GPUs run GEMMs 25% slower, all-to-all 60% slower,
    # memory overhead 2 GiB higher than the shipped profile says
    "homogeneous": ("H800:32", "H800:128", {("H800", "gemm"): 1.25, ("H800", "grouped_gemm"): 1.25,
                                            ("H800", "all_to_all"): 1.6, ("H800", "memory_overhead_gib"): 2.0}),
    # heterogeneous: 2+2 nodes -> 8+8 nodes; each type off by its own amount
    "heterogeneous": ("H800:16,MI300X:16", "H800:64,MI300X:64",
                      {("H800", "gemm"): 1.3, ("H800", "grouped_gemm"): 1.3, ("MI300X", "gemm"): 1.1,
                       ("MI300X", "attention"): 1.5, ("MI300X", "all_to_all"): 1.4}),
}


@pytest.mark.parametrize("case", sorted(SCALING_CASES))
def test_profile_scaling_4_to_16_nodes(tmp_path, case, profiles):
    """Corrections calibrated on a 4-node run predict the 16-node run within 10% (the paper's claim,
    checked inside the cost model): the 'measurement' is the cost model with known per-kernel
    perturbations; calibration sees only its rendered Megatron log.  This proves the log -> fit ->
    corrections.yaml -> --profiles chain is consistent and that per-kind rate errors learnt at small
    scale transfer when the kernel mix changes with scale; it says nothing about real-hardware error."""
    small, large, factors = SCALING_CASES[case]
    shipped = profiles
    truth = ProfileSet.load(extra_dirs=[_truth_dir(tmp_path, factors)])
    knobs = dict(model="mixtral-s", tp=2, pp=2, ep=4)
    run_s, cl_s = _inputs(small, shipped, gbs=256, **dict(knobs))
    run_l, cl_l = _inputs(large, shipped, gbs=1024, **dict(knobs))
    measured_small = estimate_run(run_s, cl_s, truth)
    rps = run_s.parallel.tp * run_s.parallel.cp * (cl_s.world_size // (run_s.parallel.tp * run_s.parallel.pp))
    log = parse_megatron_log_text(_render_log(measured_small, rps, run_s.training.global_batch_size),
                                  source=f"synthetic-{case}.log")
    assert log.problems == []
    result = calibrate(measurement_from_log(log), run_s, cl_s, shipped)
    out = tmp_path / "calib"
    write_corrections(result, out)
    calibrated = ProfileSet.load(extra_dirs=[out])
    true_large = estimate_run(run_l, cl_l, truth).iteration_time_s
    raw_error = abs(estimate_run(run_l, cl_l, shipped).iteration_time_s / true_large - 1)
    cal_error = abs(estimate_run(run_l, cl_l, calibrated).iteration_time_s / true_large - 1)
    assert result.report["predicted_after"]["error"] == pytest.approx(0.0, abs=1e-3)  # fits the small run
    assert cal_error < 0.10, (case, cal_error, raw_error)
    assert cal_error < raw_error  # calibration helped
    if ("H800", "memory_overhead_gib") in factors:
        assert calibrated.correction("H800", "memory_overhead_gib") == pytest.approx(2.0, abs=0.01)


def test_router_stats_become_an_entry(tmp_path, profiles):
    """Router statistics add a moe_imbalance_factor entry (hand example: 1.25), written where the
    loader can take it (corrections.yaml if it accepts the kind, moe_imbalance.yaml otherwise)."""
    f = tmp_path / "router.csv"
    f.write_text("layer,expert,tokens\n0,0,10\n0,1,30\n0,2,20\n0,3,20\n1,0,25\n1,1,25\n1,2,25\n1,3,25\n")
    base = profiles
    run, cluster = _inputs("H100:8", base, model=_eight_layers(tmp_path), tp=2, pp=2, gbs=64)
    meas = measurement_from_log(parse_megatron_log(LOGS / "megatron_core018_minmax.log"))
    result = calibrate(meas, run, cluster, base, load_router_stats(f), allow_memory_excess=True)
    entry = [e for e in result.corrections if e["kind"] == "moe_imbalance_factor"]
    assert len(entry) == 1 and entry[0]["factor"] == pytest.approx(1.25)
    paths = write_corrections(result, tmp_path / "out")
    text = "".join(p.read_text() for p in paths if p.suffix == ".yaml")
    assert "moe_imbalance_factor" in text
    loaded = ProfileSet.load(extra_dirs=[tmp_path / "out"])  # still loads
    if callable(getattr(loaded, "moe_imbalance_factor", None)) and "moe_imbalance_factor" in (
        (tmp_path / "out" / "corrections.yaml").read_text()
    ):
        # time factors were fitted with the measured imbalance in place: a MoE run reproduces its
        # measured time with both loaded (on the 8 GPUs the log states; 4 layers, which it does not state)
        moe_run, moe_cluster = _inputs("H800:8", base, model=_cut(tmp_path, "mixtral-s", 4), tp=2, pp=2, ep=4,
                                       gbs=64)
        res = calibrate(meas, moe_run, moe_cluster, base, load_router_stats(f), allow_memory_excess=True)
        write_corrections(res, tmp_path / "moe")
        both = ProfileSet.load(extra_dirs=[tmp_path / "moe"])
        assert both.moe_imbalance_factor() == pytest.approx(1.25)
        assert estimate_run(moe_run, moe_cluster, both).iteration_time_s == pytest.approx(1.5, rel=1e-3)


def test_calibrate_cli(tmp_path):
    """`cli.py calibrate` on the fixture log prints the comparison, warns about the unreadable lines
    and writes corrections.yaml + calibration_report.json; a missing log names --megatron-log."""
    from click.testing import CliRunner

    import cli

    out = tmp_path / "calib"
    args = ["calibrate", "--megatron-log", str(LOGS / "megatron_core018_minmax.log"), "--model",
            _eight_layers(tmp_path), "--cluster", "H100:8", "--tp", "2", "--pp", "2", "--gbs", "64", "--out", str(out),
            "--allow-memory-excess"]  # the fixture's memory is beyond the bound (test_memory_excess_is_refused_unless_forced)
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    assert "after calibration (+0.0%)" in result.output
    assert "line 27 (memory)" in result.output
    assert (out / "corrections.yaml").is_file() and (out / "calibration_report.json").is_file()
    bad = CliRunner().invoke(cli.main, args[:1] + ["--megatron-log", str(tmp_path / "none.log")] + args[3:])
    assert bad.exit_code == 2 and "--megatron-log" in bad.output


# ------------------------------------------------------------------------------------------------
# walk53b items 2, 5, 6 and 8: the configuration the log states, what is printed, memory, instrumentation


def _cli(args: list[str]):
    from click.testing import CliRunner

    import cli

    return CliRunner().invoke(cli.main, args)


ARGUMENTS_BLOCK = """------------------------ arguments ------------------------
  context_parallel_size ........................... 1
  expert_model_parallel_size ...................... 1
  global_batch_size ............................... 64
  micro_batch_size ................................ {mbs}
  num_layers ...................................... {layers}
  rampup_batch_size ............................... None
  seq_length ...................................... 4096
-------------------- end of arguments ---------------------
"""


def test_calibrate_refuses_a_run_other_than_the_logged_one(tmp_path):
    """walk53b item 2: the log states its global batch (iteration lines), world size, TP and PP (Megatron's `using
    world size` line) and, with its arguments block, CP, EP, micro-batch, sequence and layers.  A run priced with
    any other value is refused (exit 2) naming the option and both values, and nothing is written; it was fitted
    and written (--gbs 32 with a warning, --tp 4 and no --tp/--pp without a word).  Matching flags are accepted."""
    log = LOGS / "megatron_core018_minmax.log"
    with_args = tmp_path / "with_args.log"
    lines = log.read_text().splitlines(keepends=True)
    with_args.write_text(lines[0] + ARGUMENTS_BLOCK.format(mbs=2, layers=32) + "".join(lines[1:]))
    l8 = _eight_layers(tmp_path)
    cases = [
        (log, ["--cluster", "H100:8", "--tp", "2", "--pp", "2", "--gbs", "32"],
         ["--gbs (--global-batch-size): the log states 64, the run priced has 32"]),
        (log, ["--cluster", "H100:8", "--tp", "4", "--pp", "2", "--gbs", "64"],
         ["--tp (--tensor-model-parallel-size): the log states 2, the run priced has 4"]),
        (log, ["--cluster", "H100:8", "--gbs", "64"],
         ["--tp (--tensor-model-parallel-size): the log states 2, the run priced has 1",
          "--pp (--pipeline-model-parallel-size): the log states 2, the run priced has 1"]),
        (log, ["--cluster", "H100:16", "--tp", "2", "--pp", "2", "--gbs", "64"],
         ["--cluster (world size): the log states 8, the run priced has 16"]),
        (with_args, ["--cluster", "H100:8", "--tp", "2", "--pp", "2", "--gbs", "64"],
         ["--mbs (--micro-batch-size): the log states 2, the run priced has 1",
          "--model (num_layers; --num-layers): the log states 32, the run priced has 8"]),
    ]
    for k, (path, flags, expected) in enumerate(cases):
        out = tmp_path / f"cal{k}"
        res = _cli(["calibrate", "--megatron-log", str(path), "--model", l8, *flags, "--out", str(out)])
        assert res.exit_code == 2, (flags, res.output)
        error = next(line for line in res.output.splitlines() if line.startswith("error: "))
        assert error.startswith(f"error: {expected[0].split()[0]}: "), error
        assert all(e in error for e in expected) and "nothing was written" in error, error
        assert not out.exists() and "Traceback" not in res.output
    with_args.write_text(lines[0] + ARGUMENTS_BLOCK.format(mbs=1, layers=8) + "".join(lines[1:]))
    res = _cli(["calibrate", "--megatron-log", str(with_args), "--model", l8, "--cluster", "H100:8", "--tp", "2",
                "--pp", "2", "--gbs", "64", "--out", str(tmp_path / "ok"), "--allow-memory-excess"])
    assert res.exit_code == 0, res.output



def test_calibrate_refuses_a_log_whose_ranks_the_run_priced_has_not(tmp_path):
    """walk55: a log of 16 GPUs without its `using world size` line (or cut above it) names ranks 8..15 in its memory
    lines; calibrated as 8 GPUs, those ranks were dropped without a word and ranks 4..7 (stage 0 at DP 4) were
    counted as stage 1's memory.  A rank at or beyond the world size priced is refused naming --cluster."""
    lines = (LOGS / "megatron_core018_minmax.log").read_text().splitlines(keepends=True)
    memory = next(i for i, line in enumerate(lines) if line.startswith("[Rank 5]"))
    extra = lines[memory].replace("[Rank 5]", "[Rank 13]")
    for name, head in (("no_header.log", []), ("header_8.log", lines[:1])):
        path = tmp_path / name
        path.write_text("".join(head + lines[1:memory + 1] + [extra] + lines[memory + 1:]))
        out = tmp_path / f"cal-{name}"
        res = _cli(["calibrate", "--megatron-log", str(path), "--model", _eight_layers(tmp_path), "--cluster",
                    "H100:8", "--tp", "2", "--pp", "2", "--gbs", "64", "--out", str(out), "--allow-memory-excess"])
        assert res.exit_code == 2, res.output
        assert "error: --cluster: " in res.output and "the log states 14, the run priced has 8" in res.output
        assert not out.exists() and "Traceback" not in res.output

def test_printed_factors_are_the_written_ones(tmp_path):
    """walk53b item 5: calibrate printed "global x0.6730, H100 compute x2.6799" while corrections.yaml held x1.80
    (their product).  The summary lists each written entry (device, factor, kinds) as corrections.yaml holds it,
    and labels the fit's decomposition with how it maps to the written factors."""
    import yaml

    out = tmp_path / "cal"
    res = _cli(["calibrate", "--megatron-log", str(LOGS / "megatron_core015_all_timers.log"), "--model",
                _eight_layers(tmp_path), "--cluster", "H100:4", "--pp", "4", "--gbs", "16", "--out", str(out)])
    assert res.exit_code == 0, res.output
    written = yaml.safe_load((out / "corrections.yaml").read_text())
    lines = res.output.splitlines()
    start = lines.index("written    (device, factor, kinds)")
    printed = set()
    for line in lines[start + 1:]:
        row = re.fullmatch(r"  (\S+) +(x[\d.]+|\+[\d.]+ GiB) +(?:all \d+ time kinds \((.*)\)|(.*))", line)
        if row is None:
            break
        printed |= {(row[1], row[2], kind) for kind in (row[3] or row[4]).split(", ")}
    expected = {(c["device"], f"+{c['factor']:.2f} GiB" if c["kind"] == "memory_overhead_gib"
                 else f"x{c['factor']:.4f}", c["kind"]) for c in written}
    assert printed == expected and len(expected) == len(written)
    fit = next(line for line in lines if line.startswith("fit "))
    report = (out / "calibration_report.json").read_text()
    import json

    data = json.loads(report)
    g, h100 = data["global_factor"], data["device_factors"]["H100"]
    assert "the fit's decomposition" in fit and f"x{h100:.4f} x {g:.4f} = x{h100 * g:.4f}" in fit
    assert data["written_corrections"] == [{k: c[k] for k in ("device", "kind", "factor")} for c in written]
    gemm = next(c["factor"] for c in written if c["kind"] == "gemm")
    assert gemm == pytest.approx(ProfileSet.load().correction("H100", "gemm") * h100 * g, rel=1e-5)


def test_memory_excess_is_refused_unless_forced(tmp_path):
    """walk53b item 6: the fixture log's max reserved is 2.7x what the 8-layer model needs (+21.30 GiB a GPU), which
    calibrate wrote as memory_overhead_gib without a word.  Above 1.5x the prediction by more than 10% of the
    device's memory it is refused (exit 2, the figures, what to check, nothing written); --allow-memory-excess writes it with a
    warning."""
    args = ["calibrate", "--megatron-log", str(LOGS / "megatron_core018_minmax.log"), "--model",
            _eight_layers(tmp_path), "--cluster", "H100:8", "--tp", "2", "--pp", "2", "--gbs", "64",
            "--out", str(tmp_path / "cal")]
    res = _cli(args)
    assert res.exit_code == 2, res.output
    error = next(line for line in res.output.splitlines() if line.startswith("error: "))
    assert re.search(r"^error: --megatron-log: .*H100: measured max reserved 3\d\.\d\d GiB against 1\d\.\d\d GiB "
                     r"predicted \(2\.\d\dx.*memory_overhead_gib of \+21\.30 GiB", error), error
    assert "PYTORCH_CUDA_ALLOC_CONF" in error and "--allow-memory-excess" in error and "nothing was written" in error
    assert not (tmp_path / "cal").exists()
    res = _cli([*args, "--allow-memory-excess"])
    assert res.exit_code == 0, res.output
    assert "warning: memory correction above 1.5x the prediction" in res.output
    assert re.search(r"(?m)^  H100 +\+21\.30 GiB +memory_overhead_gib$", res.output), res.output


def test_memory_excess_bound():
    """The bound needs both: above 1.5x the prediction and an overhead above 10% of the device's memory (a small
    run's few GiB of allocator cache keep their small correction: test_profile_scaling_4_to_16_nodes)."""
    from types import SimpleNamespace

    from planner.calibration.calibrate import Measurement, _check_memory_excess

    profiles = SimpleNamespace(device=lambda name: SimpleNamespace(memory_gib=80.0))
    meas = Measurement(source="run.log", date="2025-03-04", iteration_time_s=1.0)

    def rows(predicted, measured):
        return [{"device": "H100", "predicted_memory_gib": predicted, "measured_max_reserved_gib": measured,
                 "memory_difference_gib": measured - predicted}]

    for predicted, measured in ((40.0, 59.0), (4.0, 11.9), (60.0, 78.0)):  # 1.48x; 2.98x but 7.9 GiB; 1.3x
        assert _check_memory_excess(meas, profiles, rows(predicted, measured), {"H100": "H100"}, False) == []
    with pytest.raises(PlannerInputError, match=r"2\.00x.*\+20\.00 GiB \(25% of the device's 80 GiB\)"):
        _check_memory_excess(meas, profiles, rows(20.0, 40.0), {"H100": "H100"}, False)
    assert "written because of --allow-memory-excess" in _check_memory_excess(meas, profiles, rows(20.0, 40.0),
                                                                {"H100": "H100"}, True)[0]


def test_instrument_dir_reports_its_iterations_and_date(tmp_path):
    """walk53b item 8: `calibrate --instrument-dir` said "1 steady iterations" and dated the run today.  It reports
    the iterations recorded (5 per rank here) and the date the files record (recorded_utc), else "unknown"; the
    world size they record is compared with --cluster like a log's."""
    import datetime
    import json

    def instrument(directory: Path, dated: bool) -> Path:
        directory.mkdir()
        for rank in range(8):
            data = {"rank": rank, "world_size": 8, "skipped_iterations": 1,
                    "iterations": [{"iteration": it, "time_s": 1.5} for it in range(1, 6)]}
            if dated:
                data["recorded_utc"] = "2025-03-04T10:05:00+00:00"
            (directory / f"instrument_rank{rank}.json").write_text(json.dumps(data))
        return directory

    run = ["--model", _eight_layers(tmp_path), "--tp", "2", "--pp", "2", "--gbs", "64"]
    for dated, date in ((True, "2025-03-04"), (False, "unknown")):
        out = tmp_path / f"cal{dated}"
        res = _cli(["calibrate", "--instrument-dir", str(instrument(tmp_path / f"i{dated}", dated)), *run,
                    "--cluster", "H100:8", "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert "over 5 steady iterations" in res.output
        source = json.loads((out / "calibration_report.json").read_text())["measured"]
        assert source["steady_iterations"] == 5 and source["date"] == date
        text = (out / "corrections.yaml").read_text()
        assert f"({date}), 5 steady iterations" in text and datetime.date.today().isoformat() not in text
    res = _cli(["calibrate", "--instrument-dir", str(tmp_path / "iTrue"), *run, "--cluster", "H100:16",
                "--out", str(tmp_path / "c16")])
    assert res.exit_code == 2 and "the log states 8, the run priced has 16" in res.output, res.output


def test_instrument_dir_of_another_run_is_refused(tmp_path):
    """walk55: instrumentation files of two runs in one directory (world sizes 8 and 16), or of another run than
    --megatron-log's (16 GPUs against the log's 8), were taken without a word (the disagreeing world size dropped,
    the other run's memory and router statistics used).  Both exit 2 naming --instrument-dir, nothing written."""
    import json

    def instrument(directory: Path, worlds: list[int]) -> Path:
        directory.mkdir()
        for rank, world in enumerate(worlds):
            data = {"rank": rank, "world_size": world, "skipped_iterations": 1,
                    "iterations": [{"iteration": it, "time_s": 1.5} for it in range(1, 6)]}
            (directory / f"instrument_rank{rank}.json").write_text(json.dumps(data))
        return directory

    run = ["--model", _eight_layers(tmp_path), "--cluster", "H100:8", "--tp", "2", "--pp", "2", "--gbs", "64"]
    mixed = instrument(tmp_path / "mixed", [8] * 4 + [16] * 4)
    other = instrument(tmp_path / "other", [16] * 8)
    for extra, says in ((["--instrument-dir", str(mixed)], "world sizes 8, 16: files of more than one run"),
                        (["--instrument-dir", str(other), "--megatron-log", str(LOGS / "megatron_core018_minmax.log")],
                         "its files state world size 16, megatron_core018_minmax.log states 8")):
        out = tmp_path / "cal"
        res = _cli(["calibrate", *extra, *run, "--out", str(out), "--allow-memory-excess"])
        assert res.exit_code == 2 and "error: --instrument-dir: " in res.output and says in res.output, res.output
        assert not out.exists() and "Traceback" not in res.output
