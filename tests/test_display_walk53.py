"""What the second new-user walk (walk53b, items 9-12) found hard to read: FlagScale's per-stage micro-batches,
compare's plan under per-stage meshes, the placement picture's node numbers against the launcher's, and the
memory picture's labels and summary.md's memory parts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main

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
def solved(tmp_path_factory):
    out = tmp_path_factory.mktemp("solve") / "plan"
    res = invoke(["solve", "--model", "mixtral-s", "--cluster", "H800:8,MI300X:8", "--gbs", "64", "--backend", "hsdp",
                  "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    return out


def _md_table(summary: str) -> list[dict[str, str]]:
    """The first markdown table under '## Stages', as {header: cell} rows."""
    lines = summary.split("## Stages", 1)[1].strip().split("\n\n", 1)[0].splitlines()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    return [dict(zip(rows[0], r)) for r in rows[2:]]


# ---------------------------------------------------------------------------------------------------------
# item 10: compare shows the stages


def test_compare_under_flagscale_shows_each_plans_stages():
    """compare --json keeps `plan` and adds `stages` (device type, layers, DP, recompute, micro-batch per stage);
    the text names the stages after the table, once per distinct plan with the backends that found it."""
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


