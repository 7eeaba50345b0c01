"""`cli.py bench` and planner/bench.py: summaries, tables, cluster sizes, and the quick suite end to end."""

from __future__ import annotations

import csv
import json
import math

import pytest
from click.testing import CliRunner

from planner.bench import (
    PAPER_SUITE, QUICK_SUITE, SECTIONS, SUITE, Row, json_clean, planning_world, summarize, table2_markdown,
    table3_markdown, three_type_cluster,
)
from planner.inputs.cluster import parse_cluster


def row(scenario, planner, tput, kind="moe-hetero", model="mixtral-s", plan="p", runnable=True, paper=True):
    """A results row whose latency is the inverse of its throughput (fixed GBS)."""
    return Row(scenario=scenario, kind=kind, model=model, cluster=scenario.split("@")[1], gpus=32, gbs=512,
               planner=planner, status="ok", throughput_tflops_per_gpu=tput, mfu=tput / 1000,
               iteration_time_s=100.0 / tput, peak_memory_gib=50.0, search_time_s=1.0, gpus_used=32, plan=plan,
               runnable=runnable, paper=paper)


SYNTH = [
    row("mixtral-s@a", "mi", 100.0), row("mixtral-s@a", "metis", 150.0), row("mixtral-s@a", "hapmoe", 200.0),
    row("mixtral-s@a", "ablation", 100.0),
    row("mixtral-s@b", "mi", 100.0), row("mixtral-s@b", "metis", 900.0), row("mixtral-s@b", "hapmoe", 800.0),
    row("mixtral-s@b", "ablation", 400.0),
    # homogeneous scenarios do not enter the geometric mean over MI
    row("mixtral-s@c", "mi", 100.0, kind="moe-homo"), row("mixtral-s@c", "hapmoe", 1000.0, kind="moe-homo"),
]


def test_summary_geomean_and_worst_ratio():
    """Speedups 2x and 8x over MI give a geometric mean of 4x; the worst HAPMoE/best-baseline ratio is 800/900."""
    s = summarize(SYNTH)
    assert s["geomean_speedup_vs_mi"] == pytest.approx(4.0)
    assert s["geomean_speedup_vs_mi_by_model"] == {"mixtral-s": pytest.approx(4.0)}
    assert s["min_ratio_vs_best_baseline"] == pytest.approx(800 / 900)
    assert s["min_ratio_scenario"] == "mixtral-s@b"
    losses = s["hapmoe_slower_than_a_baseline"]
    assert [(x["scenario"], x["baseline"]) for x in losses] == [("mixtral-s@b", "metis")]


def test_table2_normalises_to_mi():
    """Table 2: HAPMoE's throughput geomean 4.00x, latency 0.25x; Metis sqrt(1.5*9) = 3.67x."""
    md = table2_markdown(SYNTH).split("## ")[1]  # the first section (runnable: every SYNTH row is)
    table = [ln for ln in md.splitlines() if ln.startswith("| model")]
    hap_col = [c.strip(" |") for c in table[0].split(" | ")].index("HAPMoE")
    lines = {ln.split(" | ")[1]: ln.split(" | ") for ln in md.splitlines() if ln.startswith("| mixtral-s |")}
    assert lines["throughput"][hap_col].startswith("4.00x (n=2)")
    assert lines["latency"][hap_col].startswith("0.25x")
    assert f"{math.sqrt(1.5 * 9):.2f}x" in " ".join(lines["throughput"])


# Two worlds: mixtral-l@x runs on a public runtime but is not one of the paper's scenarios; mixtral-l@y is the
# paper's and planned for the hypothetical runtime; mixtral-l@z is both (the paper's h800-mi300x).
SECTIONED = [
    row("mixtral-l@x", "mi", 100.0, model="mixtral-l", paper=False), row("mixtral-l@x", "hapmoe", 150.0,
                                                                         model="mixtral-l", paper=False),
    row("mixtral-l@x", "metis", 160.0, model="mixtral-l", paper=False),
    row("mixtral-l@y", "mi", 100.0, model="mixtral-l", runnable=False),
    row("mixtral-l@y", "hapmoe", 400.0, model="mixtral-l", runnable=False),
    row("mixtral-l@y", "metis", 300.0, model="mixtral-l", runnable=False),
    row("mixtral-l@z", "mi", 100.0, model="mixtral-l"), row("mixtral-l@z", "hapmoe", 100.0, model="mixtral-l"),
]


