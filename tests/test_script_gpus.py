"""`estimate --megatron-script` prices the run the script launches: its own GPU count (torchrun, srun, mpirun) on
the first nodes of --cluster, refused where the cluster cannot hold it; the whole cluster, with a note, where the
script states no count (planner/inputs/script_gpus.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main
from helpers.json_schema import check_json
from planner.errors import PlannerInputError
from planner.inputs.script_gpus import first_gpus
from planner.schemas.cluster import ClusterSpec, CrossTypeLink, NodeGroup

FLAGS = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 "
         "--micro-batch-size 1 --lr 1e-4 --bf16 --tokenizer-type GPT2BPETokenizer --vocab-size 50257 "
         "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2")


def _script(tmp_path: Path, launch: str, *, gbs: int | None = 64, prelude: str = "", name: str = "train.sh") -> Path:
    path = tmp_path / name
    batch = f" --global-batch-size {gbs}" if gbs else ""
    path.write_text(f"#!/bin/bash\n{prelude}\n{launch} pretrain_gpt.py {FLAGS}{batch}\n")
    return path


def _estimate(script: Path, cluster: str) -> tuple[int, dict | None, str]:
    """(exit status, the JSON, what it says: its `notes`, where which GPUs are priced is said, then stderr)."""
    res = CliRunner().invoke(main, ["estimate", "--megatron-script", str(script), "--cluster", cluster, "--json"])
    payload = json.loads(res.stdout) if res.exit_code == 0 else None
    return res.exit_code, payload, "\n".join((payload or {}).get("notes", []) + [res.stderr])


def test_prices_the_gpus_the_script_launches_not_the_whole_cluster(tmp_path):
    """torchrun 2 nodes x 8 on a 64-GPU cluster: 16 GPUs priced (DP = 16 / (TP 2 * PP 2) = 4), the same price as the
    script on a cluster of exactly its 16 GPUs; the JSON keeps the cluster given and says the world size priced."""
    script = _script(tmp_path, "torchrun --nnodes 2 --nproc-per-node 8")
    code, big, err = _estimate(script, "H100:64")
    assert code == 0, err
    assert big["world_size"] == 16 and big["plan"]["dp"] == [4, 4]
    assert big["cluster"] == "H100:64" and big["cluster_gpus"] == 64
    assert "launches 16 GPUs" in err and "H100:64" in err and "48 GPUs are not priced" in err
    code, exact, err = _estimate(script, "H100:16")
    assert code == 0, err
    assert "launches 16 GPUs" not in err  # the script's own cluster: nothing to say
    assert big["iteration_time_s"] == exact["iteration_time_s"]
    assert big["max_memory_gib"] == exact["max_memory_gib"]
    text = CliRunner().invoke(main, ["estimate", "--megatron-script", str(script), "--cluster", "H100:64"])
    assert text.exit_code == 0 and "16 of 64 GPUs" in text.stdout, text.output


def test_the_gpus_priced_are_said_in_the_result_json_and_quiet_included(tmp_path):
    """Which GPUs are priced changes the result: it is one of the JSON's `notes` (it went to stderr only, so a
    program reading the JSON never saw it), and the text output says it under --quiet too (nothing did); said once,
    not again on stderr."""
    script = _script(tmp_path, "torchrun --nnodes 2 --nproc-per-node 8")
    res = CliRunner().invoke(main, ["estimate", "--megatron-script", str(script), "--cluster", "H100:64", "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    check_json("estimate", payload)
    said = [n for n in payload["notes"] if "the script launches 16 GPUs" in n]
    assert len(said) == 1 and "its other 48 GPUs are not priced" in said[0], payload["notes"]
    assert "launches 16 GPUs" not in res.stderr, res.stderr
    quiet = CliRunner().invoke(main, ["estimate", "--megatron-script", str(script), "--cluster", "H100:64", "--quiet"])
    assert quiet.exit_code == 0 and "its other 48 GPUs are not priced" in " ".join(quiet.stdout.split()), quiet.output


def test_megatrons_default_global_batch_is_over_the_scripts_gpus(tmp_path):
    """No --global-batch-size: Megatron's default mbs * DP is over the 16 GPUs the script launches (1 * 4), not the
    cluster's 64 (1 * 16)."""
    code, payload, err = _estimate(_script(tmp_path, "torchrun --nnodes 2 --nproc-per-node 8", gbs=None), "H100:64")
    assert code == 0, err
    assert payload["plan"]["gbs"] == 4 and payload["world_size"] == 16


def test_fewer_gpus_per_node_than_the_nodes_hold(tmp_path):
    """torchrun --nproc-per-node 4 on 8-GPU nodes: two nodes of 4 GPUs, priced as the cluster H100:2x4 prices it
    (TP 2 x PP 2 replicas across the two hosts)."""
    script = _script(tmp_path, "torchrun --nnodes 2 --nproc-per-node 4")
    code, part, err = _estimate(script, "H100:32")
    assert code == 0, err
    assert part["world_size"] == 8 and "4 GPUs on each node" in err
    code, exact, err = _estimate(script, "H100:2x4")
    assert code == 0, err
    assert part["iteration_time_s"] == exact["iteration_time_s"]


@pytest.mark.parametrize("launch, cluster, named", [
    ("torchrun --nnodes 2 --nproc-per-node 8", "H100:8", ["16 GPUs", "H100:8 has 8"]),  # more GPUs than the cluster
    ("torchrun --nnodes 2 --nproc-per-node 8", "H100:4x4", ["8 GPUs on each node", "hold 4"]),  # nodes too small
    ("torchrun --nnodes 4 --nproc-per-node 4", "H100:2x8", ["16 GPUs", "2 nodes"]),  # too few nodes
    ("mpirun -np 12 python", "H100:16", ["12 GPUs", "whole nodes"]),  # 8 + 4 on nodes of 8
])
def test_a_launch_the_cluster_cannot_hold_is_refused_naming_both(tmp_path, launch, cluster, named):
    code, _, err = _estimate(_script(tmp_path, launch), cluster)
    assert code == 2, err
    assert "--megatron-script / --cluster" in err and "Traceback" not in err
    for text in named:
        assert text in err


def test_a_count_from_a_launch_variables_default_prices_the_whole_cluster(tmp_path):
    """`NNODES=${NNODES:-1}`: the job's environment sets NNODES; the default the reader sees is not the run's
    count, so the whole cluster is priced and a note names the variable.  A count the script sets itself is
    the script's."""
    env = _script(tmp_path, 'torchrun --nnodes "$NNODES" --nproc-per-node 8', prelude="NNODES=${NNODES:-1}")
    code, payload, err = _estimate(env, "H100:16")
    assert code == 0, err
    assert payload["world_size"] == 16
    assert "NNODES" in err and "whole --cluster" in err and "default launches 8 GPUs" in err
    fixed = _script(tmp_path, 'torchrun --nnodes "$NNODES" --nproc-per-node 8', prelude="NNODES=1", name="fixed.sh")
    code, payload, err = _estimate(fixed, "H100:16")
    assert code == 0, err
    assert payload["world_size"] == 8


@pytest.mark.parametrize("launch", ["torchrun --nnodes 2 --nproc-per-node 0", "srun -n 0 python",
                                    "srun -n 16 --ntasks-per-node 0 python"])
