"""Output a person can read (issue 14): the terminal table fits, --wide, --quiet, progress, assumed
values, plots with the data behind them, and the user's own plan against the planner's."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main

from helpers.cli import solve_searches_once
from helpers.once import run_once

SMALL = ["--model", "mixtral-s", "--cluster", "H800:8,MI300X:8", "--gbs", "64"]
TINY_FLAGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --vocab-size 32000 --seq-length 1024 "
              "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 32 --bf16")
# Mixtral-8x7B's layer shapes with 16 of its 32 layers: the scripts' solves on two device types take seconds, not
# half a minute, and TP1 still does not fit on 80 GB
MIXTRAL_FLAGS = ("--num-layers 16 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
                 "--group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 32768 "
                 "--vocab-size 32000 --normalization RMSNorm --swiglu --disable-bias-linear "
                 "--untie-embeddings-and-output-weights --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm "
                 "--moe-token-dispatcher-type alltoall --bf16 --use-distributed-optimizer")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def invoke(args: list[str], columns: int | None = 100):
    env = {"COLUMNS": str(columns)} if columns else {"COLUMNS": None}
    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


def write_script(tmp_path: Path, parallel: str, batch: str = "--micro-batch-size 1 --global-batch-size 256",
                 nodes: int = 1) -> Path:
    """A launcher in the style of Megatron-LM's examples: arrays per concern, torchrun pretrain_gpt.py on `nodes`
    nodes of 8 GPUs."""
    path = tmp_path / "train_mixtral.sh"
    path.write_text(
        "#!/bin/bash\n"
        "GPUS_PER_NODE=8\n"
        f"MODEL_ARGS=({MIXTRAL_FLAGS})\n"
        f"TRAINING_ARGS=({batch})\n"
        f"PARALLEL_ARGS=({parallel})\n"
        f"torchrun --nproc_per_node $GPUS_PER_NODE{f' --nnodes {nodes}' if nodes > 1 else ''} pretrain_gpt.py "
        "${MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${PARALLEL_ARGS[@]} --data-path /data/x\n"
    )
    return path


# ----------------------------------------------------------------------------------------------------------
# Terminal


@pytest.fixture(scope="module")
def solved_out():
    """One solve with --out (plots always written there), once per test run (the module's tests may run on several
    pytest-xdist workers); what it printed and the directory."""
    res = run_once("solve", *SMALL, "--backend", "hsdp", out=True, columns=100)
    assert res.exit_code == 0, res.output
    return res, res.out


def test_default_table_fits_100_columns_and_wide_shows_the_memory_breakdown():
    """At COLUMNS=100 every line of the default output fits; --wide adds the memory parts and the
    communication split; at 80 columns the table still fits by dropping its least important columns."""
    res = invoke(["estimate", "--model", "mixtral-s", "--cluster", "H800:8,A100:8", "--tp", "2", "--pp", "2",
                  "--ep", "4", "--recompute", "full-block:2"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    header = "\n".join(lines[:6])
    assert "recompute" in header and "recompu…" not in res.stdout
    assert "full-block:2" in res.stdout
    assert "weights" not in res.stdout
    wide = invoke(["estimate", "--model", "mixtral-s", "--cluster", "H800:8,A100:8", "--tp", "2", "--pp", "2",
                   "--ep", "4", "--wide"])
    for col in ("weights", "grads", "optim", "activ", "other", "TP", "EP", "PP"):
        assert col in wide.stdout, col
    narrow = invoke(["estimate", "--model", "mixtral-s", "--cluster", "H800:16", "--tp", "2", "--pp", "2",
                     "--ep", "4"], columns=80)
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80
    narrow_header = narrow.stdout.split("per stage")[1].split("───")[0]
    assert "memory" in narrow_header and " compute " not in narrow_header  # the least important column went


def _stage_rows(text: str) -> list[list[str]]:
    """The per-stage table's rows, split on blanks (every cell of these rows is one word)."""
    rows = text.split("per stage")[1].split("\n")[4:]  # after the title line's end, two header lines and the rule
    return [ln.split() for ln in rows[:next(i for i, ln in enumerate(rows) if not re.match(r"\s+\d+ ", ln))]]


def test_wide_shows_every_part_of_the_compact_dp_sync():
    """The default table's "DP sync" is gradient sync + optimizer step + the fixed host time per iteration, and
    its legend says so; --wide shows each of the three (the host time was in no column: 71.4 ms shown as 6.6 +
    14.8)."""
    args = ["estimate", "--model", "mixtral-s", "--cluster", "H800:32", "--tp", "2", "--pp", "4", "--ep", "4"]
    compact, wide = invoke(args), invoke([*args, "--wide"], columns=250)
    assert compact.exit_code == 0 and wide.exit_code == 0, compact.output + wide.output
    assert "gradient sync + optimizer step + fixed host time" in compact.stdout
    assert "host (fixed host time)" in wide.stdout
    stages = json.loads(invoke([*args, "--json"]).stdout)["stages"]
    short, long_ = _stage_rows(compact.stdout), _stage_rows(wide.stdout)
    assert len(short) == len(long_) == len(stages) == 4
    for s, c, w in zip(stages, short, long_):
        # compact: stage device layers DP recompute t/mb compute comm DP-sync ...;
        # wide: ... t/mb compute recomp TP CP EP PP DP-sync optim host ...
        assert float(c[8]) == pytest.approx(1e3 * (s["dp_comm_s"] + s["optimizer_s"] + s["iteration_overhead_s"]),
                                            abs=0.06)
        assert [float(x) for x in w[12:15]] == pytest.approx(
            [1e3 * s[k] for k in ("dp_comm_s", "optimizer_s", "iteration_overhead_s")], abs=0.06)
        assert s["iteration_overhead_s"] > 0
        assert sum(float(x) for x in w[12:15]) == pytest.approx(float(c[8]), abs=0.15)