def test_summary_has_a_section_per_world_over_its_own_scenarios():
    """runnable: x (1.5x over MI, 150/160 behind Metis) and z (1x) -> sqrt(1.5); paper_assumption: y (4x) and z
    -> 2x, worst ratio 1 (z); the whole run's keys stay, over x, y and z."""
    s = summarize(SECTIONED)
    run, paper = s["runnable"], s["paper_assumption"]
    assert run["scenarios"] == ["mixtral-l@x", "mixtral-l@z"] and run["hypothetical_scenarios"] == []
    assert paper["scenarios"] == ["mixtral-l@y", "mixtral-l@z"] and paper["hypothetical_scenarios"] == ["mixtral-l@y"]
    assert run["geomean_speedup_vs_mi"] == pytest.approx(math.sqrt(1.5))
    assert run["min_ratio_vs_best_baseline"] == pytest.approx(150 / 160) and run["min_ratio_scenario"] == "mixtral-l@x"
    assert paper["geomean_speedup_vs_mi"] == pytest.approx(2.0)
    assert paper["min_ratio_vs_best_baseline"] == pytest.approx(1.0) and paper["min_ratio_scenario"] == "mixtral-l@z"
    assert s["geomean_speedup_vs_mi"] == pytest.approx((1.5 * 4) ** (1 / 3))
    assert s["min_ratio_vs_best_baseline"] == pytest.approx(150 / 160)
    assert {run["title"], paper["title"]} == {t for t, _ in SECTIONS.values()}
    assert "HYPOTHETICAL" in paper["assumes"] and "HYPOTHETICAL" not in run["assumes"]


def test_table2_shows_runnable_first_then_the_paper_assumption_each_saying_what_it_assumes():
    md = table2_markdown(SECTIONED)
    heads = [ln for ln in md.splitlines() if ln.startswith("## ")]
    assert heads == ["## Runnable today", "## As the paper assumes"]
    runnable, paper = md.split("## ")[1:]
    assert runnable.count("Assumes: ") == 1 and paper.count("Assumes: ") == 1
    assert "mixtral-l@y" not in runnable and "mixtral-l@x" not in paper
    assert "paper HAPMoE" in paper and "paper HAPMoE" not in runnable
    assert "| mixtral-l@y | " in paper and "4.00x | 1.333 | Metis-style |" in paper


def test_table3_change_ratios():
    """Table 3: the ablation over HAPMoE, 0.50 throughput and 2.00 latency on both scenarios."""
    md = table3_markdown(SYNTH)
    body = [ln for ln in md.splitlines() if ln.startswith("| mixtral-s@a") or ln.startswith("| mixtral-s@b")]
    assert len(body) == 2
    for ln in body:
        cells = ln.split(" | ")
        assert cells[2:5] == ["0.50", "0.50", "2.00"]


@pytest.mark.parametrize("total", [48, 96, 192, 384, 768, 1024])
def test_three_type_cluster_sizes(total):
    """Cluster-size study: three types in whole 8-GPU nodes, adding up to the asked total, near-equal shares."""
    spec = three_type_cluster(total)
    counts = [int(item.split(":")[1]) for item in spec.split(",")]
    assert [item.split(":")[0] for item in spec.split(",")] == ["H800", "A100", "H20"]  # one upstream job (NVIDIA)
    assert sum(counts) == total and all(c % 8 == 0 for c in counts)
    assert max(counts) - min(counts) <= 8


def test_suite_matches_the_paper():
    """Two dense scenarios on A100+910B and Mixtral-S/L on 3 homogeneous and 4 mixed clusters (16 in all)."""
    assert len(PAPER_SUITE) == 16 and all(s.paper for s in PAPER_SUITE)
    assert sum(s.kind == "moe-hetero" for s in PAPER_SUITE) == 8 and sum(s.kind == "moe-homo" for s in PAPER_SUITE) == 6
    assert {s.cluster for s in PAPER_SUITE if s.kind == "dense-hetero"} == {"a100-910b"}
    assert any(s.kind == "moe-hetero" for s in QUICK_SUITE)