def test_a_launch_with_a_count_of_zero_is_refused(tmp_path, launch):
    """A count of 0 starts no rank: refused naming the script (it was 'ClusterSpec: a cluster needs at least one
    node group', or a division by zero)."""
    code, _, err = _estimate(_script(tmp_path, launch), "H100:16")
    assert code == 2 and "error: --megatron-script: " in err and "has a count of 0" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("launch, why", [
    ("torchrun --nnodes 1 --nproc-per-node $(nvidia-smi -L | wc -l)", "no GPU count as plain numbers"),
    ("python", "python itself"),
])
def test_no_count_in_the_script_prices_the_whole_cluster_with_a_note(tmp_path, launch, why):
    code, payload, err = _estimate(_script(tmp_path, launch), "H100:16")
    assert code == 0, err
    assert payload["world_size"] == 16
    assert why in err and "whole --cluster (H100:16, 16 GPUs)" in err


def _group(device_type: str, nodes: int, per_node: int, domain: int | None = None) -> NodeGroup:
    return NodeGroup(device_type=device_type, num_nodes=nodes, gpus_per_node=per_node, scale_up_domain_gpus=domain)


def test_first_gpus_takes_nodes_in_the_clusters_order(profiles):
    """Three nodes of 8 on H800 x2, H100 x2: both H800 nodes and one H100 node, the link between them kept; a
    multi-host NVLink domain shrinks to the hosts taken (as sbatch --segment sizes it for that job)."""
    link = CrossTypeLink(between=("H800", "H100"), kind="infiniband", bandwidth_gb_per_s=25)
    cluster = ClusterSpec(groups=(_group("H800", 2, 8), _group("H100", 2, 8)), links=(link,))
    part = first_gpus(cluster, 24, 8, "torchrun", profiles)
    assert part.groups == (_group("H800", 2, 8), _group("H100", 1, 8)) and part.links == (link,)
    assert first_gpus(cluster, 32, 8, "torchrun", profiles) is cluster
    rack = ClusterSpec(groups=(_group("GB200", 16, 4, domain=64),))
    assert first_gpus(rack, 16, 4, "torchrun", profiles).groups == (_group("GB200", 4, 4, domain=16),)
    assert first_gpus(rack, 4, 4, "torchrun", profiles).groups == (_group("GB200", 1, 4),)
    with pytest.raises(PlannerInputError, match="hold 8"):
        first_gpus(cluster, 32, 16, "torchrun", profiles)


def test_solves_your_plan_says_the_script_launches_another_count(tmp_path):
    """solve plans for the whole cluster and prices the script's degrees with DP over all of it, as the plans it is
    compared with; where the script launches fewer GPUs, "your plan" says so (and points at estimate); where it
    launches the whole cluster, nothing is said.  (One node of 8 launched on 16 and on 8 GPUs: on 32 and 16 the two
    searches took twice as long.)"""
    script = _script(tmp_path, "torchrun --nnodes 1 --nproc-per-node 8")
    for cluster, said in (("H100:16", True), ("H100:8", False)):
        res = CliRunner().invoke(main, ["solve", "--megatron-script", str(script), "--cluster", cluster, "--backend",
                                        "hsdp", "--time-limit", "5", "--json", "--quiet"])
        assert res.exit_code == 0, res.output
        notes = json.loads(res.stdout)["user_plan"]["notes"]
        assert any("the script launches 8 GPUs" in n and "estimate --megatron-script" in n for n in notes) == said, \
            notes


# ------------------------------------------------------------------------------------------------
# srun takes what it does not give from the job's #SBATCH lines (planner/inputs/srun_tasks.py)


def _job(tmp_path: Path, text: str, name: str = "job.sh") -> Path:
    path = tmp_path / name
    path.write_text(text.replace("FLAGS", FLAGS + " --global-batch-size 64"))
    return path


