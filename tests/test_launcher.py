"""Tests for planner.launcher: megatron_args.txt, launch.sh, hostfile and FlagScale's YAML.

Golden files live in tests/golden/<case>/; regenerate them with HAPMOE_UPDATE_GOLDEN=1 after a
deliberate change, and review the diff.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from click.testing import CliRunner

from cli import main
from planner.errors import PlannerInputError
from planner.inputs.hosts import read_hosts
from planner.inputs.megatron_flags import parse_megatron_flags
from planner.inputs.script import parse_launcher_script
from planner.launcher import render_launch_files
from planner.launcher.common import LaunchOverrides, group_flag_items
from planner.megatron.layout import parse_layout, virtual_stage_layers
from planner.output.run_dir import LAUNCHER_OUTPUT, write_files
from planner.profile_tables import ProfileSet
from planner.schemas import ModelSpec, Plan, Recompute, StagePlan, TrainingSpec
from planner.schemas.parallel import MegatronRun, ParallelConfig

from helpers.cli import solve_searches_once
from helpers.launch import DENSE, EP_OVERLAP_MOE, args_of, cluster_of, dense_plan, ep_overlap_launch

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("HAPMOE_UPDATE_GOLDEN") == "1"

SCRIPT = r"""#!/bin/bash
# Mixtral-style launcher, as Megatron's examples write them
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
MASTER_PORT=${MASTER_PORT:-"6001"}
NNODES=${SLURM_NNODES:-"4"}
CHECKPOINT_PATH=$1
TOKENIZER_MODEL=$2
DATA_PATH=$3

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --master_port $MASTER_PORT
)

MODEL_ARGS=(
    --use-mcore-models
    --disable-bias-linear
    --seq-length 4096
    --max-position-embeddings 32768
    --num-layers 16
    --hidden-size 1024
    --ffn-hidden-size 3584
    --num-attention-heads 16
    --group-query-attention
    --num-query-groups 4
    --normalization RMSNorm
    --swiglu
    --untie-embeddings-and-output-weights
    --vocab-size 32000
)

MOE_ARGS=(
    --num-experts 8
    --moe-router-topk 2
    --moe-aux-loss-coeff 1e-2
    --moe-token-dispatcher-type alltoall
    --moe-grouped-gemm
)

DATA_ARGS=(
    --tokenizer-type Llama2Tokenizer
    --tokenizer-model ${TOKENIZER_MODEL}
    --data-path $DATA_PATH
    --split 99990,8,2
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128
    --lr 1e-4
    --train-iters 500000
    --bf16
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 2
    --expert-model-parallel-size 8
    --use-distributed-optimizer
    --sequence-parallel
)

LOGGING_ARGS=(
    --log-interval 1
    --save-interval 1000
    --save "$CHECKPOINT_PATH"
    --load "$CHECKPOINT_PATH"
    --tensorboard-dir "${CHECKPOINT_PATH}/tensorboard"
)

if [ -n "${WANDB_API_KEY}" ]; then
    LOGGING_ARGS+=(
        --wandb-project ${WANDB_PROJECT:-"Mixtral"}
    )
fi

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${MOE_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${LOGGING_ARGS[@]}
"""

def _stages(*rows: tuple[str, int, int, Recompute]) -> tuple[StagePlan, ...]:
    return tuple(StagePlan(device_type=t, num_layers=n, dp=dp, recompute=r) for t, n, dp, r in rows)


def _script_run() -> tuple[MegatronRun, object]:
    script = parse_launcher_script(SCRIPT)
    return parse_megatron_flags(script.megatron_flags), script


def case(name: str):
    """(run, plan, cluster, script) of one golden case."""
    none = Recompute.none()
    if name == "dense_megatron":
        run = MegatronRun(
            model=DENSE, training=TrainingSpec(global_batch_size=16, use_distributed_optimizer=True),
            parallel=ParallelConfig(), passthrough=("--lr", "3e-4", "--train-iters", "100", "--save", "/ckpt/dense run", "--save-interval", "50"),
        )  # fmt: skip
        full = Recompute.full("uniform", 1)
        plan = Plan(
            tp=2, vpp=2, mbs=1, gbs=16,
            stages=_stages(("H100", 6, 2, full), ("H100", 6, 2, full), ("A100", 5, 2, full), ("A100", 5, 2, full)),
        )  # fmt: skip
        return run, plan, cluster_of(("H100", 1), ("A100", 1)), None  # one vendor: one upstream job
    if name == "dense_flagscale":
        run = MegatronRun(
            model=DENSE.model_copy(update={"num_layers": 8, "name": "dense-8l"}),
            training=TrainingSpec(global_batch_size=32, use_distributed_optimizer=True),
            parallel=ParallelConfig(), passthrough=("--lr", "3e-4", "--train-iters", "100"),
        )  # fmt: skip
        block = Recompute.full("block", 1)
        plan = Plan(
            runtime="flagscale", tp=2, mbs=1, gbs=32,
            stages=_stages(("A100", 5, 4, none), ("MI300X", 2, 2, block), ("MI300X", 1, 2, block)),
        )  # fmt: skip
        return run, plan, cluster_of(("A100", 1), ("MI300X", 1)), None  # NVIDIA + AMD: FlagCX
    run, script = _script_run()
    if name == "moe_megatron":
        sel = Recompute.selective(("core_attn", "moe_act"))
        plan = Plan(
            tp=2, ep=4, etp=1, mbs=1, gbs=128,
            stages=_stages(("H800", 5, 4, sel), ("H800", 5, 4, sel), ("A100", 3, 4, sel), ("A100", 3, 4, sel)),
        )  # fmt: skip
        return run, plan, cluster_of(("H800", 2), ("A100", 2)), script
    if name == "moe_flagscale":
        full = Recompute.full("block", 2)
        plan = Plan(
            runtime="flagscale", tp=2, ep=4, etp=1, mbs=1, gbs=128,
            stages=_stages(("H800", 6, 4, full), ("H800", 5, 4, none), ("MI300X", 5, 4, none)),
        )  # fmt: skip
        return run, plan, cluster_of(("H800", 2), ("MI300X", 1)), script
    raise KeyError(name)


CASES = ["dense_megatron", "moe_megatron", "dense_flagscale", "moe_flagscale"]
MEGATRON_CASES = [c for c in CASES if c.endswith("megatron")]


def render(name: str) -> dict[str, str]:
    run, plan, cluster, script = case(name)
    return render_launch_files(run, plan, cluster, script)


# --------------------------------------------------------------------------------------------
# Golden files
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CASES)
def test_golden_files(name):
    """The emitted files equal the reviewed golden copies (dense and MoE, both runtimes)."""
    files = render(name)
    root = GOLDEN / name
    if UPDATE:
        shutil.rmtree(root, ignore_errors=True)
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    expected = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}
    assert sorted(expected) == sorted(files)
    for rel, text in files.items():
        assert text == expected[rel], f"{name}/{rel} differs from the golden file"


# --------------------------------------------------------------------------------------------
# megatron_args.txt gives the plan back
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MEGATRON_CASES)
def test_args_reparse_to_the_plan(name):
    """shlex.split + the flag parser on megatron_args.txt give the plan's degrees, layout,
    batch and recompute back."""
    run, plan, _, _ = case(name)
    back = parse_megatron_flags(args_of(render(name)))
    par = back.parallel
    assert (par.tp, par.pp, par.cp) == (plan.tp, plan.pp, plan.cp)
    if run.model.is_moe:
        assert (par.ep, par.expert_tp) == (plan.ep, plan.etp)
        assert par.sequence_parallel is True
    assert par.stage_layers(back.model.num_layers) == [s.num_layers for s in plan.stages]
    assert par.virtual_size(back.model.num_layers) == plan.vpp
    assert (back.training.micro_batch_size, back.training.global_batch_size) == (plan.mbs, plan.gbs)
    assert par.recompute == plan.stages[0].recompute
    skip = {"name", "max_position_embeddings"}  # None means seq_length; Megatron requires the flag
    assert back.model.model_dump(exclude=skip) == run.model.model_dump(exclude=skip)
    assert back.model.max_position_embeddings == (run.model.max_position_embeddings or run.model.seq_length)


def test_user_flags_pass_through_unchanged():
    """Flags the plan does not decide keep their values and order; decided ones are replaced."""
    run, plan, cluster, script = case("moe_megatron")
    argv = args_of(render_launch_files(run, plan, cluster, script))
    items = {i.name: i.values for i in group_flag_items(argv)}
    assert items["--lr"] == ["1e-4"] and items["--moe-aux-loss-coeff"] == ["1e-2"]
    assert items["--data-path"] == ["$3"] and items["--split"] == ["99990,8,2"]
    assert items["--tensor-model-parallel-size"] == ["2"]  # the script said 4; the plan decides
    assert argv.count("--tensor-model-parallel-size") == 1
    kept = [t for t in argv if t in ("--lr", "--train-iters", "--log-interval", "--save-interval", "--save", "--load")]
    assert kept == ["--lr", "--train-iters", "--log-interval", "--save-interval", "--save", "--load"]


@pytest.mark.parametrize(
    "counts, expect",
    [
        ([4, 4, 4, 4], set()),
        ([3, 5, 5, 5], {"--decoder-first-pipeline-num-layers"}),
        ([5, 5, 5, 2], {"--decoder-last-pipeline-num-layers"}),
        ([3, 6, 6, 7], {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"}),
        ([7, 9], {"--decoder-first-pipeline-num-layers"}),
        ([6, 4, 5, 7], {"--pipeline-model-parallel-layout"}),
        ([8, 0, 8], {"--pipeline-model-parallel-layout"}),
    ],
)
def test_pipeline_split_flags(counts, expect):
    """Uniform: no split flag; only the end stages differ: first/last flags; else a layout.
    Whatever is emitted, Megatron's split (as the flag parser computes it) equals the plan's."""
    run, plan, cluster = dense_plan(counts)
    argv = args_of(render_launch_files(run, plan, cluster))
    split_flags = {
        "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout",
    }  # fmt: skip
    assert {t for t in argv if t in split_flags} == expect
    back = parse_megatron_flags(argv)
    assert back.parallel.stage_layers(sum(counts)) == counts


def test_interleaved_layout_maps_stage_i_to_rank_i_mod_pp():
    """With vpp > 1 the layout lists virtual stages; stage i belongs to pipeline rank i % PP,
    and each rank's chunks add up to its layers."""
    counts = [7, 6, 5, 4]
    run, plan, cluster = dense_plan(counts, vpp=3)
    argv = args_of(render_launch_files(run, plan, cluster))
    per_virtual = parse_layout(argv[argv.index("--pipeline-model-parallel-layout") + 1])
    assert len(per_virtual) == 12
    for rank, n in enumerate(counts):
        chunks = [per_virtual[i] for i in range(len(per_virtual)) if i % 4 == rank]
        assert sum(chunks) == n and max(chunks) - min(chunks) <= 1
    # every rank follows the fullest rank's pattern (spare layers first); a rank holding fewer drops layers
    # nearest the embedding (first rank) or the loss (the others)
    assert virtual_stage_layers([3, 1], 2) == [2, 1, 1, 0]
    assert virtual_stage_layers([2, 3], 2) == [1, 2, 1, 1]
    assert virtual_stage_layers([2] + [3] * 30 + [2], 3) == [0] + [1] * 94 + [0]  # E|(t|)*94L


# --------------------------------------------------------------------------------------------
# Placement, hostfile and launch.sh
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CASES)
def test_hostfile_puts_every_stage_on_its_device_type(name):
    """Node k (nproc ranks each, hostfile order) holds ranks whose stage runs on the node's type."""
    _, plan, _, _ = case(name)
    files = render(name)
    assert files["hostfile"].startswith("# TEMPLATE: these host names are made up")
    lines = " ".join(ln for ln in files["hostfile"].splitlines() if not ln.startswith("#")).split()
    hosts = [lines[i : i + 3] for i in range(0, len(lines), 3)]
    stage_of_rank: list[int] = []
    for s, st in enumerate(plan.stages):
        stage_of_rank += [s] * (plan.tp * plan.cp * st.dp)
    rank = 0
    for host, slots, typ in hosts:
        n = int(slots.removeprefix("slots="))
        for r in range(rank, rank + n):
            assert typ == "type=" + plan.stages[stage_of_rank[r]].device_type, (host, r)
        rank += n
    assert rank == plan.world_size


