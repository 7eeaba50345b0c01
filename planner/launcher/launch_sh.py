"""launch.sh: the user's own launcher with the plan applied (or, without one, a generated launcher).

The emitted launch.sh is the input script, byte for byte, with three changes:

1. a block after the shebang that defines `hapmoe_launch` (and reads `--dry-run`);
2. `hapmoe_launch ` inserted before the statement that starts training (`eval` becomes
   `hapmoe_eval`; a launch inside a `bash -c` string or a sourced file is reached through a
   shell function that shadows the launcher, exported to child shells);
3. nothing else: the script keeps its arguments, variables and conditionals, and bash expands
   them at run time as before.

`hapmoe_launch WORDS...` receives the command exactly as the script built it and:
  * removes from the entry script's flags every flag the plan decides (with its values), keeps
    every other flag in order, and appends the plan's flags (`common.apply_plan` is the same
    rule in Python, which writes megatron_args.txt);
  * for torchrun (or `python -m torch.distributed.run`): replaces the placement options
    (nproc-per-node, nnodes, node-rank, rdzv-*) with static rendezvous and an explicit node rank,
    picking this host's agent(s) by HAPMOE_NODE_RANK, the host name (hostfile order puts each
    stage on its device type) or, under srun, SLURM_NODEID; master address and port stay the
    script's when it gives them;
  * behind srun/mpirun (or plain python) the launcher's own options are kept: the scheduler
    places ranks, so its host order must follow the hostfile;
  * with `launch.sh --dry-run ARGS...` prints the command every node would run and exits.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from planner.inputs.script import LauncherScript
from planner.launcher.common import DEFAULT_MASTER_PORT, Agent, FlagItem, arrays_of, bash_item, bash_value

# torchrun options the plan decides (placement); master address/port stay the user's.
PLACEMENT_OPTIONS = ("nproc-per-node", "nnodes", "node-rank", "rdzv-backend", "rdzv-endpoint", "rdzv-id",
                     "rdzv-conf", "standalone", "max-restarts")  # fmt: skip
_SWITCH_OPTIONS = {"standalone"}


@dataclass
class LaunchSpec:
    """Everything launch.sh needs: the agents, the plan's items and what the header says."""

    runtime: str
    entry_script: str  # the entry the plan runs (FlagScale replaces pretrain_gpt.py)
    header: list[str]
    notes: list[str]
    needs_max_connections: bool
    applied: list[FlagItem]
    decided: frozenset[str]
    agents: list[Agent]
    per_agent_items: dict[int, list[FlagItem]] = field(default_factory=dict)
    master_port: str = str(DEFAULT_MASTER_PORT)


def _case_pattern(names: Iterable[str]) -> str:
    return "|".join(sorted(names)) or "--hapmoe-nothing-decided"


def hapmoe_block(spec: LaunchSpec, entry_name: str, shadow: str | None) -> list[str]:
    """The bash functions that apply the plan at the launch statement."""
    lines = ["# ---- hapmoe: the plan, applied where the script launches training ----"]
    lines += _dry_run_and_decided(spec)
    lines += _agent_function(spec)
    lines += ["", "# hapmoe_launch WORDS...: run the script's launch command with the plan applied.",
              "hapmoe_launch() {"]
    lines += _split_launch_words(spec, entry_name)
    lines += _run_without_torchrun()
    lines += _run_agents(spec)
    lines += ["}", "hapmoe_eval() { eval \"hapmoe_launch $*\"; }"]
    if shadow:
        lines += [
            f"# The launch runs inside a string or a sourced file: {shadow} reaches the plan through this function.",
            f"{shadow}() {{ hapmoe_launch {shadow} \"$@\"; }}",
            f"export -f {shadow} hapmoe_launch hapmoe_is_decided hapmoe_agent",
        ]
    lines.append("# ---- end of hapmoe block ----")
    return lines


