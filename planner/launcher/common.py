"""Pieces both launchers share: flag items, which flags a launch passes (`launch_flags`, with the
run's model/training flags and the flags the plan decides from planner/megatron/flags.py), quoting,
node placement (stage s on its device type) and the host file.  launch.sh itself is written by
planner/launcher/launch_sh.py.

Terms.  A *flag item* is one option with its values, e.g. ("--num-layers", ["32"]).  An *agent*
is one torchrun process (a launcher "node"): it runs `nproc` ranks; global rank =
node_rank * nproc + local_rank (torchrun, static rendezvous).  Usually an agent is one host;
when the plan needs smaller blocks than a host has GPUs, several agents share a host, each
with its own CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Collection, Iterable, Sequence

from planner.errors import PlannerInputError
from planner.inputs.hosts import Host
from planner.inputs.megatron_flags import drop_flags, fork_flags_in, is_flag_token
from planner.inputs.script import LauncherScript
from planner.inputs.shell.builtins import sbatch_options
from planner.inputs.srun_tasks import srun_words
from planner.launcher.quoting import runtime_refs, sh_word
from planner.megatron.flags import (
    CONCERN_ORDER, PLAN_DECIDED_FLAGS, PRECISION_FLAGS, READ_FLAGS, array_of, model_flags,
    training_flags,
)
from planner.profile_tables import ProfileSet
from planner.runtime import RunCheck, runtime_of
from planner.schemas.cluster import ClusterSpec, pool_members
from planner.schemas.model import ModelSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan, Recompute

DEFAULT_MASTER_PORT = 6000
MEGATRON_ENTRY = "pretrain_gpt.py"


# --------------------------------------------------------------------------------------------
# Flag items
# --------------------------------------------------------------------------------------------
@dataclass
class FlagItem:
    """One option and its values; `array` is the bash array it goes to in launch.sh."""

    name: str
    values: list[str] = field(default_factory=list)
    array: str = ""
    inline: bool = False  # written as `--name=value` in the input

    def tokens(self) -> list[str]:
        if self.inline:
            return [f"{self.name}={self.values[0]}"]
        return [self.name, *self.values]


def group_flag_items(tokens: Sequence[str]) -> list[FlagItem]:
    """Split a flat flag list into items: each option with the values that follow it."""
    items: list[FlagItem] = []
    for tok in tokens:
        if is_flag_token(tok):
            if tok.startswith("--") and "=" in tok:
                name, _, value = tok.partition("=")
                items.append(FlagItem(name, [value], inline=True))
            else:
                items.append(FlagItem(tok))
        elif items and not items[-1].inline:
            items[-1].values.append(tok)
        else:
            items.append(FlagItem(tok))  # a stray value: kept verbatim, in place
    return items


def flatten(items: Iterable[FlagItem]) -> list[str]:
    out: list[str] = []
    for item in items:
        out.extend(item.tokens())
    return out


def apply_plan(user_argv: Sequence[str], applied: Sequence[FlagItem], decided: Iterable[str]) -> list[str]:
    """The entry script's flags after the plan: the user's flags minus every decided flag (with
    the values that follow it; `--flag=value` takes none), then the applied items.  Exactly what
    `hapmoe_launch` does in bash."""
    out = drop_flags(user_argv, set(decided))
    for item in applied:
        out += item.tokens()
    return out


def plan_changes(user_argv: Sequence[str], applied: Sequence[FlagItem], decided: Iterable[str] = ()) -> list[str]:
    """Human-readable notes: which of the user's flags the plan changes, adds or removes."""
    given = {i.name: i for i in group_flag_items(list(user_argv)) if is_flag_token(i.name)}
    applied_names = {i.name for i in applied}
    notes = [f"removed {' '.join(item.tokens())}" for name, item in given.items()
             if name in set(decided) and name not in applied_names]
    for item in applied:
        old = given.get(item.name)
        new = " ".join(item.tokens())
        if old is None:
            notes.append(f"added {new}")
        elif old.tokens() != item.tokens() and " ".join(old.values) != " ".join(item.values):
            notes.append(f"{' '.join(old.tokens())} -> {new}")
    return notes


