"""`estimate --plan`: a saved plan (solve --out's plan.json, a solve --json output, or the same edited) priced with
its model and cluster from the file, for re-pricing solve's pick (e.g. with --profiles after calibrate) or a plan
edited by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main

RUNNER = CliRunner()
FLAGS = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --vocab-size 32000 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 --bf16")


def _run(args):
    r = RUNNER.invoke(main, args)
    return r.exit_code, r.stdout, r.output


@pytest.fixture(scope="module")
def solved(tmp_path_factory) -> Path:
    """`solve --out` of FLAGS on H100:8, solved once for the tests that start from its plan.json (each test works on
    its own copy of the directory)."""
    out = tmp_path_factory.mktemp("solved") / "p"
    code, _, text = _run(["solve", "--megatron-args", FLAGS, "--cluster", "H100:8", "--backend", "hsdp", "--quiet",
                          "--out", str(out)])
    assert code == 0, text
    return out


def test_a_saved_plan_is_priced_as_solve_priced_it_and_an_edit_is_priced_anew(tmp_path, solved):
    shutil.copytree(solved, tmp_path / "p")
    saved = json.loads((tmp_path / "p" / "plan.json").read_text())
    code, stdout, out = _run(["estimate", "--plan", str(tmp_path / "p" / "plan.json"), "--json"])
    assert code == 0, out
    again = json.loads(stdout)
    assert again["plan"] == saved["plan"]
    assert again["iteration_time_s"] == saved["iteration_time_s"]  # one evaluator, two paths
    assert again["max_memory_gib"] == saved["max_memory_gib"]
    # solve --json's own output is a plan file too
    code, stdout, _ = _run(["solve", "--megatron-args", FLAGS, "--cluster", "H100:8", "--backend", "hsdp", "--quiet",
                            "--json"])
    (tmp_path / "solved.json").write_text(stdout)
    code, stdout, out = _run(["estimate", "--plan", str(tmp_path / "solved.json"), "--json"])
    assert code == 0, out
    assert json.loads(stdout)["iteration_time_s"] == saved["iteration_time_s"]
    # an edit: every stage recomputes every layer in full -> slower, less activation memory (the derived
    # recompute_label dropped: one that no longer names recompute is refused, walk53b #4)
    edited = dict(saved)
    edited["plan"] = dict(saved["plan"], stages=[{**{k: v for k, v in s.items() if k != "recompute_label"},
                                                  "recompute": {"granularity": "full", "method": "uniform",
                                                                "num_layers": 1, "modules": []}}
                                                 for s in saved["plan"]["stages"]])
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    code, stdout, out = _run(["estimate", "--plan", str(tmp_path / "edited.json"), "--json"])
    assert code == 0, out
    full = json.loads(stdout)
    assert all(s["recompute"]["granularity"] == "full" for s in full["plan"]["stages"])
    if any(s["recompute"]["granularity"] != "full" for s in saved["plan"]["stages"]):
        assert full["iteration_time_s"] > saved["iteration_time_s"]


def test_inputs_edited_since_solve_are_said_in_the_result_json_included(tmp_path, solved):
    """A plan.json whose inputs.run was edited after solve wrote it is priced for the run as it is now: the JSON's
    `notes` say so (they went to stderr only, and nowhere under --quiet), once."""
    doc = json.loads((solved / "plan.json").read_text())
    doc["inputs"]["run"]["training"]["hidden_dropout"] = 0.0
    (tmp_path / "edited.json").write_text(json.dumps(doc))
    res = RUNNER.invoke(main, ["estimate", "--plan", str(tmp_path / "edited.json"), "--json"])
    assert res.exit_code == 0, res.output
    said = [n for n in json.loads(res.stdout)["notes"] if "changed after solve wrote edited.json" in n]
    assert len(said) == 1 and said[0].startswith("inputs.run") and "priced for them as they are now" in said[0]
    assert "changed after solve" not in res.stderr
    quiet = RUNNER.invoke(main, ["estimate", "--plan", str(tmp_path / "edited.json"), "--quiet"])
    assert quiet.exit_code == 0 and "changed after solve wrote edited.json" in quiet.stdout, quiet.output


def test_plan_refuses_changes_from_the_command_line_and_cluster_is_needed_without_it(tmp_path, solved):
    shutil.copytree(solved, tmp_path / "p")
    code, _, out = _run(["estimate", "--plan", str(tmp_path / "p" / "plan.json"), "--tp", "2"])
    assert code == 2 and "--plan" in out and "--tp" in out and "Traceback" not in out
    code, _, out = _run(["estimate", "--megatron-args", FLAGS])
    assert code == 2 and "--cluster" in out and "Traceback" not in out


def test_a_saved_flagscale_plan_is_priced_on_its_runtime(tmp_path):
    """A mixed-vendor pick runs on FlagScale: estimate --plan prices it on the runtime the file names (the price
    solve gave), not refused as a job upstream Megatron cannot run."""
    # MI300X listed first: Megatron's rank order would put the pick's first stage on the MI300X nodes
    code, _, out = _run(["solve", "--megatron-args", FLAGS, "--cluster", "MI300X:4,H800:4", "--backend", "hsdp",
                         "--quiet", "--out", str(tmp_path / "p")])
    assert code == 0, out
    saved = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert saved["runtime"] == "flagscale" and saved["plan"]["stages"][0]["device_type"] == "H800"
    code, stdout, out = _run(["estimate", "--plan", str(tmp_path / "p" / "plan.json"), "--json"])
    assert code == 0, out
    priced = json.loads(stdout)
    assert priced["iteration_time_s"] == saved["iteration_time_s"]
    assert not any("job runs this" in n for n in priced["notes"])
    # its picture places each stage on its own device type, as its launcher does (not Megatron's rank order)
    code, _, out = _run(["estimate", "--plan", str(tmp_path / "p" / "plan.json"), "--plot", str(tmp_path / "pic"),
                         "--quiet"])
    assert code == 0, out
    place = json.loads((tmp_path / "pic" / "placement.json").read_text())
    types = [s["device_type"] for s in saved["plan"]["stages"]]
    on = [(n["device_type"], g) for n in place["nodes"] for g in n["gpus"] if g is not None]
    assert on and all(types[g] == t for t, g in on), on


def test_a_recompute_label_that_contradicts_recompute_is_refused(tmp_path, solved):
    """walk53b #4: stage 2's recompute_label set to "full:uniform:1" with recompute left at none was priced
    and emitted as none without a word; the label is derived from recompute and never read.  Now
    estimate --plan and emit refuse it (exit 2), naming the stage, the label and recompute; the label
    edited to match (selective modules in any order) or deleted is accepted."""
    shutil.copytree(solved, tmp_path / "p")
    saved = json.loads((tmp_path / "p" / "plan.json").read_text())
    k = len(saved["plan"]["stages"]) - 1
    stage = saved["plan"]["stages"][k]
    assert stage["recompute_label"] in ("none", "selective:core_attn", "full:uniform:1"), stage
    stage["recompute"], stage["recompute_label"] = {"granularity": "none"}, "none"  # a consistent edit: accepted
    (tmp_path / "none.json").write_text(json.dumps(saved))
    code, _, out = _run(["estimate", "--plan", str(tmp_path / "none.json")])
    assert code == 0, out
    doc = json.loads(json.dumps(saved))
    doc["plan"]["stages"][k]["recompute_label"] = "full:uniform:1"  # the label alone edited
    (tmp_path / "label.json").write_text(json.dumps(doc))
    for args in (["estimate", "--plan", str(tmp_path / "label.json")],
                 ["emit", "--plan", str(tmp_path / "label.json"), "--out", str(tmp_path / "launch")]):
        code, _, out = _run(args)
        assert code == 2 and "--plan" in out and "Traceback" not in out, out
        assert f"stage {k}" in out and "'full:uniform:1'" in out and '"granularity": "none"' in out, out
        assert "gives 'none'" in out
    assert not (tmp_path / "launch").exists()
    # recompute edited to selective, its label to match with the modules in another order: accepted
    sel = json.loads(json.dumps(saved))
    sel["plan"]["stages"][k]["recompute"] = {"granularity": "selective", "modules": ["core_attn", "mlp"]}
    sel["plan"]["stages"][k]["recompute_label"] = "selective:mlp+core_attn"
    (tmp_path / "sel.json").write_text(json.dumps(sel))
    code, stdout, out = _run(["estimate", "--plan", str(tmp_path / "sel.json"), "--json"])
    assert code == 0, out
    assert json.loads(stdout)["plan"]["stages"][k]["recompute"]["granularity"] == "selective"
    # recompute edited to full, its label in --recompute's spelling (walk54: refused before): accepted
    full = json.loads(json.dumps(saved))
    full["plan"]["stages"][k]["recompute"] = {"granularity": "full", "method": "uniform", "num_layers": 1}
    for label in ("full-uniform:1", "full", "full:uniform:1"):
        full["plan"]["stages"][k]["recompute_label"] = label
        (tmp_path / "full.json").write_text(json.dumps(full))
        code, _, out = _run(["estimate", "--plan", str(tmp_path / "full.json")])
        assert code == 0, (label, out)
    full["plan"]["stages"][k]["recompute_label"] = "full-block:1"  # another method: still refused
    (tmp_path / "full.json").write_text(json.dumps(full))
    assert _run(["estimate", "--plan", str(tmp_path / "full.json")])[0] == 2
    del doc["plan"]["stages"][k]["recompute_label"]  # the label deleted: recompute (none) is what counts
    (tmp_path / "nolabel.json").write_text(json.dumps(doc))
    code, _, out = _run(["estimate", "--plan", str(tmp_path / "nolabel.json")])
    assert code == 0, out


def test_a_saved_plan_that_breaks_a_rule_is_refused_naming_the_file(tmp_path):
    """walk54: a hand-edited plan.json that breaks Megatron's rules was refused naming options the user never passed
    ("error: --ep/--etp: Megatron would refuse it: ... stage 0: TP*CP*DP = 4 must be a multiple of ETP*EP = 8" for
    a stage's DP edited below EP; "error: configuration: ..." for per-stage recompute on the megatron runtime).  The
    file is what breaks it: the message names --plan, as emit's does."""
    moe = FLAGS + " --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8"
    code, _, out = _run(["solve", "--megatron-args", moe, "--cluster", "H100:8", "--backend", "hsdp", "--quiet",
                         "--out", str(tmp_path / "p")])
    assert code == 0, out
    saved = json.loads((tmp_path / "p" / "plan.json").read_text())
    doc = json.loads(json.dumps(saved))
    doc["plan"]["ep"] = 16  # more experts' ranks than any stage's TP*CP*DP
    (tmp_path / "ep.json").write_text(json.dumps(doc))
    code, _, out = _run(["estimate", "--plan", str(tmp_path / "ep.json")])
    assert code == 2 and "Traceback" not in out, out
    line = [ln for ln in out.splitlines() if ln.startswith("error:")][0]
    assert line.startswith("error: --plan: Megatron would refuse it:") and "--ep" not in line.split("refuse it")[0], line
    code, _, out = _run(["estimate", "--plan", str(tmp_path / "ep.json"), "--allow-invalid"])
    assert code == 0, out


def test_the_assumed_moe_imbalance_is_the_priced_plans(tmp_path):
    """walk54: estimate --plan of a plan at EP 4 (solve's trial candidate, or an edit) printed the MoE imbalance solve
    had assumed for its input ("1.1337 real routing at EP 8 (the input's EP is 1)"), not the EP-4 plan's own that
    it priced (1.0688).  Now the assumption is the saved plan's: its EP size and micro-batch."""
    moe = FLAGS + " --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8"
    code, _, out = _run(["solve", "--megatron-args", moe, "--cluster", "H100:8", "--backend", "hsdp", "--quiet",
                         "--out", str(tmp_path / "p")])
    assert code == 0, out
    saved = json.loads((tmp_path / "p" / "plan.json").read_text())
    value = {}
    for ep in (8, 4, 2):
        doc = json.loads(json.dumps(saved))
        doc["plan"]["ep"] = ep
        (tmp_path / f"ep{ep}.json").write_text(json.dumps(doc))
        code, stdout, out = _run(["estimate", "--plan", str(tmp_path / f"ep{ep}.json"), "--json"])
        assert code == 0, out
        (moe_row,) = [a for a in json.loads(stdout)["assumed"] if a["name"] == "MoE imbalance"]
        local = {8: "1 expert", 4: "2 experts", 2: "4 experts"}[ep]  # singular at one expert per rank
        assert f"at the input's EP {ep}, {local} per rank" in moe_row["source"], moe_row
        value[ep] = moe_row["value"]
    assert value[8] > value[4] > value[2]  # more experts per rank: the busiest rank is nearer the mean


def test_solve_states_the_moe_imbalance_of_its_pick(tmp_path):
    """Solve printed the MoE imbalance of the input's EP (EP 8 where the input's is 1: 1.1337 for mixtral-l) while its
    pick ran at EP 4 and was priced at 1.0688, so its table and `estimate --plan` of its own plan.json disagreed.
    Now solve's assumption is the pick's (its EP size and micro-batch), the value estimate --plan gives that plan."""
    moe = FLAGS + " --num-experts 8 --moe-router-topk 2"
    code, stdout, out = _run(["solve", "--megatron-args", moe, "--cluster", "H100:8", "--backend", "hsdp", "--quiet",
                              "--json", "--out", str(tmp_path / "p")])
    assert code == 0, out
    doc = json.loads(stdout)
    ep = doc["plan"]["ep"]
    (row,) = [a for a in doc["assumed"] if a["name"] == "MoE imbalance"]
    assert (f"at the pick's EP {ep}," if ep > 1 else "(the pick's EP is 1)") in row["source"], (ep, row)
    code, stdout, out = _run(["estimate", "--plan", str(tmp_path / "p" / "plan.json"), "--json"])
    assert code == 0, out
    (priced,) = [a for a in json.loads(stdout)["assumed"] if a["name"] == "MoE imbalance"]
    assert priced["value"] == row["value"], (priced, row)


def test_an_edit_that_leaves_derived_keys_behind_is_refused_once_naming_them_all(tmp_path, solved):
    """walk54: halving a stage's DP in plan.json took one round of errors per stale copy (plan.dp, plan.world_size,
    plan.num_microbatches, world_size, num_microbatches).  One refusal names them all with the values the stages
    give; setting them (or deleting the derived ones) is accepted."""
    shutil.copytree(solved, tmp_path / "p")
    saved = json.loads((tmp_path / "p" / "plan.json").read_text())
    doc = json.loads(json.dumps(saved))
    stage = doc["plan"]["stages"][0]
    stage["dp"] = max(1, stage["dp"] // 2)
    (tmp_path / "half.json").write_text(json.dumps(doc))
    code, _, out = _run(["estimate", "--plan", str(tmp_path / "half.json")])
    assert code == 2 and "Traceback" not in out, out
    line = " ".join(ln for ln in out.splitlines() if ln.strip())
    stale = [k for k in ("plan.dp", "plan.world_size", "plan.num_microbatches") if k.split(".")[1] in saved["plan"]]
    stale += [k for k in ("world_size", "num_microbatches") if k in saved]
    assert len(stale) >= 3, saved
    for key in ("world_size", "num_microbatches"):  # a copy in the plan and at the top, one edit: said once (walk55)
        said = {f"plan.{key}", key} & set(stale)
        if len(said) == 2:
            assert f"plan.{key} and {key} are " in line and line.split("; the file")[0].count(key) == 2, line
        elif said:
            assert f"{said.pop()} is " in line, line
    assert "plan.dp is " in line or "plan.dp" not in stale, line
    assert line.count("error:") == 1 and "delete the derived ones" in line, line
    for key in ("pp", "dp", "num_microbatches", "world_size"):
        doc["plan"].pop(key, None)
        doc.pop(key, None)
    (tmp_path / "clean.json").write_text(json.dumps(doc))
    code, _, out = _run(["estimate", "--plan", str(tmp_path / "clean.json"), "--allow-invalid"])
    assert code == 0, out


def test_a_stage_device_type_is_read_case_insensitively_as_everywhere_else(tmp_path, solved):
    """walk54: a plan.json edited to `"device_type": "h100"` was refused ("h100 is not in the cluster (H100:8)")
    though device names are case-insensitive elsewhere; it prices as H100, and an unknown name is refused naming
    the stage and the known devices."""
    shutil.copytree(solved, tmp_path / "p")
    saved = json.loads((tmp_path / "p" / "plan.json").read_text())
    for name, want in (("h100", 0), ("h100_sxm", 0), ("h1000", 2)):
        doc = json.loads(json.dumps(saved))
        for st in doc["plan"]["stages"]:
            st["device_type"] = name
        (tmp_path / "t.json").write_text(json.dumps(doc))
        code, stdout, out = _run(["estimate", "--plan", str(tmp_path / "t.json"), "--json"])
        assert code == want, (name, out)
        if want == 0:
            got = json.loads(stdout)
            assert got["iteration_time_s"] == saved["iteration_time_s"]
            assert {s["device_type"] for s in got["plan"]["stages"]} == {"H100"}
        else:
            assert "plan.stages[0].device_type: unknown device 'h1000'" in out and "H100" in out, out