@pytest.mark.parametrize("text, where", [
    # a bare srun in a job of 2 nodes x 8 tasks: it was 'no GPU count', the whole cluster priced
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\nsrun python pretrain_gpt.py FLAGS\n",
     ["`#SBATCH --nodes=2` ({path}:2)", "`#SBATCH --ntasks-per-node=8` ({path}:3)"]),
    # srun's own tasks per node, its nodes the job's (-N 2): it was priced as 1 node of 8
    ("#!/bin/bash\n#SBATCH -N 2\nsrun --ntasks-per-node 8 python pretrain_gpt.py FLAGS\n",
     ["`#SBATCH --nodes=2` ({path}:2)"]),
    # srun -n 16 with no nodes: Slurm places the tasks (whole nodes of 8); it was read as 16 on one node, refused
    ("#!/bin/bash\nsrun -n 16 python pretrain_gpt.py FLAGS\n", ["srun: 16 tasks"]),
    # the job script of `sbatch <<EOF`: its #SBATCH lines at their lines of the file (they were the heredoc's)
    ("#!/bin/bash\nsbatch <<EOF\n#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=8\n"
     "srun python pretrain_gpt.py FLAGS\nEOF\n", ["`#SBATCH --nodes=2` ({path}:4)"]),
    # sbatch's own options, long ones with their value as the next word (it was read as the job script's name)
    ("#!/bin/bash\nsbatch --nodes 2 --ntasks-per-node 8 <<EOF\n#!/bin/bash\nsrun python pretrain_gpt.py FLAGS\nEOF\n",
     ["`sbatch --nodes=2`", "`sbatch --ntasks-per-node=8`"]),
    # one task on each GPU, 2 nodes x 8 GPUs (Slurm: tasks = --ntasks-per-gpu x GPUs): it was read as 'one task per
    # node', the whole cluster priced
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=8\n#SBATCH --ntasks-per-gpu=1\n"
     "srun python pretrain_gpt.py FLAGS\n", ["`#SBATCH --ntasks-per-gpu=1` ({path}:4)",
                                           "`#SBATCH --gpus-per-node=8` ({path}:3)", "srun: 2 nodes x 8 tasks"]),
    # srun's own, its GPUs per node as --gres (was: the whole cluster)
    ("#!/bin/bash\nsrun -N 2 --gres=gpu:8 --ntasks-per-gpu=1 python pretrain_gpt.py FLAGS\n",
     ["srun: 2 nodes x 8 tasks"]),
    # -G16 (all the job's GPUs) and one task on each (was: the whole cluster)
    ("#!/bin/bash\n#SBATCH -G16\n#SBATCH --ntasks-per-gpu=1\nsrun python pretrain_gpt.py FLAGS\n",
     ["`#SBATCH --gpus=16` ({path}:2)", "srun: 16 tasks"]),
    # --gpus=X --gpus-per-task=1: X tasks, Slurm's other task count with --gpus-per-task (was: the whole cluster)
    ("#!/bin/bash\nsrun --gpus=16 --gpus-per-task=1 python pretrain_gpt.py FLAGS\n", ["srun: 16 tasks"]),
    # sbatch's --ntasks-per-gpu with its value as the next word (it was read as the job script's name)
    ("#!/bin/bash\nsbatch --ntasks-per-gpu 1 --gpus 16 <<EOF\n#!/bin/bash\nsrun python pretrain_gpt.py FLAGS\nEOF\n",
     ["`sbatch --ntasks-per-gpu=1`", "`sbatch --gpus=16`"]),
    # srun's --mpi takes a value (Slurm's slurm_opt.c): pmix was read as the command, srun's -N 2 and tasks per node
    # not read (the whole cluster priced)
    ("#!/bin/bash\nsrun --mpi pmix -N 2 --ntasks-per-node 8 python pretrain_gpt.py FLAGS\n", ["srun: 2 nodes x 8 tasks"]),
    # sbatch's --mem-per-gpu with its value as the next word: 80G was read as the end of sbatch's options
    ("#!/bin/bash\nsbatch --mem-per-gpu 80G --nodes 2 --ntasks-per-node 8 <<EOF\n#!/bin/bash\n"
     "srun python pretrain_gpt.py FLAGS\nEOF\n", ["`sbatch --nodes=2`", "`sbatch --ntasks-per-node=8`"]),
    # a gres other than gpu is no GPU count: --gres=nvme:1 was read as 1 GPU on each node (refused: 8 tasks on 1 GPU)
    ("#!/bin/bash\nsrun -N 2 --gres=nvme:1 --ntasks-per-node 8 python pretrain_gpt.py FLAGS\n",
     ["srun: 2 nodes x 8 tasks"]),
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\n#SBATCH --gres=shard:2\n"
     "srun python pretrain_gpt.py FLAGS\n", ["`#SBATCH --ntasks-per-node=8` ({path}:3)"]),
    # the gpu entry of a gres list, wherever it stands (the first entry, nvme:1, was read: 2 tasks on 1 GPU each)
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gres=nvme:1,gpu:8\n#SBATCH --ntasks-per-gpu=1\n"
     "srun python pretrain_gpt.py FLAGS\n", ["`#SBATCH --gres=nvme:1,gpu:8` ({path}:3)", "srun: 2 nodes x 8 tasks"]),
    ("#!/bin/bash\nsrun -N 2 --gres=gres/gpu:h100:8,nvme:1 --ntasks-per-gpu=1 python pretrain_gpt.py FLAGS\n",
     ["srun: 2 nodes x 8 tasks"]),
    # long options by an unambiguous prefix of their names, as Slurm's getopt_long reads them: --ntasks-per-n was
    # not read (one task per node: the whole cluster), its value taken for srun's command
    ("#!/bin/bash\nsrun --nodes 2 --ntasks-per-n 8 python pretrain_gpt.py FLAGS\n", ["srun: 2 nodes x 8 tasks"]),
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-n=8\nsrun python pretrain_gpt.py FLAGS\n",
     ["`#SBATCH --ntasks-per-node=8` ({path}:3)"]),
    ("#!/bin/bash\nsbatch -N 2 --ntasks-per-no 8 <<EOF\n#!/bin/bash\nsrun --gpus-per-t 1 python pretrain_gpt.py "
     "FLAGS\nEOF\n", ["`sbatch --ntasks-per-node=8`"]),
    # --tasks-per-node, the second name of --ntasks-per-node (slurm_opt.c), here by a prefix
    ("#!/bin/bash\n#SBATCH -N 2\nsrun --tasks 8 python pretrain_gpt.py FLAGS\n", ["srun: 2 nodes x 8 tasks"]),
])
def test_srun_takes_the_counts_it_does_not_give_from_the_jobs_sbatch_lines(tmp_path, text, where):
    """srun inside a Slurm job inherits the allocation's nodes and tasks: 16 GPUs on 2 nodes of H100:64, priced as
    the script's own 16-GPU cluster prices them, the note naming the lines the counts come from."""
    script = _job(tmp_path, text)
    code, part, err = _estimate(script, "H100:64")
    assert code == 0, err
    assert part["world_size"] == 16 and part["plan"]["dp"] == [4, 4]
    assert "launches 16 GPUs" in err and "the first 2 nodes of --cluster H100:64" in err, err
    for text_ in where:
        assert text_.format(path=script) in err, err
    code, exact, err = _estimate(script, "H100:16")
    assert code == 0, err
    assert part["iteration_time_s"] == exact["iteration_time_s"]


@pytest.mark.parametrize("text, why", [
    # nodes and GPUs per node, no tasks: Slurm starts one task per node (it said 'no GPU count as plain numbers')
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=8\nsrun python pretrain_gpt.py FLAGS\n",
     "so Slurm starts one task per node"),
    # tasks per node, nodes nowhere: the allocation's, set where the job is submitted (it was priced as 1 node)
    ("#!/bin/bash\nsrun --ntasks-per-node 8 python pretrain_gpt.py FLAGS\n",
     "node count neither srun (-N) nor the script's #SBATCH lines (--nodes) state"),
    # sbatch's node count from a launch variable's default: the job's environment sets NNODES
    ("#!/bin/bash\nNNODES=${NNODES:-2}\nsbatch -N $NNODES --ntasks-per-node 8 <<EOF\n#!/bin/bash\n"
     "srun python pretrain_gpt.py FLAGS\nEOF\n", "rests on NNODES"),
    # one task on each GPU of an allocation whose GPUs the script does not state (it said 'one task per node')
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-gpu=1\nsrun python pretrain_gpt.py FLAGS\n",
     "srun starts one task on each GPU (`#SBATCH --ntasks-per-gpu=1`"),
])
def test_srun_counts_the_script_does_not_state_price_the_whole_cluster(tmp_path, text, why):
    """A count srun takes from where the job runs, not from the script (no #SBATCH count, a variable's default,
    the SLURM_* node count the reader takes from --cluster), is not the script's: the whole cluster, with a note."""
    code, payload, err = _estimate(_job(tmp_path, text), "H100:32")
    assert code == 0, err
    assert payload["world_size"] == 32
    assert why in err and "whole --cluster (H100:32, 32 GPUs)" in err, err