def _fake_torchrun(tmp_path: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "torchrun"
    fake.write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$HAPMOE_ARGS_OUT"\n')
    fake.chmod(0o755)
    return bindir


def _run_agent(launch: Path, tmp_path: Path, agent: int, args=(), env=None) -> list[str]:
    bindir = tmp_path / "bin"
    out = tmp_path / f"args{agent}"
    environ = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "HAPMOE_NODE_RANK": str(agent),
        "HAPMOE_ARGS_OUT": str(out),
        "HAPMOE_SKIP_NODE_CHECK": "1",  # no GPUs here (the node check has tests of its own)
        **(env or {}),
    }
    subprocess.run(["bash", str(launch), *args], check=True, env=environ, cwd=tmp_path, timeout=30)
    return out.read_bytes().decode().split("\0")[:-1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("name", ["dense_megatron", "dense_flagscale"])
def test_launch_sh_passes_exactly_the_args_file(name, tmp_path):
    """Running launch.sh (with a fake torchrun) passes static-rendezvous placement flags and
    exactly the flags of megatron_args.txt, for every agent."""
    run, plan, cluster, script = case(name)
    paths = write_files(tmp_path / "out", render_launch_files(run, plan, cluster, script), "--out", LAUNCHER_OUTPUT)
    launch = tmp_path / "out" / "launch.sh"
    assert launch in paths and os.stat(launch).st_mode & stat.S_IXUSR
    _fake_torchrun(tmp_path)
    expected = shlex.split((tmp_path / "out" / "megatron_args.txt").read_text())
    hosts = [ln for ln in (tmp_path / "out" / "hostfile").read_text().splitlines() if not ln.startswith("#")]
    for agent in range(len(hosts)):
        got = _run_agent(launch, tmp_path, agent)
        entry = got.index("pretrain_gpt.py" if plan.runtime == "megatron" else "flagscale/train/train_gpt.py")
        head = got[:entry]
        assert head[head.index("--node-rank") + 1] == str(agent)
        assert head[head.index("--nnodes") + 1] == str(len(hosts))
        assert head[head.index("--nproc-per-node") + 1] == "8"
        assert head[head.index("--rdzv-backend") + 1] == "static"
        assert head[head.index("--master-addr") + 1] == hosts[0].split()[0]
        tail = got[entry + 1 :]
        if plan.runtime == "flagscale":
            assert tail[-2:] == ["--hetero-current-device-type", hosts[agent].split()[2].removeprefix("type=")]
            tail = tail[:-2]
        assert tail == expected


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_launch_sh_keeps_the_input_scripts_settings(tmp_path):
    """With the user's script: its positional paths, variables and conditional additions still
    work in the emitted launcher, and the input file is left untouched."""
    run, plan, cluster, script = case("moe_megatron")
    src = tmp_path / "train.sh"
    src.write_text(SCRIPT)
    write_files(tmp_path / "out", render_launch_files(run, plan, cluster, script), "--out", LAUNCHER_OUTPUT)
    assert src.read_text() == SCRIPT
    _fake_torchrun(tmp_path)
    got = _run_agent(
        tmp_path / "out" / "launch.sh", tmp_path, 3, args=("/ckpt", "/tok.model", "/data/text"),
        env={"WANDB_API_KEY": "k"},
    )  # fmt: skip
    items = {i.name: i.values for i in group_flag_items(got[got.index("pretrain_gpt.py") + 1 :])}
    assert items["--data-path"] == ["/data/text"]
    assert items["--tokenizer-model"] == ["/tok.model"]
    assert items["--tensorboard-dir"] == ["/ckpt/tensorboard"]
    assert items["--wandb-project"] == ["Mixtral"]  # the if-block, replayed after the arrays
    assert got[got.index("--master_port") + 1] == "6001"  # the script's own master port option, kept
    assert "--master-port" not in got and got[got.index("--node-rank") + 1] == "3"


def _directives_read(text: str, prefix: str) -> list[str]:
    """The scheduler directives a batch script gives, as sbatch reads them (sbatch(1): "sbatch will stop processing
    further #SBATCH directives once the first non-comment non-whitespace line has been reached"; qsub and bsub read
    #PBS and #BSUB the same way): the `prefix` lines above the first command."""
    out = []
    for line in text.split("\n")[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if line.startswith(prefix):
            out.append(line)
    return out


@pytest.mark.parametrize("prefix", ["#SBATCH", "#PBS", "#BSUB"])
def test_launch_sh_keeps_the_scheduler_directives_where_the_scheduler_reads_them(prefix):
    """A job script's directives (`#SBATCH --nodes=4`) count only above its first command: launch.sh, which the
    user submits as they submitted the script, keeps every one of them there (its block of functions came before
    them, so `sbatch launch.sh` ran on the partition's default resources: one node, no GPU), the comments and blank
    lines between them too, and the block still comes before the script's first command."""
    run, plan, cluster, _ = case("moe_megatron")
    directives = [f"{prefix} --nodes=4", f"{prefix} --gpus-per-node=8", f"{prefix} --job-name='moe; $(reboot)'"]
    head = ["#!/bin/bash", directives[0], "", "# resources", directives[1], "  # indented comment", directives[2]]
    text = "\n".join(head) + "\n" + SCRIPT.split("\n", 1)[1]
    files = render_launch_files(run, plan, cluster, parse_launcher_script(text))
    launch = files["launch.sh"]
    assert _directives_read(text, prefix) == directives  # the rule, on the input
    assert _directives_read(launch, prefix) == directives
    lines = launch.split("\n")
    assert lines.index("# ---- hapmoe: the plan, applied where the script launches training ----") \
        < lines.index("export CUDA_DEVICE_MAX_CONNECTIONS=1")
    assert "\n".join(head[1:]) + "\n# Mixtral-style launcher" in launch  # the input's comment lines, in order


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("scontrol", [True, False])
def test_launch_sh_run_by_sbatch_logs_beside_the_submitted_file(tmp_path, scontrol):
    """sbatch runs a copy of the job script (slurmd's `<spool>/job<ID>/slurm_script`), deleted when the job ends:
    a trial's log (and --hosts' SLURM_HOSTFILE) belongs beside the launch.sh the user submitted, which scontrol names
    (`Command=`), or else in the directory sbatch was called from (SLURM_SUBMIT_DIR), with a warning.  Both went to
    the spool directory."""
    run, plan, cluster, _ = case("dense_megatron")
    out = tmp_path / "my out" / "trials" / "pick"
    write_files(out, render_launch_files(run, plan, cluster, overrides=LaunchOverrides(log_name="train")),
                "--out", LAUNCHER_OUTPUT)
    spool = tmp_path / "spool" / "job7"
    spool.mkdir(parents=True)
    shutil.copy(out / "launch.sh", spool / "slurm_script")
    bindir = _fake_torchrun(tmp_path)
    if scontrol:
        (bindir / "scontrol").write_text(f"#!/bin/bash\nprintf '   JobId=7 JobName=x\\n   Command=%s\\n   WorkDir=/\\n' "
                                         f"{shlex.quote(str(out / 'launch.sh'))}\n")
        (bindir / "scontrol").chmod(0o755)
    submit = tmp_path / "submitted from"
    submit.mkdir()
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "HAPMOE_NODE_RANK": "0", "HAPMOE_ARGS_OUT": str(tmp_path / "args"),
           "HAPMOE_SKIP_NODE_CHECK": "1", "SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": str(submit)}
    done = subprocess.run(["bash", str(spool / "slurm_script")], env=env, cwd=spool, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    where = out if scontrol else submit
    logs = [p.name for p in where.iterdir() if p.suffix == ".log"]
    assert len(logs) == 1 and logs[0].startswith("train-"), (logs, done.stderr)
    assert not any(p.suffix == ".log" for p in spool.iterdir())
    assert ("scontrol does not name the submitted file" in done.stderr) is not scontrol, done.stderr


SRUN_TORCHRUN = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --container-image=img.sqsh LAUNCHER --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d ENDPOINT \
    pretrain_gpt.py --num-layers 22 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \
    --max-position-embeddings 2048 --vocab-size 32000 --swiglu --normalization RMSNorm --micro-batch-size 1 \
    --global-batch-size 64 --lr 3e-4 --bf16
"""


FLAGS_22L = ("--num-layers 22 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
             "--max-position-embeddings 2048 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 64 --bf16")
"""The model of SRUN_TORCHRUN, for the scripts the launch tests below write."""


def _emit_one_stage(out: Path | None, text: str, nodes: int = 2, hosts: str | None = None,
                    tmp_path: Path | None = None) -> dict[str, str]:
    """The launcher files of `text` for a plan of one H100 stage over `nodes` 8-GPU nodes (DP = its GPUs), with real
    host names `hosts` (a --hosts file's text) if given; written to `out` where given."""
    script = parse_launcher_script(text)
    run = parse_megatron_flags(script.megatron_flags)
    plan = Plan(gbs=64, stages=(StagePlan(device_type="H100", num_layers=22, dp=8 * nodes),))
    cluster = cluster_of(("H100", nodes))
    listed = read_hosts(_hosts_file(tmp_path, hosts), cluster, ProfileSet.load()) if hosts else None
    files = render_launch_files(run, plan, cluster, script, hosts=listed)
    if out is not None:
        write_files(out, files, "--out", LAUNCHER_OUTPUT)
    return files


def _fake_slurm(tmp_path: Path, export_all: bool) -> Path:
    """Stubs: srun runs its command once per node of a 2-node job (SLURM_PROCID/SLURM_NODEID; with `export_all`
    false, as --export=NONE does, in an environment of the SLURM_* variables and PATH only); scontrol lists the
    nodes; torchrun and python write their arguments to args<SLURM_PROCID>."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    env = "" if export_all else "env -i PATH=\"$PATH\" HAPMOE_SKIP_NODE_CHECK=1 HOME=/ "
    (bindir / "srun").write_text(
        "#!/bin/bash\nwhile [[ \"$1\" == -* ]]; do [[ \"$1\" == -[Nn] ]] && shift; shift; done\n"
        f"for i in 0 1; do {env}SLURM_PROCID=$i SLURM_NODEID=$i SLURM_STEP_NUM_NODES=2 \"$@\" & done; wait\n")
    (bindir / "scontrol").write_text("#!/bin/bash\necho node-a; echo node-b\n")
    record = f'#!/bin/bash\nprintf "%s\\0" "$@" > {shlex.quote(str(tmp_path))}/args$SLURM_PROCID\n'
    for tool in ("torchrun", "python"):
        (bindir / tool).write_text(record)
    for f in bindir.iterdir():
        f.chmod(0o755)
    return bindir


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("launcher, endpoint, export_all, master, hosts", [
    ("torchrun", "--rdzv-endpoint $MASTER:29500", True, ("node-a", "29500"), None),
    ("torchrun", "--rdzv_endpoint=$MASTER", False, ("node-a", "6000"), None),
    ("python -m torch.distributed.run", "--rdzv-endpoint $MASTER:29400", True, ("node-a", "29400"), None),
    ("torchrun", "--master-addr $MASTER --master-port 7000", False, ("node-a", "7000"), None),
    # --hosts: srun places task k on the hostfile's k-th line, agent k; node 0's host is the master
    ("torchrun", "--rdzv-endpoint $MASTER:29500", True, ("node-b", "6000"), "node-b H100\nnode-a H100\n"),
    ("python -m torch.distributed.run", "--rdzv-endpoint $MASTER:29500", True, ("node-b", "6000"),
     "node-b H100\nnode-a H100\n"),
])
def test_srun_torchrun_runs_one_node_rank_per_task(tmp_path, launcher, endpoint, export_all, master, hosts):
    """`srun torchrun ...` (torchrun in every task srun starts, the usual Slurm launch): each task runs its own
    node's agent, node ranks 0 and 1, with the script's master (its rendezvous endpoint, or --master-addr) as the
    static rendezvous' master, also where srun's --export passes launch.sh's functions to no task.  It ran one
    command for the submitting host, so every task got node rank 0, and the master was the hostfile's template
    host name (h100-node0), which no cluster has."""
    text = SRUN_TORCHRUN.replace("LAUNCHER", launcher).replace("ENDPOINT", endpoint)
    out = tmp_path / "out"
    _emit_one_stage(out, text, hosts=hosts, tmp_path=tmp_path)
    bindir = _fake_slurm(tmp_path, export_all)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "HAPMOE_SKIP_NODE_CHECK": "1", "SLURM_JOB_ID": "7",
           "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "node-[a-b]"}
    done = subprocess.run(["bash", str(out / "launch.sh")], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    if hosts:  # one task per agent, placed in stage order
        assert "SLURM_HOSTFILE=" in done.stderr and done.stderr.count("slurm_hostfile.nodes") == 1, done.stderr
    for task in (0, 1):
        got = (tmp_path / f"args{task}").read_bytes().decode().split("\0")[:-1]
        assert got[got.index("--node-rank") + 1] == str(task), got
        assert got[got.index("--nnodes") + 1] == "2" and got[got.index("--rdzv-backend") + 1] == "static"
        assert (got[got.index("--master-addr") + 1], got[got.index("--master-port") + 1]) == master, got
        assert got.count("--master-addr") == 1 and not any(w.startswith("--rdzv-endpoint") for w in got), got
        assert got[got.index("pretrain_gpt.py") + 1:].count("--global-batch-size") == 1


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("nodes, srun_n, note, job_nodes", [
    (4, "", "the script's srun runs on 2 node(s) (`#SBATCH --nodes=2`", "2"),
    (4, "-N 2 ", "the script's srun runs on 2 node(s) (srun's own -N 2) and the plan on 4: give srun -N 4", "2"),
    (4, "-N 2 ", "(srun's own -N 2) and the plan on 4: give srun -N 4", "4"),  # the step's nodes, in a job of 4
    (1, "", "and the plan on 1: submit launch.sh with `sbatch --nodes=1`", "2"),
    (2, "", None, "2"),
])
def test_a_job_of_other_nodes_than_the_plan_is_named_and_fewer_stop(tmp_path, nodes, srun_n, note, job_nodes):
    """A plan on another number of nodes than the script's job (#SBATCH --nodes=2, or srun's own -N): launch.sh's
    header says how to submit it; run in a job, or an srun step (srun -N 2 in a job of 4), of fewer nodes than the
    plan, launch.sh stops with that fix before torchrun starts (its static rendezvous would wait for the missing
    nodes forever).  Both were silent."""
    text = SRUN_TORCHRUN.replace("LAUNCHER", "torchrun").replace("ENDPOINT", "--rdzv-endpoint $MASTER:29500")
    text = text.replace("srun --container", f"srun {srun_n}--container")
    out = tmp_path / "out"
    files = _emit_one_stage(out, text, nodes)
    header = [line for line in files["launch.sh"].split("\n") if line.startswith("# note: the script's srun runs")]
    assert (note is None and not header) or (len(header) == 1 and note in header[0]), header
    bindir = _fake_slurm(tmp_path, True)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "HAPMOE_SKIP_NODE_CHECK": "1", "SLURM_JOB_ID": "7",
           "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": job_nodes}
    done = subprocess.run(["bash", str(out / "launch.sh")], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    started = (tmp_path / "args0").exists()
    if nodes > 2 and job_nodes == "2":
        assert done.returncode == 2 and not started, done.stderr
        assert f"the plan runs on {nodes} nodes and this job holds 2" in done.stderr
        assert f"sbatch --nodes={nodes}" in done.stderr
    elif nodes > 2:  # the fake srun's tasks exit 2; it reports its own status as srun does not
        assert not started and f"the plan runs on {nodes} nodes and srun's step on 2" in done.stderr, done.stderr
        assert f"give srun -N {nodes}" in done.stderr
    else:
        assert started and "this job holds" not in done.stderr, done.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("launch", [
    "srun torchrun --nnodes 2 --nproc_per_node 8 --rdzv-endpoint node-a:29500 pretrain_gpt.py",
    "srun bash -c \"set -euo pipefail; torchrun --nnodes 2 --nproc_per_node 8 --rdzv-endpoint node-a:29500 pretrain_gpt.py",
    "srun python pretrain_gpt.py",
])
def test_launch_sh_under_set_euo_pipefail_without_scontrol(tmp_path, launch):
    """Scripts often run `set -euo pipefail` (gptoss_train.sh), also in the string srun runs, and a container may
    have no scontrol: launch.sh's own reads of Slurm (scontrol show hostnames / show job) may fail there without
    stopping the launch (a failed `x=$(scontrol ... | head -n 1)` under errexit and pipefail exited the shell)."""
    tasks = "8" if "python" in launch else "1"
    text = (f"#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node={tasks}\n#SBATCH --gpus-per-node=8\n"
            f"set -euo pipefail\n{launch} {FLAGS_22L}" + ('"' if "bash -c" in launch else "") + "\n")
    out = tmp_path / "out"
    _emit_one_stage(out, text)
    bindir = _fake_slurm(tmp_path, True)
    (bindir / "scontrol").unlink()
    srun = (bindir / "srun").read_text()
    if "python" in launch:  # one task per rank
        srun = srun.replace("for i in 0 1; do", "for i in $(seq 0 15); do").replace(
            "SLURM_NODEID=$i", "SLURM_NODEID=$((i / 8)) SLURM_LOCALID=$((i % 8)) SLURM_STEP_NUM_TASKS=16")
    (bindir / "srun").write_text(srun.replace("SLURM_PROCID=$i", "SLURM_PROCID=$i SLURM_STEP_NODELIST=node-[a-b]"))
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "HAPMOE_SKIP_NODE_CHECK": "1", "SLURM_JOB_ID": "7",
           "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NODELIST": "node-a"}
    done = subprocess.run(["bash", str(out / "launch.sh")], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    ranks = 16 if "python" in launch else 2
    assert sorted(p.name for p in tmp_path.glob("args*")) == sorted(f"args{i}" for i in range(ranks)), done.stderr


@pytest.mark.parametrize("srun, noted", [
    ("srun --export=NONE bash -c \"torchrun ARGS\"", True),
    ("srun --export=HOME,PATH bash -c \"torchrun ARGS\"", True),
    ("srun bash -c \"torchrun ARGS\"", False),
    ("srun --export=ALL,X=1 bash -c \"torchrun ARGS\"", False),
    ("srun --export=NONE torchrun ARGS", False),  # the task's command carries what it needs
])
def test_a_launch_launch_sh_cannot_reach_under_srun_export_is_named(srun, noted):
    """srun --export without ALL over a training command inside a string: launch.sh reaches it through exported
    functions only and stops there at run time; the header (and solve/emit, which print the same notes) says so
    when the launcher is written, with the fix."""
    args = "--nnodes 2 --nproc_per_node 8 --rdzv-endpoint h:29500 pretrain_gpt.py " + FLAGS_22L
    text = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=8\n"
            + srun.replace("ARGS", args) + "\n")
    launch = _emit_one_stage(None, text)["launch.sh"]
    notes = [line for line in launch.split("\n") if "gives its tasks none of launch.sh's functions" in line]
    assert len(notes) == noted and (not noted or "--export=ALL" in notes[0]), notes


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("options, env, agent", [
    ("--nnodes 2 --node_rank $NODE_RANK", {"NODE_RANK": "1"}, 1),  # a Kubernetes PyTorchJob pod's script
    ("--nnodes=$NNODES --node-rank=$NODE_RANK", {"NODE_RANK": "0", "NNODES": "2"}, 0),
    ("", {"PET_NODE_RANK": "1", "PET_NNODES": "2"}, 1),  # torchrun's own variables
    ("--nnodes 1 --node_rank 0", {}, None),  # a one-node script's rank: not this plan's node order
    ("--nnodes 2 --node_rank 2", {}, "the script's torchrun node rank 2 is not a node of the hostfile (0-1)"),
])
def test_a_node_off_the_hostfile_takes_the_scripts_node_rank(tmp_path, options, env, agent):
    """A node whose host name the plan does not know (template names) outside Slurm, such as a Kubernetes pod, whose
    script passes torchrun its node rank: launch.sh runs that node's agents when the script runs as many nodes as
    the plan (it stopped: `host ... is not in hostfile`); a one-node script's literal rank 0 is not read so."""
    text = (f"#!/bin/bash\nNODE_RANK=${{NODE_RANK:-0}}\nNNODES=${{NNODES:-2}}\ntorchrun --nproc_per_node 8 {options} "
            f"--master_addr pod-0 --master_port 23456 pretrain_gpt.py {FLAGS_22L}\n")
    out = tmp_path / "out"
    _emit_one_stage(out, text)
    bindir = _fake_slurm(tmp_path, True)
    environ = {"PATH": f"{bindir}:{os.environ['PATH']}", "HAPMOE_SKIP_NODE_CHECK": "1", "HAPMOE_HOST": "pod-7", **env}
    done = subprocess.run(["bash", str(out / "launch.sh")], env=environ, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    if isinstance(agent, int):
        assert done.returncode == 0, done.stderr
        got = (tmp_path / "args").read_bytes().decode().split("\0")[:-1]
        assert got[got.index("--node-rank") + 1] == str(agent) and got[got.index("--nnodes") + 1] == "2", got
        assert got[got.index("--master_addr") + 1] == "pod-0", got
    else:
        assert done.returncode == 2 and not (tmp_path / "args").exists()
        assert (agent or "host pod-7 is not in hostfile") in done.stderr, done.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("variable", ["SRUN_EXPORT_ENV", "SLURM_EXPORT_ENV"])
def test_an_export_srun_reads_from_its_environment_stops_a_launch_it_would_hide(tmp_path, variable):
    """srun takes its --export from SRUN_EXPORT_ENV, else SLURM_EXPORT_ENV (srun(1)): NONE there keeps launch.sh's
    functions from a `bash -c` string's torchrun as `--export=NONE` does, so launch.sh stops, saying so, instead of
    starting the script's own torchrun without the plan (SRUN_EXPORT_ENV was not read)."""
    args = "--nnodes 2 --nproc_per_node 8 --rdzv-endpoint h:29500 pretrain_gpt.py " + FLAGS_22L
    text = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=8\n"
            f"srun bash -c \"torchrun {args}\"\n")
    out = tmp_path / "out"
    _emit_one_stage(out, text)
    bindir = _fake_slurm(tmp_path, False)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "HAPMOE_SKIP_NODE_CHECK": "1", "SLURM_JOB_ID": "7",
           "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "2", variable: "NONE"}
    done = subprocess.run(["bash", str(out / "launch.sh")], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and not list(tmp_path.glob("args*")), done.stderr
    assert "srun --export=NONE starts its tasks without launch.sh's functions" in done.stderr


def test_cuda_device_max_connections_only_with_tp_or_cp():
    """CUDA_DEVICE_MAX_CONNECTIONS=1 is exported when TP or CP > 1, not otherwise."""
    run, plan, cluster = dense_plan([4, 4])
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in render_launch_files(run, plan, cluster)["launch.sh"]
    tp2 = plan.model_copy(update={"tp": 2})
    cluster2 = cluster_of(("A100", 1))
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in render_launch_files(run, tp2, cluster2)["launch.sh"]


def test_fsdp_launches_never_export_one_hardware_queue():
    """Megatron-FSDP and Torch-FSDP2 refuse CUDA_DEVICE_MAX_CONNECTIONS=1 (validate_args: 'FSDP requires
    CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset', 'FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than
    one'): with TP > 1 the launch exports nothing for them."""
    from planner.launcher.megatron import max_connections

    _, plan, _ = dense_plan([4, 4])
    tp2 = plan.model_copy(update={"tp": 2})
    assert max_connections(tp2, ["--lr", "1e-4"]) == 1
    assert max_connections(tp2, ["--use-megatron-fsdp"]) is None
    assert max_connections(tp2, ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]) is None


def test_ep_overlap_launches_with_more_than_one_hardware_queue(tmp_path):
    """--overlap-moe-expert-parallel-comm needs CUDA_DEVICE_MAX_CONNECTIONS > 1 (Megatron's MoE README); the launch
    exports 32 for it, as NVIDIA's MoE Model Zoo does, also with TP > 1 (where it would otherwise export the 1 Megatron
    requires), and says why (Megatron's validator accepts each: test_megatron_validator.py).  A script of the user's
    that exports 1 with the overlap is told it may not overlap."""
    from planner.api import load_inputs

    for tp, ovl, want in ((2, True, "32"), (1, True, "32"), (2, False, "1"), (1, False, None)):
        files, _ = ep_overlap_launch(tp, ovl)
        exports = re.findall(r"export CUDA_DEVICE_MAX_CONNECTIONS=(\d+)", files["launch.sh"])
        # hapmoe_launch's export, and the same in the string each rank srun or mpirun starts itself runs
        assert exports == ([want, want] if want else []), (tp, ovl, exports)
        if ovl:
            assert "needs more than one hardware queue" in files["launch.sh"]
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n"
                      f"torchrun --nproc-per-node 8 pretrain_gpt.py {EP_OVERLAP_MOE} --tensor-model-parallel-size 2 "
                      "--sequence-parallel --overlap-moe-expert-parallel-comm\n")
    notes: list[str] = []
    load_inputs(cluster="H100:8", megatron_script=str(script), profiles=ProfileSet.load(), on_note=notes.append)
    assert any("exports CUDA_DEVICE_MAX_CONNECTIONS=1, but --overlap-moe-expert-parallel-comm" in n for n in notes)


def test_small_blocks_share_a_host():
    """A stage smaller than a node: agents of 4 GPUs share 8-GPU hosts with CUDA_VISIBLE_DEVICES."""
    run, plan, cluster = dense_plan([4, 4, 4])
    plan = plan.model_copy(update={"stages": tuple(s.model_copy(update={"dp": 4}) for s in plan.stages)})
    files = render_launch_files(run, plan, cluster_of(("A100", 2)))
    assert files["hostfile"].endswith("\na100-node0 slots=8 type=A100\na100-node1 slots=4 type=A100\n")
    assert "HAPMOE_A_CVD=4,5,6,7;" in files["launch.sh"]
    assert "--nproc-per-node 4 " in files["launch.sh"]


# --------------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------------
def test_megatron_runtime_refuses_per_stage_dp():
    """Upstream Megatron cannot run different DP per stage: refused, naming the runtime."""
    run, plan, cluster, _ = case("dense_flagscale")
    with pytest.raises(PlannerInputError) as err:
        render_launch_files(run, plan.model_copy(update={"runtime": "megatron"}), cluster)
    assert err.value.field == "--runtime" and "data-parallel" in str(err.value)


def test_flagscale_refuses_interleaving_and_cp():
    """FlagScale cannot interleave or use CP: refused with FlagScale's own words."""
    run, plan, cluster, _ = case("dense_megatron")
    fs = plan.model_copy(update={"runtime": "flagscale"})
    with pytest.raises(PlannerInputError) as err:
        render_launch_files(run, fs, cluster)
    assert "virtual pipeline not support now!" in str(err.value)


def test_rule_violation_is_refused_before_writing(tmp_path):
    """A plan that breaks a Megatron rule writes nothing and names the rule."""
    run, plan, cluster = dense_plan([4, 4])
    bad = plan.model_copy(update={"gbs": 63, "mbs": 2})
    with pytest.raises(PlannerInputError) as err:
        write_files(tmp_path / "out", render_launch_files(run, bad, cluster), "--out", LAUNCHER_OUTPUT)
    assert "eval_global_batch_size (63) must be divisible" in str(err.value)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_cluster_too_small_or_missing_type():
    """A plan that needs more GPUs of a type than the cluster has, or an absent type, is refused."""
    run, plan, _ = dense_plan([4, 4])
    with pytest.raises(PlannerInputError) as err:
        render_launch_files(run, plan, cluster_of(("H800", 1)))
    assert err.value.field == "--cluster" and "A100" in str(err.value)
    wide = plan.model_copy(update={"stages": tuple(s.model_copy(update={"dp": 8}) for s in plan.stages)})
    with pytest.raises(PlannerInputError) as err:
        render_launch_files(run, wide, cluster_of(("A100", 1)))
    assert "16 A100" in str(err.value)


def test_moe_with_etp_gets_disable_bias_linear():
    """MoE with ETP > 1 and biases on: --disable-bias-linear is added, with a note."""
    model = ModelSpec(num_layers=4, hidden_size=512, num_attention_heads=8, vocab_size=1000, num_experts=4)
    run = MegatronRun(model=model, training=TrainingSpec(global_batch_size=8), parallel=ParallelConfig())
    plan = Plan(tp=2, ep=2, etp=2, gbs=8, stages=(StagePlan(device_type="A100", num_layers=4, dp=4),))
    files = render_launch_files(run, plan, cluster_of(("A100", 1)))
    assert "--disable-bias-linear" in args_of(files)
    assert "Bias in Moe" not in files["launch.sh"] and "--disable-bias-linear added" in files["launch.sh"]


# --------------------------------------------------------------------------------------------
# FlagScale YAML
# --------------------------------------------------------------------------------------------
def test_flagscale_yaml_meshes_and_recompute_lists():
    """Meshes are TP CP EP DP PP per run of same-type, same-DP stages; recompute lists are
    [n_stages, n_microbatches, value] (granularity on/off, method 1 = block, layers)."""
    files = render("dense_flagscale")
    train = yaml.safe_load(files["flagscale/conf/train/hapmoe.yaml"])
    hetero = train["system"]["hetero"]
    # stages: A100 dp4 | MI300X dp2 | MI300X dp2, TP 2  ->  meshes [2,1,1,4,1] and [2,1,1,2,2]
    assert hetero["hetero_process_meshes"] == [2, 1, 1, 4, 1, 2, 1, 1, 2, 2]
    assert hetero["hetero_device_types"] == ["A100", "MI300X"]
    assert train["system"]["distributed_backend"] == "flagcx"  # NVIDIA + AMD in one job: FlagCX
    assert hetero["hetero_pipeline_layer_split"] == [5, 2, 1]
    assert hetero["use_partial_reduce_for_shared_embedding"] is True  # tied, DP 4 -> 2
    m = 32 // (1 * 4)
    rec = train["system"]["recompute"]
    assert rec["recompute_granularity"] == "full" and rec["recompute_method"] == "block"
    assert rec["recompute_granularity_per_stage_micro_batch"] == [[1, m, 0], [2, m, 1]]
    assert rec["recompute_method_per_stage_micro_batch"] == [[1, m, 0], [2, m, 1]]
    assert rec["recompute_num_layers_per_stage_micro_batch"] == [[1, m, 0], [2, m, 1]]
    exp = yaml.safe_load(files["flagscale/conf/config.yaml"])
    assert exp["experiment"]["runner"]["nnodes"] == 2 and exp["experiment"]["runner"]["hostfile"] == "hostfile"


def _flatten(node: dict, out: list[str]) -> None:
    """FlagScale's flatten_dict_to_args, as megatron.md 6.4 describes it."""
    for key, value in node.items():
        if isinstance(value, dict):
            _flatten(value, out)
        elif value is True:
            out.append("--" + key.replace("_", "-"))
        elif isinstance(value, list):
            out.append("--" + key.replace("_", "-"))
            out += [str(v) for v in value]
        elif value is not False and value is not None:
            out += ["--" + key.replace("_", "-"), str(value)]


@pytest.mark.parametrize("name", ["dense_flagscale", "moe_flagscale"])
def test_flagscale_yaml_says_what_megatron_args_says(name):
    """Flattening the train YAML gives the same options and values as megatron_args.txt
    (plus the per-host current device type)."""
    files = render(name)
    flat: list[str] = []
    _flatten(yaml.safe_load(files["flagscale/conf/train/hapmoe.yaml"]), flat)
    from_yaml = {i.name: i.values for i in group_flag_items(flat)}
    from_args = {i.name: i.values for i in group_flag_items(args_of(files))}
    assert from_yaml.pop("--hetero-current-device-type")
    for key in list(from_yaml):
        if key.endswith("-per-stage-micro-batch"):
            assert [json.loads(v) for v in from_args.pop(key)] == [
                json.loads(v.replace("'", '"')) for v in from_yaml.pop(key)
            ]
    norm = {k: [re.sub(r"\$\{oc\.env:HAPMOE_SCRIPT_ARG_(\d)\}", r"$\1", v).replace("${oc.env:", "${") for v in vals]
            for k, vals in from_yaml.items()}
    if "--save-interval" not in from_args:  # FlagScale's runner always passes --save: the YAML adds an interval
        train_iters = from_args.get("--train-iters", ["1000"])
        assert norm.pop("--save-interval") == train_iters
    assert norm == from_args


def test_the_yaml_header_lists_the_script_arguments_to_export_by_n():
    """The header's "export ..." names the script's arguments HAPMOE_SCRIPT_ARG_1, _2, _3 in that order (it listed
    3, 2, 1: the order of the keys in the dumped YAML), each once, and every one the YAML reads."""
    files = render("moe_flagscale")
    yaml_text = files["flagscale/conf/train/hapmoe.yaml"]
    line = next(x for x in yaml_text.splitlines() if "run.py resolves ${oc.env:...}: export" in x)
    named = re.findall(r"HAPMOE_SCRIPT_ARG_(\d)\b", line.split(" first")[0])
    read = set(re.findall(r"\$\{oc\.env:HAPMOE_SCRIPT_ARG_(\d)\}", yaml_text))
    assert named == sorted(read, key=int) and len(named) >= 2, line


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def test_emit_command_writes_the_files(tmp_path):
    """`cli.py emit --plan plan.json --out DIR` writes the launcher; a bad plan exits 2 cleanly."""
    from click.testing import CliRunner

    from cli import main

    run, plan, cluster, _ = case("dense_megatron")
    doc = {"plan": plan.model_dump(mode="json"), "inputs": {"run": run.model_dump(mode="json"), "cluster": cluster.model_dump(mode="json")}}
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["emit", "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "o" / "launch.sh").exists() and (tmp_path / "o" / "megatron_args.txt").exists()
    assert (tmp_path / "o" / "megatron_args.txt").read_text() == render("dense_megatron")["megatron_args.txt"]
    doc["plan"]["gbs"] = 15
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["emit", "--plan", str(tmp_path / "bad.json"), "--out", str(tmp_path / "b")])
    assert result.exit_code == 2 and "global batch size (15)" in result.output
    assert "Traceback" not in result.output


# --------------------------------------------------------------------------------------------
# Placement: --hosts, the node check at start-up, SLURM's placement
# --------------------------------------------------------------------------------------------
def _probe_stub(bindir: Path, tool: str, prints: str) -> None:
    (bindir / tool).write_text(f"#!/bin/bash\nprintf '%s\\n' {shlex.quote(prints)}\n")
    (bindir / tool).chmod(0o755)


def _launch(launch: Path, tmp_path: Path, agent: int) -> subprocess.CompletedProcess:
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "HAPMOE_NODE_RANK": str(agent),
           "HAPMOE_ARGS_OUT": str(tmp_path / f"args{agent}")}
    return subprocess.run(["bash", str(launch)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("nvidia-smi") or shutil.which("rocm-smi"),
                    reason="needs bash, and no real nvidia-smi/rocm-smi on PATH")
def test_each_node_checks_its_device_type_at_start_up(tmp_path):
    """launch.sh runs the node's vendor probe before starting its agent: an A100 where the plan put an H100
    stops with a message naming the node and the type it expected, and starts nothing; the right type
    starts; a missing probe tool stops too."""
    run, plan, cluster, script = case("dense_megatron")  # stages H100, H100, A100, A100: agent 0 H100, 1 A100
    write_files(tmp_path / "out", render_launch_files(run, plan, cluster, script), "--out", LAUNCHER_OUTPUT)
    launch = tmp_path / "out" / "launch.sh"
    bindir = _fake_torchrun(tmp_path)
    missing = _launch(launch, tmp_path, 0)
    assert missing.returncode == 3 and "should hold H100 (NVIDIA), but nvidia-smi is not installed" in missing.stderr
    _probe_stub(bindir, "nvidia-smi", "NVIDIA A100-SXM4-80GB")
    wrong = _launch(launch, tmp_path, 0)
    assert wrong.returncode == 3, wrong.stderr
    assert "node 0 (h100-node0) should hold H100, but nvidia-smi reports: NVIDIA A100-SXM4-80GB" in wrong.stderr
    assert not (tmp_path / "args0").exists()  # torchrun never started
    ok = _launch(launch, tmp_path, 1)  # agent 1 runs the A100 stages: it starts
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "args1").exists()
    _probe_stub(bindir, "nvidia-smi", "NVIDIA H100 80GB HBM3\nNVIDIA H100 80GB HBM3")
    assert _launch(launch, tmp_path, 0).returncode == 0 and (tmp_path / "args0").exists()
    assert _launch(launch, tmp_path, 1).returncode == 3  # an H100 where the A100 stages belong


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("rocm-smi") is not None,
                    reason="needs bash, and no real rocm-smi on PATH")
