"""The GPUs a launcher script's own launch uses, on the cluster given (`estimate --megatron-script`).

A script states its GPU count in its launch: torchrun's --nnodes and --nproc-per-node (or its PET_* variables;
under srun, one torchrun in each task: planner/inputs/srun_torchrun.py), srun's nodes and tasks per node, or its
tasks per GPU or GPUs per task (those srun does not give, from the job's own `#SBATCH` lines:
planner/inputs/srun_tasks.py), mpirun's -np (planner/inputs/script.py `world_size`, `gpus_per_node`).  `estimate`
prices the run the script makes: its TP/PP/CP/EP with DP over those GPUs, on the first nodes of the cluster in the
order it lists them (Megatron's rank order over the nodes, as planner/cost/estimate.py places stages), each node
with the script's GPUs per node.  A launch the cluster cannot hold (more GPUs or nodes than it has, more GPUs per
node than its nodes hold) is refused, naming both.

The whole cluster is priced, with a note that says so, where the script states no count: a count that is not a
plain number here, python started by the script itself (whatever runs the script starts the ranks), or a count
that rests on a launch variable the job's environment sets (`NNODES=${NNODES:-1}`: the reader sees the default,
the job gets what its launcher exports), an srun whose nodes or tasks neither it nor the script's #SBATCH lines
state (the allocation's, set where the job is submitted; the SLURM_* counts the reader takes from --cluster are
not the script's).  An srun that starts the trainer as other than one rank on each GPU (--ntasks-per-gpu=2,
--gpus-per-task=8 (or --tres-per-task=gres/gpu=8) without a torchrun in each task, or with one whose --nproc-per-node
is not 8, one task on each node of --gpus-per-node=8 with such a torchrun, more or fewer tasks on a node than the
GPUs it states there, a torchrun in each of several tasks on a node with no GPU bound to each), or with
options Slurm does not combine, is refused, naming the option.

`calibrate --megatron-script` prices the logged run as `estimate` does (planner/api.py `load_estimate_inputs`):
on the GPUs the script launches, with the same notes and refusals; `calibrate --trials` reads each trial's
plan.json, cluster included.

`solve` refuses the same launches (`check_launch`, the one place: the same message and exit status), but does not
price on the script's GPUs: it plans for the whole cluster (the search may leave GPUs idle) and the launcher it
writes sets torchrun's counts to the plan's; where the script launches another count, its "your plan" (the
script's degrees with DP over the whole cluster, as the plans it is compared with) says so (`solve_note`).
`compare` plans for the whole cluster too and prices no plan of the script's (the backends search; the script
gives the model and training only), so it has nothing to say about the script's count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.errors import PlannerInputError
from planner.inputs.cluster import describe_cluster
from planner.inputs.script import LauncherScript
from planner.inputs.shell.lexer import location
from planner.profile_tables import ProfileSet
from planner.schemas.cluster import ClusterSpec, NodeGroup, largest_segment

FIELD = "--megatron-script / --cluster"

# launch variables that hold a GPU, task or node count (the others a launcher sets are ranks, addresses, ids)
COUNT_VARIABLE = re.compile(
    r"WORLD_SIZE|\w*N_?NODES|\w*NUM_NODES|NODE_COUNT|NODE_NUM|HOST_NUM|\w*NPROC_PER_NODE|\w*GPUS_PER_NODE|NGPUS|"
    r"SLURM_(JOB_NUM_NODES|NTASKS\w*|NPROCS|TASKS_PER_NODE|GPUS\w*|JOB_GPUS)|OMPI_COMM_WORLD_(LOCAL_)?SIZE|"
    r"PMIX?_SIZE|MLP_WORKER_(NUM|GPU)|KUBERNETES_CONTAINER_RESOURCE_GPU|LSB_\w*NUM\w*|PBS_\w*(NUM|NP)\w*")


@dataclass(frozen=True)
class ScriptGpus:
    """The part of the cluster a script's run is priced on, and the note that says which and why (None: the
    script launches the whole cluster)."""

    cluster: ClusterSpec
    note: str | None


def script_gpus(script: LauncherScript, cluster: ClusterSpec, profiles: ProfileSet) -> ScriptGpus:
    """The GPUs of `cluster` the script's launch uses (see the module docstring); PlannerInputError naming both
    counts when the cluster cannot hold the launch, or naming srun's option when it is not one rank on each GPU."""
    check_launch(script)
    world, per_node = script.world_size, script.gpus_per_node
    if world is not None and per_node and world % per_node:  # srun -n 12 --ntasks-per-node 8: nodes not all full
        per_node = None
    text = describe_cluster(cluster, profiles)
    whole = f"priced on the whole --cluster ({text}, {cluster.world_size} GPUs)"
    unstated = _unstated(script)
    if unstated is not None or world is None:
        return ScriptGpus(cluster, None if world == cluster.world_size else f"{unstated}: {whole}")
    launch = _launch_words(script, world, per_node)
    if world > cluster.world_size:
        raise PlannerInputError(FIELD, f"the script launches {world} GPUs ({launch}); --cluster "
                                f"{text} has {cluster.world_size}: give a --cluster that holds the "
                                "script's run, or change the script's counts")
    part = first_gpus(cluster, world, per_node, launch, profiles)
    if part == cluster:
        return ScriptGpus(cluster, None)
    nodes = sum(g.num_nodes for g in part.groups)
    fewer = [g for g in part.groups if g.gpus_per_node < cluster.group_of(g.device_type).gpus_per_node]
    return ScriptGpus(part, (
        f"the script launches {world} GPUs ({launch}): priced on those, "
        f"{f'the first {nodes} nodes' if nodes > 1 else 'the first node'} of --cluster {text} "
        f"({describe_cluster(part, profiles)}{f', {fewer[0].gpus_per_node} GPUs on each node' if fewer else ''}); "
        f"its other "
        f"{cluster.world_size - world} GPUs are not priced (the same flags on more GPUs are another run: change "
        "the script's counts)"))