@pytest.mark.parametrize("text, named", [
    # two tasks on each GPU: two Megatron ranks on one GPU (it was the whole cluster, one rank per GPU)
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gres=gpu:8\n#SBATCH --ntasks-per-gpu=2\n"
     "srun python pretrain_gpt.py FLAGS\n", ["2 tasks on each GPU", "`#SBATCH --ntasks-per-gpu=2` ({path}:4)"]),
    # 8 GPUs for each of 4 tasks that run the trainer itself: 4 ranks (it was priced as 4 nodes x 1 GPU)
    ("#!/bin/bash\n#SBATCH --nodes=4\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-task=8\n"
     "srun python pretrain_gpt.py FLAGS\n", ["each task 8 GPUs", "`#SBATCH --gpus-per-task=8` ({path}:4)",
                                           "torchrun --nproc-per-node 8 in each task"]),
    # srun's own (it was priced as 4 tasks on one node)
    ("#!/bin/bash\nsrun -n 4 --gpus-per-task=4 python pretrain_gpt.py FLAGS\n",
     ["each task 4 GPUs", "`srun --gpus-per-task=4`", "python pretrain_gpt.py, {path}:2)"]),
    # options Slurm refuses together (srun's --ntasks-per-gpu was not read: 16 tasks priced)
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\nsrun --ntasks-per-gpu=1 python pretrain_gpt.py "
     "FLAGS\n", ["`srun --ntasks-per-gpu=1`", "--ntasks-per-node (`#SBATCH --ntasks-per-node=8` ({path}:3))",
                  "not compatible"]),
    # 8 tasks on each node of 4 GPUs: two ranks on each GPU (it was priced as 2 nodes x 8 GPUs)
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\n#SBATCH --gpus-per-node=4\n"
     "srun python pretrain_gpt.py FLAGS\n", ["8 tasks on each node", "`#SBATCH --ntasks-per-node=8` ({path}:3)",
                                           "4 GPUs each (`#SBATCH --gpus-per-node=4` ({path}:4))"]),
    # srun's own, its tasks per node as --ntasks over --nodes, its GPUs per node as --gres
    ("#!/bin/bash\nsrun -N 2 -n 16 --gres=gpu:4 python pretrain_gpt.py FLAGS\n",
     ["8 tasks on each node (`srun --ntasks=16` over `srun --nodes=2`)", "4 GPUs each (`srun --gres=gpu:4`)"]),
    # more tasks than the GPUs srun has (-G 8): it was priced as 16 GPUs
    ("#!/bin/bash\nsrun -G 8 -n 16 python pretrain_gpt.py FLAGS\n",
     ["16 tasks (`srun --ntasks=16`) with 8 GPUs (`srun --gpus=8`)"]),
])
def test_an_srun_that_does_not_start_one_rank_on_each_gpu_is_refused_naming_the_option(tmp_path, text, named):
    """--ntasks-per-gpu other than 1, or --gpus-per-task other than 1 with the trainer started by srun itself, is not
    one Megatron rank on each GPU, and Slurm refuses --ntasks-per-gpu beside --ntasks-per-node: refused (exit 2),
    naming the option and where it is given, not priced on a count the run does not have."""
    script = _job(tmp_path, text)
    code, _, err = _estimate(script, "H100:64")
    assert code == 2 and "error: --megatron-script: the script's launch (srun" in err, err
    assert "Traceback" not in err
    for text_ in named:
        assert text_.format(path=script) in err, err


@pytest.mark.parametrize("text, named", [
    # 4 tasks on each node of 8 GPUs, each running the trainer: it was priced as 2 nodes x 4 GPUs, the job's other 4
    # GPUs of each node idle (as `srun --gpus-per-node=8 torchrun --nproc-per-node 4`, which is refused)
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-node=8\n"
     "srun python pretrain_gpt.py FLAGS\n",
     ["srun starts 4 tasks on each node (`#SBATCH --ntasks-per-node=4` ({path}:3)) on nodes with 8 GPUs each "
      "(`#SBATCH --gpus-per-node=8` ({path}:4)), each task a Megatron rank: 4 ranks on 8 GPUs, 4 of each node's "
      "GPUs idle, held by the job but not priced", "(--ntasks-per-node=8) or GPUs as tasks (--gpus-per-node=4)"]),
    # the job's --gres=gpu:8, srun's own tasks over its nodes
    ("#!/bin/bash\n#SBATCH --gres=gpu:8\nsrun -N 2 -n 8 python pretrain_gpt.py FLAGS\n",
     ["4 tasks on each node (`srun --ntasks=8` over `srun --nodes=2`)", "8 GPUs each (`#SBATCH --gres=gpu:8` "
      "({path}:2))", "4 ranks on 8 GPUs, 4 of each node's GPUs idle"]),
    # one GPU bound to each task (--gpus-per-task=1) does not free the node's other GPUs the job holds
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-node=8\n"
     "srun --gpus-per-task=1 python pretrain_gpt.py FLAGS\n", ["4 ranks on 8 GPUs, 4 of each node's GPUs idle"]),
    # fewer tasks than srun's GPUs (-G 16): it was priced as 8 GPUs
    ("#!/bin/bash\nsrun -G 16 -n 8 python pretrain_gpt.py FLAGS\n",
     ["8 tasks (`srun --ntasks=8`) with 16 GPUs (`srun --gpus=16`), each task a Megatron rank: 8 ranks on 16 GPUs, "
      "8 of its GPUs idle", "give as many tasks as GPUs"]),
])
def test_an_srun_of_fewer_tasks_than_the_gpus_the_job_holds_is_refused_naming_both(tmp_path, text, named):
    """srun running the trainer itself (one rank in each task) with fewer tasks on a node than the GPUs the step has
    there (srun(1) --gres: a step is given all the GPUs the job asked for), or fewer tasks than its GPUs: refused
    (exit 2, nothing priced) as a torchrun of fewer ranks than its task's GPUs is, naming both numbers, where they are
    given and the two ways to make them agree."""
    script = _job(tmp_path, text)
    code, _, err = _estimate(script, "H100:64")
    assert code == 2 and "error: --megatron-script: the script's launch (srun" in err and "Traceback" not in err, err
    for text_ in named:
        assert text_.format(path=script) in err, err


@pytest.mark.parametrize("text, named", [
    # srun's option given by a prefix of three options' names: srun refuses it (getopt_long: ambiguous); it was read
    # as an option without a value, its value 2 as srun's command (the whole cluster priced)
    ("#!/bin/bash\nsrun --nod 2 --ntasks-per-node 8 python pretrain_gpt.py FLAGS\n",
     ["{path}:2", "srun's option --nod is ambiguous", "--nodefile, --nodelist, --nodes"]),
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gre=gpu:8\nsrun --ntasks-per-node 8 python pretrain_gpt.py FLAGS\n",
     ["error: {path}:3: #SBATCH: sbatch's option --gre is ambiguous", "--gres, --gres-flags"]),
    ("#!/bin/bash\nsbatch --ntasks-per 8 -N 2 <<EOF\n#!/bin/bash\nsrun python pretrain_gpt.py FLAGS\nEOF\n",
     ["{path}:2", "sbatch's option --ntasks-per is ambiguous", "--ntasks-per-gpu, --ntasks-per-node"]),
])
def test_an_ambiguous_prefix_of_a_slurm_option_is_refused_naming_the_candidates(tmp_path, text, named):
    """srun and sbatch read a long option by an unambiguous prefix of its name (getopt_long) and refuse one that
    starts several options' names; the reader refuses it too (exit 2), naming the line, the option and the
    candidates."""
    script = _job(tmp_path, text)
    code, _, err = _estimate(script, "H100:64")
    assert code == 2 and "Traceback" not in err, err
    for text_ in named:
        assert text_.format(path=script) in err, err


@pytest.mark.parametrize("launch, nproc", [
    ("torchrun --nnodes 2 --nproc-per-node 4", "--nproc-per-node 4: 4 ranks on 8 GPUs"),  # 4 GPUs of each idle
    ("torchrun --nnodes 2 --nproc_per_node 16", "--nproc-per-node 16: 16 ranks on 8 GPUs"),  # two ranks on a GPU
    ("torchrun --nnodes 2", "no --nproc-per-node (torchrun's default: 1): 1 rank on 8 GPUs"),
    ("python -m torch.distributed.run --nnodes=2 --nproc-per-node=2", "--nproc-per-node 2: 2 ranks on 8 GPUs"),
])
def test_a_torchrun_in_each_task_with_other_ranks_than_the_tasks_gpus_is_refused_naming_both(tmp_path, launch, nproc):
    """srun --gpus-per-task=8 with a torchrun in each task that starts another number of ranks: the GPUs per node
    were torchrun's (4 priced on each node whose task holds 8); refused (exit 2), naming both values, where they are
    given and the two ways to make them agree.  Refused, not read as either: fewer ranks leave GPUs the job holds
    idle, more put two ranks on a GPU (NCCL refuses that), so one of the two numbers is not the run the user means."""
    job = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
           "srun --gpus-per-task=8 {} pretrain_gpt.py FLAGS\n")
    script = _job(tmp_path, job.format(launch))
    code, _, err = _estimate(script, "H100:64")
    assert code == 2 and "Traceback" not in err, err
    assert "srun gives each task 8 GPUs (`srun --gpus-per-task=8`)" in err and nproc in err, err
    assert "give torchrun --nproc-per-node 8, or srun --gpus-per-task=" in err, err