def test_amd_nodes_are_checked_with_rocm_smi(tmp_path):
    """An MI300X stage's node answers through rocm-smi; an MI250X there stops launch.sh."""
    run, plan, cluster, script = case("dense_flagscale")  # A100 (agent 0), then MI300X (agent 1)
    write_files(tmp_path / "out", render_launch_files(run, plan, cluster, script), "--out", LAUNCHER_OUTPUT)
    bindir = _fake_torchrun(tmp_path)
    _probe_stub(bindir, "rocm-smi", "Card Series:  AMD Instinct MI250X")
    wrong = _launch(tmp_path / "out" / "launch.sh", tmp_path, 1)
    assert wrong.returncode == 3 and "should hold MI300X, but rocm-smi reports" in wrong.stderr
    _probe_stub(bindir, "rocm-smi", "GPU[0]: Card Series: AMD Instinct MI300X OAM")
    assert _launch(tmp_path / "out" / "launch.sh", tmp_path, 1).returncode == 0


def _hosts_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.txt"
    path.write_text(text)
    return path


def test_hosts_file_places_the_stages_on_real_nodes(tmp_path):
    """--hosts: the host file and launch.sh use the real names, in stage order, taken per type in the file's
    order (both forms of line); SLURM host files list them per torchrun agent and per rank."""
    run, plan, cluster, script = case("dense_megatron")
    hosts = read_hosts(_hosts_file(tmp_path, "# nodes\nsxm-7 A100-80GB\nh-b slots=8 type=H100\nh-a H100 8\n"),
                       cluster, ProfileSet.load())
    files = render_launch_files(run, plan, cluster, script, hosts=hosts)
    assert files["hostfile"] == "h-b slots=8 type=H100\nsxm-7 slots=8 type=A100\n"
    assert "HAPMOE_A_HOST=h-b; HAPMOE_A_TYPE=H100" in files["launch.sh"]
    assert files["slurm_hostfile.nodes"] == "h-b\nsxm-7\n"
    assert files["slurm_hostfile.ranks"] == "h-b\n" * 8 + "sxm-7\n" * 8
    assert "TEMPLATE" not in files["hostfile"]