def test_runnable_scenarios_run_as_one_job_and_the_paper_mixes_with_the_910b_are_hypothetical(profiles):
    """Every scenario outside the paper's is a mixed cluster one public runtime runs whole (both models on
    A100 + H800 and H800 + H20, upstream Megatron-LM; Mixtral-L on 32 + 32 GPUs); of the paper's mixed clusters, H800 + MI300X runs on
    FlagScale and the four with the 910B are planned for the hypothetical all-vendor runtime, whole."""
    extra = [s for s in SUITE if not s.paper]
    assert {(s.model, s.cluster) for s in extra} == {("mixtral-s", "a100-h800"), ("mixtral-s", "h800-h20"),
                                                   ("mixtral-l", "a100-h800-32"), ("mixtral-l", "h800-h20-32")}
    assert all(s.kind == "moe-hetero" for s in extra)
    assert len(SUITE) == len(PAPER_SUITE) + len(extra) == 20
    worlds = {c: planning_world(parse_cluster(c, profiles), profiles)
              for c in {s.cluster for s in SUITE if s.kind != "moe-homo"}}
    assert {c for c, w in worlds.items() if w.hypothetical} == {"a100-910b", "h800-910b", "mi300x-910b",
                                                                "h800-mi300x-910b"}
    for c, w in worlds.items():
        assert not w.choice.left_out, c  # every planner plans on the whole cluster
        expected = ("all-vendors(HYPOTHETICAL)" if "910b" in c else "flagscale" if c == "h800-mi300x" else "megatron")
        assert w.runtime == expected, c


def test_json_clean_drops_nan():
    """NaN and infinity are not JSON: they become null."""
    assert json.dumps(json_clean({"a": float("nan"), "b": [1.0, float("inf")]})) == '{"a": null, "b": [1.0, null]}'


def test_bench_rejects_bad_planner():
    """An unknown planner name exits with status 2 naming the known ones."""
    from cli import main

    res = CliRunner().invoke(main, ["bench", "--quick", "--planners", "mi,nope", "--out", "/tmp/unused-bench"])
    assert res.exit_code == 2
    assert "known: mi" in res.output


def test_bench_help_lists_every_file_the_bench_writes(tmp_path):
    """`bench --help` names each file `write_outputs` writes (scaling.csv, flagscale_tuner.md included), and
    `--out`'s check before the bench knows them all: the three come from one list."""
    from cli import main
    from planner.bench import BENCH_FILES, BenchSettings, write_outputs
    from planner.output.run_dir import BENCH_OUTPUT

    write_outputs(tmp_path, SYNTH, [], BenchSettings.for_quick())
    written = sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".png")
    assert written == sorted(BENCH_FILES)
    assert BENCH_OUTPUT.paths == BENCH_FILES
    res = CliRunner().invoke(main, ["bench", "--help"], terminal_width=1000)
    assert res.exit_code == 0, res.output
    out_help = next(line for line in res.output.splitlines() if line.strip().startswith("--out"))
    for name in BENCH_FILES:
        assert name in out_help, name


BENCH_LIMIT_S = 5.0
"""Each search's limit in the quick bench below (--quick's default: 15 s per search, 8 s for the scaling run).  HAPMoE
is never behind a baseline because it also searches, to the end, the part of its space with each baseline's degrees
(planner/baselines/hapmoe.py seeded_searches: 0.1-0.5 s each here), not because its own search certifies: at 5 s every
row's plan is the one 15 s gives (mixtral-s@h800-16 from the search with Alpa-style's degrees) and the 48-GPU scaling
search finds its 8 s plan at a 2 s limit; the run takes 55 s, not 95 s."""