# --------------------------------------------------------------------------------------------
# Flags the plan writes (the rest of the run's flags are planner/megatron/flags.py's)
# --------------------------------------------------------------------------------------------
def recompute_flag_items(r: Recompute) -> list[FlagItem]:
    """Megatron's global recompute flags for one Recompute."""
    if r.granularity == "none":
        return []
    if r.granularity == "selective":
        return [FlagItem("--recompute-granularity", ["selective"]), FlagItem("--recompute-modules", list(r.modules))]
    return [
        FlagItem("--recompute-granularity", ["full"]),
        FlagItem("--recompute-method", [str(r.method)]),
        FlagItem("--recompute-num-layers", [str(r.num_layers)]),
    ]


def data_default_items(passthrough_names: set[str]) -> list[FlagItem]:
    """Mock data and a NullTokenizer when a run that came without a script names no data or
    tokenizer, so the emitted flags are complete (launch.sh names them in a note)."""
    items: list[FlagItem] = []
    data_flags = {"--data-path", "--mock-data", "--train-data-path", "--data-args-path", "--per-split-data-args-path"}
    if not passthrough_names & data_flags:
        items.append(FlagItem("--mock-data"))
    if "--tokenizer-type" not in passthrough_names:
        items.append(FlagItem("--tokenizer-type", ["NullTokenizer"]))
    return items


def effective_model(model: ModelSpec, plan: Plan) -> tuple[ModelSpec, list[FlagItem]]:
    """The model as the launcher runs it: MoE with ETP > 1 gets --disable-bias-linear
    (Megatron: "Bias in Moe is only supported when ETP==1").  Returns the flags that adds."""
    if model.is_moe and plan.etp > 1 and model.add_bias_linear:
        return model.model_copy(update={"add_bias_linear": False}), [FlagItem("--disable-bias-linear")]
    return model, []


@dataclass(frozen=True)
class LaunchOverrides:
    """What a launch changes beyond the plan (a short trial: `solve --out DIR` writes DIR/trials/): flags
    added on top of the plan's and the user's (`added`), flags of the user's dropped with their values
    (`removed`), and the file each host copies the launch's output to (`log_name`: launch.sh's directory,
    `<log_name>-<host>.log`; `log_dir`: the absolute directory the launcher is written to, where the log goes when
    launch.sh runs as a copy elsewhere, as qsub and bsub run it from their spool)."""

    added: tuple[str, ...] = ()
    removed: frozenset[str] = frozenset()
    log_name: str | None = None
    log_dir: str | None = None


@dataclass
class LaunchFlags:
    """The flags of a launch: what the user's command passes (`user_argv`), what the plan applies
    on top (`applied`: the plan's flags, CLI overrides, flags a rule needs), the flag names
    removed from the user's flags (`decided`), and the result (`final`, megatron_args.txt)."""

    user_argv: list[str]
    applied: list[FlagItem]
    decided: frozenset[str]
    final: list[str]
    notes: list[str]
    generated: list[FlagItem]  # without a script: the run's flags for the generated arrays
    refs: list[str] = field(default_factory=list)  # run-time references (${NAME}) of the user's flags: NAMEs
    priced: PricedFlags | None = None  # with a script: what launch.sh checks the run's own flags against


@dataclass(frozen=True)
class PricedFlags:
    """The flags of the user's command that the price rests on, as the planner read them, for launch.sh to compare
    with what the command passes when it runs (`hapmoe_check_priced`).  The planner reads a script without the
    environment it runs in: a variable's `${X:-default}` read at its default, text bash alone expands (`$(cat
    args.txt)`, an array the reader cannot fill) or a branch the reader could not decide may pass other values
    there, which the plan was not priced with (and a plan-decided flag among them would be replaced silently).

    `names`: every flag compared (the cost model's flags the plan leaves to the user's command, and
    --global-batch-size where the plan keeps the user's batch); `read`: those the command passed as read, with
    their values joined by spaces ('' for a switch); `optional`: flags the plan writes itself, which the command
    may leave out."""

    names: frozenset[str]
    read: dict[str, str]
    optional: frozenset[str] = frozenset()


GLOBAL_BATCH_FLAG = "--global-batch-size"