@pytest.mark.parametrize("text, message", [
    ("h1 H100\n", "the plan needs 1 A100 node(s) for stage(s) 2,3 (8 GPUs), the file lists 0 (none): 1 short"),
    ("h1 H100\nh1 A100\n", "h1 is listed twice (first on line 1)"),
    ("h1 H100\nx A10\n", "unknown device 'A10'"),
    ("h1 H100 4\nx A100\n", "h1 has 4 GPUs, but the plan is for H100 nodes of 8"),
    ("h1 MI300X\n", "h1 is MI300X, which the cluster does not have"),
    ("h1 H100 slots=8\n", "mix of `key=value` and bare words"),
    # walk53b #13: the refusal listed '-' among the allowed characters and did not say why '-n0' is refused
    ("-n0 H100\n", "'-n0' is not a host name: it may not start with '-' (letters, digits"),
    (".n0 H100\n", "it may not start with '.'"),
    ("n0/x H100\n", "'n0/x' is not a host name: letters, digits, '.', '_' and '-', starting with a letter or digit"),
    # walk55s: a repeated or empty key was taken silently (the last type=; an empty slots= as the node size)
    ("h1 type=H100 type=A100\n", "line 1: type= repeats type= (each once)"),
    ("h1 slots=8 gpus=4 type=H100\n", "line 1: gpus= repeats slots= (each once)"),
    ("h1 slots= type=H100\n", "line 1: slots= has no value"),
    ("h1 ram=8 type=H100\n", "unknown key 'ram'; allowed: slots (or gpus), type"),
])
def test_hosts_file_refusals_name_the_problem(tmp_path, text, message):
    run, plan, cluster, script = case("dense_megatron")
    with pytest.raises(PlannerInputError) as err:
        hosts = read_hosts(_hosts_file(tmp_path, text), cluster, ProfileSet.load())
        render_launch_files(run, plan, cluster, script, hosts=hosts)
    assert err.value.field == "--hosts" and message in str(err.value)


