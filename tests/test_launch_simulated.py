"""launch.sh run as the scheduler runs it: stub sbatch/srun/mpirun/torchrun/python (tests/helpers/slurm_sim.py) start
every task a real job would, and each process that would join training is recorded.  The recorded processes must form exactly
the plan's torch.distributed world: every torchrun with the plan's --nnodes and --nproc-per-node, each node rank once,
one master address (node rank 0's host) and port, the agent's CUDA_VISIBLE_DEVICES where the plan splits a node, the
plan's Megatron flags once (megatron_args.txt); or, where srun/mpirun start the ranks themselves, one process per
rank with the plan's flags.  Nothing may start twice, and launch.sh must neither fail nor hang."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from planner.inputs.hosts import read_hosts
from planner.inputs.megatron_flags import parse_megatron_flags
from planner.inputs.script import parse_launcher_script, read_launcher_script
from planner.launcher import render_launch_files
from planner.calibration.megatron_log import parse_megatron_log, parse_megatron_log_text
from planner.cost.model import CostModel
from planner.launcher.common import Agent, place_agents
from planner.launcher.launch_sh import _first_host_function
from planner.output.run_dir import LAUNCHER_OUTPUT, write_files
from planner.trials import TRIAL_ITERATIONS, TRIAL_OVERRIDES
from planner.profile_tables import ProfileSet
from planner.schemas import Plan, StagePlan

from helpers.launch import cluster_of
from helpers.slurm_sim import records, write_stubs
from helpers.synthetic_log import megatron_log

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

CORPUS = Path(__file__).parent / "launchers"


class Sim:
    """One simulated cluster: stubs on PATH, a spool, a record directory; `run` runs a command as a user would."""

    def __init__(self, root: Path, nodes: list[str], types: dict[str, str] | str):
        """`nodes`: the allocation's, in its order; `types`: each node's device type (one for all), which its
        nvidia-smi names for launch.sh's node check."""
        self.gpus = " ".join(f"{n}={types if isinstance(types, str) else types[n]}" for n in nodes)
        self.root = root
        self.bin = write_stubs(root / "bin")
        self.rec = root / "rec"
        self.rec.mkdir()
        (root / "spool").mkdir()
        self.nodes = nodes

    def run(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        environ = {"PATH": f"{self.bin}:{os.environ['PATH']}", "HOME": str(self.root), "SIM_REC": str(self.rec),
                   "SIM_SPOOL": str(self.root / "spool"), "SIM_NODES": " ".join(self.nodes), "SIM_HOST": "login0",
                   "SIM_GPUS": self.gpus, **(env or {})}
        proc = subprocess.Popen(argv, cwd=cwd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # a launch that hangs is stopped with every task it started
        try:
            stdout, stderr = proc.communicate(timeout=int(os.environ.get("SIM_TIMEOUT", "60")))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)

    def records(self) -> list[dict]:
        return records(self.rec)


def emit(out: Path, text: str, plan: Plan, cluster, hosts_text: str | None = None, args=()) -> list[Agent]:
    """launch.sh and its files for `plan` of the script `text`, in `out`; the plan's agents."""
    path = out.parent / "input.sh"
    path.write_text(text)
    script = read_launcher_script(path, args=list(args))
    run = parse_megatron_flags(script.megatron_flags)
    hosts = None
    if hosts_text is not None:
        (out.parent / "hosts.txt").write_text(hosts_text)
        hosts = read_hosts(out.parent / "hosts.txt", cluster, ProfileSet.load())
    write_files(out, render_launch_files(run, plan, cluster, script, hosts=hosts), "--out", LAUNCHER_OUTPUT)
    return place_agents(plan, cluster, hosts)


def _opt(argv: list[str], *names: str) -> list[str]:
    """Every value of the options `names` in argv (`--x V` or `--x=V`)."""
    got = []
    for i, w in enumerate(argv):
        for n in names:
            if w == n and i + 1 < len(argv):
                got.append(argv[i + 1])
            elif w.startswith(n + "="):
                got.append(w.split("=", 1)[1])
    return got


def _entry_at(argv: list[str], entry: str) -> int:
    return next(i for i, w in enumerate(argv) if w.rsplit("/", 1)[-1] == entry)


def check_torch_world(recs: list[dict], agents: list[Agent], plan_flags: list[str], real_hosts: bool,
                      entry: str = "pretrain_gpt.py", flagscale: bool = False) -> None:
    """The recorded torchruns are the plan's agents, each once (see the module docstring); FlagScale's each with its
    node's --hetero-current-device-type after the plan's flags."""
    runs = [r for r in recs if r["kind"] == "torchrun"]
    assert not [r for r in recs if r["kind"] != "torchrun"], recs
    check_plan_environment(runs, None if flagscale else "expandable_segments:True")
    ranks = sorted(int(_opt(r["argv"], "--node-rank")[0]) for r in runs)
    assert ranks == [a.node_rank for a in agents], [(r["env"], r["argv"][:12]) for r in runs]
    by_rank = {int(_opt(r["argv"], "--node-rank")[0]): r for r in runs}
    masters = set()
    for k, r in by_rank.items():
        argv, agent = r["argv"], agents[k]
        head = argv[:_entry_at(argv, entry)]
        assert _opt(head, "--nnodes") == [str(len(agents))], head
        assert _opt(head, "--nproc-per-node", "--nproc_per_node") == [str(agent.nproc)], head
        assert _opt(head, "--rdzv-backend", "--rdzv_backend") == ["static"], head
        assert not _opt(head, "--rdzv-endpoint", "--rdzv_endpoint"), head
        addr = _opt(head, "--master-addr", "--master_addr")
        port = _opt(head, "--master-port", "--master_port")
        assert len(addr) == 1 and len(port) == 1, head
        masters.add((addr[0], port[0]))
        if real_hosts:
            assert r["env"]["SIM_HOST"] == agent.host, (k, r["env"], agent)
        cvd = ",".join(map(str, agent.gpu_ids)) if agent.nproc < agent.host_gpus else None
        assert r["env"].get("CUDA_VISIBLE_DEVICES") == cvd, (k, r["env"])
        extra = ["--hetero-current-device-type", agent.device_type] if flagscale else []
        assert argv[_entry_at(argv, entry) + 1:] == plan_flags + extra, (k, argv)
    assert len(masters) == 1, masters
    (addr, _), = masters
    assert addr == by_rank[0]["env"]["SIM_HOST"], (addr, by_rank[0]["env"])


def check_rank_world(recs: list[dict], world: int, plan_flags: list[str], rank_var: str,
                     entry: str = "pretrain_gpt.py") -> None:
    """srun/mpirun start the ranks themselves: one process per rank, each with the plan's flags once, and what
    Megatron reads to join the world (RANK, WORLD_SIZE, LOCAL_RANK: without them every rank is rank 0 of a world of
    1 on its node's first GPU; MASTER_ADDR and MASTER_PORT for torch's env:// rendezvous), the same master for all."""
    assert all(r["kind"] == "rank" for r in recs), recs
    ranks = sorted(int(r["env"][rank_var]) for r in recs)
    assert ranks == list(range(world)), ranks
    local_var = "SLURM_LOCALID" if rank_var == "SLURM_PROCID" else "OMPI_COMM_WORLD_LOCAL_RANK"
    for r in recs:
        argv, env = r["argv"], r["env"]
        assert argv[_entry_at(argv, entry) + 1:] == plan_flags, argv
        assert (env.get("RANK"), env.get("WORLD_SIZE")) == (env[rank_var], str(world)), env
        assert env.get("LOCAL_RANK") == env[local_var], env
    assert len({(r["env"].get("MASTER_ADDR"), r["env"].get("MASTER_PORT")) for r in recs}) == 1
    assert all(r["env"].get("MASTER_ADDR") and r["env"].get("MASTER_PORT") for r in recs), recs[0]["env"]
    check_plan_environment(recs)


def check_plan_environment(recs: list[dict], allocator: str | None = "expandable_segments:True") -> None:
    """Every process that trains has the environment the plan was priced with, whatever started it (the scripts here
    state no allocator setting, so the one the memory was priced with; mpirun gives a remote node -x's variables only,
    srun --export=NONE Slurm's), and one CUDA_DEVICE_MAX_CONNECTIONS.  (FlagScale's runner sets the allocator from
    its experiment YAML, which the stubs do not read: `allocator` None.)"""
    assert {r["env"].get("PYTORCH_CUDA_ALLOC_CONF") for r in recs} == {allocator}, recs[0]["env"]
    assert len({r["env"].get("CUDA_DEVICE_MAX_CONNECTIONS") for r in recs}) == 1, [r["env"] for r in recs]


def plan_flags(out: Path) -> list[str]:
    """The plan's Megatron flags, as megatron_args.txt gives them."""
    return shlex.split((out / "megatron_args.txt").read_text())


def one_stage(script_text: str, device: str, nodes: int, gbs: int, tp: int = 1, args=()) -> Plan:
    """A plan of one stage over `nodes` 8-GPU nodes, for the script's model."""
    return Plan(gbs=gbs, tp=tp, stages=(StagePlan(device_type=device, num_layers=_layers(script_text, args),
                                                 dp=8 * nodes // tp),))


def _layers(text: str, args=()) -> int:
    script = parse_launcher_script(text, args=list(args))
    return parse_megatron_flags(script.megatron_flags).model.num_layers


# --------------------------------------------------------------------------------------------
# The corpus' Slurm and MPI launchers, run as their scheduler runs them
# --------------------------------------------------------------------------------------------
def _corpus_case(tmp_path: Path, name: str, device: str, nodes: int, hosts: list[str] | None,
                 subst: dict[str, str] | None = None):
    text = (CORPUS / name).read_text()
    for old, new in (subst or {}).items():
        text = text.replace(old, new)
    plan = one_stage(text, device, nodes, gbs=128)
    out = tmp_path / "out"
    hosts_text = "".join(f"{h} {device}\n" for h in hosts) if hosts else None
    agents = emit(out, text, plan, cluster_of((device, nodes)), hosts_text)
    # the job's allocation lists its nodes in Slurm's order (by name), which need not be the host file's
    sim = Sim(tmp_path, sorted(hosts) if hosts else [f"n{i}" for i in range(nodes)], device)
    return plan, out, agents, sim


@pytest.mark.parametrize("hosts", [None, ["nb", "na"]])
def test_sbatch_srun_bash_c_torchrun_forms_the_plans_world(tmp_path, hosts):
    """slurm_srun_fsdp_string.sh submitted with `sbatch launch.sh`: srun runs `bash -c "... torchrun ..."` on each
    node; the torchruns are the plan's agents (with --hosts: each on its host, in an allocation of another order)."""
    plan, out, agents, sim = _corpus_case(tmp_path, "slurm_srun_fsdp_string.sh", "H100", 2, hosts)
    done = sim.run(["sbatch", str(out / "launch.sh")], tmp_path, {"MEGATRON_PATH": "/tmp"})
    assert done.returncode == 0, done.stderr
    check_torch_world(sim.records(), agents, plan_flags(out), hosts is not None)


@pytest.mark.parametrize("hosts", [None, ["nb", "na"]])
def test_sbatch_srun_python_tasks_form_the_plans_world(tmp_path, hosts):
    """slurm_srun_python_tasks.sh under sbatch: srun starts one python per rank; every rank once, with the plan's
    flags, and MASTER_ADDR is the host of rank 0.  With --hosts, launch.sh's srun places rank 0 on the host file's
    first node, while the script's MASTER_ADDR=$(hostname) names the batch host, the allocation's first node: the
    ranks waited for a master that never listened (rank 0 serves the store on its own host)."""
    plan, out, agents, sim = _corpus_case(tmp_path, "slurm_srun_python_tasks.sh", "A100", 2, hosts)
    done = sim.run(["sbatch", str(out / "launch.sh")], tmp_path)
    assert done.returncode == 0, done.stderr
    recs = sim.records()
    check_rank_world(recs, plan.world_size, plan_flags(out), "SLURM_PROCID", entry="pretrain_gpt.py")
    rank0 = next(r for r in recs if r["env"]["SLURM_PROCID"] == "0")
    assert rank0["env"]["MASTER_ADDR"] == rank0["env"]["SIM_HOST"], rank0
    if hosts:
        assert rank0["env"]["SIM_HOST"] == agents[0].host


def test_sbatch_heredoc_job_forms_the_plans_world(tmp_path):
    """sbatch_heredoc_fsdp.sh (its placeholders filled in): launch.sh submits a job script from a here-document whose
    srun runs `bash -x -c "... python pretrain_gpt.py ..."` once per rank; each rank once, with the plan's flags."""
    plan, out, agents, sim = _corpus_case(tmp_path, "sbatch_heredoc_fsdp.sh", "H100", 2, None,
                                          {"your_num_nodes": "2", "your_tasks_per_node": "8"})
    done = sim.run(["bash", str(out / "launch.sh")], tmp_path, {"MEGATRON_PATH": "/tmp"})
    assert done.returncode == 0, done.stderr
    check_rank_world(sim.records(), plan.world_size, plan_flags(out), "SLURM_PROCID")


HEREDOC_JOB = """#!/bin/bash
FLAGS="--num-layers 22 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 \\
--vocab-size 32000 --swiglu --normalization RMSNorm --micro-batch-size 1 --global-batch-size 64 --lr 3e-4 --bf16"
sbatch OPTS<<EOF
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
EXPORT
srun torchrun --nnodes 2 --nproc_per_node 8 --master_addr n0 --master_port 29500 pretrain_gpt.py $FLAGS
EOF
"""


@pytest.mark.parametrize("directive, option, environment, runs", [
    ("", "", None, True),
    ("", "", "env", True),
    ("#SBATCH --export=NONE", "", None, False),
    ("#SBATCH --export=NONE", "--export=ALL ", None, True),
    ("", "", "NONE", False),
    ("#SBATCH --export=ALL,NCCL_DEBUG=INFO", "", None, True),
    ("", "--export=NCCL_DEBUG ", None, False),
])
def test_a_job_submitted_under_export_none_stops_instead_of_training_without_the_plan(
        tmp_path, directive, option, environment, runs):
    """A script that submits its job from a here-document reaches the plan through launch.sh's exported functions
    (srun, torchrun); a job sbatch starts under --export=NONE (its #SBATCH line, its option, SBATCH_EXPORT; options
    win over the environment, which wins over the directive) gets none of them, and its srun torchrun trained with
    the script's own command, not the plan.  launch.sh now stops at that sbatch (exit 2, naming the fix) and
    submits nothing; a job that gets the whole environment forms the plan's world.  The header says so where the
    script states the --export."""
    plan, cluster = _plan("one")
    text = HEREDOC_JOB.replace("OPTS", option).replace("EXPORT", directive)
    if environment == "env":  # srun runs env, which runs torchrun
        text, environment = text.replace("srun torchrun", "srun env NCCL_DEBUG=INFO torchrun"), None
    out = tmp_path / "out"
    agents = emit(out, text, plan, cluster)
    sim = _sim(tmp_path, "one", None)
    done = sim.run(["bash", str(out / "launch.sh")], tmp_path, {"SBATCH_EXPORT": environment} if environment else None)
    if runs:
        assert done.returncode == 0, done.stderr
        check_torch_world(sim.records(), agents, plan_flags(out), False)
    else:
        assert done.returncode == 2, (done.returncode, done.stderr)
        assert "give sbatch --export=ALL" in done.stderr
        assert "Submitted batch job" not in done.stdout and not sim.records()
    header = (out / "launch.sh").read_text().split("# ---- hapmoe")[0]
    assert ("launch.sh stops at that sbatch" in header) == (bool(directive or option) and not runs)


@pytest.mark.parametrize("directive, runs", [("", True), ("#SBATCH --export=NONE", False)])
def test_a_job_file_the_script_submits_gets_the_plan_or_stops(tmp_path, directive, runs):
    """`sbatch job.sh` of a job file beside the script (its srun torchrun reaches the plan through launch.sh's exported
    functions): the plan's world; with the file's own `#SBATCH --export=NONE`, launch.sh stops at the sbatch."""
    plan, cluster = _plan("one")
    job = HEREDOC_JOB.split("<<EOF\n", 1)[1].rsplit("EOF\n", 1)[0].replace("EXPORT", directive)
    (tmp_path / "job.sh").write_text(job)
    text = HEREDOC_JOB.split("sbatch", 1)[0] + "export FLAGS\nsbatch job.sh\n"
    out = tmp_path / "out"
    agents = emit(out, text, plan, cluster)
    sim = _sim(tmp_path, "one", None)
    done = sim.run(["bash", str(out / "launch.sh")], tmp_path)
    if runs:
        assert done.returncode == 0, done.stderr
        check_torch_world(sim.records(), agents, plan_flags(out), False)
    else:
        assert done.returncode == 2 and "give sbatch --export=ALL" in done.stderr, done.stderr
        assert not sim.records()


@pytest.mark.parametrize("export, runs", [("", True), ("#SBATCH --export=NONE", False)])
def test_an_entry_name_of_shell_characters_is_matched_literally(tmp_path, export, runs):
    """The entry script's name reaches the new functions' patterns (hapmoe_runs_program's case, sbatch()'s job-text
    match) through sh_quote: a name with a blank, a quote, `*` and `[` matches itself only.  The job's srun
    torchrun of that entry forms the plan's world; under --export=NONE the job is stopped at sbatch."""
    entry = "my train*'[x].py"
    plan, cluster = _plan("one")
    command = ("srun torchrun --nnodes 2 --nproc_per_node 8 --master_addr n0 --master_port 29500 "
               f"{shlex.quote(entry)} $FLAGS")
    text, _ = _outer("heredoc", command, 1, tmp_path)
    text = text.replace("#SBATCH --ntasks-per-node=1\n", f"#SBATCH --ntasks-per-node=1\n{export}\n")
    out = tmp_path / "out"
    agents = emit(out, text, plan, cluster)
    assert subprocess.run(["bash", "-n", str(out / "launch.sh")]).returncode == 0
    sim = _sim(tmp_path, "one", None)
    done = sim.run(["bash", str(out / "launch.sh")], tmp_path)
    if runs:
        assert done.returncode == 0, done.stderr
        check_torch_world(sim.records(), agents, plan_flags(out), False, entry=entry)
    else:
        assert done.returncode == 2 and "give sbatch --export=ALL" in done.stderr, done.stderr
        assert not sim.records()


def test_another_job_under_export_none_is_submitted_as_it_is(tmp_path):
    """A data-preparation job the script submits under --export=NONE before the training job: sbatch() checks only
    a job that names the entry script or torchrun, so the preparation job goes as it is and the training job forms
    the plan's world."""
    plan, cluster = _plan("one")
    prep = "sbatch --export=NONE <<PREP\n#!/bin/bash\necho preparing the data\nPREP\n"
    text = HEREDOC_JOB.replace("OPTS", "").replace("EXPORT", "").replace("sbatch <<EOF", prep + "sbatch <<EOF")
    out = tmp_path / "out"
    agents = emit(out, text, plan, cluster)
    sim = _sim(tmp_path, "one", None)
    done = sim.run(["bash", str(out / "launch.sh")], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "preparing the data" in done.stdout
    check_torch_world(sim.records(), agents, plan_flags(out), False)


def test_srun_torchrun_in_a_sourced_file_forms_the_plans_world(tmp_path):
    """`sbatch launch.sh` of a job that sources a file whose `srun torchrun ...` starts training: the launch reaches
    the plan through launch.sh's functions only, and srun runs torchrun itself, so every task ran the file's own
    torchrun (no node rank, no plan flags).  srun() hands it to hapmoe_launch: the plan's agents, each once."""
    plan, cluster = _plan("one")
    part = tmp_path / "launch_part.sh"
    part.write_text("srun " + TORCHRUN_FORMS["srun torchrun"] + "\n")
    text = JOB.replace("TASKS", "1").replace("EXPORT ", "").replace("srun LAUNCH", f"source {part}")
    out = tmp_path / "out"
    agents = emit(out, text, plan, cluster)
    sim = _sim(tmp_path, "one", None)
    done = sim.run(["sbatch", str(out / "launch.sh")], tmp_path)
    assert done.returncode == 0, done.stderr
    check_torch_world(sim.records(), agents, plan_flags(out), False)


SELF_SUBMITTING = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
EXPORT
if [ -z "$SLURM_JOB_ID" ]; then
  sbatch "$0"
  exit 0
fi
FLAGS="--num-layers 22 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 \\
--vocab-size 32000 --swiglu --normalization RMSNorm --micro-batch-size 1 --global-batch-size 64 --lr 3e-4 --bf16"
srun torchrun --nnodes 2 --nproc_per_node 8 --master_addr n0 --master_port 29500 pretrain_gpt.py $FLAGS
"""


@pytest.mark.parametrize("directive", ["", "#SBATCH --export=NONE"])
def test_a_script_that_submits_itself_forms_the_plans_world(tmp_path, directive):
    """`[ -z "$SLURM_JOB_ID" ] && sbatch "$0"`: run on the login node, the script submits itself and trains in the
    job.  The reader followed `sbatch "$0"` into itself forever (no job id in the job: "source nested more than 64
    deep"); the job has an id now, and the job is launch.sh itself, whose functions are its own, so --export=NONE
    does not stop it: the plan's agents, each once."""
    plan, cluster = _plan("one")
    out = tmp_path / "out"
    agents = emit(out, SELF_SUBMITTING.replace("EXPORT", directive), plan, cluster)
    assert "launch.sh stops" not in (out / "launch.sh").read_text().split("# ---- hapmoe")[0]
    sim = _sim(tmp_path, "one", None)
    done = sim.run(["bash", str(out / "launch.sh")], tmp_path)
    assert done.returncode == 0, done.stderr
    check_torch_world(sim.records(), agents, plan_flags(out), False)


def test_srun_python_in_a_submitted_job_forms_the_plans_world(tmp_path):
    """`sbatch <<EOF ... srun python pretrain_gpt.py $FLAGS`: srun starts each rank itself, inside a job script that
    reaches the plan only through launch.sh's functions; the ranks ran the script's own flags.  Each rank once, with
    the plan's flags, RANK and WORLD_SIZE."""
    plan, cluster = _plan("one")
    text = HEREDOC_JOB.replace("OPTS", "").replace("EXPORT", "").replace("--ntasks-per-node=1", "--ntasks-per-node=8")
    text = text.replace("torchrun --nnodes 2 --nproc_per_node 8 --master_addr n0 --master_port 29500 ", "python ")
    out = tmp_path / "out"
    emit(out, text, plan, cluster)
    sim = _sim(tmp_path, "one", None)
    done = sim.run(["bash", str(out / "launch.sh")], tmp_path)
    assert done.returncode == 0, done.stderr
    check_rank_world(sim.records(), plan.world_size, plan_flags(out), "SLURM_PROCID")


@pytest.mark.parametrize("wrap", ["heredoc", "string"])
def test_mpirun_where_only_functions_reach_the_launch_forms_the_plans_world(tmp_path, wrap):
    """`mpirun -np 16 --hostfile F python pretrain_gpt.py` in a job script the script submits, or in a `bash -c`
    string: mpirun starts python itself, which no exported function reaches, so its ranks ran the script's own
    flags without RANK or WORLD_SIZE.  mpirun() hands such a launch to hapmoe_launch: each rank once, with the
    plan's flags and the rank variables."""
    plan, cluster = _plan("one")
    mpi = "mpirun -np 16 --hostfile $HOSTFILE -x MASTER_ADDR=n0 python pretrain_gpt.py $FLAGS"
    text = HEREDOC_JOB.replace("OPTS", "").replace("EXPORT", "").replace(
        "srun torchrun --nnodes 2 --nproc_per_node 8 --master_addr n0 --master_port 29500 pretrain_gpt.py $FLAGS", mpi)
    if wrap == "string":
        text = HEREDOC_JOB.split("sbatch", 1)[0] + f'bash -c "{mpi}"\n'
    (tmp_path / "mpi_hosts").write_text("n0 slots=8\nn1 slots=8\n")
    out = tmp_path / "out"
    emit(out, text, plan, cluster)
    sim = _sim(tmp_path, "one", None)
    done = sim.run(["bash", str(out / "launch.sh")], tmp_path, {"HOSTFILE": str(tmp_path / "mpi_hosts"), "SIM_HOST": "n0"})
    assert done.returncode == 0, done.stderr
    check_rank_world(sim.records(), plan.world_size, plan_flags(out), "OMPI_COMM_WORLD_RANK")


# --------------------------------------------------------------------------------------------
# where the launch sits in the script (outer) x what starts the ranks (inner)
# --------------------------------------------------------------------------------------------
_MODEL = ("--num-layers 22 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 "
          "--vocab-size 32000 --swiglu --normalization RMSNorm --micro-batch-size 1 --global-batch-size 64 --lr 3e-4 --bf16")
_TR = "torchrun --nnodes 2 --nproc_per_node 8 --master_addr n0 --master_port 29500 pretrain_gpt.py $FLAGS"
INNER = {  # command, tasks per node, the rank variable of the world (None: torchrun agents)
    "srun torchrun": (f"srun {_TR}", 1, None),
    "srun bash -c torchrun": (f'srun bash -c "{_TR}"', 1, None),
    "srun env torchrun": (f"srun env NCCL_DEBUG=INFO {_TR}", 1, None),
    "srun python -m torch.distributed.run": ("srun python -m torch.distributed.run --nnodes=2 --nproc-per-node=8 "
                                             "--master_addr=n0 --master_port=29500 pretrain_gpt.py $FLAGS", 1, None),
    "srun python": ("srun python pretrain_gpt.py $FLAGS", 8, "SLURM_PROCID"),
    "srun bash -c python": ('srun bash -c "python pretrain_gpt.py $FLAGS"', 8, "SLURM_PROCID"),
    "mpirun python": ("mpirun -np 16 --hostfile $HOSTFILE -x MASTER_ADDR=n0 python pretrain_gpt.py $FLAGS", 8,
                      "OMPI_COMM_WORLD_RANK"),
    "mpirun torchrun": ("mpirun -np 2 --hostfile $HOSTFILE --map-by ppr:1:node -x MASTER_ADDR=n0 " + _TR, 1, None),
    "mpirun bash -c python": ('mpirun -np 16 --hostfile $HOSTFILE -x MASTER_ADDR=n0 bash -c "python pretrain_gpt.py '
                              '$FLAGS"', 8, "OMPI_COMM_WORLD_RANK"),
    "mpirun bash file": ("mpirun -np 16 --hostfile $HOSTFILE -x MASTER_ADDR=n0 -x FLAGS bash $ENTRY_SH", 8,
                         "OMPI_COMM_WORLD_RANK"),
}
ENTRY_SH = "#!/bin/bash\n# what each rank runs (Pai-Megatron-Patch's mpirun ... bash entry.sh style)\npython pretrain_gpt.py $FLAGS\n"


def _outer(outer: str, command: str, tasks: int, root: Path) -> tuple[str, str]:
    """The script for `command` placed as `outer` says, and what runs launch.sh (sbatch or bash)."""
    head = f"#SBATCH --nodes=2\n#SBATCH --ntasks-per-node={tasks}\n"
    (root / "entry.sh").write_text(ENTRY_SH)
    flags = f'FLAGS="{_MODEL}"\nexport FLAGS ENTRY_SH={shlex.quote(str(root / "entry.sh"))}\n'
    quoted = command.replace('"', '\\"')
    if outer == "heredoc":
        return f"#!/bin/bash\n{flags}sbatch <<EOF\n#!/bin/bash\n{head}{command}\nEOF\n", "bash"
    if outer == "job file":
        (root / "job.sh").write_text(f"#!/bin/bash\n{head}{command}\n")
        return f"#!/bin/bash\n{flags}sbatch job.sh\n", "bash"
    if outer == "source":
        (root / "part.sh").write_text(command + "\n")
        return f"#!/bin/bash\n{head}{flags}source {root / 'part.sh'}\n", "sbatch"
    body = {"direct": command, "function": f"go() {{\n  {command}\n}}\ngo", "bash -c": f'bash -c "{quoted}"',
            "eval": 'CMD="' + quoted.replace("$FLAGS", "\\$FLAGS") + '"\neval "$CMD"'}[outer]
    return f"#!/bin/bash\n{head}{flags}{body}\n", "sbatch"


@pytest.mark.parametrize("outer, inner", [
    ("direct", "srun env torchrun"), ("direct", "srun python -m torch.distributed.run"),
    ("heredoc", "srun python -m torch.distributed.run"), ("heredoc", "srun bash -c python"),
    ("job file", "srun torchrun"), ("job file", "mpirun python"),
    ("function", "srun bash -c torchrun"), ("function", "mpirun python"),
    ("bash -c", "srun torchrun"), ("bash -c", "srun python"),
    ("eval", "srun torchrun"), ("eval", "srun bash -c torchrun"), ("eval", "srun bash -c python"),
    ("source", "srun env torchrun"), ("source", "srun bash -c python"),
    ("direct", "mpirun bash -c python"), ("direct", "mpirun bash file"), ("heredoc", "mpirun bash file"),
    ("function", "mpirun bash -c python"), ("direct", "mpirun torchrun"), ("heredoc", "mpirun torchrun"),
    ("bash -c", "mpirun torchrun"),
])
def test_where_the_launch_sits_and_what_starts_it_form_the_plans_world(tmp_path, outer, inner):
    """The launch in launch.sh itself, a job script the script submits (here-document, file), a function, a `bash
    -c` string, an eval'd variable or a sourced file, started by srun (torchrun itself, through env, `python -m`, in a
    `bash -c` string, or python ranks) or mpirun: each forms the plan's world (a sample of the 7 x 7 forms, all of
    which pass).  `eval "$CMD"` of an srun whose `bash -c` string runs the training ran the string's own command:
    hapmoe_eval sees a string, not the launch; such an eval now reaches the launch through the functions."""
    plan, cluster = _plan("one")
    command, tasks, rank_var = INNER[inner]
    text, run_by = _outer(outer, command, tasks, tmp_path)
    (tmp_path / "mpi_hosts").write_text("n0 slots=8\nn1 slots=8\n")
    out = tmp_path / "out"
    agents = emit(out, text, plan, cluster)
    sim = _sim(tmp_path, "one", None)
    done = sim.run([run_by, str(out / "launch.sh")], tmp_path, {"HOSTFILE": str(tmp_path / "mpi_hosts")})
    assert done.returncode == 0, done.stderr
    if rank_var is None:
        check_torch_world(sim.records(), agents, plan_flags(out), False)
    else:
        check_rank_world(sim.records(), plan.world_size, plan_flags(out), rank_var)


def test_an_eval_of_srun_export_none_with_a_string_stops_and_says_so(tmp_path):
    """`eval "$CMD"` of `srun --export=NONE bash -c "torchrun ..."`: the string's torchrun reaches the plan only
    through launch.sh's functions, which --export=NONE keeps from the tasks; the header says launch.sh stops there,
    and it does (exit 2), naming srun --export=ALL."""
    plan, cluster = _plan("one")
    command = INNER["srun bash -c torchrun"][0].replace("srun ", "srun --export=NONE ", 1)
    text, run_by = _outer("eval", command, 1, tmp_path)
    out = tmp_path / "out"
    emit(out, text, plan, cluster)
    assert "launch.sh stops there" in (out / "launch.sh").read_text().split("# ---- hapmoe")[0]
    sim = _sim(tmp_path, "one", None)
    done = sim.run([run_by, str(out / "launch.sh")], tmp_path)
    assert done.returncode == 2 and "give srun --export=ALL" in done.stderr, done.stderr
    assert not sim.records()


@pytest.mark.parametrize("run_by", ["bash", "sbatch"])
def test_mpirun_hostfile_forms_the_plans_world(tmp_path, run_by):
    """mpirun_hostfile.sh: mpirun starts -np python ranks over its host file's slots (the remote ones without
    launch.sh's functions or variables but for -x); each rank once, with the plan's flags.  Submitted with sbatch,
    the batch shell's SLURM_PROCID=0 reached every rank on the first node, which all became rank 0: the MPI
    launcher's rank variables now come first."""
    plan, out, agents, sim = _corpus_case(tmp_path, "mpirun_hostfile.sh", "H800", 2, None)
    (tmp_path / "mpi_hosts").write_text("n0 slots=8\nn1 slots=8\n")
    done = sim.run([run_by, str(out / "launch.sh")], tmp_path,
                   {"HOSTFILE": str(tmp_path / "mpi_hosts"), "SIM_HOST": "n0"})
    assert done.returncode == 0, done.stderr
    check_rank_world(sim.records(), plan.world_size, plan_flags(out), "OMPI_COMM_WORLD_RANK")


# --------------------------------------------------------------------------------------------
# srun's forms, plans of one and of two device types, template and real host names
# --------------------------------------------------------------------------------------------
JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=TASKS
#SBATCH --gpus-per-node=8
MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR=$MASTER MASTER_PORT=29500
FLAGS="--num-layers 22 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 \
--vocab-size 32000 --swiglu --normalization RMSNorm --micro-batch-size 1 --global-batch-size 64 --lr 3e-4 --bf16"
srun EXPORT LAUNCH
"""
TORCHRUN_FORMS = {
    "srun torchrun": "torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint $MASTER:29500 "
                     "pretrain_gpt.py $FLAGS",
    "srun torchrun --master_addr": "torchrun --nnodes 2 --nproc_per_node 8 --master_addr $MASTER --master_port 29500 "
                                   "pretrain_gpt.py $FLAGS",
    "srun python -m torch.distributed.run": "python -m torch.distributed.run --nnodes=2 --nproc-per-node=8 "
                                            "--rdzv_endpoint=$MASTER:29500 pretrain_gpt.py $FLAGS",
    "srun bash -c torchrun": 'bash -c "torchrun --nnodes 2 --nproc_per_node 8 --rdzv_endpoint $MASTER:29500 '
                             'pretrain_gpt.py $FLAGS"',
    "srun bash -c torchrun --master_addr": 'bash -c "torchrun --nnodes 2 --nproc_per_node 8 --master_addr $MASTER '
                                          '--master_port 29500 pretrain_gpt.py $FLAGS"',
}


def _plan(kind: str):
    """('one', one stage of H100 on 2 nodes) or ('two', H100 then A100 at TP 2: an agent of 4 GPUs on the H100 node,
    two on the A100 node)."""
    if kind == "one":
        return Plan(gbs=64, stages=(StagePlan(device_type="H100", num_layers=22, dp=16),)), cluster_of(("H100", 2))
    stages = (StagePlan(device_type="H100", num_layers=8, dp=2), StagePlan(device_type="A100", num_layers=7, dp=2),
              StagePlan(device_type="A100", num_layers=7, dp=2))
    return Plan(tp=2, gbs=64, stages=stages), cluster_of(("H100", 1), ("A100", 1))


def _sim(tmp_path: Path, kind: str, hosts: str | None) -> Sim:
    """The job's two nodes, in the allocation's order (by name): the host file's, else n0 (H100) and n1."""
    if hosts is None:
        return Sim(tmp_path, ["n0", "n1"], {"n0": "H100", "n1": "H100" if kind == "one" else "A100"})
    types = dict(line.split() for line in hosts.splitlines())
    return Sim(tmp_path, sorted(types), types)


def _hosts(kind: str) -> str:
    """Real host names whose allocation order (by name) is not the plan's."""
    return "hb H100\nha H100\n" if kind == "one" else "zh H100\naa A100\n"


@pytest.mark.parametrize("form", list(TORCHRUN_FORMS))
@pytest.mark.parametrize("kind", ["one", "two"])
@pytest.mark.parametrize("real", [False, True])
def test_srun_torchrun_forms_make_the_plans_world(tmp_path, form, kind, real):
    """`sbatch launch.sh` of a job whose srun starts torchrun on each node (itself, through `python -m`, or in a
    `bash -c` string; the master from --rdzv-endpoint or --master_addr): the torchruns are exactly the plan's agents,
    also where the plan puts several agents on one host (CUDA_VISIBLE_DEVICES each) and with real host names whose
    allocation order is not the plan's."""
    plan, cluster = _plan(kind)
    text = JOB.replace("TASKS", "1").replace("EXPORT ", "").replace("LAUNCH", TORCHRUN_FORMS[form])
    out = tmp_path / "out"
    hosts = _hosts(kind) if real else None
    agents = emit(out, text, plan, cluster, hosts)
    sim = _sim(tmp_path, kind, hosts)
    done = sim.run(["sbatch", str(out / "launch.sh")], tmp_path)
    assert done.returncode == 0, done.stderr
    check_torch_world(sim.records(), agents, plan_flags(out), real)


@pytest.mark.parametrize("form", ["srun torchrun", "srun bash -c torchrun"])
@pytest.mark.parametrize("real", [False, True])
def test_flagscale_srun_torchrun_makes_the_plans_world(tmp_path, form, real):
    """The FlagScale runtime's launch.sh (its entry in place of pretrain_gpt.py, each agent's device type flag) run
    by sbatch, srun starting torchrun: the plan's agents, each once, with its own device type."""
    plan, cluster = _plan("two")
    plan = plan.model_copy(update={"runtime": "flagscale"})
    text = JOB.replace("TASKS", "1").replace("EXPORT ", "").replace("LAUNCH", TORCHRUN_FORMS[form])
    out = tmp_path / "out"
    hosts = _hosts("two") if real else None
    agents = emit(out, text, plan, cluster, hosts)
    sim = _sim(tmp_path, "two", hosts)
    done = sim.run(["sbatch", str(out / "launch.sh")], tmp_path)
    assert done.returncode == 0, done.stderr
    check_torch_world(sim.records(), agents, plan_flags(out), real, entry="train_gpt.py", flagscale=True)


@pytest.mark.parametrize("kind, real", [("one", False), ("one", True), ("two", True)])
def test_srun_python_per_rank_makes_the_plans_world(tmp_path, kind, real):
    """`srun --ntasks-per-node=8 python pretrain_gpt.py` (one rank a task, the job's own --ntasks-per-node=8): every
    rank once with the plan's flags, rank 0 on MASTER_ADDR; with real host names each rank on its stage's host.
    With real names, launch.sh's srun placed rank 0 on the host file's first node while the script's MASTER_ADDR
    named the allocation's first node, and the job's 16 tasks outnumbered a plan of 12 ranks (the host file's lines).
    (Template names and a plan of fewer ranks than the script's tasks, ("two", False), is not covered: srun starts
    the script's 16 tasks.)"""
    plan, cluster = _plan(kind)
    text = JOB.replace("TASKS", "8").replace("EXPORT ", "--ntasks-per-node=8 ").replace(
        "LAUNCH", "python -u pretrain_gpt.py $FLAGS")
    out = tmp_path / "out"
    hosts = _hosts(kind) if real else None
    agents = emit(out, text, plan, cluster, hosts)
    sim = _sim(tmp_path, kind, hosts)
    done = sim.run(["sbatch", str(out / "launch.sh")], tmp_path)
    assert done.returncode == 0, done.stderr
    recs = sim.records()
    check_rank_world(recs, plan.world_size, plan_flags(out), "SLURM_PROCID")
    rank0 = next(r for r in recs if r["env"]["SLURM_PROCID"] == "0")
    assert rank0["env"]["MASTER_ADDR"] == rank0["env"]["SIM_HOST"], rank0["env"]
    if real:
        by_rank = {int(r["env"]["SLURM_PROCID"]): r["env"]["SIM_HOST"] for r in recs}
        assert all(by_rank[a.first_rank + i] == a.host for a in agents for i in range(a.nproc))


@pytest.mark.parametrize("form", ["srun torchrun", "srun torchrun --master_addr", "srun bash -c torchrun"])
@pytest.mark.parametrize("kind", ["one", "two"])
@pytest.mark.parametrize("real", [False, True])
def test_srun_export_none_makes_the_plans_world_or_stops(tmp_path, form, kind, real):
    """srun --export=NONE: the tasks get Slurm's variables only, none of launch.sh's functions or variables.  `srun
    torchrun`, whose tasks get the functions in their command, forms the plan's world: with real host names each
    task's agent and the master (node 0's host) travel there too (each task on the A100 node started both of its
    agents, and the script's --master_addr stayed the allocation's first node).  `srun bash -c "torchrun ..."`
    reaches the plan through the exported functions only: launch.sh stops, saying so (its torchruns ran without the
    plan)."""
    plan, cluster = _plan(kind)
    text = JOB.replace("TASKS", "1").replace("EXPORT", "--export=NONE").replace("LAUNCH", TORCHRUN_FORMS[form])
    out = tmp_path / "out"
    hosts = _hosts(kind) if real else None
    agents = emit(out, text, plan, cluster, hosts)
    sim = _sim(tmp_path, kind, hosts)
    done = sim.run(["sbatch", str(out / "launch.sh")], tmp_path)
    if "bash -c" in form:
        assert done.returncode == 2 and not sim.records(), done.stderr
        assert "srun --export=NONE starts its tasks without launch.sh's functions" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    check_torch_world(sim.records(), agents, plan_flags(out), real)


# --------------------------------------------------------------------------------------------
# mpirun: the ranks its host file places, each checking its node's device type
# --------------------------------------------------------------------------------------------
MPI_JOB = """#!/bin/bash
export MASTER_ADDR=${MASTER_ADDR:-aa} MASTER_PORT=29500
FLAGS="--num-layers 22 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 \
--vocab-size 32000 --swiglu --normalization RMSNorm --micro-batch-size 1 --global-batch-size 64 --lr 3e-4 --bf16"
mpirun -np 12 --hostfile $HOSTFILE --bind-to none -x MASTER_ADDR -x MASTER_PORT python pretrain_gpt.py $FLAGS
"""


@pytest.mark.parametrize("order", ["plan", "reversed"])
def test_mpirun_ranks_start_only_on_their_stages_device_type(tmp_path, order):
    """mpirun, run from a login node, places ranks by its own host file (launch.sh keeps it); the plan puts ranks 0-3
    on the H100 node and 4-11 on the A100 node.  In the plan's order every rank starts once with the plan's flags; in
    another order no rank may start on a node of another type (each checks its node first, docs/running.md): the
    remote ranks, which mpirun gives none of launch.sh's functions, skipped the check and trained on the wrong GPUs."""
    plan, cluster = _plan("two")
    out = tmp_path / "out"
    emit(out, MPI_JOB, plan, cluster)
    sim = Sim(tmp_path, ["zh", "aa"], {"zh": "H100", "aa": "A100"})
    lines = ["zh slots=4", "aa slots=8"] if order == "plan" else ["aa slots=8", "zh slots=4"]
    (tmp_path / "mpi_hosts").write_text("\n".join(lines) + "\n")
    done = sim.run(["bash", str(out / "launch.sh")], tmp_path, {"HOSTFILE": str(tmp_path / "mpi_hosts")})
    recs = sim.records()
    stage_type = {r: ("H100" if r < 4 else "A100") for r in range(12)}
    node_type = {"zh": "H100", "aa": "A100"}
    wrong = [r["env"]["OMPI_COMM_WORLD_RANK"] for r in recs
             if node_type[r["env"]["SIM_HOST"]] != stage_type[int(r["env"]["OMPI_COMM_WORLD_RANK"])]]
    assert not wrong, (wrong, done.stderr[-2000:])
    if order == "plan":
        assert done.returncode == 0, done.stderr
        check_rank_world(recs, plan.world_size, plan_flags(out), "OMPI_COMM_WORLD_RANK")
        # what launch.sh exports for the plan reaches the ranks mpirun starts on another node too (mpirun passes -x's
        # variables only): TP 2 needs one hardware queue, the memory was priced with expandable segments
        assert {(r["env"].get("CUDA_DEVICE_MAX_CONNECTIONS"), r["env"].get("PYTORCH_CUDA_ALLOC_CONF"))
                for r in recs} == {("1", "expandable_segments:True")}, [r["env"] for r in recs if r["env"]["SIM_HOST"] == "aa"][:1]
    else:
        assert done.returncode == 3 and "should hold H100" in done.stderr, done.stderr


# --------------------------------------------------------------------------------------------
# launch.sh started on every node by the user's own srun (docs/running.md: one task per node)
# --------------------------------------------------------------------------------------------
PLAIN = """#!/bin/bash
FLAGS="--num-layers 22 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 \
--vocab-size 32000 --swiglu --normalization RMSNorm --micro-batch-size 1 --global-batch-size 64 --lr 3e-4 --bf16"
torchrun --nnodes 2 --nproc_per_node 8 --master_addr ${MASTER_ADDR:-localhost} --master_port 29500 pretrain_gpt.py $FLAGS
"""


@pytest.mark.parametrize("kind", ["one", "two"])
@pytest.mark.parametrize("real", [False, True])
@pytest.mark.parametrize("scontrol", [True, False])
def test_srun_one_task_per_node_runs_every_agent_once(tmp_path, kind, real, scontrol):
    """`srun -N 2 --ntasks-per-node=1 bash launch.sh` of a torchrun script: each node starts its agents (SLURM_NODEID
    with template names, the host name with real ones, in an allocation of another order than the plan's), every
    node rank once, node 0's host the master where the script's is localhost: with template names the step's first
    node, which SLURM_NODEID 0 is (it was the template's name, h100-node0, which no cluster has).  The step's node
    list is compressed, as Slurm writes it (n[0-1]); in a container without scontrol launch.sh reads its first host
    off the list itself (the master was the template's name again)."""
    plan, cluster = _plan(kind)
    out = tmp_path / "out"
    hosts = _hosts(kind) if real else None
    agents = emit(out, PLAIN, plan, cluster, hosts)
    sim = _sim(tmp_path, kind, hosts)
    if not scontrol:
        (sim.bin / "scontrol").unlink()
    done = sim.run(["srun", "-N", "2", "--ntasks-per-node=1", "bash", str(out / "launch.sh")], tmp_path,
                   {"SLURM_JOB_NODELIST_SIM": ",".join(sim.nodes), "SIM_HOSTLIST": "compressed"})
    assert done.returncode == 0, done.stderr
    check_torch_world(sim.records(), agents, plan_flags(out), real)


@pytest.mark.parametrize("launch", ["python -u pretrain_gpt.py $FLAGS", 'bash -c "python -u pretrain_gpt.py $FLAGS"',
                                    'bash -c "python pretrain_gpt.py $FLAGS"'])
@pytest.mark.parametrize("kind", ["one", "two"])
def test_srun_ranks_of_two_device_types_each_check_their_own(tmp_path, launch, kind):
    """srun starting one python rank a task, directly or in a `bash -c` string (sbatch_heredoc_fsdp.sh's form), with
    real host names: every rank of the plan once, each on its stage's host after checking that host's type against
    its own agent's (the `bash -c` form checked agent 0's type on every node, and the A100 ranks stopped; with
    `python -u` it called launch.sh's python function from itself, forever)."""
    plan, cluster = _plan(kind)
    text = JOB.replace("TASKS", "8").replace("EXPORT ", "").replace("LAUNCH", launch)
    out = tmp_path / "out"
    hosts = _hosts(kind)
    agents = emit(out, text, plan, cluster, hosts)
    sim = _sim(tmp_path, kind, hosts)
    done = sim.run(["sbatch", str(out / "launch.sh")], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    recs = sim.records()
    check_rank_world(recs, plan.world_size, plan_flags(out), "SLURM_PROCID")
    by_rank = {int(r["env"]["SLURM_PROCID"]): r["env"]["SIM_HOST"] for r in recs}
    assert all(by_rank[a.first_rank + i] == a.host for a in agents for i in range(a.nproc))


@pytest.mark.parametrize("launch", ["python pretrain_gpt.py $FLAGS", "python -u pretrain_gpt.py $FLAGS"])
def test_plain_python_launch_runs_once(tmp_path, launch):
    """A script that runs `python [-u] pretrain_gpt.py` itself (a one-GPU plan): the rank runs once, with the plan's
    flags, after its node's check.  With `-u` launch.sh ran `python -u bash -c ...`: python looked for a script named
    bash (and, where python is launch.sh's function, in a `bash -c` string under srun, called itself forever)."""
    plan = Plan(gbs=64, stages=(StagePlan(device_type="H100", num_layers=22, dp=1),))
    text = JOB.replace("#SBATCH", "# ").replace("srun EXPORT LAUNCH", launch)
    out = tmp_path / "out"
    emit(out, text, plan, cluster_of(("H100", 1)))
    sim = Sim(tmp_path, ["n0"], "H100")
    done = sim.run(["bash", str(out / "launch.sh")], tmp_path, {"SIM_HOST": "n0"})
    assert done.returncode == 0, done.stderr
    recs = sim.records()
    assert len(recs) == 1 and recs[0]["kind"] == "rank", recs
    assert recs[0]["argv"][1:] == plan_flags(out)


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_ranks_of_another_world_than_the_plans_stop(tmp_path, launcher):
    """srun or mpirun starting the script's 16 python ranks for a plan of 12 (template host names, which launch.sh does
    not place): Megatron would run with a world of 16, another plan than the one priced (here one that does not
    divide, elsewhere silently another data-parallel size).  Every rank stops before python starts, rank 0 saying
    how many ranks to start."""
    plan, cluster = _plan("two")
    if launcher == "srun":
        text = JOB.replace("TASKS", "8").replace("EXPORT ", "--ntasks-per-node=8 ").replace(
            "LAUNCH", "python -u pretrain_gpt.py $FLAGS")
        argv, env = ["sbatch"], {}
    else:
        text = MPI_JOB.replace("-np 12", "-np 16")
        argv, env = ["bash"], {"HOSTFILE": str(tmp_path / "mpi_hosts")}
        (tmp_path / "mpi_hosts").write_text("n0 slots=8\nn1 slots=8\n")
    out = tmp_path / "out"
    emit(out, text, plan, cluster)
    sim = _sim(tmp_path, "two", None)
    done = sim.run([*argv, str(out / "launch.sh")], tmp_path, env)
    assert done.returncode == 2 and not sim.records(), done.stderr
    assert done.stderr.count("launch.sh: 16 ranks started, the plan has 12: give srun --ntasks=12") == 1, done.stderr


def _trial_launcher(tmp_path: Path, out: Path, text: str, plan: Plan, cluster, written: str | None = None) -> str:
    """The trial launcher of the script `text` for `plan` in `out` (written, as solve writes it, knowing the directory
    `written`), and the training log its torchrun prints (the cost model's timeline as Megatron logs it, in
    tmp_path/train.txt for the SIM_LOG stub)."""
    script = parse_launcher_script(text)
    run = parse_megatron_flags(script.megatron_flags)
    overrides = replace(TRIAL_OVERRIDES, log_dir=written)
    write_files(out, render_launch_files(run, plan, cluster, script, overrides=overrides), "--out", LAUNCHER_OUTPUT)
    cost = CostModel(run.model, run.training, cluster, ProfileSet.load()).evaluate(plan)
    log = megatron_log(cost, vpp=plan.vpp, global_batch_size=plan.gbs, iterations=TRIAL_ITERATIONS)
    (tmp_path / "train.txt").write_text(log)
    return log


@pytest.mark.parametrize("inner", ["srun torchrun", "srun bash -c torchrun"])
def test_a_trial_whose_script_submits_its_job_keeps_the_jobs_log(tmp_path, inner):
    """A trial launcher of a script that submits its job from a here-document: sbatch writes the job's output to
    slurm-<id>.out, so launch.sh's log on the login node held only "Submitted batch job" and `calibrate --trials`
    found no iteration.  The job's shell, where srun gathers the ranks' output, now keeps the trial log beside
    launch.sh, every iteration of it; the login node's log has none."""
    plan, cluster = _plan("one")
    text, _ = _outer("heredoc", INNER[inner][0], 1, tmp_path)
    out = tmp_path / "trials" / "pick"
    _trial_launcher(tmp_path, out, text, plan, cluster)
    sim = _sim(tmp_path, "one", None)
    done = sim.run(["bash", str(out / "launch.sh")], tmp_path,
                   {"SIM_LOG": str(tmp_path / "train.txt"), "SIM_SBATCH_OUTPUT": "1"})
    assert done.returncode == 0, done.stderr
    check_torch_world(sim.records(), place_agents(plan, cluster), plan_flags(out), False)
    with_iterations = [p.name for p in sorted(out.glob("*.log")) if parse_megatron_log(p).it_number]
    assert with_iterations == ["train-n0.log"], (sorted(out.glob("*.log")), (tmp_path / "slurm-7.out").read_text())
    assert len(parse_megatron_log(out / "train-n0.log").it_number) == TRIAL_ITERATIONS


def test_a_trial_run_by_sbatch_leaves_its_log_beside_the_submitted_launcher(tmp_path):
    """The trial loop as a Slurm user runs it: `sbatch trials/pick/launch.sh` of a job whose srun starts torchrun on
    each node; the training log node 0 prints reaches the batch host through srun and is kept beside the launch.sh
    submitted (where `calibrate --trials` reads it), every iteration of it, not in sbatch's spool copy's directory."""
    plan, cluster = _plan("one")
    text = JOB.replace("TASKS", "1").replace("EXPORT ", "").replace("LAUNCH", TORCHRUN_FORMS["srun torchrun"])
    out = tmp_path / "my plans" / "trials" / "pick"
    log = _trial_launcher(tmp_path, out, text, plan, cluster)
    sim = _sim(tmp_path, "one", None)
    done = sim.run(["sbatch", str(out / "launch.sh")], tmp_path, {"SIM_LOG": str(tmp_path / "train.txt")})
    assert done.returncode == 0, done.stderr
    check_torch_world(sim.records(), place_agents(plan, cluster), plan_flags(out), False)
    kept = sorted(out.glob("*.log"))
    assert [p.name for p in kept] == ["train-n0.log"], (kept, done.stderr)
    assert not list((tmp_path / "spool").rglob("*.log"))
    wrote, read = parse_megatron_log_text(log), parse_megatron_log(kept[0])
    assert read.it_number == wrote.it_number and len(wrote.it_number) == TRIAL_ITERATIONS


PBS_JOB = """#!/bin/bash
#PBS -l select=1:ngpus=8
cd "$PBS_O_WORKDIR"
FLAGS="--num-layers 22 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 \\
--vocab-size 32000 --swiglu --normalization RMSNorm --micro-batch-size 1 --global-batch-size 64 --lr 3e-4 --bf16"
torchrun --nproc_per_node 8 pretrain_gpt.py $FLAGS
"""


@pytest.mark.parametrize("written", ["solve", "emit", "gone"])
def test_a_trial_run_from_a_schedulers_spool_copy_logs_where_solve_wrote_it(tmp_path, written):
    """`qsub trials/pick/launch.sh` (PBS, Torque) and bsub (LSF) run a copy of the job script from their spool, which
    the job's end deletes: launch.sh's own directory there does not hold its megatron_args.txt, so the trial log goes
    to the directory solve wrote the launcher to, where `calibrate --trials` reads it, every iteration of it; a launcher
    that does not know where it was written (emit's) keeps its log beside the copy, as does one whose written directory
is gone, saying so."""
    plan = Plan(gbs=64, stages=(StagePlan(device_type="H100", num_layers=22, dp=8),))
    cluster = cluster_of(("H100", 1))
    out = tmp_path / "plans" / "trials" / "pick"
    _trial_launcher(tmp_path, out, PBS_JOB, plan, cluster, None if written == "emit" else str(out))
    spool = tmp_path / "mom_priv" / "jobs"
    spool.mkdir(parents=True)
    shutil.copy(out / "launch.sh", spool / "7.pbs0.SC")
    if written == "gone":
        shutil.copy(out / "megatron_args.txt", tmp_path / "megatron_args.txt")
        shutil.rmtree(out)
    work = tmp_path / "work"
    work.mkdir()
    sim = Sim(tmp_path / "sim", ["h100-node0"], "H100")  # the template host file's name
    done = sim.run(["bash", str(spool / "7.pbs0.SC")], work,
                   {"SIM_LOG": str(tmp_path / "train.txt"), "SIM_HOST": "h100-node0", "PBS_JOBID": "7.pbs0",
                    "PBS_O_WORKDIR": str(work)})
    assert done.returncode == 0, done.stderr + done.stdout[-3000:]
    check_torch_world(sim.records(), place_agents(plan, cluster), plan_flags(tmp_path if written == "gone" else out),
                      False)
    logs = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.log"))
    where = out if written == "solve" else spool
    assert logs == [(where / "train-h100-node0.log").relative_to(tmp_path).as_posix()], (logs, done.stderr)
    assert len(parse_megatron_log(where / "train-h100-node0.log").it_number) == TRIAL_ITERATIONS
    said = f"launch.sh: neither {spool} nor {out} holds this launcher's megatron_args.txt: this host's log goes to {spool}"
    assert (said in done.stderr) == (written == "gone"), done.stderr
    if written == "solve":
        moved = tmp_path / "moved"
        shutil.copytree(out, moved)
        assert sim.run(["bash", str(moved / "launch.sh")], work, {"SIM_LOG": str(tmp_path / "train.txt"),
                                                                  "SIM_HOST": "h100-node0"}).returncode == 0
        assert (moved / "train-h100-node0.log").exists()  # a moved launcher's directory holds its files: its log stays there


@pytest.mark.parametrize("outer", ["heredoc", "function"])
def test_a_job_named_like_the_launcher_is_no_program_launch(tmp_path, outer):
    """`srun -J torchrun bash -c "torchrun ..."` (a job step named torchrun): the option's value was taken for the
    program srun runs, so the launch went to hapmoe_launch as `srun torchrun` would, without the string's --hosts
    placement; srun's options are now skipped first, and the string's torchrun forms the plan's world on the real
    hosts, in stage order."""
    plan, cluster = _plan("two")
    command = INNER["srun bash -c torchrun"][0].replace("srun ", "srun -J torchrun ", 1)
    text, run_by = _outer(outer, command, 1, tmp_path)
    out = tmp_path / "out"
    hosts = _hosts("two")
    agents = emit(out, text, plan, cluster, hosts)
    sim = _sim(tmp_path, "two", hosts)
    done = sim.run([run_by, str(out / "launch.sh")], tmp_path)
    assert done.returncode == 0, done.stderr
    check_torch_world(sim.records(), agents, plan_flags(out), True)


@pytest.mark.parametrize("hostlist, first", [
    ("node[01-04,07]", "node01"), ("gpu5,gpu6", "gpu5"), ("rack[1-2]-node[3-4],x9", "rack1-node3"),
    ("a,b[1-2]", "a"), ("node[7]", "node7"), ("dgx-[003,001-002]", "dgx-003"), ("x[1-2]-ib,y[3]", "x1-ib"),
    ("h100-node0", "h100-node0"),
])
def test_the_first_host_of_a_slurm_host_list_without_scontrol(tmp_path, hostlist, first):
    """hapmoe_first_host reads rank 0's host off a compressed Slurm host list where no scontrol runs: each bracket's
    first number, zero padding and what follows the bracket kept, up to the list's first comma outside brackets."""
    script = tmp_path / "first.sh"
    script.write_text("\n".join(_first_host_function()) + '\nhapmoe_first_host "$1"\n')
    done = subprocess.run([shutil.which("bash"), str(script), hostlist], capture_output=True, text=True, timeout=30,
                          env={"PATH": str(tmp_path / "nothing")})  # no scontrol, nor anything else
    assert (done.returncode, done.stdout) == (0, first + "\n"), done.stderr


def test_mpirun_of_more_torchruns_than_nodes_stops(tmp_path):
    """`mpirun -np 4 --map-by ppr:2:node torchrun ...` on a plan of two nodes: each torchrun is a node's agent, so two a
    node would start the node's agents twice: launch.sh stops (exit 2) before any starts, naming what to give."""
    plan, cluster = _plan("one")
    command = INNER["mpirun torchrun"][0].replace("-np 2", "-np 4").replace("ppr:1:node", "ppr:2:node")
    text, run_by = _outer("direct", command, 1, tmp_path)
    (tmp_path / "mpi_hosts").write_text("n0 slots=8\nn1 slots=8\n")
    out = tmp_path / "out"
    emit(out, text, plan, cluster)
    sim = _sim(tmp_path, "one", None)
    done = sim.run([run_by, str(out / "launch.sh")], tmp_path, {"HOSTFILE": str(tmp_path / "mpi_hosts")})
    assert done.returncode == 2 and not sim.records(), done.stderr
    assert done.stderr.count("launch.sh: mpirun started 4 torchruns, the plan runs 2 nodes: give mpirun -np 2 "
                             "--map-by ppr:1:node (one torchrun a node)") == 1, done.stderr


@pytest.mark.parametrize("outer, inner", [("direct", "mpirun bash -c python"), ("direct", "mpirun bash file"),
                                          ("function", "mpirun python"), ("bash -c", "mpirun torchrun"),
                                          ("bash -c", "srun env torchrun"), ("heredoc", "srun env torchrun")])
def test_dry_run_of_a_launch_the_functions_reach_shows_the_plan(tmp_path, outer, inner):
    """`--dry-run` where mpirun's or srun's launch reaches the plan through launch.sh's functions (a bash mpirun starts
    on every rank, mpirun in a string, `srun env X=1 torchrun` in a string or a submitted job): it printed the
    launcher's line with the script's flags only; what it would start now prints as the plan makes it (a bash mpirun
    starts run once here, under the stubs), and nothing starts.  (An mpirun in a function is launch.sh's own line,
    which showed the plan already.)"""
    plan, cluster = _plan("one")
    command, _, _ = INNER[inner]
    text, _ = _outer(outer, command, 8, tmp_path)
    out = tmp_path / "out"
    emit(out, text, plan, cluster)
    sim = _sim(tmp_path, "one", None)
    done = sim.run(["bash", str(out / "launch.sh"), "--dry-run"], tmp_path, {"HOSTFILE": str(tmp_path / "mpi_hosts")})
    assert done.returncode == 0, done.stderr
    assert not sim.records()
    planned = [line for line in done.stdout.splitlines() if "pretrain_gpt.py" in line]
    assert planned and all(line.split()[-len(plan_flags(out)):] == plan_flags(out) for line in planned), done.stdout


@pytest.mark.parametrize("outer", ["direct", "heredoc"])
def test_mpirun_torchrun_with_real_host_names_meets_at_node_0s_host(tmp_path, outer):
    """`mpirun --map-by ppr:1:node torchrun --master_addr <the allocation's first host> ...` with --hosts whose node 0
    is another host: each rank starts its own host's agents, and the master is node 0's host, where torchrun's static
    rendezvous serves the store (the script's address, another node's, left every node waiting)."""
    plan, cluster = _plan("two")
    hosts = _hosts("two")
    names = sorted(dict(line.split() for line in hosts.splitlines()))
    text, run_by = _outer(outer, INNER["mpirun torchrun"][0].replace("n0", names[0]), 1, tmp_path)
    (tmp_path / "mpi_hosts").write_text("".join(f"{n} slots=1\n" for n in names))
    out = tmp_path / "out"
    agents = emit(out, text, plan, cluster, hosts)
    sim = _sim(tmp_path, "two", hosts)
    done = sim.run([run_by, str(out / "launch.sh")], tmp_path, {"HOSTFILE": str(tmp_path / "mpi_hosts")})
    assert done.returncode == 0, done.stderr
    check_torch_world(sim.records(), agents, plan_flags(out), True)