def priced_flags(user_argv: Sequence[str], applied: Sequence[FlagItem], decided: Collection[str]) -> PricedFlags:
    """The user's flags launch.sh checks at run time (PricedFlags): the cost model's (READ_FLAGS) that no applied
    item replaces, and the global batch where the plan keeps the command's own (a --gbs override replaces it on
    purpose: not checked).  Text the reader left for bash (`$EXTRA`) is not a value."""
    read: dict[str, str] = {}
    for item in group_flag_items(list(user_argv)):
        if is_flag_token(item.name):
            read[item.name] = " ".join(v for v in item.values if not v.startswith(("$", "`")))
    applied_values = {i.name: " ".join(i.values) for i in applied}
    names = {n for n in READ_FLAGS if n not in decided and n not in applied_values}
    optional: set[str] = set()
    planned_gbs = applied_values.get(GLOBAL_BATCH_FLAG)
    if planned_gbs is not None and read.get(GLOBAL_BATCH_FLAG, planned_gbs) == planned_gbs:
        names.add(GLOBAL_BATCH_FLAG)
        optional.add(GLOBAL_BATCH_FLAG)
        read[GLOBAL_BATCH_FLAG] = planned_gbs
    return PricedFlags(frozenset(names), {n: v for n, v in read.items() if n in names}, frozenset(optional))


def launch_flags(
    run: MegatronRun,
    model: ModelSpec,
    plan_items: list[FlagItem],
    script: LauncherScript | None,
    extra_items: Sequence[FlagItem] = (),
    removed: Iterable[str] = (),
) -> LaunchFlags:
    """All flags for the entry script.  With a script: the script's own flags (plus the CLI
    overrides it was planned with), minus the flags the plan decides, plus the plan's flags.
    Without: the run's model/training flags and its passthrough flags, then the plan's.  `extra_items`
    are applied like the plan's; `removed` flags are dropped from the user's without replacement."""
    notes: list[str] = []
    overrides = group_flag_items(list(getattr(script, "extra_flags", []) or [])) if script is not None else []
    planned = {i.name for i in [*extra_items, *plan_items]}
    # the plan's flags replace the user's: a decided flag given with --megatron-args is not written twice
    overrides = [o for o in overrides if o.name not in planned and o.name not in PLAN_DECIDED_FLAGS]
    applied = [*overrides, *extra_items, *plan_items]
    decided = frozenset(PLAN_DECIDED_FLAGS | {i.name for i in applied} | set(removed))
    generated: list[FlagItem] = []
    if script is not None:
        user_argv = list(script.megatron_flags)
    else:
        passthrough = group_flag_items(run.passthrough)
        names = {item.name for item in passthrough}
        generated = [FlagItem(n, v) for n, v in model_flags(model) if n not in names]
        training_items = [FlagItem(n, v) for n, v in training_flags(run.training)]
        if names & set(PRECISION_FLAGS):
            training_items = [i for i in training_items if i.name not in PRECISION_FLAGS]
        generated += [i for i in training_items if i.name not in names]
        defaults = data_default_items(names | {i.name for i in generated})
        for item in defaults:
            notes.append(f"{' '.join(item.tokens())} added: the run names no data or tokenizer; replace it for a real run")
        generated += [i for i in passthrough if i.name not in decided] + defaults
        for item in generated:
            item.array = array_of(item.name)
        generated = _order_items(generated)
        user_argv = flatten(generated)
    final = apply_plan(user_argv, applied, decided)
    changes = plan_changes(user_argv, applied, decided)
    if changes:
        notes.insert(0, "the plan sets: " + "; ".join(changes))
    refs = runtime_refs(flatten(overrides) if script is not None else user_argv)  # the script's own: its text's
    if refs:
        notes.append("expanded by launch.sh when it runs (it stops when one is unset): "
                     + ", ".join(f"${{{r}}}" for r in refs))
    priced = priced_flags(user_argv, applied, decided) if script is not None else None
    return LaunchFlags(user_argv, applied, decided, final, notes, generated, refs, priced)


def array_order(items: list[FlagItem]) -> list[str]:
    """Arrays in launch.sh order (concerns as Megatron's examples write them)."""
    used = {i.array for i in items}
    order = [a for a in CONCERN_ORDER if a in used]
    return order + sorted(a for a in used if a not in order)


def _order_items(items: list[FlagItem]) -> list[FlagItem]:
    rank = {a: k for k, a in enumerate(array_order(items))}
    return sorted(items, key=lambda i: rank[i.array])  # stable: keeps order inside an array


def arrays_of(items: list[FlagItem]) -> dict[str, list[FlagItem]]:
    out: dict[str, list[FlagItem]] = {a: [] for a in array_order(items)}
    for item in items:
        out[item.array].append(item)
    return out