def test_hosts_the_plan_leaves_unused_are_named(tmp_path, tiny, monkeypatch):
    """walk53b #13: `emit --hosts` with 5 H800 nodes for a 4-node plan dropped n4 without a word.  Now solve and
    emit name each listed node the plan places no agent on (here a one-node plan, a file of two).  (The --json run
    prints the first run's search: helpers/cli.py solve_searches_once.)"""
    solve_searches_once(monkeypatch)
    hosts = _hosts_file(tmp_path, "n0 H800\n# spare\nn1 H800 8\n")
    res = CliRunner().invoke(main, ["solve", "--model", str(tiny), "--cluster", "H800:8", "--time-limit", "5",
                                    "--out", str(tmp_path / "p"), "--hosts", str(hosts)])
    assert res.exit_code == 0, res.output
    note = "--hosts: 1 of the 2 node(s) listed are not used by this plan and get no agent"
    said = " ".join(res.output.split())  # the report wraps its notes at the terminal's width
    assert note in said and "n1 (H800, line 3)" in said, res.output
    saved = json.loads((tmp_path / "p" / "plan.json").read_text())  # walk55s: it went to stderr only
    assert any(note in n for n in saved["notes"]) and note in (tmp_path / "p" / "summary.md").read_text()
    quiet = CliRunner().invoke(main, ["solve", "--model", str(tiny), "--cluster", "H800:8", "--time-limit", "5",
                                      "--hosts", str(hosts), "--json", "--quiet"])
    assert quiet.exit_code == 0 and any(note in n for n in json.loads(quiet.stdout)["notes"]), quiet.output
    assert (tmp_path / "p" / "launch" / "hostfile").read_text() == "n0 slots=8 type=H800\n"
    launch_sh = (tmp_path / "p" / "launch" / "launch.sh").read_text()
    assert f"# note: {note}" in launch_sh and "n1 (H800, line 3)" in launch_sh  # the file says so too
    res = CliRunner().invoke(main, ["emit", "--plan", str(tmp_path / "p" / "plan.json"), "--out", str(tmp_path / "e"),
                                    "--hosts", str(hosts)])
    assert res.exit_code == 0, res.output
    assert f"note: {note}" in res.output and "n1 (H800, line 3)" in res.output
    _hosts_file(tmp_path, "n0 H800\n")  # every node used: no note
    res = CliRunner().invoke(main, ["emit", "--plan", str(tmp_path / "p" / "plan.json"), "--out", str(tmp_path / "e"),
                                    "--hosts", str(hosts)])
    assert res.exit_code == 0 and "not used by this plan" not in res.output, res.output
    _hosts_file(tmp_path, "n0 H800 4\n")  # walk55s: emit cannot take --cluster; the advice is to solve again
    res = CliRunner().invoke(main, ["emit", "--plan", str(tmp_path / "p" / "plan.json"), "--out", str(tmp_path / "e"),
                                    "--hosts", str(hosts)])
    assert res.exit_code == 2 and "re-run solve with --cluster H800:NODESx4" in res.output, res.output
    assert "give --cluster" not in res.output


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_srun_places_tasks_in_stage_order_with_real_hosts(tmp_path):
    """A script that runs `srun bash -c "... torchrun ..."`, emitted with --hosts: srun gets
    --distribution=arbitrary and SLURM_HOSTFILE lists the nodes in stage order; without --hosts srun is
    left to the allocation's order, and launch.sh says so."""
    script_path = Path(__file__).parent / "launchers" / "slurm_srun_fsdp_string.sh"
    out = tmp_path / "plan"
    hosts = _hosts_file(tmp_path, "b2 H100\nb1 H100\n")
    res = CliRunner().invoke(main, ["solve", "--megatron-script", str(script_path), "--cluster", "H100:16",
                                    "--backend", "hsdp", "--quiet", "--out", str(out), "--hosts", str(hosts)])
    assert res.exit_code == 0, res.output
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text('#!/bin/bash\n{ echo "SLURM_HOSTFILE=$SLURM_HOSTFILE"; printf "%s\\n" "$@"; } > '
                                 '"$HAPMOE_SRUN_OUT"\n')
    (bindir / "srun").chmod(0o755)
    (bindir / "scontrol").write_text("#!/bin/bash\necho b2\n")
    (bindir / "scontrol").chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "HAPMOE_SRUN_OUT": str(tmp_path / "srun.txt"), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(out / "launch" / "launch.sh")], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    got = (tmp_path / "srun.txt").read_text().splitlines()
    assert got[0] == f"SLURM_HOSTFILE={out / 'launch' / 'slurm_hostfile.nodes'}" and got[1] == "--distribution=arbitrary"
    assert (out / "launch" / "slurm_hostfile.nodes").read_text() == "b2\nb1\n"
    assert "srun places the tasks in stage order" in proc.stderr


