"""Refusals that name the input the user gave, and checks made where the docs say (walkthrough 53, items 10 and 12):
an override that breaks the world size names the override; a HF config's errors name its own file and say why a
head size is needed; --moe-imbalance on a dense model is refused; `emit` takes `solve --json`'s output as plan.json;
a --hosts file short of the cluster's nodes is refused before the search."""

from __future__ import annotations

import json

import pytest

from helpers.cli import refused, run
from planner.inputs.plan_file import made_for
from planner.profile_tables import ProfileSet
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun

SMALL_FLAGS = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
               "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 --bf16 "
               "--tokenizer-type GPT2BPETokenizer --vocab-size 50304")


# ---- item 10: the override that breaks TP*PP*CP | GPUs is named -----------------------------------------------

def test_a_tp_override_beyond_the_cluster_names_tp_and_says_why():
    line = refused(run(["estimate", "--model", "llama3-8b", "--cluster", "H100:8", "--tp", "16"]), "--tp")
    assert line.startswith("error: --tp: TP 16 exceeds the cluster's 8 GPUs (H100:8)"), line
    line = refused(run(["estimate", "--model", "llama3-8b", "--cluster", "H100:24", "--tp", "16"]), "--tp")
    assert line.startswith("error: --tp: TP 16 does not divide the cluster's 24 GPUs"), line
    line = refused(run(["estimate", "--model", "llama3-8b", "--cluster", "H100:8", "--tp", "4", "--pp", "4"]), "--tp")
    assert line.startswith("error: --tp / --pp: TP*PP*CP = 4*4*1 = 16 exceeds the cluster's 8 GPUs"), line


def test_degrees_the_input_states_still_blame_the_cluster():
    """TP 16 from the flags themselves: the override (--pp 1) is not what broke it."""
    line = refused(run(["estimate", "--megatron-args", SMALL_FLAGS + " --tensor-model-parallel-size 16",
                        "--cluster", "H100:8", "--pp", "1"]), "--cluster")
    assert line.startswith("error: --cluster: world size (8) is not divisible"), line


# ---- item 10: a HF config's errors -----------------------------------------------------------------------------

HF_30_HEADS = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
               "num_attention_heads": 30, "num_hidden_layers": 4, "intermediate_size": 11008, "vocab_size": 32000,
               "max_position_embeddings": 4096}


def test_hidden_not_divisible_by_heads_says_so_under_the_files_own_name(tmp_path):
    path = tmp_path / "unk.json"
    path.write_text(json.dumps(HF_30_HEADS))
    line = refused(run(["estimate", "--model", str(path), "--cluster", "H100:8"]), "unk.json")
    assert line.startswith("error: unk.json:hidden_size: 4096 is not divisible by num_attention_heads 30"), line
    assert "give head_dim" in line and "config.json" not in line
    path.write_text(json.dumps({**HF_30_HEADS, "head_dim": 128}))  # with head_dim it is a model
    assert run(["estimate", "--model", str(path), "--cluster", "H100:8", "--json"]).exit_code == 0
    path.write_text(json.dumps({**HF_30_HEADS, "num_attention_heads": 32, "vocab_size": "x"}))
    line = refused(run(["estimate", "--model", str(path), "--cluster", "H100:8"]), "unk.json")
    assert line.startswith("error: unk.json:vocab_size: expected an integer"), line
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(HF_30_HEADS))  # the file is config.json: so named
    assert refused(run(["estimate", "--model", str(tmp_path / "m"), "--cluster", "H100:8"]),
                   "config.json").startswith("error: config.json:hidden_size:")


# ---- item 12: --moe-imbalance on a dense model ------------------------------------------------------------------

@pytest.mark.parametrize("command", ["estimate", "solve"])
def test_moe_imbalance_on_a_dense_model_is_refused(command):
    line = refused(run([command, "--model", "llama3-8b", "--cluster", "H100:8", "--moe-imbalance", "2"]),
                   "--moe-imbalance")
    assert line.startswith("error: --moe-imbalance: the model has no experts"), line


