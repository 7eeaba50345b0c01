"""The tasks a launcher script's `srun` starts (one GPU each): its own counts, and those it takes from the job.

srun inside a Slurm job takes what it does not give itself from the job's allocation: the job's nodes
(SLURM_NNODES), tasks per node (SLURM_NTASKS_PER_NODE), tasks (SLURM_NTASKS), GPUs (SLURM_GPUS, SLURM_GPUS_PER_NODE),
GPUs per task (SLURM_GPUS_PER_TASK) and tasks per GPU (SLURM_NTASKS_PER_GPU), as the job script's `#SBATCH` lines or
sbatch's own options state them (planner/inputs/shell/builtins.py `sbatch_values`; those the reader takes from
--cluster are not the script's).  So `#SBATCH --nodes=2` and `--ntasks-per-node=8` (or `-N 2`) above a bare
`srun python pretrain_gpt.py` start 16 tasks, 8 on each node.

The GPU options, as Slurm's srun and sbatch man pages define them:

* `--ntasks-per-gpu=N`: N tasks on each GPU: with --ntasks, that many tasks (Slurm sizes the GPUs to them); without,
  N times the GPUs (-G/--gpus, or --gpus-per-node / --gres=gpu:G times the nodes: N x G on each node).  Slurm refuses
  it beside --gpus-per-task or --ntasks-per-node.  Each task is a Megatron rank, one on each GPU (NCCL refuses two
  ranks on one GPU), so N other than 1 is refused.
* `--gpus-per-task=G`: G GPUs for each task; the tasks are those the other counts give, or --gpus=X over G.  A task
  that runs the trainer itself is one process, one Megatron rank on one GPU, so G other than 1 is refused there
  (a torchrun in each task starts the ranks: its own counts are the launch's, planner/inputs/srun_torchrun.py; its
  --nproc-per-node other than G is refused there).

Other than one task on each GPU is refused too, srun's counts or the job's: more tasks on a node than its GPUs
(--ntasks-per-node=8, or --ntasks over --nodes, with --gpus-per-node=4 or --gres=gpu:4), or more tasks than the GPUs
(-G/--gpus), put two ranks on a GPU; fewer (--ntasks-per-node=4 with --gpus-per-node=8) leave GPUs the job holds
idle, as a torchrun in each task of fewer ranks than the task's GPUs does (planner/inputs/srun_torchrun.py).

No count, with the reason, where it is not the script's: srun's node count without -N where the job states none
(the allocation's that runs the script: `sbatch -N 4 train.sh` sets it, not the script); no --ntasks or
--ntasks-per-node in srun or the job, where Slurm starts one task per node, whatever GPUs the nodes hold; and
--ntasks-per-gpu where neither srun nor the job states the GPUs (or the tasks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from planner.inputs.shell.builtins import GPU_KEYS, SchedulerValue, gpu_value, sbatch_options
from planner.inputs.slurm_options import options_end

# srun's own count options, as sbatch_options names them: plain numbers, or the launch states no count
COUNT_KEYS = frozenset({"nodes", "ntasks", "ntasks-per-node", "ntasks-per-gpu", "gpus-per-task"})
BIND_KEYS = frozenset({"gpu-bind", "tres-bind"})  # which GPUs each task sees (planner/inputs/srun_torchrun.py)
# srun's other spelling of a GPU count: --gres=gpu:G is --gpus-per-node=G, --tres-per-task=gres/gpu=G is
# --gpus-per-task=G (planner/inputs/shell/builtins.py `gres_gpus`, `tres_gpus`); each read where it has a GPU entry
SPELT_AS = {"gpus-per-node": "gres", "gpus-per-task": "tres-per-task"}
JOB_NAMES = {"nodes": "SLURM_NNODES", "ntasks": "SLURM_NTASKS", "ntasks-per-node": "SLURM_NTASKS_PER_NODE",
             "ntasks-per-gpu": "SLURM_NTASKS_PER_GPU", "gpus-per-task": "SLURM_GPUS_PER_TASK", "gpus": "SLURM_GPUS",
             "gpus-per-node": "SLURM_GPUS_PER_NODE", "gpu-bind": "SLURM_GPU_BIND",
             "tres-bind": "SLURM_TRES_BIND"}  # the job's variable srun takes each option from


@dataclass(frozen=True)
class SrunTasks:
    """srun's tasks (None: no count the script states), tasks on each node (None: Slurm places them), where the
    counts it takes from the job are stated, why there is no count (None: a count, or one not given as plain
    numbers), and why the launch is refused (None: it is not; the planner prices one rank on each GPU)."""

    world: int | None
    per_node: int | None
    inherited: tuple[str, ...] = ()
    unstated: str | None = None
    refused: str | None = None


@dataclass
class SrunCounts:
    """srun's own options (`own`, as given) and the job's SLURM_* values (`job`), read by option name, srun's own
    first; `taken`: where the job's values read are stated."""

    own: dict[str, str]
    job: Mapping[str, SchedulerValue]
    taken: list[str] = field(default_factory=list)

    def gives(self, key: str) -> bool:
        """srun gives `key` itself (--gres=gpu:G is its --gpus-per-node, --tres-per-task=gres/gpu=G its --gpus-per-task;
        --gres=nvme:1 or --tres-per-task=cpu=4 gives no GPUs)."""
        return self._own_name(key) is not None

    def _own_name(self, key: str) -> str | None:
        """The option of srun's own that gives `key` (`key`, or its SPELT_AS spelling with a GPU entry); None."""
        if key in self.own:
            return key
        other = SPELT_AS.get(key)
        return other if other is not None and gpu_value(other, self.own.get(other, "")) is not None else None

    def take(self, key: str, *, own: bool | None = None, record: bool = True) -> int | None:
        """The value srun runs with: its own where it gives `key` (`own`: True, srun's only; False, the job's only),
        else the job's, its place kept (`record`); None where that is not a plain number."""
        if own if own is not None else self.gives(key):
            name = self._own_name(key) or key
            value = gpu_value(name, self.own.get(name, "")) or ""
            return int(value) if value.isdigit() else None
        stated = self.job.get(JOB_NAMES[key])
        if stated is None or not stated.value.isdigit():
            return None
        if record:
            self.taken.append(stated.source)
        return int(stated.value)

    def given(self, key: str) -> tuple[str, str] | None:
        """The value of `key` as given, not read as a count (srun's own, else the job's), and where; None where
        neither gives it."""
        if key in self.own:
            return self.own[key], f"`srun --{key}={self.own[key]}`"
        stated = self.job.get(JOB_NAMES[key])
        return (stated.value, stated.source) if stated is not None else None

    def where(self, key: str) -> str:
        """Where the value of `key` srun runs with is given."""
        name = self._own_name(key)
        if name is not None:
            return f"`srun --{name}={self.own[name]}`"
        return self.job[JOB_NAMES[key]].source

    def result(self, world: int | None, per_node: int | None, *, unstated: str | None = None,
               refused: str | None = None) -> SrunTasks:
        return SrunTasks(world, per_node, tuple(dict.fromkeys(self.taken)), unstated, refused)