def _dry_run_and_decided(spec: LaunchSpec) -> list[str]:
    """`--dry-run` read off the arguments, and `hapmoe_is_decided FLAG`: the flags the plan decides."""
    return [
        "HAPMOE_DRY_RUN=${HAPMOE_DRY_RUN:-0}",
        'if [[ "${1:-}" == "--dry-run" ]]; then HAPMOE_DRY_RUN=1; shift; fi',
        "export HAPMOE_DRY_RUN",
        "",
        "# Flags the plan decides: removed (with their values) from what the script passes.",
        "hapmoe_is_decided() {",
        f"    case \"$1\" in {_case_pattern(spec.decided)}) return 0 ;; esac",
        "    return 1",
        "}",
    ]


def _agent_function(spec: LaunchSpec) -> list[str]:
    """`hapmoe_agent K`: agent K's host, its GPUs (when it has part of a host) and its own extra flags."""
    lines = [
        "",
        "# Agent k of the plan: its host, its GPUs, its own extra flags.",
        "hapmoe_agent() {",
        '    HAPMOE_A_CVD=""; HAPMOE_A_EXTRA=()',
        '    case "$1" in',
    ]
    for ag in spec.agents:
        cvd = ",".join(map(str, ag.gpu_ids)) if ag.nproc < ag.host_gpus else ""
        extra = " ".join(bash_item(i) for i in spec.per_agent_items.get(ag.node_rank, []))
        lines.append(
            f"        {ag.node_rank}) HAPMOE_A_HOST={ag.host}; HAPMOE_A_CVD=\"{cvd}\"; HAPMOE_A_EXTRA=({extra}) ;;"
            f"  # {ag.device_type}: ranks {ag.first_rank}-{ag.first_rank + ag.nproc - 1}, stage(s) "
            + ",".join(map(str, ag.stages))
        )
    return lines + [
        "        *) return 1 ;;",
        "    esac",
        "}",
    ]


def _split_launch_words(spec: LaunchSpec, entry_name: str) -> list[str]:
    """hapmoe_launch, first part: the words split into the launcher (torchrun's placement options
    dropped) and the entry script's flags (the decided ones dropped); the entry word to run."""
    plan_words = " ".join(bash_item(i) for i in spec.applied)
    placement = "|".join(dict.fromkeys(f"--{o}|--{o.replace('-', '_')}" for o in PLACEMENT_OPTIONS if o not in _SWITCH_OPTIONS))
    switches = "|".join(dict.fromkeys(f"--{o}|--{o.replace('-', '_')}" for o in _SWITCH_OPTIONS))
    entry_new = spec.entry_script
    lines = [
        "    local -a words=(\"$@\") launcher=() args=() plan=(" + plan_words + ")",
        "    local n=${#words[@]} entry=-1 i tok name skip=0 torch=0 after=0",
        "    for ((i = 0; i < n; i++)); do",
        f"        if [[ \"${{words[i]##*/}}\" == {shlex.quote(entry_name)} ]]; then entry=$i; break; fi",
        "    done",
        "    if ((entry < 0)); then command \"$@\"; return; fi  # not the training launch",
        "    for ((i = 0; i < entry; i++)); do",
        "        tok=${words[i]}",
        "        if ((after == 0)) && [[ \"${tok##*/}\" == torchrun ]]; then torch=1; after=1; launcher+=(\"$tok\"); continue; fi",
        "        if ((after == 0)) && [[ \"$tok\" == torch.distributed.run || \"$tok\" == torch.distributed.launch ]]; then",
        "            torch=1; after=1; launcher+=(\"$tok\"); continue",
        "        fi",
        "        if ((torch)); then",
        "            case \"${tok%%=*}\" in",
        f"                {switches}) continue ;;",
        f"                {placement}) [[ \"$tok\" == *=* ]] || ((i++)); continue ;;",
        "            esac",
        "        fi",
        "        launcher+=(\"$tok\")",
        "    done",
        "    for tok in \"${words[@]:entry+1}\"; do",
        "        if [[ \"$tok\" == -?* && ! \"$tok\" =~ ^-?[0-9]*\\.?[0-9]+([eE][-+]?[0-9]+)?$ ]]; then",
        "            name=${tok%%=*}",
        "            if hapmoe_is_decided \"$name\"; then",
        "                if [[ \"$tok\" == *=* ]]; then skip=0; else skip=1; fi",
        "                continue",
        "            fi",
        "            skip=0",
        "        elif ((skip)); then",
        "            continue",
        "        fi",
        "        args+=(\"$tok\")",
        "    done",
        (f"    local entry_word={bash_value(entry_new)}  # FlagScale's entry replaces {entry_name}"
         if entry_new.rsplit("/", 1)[-1] != entry_name else "    local entry_word=${words[entry]}"),
    ]
    if spec.needs_max_connections:
        lines.append("    export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron needs it with TP or CP > 1 (pre-Blackwell)")
    return lines