@pytest.mark.parametrize("cluster,ep,exported", [("GB200:64", 64, "64"), ("GB200:64", 8, "8"), ("B200:64", 64, None)])
def test_hybridep_is_told_its_nvlink_domain(cluster, ep, exported):
    """HybridEP with EP across the 4-GPU trays of an NVL72 domain is launched with the topology NVIDIA's launcher
    sets (Megatron-Bridge scripts/performance/utils/utils.py): its EP ranks per domain (min(EP, domain)), the rack's
    72-GPU domain and multi-node NVLink on; on 8-GPU hosts nothing is exported (HybridEP's defaults are theirs); the
    hostfile's hosts are the trays (4 slots each) whatever the domain."""
    from helpers.cases import flags_cost_model

    flags = ("--num-layers 4 --hidden-size 1024 --ffn-hidden-size 2048 --num-attention-heads 8 --seq-length 1024 "
             "--max-position-embeddings 1024 --vocab-size 32000 --num-experts 64 --moe-router-topk 2 "
             "--moe-grouped-gemm --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep "
             f"--expert-model-parallel-size {ep} --micro-batch-size 1 --global-batch-size 128 --bf16")
    run, plan, cm = flags_cost_model(flags, cluster)
    files = render_launch_files(run, plan, cm.cluster)
    lines = [f"export NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN={exported}", "export NVLINK_DOMAIN_SIZE=72",
             "export USE_MNNVL=1"]
    assert all((line in files["launch.sh"]) == (exported is not None) for line in lines)
    for name in ("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "NVLINK_DOMAIN_SIZE", "USE_MNNVL"):
        assert (name in files["launch.sh"]) == (exported is not None)
    slots = {ln.split()[1] for ln in files["hostfile"].splitlines() if not ln.startswith("#")}
    assert slots == {"slots=4" if cluster.startswith("GB200") else "slots=8"}
    if exported is not None:
        assert "sbatch --segment=16" in files["launch.sh"]


@pytest.mark.parametrize("cluster,exported", [("GB200:16", False), ("B200:16", False), ("H100:16", True),
                                              ("B200:8,H100:8", True)])
def test_max_connections_1_only_where_megatron_asks_for_it(cluster, exported):
    """TP > 1 needs CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell only (Megatron's validate_args checks it for
    get_device_arch_version() < 10): a plan whose GPUs are all Blackwell leaves it unset, one with any older GPU
    exports it."""
    from helpers.cases import flags_cost_model

    flags = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings "
             "1024 --vocab-size 32000 --tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 1 "
             "--global-batch-size 64 --bf16")
    if "," in cluster:
        flags += " --pipeline-model-parallel-size 2"
    run, plan, cm = flags_cost_model(flags, cluster)
    assert len({s.device_type for s in plan.stages}) == cluster.count(",") + 1
    launch = render_launch_files(run, plan, cm.cluster)["launch.sh"]
    assert ("export CUDA_DEVICE_MAX_CONNECTIONS=1" in launch) == exported


