"""Display details a new user found hard to read: FlagScale's per-stage micro-batches, compare's plan under
per-stage meshes, the placement picture's node numbers against the launcher's, and the memory picture's labels
and summary.md's memory parts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main
from planner.inputs.cluster import parse_cluster
from planner.inputs.hosts import Host
from planner.launcher.common import hostfile_text, place_agents, stage_rank_ranges
from planner.output.plots import _memory_figure, memory_label_bottom, node_caption, placement_data
from planner.output.report import degrees_line, plan_json
from planner.schemas.plan import Plan, StagePlan

from helpers.cli import compare_searches_once
from helpers.once import run_once

# the pick of `solve --model mixtral-s --cluster H800:16,MI300X:16` (walk53b item 1): stage 0 on MI300X at DP 16,
# stages 1-2 on H800 at DP 8, so FlagScale runs 2-sample micro-batches on them (DP0 x mbs / DP)
HET = {"runtime": "flagscale", "tp": 1, "ep": 8, "mbs": 1, "gbs": 1024,
       "stages": [{"device_type": "MI300X", "num_layers": 14, "dp": 16},
                  {"device_type": "H800", "num_layers": 9, "dp": 8},
                  {"device_type": "H800", "num_layers": 9, "dp": 8}]}
HET_CLUSTER = "H800:16,MI300X:16"


def invoke(args: list[str]):
    return CliRunner().invoke(main, args, env={"COLUMNS": "120"}, catch_exceptions=False)


@pytest.fixture(scope="module")
def het_estimate(tmp_path_factory):
    """estimate --plan on the FlagScale pick, with its pictures (--allow-invalid: estimate prices under upstream
    Megatron's rules, which refuse one job over AMD and NVIDIA; the pricing is solve's)."""
    d = tmp_path_factory.mktemp("het")
    (d / "plan.json").write_text(json.dumps(HET))
    args = ["estimate", "--plan", str(d / "plan.json"), "--model", "mixtral-s", "--cluster", HET_CLUSTER,
            "--allow-invalid"]
    res = invoke([*args, "--plot", str(d / "plots")])
    assert res.exit_code == 0, res.output
    return res.output, d / "plots"


@pytest.fixture(scope="module")
def solved():
    """solve --out of mixtral-s on H800:8,MI300X:8 (test_cli.py's --json test and test_readable_output.py's --quiet
    test read the same solve)."""
    res = run_once("solve", "--model", "mixtral-s", "--cluster", "H800:8,MI300X:8", "--gbs", "64", "--backend", "hsdp",
                   "--json", "--quiet", out=True)
    assert res.exit_code == 0, res.stdout + res.stderr
    return res.out


def _md_table(summary: str) -> list[dict[str, str]]:
    """The first markdown table under '## Stages', as {header: cell} rows."""
    lines = summary.split("## Stages", 1)[1].strip().split("\n\n", 1)[0].splitlines()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    return [dict(zip(rows[0], r)) for r in rows[2:]]


# ---------------------------------------------------------------------------------------------------------
# item 9: each stage's own micro-batch


def test_flagscale_per_stage_micro_batches_are_shown(het_estimate):
    """The header says mbs=1/2/2, not mbs=1; the terminal table and summary.md have a column of each stage's
    micro-batch; a plan whose stages share one micro-batch keeps the single number and no column."""
    text, plots = het_estimate
    assert "mbs=1/2/2" in text and "mbs=1 " not in text
    header = next(line for line in text.splitlines() if line.startswith("stage "))
    assert header.split()[:5] == ["stage", "device", "layers", "DP", "mbs"]
    rows = [line.split() for line in text.splitlines() if re.match(r"\s+\d+\s+(MI300X|H800)\s", line)]
    assert [r[4] for r in rows] == ["1", "2", "2"]
    summary = (plots / "summary.md").read_text()
    assert "mbs=1/2/2" in summary
    assert [r["micro-batch (samples per DP rank)"] for r in _md_table(summary)] == ["1", "2", "2"]

    uniform = Plan(runtime="flagscale", mbs=2, gbs=64, stages=(StagePlan(device_type="H800", num_layers=2, dp=8),
                                                               StagePlan(device_type="MI300X", num_layers=2, dp=8)))
    line = degrees_line(plan_json(uniform))
    assert "mbs=2 " in line and "per stage" not in line


# ---------------------------------------------------------------------------------------------------------
# item 10: compare shows the stages


def test_compare_under_flagscale_shows_each_plans_stages(monkeypatch):
    """compare --json keeps `plan` and adds `stages` (device type, layers, DP, recompute, micro-batch per stage);
    the text names the stages after the table, once per distinct plan with the backends that found it.  The text
    run prints the --json run's rows (one comparison searched: helpers/cli.py compare_searches_once)."""
    compare_searches_once(monkeypatch)
    args = ["compare", "--model", "mixtral-s", "--cluster", "H800:8,MI300X:8", "--layers", "4", "--time-limit", "60"]
    res = invoke([*args, "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["runtime"] == "flagscale"
    for row in d["results"]:
        assert "dp=per-stage" in row["plan"]
        stages = row["stages"]
        assert sum(s["num_layers"] for s in stages) == 4
        assert {s["device_type"] for s in stages} <= {"H800", "MI300X"}
        assert all(s["dp"] >= 1 and s["micro_batch_size"] >= 1 and s["recompute"] for s in stages)
        assert [s["index"] for s in stages] == list(range(len(stages)))
    text = invoke(args).output
    lines = [line for line in text.splitlines() if line.startswith("stages (")]
    named = sorted(b for line in lines for b in line.split("(", 1)[1].split(")", 1)[0].split(", "))
    assert named == sorted(r["backend"] for r in d["results"])
    first = d["results"][0]["stages"][0]
    assert any(f"S0 {first['device_type']} {first['num_layers']} layer" in line and f"DP{first['dp']}" in line
               for line in lines)


# ---------------------------------------------------------------------------------------------------------
# item 11: the placement picture numbers nodes as the launcher does


def _check_launcher_numbering(plan: Plan, cluster, hosts=None) -> dict:
    place = placement_data(plan, cluster, hosts=hosts)
    agents = place_agents(plan, cluster, hosts)
    listed = [line.split()[0] for line in hostfile_text(agents).splitlines() if line and not line.startswith("#")]
    assert place["node_numbering"] == "launcher"
    used = [n for n in place["nodes"] if n["node_ranks"]]
    assert [n["host"] for n in used] == listed  # the picture's order is the hostfile's
    by_host = {n["host"]: n for n in place["nodes"]}
    ranges = stage_rank_ranges(plan)
    for a in agents:
        node = by_host[a.host]
        assert a.node_rank in node["node_ranks"] and node["device_type"] == a.device_type
        for j, gpu in enumerate(a.gpu_ids):
            stage = next(i for i, (lo, hi) in enumerate(ranges) if lo <= a.first_rank + j < hi)
            assert node["gpus"][gpu] == stage
    return place


def test_placement_numbers_nodes_as_launch_sh_and_the_hostfile(profiles):
    """Stage 0 on MI300X: launch.sh's node 0 is the first MI300X node, though the cluster lists H800 first; the
    picture's data give each node its node rank and hostfile name, the GPUs hold the stages the launcher puts
    there, and the captions say both; --hosts names are the file's."""
    plan = Plan.from_json(HET)
    cluster = parse_cluster(HET_CLUSTER, profiles)
    place = _check_launcher_numbering(plan, cluster)
    assert [(n["device_type"], n["node_ranks"], n["host"]) for n in place["nodes"]] == [
        ("MI300X", [0], "mi300x-node0"), ("MI300X", [1], "mi300x-node1"),
        ("H800", [2], "h800-node0"), ("H800", [3], "h800-node1")]
    assert [node_caption(n) for n in place["nodes"]][2] == "node 2 (h800-node0)"

    hosts = (Host("gpu-a", "H800", 8, 1), Host("gpu-b", "H800", 8, 2), Host("amd-x", "MI300X", 8, 3),
             Host("amd-y", "MI300X", 8, 4))
    place = _check_launcher_numbering(plan, cluster, hosts)
    assert [node_caption(n) for n in place["nodes"]] == ["node 0 (amd-x)", "node 1 (amd-y)", "node 2 (gpu-a)",
                                                         "node 3 (gpu-b)"]

    # a plan on part of the cluster: the unused nodes come last, named but not numbered
    small = Plan(runtime="flagscale", tp=1, ep=8, mbs=1, gbs=64,
                 stages=(StagePlan(device_type="H800", num_layers=16, dp=8),
                         StagePlan(device_type="MI300X", num_layers=16, dp=8)))
    place = _check_launcher_numbering(small, cluster)
    assert [node_caption(n) for n in place["nodes"]] == ["node 0 (h800-node0)", "node 1 (mi300x-node0)",
                                                         "h800-node1, unused", "mi300x-node1, unused"]


def test_solve_out_placement_matches_its_hostfile(solved):
    place = json.loads((solved / "plots" / "placement.json").read_text())
    hostfile = (solved / "launch" / "hostfile").read_text()
    listed = [(line.split()[0], line.split("type=")[1]) for line in hostfile.splitlines()
              if line and not line.startswith("#")]
    used = [(n["host"], n["device_type"]) for n in place["nodes"] if n["node_ranks"]]
    assert used == listed
    assert [r for n in place["nodes"] for r in n["node_ranks"]] == list(range(len(listed)))


# ---------------------------------------------------------------------------------------------------------
# item 12: memory.png's labels and summary.md's memory parts


def test_memory_labels_do_not_cross_the_capacity_lines(het_estimate):
    """Stage 1 of the FlagScale pick is at 98% of usable memory: its label, as drawn, lies clear of both its
    usable and its capacity line (so does every other stage's)."""
    _, plots = het_estimate
    data = json.loads((plots / "memory.json").read_text())
    assert any(s["near_capacity"] for s in data["stages"])
    fig = _memory_figure(data)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    to_data = ax.transData.inverted()
    labels = [t for t in ax.texts if "GiB" in t.get_text() or "%" in t.get_text()]
    assert len(labels) == len(data["stages"])
    for s, text in zip(data["stages"], labels):
        box = text.get_window_extent(renderer)
        (_, y0), (_, y1) = to_data.transform([(box.x0, box.y0), (box.x1, box.y1)])
        for line in (s["usable_gib"], s["capacity_gib"]):
            assert not y0 <= line <= y1, (s["index"], y0, y1, line)
        assert y0 >= s["total_gib"]  # above its bar
    assert y1 <= ax.get_ylim()[1]


def test_memory_label_bottom_clears_each_line_it_would_cross():
    assert memory_label_bottom(50.0, (75.0, 79.0), 10.0, 1.0) == 51.0  # far below: on its bar
    assert memory_label_bottom(73.8, (75.1, 79.1), 10.0, 1.0) == pytest.approx(80.1)  # under both: above both
    assert memory_label_bottom(90.0, (75.1, 79.1), 10.0, 1.0) == 91.0  # over the capacity: on its bar


def _parts_sum(row: dict[str, str]) -> float:
    return sum(float(row[k]) for k in ("weights", "grads", "optimizer", "activations", "allocated, not itemised",
                                       "allocator cache", "other"))


def test_summary_memory_parts_add_up_to_the_total(solved, het_estimate):
    """solve --out (and estimate --plot): in every stage row of summary.md the memory parts add up to the
    stage's memory, within the rounding of 8 numbers to 0.1 GiB."""
    for summary in ((solved / "summary.md").read_text(), (het_estimate[1] / "summary.md").read_text()):
        rows = _md_table(summary)
        assert rows
        for row in rows:
            total = float(re.search(r"[\d.]+", row["memory (GiB)"]).group())
            assert abs(_parts_sum(row) - total) <= 8 * 0.05 + 1e-9, row


def test_a_name_the_plot_font_cannot_draw_warns_once_in_the_notes(tmp_path):
    """A model named in CJK: matplotlib's font has no glyph for it and warns per character; under --quiet nothing
    reaches stderr, and the output says once that the title's characters are drawn as boxes."""
    model = tmp_path / "cjk.yaml"
    model.write_text("name: 中文模型\nnum_layers: 4\nhidden_size: 1024\nnum_attention_heads: 8\nvocab_size: 32000\n"
                     "seq_length: 1024\nmax_position_embeddings: 1024\n")
    res = CliRunner().invoke(main, ["estimate", "--model", str(model), "--cluster", "H100:8", "--plot",
                                    str(tmp_path / "plots"), "--quiet", "--json"])
    assert res.exit_code == 0, res.output
    assert "Glyph" not in res.stderr
    notes = [n for n in json.loads(res.stdout)["notes"] if "no glyph" in n]
    assert len(notes) == 1