def test_wide_terminal_keeps_the_default_table(solved_out):
    """A wide terminal does not switch columns on by itself: --wide does."""
    res = invoke(["estimate", "--model", "mixtral-s", "--cluster", "H800:16", "--tp", "2", "--pp", "2", "--ep", "4"],
                 columns=250)
    assert "weights" not in res.stdout and "DP sync" in res.stdout


def test_top_k_lists_the_other_plans_in_the_text_and_summary(tmp_path):
    """--top K: the text and summary.md list the K-1 plans after the pick (time, range, memory, degrees, what
    differs from the pick), the same ones as the JSON's `alternatives` (which carry their memory too); --top 1
    prints no such table."""
    base = ["solve", "--megatron-args", TINY_FLAGS, "--cluster", "H800:4", "--backend", "hsdp", "--quiet"]
    res = invoke([*base, "--top", "3", "--out", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    payload = json.loads((tmp_path / "p" / "plan.json").read_text())
    alts = payload["alternatives"]
    assert 1 <= len(alts) <= 2  # the search may hold fewer distinct plans than asked
    assert {frozenset(a) for a in alts} == {frozenset({"iteration_time_s", "tflops_per_gpu", "mfu", "plan",
                                                       "max_memory_gib", "max_allocated_gib", "max_reserved_gib",
                                                       "fits", "iteration_time_range_s", "tflops_per_gpu_range",
                                                       "range_source", "evidence", "range_by_mechanism_s"})}
    text = " ".join(res.stdout.split())
    assert (f"--top 3: the {len(alts)} plan{'s' if len(alts) > 1 else ''} after the pick" in text
            and (len(alts) == 2 or f"the search kept {len(alts)} other plan" in text)), res.stdout
    summary = (tmp_path / "p" / "summary.md").read_text()
    assert "## Other plans" in summary
    table = res.stdout.split("--top 3:")[1]
    for rank, a in enumerate(alts, start=2):
        lo, hi = a["iteration_time_range_s"]
        row = next(ln for ln in summary.splitlines() if ln.startswith(f"| {rank} | "))
        assert f"| {a['iteration_time_s']:.3f} | {lo:.3f}-{hi:.3f} |" in row, row
        assert f"{a['iteration_time_s']:.3f}" in table and f"{lo:.3f}-{hi:.3f}" in table
        assert f"| {a['max_memory_gib']:.1f} | TP" in row, row  # the peak memory, then the degrees
        assert "->" in row.split(" | ")[-1], row  # what differs from the pick
    one = invoke([*base, "--top", "1"])
    assert one.exit_code == 0 and "--top" not in one.stdout and "after the pick" not in one.stdout


def test_plan_difference_names_what_changes():
    from planner.output.report import plan_difference

    def plan(tp=1, pp=2, mbs=1, layers=(4, 4), dp=2, rec="none", types=("H800", "H800")):
        return {"tp": tp, "pp": pp, "cp": 1, "ep": 1, "etp": 1, "vpp": 1, "mbs": mbs, "dp": [dp] * pp,
                "sequence_parallel": tp > 1,
                "stages": [{"device_type": t, "num_layers": n, "recompute_label": rec} for t, n in zip(types, layers)]}

    pick = plan()
    assert plan_difference(pick, plan(mbs=2)) == "mbs 1->2"
    assert plan_difference(pick, plan(tp=2, dp=1)) == "TP 1->2, DP 2->1, sequence parallel on"
    assert plan_difference(pick, plan(layers=(5, 3))) == "layers 4/4->5/3"
    assert plan_difference(pick, plan(rec="full:uniform:1")) == "recompute none->full-uniform:1"
    assert plan_difference(pick, plan(pp=4, layers=(2, 2, 2, 2), dp=1, types=("H800",) * 4)) == \
        "PP 2->4, DP 2->1, stages 4 H800, layers 2/2/2/2"
    assert plan_difference(pick, plan(types=("MI300X", "H800"))) == "stages 1 MI300X, 1 H800"


def test_stage_lists_read_in_stage_order_with_runs_counted():
    """An 8-stage pick (four stages without recompute, then four with) against a 4-stage candidate: its recompute
    read as the sorted set "full-uniform:1/none" (a two-stage plan, by the look of it, and in the wrong order), and
    the difference listed all twelve stages, wrapped mid-word at 100 columns; now each run of equal stages is counted,
    in stage order."""
    from planner.output.report import degrees_short, plan_difference

    def plan(recs, pp):
        return {"tp": 1, "pp": pp, "cp": 1, "ep": 4, "etp": 1, "vpp": 1, "mbs": 1, "dp": [4] * pp,
                "stages": [{"device_type": "H800", "num_layers": 4, "recompute_label": r} for r in recs]}

    pick = plan(["none"] * 4 + ["full:uniform:1"] * 4, 8)
    other = plan(["full:uniform:1", "none", "none", "full:uniform:1"], 4)
    assert degrees_short(pick).endswith("mbs1 none x4/full-uniform:1 x4")
    assert degrees_short(other).endswith("mbs1 full-uniform:1/none x2/full-uniform:1")
    assert "recompute none x4/full-uniform:1 x4->full-uniform:1/none x2/full-uniform:1" in plan_difference(pick, other)
    assert degrees_short(plan(["none"] * 8, 8)).endswith("mbs1 none")


def test_trial_lines_say_how_each_candidate_differs_from_the_pick():
    """A candidate with the pick's degrees and another layer split read exactly as the pick in the trials list
    ("TP1 PP2 ... mbs1 none" twice, two times): each line but the pick's now names what differs."""
    from planner.output.report import trial_lines

    def plan(layers, types=("MI300X", "H800")):
        return {"tp": 1, "pp": 2, "cp": 1, "ep": 8, "etp": 1, "vpp": 1, "mbs": 1, "dp": [16, 16],
                "sequence_parallel": False,
                "stages": [{"device_type": t, "num_layers": n, "recompute_label": "none"} for t, n in zip(types, layers)]}

    pick = plan((14, 18))
    trials = [{"name": name, "plan": p, "iteration_time_s": t, "iteration_time_range_s": [t * 0.9, t * 1.1]}
              for name, p, t in (("pick", pick, 7.0), ("candidate-1", plan((13, 19)), 7.4),
                                 ("candidate-2", plan((14, 18), ("H800", "MI300X")), 7.5))]
    lines = trial_lines({"plan": pick, "trials": trials, "trials_why": "why"}, None)
    assert "[" not in lines[1] and "TP1 PP2 CP1 EP8 ETP1 DP16 VPP1 mbs1 none, predicted 7.000 s" in lines[1]
    assert "[layers 14/18->13/19]" in lines[2]
    assert "[stages 1 H800, 1 MI300X]" in lines[3]


def test_solve_terminal_output_and_final_progress_line(solved_out):
    """Without a terminal, stderr holds exactly the final search line and the files line; stdout the
    plan, the status in the shared vocabulary, and the assumed values with their flags."""
    res, out = solved_out
    err = res.stderr.splitlines()
    assert len(err) == 2, res.stderr
    assert err[0].startswith("search: ") and "configurations" in err[0] and "best" in err[0]
    assert err[1].startswith("wrote ") and str(out) in err[1]
    assert max(len(line) for line in res.stdout.splitlines()) <= 100
    # by default the whole space is searched (the prunings only order the work): certified
    assert "search: OPTIMAL, certified over the whole search space" in res.stdout
    assert "assumed" in res.stdout and "--moe-imbalance" in res.stdout and "--seq" in res.stdout


def test_quiet_is_quiet(tmp_path):
    """--quiet: nothing at all on stderr, even with --out (no 'wrote N files'), with the text output or --json (which
    alone still prints the search's last line and the files line there)."""
    res = run_once("solve", *SMALL, "--backend", "hsdp", "--json", "--quiet", out=True)  # test_cli.py reads it too
    assert res.exit_code == 0, res.stdout + res.stderr
    assert res.stderr == ""
    assert (res.out / "plan.json").exists()
    text = invoke(["solve", "--megatron-args", TINY_FLAGS, "--cluster", "H800:2", "--quiet", "--out",
                   str(tmp_path / "t")])
    assert text.exit_code == 0 and text.stderr == "" and "search: " in text.stdout, text.output
    assert (tmp_path / "t" / "plan.json").exists()
    est = invoke(["estimate", "--model", "mixtral-s", "--cluster", "H800:16", "--quiet", "--plot",
                  str(tmp_path / "e")])
    assert est.exit_code == 0 and est.stderr == ""


def test_estimate_quiet_leaves_out_the_input_notes(tmp_path):
    """docs/user-guide.md: `--quiet` (solve, estimate, bench) leaves only errors on stderr.  `estimate
    --megatron-script` of a script that launches 8 of the cluster's 16 GPUs notes which GPUs it prices; under
    --quiet that note went to stderr all the same (as it does not for solve)."""
    script = write_script(tmp_path, "--tensor-model-parallel-size 2 --expert-model-parallel-size 4")
    args = ["estimate", "--megatron-script", str(script), "--cluster", "H800:16"]
    loud = invoke(args)
    assert loud.exit_code == 0 and "note: " in loud.stderr, loud.output
    quiet = invoke([*args, "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr
    assert quiet.stdout == loud.stdout


def test_statuses_read_the_same_for_both_backends():
    """Exact search on a tiny model: both backends print OPTIMAL (certified) by default and with
    --no-prune; with --prune (the pruned space only) both print FEASIBLE with the same reason,
    whatever status string the backend itself returned."""
    from planner.output.report import search_status

    for prune, word in (([], "OPTIMAL"), (["--prune"], "FEASIBLE"), (["--no-prune"], "OPTIMAL")):
        texts = []
        for backend in ("hsdp", "cpsat"):
            res = invoke(["solve", "--megatron-args", TINY_FLAGS, "--cluster", "H800:8,MI300X:8", "--backend",
                          backend, "--quiet", *prune])
            assert res.exit_code == 0, res.output
            line = next(x for x in res.stdout.splitlines() if x.startswith("search: "))
            assert line.startswith(f"search: {word}")
            texts.append(line)
        assert texts[0] == texts[1]
    payload = {"certified_optimal": False, "status": "OPTIMAL", "gap": 0.0, "notes": [],
               "pruning": {"load_balance_delta": 0.2, "memory": True}}
    assert search_status(payload)[0] == "FEASIBLE"


# ----------------------------------------------------------------------------------------------------------
# Progress


def test_progress_is_silent_off_a_terminal_except_the_final_line():
    """Off a terminal the callback prints nothing; finish() leaves one line with the result's best
    and gap; under --quiet not even that."""
    from planner.progress import ProgressDisplay

    stream = io.StringIO()
    with ProgressDisplay(quiet=False, time_limit_s=60, stream=stream) as p:
        for k in range(1, 6):
            p({"tried": k, "total": 10, "solved": k, "best_s": 3.0, "bound_s": 2.5, "config": "x"})
        assert stream.getvalue() == ""
        assert abs(p.gap() - (3.0 - 2.5) / 3.0) < 1e-12
        assert "left" in p.eta_text()
    p.finish(best_s=3.0, lower_bound_s=3.0)
    text = stream.getvalue()
    assert text.count("\n") == 1 and "5/10 configurations" in text and "best 3.000 s" in text
    assert "gap 0.00%" in text
    quiet = io.StringIO()
    with ProgressDisplay(quiet=True, stream=quiet) as q:
        q({"tried": 1, "total": 2, "solved": 1, "best_s": 1.0})
    q.finish()
    assert quiet.getvalue() == ""


def test_time_left_is_the_time_limit_not_the_configurations_rate(monkeypatch):
    """The bar's time left is a bound the search keeps (the time limit left), not the rate over configurations closed:
    the cheap ones close first, so 4,100 of 4,360 closed after 1 s of an 11 s search read '<= 0.1 s left'."""
    from planner import progress as progress_module

    now = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    with progress_module.ProgressDisplay(quiet=False, time_limit_s=60, stream=io.StringIO()) as p:
        now[0] += 1.0
        p({"tried": 4100, "total": 4360, "solved": 40, "best_s": 3.0, "config": "x"})
        assert p.eta_text() == "<= 59 s left"


def test_live_progress_draws_a_bar_with_best_and_gap():
    """On a terminal (forced here) the rich bar shows configurations, elapsed time, an estimate and
    the best plan with its gap, and is cleared before the final line."""
    from planner.progress import ProgressDisplay

    stream = io.StringIO()
    with ProgressDisplay(quiet=False, time_limit_s=60, stream=stream, live=True) as p:
        p({"tried": 3, "total": 10, "solved": 2, "best_s": 4.0, "bound_s": 3.0, "config": "x"})
        p._progress.refresh()
        shown = stream.getvalue()
        assert "3/10" in shown and "best 4.000 s, gap 25.00%" in shown and "left" in shown
    p.finish()
    last = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", stream.getvalue().rstrip().splitlines()[-1])  # the bar's erase codes
    assert last.startswith("search: 3/10 configurations")


# ----------------------------------------------------------------------------------------------------------
# Plots and the data behind them


def _png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000, path


def test_out_writes_plots_with_their_data_and_summary_shows_them(solved_out):
    """--out always writes placement, timeline and memory (PNG + JSON); the data agree with plan.json
    and with each other; summary.md embeds every picture by a path that exists."""
    _, out = solved_out
    plan = json.loads((out / "plan.json").read_text())
    plots = out / "plots"
    for name in ("placement", "timeline", "memory"):
        _png(plots / f"{name}.png")
        assert plan["plots"][name] == f"plots/{name}.png"
    summary = (out / "summary.md").read_text()
    for name, rel in plan["plots"].items():
        assert f"![{name}]({rel})" in summary and (out / rel).exists()

    # placement: every stage holds TP*CP*DP GPUs, all of its own device type; the rest are unused
    place = json.loads((plots / "placement.json").read_text())
    p = plan["plan"]
    owners: dict[int, list[str]] = {}
    for node in place["nodes"]:
        for owner in node["gpus"]:
            if owner is not None:
                owners.setdefault(owner, []).append(node["device_type"])
    for i, st in enumerate(p["stages"]):
        assert len(owners[i]) == p["tp"] * p["cp"] * st["dp"]
        assert set(owners[i]) == {st["device_type"]}
        assert place["stages"][i]["num_layers"] == st["num_layers"]
    assert place["unused_gpus"] == plan["cluster_gpus"] - plan["world_size"]

    # memory: the parts add up to each stage's memory; capacities are the stages'
    mem = json.loads((plots / "memory.json").read_text())
    for m, st in zip(mem["stages"], plan["stages"]):
        parts = sum(m[f"{k}_gib"] for k in mem["parts"])
        assert math.isclose(parts, st["memory_gib"], rel_tol=1e-9)
        assert math.isclose(m["capacity_gib"], st["capacity_gib"]) and m["fits"] == st["fits"]

    # timeline: every micro-batch's forward and backward on every stage (and chunk); each stage busy
    # for m * its per-micro-batch time, idle for the rest of the simulated pipeline
    tl = json.loads((plots / "timeline.json").read_text())
    m, vpp, pp = plan["num_microbatches"], p["vpp"], p["pp"]
    assert tl["num_microbatches"] == m and tl["vpp"] == vpp
    assert len(tl["events"]) == 2 * m * pp * vpp
    assert tl["schedule"] == ("interleaved" if vpp > 1 else "1f1b")
    span = tl["simulated_pipeline_s"]
    for s, st in zip(tl["stages"], plan["stages"]):
        own = [e for e in tl["events"] if e[0] == s["index"]]
        busy = sum(e[5] - e[4] for e in own)
        assert math.isclose(busy, m * st["time_s"], rel_tol=1e-9)
        assert math.isclose(s["busy_s"] + s["bubble_s"], span, rel_tol=1e-9)
        assert all(0 <= e[4] <= e[5] <= span * (1 + 1e-12) for e in own)
    assert (plots / "timeline.csv").read_text().count("\n") == len(tl["events"]) + 1


def test_estimate_plot_interleaved_and_plot_dir_rules(tmp_path):
    """estimate --plot DIR draws an interleaved schedule (VPP 2): one event per micro-batch, chunk and
    direction on every stage, chunks 0 and 1 both present; --plot DIR together with --out is refused."""
    d = tmp_path / "pics"
    res = invoke(["estimate", "--model", "mixtral-s", "--cluster", "H800:16", "--tp", "2", "--pp", "2", "--ep", "4",
                  "--vpp", "2", "--gbs", "64", "--plot", str(d), "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    tl = json.loads((d / "timeline.json").read_text())
    assert tl["schedule"] == "interleaved" and tl["vpp"] == 2
    m = payload["num_microbatches"]
    assert len(tl["events"]) == 2 * m * 2 * 2
    assert {e[3] for e in tl["events"]} == {0, 1}
    for name in ("placement", "timeline", "memory"):
        _png(d / f"{name}.png")
    assert "![timeline](timeline.png)" in (d / "summary.md").read_text()
    bad = invoke(["solve", *SMALL, "--out", str(tmp_path / "o"), "--plot", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--plot" in bad.output and not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------------------------------------
# Assumed values


def test_preset_assumptions_are_listed_with_their_flags():
    """A preset: global batch, sequence, dropout, dispatcher and MoE imbalance are assumed, each with its flag;
    an override states the value; --moe-imbalance is applied (EP time grows with it)."""
    base = ["estimate", "--model", "mixtral-s", "--cluster", "H800:16", "--tp", "2", "--pp", "2", "--ep", "4", "--json"]
    d = json.loads(invoke(base).stdout)
    assumed = {a["name"]: a for a in d["assumed"]}
    assert set(assumed) == {"global batch size", "sequence length", "dropout", "token dispatcher", "MoE imbalance",
                            "allocator"}
    assert assumed["allocator"]["flag"] == "PYTORCH_CUDA_ALLOC_CONF"
    # the two values (attention/hidden), each with its setting
    assert assumed["dropout"]["value"] == "0.1/0.1"
    assert assumed["dropout"]["flag"] == "training: attention_dropout, hidden_dropout"
    assert assumed["global batch size"]["flag"] == "--gbs" and assumed["global batch size"]["value"] == d["plan"]["gbs"]
    assert assumed["MoE imbalance"]["flag"] == "--moe-imbalance"
    # estimate has no pick: the source speaks of the input's plan and of others (it read "the pick included")
    assert "at the input's EP 4" in assumed["MoE imbalance"]["source"]
    assert "a plan of other degrees gets its own" in assumed["MoE imbalance"]["source"]
    assert "pick" not in assumed["MoE imbalance"]["source"]
    assert assumed["token dispatcher"]["value"] == "alltoall"
    d2 = json.loads(invoke(base + ["--gbs", "64", "--seq", "2048", "--moe-imbalance", "2.0"]).stdout)
    assert {a["name"] for a in d2["assumed"]} == {"token dispatcher", "dropout", "allocator"}
    d3 = json.loads(invoke(base + ["--gbs", "64", "--seq", "2048"]).stdout)
    assert sum(s["ep_comm_s"] for s in d2["stages"]) > sum(s["ep_comm_s"] for s in d3["stages"])
    for bad in ("0.5", "nan", "inf"):
        r = invoke(base + ["--moe-imbalance", bad])
        assert r.exit_code == 2 and "--moe-imbalance" in r.output


def test_assumptions_read_in_a_narrow_terminal():
    """The reasons of the assumed values were a fourth column of a table: at 80 columns it was six characters wide,
    each reason folded into hundreds of lines of word pieces.  Where the terminal leaves the reasons less than
    ASSUMED_MIN_REASON_COLUMNS, each value is a line and its reason wraps beneath it, whole words, within the
    width; a wide terminal keeps the table (value and reason on one line)."""
    from planner.output.report import ASSUMED_MIN_REASON_COLUMNS

    base = ["estimate", "--model", "mixtral-s", "--cluster", "H800:16", "--tp", "2", "--pp", "2", "--ep", "4"]
    assumed = json.loads(invoke([*base, "--json"]).stdout)["assumed"]
    for columns in (80, 100):
        text = invoke(base, columns=columns).stdout
        section = text.split("assumed (the input does not state these)\n")[1].splitlines()
        assert max(len(line) for line in section) <= columns
        for a in assumed:
            head = f"  {a['name']}: {a['value']} (set with {a['flag']})"
            start = section.index(head)
            reason = []
            for line in section[start + 1:]:
                if not line.startswith("    "):
                    break
                reason.append(line.strip())
            assert " ".join(reason) == " ".join(a["source"].split()), a["name"]
    wide = invoke(base, columns=300).stdout
    lead = max(len(a["name"]) for a in assumed) + max(len(str(a["value"])) for a in assumed) + \
        max(len(a["flag"]) for a in assumed) + 6
    assert 300 - lead >= ASSUMED_MIN_REASON_COLUMNS
    for a in assumed:  # the table: the value's line carries the start of its reason
        assert any(a["flag"] in line and a["source"][:20] in line for line in wide.splitlines()), a["name"]


def test_flag_and_hf_assumptions(tmp_path):
    """Megatron flags: what they leave out (global batch, dispatcher) is assumed, what they state is not;
    an HF config: global batch, sequence and dispatcher are assumed."""
    flags = MIXTRAL_FLAGS.replace("--moe-token-dispatcher-type alltoall", "") + " --micro-batch-size 1"
    d = json.loads(invoke(["estimate", "--megatron-args", flags, "--cluster", "H800:16", "--json"]).stdout)
    names = {a["name"]: a for a in d["assumed"]}
    assert names["global batch size"]["value"] == 16  # Megatron's default: mbs * DP
    assert "Megatron" in names["token dispatcher"]["source"]
    assert "sequence length" not in names and "vocabulary" not in names
    stated = json.loads(invoke(["estimate", "--megatron-args", MIXTRAL_FLAGS + " --micro-batch-size 1 "
                                "--global-batch-size 64", "--cluster", "H800:16", "--json"]).stdout)
    assert {a["name"] for a in stated["assumed"]} == {"MoE imbalance", "dropout", "allocator"}
    assert next(a for a in stated["assumed"] if a["name"] == "dropout")["flag"] == "--attention-dropout, --hidden-dropout"
    both = json.loads(invoke(["estimate", "--megatron-args", MIXTRAL_FLAGS + " --micro-batch-size 1 "
                              "--global-batch-size 64 --attention-dropout 0.0 --hidden-dropout 0.0",
                              "--cluster", "H800:16", "--json"]).stdout)
    assert {a["name"] for a in both["assumed"]} == {"MoE imbalance", "allocator"}  # nothing assumed about dropout
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 1024,
        "intermediate_size": 3584, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
        "vocab_size": 32000, "max_position_embeddings": 4096, "num_local_experts": 4, "num_experts_per_tok": 2}))
    h = json.loads(invoke(["estimate", "--model", str(cfg), "--cluster", "H800:8", "--json"]).stdout)
    assert {a["name"] for a in h["assumed"]} == {"global batch size", "sequence length", "token dispatcher",
                                                "MoE imbalance", "allocator"}  # dropout: the config's (walk55m)


def test_the_models_parameters_are_printed_and_in_the_json(tmp_path, solved_out):
    """A model brought as a HuggingFace config.json (Qwen3-30B-A3B's): estimate --json gives its total and active
    parameter counts, and the text one line with them (the model card: 30.5B in total, 3.3B activated, given
    truncated; ours 3.353B).  solve gives them in its JSON (plan.json), text and summary.md (Mixtral 8x7B: 46.7B
    total, 12.9B per token, Mistral's announcement).  tests/test_cost_model.py checks the counts themselves."""
    from helpers.hf_configs import QWEN3_30B
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN3_30B))
    args = ["estimate", "--model", str(cfg), "--cluster", "H800:8", "--ep", "8"]
    d = json.loads(invoke([*args, "--json"]).stdout)
    assert round(d["parameters_total"] / 1e9, 1) == 30.5 and int(d["parameters_active"] / 1e8) == 33
    assert d["parameters_input_embedding"] == 151936 * 2048 and d["parameters_mtp"] == 0
    assert all(isinstance(d[k], int) for k in ("parameters_total", "parameters_active"))
    text = invoke(args, columns=200).output
    assert "model: 30.5 B parameters, 3.35 B active per token (both count the 311 M input embedding)" in text
    res, out = solved_out
    plan = json.loads((out / "plan.json").read_text())
    assert (round(plan["parameters_total"] / 1e9, 1), round(plan["parameters_active"] / 1e9, 1)) == (46.7, 12.9)
    line = "model: 46.7 B parameters, 12.9 B active per token (both count the 131 M input embedding)"
    assert line in res.output and f"- {line}" in (out / "summary.md").read_text()


# ----------------------------------------------------------------------------------------------------------
# Your plan against ours


def test_script_plan_is_priced_against_the_planners(tmp_path):
    """solve --megatron-script prices the script's own plan on the same cluster: the same numbers
    estimate gives for that script where it launches the whole cluster (estimate prices the GPUs a script
    launches), the speed-up is the ratio of iteration times, and both placements are drawn in one picture
    whose data hold each plan's stages."""
    script = write_script(tmp_path, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                                    "--expert-model-parallel-size 2 --sequence-parallel", nodes=2)
    cluster = ["--cluster", "H800:8,A100:8"]
    out = tmp_path / "o"
    res = invoke(["solve", "--megatron-script", str(script), *cluster, "--backend", "hsdp", "--out", str(out)])
    assert res.exit_code == 0, res.output
    plan = json.loads((out / "plan.json").read_text())
    u = plan["user_plan"]
    est = json.loads(invoke(["estimate", "--megatron-script", str(script), *cluster, "--json"]).stdout)
    assert u["priced"] and math.isclose(u["iteration_time_s"], est["iteration_time_s"], rel_tol=1e-12)
    assert u["plan"]["tp"] == 2 and u["plan"]["pp"] == 2 and u["plan"]["ep"] == 2
    assert math.isclose(u["speedup"], u["iteration_time_s"] / plan["iteration_time_s"], rel_tol=1e-12)
    assert u["fits"] == est["fits"] and u["runs"] == (est["fits"] and not u["violations"])
    assert "your plan" in res.stdout and "speed-up" in res.stdout
    both = json.loads((out / "plots" / "placement_vs_yours.json").read_text())
    assert [s["num_layers"] for s in both["yours"]["stages"]] == [s["num_layers"] for s in u["plan"]["stages"]]
    assert [s["num_layers"] for s in both["planner"]["stages"]] == [s["num_layers"] for s in plan["plan"]["stages"]]
    assert both["yours"]["order"] == "rank"
    _png(out / "plots" / "placement_vs_yours.png")
    summary = (out / "summary.md").read_text()
    assert "## Your plan against the planner's" in summary
    rng = "| range (s) | {:.3f}-{:.3f} | {:.3f}-{:.3f} |".format(*u["iteration_time_range_s"],
                                                              *plan["iteration_time_range_s"])
    assert rng in summary, summary  # walk55s: the text table had the ranges, summary.md did not


def test_script_plan_that_does_not_fit_or_breaks_a_rule_or_cannot_run_says_so(tmp_path, monkeypatch):
    """No model parallelism for Mixtral on 16 H800: does not fit.  VPP with too few micro-batches:
    breaks Megatron's rule.  TP*PP*CP not dividing the cluster: cannot run, and says why.  (The text run prints
    the --json run's search: helpers/cli.py solve_searches_once.)"""
    solve_searches_once(monkeypatch)
    cluster = ["--cluster", "H800:16", "--backend", "hsdp", "--quiet"]
    oom = write_script(tmp_path, "--tensor-model-parallel-size 1")
    r = invoke(["solve", "--megatron-script", str(oom), *cluster, "--json"])
    u = json.loads(r.stdout)["user_plan"]
    assert u["fits"] is False and u["overflow"]["short_gib"] > 0 and u["runs"] is False
    text = invoke(["solve", "--megatron-script", str(oom), *cluster]).stdout
    assert "does not fit" in text
    vpp = write_script(tmp_path, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                                 "--num-layers-per-virtual-pipeline-stage 2 --expert-model-parallel-size 2 "
                                 "--sequence-parallel", batch="--micro-batch-size 1 --global-batch-size 12")
    u = json.loads(invoke(["solve", "--megatron-script", str(vpp), *cluster, "--json"]).stdout)["user_plan"]
    assert [v["rule"] for v in u["violations"]] == ["vpp_microbatches"] and u["runs"] is False
    bad = write_script(tmp_path, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                                 "--context-parallel-size 2 --sequence-parallel")
    r = invoke(["solve", "--megatron-script", str(bad), "--cluster", "H800:24", "--backend", "hsdp", "--quiet"])
    assert r.exit_code == 0, r.output
    assert "cannot run on this cluster" in r.stdout and "16" in r.stdout


def test_own_calibration_states_the_imbalance(tmp_path):
    """A router imbalance from the user's own --profiles calibration is not an assumption."""
    (tmp_path / "corrections.yaml").write_text(
        "- device: '*'\n  kind: moe_imbalance_factor\n  factor: 1.3\n"
        "  provenance:\n    kind: measured\n    source: router statistics of my run\n")
    args = ["estimate", "--model", "mixtral-s", "--cluster", "H800:16", "--json"]
    mine = json.loads(invoke(args + ["--profiles", str(tmp_path)]).stdout)
    assert "MoE imbalance" not in {a["name"] for a in mine["assumed"]}
    # but the output names the value used and where it came from (--moe-imbalance's promise)
    named = [n for n in mine["notes"] if n.startswith("MoE imbalance ") and "your router statistics" in n]
    assert len(named) == 1 and "max/mean tokens per expert 1.3" in named[0], mine["notes"]
    shipped = json.loads(invoke(args).stdout)
    assert "MoE imbalance" in {a["name"] for a in shipped["assumed"]}


def test_top_k_never_lists_one_plan_twice():
    """Grouping each plan's device types into one block can turn two searched plans into the same one: --top K
    lists each plan once (here six asked, three distinct on H800 + MI300X: the search returns six plans, three of them
    twice, as it did for mixtral-s, whose search took 14 s)."""
    r = invoke(["solve", "--megatron-args", TINY_FLAGS, "--cluster", "H800:8,MI300X:8", "--top", "6",
                "--backend", "hsdp", "--json", "--quiet"])
    d = json.loads(r.stdout)
    plans = [json.dumps(d["plan"], sort_keys=True)] + [json.dumps(a["plan"], sort_keys=True)
                                                       for a in d.get("alternatives", [])]
    assert len(plans) >= 2 and len(set(plans)) == len(plans)


def test_flags_whose_one_stage_spans_vendors_cannot_run_upstream(tmp_path):
    """Flags without model parallelism on H800 + MI300X make one data-parallel stage over both vendors, which the
    plan prices as the slower type: estimate refuses it as upstream Megatron would (one vendor's collective library
    per job), and solve calls the user's plan one that does not run, proposes no trial of it, and writes its
    launchers (it used to fail writing a trial launcher for 8 H800 on a cluster of 4)."""
    flags = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --vocab-size 32000 --seq-length 2048 "
             "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 --bf16")
    r = invoke(["estimate", "--megatron-args", flags, "--cluster", "H800:4,MI300X:4"])
    assert r.exit_code == 2 and "cannot run one job over" in r.output
    r = invoke(["solve", "--megatron-args", flags, "--cluster", "H800:4,MI300X:4", "--backend", "hsdp", "--quiet",
                "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert d["user_plan"]["runs"] is False and "yours" not in {t["name"] for t in d["trials"]}


def test_the_headline_shows_small_figures_with_their_digits():
    """walk55: a CPU profile's estimate printed '0.0 (0-0) TFLOP/s/GPU' beside 'MFU 39.2%'; a figure the fixed
    decimals would hide keeps two significant digits, the usual ones keep their decimals."""
    from planner.output.report import headline

    small = headline({"iteration_time_s": 1.5, "iteration_time_range_s": [1.2, 1.9], "tflops_per_gpu": 0.0043,
                      "tflops_per_gpu_range": [0.0031, 0.0052], "mfu": 0.392})
    assert "0.0043 (0.0031-0.0052) TFLOP/s/GPU" in small and "iteration 1.500 s (range 1.20-1.90)" in small
    usual = headline({"iteration_time_s": 0.387, "iteration_time_range_s": [0.37, 0.41], "tflops_per_gpu": 21.5,
                      "tflops_per_gpu_range": [20.2, 23.1], "mfu": 0.022})
    assert usual == "iteration 0.387 s (range 0.37-0.41) | 21.5 (20-23) TFLOP/s/GPU | MFU 2.2%"


def test_full_recompute_is_spelled_one_way_in_every_output():
    """walk55s: --wide and summary.md printed `full:uniform:1` where the default table, --top and the trials print
    the --recompute form `full-uniform:1`; every output now spells it the CLI's way (selective keeps its modules
    where there is room)."""
    from planner.output.report import _md_stage_table, recompute_long, recompute_short

    assert recompute_long("full:uniform:1") == recompute_short("full:uniform:1") == "full-uniform:1"
    assert recompute_long("selective:core_attn+moe_act") == "selective:core_attn+moe_act"
    wide = invoke(["estimate", "--model", "mixtral-s", "--cluster", "H800:8", "--recompute", "full", "--wide"])
    assert wide.exit_code == 0 and "full-uniform:1" in wide.stdout and "full:uniform" not in wide.stdout, wide.output
    payload = json.loads(invoke(["estimate", "--model", "mixtral-s", "--cluster", "H800:8", "--recompute",
                                 "full-block:2", "--json"]).stdout)
    table = "\n".join(_md_stage_table(payload["stages"]))
    assert "full-block:2" in table and "full:block" not in table, table