def test_a_torchrun_in_each_task_of_gpus_per_task_is_read_by_its_own_counts(tmp_path):
    """--gpus-per-task=8, one task per node: the trainer behind srun directly is refused (one rank per task), a
    torchrun in each task starts the ranks, and its counts (2 x 8) are the launch's."""
    job = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-task=8\nsrun {} FLAGS\n"
    code, _, err = _estimate(_job(tmp_path, job.format("python pretrain_gpt.py")), "H100:64")
    assert code == 2 and "--gpus-per-task=8" in err, err
    torchrun = _job(tmp_path, job.format("torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py"), "torchrun.sh")
    code, payload, err = _estimate(torchrun, "H100:64")
    assert code == 0, err
    assert payload["world_size"] == 16 and "launches 16 GPUs" in err


def _same_as_two_nodes_of_eight(tmp_path: Path, script: Path) -> None:
    """`script` on H100:64 is priced on 16 GPUs, 2 nodes of 8, as on a cluster of just those (H100:16)."""
    code, part, err = _estimate(script, "H100:64")
    assert code == 0, err
    assert part["world_size"] == 16 and "the first 2 nodes of --cluster H100:64 (H100:16)" in err, err
    code, exact, err = _estimate(script, "H100:16")
    assert code == 0, err
    assert part["iteration_time_s"] == exact["iteration_time_s"]


@pytest.mark.parametrize("text", [
    # torchrun starts a rank on each GPU its task sees: the 8 --gpus-per-task binds to it (it was 'no GPU count as
    # plain numbers', the whole cluster priced)
    "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-task=8\n"
    "srun torchrun --nnodes 2 --nproc-per-node gpu pretrain_gpt.py FLAGS\n",
    "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
    "srun --gpus-per-task=8 torchrun --nnodes 2 --nproc_per_node=auto pretrain_gpt.py FLAGS\n",
    # one task on each node, which sees all the node's GPUs (--gres, srun's own; or the job's --gpus-per-node, and
    # no task count: Slurm starts one task per node)
    "srun -N 2 --ntasks-per-node 1 --gres=gpu:8 torchrun --nnodes 2 --nproc-per-node=auto pretrain_gpt.py FLAGS\n",
    "#SBATCH --nodes=2\n#SBATCH --gpus-per-node=8\n"
    "srun torchrun --nnodes 2 --nproc_per_node gpu pretrain_gpt.py FLAGS\n",
    # --gpu-bind=per_task:8 binds 8 GPUs to each task as --gpus-per-task=8 does
    "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:8\n"
    "srun --gpu-bind=verbose,per_task:8 torchrun --nnodes 2 --nproc-per-node gpu pretrain_gpt.py FLAGS\n",
])
def test_torchrun_per_gpu_under_srun_starts_a_rank_on_each_gpu_slurm_gives_the_task(tmp_path, text):
    """torchrun --nproc-per-node gpu|auto (torch/distributed/run.py `determine_local_world_size`: the GPUs the
    process sees) in each srun task: the GPUs Slurm gives the task, 8, on 2 nodes: priced as the script's own 16."""
    _same_as_two_nodes_of_eight(tmp_path, _job(tmp_path, "#!/bin/bash\n" + text))


@pytest.mark.parametrize("text, named", [
    # neither srun nor the job states the task's GPUs (it was the whole cluster, with a note)
    ("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\nsrun torchrun --nnodes 2 --nproc-per-node gpu pretrain_gpt.py "
     "FLAGS\n", ["torchrun (--nproc-per-node gpu) starts one rank on each GPU its srun task sees",
                 "neither srun nor the script's #SBATCH lines state them (--gpus-per-task, or --gres=gpu:N",
                 "give torchrun --nproc-per-node N, or srun --gpus-per-task=N"]),
    ("srun -N 2 torchrun --nnodes 2 --nproc_per_node auto pretrain_gpt.py FLAGS\n",
     ["torchrun (--nproc-per-node auto) starts one rank on each GPU"]),
    # a binding that states no count: which GPUs each task sees is Slurm's choice there
    ("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:8\n#SBATCH --gpu-bind=closest\n"
     "srun torchrun --nnodes 2 --nproc-per-node gpu pretrain_gpt.py FLAGS\n",
     ["`#SBATCH --gpu-bind=closest` ({path}:5) binds them, which states no count"]),
    # two tasks on each node, no GPU bound to a task: each torchrun starts 8 ranks on the node's same 8 GPUs
    ("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --gres=gpu:8\n"
     "srun torchrun --nnodes 4 --nproc-per-node gpu pretrain_gpt.py FLAGS\n",
     ["srun starts 2 tasks on each node (`#SBATCH --ntasks-per-node=2` ({path}:3)), a torchrun in each",
      "each task sees all 8 GPUs of its node (`#SBATCH --gres=gpu:8` ({path}:4))", "share GPUs"]),
])
def test_torchrun_per_gpu_under_srun_is_refused_where_the_tasks_gpus_are_not_known(tmp_path, text, named):
    """--nproc-per-node gpu|auto where the script does not state the GPUs Slurm gives each task: refused (exit 2),
    naming the flag and what would make it readable, not priced on a guess."""
    script = _job(tmp_path, "#!/bin/bash\n" + text)
    code, _, err = _estimate(script, "H100:64")
    assert code == 2 and "error: --megatron-script: the script's launch (srun" in err, err
    assert "Traceback" not in err
    for text_ in named:
        assert text_.format(path=script) in err, err


def test_several_tasks_on_a_node_each_with_its_gpus_run_all_their_ranks_there(tmp_path):
    """srun --ntasks-per-node=2 --gpus-per-task=4, a torchrun of 4 ranks in each of the 4 tasks: 8 ranks on each of
    2 nodes (it was priced as 4 nodes of 4 GPUs: torchrun's --nproc-per-node alone as the GPUs per node)."""
    job = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --gpus-per-task=4\n"
           "srun torchrun --nnodes 4 --nproc-per-node {} pretrain_gpt.py FLAGS\n")
    _same_as_two_nodes_of_eight(tmp_path, _job(tmp_path, job.format(4)))
    _same_as_two_nodes_of_eight(tmp_path, _job(tmp_path, job.format("gpu"), "gpu.sh"))
    # no GPU bound to a task by Slurm, but each task's own 4 set by the script in front of its torchrun
    per_task = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --gres=gpu:8\n"
                "srun bash -c 'CUDA_VISIBLE_DEVICES=$(seq -s, $((SLURM_LOCALID * 4)) $((SLURM_LOCALID * 4 + 3))) "
                "torchrun --nnodes 4 --nproc-per-node 4 pretrain_gpt.py FLAGS'\n")
    _same_as_two_nodes_of_eight(tmp_path, _job(tmp_path, per_task, "visible.sh"))