def srun_words(words: list[str]) -> list[str]:
    """srun's own words of a wrapper `srun OPTIONS COMMAND ...`: up to the first word that is neither an option nor an
    option's value (planner/inputs/slurm_options.py), so that `srun numactl -N 0 python ...` does not read numactl's
    -N as srun's nodes."""
    return words[:1 + options_end(words[1:], "srun")]


def _own(words: list[str]) -> dict[str, str]:
    """srun's own count, GPU and GPU-binding options among `words` (`srun_words`), as sbatch_options names them."""
    return {key: value for key, value in sbatch_options(srun_words(words), "srun").items()
            if key in COUNT_KEYS | GPU_KEYS | BIND_KEYS | {"tres-per-task"}}


def srun_counts(words: list[str], job: Mapping[str, SchedulerValue]) -> SrunCounts:
    """The counts of `srun` with options `words` in a job of geometry `job`: its own, else the job's."""
    return SrunCounts(_own(words), job)


def srun_tasks(words: list[str], job: Mapping[str, SchedulerValue]) -> SrunTasks:
    """The tasks of `srun` with options `words` (`srun_words`: its own) in a job whose geometry the script states
    (`job`: the SLURM_* values of its #SBATCH lines and sbatch options, by name); see the module docstring."""
    own = _own(words)
    if any(not (gpu_value(key, value) or "").isdigit() for key, value in own.items() if key in COUNT_KEYS) or \
            gpu_value("tres-per-task", own.get("tres-per-task", "")) == "":
        return SrunTasks(None, None)  # a count that is not a plain number
    counts = SrunCounts(own, job)
    if (both := both_gpus_per_task(counts)) is not None:
        return counts.result(None, None, refused=both)
    if counts.take("ntasks-per-gpu") is not None:
        return _tasks_per_gpu(counts)
    per_task = counts.take("gpus-per-task")
    if per_task is not None and per_task != 1:
        torchrun = (f"start torchrun --nproc-per-node {per_task} in each task (its counts are then the launch's), or "
                    if per_task > 1 else "")
        return counts.result(None, None, refused=(
            f"srun gives each task {per_task} GPUs ({counts.where('gpus-per-task')}) and starts the trainer itself "
            "in each task: one process, so one Megatron rank, where Megatron runs one rank on each GPU; "
            f"{torchrun}give --gpus-per-task=1"))
    tasks = node_tasks(counts)
    if per_task is None or tasks.world is not None:
        return _one_gpu_each(counts, tasks)
    gpus = counts.take("gpus")  # --gpus=X --gpus-per-task=1: X tasks, Slurm's other task count with --gpus-per-task
    return tasks if gpus is None else counts.result(gpus, _even(gpus, counts.take("nodes")))