def job_check(plan: Plan, profiles: ProfileSet) -> RunCheck:
    """Whether the plan's runtime can hold the plan's device types in one job (profiles/runtimes.yaml);
    PlannerInputError naming --runtime otherwise, and for a hypothetical runtime's row
    (ProfileSet.assuming): no launcher is written for a job that cannot start."""
    rt = runtime_of(plan.runtime)
    row = profiles.runtime_support(rt.name)
    if row.hypothetical:
        raise PlannerInputError("--runtime", f"{row.title} is hypothetical (it assumes {row.hypothetical}); no "
                                "launcher written: no public runtime runs this job")
    check = rt.can_run(plan.member_types(), profiles)
    if not check.ok:
        other = "flagscale" if rt.name != "flagscale" else "megatron"
        raise PlannerInputError("--runtime", f"{check.reason}; no launcher written (plan it again with --runtime "
                                f"auto, or --runtime {other} where that runs these devices)")
    return check


def runtime_notes(check: RunCheck, plan: Plan | None = None, final_flags: Sequence[str] = (),
                  profiles: ProfileSet | None = None) -> list[str]:
    """What the job needs besides the runtime (a plug-in, a fork, FlagCX), for the launcher's header; and
    MindSpeed's flags on a job without Ascend devices (MindSpeed patches Megatron-LM for Ascend only)."""
    notes = [f"{check.reason}; needs {need}" for need in check.needs]
    mindspeed = fork_flags_in(list(final_flags)).get("MindSpeed", [])
    if mindspeed and plan is not None and profiles is not None and not any(
            profiles.vendor(s.device_type).lower() == "huawei" for s in plan.stages):
        notes.append(f"{', '.join(mindspeed)}: MindSpeed's flags (Ascend NPUs only) on a job without Ascend devices: "
                     "upstream Megatron-LM's parser refuses them; remove them for these devices")
    return notes


# --------------------------------------------------------------------------------------------
# Flag items in the generated shell (values quoted by planner/launcher/quoting.py)
# --------------------------------------------------------------------------------------------
def bash_item(item: FlagItem, live: Collection[str] = ()) -> str:
    """One flag item as bash words: every token through `sh_word`, a ${NAME} in `live` (the run-time
    references of the user's flags) left for bash to expand, all else literal."""
    return " ".join(sh_word(t, live) for t in item.tokens())


def args_file_text(items: Iterable[FlagItem], live: Collection[str] = ()) -> str:
    """megatron_args.txt: one flag per line, as bash words (a run-time reference in `live` as "${NAME}",
    which launch.sh expands); shlex.split of the file gives the argv back, references as ${NAME}."""
    return "\n".join(bash_item(item, live) for item in items) + "\n"


# --------------------------------------------------------------------------------------------
# Placement: stage s -> ranks -> agents -> hosts
# --------------------------------------------------------------------------------------------
@dataclass
class Agent:
    """One torchrun process: node rank, host, device type, ranks, the GPUs it uses."""

    node_rank: int
    host: str
    device_type: str
    first_rank: int
    nproc: int
    stages: list[int]
    gpu_ids: list[int]
    host_gpus: int


def stage_rank_ranges(plan: Plan) -> list[tuple[int, int]]:
    """Global rank range [start, end) of every stage: TP*CP*DP_s consecutive ranks, in stage
    order (Megatron's default order tp-cp-ep-dp-pp, and FlagScale's mesh order)."""
    out, start = [], 0
    for s in plan.stages:
        size = plan.tp * plan.cp * s.dp
        out.append((start, start + size))
        start += size
    return out