@pytest.mark.parametrize("text, named", [
    # two tasks on each node that bind no GPU: both torchruns put their local rank 0 on GPU 0 (it was priced as 4
    # nodes of 4)
    ("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --gres=gpu:8\n"
     "srun torchrun --nnodes 4 --nproc-per-node 4 pretrain_gpt.py FLAGS\n",
     ["srun starts 2 tasks on each node", "binds no GPU to a task", "--gpus-per-task=G"]),
    # 4 tasks, each a torchrun agent, where torchrun's rendezvous waits for 2 (--nnodes: the nodes, not the tasks)
    ("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --gpus-per-task=4\n"
     "srun torchrun --nnodes 2 --nproc-per-node 4 pretrain_gpt.py FLAGS\n",
     ["srun starts 4 tasks (`#SBATCH --ntasks-per-node=2` ({path}:3) x `#SBATCH --nodes=2` ({path}:2))",
      "torchrun (--nnodes 2) waits for 2 agents", "give torchrun --nnodes 4"]),
])
def test_several_tasks_on_a_node_that_do_not_run_a_rank_on_each_gpu_are_refused(tmp_path, text, named):
    script = _job(tmp_path, "#!/bin/bash\n" + text)
    code, _, err = _estimate(script, "H100:64")
    assert code == 2 and "error: --megatron-script: the script's launch (srun" in err and "Traceback" not in err, err
    for text_ in named:
        assert text_.format(path=script) in err, err


@pytest.mark.parametrize("text", [
    # torchrun reads PET_<OPTION> where the option is not given (torch/distributed/argparse_util.py `env`): it was
    # read as torchrun's default, 1 rank on each of 2 nodes
    "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\nexport PET_NPROC_PER_NODE=8\n"
    "srun torchrun --nnodes 2 pretrain_gpt.py FLAGS\n",
    "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
    "PET_NPROC_PER_NODE=8 srun torchrun --nnodes 2 pretrain_gpt.py FLAGS\n",
    "export PET_NNODES=2\nPET_NPROC_PER_NODE=8 torchrun pretrain_gpt.py FLAGS\n",
])
def test_torchrun_reads_its_pet_variables_where_the_option_is_not_given(tmp_path, text):
    _same_as_two_nodes_of_eight(tmp_path, _job(tmp_path, "#!/bin/bash\n" + text))


def test_torchrun_reads_a_pet_variable_it_gets_and_under_its_option(tmp_path):
    """PET_NPROC_PER_NODE=8: exported, torchrun's 8 ranks on each of 4 nodes; the option, where given, wins over it;
    a shell variable the script does not export is not in torchrun's environment: its default, 1 on each node."""
    for prelude, launch, world in (("export PET_NPROC_PER_NODE=8", "torchrun --nnodes 4", 32),
                                   ("export PET_NPROC_PER_NODE=8", "torchrun --nnodes 4 --nproc-per-node 2", 8),
                                   ("PET_NPROC_PER_NODE=8", "torchrun --nnodes 4", 4)):
        code, payload, err = _estimate(_script(tmp_path, launch, prelude=prelude), "H100:64")
        assert code == 0, err
        assert payload["world_size"] == world, (prelude, launch, err)


@pytest.mark.parametrize("text", [
    "#SBATCH --nodes=2\n#SBATCH --gres=gpu:8\n#SBATCH --ntasks-per-gpu=2\nsrun python pretrain_gpt.py FLAGS\n",
    "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\nsrun --gpus-per-task=8 torchrun --nnodes 2 --nproc-per-node 4 "
    "pretrain_gpt.py FLAGS\n",
    "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\nsrun torchrun --nnodes 2 --nproc-per-node gpu pretrain_gpt.py "
    "FLAGS\n",
    "torchrun --nnodes 2 --nproc-per-node 0 pretrain_gpt.py FLAGS\n",
])
def test_solve_refuses_the_launches_estimate_refuses_with_the_same_message(tmp_path, text):
    """A launch that is not one rank on each GPU (srun --ntasks-per-gpu=2, a torchrun of 4 ranks in a task of 8
    GPUs, `gpu` ranks on GPUs the script does not state) or that starts no rank: `solve` searched and wrote a
    launcher for it (exit 0); it is refused before the search, exit 2, with estimate's message."""
    script = _job(tmp_path, "#!/bin/bash\n" + text)
    code, _, estimated = _estimate(script, "H100:16")
    assert code == 2 and "error: --megatron-script: the script's launch (" in estimated, estimated
    res = CliRunner().invoke(main, ["solve", "--megatron-script", str(script), "--cluster", "H100:16", "--backend",
                                    "hsdp", "--time-limit", "5", "--json", "--quiet"])
    assert res.exit_code == 2 and res.stderr == estimated, res.output


# ------------------------------------------------------------------------------------------------
# calibrate prices the script's run as estimate does

LOG = Path(__file__).parent / "data" / "logs" / "megatron_core018_minmax.log"  # 8 GPUs, TP 2, PP 2, GBS 64
LLAMA_8L = ("--num-layers 8 --hidden-size 4096 --ffn-hidden-size 11008 --num-attention-heads 32 --seq-length 4096 "
            "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64 --tensor-model-parallel-size 2 "
            "--pipeline-model-parallel-size 2 --bf16 --swiglu --normalization RMSNorm --disable-bias-linear "
            "--untie-embeddings-and-output-weights --position-embedding-type rope --vocab-size 32000 "
            "--use-distributed-optimizer --lr 1e-4 --tokenizer-type GPT2BPETokenizer")


def _calibrate(tmp_path: Path, log: Path, script: Path, cluster: str) -> tuple[int, dict | None, str]:
    out = tmp_path / f"calib-{cluster.replace(':', '-')}-{log.stem}"
    res = CliRunner().invoke(main, ["calibrate", "--megatron-log", str(log), "--megatron-script", str(script),
                                    "--cluster", cluster, "--out", str(out), "--allow-memory-excess", "--json"])
    return res.exit_code, json.loads(res.stdout) if res.exit_code == 0 else None, res.stderr


def test_calibrate_prices_the_gpus_the_script_launches(tmp_path):
    """The log of an 8-GPU run and its script (torchrun 1 x 8), calibrated with --cluster H100:16: it was refused
    (the log's world size 8 against the 16 priced); now the script's 8 GPUs are priced, with estimate's note, and
    the fit is the one on the script's own cluster.  A log that states no world size was compared with a 16-GPU
    run (DP 4, not the logged DP 2) without a word; now with the logged run.  A launch the cluster cannot hold is
    refused as estimate refuses it."""
    script = tmp_path / "llama.sh"
    script.write_text(f"#!/bin/bash\ntorchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py {LLAMA_8L}\n")
    headless = tmp_path / "headless.log"  # the log without its `using world size` line
    headless.write_text("".join(LOG.read_text().splitlines(keepends=True)[1:]))
    for log in (LOG, headless):
        code, exact, err = _calibrate(tmp_path, log, script, "H100:8")
        assert code == 0, err
        code, part, err = _calibrate(tmp_path, log, script, "H100:16")
        assert code == 0, err
        assert "the script launches 8 GPUs" in err and "its other 8 GPUs are not priced" in err, err
        assert part["predicted_before"] == exact["predicted_before"]
        assert part["written_corrections"] == exact["written_corrections"]
    code, _, err = _calibrate(tmp_path, LOG, script, "H100:4")
    assert code == 2 and "--megatron-script / --cluster" in err and "H100:4 has 4" in err, err


