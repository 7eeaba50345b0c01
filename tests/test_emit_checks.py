"""Issue 23, item 2: `emit` re-checks everything `solve` checks (the checker: layers, GPUs, memory,
Megatron's rules; the prediction guard) and refuses a plan whose model or cluster differs from the one
it was made for (plan.json's made_for record).  Each example of the issue is a test here."""

from __future__ import annotations

import copy
import re
import json
from pathlib import Path

import pytest

from helpers.cli import refused, run
from planner.inputs.cluster import describe_cluster, parse_cluster
from planner.inputs.plan_file import made_for
from planner.inputs.resolve import resolve_run
from planner.output.report import plan_json
from planner.profile_tables import ProfileSet
from planner.schemas.cluster import ClusterSpec, NodeGroup
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan, StagePlan
from tools.fuzz.inputs import SCRIPT, TINY_MODEL, base_plan_document
from tools.fuzz.mutations import to_json, to_yaml

# mixtral-s on H800:16,H200:16 (one upstream Megatron job): PP 8 of 4 layers, DP 4; the H800 stages sit after
# the third stage, stage 3 (six micro-batches in flight) a few GiB under what the 7% headroom leaves of its
# 79 GiB, the H200 stages far from their 140 GiB
TYPES = ("H200", "H200", "H200", "H800", "H800", "H800", "H800", "H200")
CLUSTER = "H800:16,H200:16"


def mixtral_plan_document() -> dict:
    run = resolve_run(model="mixtral-s", world_size=32)
    cluster = parse_cluster(CLUSTER, ProfileSet.load())
    plan = Plan(runtime="megatron", tp=1, cp=1, ep=1, etp=1, vpp=1, mbs=1, gbs=1024, sequence_parallel=False,
                stages=tuple(StagePlan(device_type=t, num_layers=4, dp=4) for t in TYPES))
    return {"runtime": "megatron", "model": run.model.name, "cluster": describe_cluster(cluster, ProfileSet.load()),
            "world_size": 32,
            "cluster_gpus": 32, "num_microbatches": plan.num_microbatches, "plan": plan_json(plan),
            "inputs": {"run": run.model_dump(mode="json"), "cluster": cluster.model_dump(mode="json")},
            "made_for": made_for(run, cluster, ProfileSet.load())}


@pytest.fixture(scope="module")
def mixtral() -> dict:
    return mixtral_plan_document()


def emit(tmp_path: Path, doc: dict, *extra: str):
    path = tmp_path / "plan.json"
    path.write_bytes(to_json(doc))
    return run(["emit", "--plan", str(path), "--out", str(tmp_path / "launch"), *extra])


def test_the_untouched_plan_is_emitted(tmp_path, mixtral):
    res = emit(tmp_path, mixtral)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "launch" / "launch.sh").is_file()


def _layer_moved(doc):
    doc["plan"]["stages"][2]["num_layers"] -= 1
    doc["plan"]["stages"][3]["num_layers"] += 1  # onto the fullest H800 stage


def _types_swapped(doc):
    s = doc["plan"]["stages"]
    s[2]["device_type"], s[3]["device_type"] = s[3]["device_type"], s[2]["device_type"]  # an H800 one stage earlier


def _mbs_raised(doc):
    doc["plan"]["mbs"] = 2
    doc["plan"]["num_microbatches"] = doc["num_microbatches"] = doc["num_microbatches"] // 2


def _experts(doc):
    doc["inputs"]["run"]["model"]["num_experts"] = 16


def _hidden(doc):
    doc["inputs"]["run"]["model"]["hidden_size"] = 8192


@pytest.mark.parametrize("edit", [_layer_moved, _types_swapped, _mbs_raised, _experts, _hidden],
                         ids=["a layer moved", "two stage types swapped", "the micro-batch raised",
                              "the experts changed", "the hidden size changed"])
def test_an_edited_plan_is_refused_with_the_checkers_reason(tmp_path, mixtral, edit):
    """Each edit was emitted as a launcher; the checker rejects every one (issue 23: 97-138 GiB on a 79 GiB
    stage; here 75-119 GiB where 73.6 GiB may be used)."""
    doc = copy.deepcopy(mixtral)
    edit(doc)
    line = refused(emit(tmp_path, doc), "--plan")
    assert "plan checker rejects" in line and re.search(r"needs [0-9.]+ GiB, may use [0-9.]+ GiB \(79\.1 GiB less", line)
    if edit in (_experts, _hidden):
        assert "inputs.run (made for mixtral-s) changed after solve" in line
    assert not (tmp_path / "launch").exists()


def test_a_bare_plan_of_terabytes_per_gpu_is_refused(tmp_path):
    """`emit --plan bare.json --model deepseek-v3 --cluster H800:8` wrote a plan of about 1.4 TB per GPU."""
    bare = {"runtime": "megatron", "tp": 1, "cp": 1, "ep": 1, "etp": 1, "vpp": 1, "mbs": 1, "gbs": 1024,
            "stages": [{"device_type": "H800", "num_layers": 61, "dp": 8, "recompute": {"granularity": "none"}}]}
    line = refused(emit(tmp_path, bare, "--model", "deepseek-v3", "--cluster", "H800:8"), "--plan")
    # 671e9 parameters of 2 bytes on every GPU: the weights alone are 1,250 GiB
    gib = float(line.split("needs ")[1].split(" GiB")[0])
    assert gib > 671e9 * 2 / 2**30 and not (tmp_path / "launch").exists()


