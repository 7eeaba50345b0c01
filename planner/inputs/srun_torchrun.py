"""A torchrun in each task of a launch's srun: the ranks it starts, and the GPUs each node runs.

Each srun task runs one torchrun agent (a torchrun "node"), which starts --nproc-per-node ranks
(planner/inputs/torchrun_counts.py).  A node runs srun's tasks on it times that: `srun --ntasks-per-node=2
--gpus-per-task=4 torchrun --nnodes 4 --nproc-per-node 4` runs 8 ranks on each of 2 nodes, not 4 on each of 4.  Tasks
on each node are srun's (planner/inputs/srun_tasks.py `node_tasks`), one where neither srun nor the job gives a task
count (srun(1) -n: "The default is one task per node").

The GPUs a task sees (CUDA_VISIBLE_DEVICES, those `--nproc-per-node gpu` or `auto` start one rank on each of), as
Slurm gives them (SchedMD/slurm 284c3b95f08a2dc2478499837b03355e1b9c5c75):

* --gpus-per-task=G binds G GPUs to each task (srun(1): it "will implicitly set --tres-bind=gres/gpu:per_task:G";
  src/common/slurm_opt.c `_implicitly_bind_tres_per_task`), as --gpu-bind=per_task:G or --tres-bind=gres/gpu:per_task:G
  do, and as --tres-per-task=gres/gpu=G (also `gres/gpu:TYPE=G`, or an entry of a list `cpu=4,gres/gpu=G`: the same
  option in Slurm, planner/inputs/shell/builtins.py `tres_gpus`); another binding (closest, map, mask, single) is not
  a count the script states; `none` binds none.
* Otherwise Slurm binds no GPU to a task (srun(1) --tres-bind: "By default, most tres are not bound to individual
  tasks"; src/interfaces/gres.c `_get_usable_gres` narrows a task's GPUs only under a tres-bind): each task sees every
  GPU the step has on its node, --gres=gpu:N or --gpus-per-node=N (srun's, else the job's, all of which a step gets by
  default).  Several tasks on a node then start their ranks on the same GPUs: Megatron puts local rank k on GPU k
  (megatron/training/initialize.py `_initialize_distributed`: torch.cuda.set_device(args.local_rank);
  NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553), so each task's first rank is on GPU 0.

Refused, naming the options: ranks other than the GPUs Slurm binds to the task (more: two ranks on a GPU, which NCCL
refuses; fewer: GPUs the job holds idle), or than the GPUs of its node where srun runs one task on each node and binds
none (`srun --ntasks-per-node=1 --gpus-per-node=8 torchrun --nproc-per-node 4`: the task sees the node's 8 GPUs, as
with --gpus-per-task=8; a plain torchrun on a node of more GPUs is priced on its ranks, since a script without Slurm
holds no GPUs of its own: the others are the cluster's, not the job's); `gpu` or `auto` where the script states no
GPUs for the task; several tasks on a node with no GPU bound to each (unless the script sets CUDA_VISIBLE_DEVICES for
torchrun itself, which then decides the GPUs a task sees); srun given both --gpus-per-task and --tres-per-task's GPUs
(Slurm refuses the pair); and srun tasks other than torchrun's --nnodes agents (its rendezvous waits for --nnodes
agents, MIN:MAX at most MAX).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from planner.inputs.shell.builtins import SchedulerValue
from planner.inputs.srun_tasks import (
    SrunCounts, both_gpus_per_task, node_tasks, ranks_on_gpus, srun_counts, tasks_per_node_where, tasks_where,
)
from planner.inputs.torchrun_counts import PER_GPU, TorchrunCount


@dataclass(frozen=True)
class TorchrunTasks:
    """The ranks of a torchrun in each srun task (None: not a count the script states), the ranks on each node
    (None: as torchrun's --nproc-per-node alone where srun's tasks per node are not stated), the launch's counts in
    words, and why it is refused (None: it is not)."""

    world: int | None
    per_node: int | None
    words: str = ""
    refused: str | None = None


@dataclass(frozen=True)
class _TaskGpus:
    """The GPUs each task sees (None: not a count the script states), where that is given, and whether Slurm binds
    them to the task (False: every task on a node sees the step's GPUs of the node)."""

    count: int | None
    where: str
    bound: bool


def torchrun_tasks(words: list[str], job: Mapping[str, SchedulerValue], nproc: TorchrunCount, nnodes: TorchrunCount,
                   env: Mapping[str, str]) -> TorchrunTasks:
    """The ranks a torchrun (counts `nproc`, `nnodes`; environment `env`) starts in each task of `srun` (options
    `words`, in a job of geometry `job`); see the module docstring."""
    counts = srun_counts(words, job)
    if (both := both_gpus_per_task(counts)) is not None:
        return TorchrunTasks(None, None, refused=both)
    seen = _task_gpus(counts, env)
    tasks, per_node = _agents(counts)
    if per_node is not None and per_node > 1 and not seen.bound:
        return TorchrunTasks(None, None, refused=_shared(counts, per_node, seen, nproc))
    if nproc.value in PER_GPU:
        if seen.count is None:
            return TorchrunTasks(None, None, refused=_unknown(nproc, seen))
        ranks = seen.count
    elif nproc.value.isdigit():
        ranks = int(nproc.value)
    else:
        return TorchrunTasks(None, None)  # `cpu`, `$N`: not a GPU count the script states
    if seen.bound and seen.count is not None and seen.count != ranks:
        return TorchrunTasks(None, None, refused=_not_the_tasks_gpus(seen, ranks, nproc.given))
    if not seen.bound and per_node == 1 and seen.count is not None and seen.count != ranks:
        return TorchrunTasks(None, None, refused=_not_the_nodes_gpus(counts, seen, ranks, nproc.given))
    agents, least = nnodes.number, nnodes.least
    if agents is not None and least is not None and tasks is not None:
        if not least <= tasks <= agents:
            return TorchrunTasks(None, None, refused=_not_the_agents(counts, tasks, nnodes))
        agents = tasks
    if agents is None:
        return TorchrunTasks(None, None)
    each = per_node * ranks if per_node is not None else ranks
    return TorchrunTasks(agents * ranks, each, _words(agents, ranks, per_node, nproc))


def _agents(counts: SrunCounts) -> tuple[int | None, int | None]:
    """srun's tasks, each a torchrun agent, and the tasks on each node (None: not stated): srun's counts, else one
    task on each node where neither srun nor the job gives a task count."""
    tasks = node_tasks(counts)
    if tasks.world is not None:
        return tasks.world, tasks.per_node
    if _no_task_count(counts):
        return counts.take("nodes", record=False), 1
    return None, None


def _no_task_count(counts: SrunCounts) -> bool:
    """Neither srun nor the job gives a task count: Slurm starts one task on each node."""
    return all(counts.given(key) is None for key in ("ntasks", "ntasks-per-node", "ntasks-per-gpu"))


def _task_gpus(counts: SrunCounts, env: Mapping[str, str]) -> _TaskGpus:
    """The GPUs each task sees (see the module docstring); where the script sets CUDA_VISIBLE_DEVICES for torchrun
    (`env`), those, which are not a count it states."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return _TaskGpus(None, "the CUDA_VISIBLE_DEVICES the script sets for torchrun", bound=True)
    binding = _binding(counts)
    if binding is not None and binding[0] != "none":
        kind, where = binding
        m = re.fullmatch(r"per_task:(\d+)", kind)
        return _TaskGpus(int(m.group(1)) if m else None, where, bound=True)
    per_task = counts.take("gpus-per-task", record=False)
    if per_task is not None and binding is None:
        return _TaskGpus(per_task, counts.where("gpus-per-task"), bound=True)
    per_node = counts.take("gpus-per-node", record=False)
    return _TaskGpus(per_node, counts.where("gpus-per-node") if per_node is not None else "", bound=False)


def _binding(counts: SrunCounts) -> tuple[str, str] | None:
    """The GPU binding srun runs with (`per_task:4`, `none`, `closest`, `map:0,1`) and where it is given: its own
    --tres-bind or --gpu-bind, else the job's; None where none is given."""
    for key in ("tres-bind", "gpu-bind"):
        given = counts.given(key)
        if given is None:
            continue
        value, where = given
        if key == "tres-bind":  # `gres/gpu:[verbose,]TYPE[+gres/nic:...]`
            entry = next((e for e in value.split("+") if e.startswith("gres/gpu:")), None)
            if entry is None:
                continue
            value = entry.removeprefix("gres/gpu:")
        return value.removeprefix("verbose,"), where
    return None


def _shared(counts: SrunCounts, per_node: int, seen: _TaskGpus, nproc: TorchrunCount) -> str:
    """Several tasks on a node, each running torchrun, with no GPU bound to each: they share the node's GPUs."""
    gpus = f"all {seen.count} GPUs of its node ({seen.where})" if seen.count is not None else "all the GPUs of its node"
    return (f"srun starts {per_node} tasks on each node ({tasks_per_node_where(counts)}), a torchrun in each "
            f"({nproc.given}), and binds no GPU to a task: each task sees {gpus}, and Megatron puts each torchrun's "
            "local rank k on GPU k (torch.cuda.set_device(local_rank)), so the tasks' ranks share GPUs, which NCCL "
            "refuses; run one task on each node with --nproc-per-node set to its GPUs, or give srun "
            "--gpus-per-task=G (each task then sees its own G GPUs)")


def _unknown(nproc: TorchrunCount, seen: _TaskGpus) -> str:
    """`--nproc-per-node gpu|auto` where the GPUs each task sees are not stated."""
    why = (f"{seen.where} binds them, which states no count" if seen.bound else
           "neither srun nor the script's #SBATCH lines state them (--gpus-per-task, or --gres=gpu:N / "
           "--gpus-per-node with one task on each node)")
    return (f"torchrun ({nproc.given}) starts one rank on each GPU its srun task sees, and {why}; give torchrun "
            "--nproc-per-node N, or srun --gpus-per-task=N")


def _not_the_tasks_gpus(seen: _TaskGpus, ranks: int, nproc_words: str) -> str:
    """torchrun's ranks are not the GPUs Slurm binds to its task: more put two ranks on a GPU (NCCL refuses that, or
    a rank's device is not there); fewer leave GPUs the job holds idle, and the GPUs per node are not the job's."""
    gpus = seen.count or 0
    on = ranks_on_gpus(ranks, gpus, "each task's")
    return (f"srun gives each task {gpus} GPUs ({seen.where}) and starts torchrun in each task with {nproc_words}: "
            f"{on}; give torchrun --nproc-per-node {gpus}, or srun "
            f"--gpus-per-task={ranks}")


def _not_the_nodes_gpus(counts: SrunCounts, seen: _TaskGpus, ranks: int, nproc_words: str) -> str:
    """One task on each node, which sees all the GPUs the step has there (no GPU bound to it), running a torchrun of
    other ranks than those GPUs: as `_not_the_tasks_gpus`, the node's GPUs are the task's."""
    gpus = seen.count or 0
    tasks = ("Slurm's one task on each node without a task count" if _no_task_count(counts) else
             tasks_per_node_where(counts))
    on = ranks_on_gpus(ranks, gpus, "each node's")
    return (f"srun starts one task on each node ({tasks}), which sees all {gpus} GPUs of its node ({seen.where}), and "
            f"starts torchrun in it with {nproc_words}: {on}; give torchrun --nproc-per-node {gpus}, or ask Slurm for "
            f"{ranks} GPUs on each node (--gpus-per-node={ranks})")


def _not_the_agents(counts: SrunCounts, tasks: int, nnodes: TorchrunCount) -> str:
    """srun's tasks, each a torchrun agent, are not the agents torchrun's rendezvous waits for."""
    where = (f"one on each node of {counts.where('nodes')}, as Slurm starts them without a task count"
             if _no_task_count(counts) else tasks_where(counts))
    return (f"srun starts {tasks} tasks ({where}), a torchrun agent in each, and torchrun "
            f"({nnodes.given}) waits for {nnodes.value} agents in its rendezvous; give torchrun --nnodes {tasks} "
            "(the tasks, not the nodes, where srun runs several tasks on a node)")


def _words(agents: int, ranks: int, per_node: int | None, nproc: TorchrunCount) -> str:
    """The launch's counts: srun's tasks (torchrun agents) and the ranks torchrun starts in each."""
    nodes = agents // per_node if per_node else None
    on = f" on {nodes} node{'s' if nodes != 1 else ''}" if nodes else ""
    tasks, each = f"{agents} task{'s' if agents != 1 else ''}", f"{ranks} rank{'s' if ranks != 1 else ''}"
    return f"srun: {tasks}{on}, a torchrun of {each} in each ({nproc.given})"