def test_calibrate_prices_the_tasks_an_srun_starts_on_each_gpu(tmp_path):
    """The same 8-GPU log, its script an srun with one task on each of 8 GPUs (#SBATCH --gpus-per-node=8,
    --ntasks-per-gpu=1), calibrated with --cluster H100:16: it was read as one task per node, the whole 16 GPUs
    priced against the log's 8 and refused; now the 8 are priced, as on the script's own H100:8."""
    script = tmp_path / "srun.sh"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gpus-per-node=8\n#SBATCH --ntasks-per-gpu=1\n"
                      f"srun python pretrain_gpt.py {LLAMA_8L}\n")
    code, exact, err = _calibrate(tmp_path, LOG, script, "H100:8")
    assert code == 0, err
    code, part, err = _calibrate(tmp_path, LOG, script, "H100:16")
    assert code == 0, err
    assert "the script launches 8 GPUs" in err and "`#SBATCH --ntasks-per-gpu=1`" in err, err
    assert part["predicted_before"] == exact["predicted_before"]


def test_the_command_srun_runs_keeps_its_own_options(tmp_path):
    """`srun numactl -N 0 python ...` (CPU binding in front of the trainer): numactl's -N 0 is not srun's node count
    (it was read as srun -N 0 and the launch refused as starting no rank); srun's nodes and tasks come from the job."""
    prelude = "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8"
    script = _script(tmp_path, "srun --label numactl -N 0 --membind 0 python", prelude=prelude)
    code, payload, err = _estimate(script, "H100:32")
    assert code == 0, err
    assert payload["world_size"] == 16 and "launches 16 GPUs" in err


# ------------------------------------------------------------------------------------------------
# torchrun's options by a prefix (argparse's allow_abbrev), Slurm's --tres-per-task, srun's --export

@pytest.mark.parametrize("text", [
    # torchrun's argparse reads a unique prefix of one spelling as the option (it was read as no option: torchrun's
    # defaults, 1 x 1)
    "torchrun --nnod 2 --nproc-p 8 pretrain_gpt.py FLAGS\n",
    "torchrun --nn=2 --nproc_per=8 pretrain_gpt.py FLAGS\n",
    "python -m torch.distributed.run --nnodes 2 --nproc-per-n 8 pretrain_gpt.py FLAGS\n",
])
def test_torchrun_reads_an_option_given_by_a_unique_prefix(tmp_path, text):
    _same_as_two_nodes_of_eight(tmp_path, _job(tmp_path, "#!/bin/bash\n" + text))


@pytest.mark.parametrize("launch, prefix, candidates", [
    # a prefix of both spellings of one option: argparse counts them apart and refuses it
    ("torchrun --nnodes 2 --nproc 8", "--nproc", "--nproc-per-node, --nproc_per_node"),
    ("torchrun --n 2 --nproc-per-node 8", "--n", "--nnodes, --nproc-per-node, --nproc_per_node"),
    ("python -m torch.distributed.launch --use 1 --nnodes 2 --nproc-per-node 8", "--use", "--use-env, --use_env"),
])
def test_an_ambiguous_prefix_of_a_torchrun_option_is_refused_naming_the_candidates(tmp_path, launch, prefix,
                                                                                    candidates):
    """torchrun exits with argparse's "ambiguous option" error; the reader refuses the script (exit 2), naming the
    line, the prefix and the options it starts (it was read as no option: torchrun's default)."""
    script = _script(tmp_path, launch)
    code, _, err = _estimate(script, "H100:64")
    assert code == 2 and "Traceback" not in err, err
    assert f"error: --megatron-script: {script}:3: torchrun's option {prefix} is ambiguous" in err, err
    assert f"it starts {candidates}" in err, err


@pytest.mark.parametrize("text", [
    # --tres-per-task=gres/gpu=G binds G GPUs to each task as --gpus-per-task=G does (it was read as no GPUs per task:
    # `gpu` refused as not stated, two tasks on a node refused as sharing the node's GPUs)
    "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
    "srun --tres-per-task=cpu=4,gres/gpu=8 torchrun --nnodes 2 --nproc-per-node gpu pretrain_gpt.py FLAGS\n",
    "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --tres-per-task=gres/gpu:h100=4\n"
    "srun torchrun --nnodes 4 --nproc-per-node 4 pretrain_gpt.py FLAGS\n",
    "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n"
    "srun --tres-per-task gres:gpu=4 torchrun --nnodes 4 --nproc-per-node auto pretrain_gpt.py FLAGS\n",
])
def test_tres_per_task_gpus_bind_them_to_each_task_as_gpus_per_task(tmp_path, text):
    _same_as_two_nodes_of_eight(tmp_path, _job(tmp_path, "#!/bin/bash\n" + text))


@pytest.mark.parametrize("text, named", [
    # a torchrun of 4 ranks in a task --tres-per-task gives 8 GPUs: refused as with --gpus-per-task=8 (it was priced
    # as 4 on each node)
    ("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
     "srun --tres-per-task=gres/gpu=8 torchrun --nnodes 2 --nproc-per-node 4 pretrain_gpt.py FLAGS\n",
     ["srun gives each task 8 GPUs (`srun --tres-per-task=gres/gpu=8`)", "4 ranks on 8 GPUs"]),
    # the trainer itself in each task of 8 GPUs (it was priced as one rank on each of 2 nodes)
    ("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --tres-per-task=gres/gpu=8\n"
     "srun python pretrain_gpt.py FLAGS\n",
     ["srun gives each task 8 GPUs (`#SBATCH --tres-per-task=gres/gpu=8` ({path}:4))"]),
    # both spellings on one srun: Slurm refuses them together
    ("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
     "srun --gpus-per-task=8 --tres-per-task=gres/gpu=8 torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py FLAGS\n",
     ["both --gpus-per-task=8 and --tres-per-task=gres/gpu=8, which Slurm refuses together"]),
])
def test_tres_per_task_gpus_are_refused_where_gpus_per_task_is(tmp_path, text, named):
    script = _job(tmp_path, "#!/bin/bash\n" + text)
    code, _, err = _estimate(script, "H100:64")
    assert code == 2 and "error: --megatron-script: the script's launch (srun" in err and "Traceback" not in err, err
    for text_ in named:
        assert text_.format(path=script) in err, err