def _run_without_torchrun() -> list[str]:
    """hapmoe_launch behind srun / mpirun / python: the command as the script gave it, the plan applied."""
    return [
        "    if ((!torch)); then  # srun / mpirun / python: the scheduler places the ranks",
        "        if [[ \"$HAPMOE_DRY_RUN\" == 1 ]]; then",
        "            printf '%q ' \"${launcher[@]}\" \"$entry_word\" \"${args[@]}\" \"${plan[@]}\"; echo",
        "            exit 0",
        "        fi",
        "        command \"${launcher[@]}\" \"$entry_word\" \"${args[@]}\" \"${plan[@]}\"",
        "        return",
        "    fi",
    ]


def _run_agents(spec: LaunchSpec) -> list[str]:
    """hapmoe_launch with torchrun: this host's agents (or every agent under --dry-run), each with
    static rendezvous, its node rank and the script's master address and port when it gives them."""
    agents = spec.agents
    lines = [
        "    local master=() has_addr=0 has_port=0  # the script's master address/port win",
        "    for tok in \"${launcher[@]}\"; do",
        "        case \"${tok%%=*}\" in --master-addr|--master_addr) has_addr=1 ;; --master-port|--master_port) has_port=1 ;; esac",
        "    done",
        f"    ((has_addr)) || master+=(--master-addr \"${{HAPMOE_MASTER_ADDR:-{agents[0].host}}}\")",
        f"    ((has_port)) || master+=(--master-port \"${{HAPMOE_MASTER_PORT:-{spec.master_port}}}\")",
    ]
    lines += _this_hosts_agents(agents)
    return lines + [
        "    local k status=0",
        "    for k in \"${agents[@]}\"; do",
        f"        hapmoe_agent \"$k\" || {{ echo \"launch.sh: no agent $k (0-{len(agents) - 1})\" >&2; exit 2; }}",
        f"        local -a cmd=(\"${{launcher[@]}}\" --nproc-per-node {agents[0].nproc} --nnodes {len(agents)} "
        "--node-rank \"$k\"",
        "            --rdzv-backend static \"${master[@]}\" \"$entry_word\" \"${args[@]}\" \"${plan[@]}\" \"${HAPMOE_A_EXTRA[@]}\")",
        "        if [[ \"$HAPMOE_DRY_RUN\" == 1 ]]; then",
        "            echo \"# node $k ($HAPMOE_A_HOST)\"",
        "            [[ -n \"$HAPMOE_A_CVD\" ]] && printf 'CUDA_VISIBLE_DEVICES=%s ' \"$HAPMOE_A_CVD\"",
        "            printf '%q ' \"${cmd[@]}\"; echo",
        "        elif ((${#agents[@]} > 1)); then",
        "            CUDA_VISIBLE_DEVICES=${HAPMOE_A_CVD:-${CUDA_VISIBLE_DEVICES:-}} command \"${cmd[@]}\" &",
        "        elif [[ -n \"$HAPMOE_A_CVD\" ]]; then",
        "            CUDA_VISIBLE_DEVICES=$HAPMOE_A_CVD command \"${cmd[@]}\" || status=$?",
        "        else",
        "            command \"${cmd[@]}\" || status=$?",
        "        fi",
        "    done",
        "    [[ \"$HAPMOE_DRY_RUN\" == 1 ]] && exit 0",
        "    if ((${#agents[@]} > 1)); then wait || status=$?; fi",
        "    return $status",
    ]