def _one_gpu_each(counts: SrunCounts, tasks: SrunTasks) -> SrunTasks:
    """`tasks`, refused where srun starts other than one task on each GPU of its nodes (--gpus-per-node, or
    --gres=gpu:G), or of its GPUs (-G/--gpus, or GPUs per node x nodes), srun's own or the job's: each task is a
    Megatron rank, so more tasks put two ranks on a GPU (NCCL refuses two on one GPU), and fewer leave GPUs the job
    holds idle (the step gets all the job's GPUs on each node, srun(1) --gres: "By default, a job step is allocated
    all of the generic resources that have been requested by the job"; SchedMD/slurm
    284c3b95f08a2dc2478499837b03355e1b9c5c75, doc/man/man1/srun.1), as a torchrun of fewer ranks than its task's GPUs
    is refused (planner/inputs/srun_torchrun.py)."""
    if tasks.world is None:
        return tasks
    per_node_gpus = counts.take("gpus-per-node", record=False)
    nodes = counts.take("nodes", record=False)
    if tasks.per_node is not None and per_node_gpus is not None and tasks.per_node != per_node_gpus:
        on = ranks_on_gpus(tasks.per_node, per_node_gpus, "each node's")
        return counts.result(None, None, refused=(
            f"srun starts {tasks.per_node} tasks on each node ({tasks_per_node_where(counts)}) on nodes with "
            f"{per_node_gpus} GPUs each ({counts.where('gpus-per-node')}), each task a Megatron rank: "
            f"{on}; give as many tasks on each node as GPUs "
            f"(--ntasks-per-node={per_node_gpus}) or GPUs as tasks (--gpus-per-node={tasks.per_node})"))
    gpus = counts.take("gpus", record=False)
    key = "gpus" if gpus is not None else "gpus-per-node"
    if gpus is None and per_node_gpus is not None and nodes is not None:
        gpus = per_node_gpus * nodes
    if gpus is not None and tasks.world != gpus:
        stated = counts.where(key) + (f" x {nodes} nodes ({counts.where('nodes')})" if key == "gpus-per-node" else "")
        return counts.result(None, None, refused=(
            f"srun starts {tasks.world} tasks ({tasks_where(counts)}) with {gpus} GPUs ({stated}), each task a "
            f"Megatron rank: {ranks_on_gpus(tasks.world, gpus, 'its')}; give as many tasks as GPUs"))
    return tasks


def ranks_on_gpus(ranks: int, gpus: int, whose: str) -> str:
    """`ranks` Megatron ranks on `gpus` GPUs Slurm gives (`whose`: each task's, each node's): more put two ranks on a
    GPU, which NCCL refuses; fewer leave GPUs the job holds idle, not priced.  The one wording of srun's refusals of
    a launch that is not one rank on each GPU (here, and planner/inputs/srun_torchrun.py)."""
    what = ("more ranks than GPUs, so two would share a GPU, which NCCL refuses" if ranks > gpus else
            f"{gpus - ranks} of {whose} GPUs idle, held by the job but not priced")
    return f"{ranks} rank{'s' if ranks != 1 else ''} on {gpus} GPUs, {what}"


def both_gpus_per_task(counts: SrunCounts) -> str | None:
    """srun given --gpus-per-task and a --tres-per-task with a gres/gpu entry, which Slurm refuses together
    (SchedMD/slurm 284c3b95f08a2dc2478499837b03355e1b9c5c75, src/common/slurm_opt.c
    `_set_tres_per_task_from_sibling_opt_internal`: "You can not have --tres-per-task=gres/gpu= and --gpus-per-task");
    None where it is not."""
    own = counts.own
    if "gpus-per-task" not in own or gpu_value("tres-per-task", own.get("tres-per-task", "")) is None:
        return None
    return (f"srun is given both --gpus-per-task={own['gpus-per-task']} and --tres-per-task={own['tres-per-task']}, "
            "which Slurm refuses together (\"You can not have --tres-per-task=gres/gpu= and --gpus-per-task\"); give "
            "one of them")