# ---- item 12: emit takes solve --json's output --------------------------------------------------------------------

def test_emit_takes_solve_json_output_with_its_made_for_record(tmp_path, tiny):
    res = run(["solve", "--model", str(tiny), "--cluster", "H800:2", "--time-limit", "10", "--json", "--quiet"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["made_for"] == made_for(MegatronRun.model_validate(doc["inputs"]["run"]),
                                       ClusterSpec.model_validate(doc["inputs"]["cluster"]), ProfileSet.load())
    assert doc["made_for"]["cluster"] == "H800:2"
    path = tmp_path / "solved.json"
    path.write_text(res.stdout)
    out = run(["emit", "--plan", str(path), "--out", str(tmp_path / "launch")])
    assert out.exit_code == 0, out.output
    assert "no made_for record" not in out.output and (tmp_path / "launch" / "launch.sh").is_file()
    del doc["made_for"]  # a file without the record: the note names the file and says what it lacks, truly
    path.write_text(json.dumps(doc))
    out = run(["emit", "--plan", str(path), "--out", str(tmp_path / "launch2")])
    assert out.exit_code == 0, out.output
    assert "solved.json has no made_for record" in out.output and "written before this version" not in out.output


# ---- item 12: --hosts is checked against the cluster before the search --------------------------------------------

def test_hosts_short_of_the_cluster_is_refused_before_the_search(tmp_path, tiny, monkeypatch):
    def no_search(*args, **kwargs):
        raise AssertionError("the search ran before --hosts was checked")

    monkeypatch.setattr("planner.commands.solve.solve", no_search)
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("n1 H800 8\n")
    line = refused(run(["solve", "--model", str(tiny), "--cluster", "H800:16", "--hosts", str(hosts), "--quiet"]),
                   "--hosts")
    assert "lists 1 H800 node(s) (n1), but --cluster has 2 (H800:16): 1 short" in line, line


def test_a_bad_time_limit_names_the_environment_variable_only_when_it_came_from_there(monkeypatch):
    """walk55s: `--time-limit 0` typed on the command line was refused as "'--time-limit' (env var:
    'HAPMOE_TIME_LIMIT')", as if the variable were involved; the variable is named only when its value is the bad
    one (docs/search.md: "a bad value is refused naming the variable")."""
    monkeypatch.delenv("HAPMOE_TIME_LIMIT", raising=False)
    typed = refused(run(["solve", "--model", "llama3-8b", "--cluster", "H800:8", "--time-limit", "0"]), "--time-limit")
    assert "HAPMOE_TIME_LIMIT" not in typed
    monkeypatch.setenv("HAPMOE_TIME_LIMIT", "0")
    from_env = refused(run(["solve", "--model", "llama3-8b", "--cluster", "H800:8"]), "--time-limit")
    assert "from the environment variable HAPMOE_TIME_LIMIT" in from_env
    overridden = refused(run(["compare", "--model", "llama3-8b", "--cluster", "H800:8", "--time-limit", "0.05"]),
                         "--time-limit")
    assert "HAPMOE_TIME_LIMIT" not in overridden


def test_a_batch_no_rule_allows_is_named_with_its_figures():
    """walk55s: `--mbs 3 --gbs 1024` was told 'check the global batch size' though only the micro-batch was wrong;
    the hint now names both figures and their options; an odd batch for allowed micro-batches names them too."""
    from planner.search.explain import batch_hint

    res = run(["solve", "--model", "mixtral-s", "--cluster", "H800:8", "--mbs", "3", "--gbs", "1024",
               "--time-limit", "10", "--backend", "hsdp"])
    assert res.exit_code == 2, res.output  # infeasible input
    assert "the global batch (1024, --gbs) is no multiple of the micro-batch (3, --mbs)" in res.output, res.output
    assert "(7, --gbs)" in batch_hint(7, (1, 2))