# --------------------------------------------------------------------------------------------
# The allocator setting the memory estimate assumed
# --------------------------------------------------------------------------------------------
def test_the_assumed_allocator_is_set_only_where_nothing_sets_one():
    """An input that states no allocator setting is priced with expandable segments: launch.sh then sets
    PYTORCH_CUDA_ALLOC_CONF, but only where the environment sets neither allocator variable (run here in bash);
    an input script that states its own gets nothing from the planner."""
    import subprocess

    run, plan, cluster, script = case("dense_megatron")
    assert run.training.expandable_segments is None
    text = render_launch_files(run, plan, cluster, script)["launch.sh"]
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "PYTORCH_ALLOC_CONF:-}" in line)
    block = "\n".join(lines[start:start + 1]) + '\necho "${PYTORCH_CUDA_ALLOC_CONF:-unset}"'
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}

    def after(extra: dict[str, str]) -> str:
        return subprocess.run(["bash", "-c", block], env={**env, **extra}, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert after({}) == "expandable_segments:True"
    assert after({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}) == "max_split_size_mb:512"
    assert after({"PYTORCH_ALLOC_CONF": "expandable_segments:False"}) == "unset"
    stated = run.model_copy(update={"training": run.training.model_copy(update={"expandable_segments": False})})
    text = render_launch_files(stated, plan, cluster, script)["launch.sh"]
    assert "PYTORCH_CUDA_ALLOC_CONF" not in text


def _split_host_launch(tmp_path: Path, hosts: str | None = None) -> Path:
    """A plan whose A100 node runs two torchrun agents of 4 GPUs (its type's run of ranks is 8, the H100's 4):
    agent 0 on h100-node0, agents 1 and 2 on a100-node0."""
    run = MegatronRun(model=DENSE, training=TrainingSpec(global_batch_size=16, use_distributed_optimizer=True),
                      parallel=ParallelConfig())
    none = Recompute.none()
    plan = Plan(tp=2, mbs=1, gbs=16, stages=_stages(("H100", 8, 2, none), ("A100", 7, 2, none), ("A100", 7, 2, none)))
    cluster = cluster_of(("H100", 1), ("A100", 1))
    listed = None if hosts is None else read_hosts(_hosts_file(tmp_path, hosts), cluster, ProfileSet.load())
    write_files(tmp_path / "out", render_launch_files(run, plan, cluster, None, hosts=listed), "--out", LAUNCHER_OUTPUT)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "torchrun"  # appends its node rank: two agents of one host run in the background
    fake.write_text('#!/bin/bash\nwhile [[ $# -gt 0 && "$1" != --node-rank ]]; do shift; done\n'
                    'echo "$2" >> "$HAPMOE_RANKS_OUT"\n')
    fake.chmod(0o755)
    return tmp_path / "out" / "launch.sh"


def _ranks_started(launch: Path, tmp_path: Path, **env: str) -> tuple[int, list[int], str]:
    out = tmp_path / "ranks"
    out.unlink(missing_ok=True)
    environ = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "HAPMOE_RANKS_OUT": str(out),
               "HAPMOE_SKIP_NODE_CHECK": "1", "HAPMOE_HOST": "not-a-listed-host", **env}
    proc = subprocess.run(["bash", str(launch)], env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    ranks = sorted(int(r) for r in out.read_text().split()) if out.exists() else []
    return proc.returncode, ranks, proc.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_slurm_nodeid_starts_every_agent_of_its_node(tmp_path):
    """walk54: under `srun --ntasks-per-node=1 bash launch.sh` with template host names, SLURM_NODEID (a node of
    the allocation, the hostfile's line) was taken for a torchrun node rank: the A100 node (SLURM_NODEID 1) started
    agent 1 only, and agent 2 (its other 4 GPUs) never started, so the static rendezvous waited forever."""
    launch = _split_host_launch(tmp_path)
    hostfile = [ln.split()[0] for ln in (tmp_path / "out" / "hostfile").read_text().splitlines()
                if not ln.startswith("#")]
    assert hostfile == ["h100-node0", "a100-node0"]
    assert _ranks_started(launch, tmp_path, SLURM_NODEID="0")[:2] == (0, [0])
    assert _ranks_started(launch, tmp_path, SLURM_NODEID="1")[:2] == (0, [1, 2])
    rc, ranks, err = _ranks_started(launch, tmp_path, SLURM_NODEID="2")
    assert rc == 2 and not ranks and "SLURM_NODEID 2 is not a node of the hostfile (0-1)" in err
    rc, ranks, err = _ranks_started(launch, tmp_path)
    assert rc == 2 and not ranks and "is not in hostfile; set HAPMOE_NODE_RANK or HAPMOE_HOST" in err
    # the host name and HAPMOE_NODE_RANK (one torchrun node rank) as before
    assert _ranks_started(launch, tmp_path, HAPMOE_HOST="a100-node0")[:2] == (0, [1, 2])
    assert _ranks_started(launch, tmp_path, HAPMOE_NODE_RANK="2", SLURM_NODEID="1")[:2] == (0, [2])


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_srun_task_per_agent_starts_its_own_agent_only(tmp_path):
    """walk54: a script's own `srun bash -c "... torchrun ..."` with --hosts runs one task per torchrun agent
    (slurm_hostfile.nodes lists the A100 node twice); each task found its agents by host name, so both tasks on the
    A100 node started agents 1 and 2: four torchruns there, each node rank twice.  launch.sh's srun now tells
    its tasks that task k is agent k (SLURM_PROCID)."""
    launch = _split_host_launch(tmp_path, "hh H100\naa A100\n")
    assert (tmp_path / "out" / "slurm_hostfile.nodes").read_text() == "hh\naa\naa\n"
    text = launch.read_text()
    assert 'HAPMOE_SRUN_TASK_PER_AGENT=$per_agent command srun "$@"' in text
    for task in (1, 2):
        assert _ranks_started(launch, tmp_path, HAPMOE_HOST="aa", SLURM_PROCID=str(task), SLURM_NODEID="1",
                              HAPMOE_SRUN_TASK_PER_AGENT="1")[:2] == (0, [task])
    # an srun of the user's own, one task per node: the host name's agents, all of them
    assert _ranks_started(launch, tmp_path, HAPMOE_HOST="aa", SLURM_PROCID="1", SLURM_NODEID="1")[:2] == (0, [1, 2])


_SMALL_FLAGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 "
                "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 64 --bf16 "
                "--tokenizer-type NullTokenizer --vocab-size 32000 --mock-data --train-iters 10")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_dry_run_skips_the_value_of_every_srun_and_sbatch_option(tmp_path):
    """`launch.sh --dry-run` runs the job script an sbatch submits and the command an srun starts (a `bash -c` string
    with torchrun) past their options.  An option whose value is the next word and that launch.sh's own list lacked
    (-G 16, --gpus-per-task 8, pyxis's --container-image IMG, --mpi pmix) left its value taken for the command:
    `bash 16 --gpus-per-task ...` (no such file) for sbatch, `8 --container-image ...` printed as not run for srun,
    and no node's command either way."""
    (tmp_path / "job.sh").write_text(
        "#!/bin/bash\n"
        f'CMD="torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py {_SMALL_FLAGS}"\n'
        "srun -N 2 --ntasks-per-node 1 --gpus-per-task 8 --container-image nvcr.io/nvidia/pytorch:25.04-py3 "
        '--mpi pmix -G 16 bash -c "$CMD"\n')
    submit = tmp_path / "submit.sh"
    submit.write_text('#!/bin/bash\ncd "$(dirname "$0")"\nsbatch -G 16 --gpus-per-task 8 --ntasks-per-gpu 1 '
                      "--wait-all-nodes 1 job.sh\n")
    out = tmp_path / "plan"
    res = CliRunner().invoke(main, ["solve", "--megatron-script", str(submit), "--cluster", "H100:16",
                                    "--backend", "hsdp", "--quiet", "--out", str(out)])
    assert res.exit_code == 0, res.output
    proc = subprocess.run(["bash", str(out / "launch" / "launch.sh"), "--dry-run"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "No such file" not in proc.stderr and "not run] 16 " not in proc.stderr
    assert "[dry-run, not run] srun -N 2 --ntasks-per-node 1 --gpus-per-task 8" in proc.stderr  # the job script ran
    nodes = [ln for ln in proc.stdout.splitlines() if ln.startswith("torchrun ")]
    assert len(nodes) == 2 and all("pretrain_gpt.py" in ln for ln in nodes), proc.stdout + proc.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_dry_run_skips_the_value_of_an_option_given_by_a_prefix_of_its_name(tmp_path):
    """Slurm reads a long option by an unambiguous prefix of its name (getopt_long), and so does the reader;
    `launch.sh --dry-run` took the value of `--ntasks-per-n 1` (srun) or `--gpus-per-t 8` (sbatch) for the command
    (`1 --gpus-per-t ...` printed as not run, `bash 8 ...`: no such file), and no node's command printed.  An
    option's full name that starts another's (sbatch --wait, --wait-all-nodes) keeps its own reading."""
    (tmp_path / "job.sh").write_text(
        "#!/bin/bash\n"
        f'CMD="torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py {_SMALL_FLAGS}"\n'
        "srun --label -N 2 --ntasks-per-n 1 --gpus-per-t 8 --container-ima nvcr.io/nvidia/pytorch:25.04-py3 "
        'bash -c "$CMD"\n')
    submit = tmp_path / "submit.sh"
    submit.write_text('#!/bin/bash\ncd "$(dirname "$0")"\nsbatch --wait --gpus-per-t 8 --wait-all 1 -N 2 job.sh\n')
    out = tmp_path / "plan"
    res = CliRunner().invoke(main, ["solve", "--megatron-script", str(submit), "--cluster", "H100:16",
                                    "--backend", "hsdp", "--quiet", "--out", str(out)])
    assert res.exit_code == 0, res.output
    proc = subprocess.run(["bash", str(out / "launch" / "launch.sh"), "--dry-run"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "No such file" not in proc.stderr and "not run] 1 " not in proc.stderr, proc.stderr
    assert "[dry-run, not run] srun --label -N 2 --ntasks-per-n 1" in proc.stderr  # the job script ran
    nodes = [ln for ln in proc.stdout.splitlines() if ln.startswith("torchrun ")]
    assert len(nodes) == 2 and all("pretrain_gpt.py" in ln for ln in nodes), proc.stdout + proc.stderr


def test_the_ascend_only_advice_names_no_flag_another_fork_takes():
    """--qk-nope-head-dim and --qk-rope-head-dim are MindSpeed's and Pai-Megatron-Patch's alike (Pai's
    megatron_patch/arguments.py adds both; its examples/deepseek_v3 and moonlight pass them on NVIDIA GPUs): on a job
    without Ascend devices launch.sh's header no longer tells to remove them as MindSpeed's, which would drop the MLA
    head dims Pai's DeepSeek models read; a flag only MindSpeed takes is still named."""
    from types import SimpleNamespace

    from planner.launcher.common import runtime_notes
    from planner.runtime import RunCheck

    plan = SimpleNamespace(stages=[SimpleNamespace(device_type="H100")])
    flags = ["--qk-nope-head-dim", "128", "--qk-rope-head-dim", "64", "--use-fused-rmsnorm"]
    notes = runtime_notes(RunCheck(True, "upstream Megatron-LM runs H100"), plan, flags, ProfileSet.load())
    assert len(notes) == 1 and notes[0].startswith("--use-fused-rmsnorm: MindSpeed's flags (Ascend NPUs only)")