def test_a_plan_for_one_model_is_not_emitted_with_another_models_script(tmp_path, mixtral):
    """The header named the first model (issue 23); now the script is compared with what the plan was
    made for and refused, naming the differing fields."""
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT.format(extra="", layers="4"))  # a tiny MoE model
    line = refused(emit(tmp_path, mixtral, "--megatron-script", str(script)), "--megatron-script")
    assert "mixtral-s" in line and "hidden_size 256 vs 4096" in line
    # the same model's script is fine, and the launcher names the plan's model
    tiny_doc = base_plan_document()
    res = emit(tmp_path, tiny_doc, "--megatron-script", str(script))
    assert res.exit_code == 0, res.output
    assert "tiny-moe" in (tmp_path / "launch" / "launch.sh").read_text()


def test_a_plan_is_not_emitted_for_another_cluster(tmp_path, mixtral):
    line = refused(emit(tmp_path, base_plan_document(), "--cluster", "H800:16"), "--cluster")
    assert "made for H800:8" in line and "H800:16 (H800:16)" not in line and "re-run solve" in line
    # the same groups in another order (walk54: "not H200:16,H800:16 (H200:16,H800:16)"): said so
    line = refused(emit(tmp_path, mixtral, "--cluster", "H200:16,H800:16"), "--cluster")
    assert "made for H800:16,H200:16, not H200:16,H800:16; the same groups in another order" in line, line


def test_an_edited_cluster_or_record_is_refused_and_an_old_plan_json_still_checked(tmp_path):
    doc = base_plan_document()
    doc["inputs"]["cluster"]["groups"][0]["intra_node_bandwidth_gb_per_s"] = 100.0
    assert "inputs.cluster (made for H800:8) changed" in refused(emit(tmp_path, doc), "--plan")
    doc = base_plan_document()
    doc["made_for"] = {"model": "x"}
    refused(emit(tmp_path, doc), "--plan")
    doc = base_plan_document()
    del doc["made_for"]  # written before made_for existed: checked, and said so
    res = emit(tmp_path, doc)
    assert res.exit_code == 0 and "no made_for record" in res.output


def _on_two_nodes_of_four(doc: dict, description: str) -> dict:
    """base_plan_document's plan on two nodes of 4 H800 (not the H800's 8 a node), the cluster described as
    `description` and recorded as the version that wrote that description did (a shorthand cluster named by it)."""
    cluster = ClusterSpec(name=description, groups=(NodeGroup(device_type="H800", num_nodes=2, gpus_per_node=4),))
    run_spec = MegatronRun.model_validate(doc["inputs"]["run"])
    doc["inputs"]["cluster"] = cluster.model_dump(mode="json")
    doc["cluster"] = description
    doc["made_for"] = made_for(run_spec, cluster, ProfileSet.load()) | {"cluster": description}
    return doc


@pytest.mark.parametrize("description", ["H800:2x4", "H800:8"])
def test_a_plan_json_on_other_nodes_is_read_in_its_description_and_the_old_one(tmp_path, description):
    """On 2x4 H800 this version writes `cluster: H800:2x4`, which --cluster reads back; earlier versions wrote
    H800:8 (which --cluster reads as one node of 8).  A file with either is emitted and priced, also with
    --cluster H800:2x4; one whose description is of another cluster is still refused."""
    doc = _on_two_nodes_of_four(base_plan_document(), description)
    res = emit(tmp_path, doc, "--cluster", "H800:2x4")
    assert res.exit_code == 0, res.output
    assert "changed after solve" not in res.output
    res = run(["estimate", "--plan", str(tmp_path / "plan.json"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["cluster"] == "H800:2x4"
    doc["cluster"] = "H800:16"
    (tmp_path / "other").mkdir()
    line = refused(emit(tmp_path / "other", doc), "--plan")
    assert "cluster is 'H800:16' but the plan and its inputs give 'H800:2x4'" in line, line


def test_solve_out_describes_other_nodes_as_cluster_reads_them(tmp_path):
    """solve on H800:2x4 says H800:2x4 in plan.json (cluster, made_for), summary.md and its JSON, not H800:8
    (one node of 8 to --cluster), and that text given back as --cluster is the plan's cluster."""
    model = tmp_path / "tiny.yaml"
    model.write_bytes(to_yaml(TINY_MODEL))
    out = tmp_path / "plan"
    res = run(["solve", "--model", str(model), "--cluster", "H800:2x4", "--quiet", "--time-limit", "30", "--out",
               str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "plan.json").read_text())
    assert doc["cluster"] == doc["made_for"]["cluster"] == "H800:2x4"
    assert "on H800:2x4" in (out / "summary.md").read_text()
    res = run(["estimate", "--plan", str(out / "plan.json"), "--cluster", doc["cluster"]])
    assert res.exit_code == 0, res.output
    assert "on H800:2x4" in res.output


def test_solve_out_writes_the_made_for_record(tmp_path):
    model = tmp_path / "tiny.yaml"
    model.write_bytes(to_yaml(TINY_MODEL))
    out = tmp_path / "plan"
    assert run(["solve", "--model", str(model), "--cluster", "H800:2", "--quiet", "--time-limit", "5", "--out",
                str(out)]).exit_code == 0
    doc = json.loads((out / "plan.json").read_text())
    assert doc["made_for"]["model"] == "tiny-moe" and doc["made_for"]["cluster"] == "H800:2"
    res = run(["emit", "--plan", str(out / "plan.json"), "--out", str(tmp_path / "launch")])
    assert res.exit_code == 0, res.output