def tasks_per_node_where(counts: SrunCounts) -> str:
    """Where srun's tasks on each node are given: --ntasks-per-node, or --ntasks over --nodes (node_tasks)."""
    if counts.gives("ntasks-per-node") or not counts.gives("ntasks"):
        if counts.take("ntasks-per-node", record=False) is not None:
            return counts.where("ntasks-per-node")
    return f"{tasks_where(counts)} over {counts.where('nodes')}"


def tasks_where(counts: SrunCounts) -> str:
    """Where srun's task count is given: --ntasks, else --ntasks-per-node x --nodes (node_tasks)."""
    if counts.gives("ntasks") or counts.take("ntasks-per-node", record=False) is None:
        return counts.where("ntasks")
    return f"{counts.where('ntasks-per-node')} x {counts.where('nodes')}"


def node_tasks(counts: SrunCounts) -> SrunTasks:
    """The tasks srun's node and task counts (its own, else the job's) give."""
    nodes = counts.take("nodes")
    per = counts.take("ntasks-per-node") if counts.gives("ntasks-per-node") or not counts.gives("ntasks") else None
    total = counts.take("ntasks", own=True) if counts.gives("ntasks") else None
    if total is None and per is not None:
        if nodes is None:
            return counts.result(None, None, unstated=(
                f"srun starts {per} tasks on each node of the allocation it runs in, whose node count neither srun "
                "(-N) nor the script's #SBATCH lines (--nodes) state as a plain number; it is set where the job is "
                "submitted"))
        total = nodes * per
    if total is None:
        total = counts.take("ntasks")
    if total is None and nodes is not None:
        return counts.result(None, None, unstated=(
            "neither srun nor the script's #SBATCH lines give --ntasks or --ntasks-per-node, so Slurm starts one "
            "task per node, whatever GPUs it holds"))
    if total is None:
        return counts.result(None, None, unstated=(
            "neither srun nor the script's #SBATCH lines state its nodes or tasks as plain numbers (-N, -n, "
            "--ntasks-per-node); they are the allocation's it runs in, set where the job is submitted"))
    return counts.result(total, per if per is not None else _even(total, nodes))


def _tasks_per_gpu(counts: SrunCounts) -> SrunTasks:
    """The tasks of srun with --ntasks-per-gpu (its own, else the job's): one on each GPU (see the module
    docstring)."""
    per_gpu = counts.take("ntasks-per-gpu")
    for other in ("gpus-per-task", "ntasks-per-node"):
        if counts.take(other) is not None:
            return counts.result(None, None, refused=(
                f"--ntasks-per-gpu ({counts.where('ntasks-per-gpu')}) with --{other} ({counts.where(other)}), which "
                "Slurm refuses together (srun's and sbatch's man pages: --ntasks-per-gpu is not compatible with "
                "--gpus-per-task or --ntasks-per-node); give one of them"))
    if per_gpu != 1:
        return counts.result(None, None, refused=(
            f"srun starts {per_gpu} tasks on each GPU ({counts.where('ntasks-per-gpu')}), each a Megatron rank, "
            "where Megatron runs one rank on each GPU (NCCL refuses two on one GPU); give --ntasks-per-gpu=1"))
    nodes = counts.take("nodes")
    tasks = counts.take("ntasks")
    if tasks is not None:  # Slurm sizes the GPUs to the tasks
        return counts.result(tasks, _even(tasks, nodes))
    own = counts.gives("gpus-per-node") or counts.gives("gpus")  # the step has all the job's GPUs, unless srun asks
    per_node = counts.take("gpus-per-node", own=own) if nodes is not None else None
    gpus = nodes * per_node if nodes is not None and per_node is not None else counts.take("gpus", own=own)
    if gpus is None:
        return counts.result(None, None, unstated=(
            f"srun starts one task on each GPU ({counts.where('ntasks-per-gpu')}) of the allocation it runs in, "
            "whose GPUs neither srun nor the script's #SBATCH lines state as plain numbers (-G/--gpus, or "
            "--gpus-per-node with --nodes); they are set where the job is submitted"))
    return counts.result(gpus, per_node if per_node is not None else _even(gpus, nodes))


def _even(tasks: int, nodes: int | None) -> int | None:
    """Tasks on each node where Slurm spreads `tasks` evenly over `nodes` (None: not stated, or not evenly)."""
    return tasks // nodes if nodes and tasks % nodes == 0 else None