@pytest.mark.parametrize("text, named", [
    # one task on each node, which sees the node's 8 GPUs (none bound to it), a torchrun of 4 ranks in it: refused as
    # with --gpus-per-task=8 (it was priced as 4 GPUs on each node, the job's other 4 idle)
    ("#SBATCH --nodes=2\n"
     "srun --ntasks-per-node=1 --gpus-per-node=8 torchrun --nnodes 2 --nproc-per-node 4 pretrain_gpt.py FLAGS\n",
     ["srun starts one task on each node (`srun --ntasks-per-node=1`), which sees all 8 GPUs of its node "
      "(`srun --gpus-per-node=8`)", "--nproc-per-node 4: 4 ranks on 8 GPUs, 4 of each node's GPUs idle",
      "give torchrun --nproc-per-node 8, or ask Slurm for 4 GPUs on each node (--gpus-per-node=4)"]),
    # the job's GPUs and no task count (Slurm's one task per node); 16 ranks on 8 GPUs
    ("#SBATCH --nodes=2\n#SBATCH --gres=gpu:8\nsrun torchrun --nnodes 2 --nproc_per_node 16 pretrain_gpt.py FLAGS\n",
     ["(Slurm's one task on each node without a task count), which sees all 8 GPUs of its node "
      "(`#SBATCH --gres=gpu:8` ({path}:3))", "16 ranks on 8 GPUs, more ranks than GPUs"]),
])
def test_one_task_on_each_node_with_other_ranks_than_the_nodes_gpus_is_refused(tmp_path, text, named):
    """The same task as `--gpus-per-task=8` (the node's 8 GPUs, all seen by its one task), the same refusal (exit 2),
    naming the flags and both numbers; a plain torchrun of 4 on a node of 8 is priced on its 4 (the node's other GPUs
    are the cluster's, not held by the script: test_fewer_gpus_per_node_than_the_nodes_hold)."""
    script = _job(tmp_path, "#!/bin/bash\n" + text)
    code, _, err = _estimate(script, "H100:64")
    assert code == 2 and "error: --megatron-script: the script's launch (srun" in err and "Traceback" not in err, err
    for text_ in named:
        assert text_.format(path=script) in err, err


JOB_2x1 = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"


@pytest.mark.parametrize("text", [
    # srun's --export sets PET_* for the task (it was not read: torchrun's default, 1 rank in each task)
    "srun --export=PET_NPROC_PER_NODE=8 torchrun --nnodes 2 pretrain_gpt.py FLAGS\n",
    "export PET_NNODES=2\nsrun --export=ALL,PET_NPROC_PER_NODE=8 torchrun pretrain_gpt.py FLAGS\n",
    # a name alone passes srun's value of it
    "export PET_NPROC_PER_NODE=8\nsrun --export=PET_NPROC_PER_NODE torchrun --nnodes 2 pretrain_gpt.py FLAGS\n",
    # the job's --export=NONE reaches srun through SLURM_EXPORT_ENV, which the script may set back to ALL
    "#SBATCH --export=NONE\nexport PET_NPROC_PER_NODE=8\nexport SLURM_EXPORT_ENV=ALL\n"
    "srun torchrun --nnodes 2 pretrain_gpt.py FLAGS\n",
    # what the task sets itself is not srun's to filter
    "srun --export=NONE bash -c 'PET_NPROC_PER_NODE=8 torchrun --nnodes 2 pretrain_gpt.py FLAGS'\n",
])
def test_srun_export_gives_the_task_its_pet_variables(tmp_path, text):
    _same_as_two_nodes_of_eight(tmp_path, _job(tmp_path, JOB_2x1 + text))


@pytest.mark.parametrize("text, where", [
    # srun(1) --export=NONE: "None of the user environment will be defined" (it was read as the script's 8)
    ("export PET_NPROC_PER_NODE=8\nsrun --export=NONE torchrun --nnodes 4 pretrain_gpt.py FLAGS\n",
     "`srun --export=NONE`"),
    ("PET_NPROC_PER_NODE=8 srun --export=NONE torchrun --nnodes 4 pretrain_gpt.py FLAGS\n", "`srun --export=NONE`"),
    # a list without ALL passes only what it names
    ("export PET_NPROC_PER_NODE=8\nsrun --export=PATH,HOME torchrun --nnodes 4 pretrain_gpt.py FLAGS\n",
     "`srun --export=PATH,HOME`"),
    # sbatch's --export=NONE is srun's too (SLURM_EXPORT_ENV)
    ("#SBATCH --export=NONE\nexport PET_NPROC_PER_NODE=8\nsrun torchrun --nnodes 4 pretrain_gpt.py FLAGS\n",
     "`#SBATCH --export=NONE` ({path}:4)"),
])
def test_srun_export_hides_the_scripts_pet_variables_from_torchrun(tmp_path, text, where):
    """The script's PET_NPROC_PER_NODE=8 does not reach the torchrun srun starts: torchrun's default, 1 rank in each
    of the 4 tasks, and the note says why."""
    script = _job(tmp_path, JOB_2x1.replace("nodes=2", "nodes=4") + text)
    code, payload, err = _estimate(script, "H100:64")
    assert code == 0, err
    assert payload["world_size"] == 4, err
    assert (f"the script's PET_NPROC_PER_NODE=8 does not reach torchrun ({where.format(path=script)} does not pass "
            "it): torchrun's default 1") in err, err


@pytest.mark.parametrize("text, noted", [
    # the count is torchrun's default only because the script sets no PET_*: the submitting environment's would win
    ("torchrun --nproc-per-node 8 pretrain_gpt.py FLAGS\n", ["PET_NNODES"]),
    ("#SBATCH --nodes=1\nsrun torchrun pretrain_gpt.py FLAGS\n", ["PET_NNODES", "PET_NPROC_PER_NODE"]),
    # the option or the script's own PET_* gives it: nothing to say
    ("torchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py FLAGS\n", []),
    ("export PET_NNODES=1\ntorchrun --nproc-per-node 8 pretrain_gpt.py FLAGS\n", []),
    # an --export that passes no PET_* of the submitting environment: it cannot change the count
    ("#SBATCH --nodes=1\nsrun --export=NONE torchrun --nproc-per-node 8 pretrain_gpt.py FLAGS\n", []),
    ("#SBATCH --nodes=1\n#SBATCH --export=PATH\nsrun torchrun --nproc-per-node 8 pretrain_gpt.py FLAGS\n", []),
    ("#SBATCH --nodes=1\nsrun --export=PATH,PET_NNODES torchrun --nproc-per-node 8 pretrain_gpt.py FLAGS\n",
     ["PET_NNODES"]),
])
def test_a_count_left_to_torchrun_s_default_notes_the_pet_variable_that_would_change_it(tmp_path, text, noted):
    """torchrun reads PET_NNODES / PET_NPROC_PER_NODE from its environment where its option is not given; one the
    job is submitted with (sbatch passes the submitting environment on by default) is not in the script: the count
    is read as torchrun's default, with a note naming the variable (there was none), and none where the option, the
    script or an --export decides it."""
    script = _job(tmp_path, "#!/bin/bash\n" + text)
    res = CliRunner().invoke(main, ["estimate", "--megatron-script", str(script), "--cluster", "H100:8", "--json"])
    notes = [line for line in res.stderr.splitlines() if "in the environment the job is submitted or run from" in line]
    for variable in ("PET_NNODES", "PET_NPROC_PER_NODE"):
        said = [n for n in notes if f"the script sets no {variable}: read as torchrun's default" in n]
        assert len(said) == (variable in noted), res.stderr
    assert all(n.startswith(f"note: {script}:") for n in notes), res.stderr