@pytest.mark.slow
def test_bench_quick_end_to_end(tmp_path):
    """`bench --quick` writes every output; HAPMoE is at least as fast as each baseline, MI included."""
    from cli import main

    out = tmp_path / "bench"
    res = CliRunner().invoke(main, ["bench", "--quick", "--scaling-sizes", "48", "--time-limit", str(BENCH_LIMIT_S),
                                    "--scaling-time-limit", str(BENCH_LIMIT_S), "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    for name in ("results.csv", "summary.json", "table2.md", "table3.md", "search_time.md", "scaling.csv",
                 "throughput_vs_mi.png", "ablation.png", "search_time.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 8 * len(QUICK_SUITE)  # seven planners and FlagScale's auto-tuner (skipped under --quick)
    assert all(r["status"] == "none" and "skipped" in r["notes"] for r in rows if r["planner"] == "flagscale-tuner")
    for r in rows:
        if r["status"] == "ok":
            assert float(r["peak_memory_gib"]) > 0 and float(r["iteration_time_s"]) > 0
    summary = json.loads((out / "summary.json").read_text())
    # On H800 + MI300X every planner's plan is a FlagScale job (issue 21): HAPMoE is no slower than MI there
    # (1.02x at the time of writing; the 1.2x and more of earlier versions priced upstream Megatron jobs
    # across vendors, which cannot start)
    assert summary["geomean_speedup_vs_mi"] >= 1 - 1e-9
    assert summary["min_ratio_vs_best_baseline"] >= 1 - 1e-6
    for section in ("runnable", "paper_assumption"):  # both comparisons, never behind a baseline
        assert summary[section]["geomean_speedup_vs_mi"] >= 1 - 1e-9
        assert summary[section]["min_ratio_vs_best_baseline"] >= 1 - 1e-6
    assert summary["paper_assumption"]["hypothetical_scenarios"] == ["llama2-7b@a100-910b"]  # A100 + 910B
    assert "llama2-7b@a100-910b" not in summary["runnable"]["scenarios"]
    assert res.output.index("## Runnable today") < res.output.index("## As the paper assumes")
    assert "Table 2" in res.output and "Table 3" in res.output and "FlagScale auto-tuner beside HAPMoE" in res.output
    assert "nan" not in (out / "flagscale_tuner.md").read_text()  # a tuner not run has no search time: '-'
    for r in rows:  # every plan is a job one runtime runs: FlagScale across vendors, upstream Megatron on one
        if r["status"] == "ok" and r["cluster"] == "h800-mi300x":
            assert r["plan"].startswith("flagscale"), r
        if r["status"] == "ok" and r["cluster"] == "a100-910b":  # unless labelled hypothetical
            assert r["plan"].startswith("all-vendors(HYPOTHETICAL)") and r["runnable"] == "False", r
            assert r["notes"].startswith("HYPOTHETICAL all-vendor runtime"), r


def test_flagscale_tuner_is_skipped_with_the_reason_without_its_environment(monkeypatch):
    """Without FlagScale's environment the tuner column says it was skipped and why; no plan, no error."""
    from planner.api import load_inputs
    from planner.bench_flagscale import run_flagscale_tuner

    monkeypatch.setenv("HAPMOE_FLAGSCALE_PYTHON", "/nonexistent/python3.12")
    inputs = load_inputs(model="mixtral-s", cluster="H800:8,MI300X:8")
    out = run_flagscale_tuner(inputs.run, inputs.cluster, inputs.profiles, time_limit_s=10)
    assert out.status == "skipped" and out.best is None
    assert "HAPMOE_FLAGSCALE_PYTHON=/nonexistent/python3.12 does not exist" in out.why
    assert out.notes() == [f"FlagScale auto-tuner: skipped: {out.why}"]


def test_tuner_candidates_become_plans_or_say_why_not():
    """A candidate with one TP/EP becomes a flagscale Plan (meshes -> stages, split, recompute); per-mesh TP
    cannot be said by a plan."""
    from planner.api import load_inputs
    from planner.bench_flagscale import candidate_plan

    run = load_inputs(model="mixtral-s", cluster="H800:8,MI300X:8").run
    cand = {"hetero_device_types": ["H800", "MI300X"], "hetero_process_meshes": [[2, 1, 2, 4, 1], [2, 1, 2, 2, 2]],
            "hetero_pipeline_layer_split": [16, 8, 8], "micro_batch_size": 1, "sequence_parallel": True,
            "use_recompute": True, "recompute_granularity": "full", "recompute_method": "uniform",
            "recompute_num_layers": 1}
    plan = candidate_plan(cand, run)
    assert plan.runtime == "flagscale" and (plan.tp, plan.ep, plan.cp) == (2, 2, 1)
    assert [(s.device_type, s.num_layers, s.dp) for s in plan.stages] == [("H800", 16, 4), ("MI300X", 8, 2),
                                                                          ("MI300X", 8, 2)]
    assert plan.stages[0].recompute.granularity == "full"
    cand["hetero_process_meshes"] = [[2, 1, 2, 4, 1], [4, 1, 2, 1, 2]]
    assert candidate_plan(cand, run) == "per-mesh TP/EP differ or CP > 1"