def _this_hosts_agents(agents: list[Agent]) -> list[str]:
    """The agents to start here: all under --dry-run, else HAPMOE_NODE_RANK's, the host name's
    (hostfile order), or srun's node id."""
    lines = [
        "    local -a agents=()",
        "    if [[ \"$HAPMOE_DRY_RUN\" == 1 ]]; then",
        f"        agents=({' '.join(str(a.node_rank) for a in agents)})",
        "    elif [[ -n \"${HAPMOE_NODE_RANK:-}\" ]]; then",
        "        agents=(\"$HAPMOE_NODE_RANK\")",
        "    else",
        "        case \"${HAPMOE_HOST:-$(hostname -s)}\" in",
    ]
    by_host: dict[str, list[int]] = {}
    for ag in agents:
        by_host.setdefault(ag.host, []).append(ag.node_rank)
    for host, ranks in by_host.items():
        lines.append(f"            {host}) agents=({' '.join(map(str, ranks))}) ;;")
    return lines + [
        "            *) if [[ -n \"${SLURM_NODEID:-}\" ]]; then agents=(\"$SLURM_NODEID\")  # srun: the allocation's node order",
        "               else echo \"launch.sh: host $(hostname -s) is not in hostfile; set HAPMOE_NODE_RANK or HAPMOE_HOST\" >&2; exit 2; fi ;;",
        "        esac",
        "    fi",
    ]


def _comment(lines: Sequence[str]) -> list[str]:
    return ["# " + line if line else "#" for line in lines]


def script_launch_sh(script: LauncherScript, spec: LaunchSpec) -> str:
    """The user's script with the plan applied (see the module docstring)."""
    text = script.text
    site = script.site
    entry_name = script.entry_script.rsplit("/", 1)[-1]
    shadow = None
    if site is not None and site.via == "direct":
        text = text[: site.offset] + "hapmoe_launch " + text[site.offset :]
        how = f"`hapmoe_launch` inserted before `{site.word}` on line {site.line}"
    elif site is not None and site.via == "eval":
        text = text[: site.offset] + "hapmoe_eval" + text[site.offset + len("eval") :]
        how = f"`eval` on line {site.line} became `hapmoe_eval`"
    else:
        shadow = script.launcher[0].rsplit("/", 1)[-1]
        how = f"the launch on line {site.line if site else '?'} reaches the plan through a `{shadow}` shell function"
    lines = text.split("\n")
    shebang = lines[0] if lines and lines[0].startswith("#!") else "#!/bin/bash"
    body = lines[1:] if lines and lines[0].startswith("#!") else lines
    out = [shebang]
    out += _comment(spec.header)
    src = script.path or "the input script"
    out += _comment(["", f"This is {src} with the plan applied: {how}.",
                     "Run it with the same arguments as the input script; `launch.sh --dry-run ARGS...` prints the",
                     "command every node would run."])
    if spec.notes:
        out += _comment([""] + [f"note: {n}" for n in spec.notes])
    out += hapmoe_block(spec, entry_name, shadow)
    out += body
    result = "\n".join(out)
    return result if result.endswith("\n") else result + "\n"


def generated_launch_sh(items: list[FlagItem], spec: LaunchSpec, launcher: Sequence[str] = ("torchrun",)) -> str:
    """A launcher for a run that came without a script: the run's flags in bash arrays per
    concern, and one launch statement through `hapmoe_launch`."""
    live = sorted({m.group(0) for i in items for v in i.values for m in re.finditer(r"\$\{[A-Za-z_]\w*\}", v)})
    out = ["#!/bin/bash"]
    out += _comment(spec.header)
    out += _comment(["", "Run it on every host of the hostfile (or set HAPMOE_NODE_RANK); `launch.sh --dry-run`",
                     "prints the command every node would run."])
    if spec.notes:
        out += _comment([""] + [f"note: {n}" for n in spec.notes])
    out += hapmoe_block(spec, spec.entry_script.rsplit("/", 1)[-1], None)
    out.append("")
    for ref in live:
        name = ref[2:-1]
        out.append(f': "${{{name}:?launch.sh: set {name} (the run\'s flags refer to it)}}"')
    arrays = arrays_of(items)
    for name, arr_items in arrays.items():
        out.append(f"{name}=(")
        out += [f"    {bash_item(i, live)}" for i in arr_items]
        out.append(")")
    refs = " ".join(f'"${{{n}[@]}}"' for n in arrays)
    out.append("")
    out.append(f"hapmoe_launch {' '.join(launcher)} {bash_value(spec.entry_script)} {refs}")
    return "\n".join(out) + "\n"