def check_launch(script: LauncherScript) -> None:
    """PlannerInputError (--megatron-script, exit status 2) where the script's launch is not one Megatron rank on
    each GPU it holds (`LauncherScript.refused`: srun's options, a torchrun in each srun task), or starts no rank (a
    count of 0).  The one check of the launch as the script writes it, whatever cluster it runs on: `estimate`,
    `calibrate` (through `script_gpus`) and `solve` apply it."""
    refused = script.refused
    if refused is not None:  # srun --ntasks-per-gpu=2, --gpus-per-task=8 in front of the trainer (or of a torchrun
        # with --nproc-per-node 4): not a rank on each GPU
        site = f", {location(script.path, script.site.line)}" if script.site is not None else ""
        raise PlannerInputError("--megatron-script", f"the script's launch ({_launch_text(script)}{site}): {refused}")
    world, per_node = script.world_size, script.gpus_per_node
    if _unstated(script) is None and world is not None and (world == 0 or per_node == 0):
        # torchrun --nproc-per-node 0, srun -n 0: no rank to price
        raise PlannerInputError("--megatron-script", f"the script's launch ({_launch_words(script, world, per_node)}) "
                                "has a count of 0: it starts no rank; give its counts positive numbers")


def solve_note(script: LauncherScript, cluster: ClusterSpec, profiles: ProfileSet) -> str | None:
    """For solve's "your plan": the script launches a GPU count of its own, not the cluster's (None: the same,
    or no count stated)."""
    world = script.world_size
    if world is None or world == cluster.world_size or _unstated(script) is not None:
        return None
    return (f"the script launches {world} GPUs ({_launch_words(script, world, script.gpus_per_node)}); your plan "
            f"is priced with its degrees over all {cluster.world_size} GPUs of --cluster "
            f"{describe_cluster(cluster, profiles)}, as "
            f"the plans it is compared with; `estimate --megatron-script` prices the run as the script launches it")


def _unstated(script: LauncherScript) -> str | None:
    """Why the script states no GPU count the planner can price, or None when it does."""
    if script.launched_by is None:
        return (f"the script starts {script.entry_script} with python itself, not torchrun, srun or mpirun, so its "
                "GPU count is that of whatever runs the script")
    if script.world_size is None:
        srun = script.srun.unstated if script.launched_by == "srun" else None
        why = f": {srun}" if srun else " states no GPU count as plain numbers"
        return f"the script's launch ({_launch_text(script)}){why}"
    rests = {name: where for name, where in script.launch_defaults.items() if COUNT_VARIABLE.fullmatch(name)}
    if rests:
        named = ", ".join(f"{name} ({where})" for name, where in rests.items())
        return (f"the script's GPU count rests on {named}, set by the job's environment when it runs and unset "
                f"here, where its default launches {script.world_size} GPUs")
    return None


def _launch_text(script: LauncherScript) -> str:
    """The launch's words up to the entry script (the first 100 characters of its options)."""
    words = " ".join([*script.wrapper, *script.launcher, *script.launcher_args])
    return f"{words if len(words) <= 100 else words[:97] + '...'} {script.entry_script}"