def _host_name(device_type: str, k: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", device_type.lower()).strip("-") or "node"
    return f"{slug}-node{k}"


def place_agents(plan: Plan, cluster: ClusterSpec, hosts: Sequence[Host] | None = None) -> list[Agent]:
    """Agents in node-rank order so that stage s lands on its device type.

    nproc (equal on every agent, as torchrun requires) is the largest block that divides every
    run of consecutive same-type ranks and every used host's GPU count.  `hosts` (--hosts): the real
    nodes, taken per type in the file's order; without them, template names (`h800-node0`, ...).
    Raises PlannerInputError("--cluster") when a device type is missing or short of GPUs, and
    PlannerInputError("--hosts") when the file lists fewer nodes of a type than the plan needs."""
    ranges = stage_rank_ranges(plan)
    runs = _type_runs(plan, ranges)
    need = plan.gpus_by_type()
    _check_cluster_has(need, cluster)
    used = [m for m in cluster.device_types if any(m in pool_members(t) for t in need)]  # a pool: its members' nodes
    nodes = _nodes_by_type(used, cluster, hosts)
    nproc = 0
    for size in [b - a for _, a, b, _ in runs] + [gpn for t in used for _, gpn in nodes[t]]:
        nproc = math.gcd(nproc, size)
    if hosts is not None:
        _check_enough_hosts(runs, nodes, nproc)
    # free agent slots per type: (host, gpu ids, host gpus), consumed in order
    slots: dict[str, list[tuple[str, list[int], int]]] = {}
    for t in used:
        for host, gpn in nodes[t]:
            for j in range(gpn // nproc):
                slots.setdefault(t, []).append((host, list(range(j * nproc, (j + 1) * nproc)), gpn))
    agents: list[Agent] = []
    for t, a, b, _stages in runs:
        for first in range(a, b, nproc):
            member = next((m for m in pool_members(t) if slots.get(m)), None)  # a pool: its members in order
            if member is None:
                raise PlannerInputError(
                    "--cluster",
                    f"not enough {t} nodes: with {nproc} GPUs per torchrun agent the plan needs "
                    f"more {t} agents than the cluster's nodes provide",
                )
            host, gpus, gpn = slots[member].pop(0)
            stage_ids = [i for i, (sa, sb) in enumerate(ranges) if sa < first + nproc and sb > first]
            agents.append(Agent(len(agents), host, member, first, nproc, stage_ids, gpus, gpn))
    return agents


def unused_hosts_note(plan: Plan, cluster: ClusterSpec, hosts: Sequence[Host] | None) -> str | None:
    """The note for a --hosts file that lists nodes the plan places no agent on (a file of more nodes than
    the plan uses, or nodes of a type it idles): which ones, by name and line; None when every node is used."""
    if hosts is None:
        return None
    used = {a.host for a in place_agents(plan, cluster, hosts)}
    left = [h for h in hosts if h.name not in used]
    if not left:
        return None
    shown = ", ".join(f"{h.name} ({h.device_type}, line {h.line})" for h in left[:8]) + (", ..." if len(left) > 8 else "")
    return (f"--hosts: {len(left)} of the {len(hosts)} node(s) listed are not used by this plan and get no agent "
            f"(the host file leaves them out): {shown}")


def placement_notes(plan: Plan, cluster: ClusterSpec, hosts: Sequence[Host] | None, script: LauncherScript | None,
                    agents: Sequence[Agent]) -> list[str]:
    """The notes on where the plan runs against what the user gave (also in launch.sh's header): hosts a --hosts
    file lists that get no agent, a script's srun on another number of nodes, and a launch inside a string srun
    starts that its --export keeps launch.sh's functions from."""
    return [n for n in (unused_hosts_note(plan, cluster, hosts), job_nodes_note(script, agents),
                        hidden_launch_note(script)) if n]


def hidden_launch_note(script: LauncherScript | None) -> str | None:
    """The note where the script's srun runs the training inside a string (`srun bash -c "torchrun ..."`) under an
    --export that passes the tasks no function: launch.sh reaches such a launch through exported shell functions
    only, so it stops there rather than start the script's own command without the plan (launch_sh._export_check);
    or where the launch is in a job the script submits with sbatch under such an --export, whatever the launch's
    form: launch.sh stops at the sbatch (launch_sh.sbatch_function)."""
    if script is None:
        return None
    job = script.sbatch_export
    if job is not None:
        return (f"sbatch's --export ({job.where}) starts the job the script submits without launch.sh's functions, "
                "through which the plan reaches the job's training command: launch.sh stops at that sbatch (exit "
                "status 2) rather than submit a job that trains without the plan; give sbatch --export=ALL "
                "(variables may follow: --export=ALL,NAME=VALUE)")
    site = script.site
    if site is None or site.via == "direct" or (site.via == "eval" and not site.nested) or script.outer_env is None:
        return None  # the launch is launch.sh's own statement, or srun runs the program itself (no string between)
    export = script.srun_export
    if export is None or export.all:
        return None
    return (f"srun's --export ({export.where}) gives its tasks none of launch.sh's functions, and the script's training "
            "command runs inside a string srun starts, which the plan reaches only through them: launch.sh stops "
            "there (exit status 2); give that srun --export=ALL (variables may follow: --export=ALL,NAME=VALUE), or "
            "start torchrun by srun itself (`srun torchrun ...`)")


def job_nodes_note(script: LauncherScript | None, agents: Sequence[Agent]) -> str | None:
    """The note where the script's srun runs on another number of nodes than the plan's hosts: its own -N, else
    the job's (`#SBATCH --nodes`, as the script states it).  On fewer, torchrun's static rendezvous would wait for
    the missing nodes forever (launch.sh stops first: launch_sh.srun_function); on more, srun starts tasks on nodes
    that are no host of the plan, which stop.  None where they agree or the script states no count."""
    if script is None or not script.under_srun:
        return None
    hosts = len({a.host for a in agents})
    own = sbatch_options(srun_words(script.wrapper), "srun").get("nodes")
    job = script.job.get("SLURM_NNODES")
    if own is not None:
        nodes, where, fix = own, f"srun's own -N {own}", f"give srun -N {hosts}"
    elif job is not None and job.stated:
        nodes, where, fix = job.value, job.source, f"submit launch.sh with `sbatch --nodes={hosts}` (sbatch's " \
                                                   "options win over the script's #SBATCH lines)"
    else:
        return None
    if not nodes.isdigit() or int(nodes) == hosts:
        return None
    then = ("launch.sh stops before training starts, where torchrun would wait for the missing nodes"
            if int(nodes) < hosts else "srun starts tasks on nodes the plan leaves out, which stop")
    return f"the script's srun runs on {nodes} node(s) ({where}) and the plan on {hosts}: {fix}; as it is, {then}"


def _type_runs(plan: Plan, ranges: list[tuple[int, int]]) -> list[tuple[str, int, int, list[int]]]:
    """Runs of consecutive stages of one device type: (type, first rank, end rank, stages)."""
    runs: list[tuple[str, int, int, list[int]]] = []
    for i, (stage, (a, b)) in enumerate(zip(plan.stages, ranges)):
        if runs and runs[-1][0] == stage.device_type:
            t, start, _, stages = runs[-1]
            runs[-1] = (t, start, b, stages + [i])
        else:
            runs.append((stage.device_type, a, b, [i]))
    return runs


def _check_cluster_has(need: dict[str, int], cluster: ClusterSpec) -> None:
    """Every stage type (a pool: each member) in the cluster, with GPUs enough for the plan."""
    have = cluster.gpus_by_type()
    for t in need:
        missing = [m for m in pool_members(t) if m not in have]
        if missing:
            raise PlannerInputError(
                "--cluster", f"the plan places stages on {', '.join(missing)}, which the cluster does not have "
                f"(it has {', '.join(have) or 'nothing'})"
            )
    short = cluster.shortfalls(need)
    if short:
        raise PlannerInputError("--cluster", short[0].replace("the plan uses", "the plan needs"))


def _nodes_by_type(used: Sequence[str], cluster: ClusterSpec, hosts: Sequence[Host] | None
                   ) -> dict[str, list[tuple[str, int]]]:
    """(name, GPUs) of the nodes of each used device type: the --hosts file's, else template names."""
    nodes: dict[str, list[tuple[str, int]]] = {t: [] for t in used}
    if hosts is not None:
        for h in hosts:
            if h.device_type in nodes:
                nodes[h.device_type].append((h.name, h.gpus))
        return nodes
    for t in used:
        k = 0
        for g in cluster.groups:
            if g.device_type != t:
                continue
            for _ in range(g.num_nodes):
                nodes[t].append((_host_name(t, k), g.gpus_per_node))
                k += 1
    return nodes


def node_names(cluster: ClusterSpec, hosts: Sequence[Host] | None = None) -> dict[str, list[str]]:
    """The names the launcher gives each device type's nodes, in its order: the --hosts file's, else the template
    names of hostfile (`h800-node0`, ...), for every type of the cluster."""
    return {t: [name for name, _ in nodes] for t, nodes in _nodes_by_type(cluster.device_types, cluster, hosts).items()}


def _check_enough_hosts(runs: list[tuple[str, int, int, list[int]]], nodes: dict[str, list[tuple[str, int]]],
                        nproc: int) -> None:
    """--hosts must list as many nodes of each type as the plan's agents fill; the shortfall is named."""
    agents: dict[str, int] = {}
    stages: dict[str, list[int]] = {}
    for t, a, b, ss in runs:
        agents[t] = agents.get(t, 0) + (b - a) // nproc
        stages.setdefault(t, []).extend(ss)
    for t, n in agents.items():
        listed = [node for m in pool_members(t) for node in nodes.get(m, [])]  # a pool: its members' nodes
        per_node = listed[0][1] // nproc if listed else 1
        needed = -(-n // per_node)
        if len(listed) < needed:
            names = ", ".join(name for name, _ in listed) or "none"
            raise PlannerInputError(
                "--hosts", f"the plan needs {needed} {t} node(s) for stage(s) {','.join(map(str, stages[t]))} "
                f"({n * nproc} GPUs), the file lists {len(listed)} ({names}): {needed - len(listed)} short")


TEMPLATE_HEADER = (
    "# TEMPLATE: these host names are made up. Replace each with the name of a node of that type (hostname -s),\n"
    "# keeping the order (node rank = line order, so each stage lands on its device type), or run solve/emit\n"
    "# with --hosts FILE (one line per node: NAME TYPE [GPUS]) to write the real placement.\n"
)


def host_file_type(device_type: str) -> str:
    """A device type as one word of a host file (`type=RTX_4090`): FlagScale's reader takes `type=\\S+`, so
    blanks become `_`; --hosts reads it back (device names match ignoring case, '-', '_' and spaces)."""
    return re.sub(r"\s+", "_", device_type)


def hostfile_text(agents: list[Agent], template: bool = False) -> str:
    """One line per host, in node-rank order: `host slots=N type=T` (FlagScale's and MPI's host-file
    form); a template (made-up names) says so in a comment header."""
    lines: list[str] = []
    seen: dict[str, int] = {}
    order: list[str] = []
    types: dict[str, str] = {}
    for ag in agents:
        if ag.host not in seen:
            order.append(ag.host)
            seen[ag.host] = 0
            types[ag.host] = ag.device_type
        seen[ag.host] += ag.nproc
    for host in order:
        lines.append(f"{host} slots={seen[host]} type={host_file_type(types[host])}")
    return (TEMPLATE_HEADER if template else "") + "\n".join(lines) + "\n"


def slurm_hostfiles(agents: list[Agent]) -> dict[str, str]:
    """SLURM_HOSTFILE for `srun --distribution=arbitrary`, one line per task in rank order: one task per
    torchrun agent (slurm_hostfile.nodes) or one per rank (slurm_hostfile.ranks, srun running python)."""
    nodes = "".join(f"{ag.host}\n" for ag in agents)
    ranks = "".join(f"{ag.host}\n" * ag.nproc for ag in agents)
    return {"slurm_hostfile.nodes": nodes, "slurm_hostfile.ranks": ranks}


def plan_header(plan: Plan, model: ModelSpec, agents: list[Agent]) -> list[str]:
    """Comment lines describing the plan: degrees and one line per stage with its agents."""
    ranges = stage_rank_ranges(plan)
    sizes = [plan.stage_mbs(i) for i in range(plan.pp)]
    varies = len(set(sizes)) > 1  # FlagScale: DP0 x mbs / DP_i samples per DP rank of stage i
    mbs = "/".join(map(str, sizes)) + " (per stage: samples per DP rank, DP0 x mbs / DP)" if varies else str(plan.mbs)
    lines = [
        f"Generated by hapmoe for the {plan.runtime} runtime: {model.name}, {model.num_layers} layers, "
        f"world size {plan.world_size}",
        f"TP={plan.tp} CP={plan.cp} EP={plan.ep} ETP={plan.etp} PP={plan.pp} VPP={plan.vpp} "
        f"mbs={mbs} gbs={plan.gbs} micro-batches={plan.num_microbatches}",
    ]
    for i, (s, (a, b)) in enumerate(zip(plan.stages, ranges)):
        nodes = sorted({ag.node_rank for ag in agents if i in ag.stages})
        lines.append(
            f"stage {i}: {s.device_type}, {s.num_layers} layers, DP={s.dp}, "
            + (f"mbs={sizes[i]}, " if varies else "")
            + f"recompute {s.recompute.label}, ranks {a}-{b - 1}, agents {','.join(map(str, nodes))}"
        )
    return lines