def _launch_words(script: LauncherScript, world: int, per_node: int | None) -> str:
    """The launch's counts as the script gives them, and where."""
    site = f", {location(script.path, script.site.line)}" if script.site is not None else ""
    if script.launched_by == "torchrun" and script.under_srun:
        return f"{script.torchrun.words}{site}"
    if script.launched_by == "torchrun" and per_node:
        return f"{' '.join(script.launcher)} --nnodes {world // per_node} --nproc-per-node {per_node}{site}"
    inherited = script.srun.inherited if script.launched_by == "srun" else ()
    site += f"; what srun does not give comes from the job's {', '.join(inherited)}" if inherited else ""
    if per_node:
        nodes = world // per_node
        return f"{script.launched_by}: {nodes} node{'s' if nodes > 1 else ''} x {per_node} tasks{site}"
    return f"{script.launched_by}: {world} tasks{site}"


def first_gpus(cluster: ClusterSpec, world: int, per_node: int | None, launch: str, profiles: ProfileSet
               ) -> ClusterSpec:
    """The first nodes of `cluster`, in the order it lists them, that hold `world` GPUs with `per_node` GPUs on
    each (None: each node's own, as mpirun fills its slots); PlannerInputError when they cannot."""
    groups: list[NodeGroup] = []
    left = world
    for g in cluster.groups:
        if left <= 0:
            break
        nodes, size = _take(g, left, per_node, first_of_type=all(h.device_type != g.device_type for h in groups))
        if size > g.gpus_per_node:
            raise PlannerInputError(FIELD, f"the script starts {size} GPUs on each node ({launch}); the "
                                    f"{g.device_type} nodes of --cluster {describe_cluster(cluster, profiles)} hold "
                                    f"{g.gpus_per_node}: "
                                    "give a --cluster whose nodes hold the script's run, or change its counts")
        if nodes == 0:
            raise PlannerInputError(FIELD, f"the script's {world} GPUs ({launch}) do not fill whole nodes of --cluster "
                                    f"{describe_cluster(cluster, profiles)} ({g.device_type}: {g.gpus_per_node} per "
                                    "node); give the "
                                    "--cluster the script runs on (TYPE:NODESxGPUS)")
        groups.append(_first_nodes(g, nodes, size))
        left -= nodes * size
    if left > 0:
        total = sum(g.num_nodes for g in cluster.groups)
        raise PlannerInputError(FIELD, f"the script launches {world} GPUs ({launch}); --cluster "
                                f"{describe_cluster(cluster, profiles)} "
                                f"has {total} nodes, which hold {world - left} of them: give a --cluster that holds "
                                "the script's run, or change its counts")
    if groups == list(cluster.groups):
        return cluster
    types = {g.device_type for g in groups}
    links = tuple(link for link in cluster.links if set(link.between) <= types)
    return ClusterSpec(name=cluster.name, groups=tuple(groups), links=links)


def _take(group: NodeGroup, left: int, per_node: int | None, *, first_of_type: bool) -> tuple[int, int]:
    """(nodes, GPUs on each) the launch takes of `group` with `left` GPUs still to place: `per_node` on each of
    as many of its nodes as they need; without `per_node`, whole nodes, or one partial node where it is the
    type's only one (a group's nodes are all one size); (0, 0) where neither fits."""
    if per_node is not None:
        return min(group.num_nodes, -(-left // per_node)), per_node
    gpus = min(left, group.num_gpus)
    if gpus % group.gpus_per_node == 0:
        return gpus // group.gpus_per_node, group.gpus_per_node
    if gpus < group.gpus_per_node and first_of_type:
        return 1, gpus
    return 0, 0


def _first_nodes(group: NodeGroup, nodes: int, per_node: int) -> NodeGroup:
    """`nodes` hosts of `group` with `per_node` GPUs each, in scale-up domains of as many of its hosts as the
    group's own domain spans (largest_segment: as sbatch --segment sizes them for a job of that many hosts)."""
    if nodes == group.num_nodes and per_node == group.gpus_per_node:
        return group
    hosts = largest_segment(nodes, group.domain_gpus // group.gpus_per_node)
    fields = group.model_dump() | {"num_nodes": nodes, "gpus_per_node": per_node,
                                   "scale_up_domain_gpus": hosts * per_node if hosts > 1 else None}
    return NodeGroup(**fields)
