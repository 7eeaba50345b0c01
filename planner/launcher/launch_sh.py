"""launch.sh: the user's own launcher with the plan applied (or, without one, a generated launcher).

The emitted launch.sh is the input script, byte for byte, with three changes:

1. a block after the shebang and the script's leading comments that defines `hapmoe_launch` (and reads
   `--dry-run`): a scheduler reads its directives (`#SBATCH`, `#PBS`, `#BSUB`, `#flux:`) only up to the script's
   first command (sbatch(1): "sbatch will stop processing further #SBATCH directives once the first non-comment
   non-whitespace line has been reached"), so none may come before them;
2. `hapmoe_launch ` inserted before the statement that starts training (`eval` becomes
   `hapmoe_eval`; a launch inside a `bash -c` string, a sourced file or a job the script submits
   with sbatch is reached through a shell function that shadows the launcher, exported to child
   shells, and where srun or mpirun there starts the program itself, which no function reaches,
   through srun()/mpirun() handing it to hapmoe_launch; a job sbatch would start without those
   functions, under --export=NONE, is stopped at the sbatch);
3. nothing else: the script keeps its arguments, variables and conditionals, and bash expands
   them at run time as before.

`hapmoe_launch WORDS...` receives the command exactly as the script built it and:
  * removes from the entry script's flags every flag the plan decides (with its values), keeps
    every other flag in order, and appends the plan's flags (`common.apply_plan` is the same
    rule in Python, which writes megatron_args.txt);
  * stops (exit 2) when the command passes other priced flags than the planner read from the script
    (`hapmoe_check_priced`, common.PricedFlags: an environment variable's default read in place of the
    run's value, text only bash expands), unless HAPMOE_ALLOW_UNPRICED=1;
  * for torchrun (or `python -m torch.distributed.run`): replaces the placement options
    (nproc-per-node, nnodes, node-rank, rdzv-*) with static rendezvous and an explicit node rank,
    picking this host's agent(s) by HAPMOE_NODE_RANK, the host name (hostfile order puts each
    stage on its device type) or, under srun, SLURM_NODEID; master address and port stay the
    script's when it gives them (--master-addr/--master-port, or the host and port of its
    --rdzv-endpoint where the host names are a template), but where launch.sh's srun placed the tasks (--hosts)
    node 0's host, the host file's first (the script's master is the allocation's first node, as a rule; ranks
    srun starts get it as MASTER_ADDR); where srun runs torchrun itself
    (`srun [OPTIONS] torchrun ...`), each task srun starts runs hapmoe_launch for its own node;
  * behind srun/mpirun (or plain python) the launcher's own options are kept: the scheduler
    places ranks, so its host order must follow the hostfile;
  * with `launch.sh --dry-run ARGS...` prints the command every node would run and exits; before
    that, nothing of the script runs but read-only tools (DRY_RUN_TOOLS): every other command,
    however it is started (xargs, a `bash -c` string), prints itself instead.

Every value from the input in the block (device types, host names, flags, the entry script's name)
is written by planner/launcher/quoting.py (`sh_quote`, `sh_word`, `comment_lines`); the block's
function and variable names are the planner's own.  What `--dry-run` does not stop: a redirection in
the script itself (`> FILE`) still writes FILE, and a program the script runs by its full path
(`/usr/bin/cp`) still runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from planner.inputs.script import LauncherScript
from planner.inputs.slurm_options import LONG_NAMES, VALUED, Scheduler
from planner.launcher.common import DEFAULT_MASTER_PORT, Agent, FlagItem, PricedFlags, arrays_of, bash_item
from planner.launcher.quoting import comment_lines, one_line, sh_quote
from planner.profile_tables import ProfileSet

# torchrun options the plan decides (placement); master address/port stay the user's.
PLACEMENT_OPTIONS = ("nproc-per-node", "nnodes", "node-rank", "rdzv-backend", "rdzv-endpoint", "rdzv-id",
                     "rdzv-conf", "standalone", "max-restarts")  # fmt: skip
_SWITCH_OPTIONS = {"standalone"}


@dataclass(frozen=True)
class NodeCheck:
    """How launch.sh checks that a node holds a device type: its vendor's probe command, the names the
    probe may print for it, and the variable that selects a process's devices."""

    device_type: str
    vendor: str
    probe: str | None  # None: no probe known for the vendor (the check is skipped, and says so)
    names: tuple[str, ...]
    visible_devices: str = "CUDA_VISIBLE_DEVICES"


@dataclass
class LaunchSpec:
    """Everything launch.sh needs: the agents, the plan's items and what the header says."""

    runtime: str
    entry_script: str  # the entry the plan runs (FlagScale replaces pretrain_gpt.py)
    header: list[str]
    notes: list[str]
    max_connections: int | None  # the CUDA_DEVICE_MAX_CONNECTIONS launch.sh exports (None: none)
    applied: list[FlagItem]
    decided: frozenset[str]
    agents: list[Agent]
    per_agent_items: dict[int, list[FlagItem]] = field(default_factory=dict)
    master_port: str = str(DEFAULT_MASTER_PORT)
    node_checks: dict[str, NodeCheck] = field(default_factory=dict)  # device type -> how to check a node
    real_hosts: bool = False  # host names from --hosts (else the template's): SLURM placement is emitted
    refs: list[str] = field(default_factory=list)  # variables the plan's flags refer to (${NAME}): checked set
    log_name: str | None = None  # copy this host's output to HAPMOE_DIR/<log_name>-<host>.log (LaunchOverrides)
    log_dir: str | None = None  # where the launcher was written: the log's place when launch.sh runs as a copy
    exports: dict[str, str] = field(default_factory=dict)  # more environment the plan needs (name -> value)
    allocator_default: str | None = None  # PYTORCH_CUDA_ALLOC_CONF when the environment sets none (allocator_env)
    priced: PricedFlags | None = None  # the user's flags the price rests on, as read: checked when the launch runs


def node_checks(device_types: Iterable[str], profiles: ProfileSet) -> dict[str, NodeCheck]:
    """How launch.sh checks each device type's nodes (profiles/runtimes.yaml `probes`, the device's names)."""
    out: dict[str, NodeCheck] = {}
    for t in dict.fromkeys(device_types):
        vendor = profiles.vendor(t)
        probe = profiles.probe(vendor)
        out[t] = NodeCheck(t, vendor, probe.probe if probe else None, profiles.reported_names(t),
                           probe.visible_devices if probe else "CUDA_VISIBLE_DEVICES")
    return out


def _case_pattern(values: Iterable[str]) -> str:
    """A `case` pattern that matches exactly these values (each quoted: no glob, no expansion)."""
    return "|".join(sh_quote(v) for v in sorted(values)) or "--hapmoe-nothing-decided"


def _ere(text: str) -> str:
    """`text` as a POSIX extended regular expression matching it literally (a control character, which
    grep cannot take in a pattern, matches any character)."""
    return re.sub(r"[][\\.^$*+?(){}|]", lambda m: "\\" + m.group(0), re.sub(r"[\x00-\x1f\x7f]", ".", text))


SHADOWED_LAUNCHERS = re.compile(r"torchrun|python[0-9.]*")
"""The launcher words a shell function may stand in for (planner/inputs/shell/interp.launch_split): the only
input that names a function in launch.sh, and only when it is one of these."""


def _launch_functions(spec: LaunchSpec) -> str:
    """The block's functions hapmoe_launch calls where the training starts (in a task srun starts, too)."""
    out = "hapmoe_launch hapmoe_is_decided hapmoe_agent hapmoe_check_node hapmoe_first_host hapmoe_dry"
    out += " hapmoe_need_refs" if spec.refs else ""
    return out + (" hapmoe_priced_read hapmoe_check_priced" if spec.priced is not None else "")


def hapmoe_block(spec: LaunchSpec, entry_name: str, shadow: str | None, sbatch_job: bool = False) -> list[str]:
    """The bash functions that apply the plan at the launch statement; `sbatch_job`: the launch is in a job the
    script submits with sbatch (sbatch_function)."""
    lines = ["# ---- hapmoe: the plan, applied where the script launches training ----"]
    lines += _dry_run_and_decided(spec)
    lines += _log_lines(spec)
    lines += dry_run_stubs(spec)
    lines += _refs_function(spec)
    lines += _priced_function(spec)
    lines += _agent_function(spec)
    lines += node_check_function(spec)
    lines += _first_host_function()
    job_log = sbatch_job and spec.log_name is not None
    lines += ["", "# hapmoe_launch WORDS...: run the script's launch command with the plan applied.",
              "hapmoe_launch() {"] + ([_JOB_LOG] if job_log else [])
    lines += _split_launch_words(spec, entry_name)
    lines += _run_without_torchrun(spec)
    lines += _run_agents(spec)
    lines += ["}", "hapmoe_eval() { eval \"hapmoe_launch $*\"; }"]
    exported = _launch_functions(spec) + " hapmoe_slurm_valued srun"
    exported += " hapmoe_runs_program hapmoe_srun_runs_program hapmoe_mpi_shell hapmoe_mpi_dry mpirun mpiexec" if shadow else ""
    exported += " hapmoe_log" if job_log else ""
    exported += f" {shadow}" if shadow and shadow != "srun" else ""
    lines += srun_function(spec, entry_name, shadowed=shadow is not None, job_log=job_log)
    lines += program_functions(entry_name, exported) if shadow else []
    lines += sbatch_function(entry_name) if sbatch_job else []
    if shadow and shadow != "srun":
        if not SHADOWED_LAUNCHERS.fullmatch(shadow):
            raise ValueError(f"launcher word {shadow!r} cannot name a shell function")
        lines += [
            f"# The launch runs inside a string or a sourced file: {shadow} reaches the plan through this function.",
            f"{shadow}() {{ hapmoe_launch {shadow} \"$@\"; }}",
        ]
    lines += [f"export -f {exported}", "# ---- end of hapmoe block ----"]
    return lines


# --dry-run runs only what reads: the tools of DRY_RUN_TOOLS (the script computes values with them); any other
# command found on PATH prints itself instead ("[dry-run, not run] ...") and succeeds.  PATH points nowhere during
# a dry run, so every program, whatever runs it (xargs, a `bash -c` string), reaches command_not_found_handle,
# which runs the tools from the real PATH; the commands of DRY_RUN_STUBS are shell functions besides, in case the
# script puts a directory of its own on PATH.  Both are exported, so child shells see them.
DRY_RUN_TOOLS = ("basename", "dirname", "realpath", "readlink", "date", "hostname", "whoami", "id", "uname", "nproc",
                 "seq", "expr", "cat", "head", "tail", "cut", "tr", "wc", "sort", "uniq", "grep", "egrep", "fgrep",
                 "sed", "awk", "gawk", "mawk", "shuf", "printenv", "getconf", "ls", "stat", "du", "df", "free", "find",
                 "scontrol", "bash", "sh")
"""Read-only tools a dry run runs: `find` without -exec/-delete/-fprint, `sed` without -i, `sort` without -o,
`scontrol show` only; `sh` runs as bash (which sees the exported stubs)."""
DRY_RUN_STUBS = ("mpirun", "mpiexec", "salloc", "scancel", "torchrun", "deepspeed", "xargs", "parallel",
                 "mkdir", "rm", "rmdir", "cp", "mv", "ln", "touch", "chmod", "chown", "install", "truncate", "unlink",
                 "dd", "rsync", "scp", "ssh", "pdsh", "wget", "curl", "aria2c", "huggingface-cli", "pip", "pip3", "git",
                 "docker", "apptainer", "singularity", "enroot", "kill", "pkill", "tar", "unzip", "sleep", "nohup")


def _skip_options(scheduler: Scheduler, indent: str) -> list[str]:
    """bash lines that shift srun's or sbatch's options off "$@", up to the command it runs or the job script it
    submits: an option that takes a value (planner/inputs/slurm_options.py, the list the script reader skips by)
    takes the next word with it, unless the value is attached (`--nodes=2`, `-N2`); a long option also when given
    by an unambiguous prefix of its name, as Slurm's getopt_long reads it (`hapmoe_slurm_valued`: `--ntasks-per-n 8`;
    an ambiguous one, which srun and sbatch refuse, takes no value here)."""
    shorts = "|".join(sh_quote(option) for option in sorted(VALUED[scheduler]) if not option.startswith("--"))
    valued = sorted(name for name in LONG_NAMES[scheduler] if f"--{name}" in VALUED[scheduler])
    others = sorted(LONG_NAMES[scheduler] - set(valued))
    pad = indent + " " * 8
    return [f"{indent}# {scheduler}'s options off \"$@\": one that takes a value takes the next word with it",
            f"{indent}local hapmoe_valued={_name_lines(valued, indent, len('local hapmoe_valued='))}",
            f"{indent}local hapmoe_other={_name_lines(others, indent, len('local hapmoe_other='))}",
            f'{indent}while [[ $# -gt 0 && "$1" == -* ]]; do', f'{indent}    case "$1" in',
            f"{pad}--) shift; break ;;", f"{pad}{shorts}) shift 2 || shift ;;",
            f'{pad}--?*) if hapmoe_slurm_valued "$1" "$hapmoe_valued" "$hapmoe_other"; then shift 2 || shift',
            f"{pad}      else shift; fi ;;",
            f"{pad}*) shift ;;", f"{indent}    esac", f"{indent}done"]


def _name_lines(names: list[str], indent: str, head: int) -> str:
    """`names` as one quoted bash word, one name from the next by a blank or a line break (lines under 100
    characters; `head`: the characters before the word on its first line)."""
    rows: list[str] = []
    for name in names:
        if rows and len(indent) + 4 + len(rows[-1]) + len(name) + (head - 4 if len(rows) == 1 else 0) < 96:
            rows[-1] += f" {name}"
        else:
            rows.append(name)
    return sh_quote(f"\n{indent}    ".join(rows))


_SLURM_VALUED = [
    "# Slurm reads a long option by an unambiguous prefix of its name too (getopt_long: --ntasks-per-n 8): does $1",
    "# (--NAME) name one that takes a value, among $2 (the long options that do) and $3 (the others)?",
    "hapmoe_slurm_valued() {",
    "    local IFS=$' \\t\\n' x=${1#--} n k=0 valued=0",
    '    for n in $2; do [[ $n == "$x" ]] && return 0; [[ $n == "$x"* ]] && k=$((k + 1)) valued=1; done',
    '    for n in $3; do [[ $n == "$x" ]] && return 1; [[ $n == "$x"* ]] && k=$((k + 1)) valued=0; done',
    "    ((k == 1 && valued))",
    "}",
]
"""Exact where no prefix starts two names of one option and nothing else (slurm_options `_SAME_OPTION`: tested)."""


def dry_run_stubs(spec: LaunchSpec) -> list[str]:
    """`--dry-run`: only DRY_RUN_TOOLS run; every other command prints itself on stderr and returns 0 (srun:
    see srun_function), but a word `[...` in a command's place (`if [$X = true]`: the test run together with its
    operand) fails as bash fails it on every node, command not found, as the script reader reads it.
    `python -c "...device_count()..."` answers node 0's GPUs (the plan's), which the script may compute
    --nproc-per-node or --nnodes from; `cd` into a directory that does not exist yet is allowed."""
    gpus = spec.agents[0].host_gpus if spec.agents else 0
    return [
        "",
        "# --dry-run: only tools that read run; every other command prints itself and succeeds.",
        "hapmoe_dry() { printf '[dry-run, not run] %s\\n' \"$*\" >&\"${HAPMOE_DRY_ERR:-2}\"; return 0; }",
        "hapmoe_dry_python() {",
        '    hapmoe_dry "$@"',
        '    if [[ "${2:-}" == -c && "${3:-}" == *device_count\\(\\)* ]]; then',
        f"        echo {gpus}; echo \"[dry-run] ... device_count() answered {gpus}: node 0's GPUs in the plan\" >&\"${{HAPMOE_DRY_ERR:-2}}\"",
        "    fi",
        "}",
        *_SLURM_VALUED,
        'if [[ "$HAPMOE_DRY_RUN" == 1 ]]; then',
        '    HAPMOE_REAL_PATH=$PATH; PATH=/nonexistent/hapmoe-dry-run; export HAPMOE_REAL_PATH PATH',
        "    command_not_found_handle() {",
        "        local a real",
        '        case "$1" in',
        '            python*) hapmoe_dry_python "$@"; return 0 ;;',
        '            find) for a in "${@:2}"; do case "$a" in -exec|-execdir|-ok|-okdir|-delete|-fprint*|-fls)',
        '                      hapmoe_dry "$@"; return 0 ;; esac; done ;;',
        '            sed) for a in "${@:2}"; do case "$a" in -[!-]*i*|--in-place*) hapmoe_dry "$@"; return 0 ;; esac; done ;;',
        '            sort) for a in "${@:2}"; do case "$a" in -[!-]*o*|--output*) hapmoe_dry "$@"; return 0 ;; esac; done ;;',
        '            scontrol) [[ "${2:-}" == show ]] || { hapmoe_dry "$@"; return 0; } ;;',
        '            sh) set -- bash "${@:2}" ;;',
        f"            {'|'.join(t for t in DRY_RUN_TOOLS if t not in ('find', 'sed', 'sort', 'scontrol', 'sh'))}) ;;",
        "            # `[$X = true]` (no blank after `[`) runs a command `[0`, which no node has: bash fails it (127)",
        "            \\[*) printf 'bash: %s: command not found\\n' \"$1\" >&2; return 127 ;;",
        '            *) hapmoe_dry "$@"; return 0 ;;',
        "        esac",
        '        real=$(PATH=$HAPMOE_REAL_PATH type -P "$1") || { hapmoe_dry "$@"; return 0; }',
        '        "$real" "${@:2}"',
        "    }",
        "    export -f command_not_found_handle",
        "    for hapmoe_c in " + " ".join(DRY_RUN_STUBS) + "; do",
        '        eval "$hapmoe_c() { hapmoe_dry $hapmoe_c \\"\\$@\\"; }"; export -f "$hapmoe_c"',
        "    done",
        '    python() { hapmoe_dry_python python "$@"; }; python3() { hapmoe_dry_python python3 "$@"; }',
        "    export -f python python3 hapmoe_dry_python",
        "    cd() { builtin cd \"$@\" 2>/dev/null || hapmoe_dry cd \"$@\"; }; export -f cd",
        "    tee() { hapmoe_dry tee \"$@\"; command cat; }; export -f tee  # the output still shows",
        "    # sbatch: the job script (a file, or a here-document) runs here under the same stubs, so its launch prints",
        "    sbatch() {",
        "        hapmoe_dry sbatch \"$@\"",
        *_skip_options("sbatch", " " * 8),
        "        if [[ $# -gt 0 ]]; then bash \"$@\"; else bash -s; fi",
        "        return 0",
        "    }",
        "    export -f sbatch",
        "fi",
    ]


def node_check_function(spec: LaunchSpec) -> list[str]:
    """`hapmoe_check_node K HOST TYPE`: the node runs its vendor's probe and stops launch.sh unless the
    probe names TYPE (HAPMOE_SKIP_NODE_CHECK=1 skips the check)."""
    lines = ["", "# Node K must hold TYPE: its vendor's probe must name it (HAPMOE_SKIP_NODE_CHECK=1 skips this).",
             "hapmoe_check_node() {",
             '    [[ "${HAPMOE_SKIP_NODE_CHECK:-0}" == 1 ]] && return 0',
             '    local probe="" names="" vendor="" out tool',
             '    case "$3" in']
    for t, chk in spec.node_checks.items():
        names = "|".join(_ere(n) for n in chk.names)
        lines.append(f"        {sh_quote(t)}) vendor={sh_quote(chk.vendor)}; probe={sh_quote(chk.probe or '')}; "
                     f"names={sh_quote(names)} ;;")
    lines += [
        "    esac",
        '    if [[ -z "$probe" ]]; then echo "launch.sh: node $1 ($2): no device probe known for $3 ($vendor); '
        'not checked" >&2; return 0; fi',
        "    tool=${probe%% *}",
        '    if ! command -v "$tool" >/dev/null 2>&1; then',
        '        echo "launch.sh: node $1 ($2) should hold $3 ($vendor), but $tool is not installed there; stopping '
        '(HAPMOE_SKIP_NODE_CHECK=1 starts anyway)" >&2; exit 3',
        "    fi",
        "    out=$(command $probe 2>&1)",
        '    if ! grep -qiE "(^|[^[:alnum:]])($names)([^[:alnum:]]|\\$)" <<<"$out"; then',
        '        echo "launch.sh: node $1 ($2) should hold $3, but $tool reports: $(head -n 3 <<<"$out" | tr \'\\n\' \' \')'
        'stopping (HAPMOE_SKIP_NODE_CHECK=1 starts anyway)" >&2; exit 3',
        "    fi",
        "}",
    ]
    return lines


def srun_function(spec: LaunchSpec, entry_name: str, shadowed: bool = False, job_log: bool = False) -> list[str]:
    """`srun` shadowed: under --dry-run it prints itself and runs its command under the stubs (a
    `bash -c` string then prints every node's launch); for the training launch it places the tasks in
    stage order (SLURM_HOSTFILE + --distribution=arbitrary) when the host names are real (--hosts).  `shadowed`:
    the launch reaches the plan through shell functions (a job script, a string, a sourced file), where srun may run
    the training program itself, which no function reaches: srun() hands such a launch to hapmoe_launch
    (program_functions).  `job_log`: a trial launcher's job keeps its log (_JOB_LOG)."""
    place = ["    local hapmoe_train=0 w per_agent=" + (" master=" if spec.real_hosts else ""),
             '    for w in "$@"; do [[ "$w" == *' + sh_quote(entry_name) + '* || "$w" == *torchrun* ]] '
             '&& hapmoe_train=1; done']
    if job_log:
        place += ["    if ((hapmoe_train)); then", "    " + _JOB_LOG, "    fi"]
    if shadowed:
        place += [
            "    # srun starting the training program itself where only launch.sh's functions reach the launch (a job",
            "    # script or string: `sbatch <<EOF ... srun torchrun ...`): srun runs the program, not a shell, so no",
            "    # function applies the plan in its tasks; hapmoe_launch runs it as the script's own `srun torchrun ...`",
            '    if ((hapmoe_train)) && [[ "$HAPMOE_DRY_RUN" != 1 ]] && hapmoe_srun_runs_program "$@"; then',
            '        hapmoe_launch srun "$@"; return',
            "    fi"]
    if spec.real_hosts:
        place += [
            '    if ((hapmoe_train)) && [[ -z "${HAPMOE_NO_SLURM_PLACEMENT:-}" ]]; then',
            '        local per=nodes; for w in "$@"; do [[ "${w##*/}" == python* ]] && per=ranks; done',
            '        for w in "$@"; do [[ "$w" == torch.distributed.run || "$w" == torch.distributed.launch ]] && per=nodes; done',
            '        export SLURM_HOSTFILE="$HAPMOE_DIR/slurm_hostfile.$per"',
            f'        local ntasks={len(spec.agents)}; [[ "$per" == nodes ]] && per_agent=1  # task k runs agent k (SLURM_PROCID)',
            f'        [[ "$per" == ranks ]] && ntasks={sum(ag.nproc for ag in spec.agents)}',
            "        # one task per line of the file (the job's SLURM_NTASKS would cut it short); rank 0, on the file's first",
            "        # host, is the master, whatever the script took for it (the allocation's first node, as a rule)",
            '        set -- --distribution=arbitrary --ntasks="$ntasks" "$@"',
            f'        master=${{HAPMOE_MASTER_ADDR:-{sh_quote(spec.agents[0].host)}}}',
            '        echo "launch.sh: srun places the tasks in stage order (SLURM_HOSTFILE=$SLURM_HOSTFILE, '
            '--distribution=arbitrary --ntasks=$ntasks; master $master)" >&2',
            "    fi",
        ]
    else:
        place += [
            '    ((hapmoe_train)) && echo "launch.sh: the host names are a template (solve --hosts FILE writes the '
            "placement): srun places the nodes in the allocation's order; each node checks its device type at "
            'start-up" >&2',
        ]
    hosts = len({ag.host for ag in spec.agents})

    return ["", "# srun: the training launch placed in stage order; printed, not run, under --dry-run.",
            "srun() {"] + place + [
        '    if [[ "$HAPMOE_DRY_RUN" == 1 ]]; then',
        '        hapmoe_dry srun "$@"',
        *(['        if ((hapmoe_train)) && hapmoe_srun_runs_program "$@"; then hapmoe_launch srun "$@"; return; fi  '
           "# as it runs"] if shadowed else []),
        *_skip_options("srun", " " * 8),
        '        if [[ $# -gt 0 ]]; then "$@"; fi',
        "        return 0",
        "    fi",
        "    # a job of fewer nodes than the plan's: torchrun's static rendezvous would wait for the others forever",
        f'    if ((hapmoe_train)) && [[ "${{SLURM_JOB_NUM_NODES:-}}" =~ ^[0-9]+$ ]] && ((SLURM_JOB_NUM_NODES < {hosts})); then',
        f'        echo "launch.sh: the plan runs on {hosts} nodes and this job holds $SLURM_JOB_NUM_NODES '
        f'(SLURM_JOB_NUM_NODES): submit it with sbatch --nodes={hosts}" >&2',
        "        exit 2",
        "    fi",
        *_export_check(),
        *_run_srun(spec),
        "}",
    ]


def program_functions(entry_name: str, functions: str) -> list[str]:
    """Where the launch reaches the plan through shell functions (a job script, a string, a sourced file): srun and
    mpirun start the training program themselves, not a shell, so no function applies the plan in their tasks.
    hapmoe_runs_program tells such a launch (torchrun or the entry script before any `bash`/`sh` among the words:
    `srun env X=1 torchrun ...`, not `srun bash -c "..."`; for srun, among the words after its options:
    hapmoe_srun_runs_program); srun() (srun_function) and mpirun()/mpiexec() (not under
    --dry-run, whose stubs print them) hand it to hapmoe_launch, as the script's own `srun torchrun ...` or `mpirun ...
    python pretrain_gpt.py` would be; the tasks hapmoe_launch then starts (`... bash -c ...`) reach srun or mpirun
    itself.  Where mpirun starts a shell on every rank instead (`mpirun ... bash entry.sh`, `mpirun ... bash -c
    "python ..."`: Pai-Megatron-Patch's style), the launch inside reaches the plan through the exported `functions`,
    which Open MPI does not pass a remote node (only -x's variables): hapmoe_mpi_shell writes them into the shell's
    command (`bash -c "<functions>; . entry.sh"`), as srun's fan-out does (_fan_out_srun)."""
    return [
        "",
        "# hapmoe_runs_program WORDS...: whether srun/mpirun runs the training program itself (no shell between)",
        "hapmoe_runs_program() {",
        "    local w",
        '    for w in "$@"; do',
        '        case "${w##*/}" in',
        "            bash|sh) return 1 ;;",
        f"            torchrun|torch.distributed.run|torch.distributed.launch|{sh_quote(entry_name)}) return 0 ;;",
        "        esac",
        "    done",
        "    return 1",
        "}",
        "# hapmoe_srun_runs_program SRUN-ARGS...: the same, of the command after srun's options (`srun -J torchrun bash",
        "# -c ...` runs bash: the option's value is no program)",
        "hapmoe_srun_runs_program() {",
        *_skip_options("srun", "    "),
        '    hapmoe_runs_program "$@"',
        "}",
        "# hapmoe_mpi_shell LAUNCHER WORDS...: a bash the MPI launcher starts on every rank, launch.sh's functions and",
        "# variables written into its command (a remote node gets none of them)",
        "hapmoe_mpi_shell() {",
        '    local launcher=$1 i j defs; shift',
        '    local -a w=("$@")',
        '    for ((i = 0; i < ${#w[@]}; i++)); do [[ "${w[i]##*/}" == bash ]] && break; done',
        '    for ((j = i + 1; j < ${#w[@]}; j++)); do [[ "${w[j]}" == -* && "${w[j]}" != -c ]] || break; done',
        "    if ((j >= ${#w[@]})); then command \"$launcher\" \"$@\"; return; fi  # no shell, or one reading stdin",
        f'    defs="$(declare -f {functions}; declare -p HAPMOE_DIR HAPMOE_DRY_RUN; '
        'declare -p HAPMOE_SKIP_NODE_CHECK 2>/dev/null)"',
        '    if [[ "${w[j]}" == -c ]]; then  # bash -c STRING [NAME ARGS...]',
        '        command "$launcher" "${w[@]:0:j}" -c "$defs"$\'\\n\'"${w[j+1]:-}" "${w[@]:j+2}"',
        "    else  # bash FILE ARGS...: the file sourced where the functions are, as $0 and its arguments",
        '        command "$launcher" "${w[@]:0:j}" -c "$defs"$\'\\n. "$0" "$@"\' "${w[@]:j}"',
        "    fi",
        "}",
        "# hapmoe_mpi_dry LAUNCHER WORDS...: under --dry-run, what the MPI launcher would start, shown with the plan:",
        "# its training program through hapmoe_launch, a bash it starts run once here, under the stubs",
        "hapmoe_mpi_dry() {",
        '    hapmoe_dry "$@"',
        '    if hapmoe_runs_program "${@:2}"; then hapmoe_launch "$@"; return; fi',
        "    local i",
        '    for ((i = 2; i <= $#; i++)); do [[ "${!i##*/}" == bash ]] && { "${@:i}"; return; }; done',
        "}",
        'if [[ "$HAPMOE_DRY_RUN" != 1 ]]; then',
        '    mpirun() { if hapmoe_runs_program "$@"; then hapmoe_launch mpirun "$@"; else hapmoe_mpi_shell mpirun "$@"; fi; }',
        '    mpiexec() { if hapmoe_runs_program "$@"; then hapmoe_launch mpiexec "$@"; else hapmoe_mpi_shell mpiexec "$@"; fi; }',
        "else",
        '    mpirun() { hapmoe_mpi_dry mpirun "$@"; }; mpiexec() { hapmoe_mpi_dry mpiexec "$@"; }',
        "fi",
    ]


def sbatch_function(entry_name: str) -> list[str]:
    """`sbatch` shadowed (not under --dry-run) where the launch is in a job the script submits: that job reaches the
    plan through launch.sh's exported functions, which a job started under --export=NONE (or a list without ALL) does
    not get, so it would train with the script's own command.  sbatch() stops there (exit 2).  The job's --export is
    sbatch's option, else SBATCH_EXPORT, else the job script's `#SBATCH --export` above its first command (sbatch(1):
    options win over the environment, which wins over the script's directives); the job script is the file named, or
    the text on standard input (a here-document), which sbatch() reads and hands on.  Only a job whose text (or
    --wrap command) names the entry script or torchrun is checked: the script's other jobs (data preparation) keep
    their --export."""
    return [
        "",
        "# sbatch: the job the script submits reaches the plan through launch.sh's exported functions, which a job",
        "# started under --export=NONE (or a list without ALL) does not get: it would train without the plan",
        'if [[ "$HAPMOE_DRY_RUN" != 1 ]]; then',
        "sbatch() {",
        '    local hapmoe_words=("$@") hapmoe_text= hapmoe_stdin=0 hapmoe_export= hapmoe_prev= hapmoe_wrap=0 w line i',
        *_skip_options("sbatch", " " * 4),
        '    for w in "${hapmoe_words[@]:0:${#hapmoe_words[@]}-$#}"; do',
        '        [[ "$hapmoe_prev" == --export ]] && hapmoe_export=$w',
        '        [[ "$w" == --export=* ]] && hapmoe_export=${w#--export=}',
        '        [[ "$w" == --wrap || "$w" == --wrap=* ]] && hapmoe_wrap=1',
        '        hapmoe_prev=$w',
        "    done",
        '    if [[ $# -gt 0 ]]; then hapmoe_text=$(cat -- "$1" 2>/dev/null) || hapmoe_text=',
        "    elif ((!hapmoe_wrap)); then hapmoe_text=$(cat); hapmoe_stdin=1; fi",
        "    ((hapmoe_wrap)) && hapmoe_text+=\" ${hapmoe_words[*]}\"",
        '    if [[ -z "$hapmoe_export" && -z "${SBATCH_EXPORT:-}" ]]; then  # the job script\'s own #SBATCH lines',
        '        while IFS= read -r line; do',
        '            line=${line#"${line%%[![:space:]]*}"}',
        '            case "$line" in',
        "                '#SBATCH'*) read -ra w <<< \"${line#\\#SBATCH}\"",
        '                    for ((i = 0; i < ${#w[@]}; i++)); do',
        '                        [[ "${w[i]}" == --export=* ]] && hapmoe_export=${w[i]#--export=}',
        '                        [[ "${w[i]}" == --export ]] && hapmoe_export=${w[i+1]:-}',
        "                    done ;;",
        "                '#'*|'') ;;",
        "                *) break ;;",
        "            esac",
        '        done <<< "$hapmoe_text"',
        "    fi",
        '    hapmoe_export=${hapmoe_export:-${SBATCH_EXPORT:-ALL}}',
        '    if [[ ",${hapmoe_export^^}," != *,ALL,* && ( "$hapmoe_text" == *' + sh_quote(entry_name)
        + '* || "$hapmoe_text" == *torchrun* ) ]]; then',
        '        echo "launch.sh: sbatch --export=$hapmoe_export starts the job without launch.sh\'s functions, so the plan '
        'would not apply to its training command; give sbatch --export=ALL (variables may follow: '
        '--export=ALL,NAME=VALUE)" >&2',
        "        exit 2",
        "    fi",
        '    if ((hapmoe_stdin)); then command sbatch "${hapmoe_words[@]}" <<< "$hapmoe_text"',
        '    else command sbatch "${hapmoe_words[@]}"; fi',
        "}",
        "fi",
    ]


def _export_check() -> list[str]:
    """srun() stops (exit 2) where srun's --export (or SRUN_/SLURM_EXPORT_ENV, which srun reads) passes the tasks not all of
    the environment and the tasks need launch.sh's exported functions: a command that reaches the plan through them (a
    `bash -c` string whose torchrun or python is a function), where the plan would silently not apply.  The commands
    hapmoe_launch gives srun carry the functions in their own string (`hapmoe-task`)."""
    return [
        "    # --export=NONE (or a list without ALL) gives the tasks none of launch.sh's functions: the plan would not apply",
        '    # srun reads SRUN_EXPORT_ENV, then SLURM_EXPORT_ENV (sbatch sets it from the job\'s --export)',
        '    local hapmoe_export=${SRUN_EXPORT_ENV:-${SLURM_EXPORT_ENV:-ALL}} hapmoe_prev= hapmoe_carried=0',
        '    for w in "$@"; do',
        '        [[ "$hapmoe_prev" == --export ]] && hapmoe_export=$w',
        '        [[ "$w" == --export=* ]] && hapmoe_export=${w#--export=}',
        '        [[ "$w" == hapmoe-task ]] && hapmoe_carried=1',
        '        hapmoe_prev=$w',
        "    done",
        '    if ((hapmoe_train && !hapmoe_carried)) && [[ "$hapmoe_export" != ALL* ]]; then',
        '        echo "launch.sh: srun --export=$hapmoe_export starts its tasks without launch.sh\'s functions, so the plan '
        'would not apply to the command it runs; give srun --export=ALL (variables may follow: --export=ALL,NAME=VALUE)" >&2',
        "        exit 2",
        "    fi",
    ]


def _run_srun(spec: LaunchSpec) -> list[str]:
    """srun() runs srun: each task told that srun started it (HAPMOE_SRUN_STEP: the step's node count is then the
    plan's to check), whether it is one agent (HAPMOE_SRUN_TASK_PER_AGENT) and, where srun() placed the tasks, node
    0's host, the master (HAPMOE_SRUN_MASTER for torchrun; MASTER_ADDR for ranks srun starts)."""
    if not spec.real_hosts:
        return ['    HAPMOE_SRUN_STEP=1 HAPMOE_SRUN_TASK_PER_AGENT=$per_agent command srun "$@"']
    return ['    if [[ -n "$master" ]]; then',
            '        HAPMOE_SRUN_STEP=1 HAPMOE_SRUN_TASK_PER_AGENT=$per_agent HAPMOE_SRUN_MASTER=$master MASTER_ADDR=$master \\',
            '            command srun "$@"',
            "    else",
            '        HAPMOE_SRUN_STEP=1 HAPMOE_SRUN_TASK_PER_AGENT=$per_agent command srun "$@"',
            "    fi"]


def _submitted_dir() -> list[str]:
    """bash lines that point HAPMOE_DIR at the submitted launch.sh's directory under sbatch, which runs a copy of the
    job script in slurmd's spool (`<spool>/job<ID>/slurm_script`, src/slurmd/slurmstepd/mgr.c) that the job's end
    deletes: the trial logs and SLURM_HOSTFILE belong beside the file the user submitted.  scontrol gives its path
    (`Command=`, sbatch's full path of the script: src/sbatch/opt.c, src/scontrol/info_job.c); without it, the
    directory sbatch was called from (SLURM_SUBMIT_DIR), with a warning."""
    return [
        'if [[ -n "${SLURM_JOB_ID:-}" && "${BASH_SOURCE[0]##*/}" == slurm_script ]]; then  # sbatch\'s copy',
        '    hapmoe_submitted=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n \'s/^ *Command=//p\' | head -n 1) ||'
        ' hapmoe_submitted=',
        '    if [[ "$hapmoe_submitted" == /* && -d "${hapmoe_submitted%/*}" ]]; then',
        '        HAPMOE_DIR=${hapmoe_submitted%/*}',
        "    else",
        '        HAPMOE_DIR=${SLURM_SUBMIT_DIR:-$PWD}',
        '        echo "launch.sh: sbatch runs a copy of this script and scontrol does not name the submitted file: its'
        ' files are looked for in $HAPMOE_DIR (where sbatch was called)" >&2',
        "    fi",
        "    unset hapmoe_submitted",
        "fi",
    ]


def _dry_run_and_decided(spec: LaunchSpec) -> list[str]:
    """`--dry-run` read off the arguments, and `hapmoe_is_decided FLAG`: the flags the plan decides."""
    return [
        "HAPMOE_DRY_RUN=${HAPMOE_DRY_RUN:-0}",
        'if [[ "${1:-}" == "--dry-run" ]]; then HAPMOE_DRY_RUN=1; shift; fi',
        'HAPMOE_DIR="$(builtin cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"  # where launch.sh and its files lie',
        *_submitted_dir(),
        "export HAPMOE_DRY_RUN HAPMOE_DIR",
        "# --dry-run prints where launch.sh's own output goes, also from a launch whose output the script redirects",
        "# (file descriptors a variable names: bash 4.1 and later; an older bash prints where the script says)",
        'if [[ "$HAPMOE_DRY_RUN" == 1 ]] && ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 401)); then',
        "    eval 'exec {HAPMOE_DRY_OUT}>&1 {HAPMOE_DRY_ERR}>&2'; export HAPMOE_DRY_OUT HAPMOE_DRY_ERR",
        "fi",
        "",
        "# Flags the plan decides: removed (with their values) from what the script passes.",
        "hapmoe_is_decided() {",
        f"    case \"$1\" in {_case_pattern(spec.decided)}) return 0 ;; esac",
        "    return 1",
        "}",
    ]


def _refs_function(spec: LaunchSpec) -> list[str]:
    """`hapmoe_need_refs`: the variables the plan's flags refer to (${NAME}, left for run time) must be set;
    launch.sh stops with a message naming the first one that is not.  Nothing when there are none."""
    if not spec.refs:
        return []
    names = " ".join(spec.refs)  # RUNTIME_REF names: identifiers, never other text
    return [
        "",
        "# The variables the plan's flags refer to, expanded when launch.sh runs: each must be set.",
        "hapmoe_need_refs() {",
        "    local v",
        f"    for v in {names}; do",
        '        if [[ -z "${!v:-}" ]]; then',
        '            echo "launch.sh: set $v: the flags refer to \\${$v} (the plan keeps it for this run to fill in)" >&"${HAPMOE_DRY_ERR:-2}"',
        "            exit 2",
        "        fi",
        "    done",
        "}",
    ]


def _priced_function(spec: LaunchSpec) -> list[str]:
    """`hapmoe_check_priced FLAGS...`: the command's own flags against those the price rests on as the planner read
    them (PricedFlags): one the run passes with another value, passes though the planner read none, or leaves out
    though the planner read it, stops the launch (exit 2) naming each, unless HAPMOE_ALLOW_UNPRICED=1.  Nothing
    without a script (the generated launcher passes what was read).  Bash 3.2 as well: no associative arrays."""
    p = spec.priced
    if p is None:
        return []
    cases = [f"        {sh_quote(n)}) HAPMOE_R={sh_quote(v)} ;;" for n, v in sorted(p.read.items())]
    required = " ".join(sh_quote(n) for n in sorted(p.read) if n not in p.optional)
    return [
        "",
        "# The flags of the script's command that the price rests on, as the planner read them (without this",
        "# environment): a run that passes others (a variable's default read in its place, text only bash expands)",
        "# was not priced, and the plan would replace a decided one among them without a word.",
        "hapmoe_priced_read() {  # HAPMOE_R: the value read for flag $1 ('' for a switch); status 1: none was read",
        '    case "$1" in',
        *cases,
        "        *) return 1 ;;",
        "    esac",
        "}",
        "hapmoe_check_priced() {",
        "    local -a names=() values=() diff=()",
        "    local tok f i cur=-1 msg",
        '    for tok in "$@"; do',
        r'        if [[ "$tok" == -?* && ! "$tok" =~ ^-?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]]; then',
        "            f=${tok%%=*}; cur=-1",
        f'            case "$f" in {_case_pattern(p.names)}) ;; *) continue ;; esac',
        '            for ((i = 0; i < ${#names[@]}; i++)); do [[ "${names[i]}" == "$f" ]] && break; done',
        "            names[i]=$f  # the last one counts, as for Megatron's parser",
        '            if [[ "$tok" == *=* ]]; then values[i]=${tok#*=}; else values[i]=""; cur=$i; fi',
        "        elif ((cur >= 0)); then",
        '            values[cur]+="${values[cur]:+ }$tok"',
        "        fi",
        "    done",
        "    for ((i = 0; i < ${#names[@]}; i++)); do",
        "        f=${names[i]}",
        '        if ! hapmoe_priced_read "$f"; then diff+=("$f${values[i]:+ ${values[i]}} (priced without it)")',
        '        elif [[ "${values[i]}" != "$HAPMOE_R" ]]; then diff+=("$f${values[i]:+ ${values[i]}} (priced: $f${HAPMOE_R:+ $HAPMOE_R})"); fi',
        "    done",
        f"    for f in {required}; do",
        '        for ((i = 0; i < ${#names[@]}; i++)); do [[ "${names[i]}" == "$f" ]] && continue 2; done',
        '        hapmoe_priced_read "$f"; diff+=("no $f (priced: $f${HAPMOE_R:+ $HAPMOE_R})")',
        "    done",
        "    ((${#diff[@]})) || return 0",
        "    printf -v msg ' %s;' \"${diff[@]}\"",
        "    echo \"launch.sh: the command passes other flags than the plan was priced with:${msg%;}; the planner read the \"\\",
        "\"script without this run's environment (a variable's default in its place, text only bash expands, a branch \"\\",
        "\"it could not decide): plan again with these values (--gbs, --seq, --megatron-args, or set them in the \"\\",
        "\"script), or HAPMOE_ALLOW_UNPRICED=1 to start anyway\" >&\"${HAPMOE_DRY_ERR:-2}\"",
        "    [[ \"${HAPMOE_ALLOW_UNPRICED:-0}\" == 1 ]] || exit 2",
        "}",
    ]


def _agent_function(spec: LaunchSpec) -> list[str]:
    """`hapmoe_agent K`: agent K's host, its GPUs (when it has part of a host) and its own extra flags."""
    lines = [
        "",
        "# Agent k of the plan: its host, its device type, its GPUs, its own extra flags.",
        "hapmoe_agent() {",
        '    HAPMOE_A_CVD=""; HAPMOE_A_EXTRA=()',
        '    case "$1" in',
    ]
    for ag in spec.agents:
        cvd = ",".join(map(str, ag.gpu_ids)) if ag.nproc < ag.host_gpus else ""
        extra = " ".join(bash_item(i) for i in spec.per_agent_items.get(ag.node_rank, []))
        check = spec.node_checks.get(ag.device_type)
        var = check.visible_devices if check is not None else "CUDA_VISIBLE_DEVICES"
        lines.append(
            f"        {ag.node_rank}) HAPMOE_A_HOST={sh_quote(ag.host)}; HAPMOE_A_TYPE={sh_quote(ag.device_type)}; "
            f"HAPMOE_A_VIS={sh_quote(var)}; HAPMOE_A_CVD={sh_quote(cvd)}; HAPMOE_A_EXTRA=({extra}) ;;"
            f"  # {one_line(ag.device_type)}: ranks {ag.first_rank}-{ag.first_rank + ag.nproc - 1}, stage(s) "
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
    plan_words = " ".join(bash_item(i, spec.refs) for i in spec.applied)
    placement = "|".join(dict.fromkeys(f"--{o}|--{o.replace('-', '_')}" for o in PLACEMENT_OPTIONS if o not in _SWITCH_OPTIONS))
    switches = "|".join(dict.fromkeys(f"--{o}|--{o.replace('-', '_')}" for o in _SWITCH_OPTIONS))
    entry_new = spec.entry_script
    lines = [
        "    local -a words=(\"$@\") launcher=() args=() plan=()",
        "    local n=${#words[@]} entry=-1 i tok name skip=0 torch=0 after=0 tpos=-1 rdzv= node_rank= nnodes=",
        "    for ((i = 0; i < n; i++)); do",
        f"        if [[ \"${{words[i]##*/}}\" == {sh_quote(entry_name)} ]]; then entry=$i; break; fi",
        "    done",
        "    if ((entry < 0)); then  # not the training launch",
        "        if [[ \"$HAPMOE_DRY_RUN\" == 1 ]]; then hapmoe_dry \"$@\"; else command \"$@\"; fi",
        "        return",
        "    fi",
        *(["    hapmoe_need_refs"] if spec.refs else []),
        "    plan=(" + plan_words + ")",
        "    for ((i = 0; i < entry; i++)); do",
        "        tok=${words[i]}",
        "        if ((after == 0)) && [[ \"${tok##*/}\" == torchrun ]]; then torch=1; after=1; tpos=$i; launcher+=(\"$tok\"); continue; fi",
        "        if ((after == 0)) && [[ \"$tok\" == torch.distributed.run || \"$tok\" == torch.distributed.launch ]]; then",
        "            torch=1; after=1; tpos=$i; launcher+=(\"$tok\"); continue",
        "        fi",
        "        if ((torch)); then",
        "            case \"${tok%%=*}\" in",
        f"                {switches}) continue ;;",
        "                # the script's rendezvous endpoint (its master, HOST:PORT), node rank and nodes, read before they",
        "                # are dropped",
        "                --rdzv-endpoint|--rdzv_endpoint|--node-rank|--node_rank|--nnodes)",
        "                    local v=",
        "                    if [[ \"$tok\" == *=* ]]; then v=${tok#*=}",
        "                    elif [[ \"${words[i+1]:-}\" != --?* ]]; then v=${words[i+1]:-}; ((i++)); fi",
        "                    case \"${tok%%=*}\" in --rdzv?endpoint) rdzv=$v ;; --node?rank) node_rank=$v ;; *) nnodes=$v ;; esac",
        "                    continue ;;",
        "                # the option's value, unless the script left it empty (`--nnodes $UNSET --node-rank 0`)",
        f"                {placement}) [[ \"$tok\" == *=* || \"${{words[i+1]:-}}\" == --?* ]] || ((i++)); continue ;;",
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
        *(["    hapmoe_check_priced \"${words[@]:entry+1}\""] if spec.priced is not None else []),
        (f"    local entry_word={sh_quote(entry_new)}  # FlagScale's entry replaces {one_line(entry_name)}"
         if entry_new.rsplit("/", 1)[-1] != entry_name else "    local entry_word=${words[entry]}"),
    ]
    if spec.max_connections == 1:
        lines.append("    # CUDA_DEVICE_MAX_CONNECTIONS=1: Megatron needs it with TP or CP > 1 (pre-Blackwell)")
    elif spec.max_connections is not None:
        lines.append("    # CUDA_DEVICE_MAX_CONNECTIONS: --overlap-moe-expert-parallel-comm needs more than one hardware queue")
    if spec.allocator_default is not None:
        lines.append("    # the allocator setting the memory estimate assumed (the input states none): kept if the environment"
                     " sets one")
    return lines + ["    " + statement for statement in _plan_exports(spec)]


def _plan_exports(spec: LaunchSpec) -> list[str]:
    """bash statements that export the environment the plan needs: CUDA_DEVICE_MAX_CONNECTIONS, the plan's `exports`,
    the allocator setting the memory was priced with where the environment sets none.  hapmoe_launch runs them, and so
    does each rank srun or mpirun starts itself (_run_without_torchrun), whose environment need not be launch.sh's:
    mpirun passes a remote node only -x's variables, srun --export=NONE only SLURM_*, and Megatron's validate_args
    refuses TP or CP > 1 without CUDA_DEVICE_MAX_CONNECTIONS=1 on pre-Blackwell GPUs."""
    out = [] if spec.max_connections is None else [f"export CUDA_DEVICE_MAX_CONNECTIONS={int(spec.max_connections)}"]
    for name, value in spec.exports.items():
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
            raise ValueError(f"launch.sh exports only environment names, got {name!r}")
        out.append(f"export {name}={sh_quote(value)}")
    if spec.allocator_default is not None:
        out.append('if [[ -z "${PYTORCH_ALLOC_CONF:-}${PYTORCH_CUDA_ALLOC_CONF:-}" ]]; then '
                   f"export PYTORCH_CUDA_ALLOC_CONF={sh_quote(spec.allocator_default)}; fi")
    return out


def _rank_environment(spec: LaunchSpec) -> str:
    """bash (in a rank's `bash -c` string, after `r` and `n`, its rank and the ranks started) that gives a rank srun or
    mpirun starts what Megatron reads to join the world, where the environment has none of its own: RANK,
    WORLD_SIZE, LOCAL_RANK (megatron/training/arguments.py and config/common_config.py read them with defaults 0, 1
    and 0, so each rank of `srun python pretrain_gpt.py` trained alone on its node's first GPU) and the MASTER_PORT
    and, under srun, MASTER_ADDR of torch's env:// rendezvous (the step's first node, where rank 0 runs): the values
    NVIDIA's enroot hook gives a pyxis container's tasks (NVIDIA/enroot conf/hooks/extra/50-slurm-pytorch.sh), which
    NVIDIA's `srun python` examples rely on."""
    return ('if [[ -n "$r" ]]; then export RANK=${RANK:-$r}; [[ -n "$n" ]] && export WORLD_SIZE=${WORLD_SIZE:-$n}; '
            'lr=${LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-}}}}; '
            '[[ -n "$lr" ]] && export LOCAL_RANK=$lr; fi; '
            f'export MASTER_PORT=${{MASTER_PORT:-{sh_quote(spec.master_port)}}}; '
            'if [[ -z "${MASTER_ADDR:-}" && -n "${SLURM_STEP_NODELIST:-}" ]]; then '
            'MASTER_ADDR=$(hapmoe_first_host "$SLURM_STEP_NODELIST"); '
            '[[ -n "$MASTER_ADDR" ]] && export MASTER_ADDR; fi; ')


def _rank_of(default: str = "") -> str:
    """bash: a rank's number as its launcher gives it, the MPI launcher's (OMPI_COMM_WORLD_RANK, PMI_RANK) before
    srun's (SLURM_PROCID: an sbatch job's batch shell has 0, which every rank mpirun starts in the job inherits)."""
    return "${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-" + default + "}}}"


def _ranks_started() -> str:
    """bash: how many ranks the launcher started, in _rank_of's order."""
    return "${OMPI_COMM_WORLD_SIZE:-${PMI_SIZE:-${SLURM_STEP_NUM_TASKS:-}}}"


def _run_without_torchrun(spec: LaunchSpec) -> list[str]:
    """hapmoe_launch behind srun / mpirun / python: the command as the script gave it, the plan applied;
    every task first checks its node's device type (its rank's agent): the check's functions (and
    HAPMOE_SKIP_NODE_CHECK) travel in the task's `bash -c` string, as mpirun passes a remote node none of
    launch.sh's environment (but -x's) and srun --export=NONE none.  A rank's number: _rank_of."""
    nproc = spec.agents[0].nproc
    world = sum(ag.nproc for ag in spec.agents)
    started = f'n={_ranks_started()}; '
    count = (f'if [[ -n "$n" && "$n" != {world} ]]; then [[ "$r" == 0 ]] && echo "launch.sh: $n ranks started, the plan '
             f'has {world}: give srun --ntasks={world} (or mpirun -np {world})" >&2; exit 2; fi; ')
    check = (f'; r={_rank_of()}; ' + started + count +
             f'if [[ -n "$r" ]]; then k=$((r / {nproc})); '
             'hapmoe_agent "$k" && hapmoe_check_node "$k" "$(hostname -s)" "$HAPMOE_A_TYPE"; fi; '
             + "".join(statement + "; " for statement in _plan_exports(spec)) + _rank_environment(spec) + 'exec "$@"')
    return [
        "    local i",
        "    if ((!torch)); then  # srun / mpirun / python: the scheduler places the ranks",
        "        if [[ \"$HAPMOE_DRY_RUN\" == 1 ]]; then",
        "            { printf '%q ' \"${launcher[@]}\" \"$entry_word\" \"${args[@]}\" \"${plan[@]}\"; echo; } >&\"${HAPMOE_DRY_OUT:-1}\"",
        "            exit 0",
        "        fi",
        f"        local j=${{#launcher[@]}} r={_rank_of('0')}",
        "        for ((i = 0; i < ${#launcher[@]}; i++)); do [[ \"${launcher[i]##*/}\" == python* ]] && { j=$i; break; }; done",
        "        if ((j > 0)); then  # srun / mpirun start the ranks: each checks its node's device type first (srun: placed)",
        "            \"${launcher[@]:0:j}\" bash -c \"$(declare -f hapmoe_agent hapmoe_check_node hapmoe_first_host; "
        f"declare -p HAPMOE_SKIP_NODE_CHECK 2>/dev/null)\"{sh_quote(check)} hapmoe-task \"${{launcher[@]:j}}\" \"$entry_word\" "
        "\"${args[@]}\" \"${plan[@]}\"",
        "        else  # python itself: one rank (an srun task's, in a `bash -c` string), or all of them",
        "            local n lr; " + started + count,
        f"            hapmoe_agent $((r / {nproc})) && hapmoe_check_node $((r / {nproc})) \"$(hostname -s)\" \"$HAPMOE_A_TYPE\"",
        "            " + _rank_environment(spec).rstrip("; "),
        "            command \"${launcher[@]}\" \"$entry_word\" \"${args[@]}\" \"${plan[@]}\"",
        "        fi",
        "        return",
        "    fi",
    ]


def _run_agents(spec: LaunchSpec) -> list[str]:
    """hapmoe_launch with torchrun: this host's agents (or every agent under --dry-run), each with
    static rendezvous, its node rank and the script's master address and port when it gives them."""
    agents = spec.agents
    hosts = len({ag.host for ag in agents})
    lines = _fan_out_srun(spec) + _fan_out_mpirun(spec) + [
        "    # a task of an srun step on fewer nodes than the plan's (srun -N): static rendezvous would wait forever",
        f'    if [[ -n "${{HAPMOE_SRUN_STEP:-}}" && "${{SLURM_STEP_NUM_NODES:-}}" =~ ^[0-9]+$ ]] && ((SLURM_STEP_NUM_NODES < {hosts})); then',
        f'        [[ "${{SLURM_PROCID:-0}}" == 0 ]] && echo "launch.sh: the plan runs on {hosts} nodes and srun\'s step on '
        f'$SLURM_STEP_NUM_NODES (SLURM_STEP_NUM_NODES): give srun -N {hosts}" >&2',
        "        exit 2",
        "    fi",
    ] + [
        f"    local master=() has_addr=0 has_port=0 i master_host={sh_quote(agents[0].host)}"
        f" master_port={sh_quote(spec.master_port)}  # the script's master address/port win",
    ]
    lines += _template_master(spec)
    lines += [
        '    [[ -n "${HAPMOE_MASTER_ADDR:-}" ]] && master_host=$HAPMOE_MASTER_ADDR',
        *(['    [[ -n "${HAPMOE_SRUN_MASTER:-}" ]] && master_host=$HAPMOE_SRUN_MASTER  # launch.sh\'s srun placed node 0']
          if spec.real_hosts else []),
        '    [[ -n "${HAPMOE_MASTER_PORT:-}" ]] && master_port=$HAPMOE_MASTER_PORT',
        "    for ((i = 0; i < ${#launcher[@]}; i++)); do",
        "        case \"${launcher[i]%%=*}\" in",
        "            --master-addr|--master_addr)",
        "                local addr=${launcher[i]#*=}; [[ \"${launcher[i]}\" == *=* ]] || addr=${launcher[i+1]:-}",
        *([
            "                if [[ -n \"${HAPMOE_SRUN_MASTER:-}\" ]]; then  # srun placed node 0, maybe not where the script's",
            "                    # master is (the allocation's first node, as a rule): node 0's host, as srun said",
            "                    if [[ \"${launcher[i]}\" == *=* ]]; then unset 'launcher[i]'; else unset 'launcher[i]' 'launcher[i+1]'; fi",
            "                    launcher=(\"${launcher[@]}\"); i=-1; continue",
            "                fi",
        ] if spec.real_hosts else []),
        f"                if (({hosts} > 1)) && [[ \"$addr\" == localhost || \"$addr\" == 127.0.0.1 || \"$addr\" == ::1 ]]; then",
        "                    # a one-node address in a multi-node plan: every node would wait for itself",
        f"                    echo \"launch.sh: the script's master address $addr is one node's; the plan runs {hosts} nodes, "
        "so node 0's host is the master ($master_host; set HAPMOE_MASTER_ADDR)\" >&2",
        "                    if [[ \"${launcher[i]}\" == *=* ]]; then unset 'launcher[i]'; else unset 'launcher[i]' 'launcher[i+1]'; fi",
        "                    launcher=(\"${launcher[@]}\"); i=-1; continue",
        "                fi",
        "                has_addr=1 ;;",
        "            --master-port|--master_port) has_port=1 ;;",
        "        esac",
        "    done",
        "    ((has_addr)) || master+=(--master-addr \"$master_host\")",
        "    ((has_port)) || master+=(--master-port \"$master_port\")",
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
        "            {",
        "                echo \"# node $k ($HAPMOE_A_HOST, $HAPMOE_A_TYPE)\"",
        "                [[ -n \"$HAPMOE_A_CVD\" ]] && printf '%s=%s ' \"$HAPMOE_A_VIS\" \"$HAPMOE_A_CVD\"",
        "                printf '%q ' \"${cmd[@]}\"; echo",
        "            } >&\"${HAPMOE_DRY_OUT:-1}\"",
        "            continue",
        "        fi",
        "        hapmoe_check_node \"$k\" \"$HAPMOE_A_HOST\" \"$HAPMOE_A_TYPE\"",
        "        if ((${#agents[@]} > 1)); then",
        "            ( [[ -n \"$HAPMOE_A_CVD\" ]] && export \"$HAPMOE_A_VIS=$HAPMOE_A_CVD\"; command \"${cmd[@]}\" ) &",
        "        elif [[ -n \"$HAPMOE_A_CVD\" ]]; then",
        "            ( export \"$HAPMOE_A_VIS=$HAPMOE_A_CVD\"; command \"${cmd[@]}\" ) || status=$?",
        "        else",
        "            command \"${cmd[@]}\" || status=$?",
        "        fi",
        "    done",
        "    [[ \"$HAPMOE_DRY_RUN\" == 1 ]] && exit 0",
        "    if ((${#agents[@]} > 1)); then wait || status=$?; fi",
        "    return $status",
    ]


def _first_host_function() -> list[str]:
    """`hapmoe_first_host LIST`: the first host of a Slurm host list, where rank 0 runs: scontrol's (`show hostnames`),
    else read off the list itself (`node[01-04,07],gpu9` -> node01: each bracket's first number, zero padding kept;
    `rack[1-2]-n[3-4]` -> rack1-n3), as a container's task without scontrol has to (pyxis/enroot images seldom ship
    Slurm's client): the master was then the template's name (h100-node0), which no cluster has."""
    return [
        "",
        "# hapmoe_first_host LIST: the first host of a Slurm host list (scontrol's, else read off the list)",
        "hapmoe_first_host() {",
        '    local l=$1 h=',
        '    h=$(scontrol show hostnames "$l" 2>/dev/null | head -n 1) || h=',
        '    if [[ -z "$h" ]]; then',
        '        while [[ "$l" =~ ^([^],[]*)\\[([^],-]*)[^]]*\\](.*)$ ]]; do',
        "            h+=${BASH_REMATCH[1]}${BASH_REMATCH[2]}; l=${BASH_REMATCH[3]}",
        "        done",
        "        h+=${l%%,*}",
        "    fi",
        "    printf '%s\\n' \"$h\"",
        "}",
    ]


def _template_master(spec: LaunchSpec) -> list[str]:
    """With template host names, node 0's real host: in an srun task the step's first node (SLURM_NODEID 0, as
    _this_hosts_agents reads it), else the host of the script's rendezvous endpoint (when not a loopback name)."""
    if spec.real_hosts:
        return []
    hosts = len({ag.host for ag in spec.agents})
    loopback = '[[ "$rhost" != localhost && "$rhost" != 127.0.0.1 && "$rhost" != ::1 ]]'
    return [
        "    if [[ -n \"${SLURM_NODEID:-}\" && -n \"${SLURM_STEP_NODELIST:-}\" ]]; then  # an srun task: node 0 is the step's first",
        '        local first; first=$(hapmoe_first_host "$SLURM_STEP_NODELIST")',
        '        [[ -n "$first" ]] && master_host=$first',
        "    fi",
        '    if [[ -n "$rdzv" ]]; then  # torchrun --rdzv-endpoint HOST[:PORT]: node 0\'s host, as the script gives it',
        '        local rhost=$rdzv rport=',
        '        if [[ "$rdzv" =~ ^(.*):([0-9]+)$ ]]; then rhost=${BASH_REMATCH[1]}; rport=${BASH_REMATCH[2]}; fi',
        f'        if [[ -n "$rhost" ]] && {{ (({hosts} == 1)) || {loopback}; }}; then master_host=$rhost; fi',
        '        [[ -n "$rport" ]] && master_port=$rport',
        "    fi",
    ]


_TORCH_FROM = [
    '        if [[ "${words[from]}" == torch.distributed.* ]]; then  # python -m torch.distributed.run',
    '            while ((from > 1)) && [[ "${words[from]##*/}" != python* ]]; do ((from--)); done',
    "        fi",
]
"""bash: `from`, torchrun's place among the words, moved back to the python that runs `-m torch.distributed.run`:
where a launcher's fan-out (_fan_out_srun, _fan_out_mpirun) hands each task the words from there on."""


def _fan_out_srun(spec: LaunchSpec) -> list[str]:
    """hapmoe_launch where srun runs torchrun itself (`srun [OPTIONS] torchrun ...`): srun starts one torchrun per
    task, so the plan's agent (its node rank, devices and node check) is each task's to pick, not the submitting
    host's (which gave every task its own node rank, 0).  srun runs hapmoe_launch in each task on the words from
    torchrun on, as where the script's srun runs a `bash -c` string; the functions and the variables they read
    travel in the string (`declare -f`/`declare -p`: bash writes them), whatever srun's --export passes: with real
    host names also what srun() tells its tasks (one task per agent, node 0's host the master; srun_function)."""
    placed = [
        "        # srun() places one task per agent, node 0's host the master (as in srun(): --export=NONE passes neither)",
        "        local HAPMOE_SRUN_TASK_PER_AGENT= HAPMOE_SRUN_MASTER=",
        '        if [[ -z "${HAPMOE_NO_SLURM_PLACEMENT:-}" ]]; then',
        f"            HAPMOE_SRUN_TASK_PER_AGENT=1 HAPMOE_SRUN_MASTER=${{HAPMOE_MASTER_ADDR:-{sh_quote(spec.agents[0].host)}}}",
        "        fi",
    ] if spec.real_hosts else []
    carried = "HAPMOE_DIR HAPMOE_DRY_RUN HAPMOE_SRUN_STEP" + (" HAPMOE_SRUN_TASK_PER_AGENT HAPMOE_SRUN_MASTER"
                                                              if spec.real_hosts else "")
    return [
        '    if [[ "${launcher[0]##*/}" == srun && "$HAPMOE_DRY_RUN" != 1 ]]; then  # srun: one torchrun per task',
        "        local from=$tpos HAPMOE_SRUN_STEP=1",
        *_TORCH_FROM,
        *placed,
        f'        srun "${{words[@]:1:from-1}}" bash -c "$(declare -f {_launch_functions(spec)}; '
        f'declare -p {carried})"\'; hapmoe_launch "$@"\' hapmoe-task "${{words[@]:from}}"',
        "        return",
        "    fi",
    ]


def _fan_out_mpirun(spec: LaunchSpec) -> list[str]:
    """hapmoe_launch where mpirun (or mpiexec) runs torchrun itself (`mpirun -np NODES --map-by ppr:1:node torchrun
    ...`): as for srun (_fan_out_srun), each rank runs hapmoe_launch on the words from torchrun on and starts its own
    node's agents (every torchrun was node rank 0 of the submitting host's choosing); the functions and variables travel
    in the rank's `bash -c` string, as Open MPI passes a remote node none of them.  A rank finds its node by its host
    name, else by its MPI rank (_this_hosts_agents), one rank a node."""
    hosts = len({ag.host for ag in spec.agents})
    size = "${OMPI_COMM_WORLD_SIZE:-${PMI_SIZE:-}}"
    return [
        '    if [[ ("${launcher[0]##*/}" == mpirun || "${launcher[0]##*/}" == mpiexec) && "$HAPMOE_DRY_RUN" != 1 ]]; then',
        "        local from=$tpos HAPMOE_MPI_STEP=1  # mpirun: one torchrun per rank, one rank per node",
        *([f"        local HAPMOE_SRUN_MASTER=${{HAPMOE_MASTER_ADDR:-{sh_quote(spec.agents[0].host)}}}  # node 0's host, "
           "the master, wherever mpirun's host file puts it"] if spec.real_hosts else []),
        *_TORCH_FROM,
        f'        command "${{words[0]}}" "${{words[@]:1:from-1}}" bash -c "$(declare -f {_launch_functions(spec)}; '
        f'declare -p HAPMOE_DIR HAPMOE_DRY_RUN HAPMOE_MPI_STEP{" HAPMOE_SRUN_MASTER" if spec.real_hosts else ""}; '
        'declare -p HAPMOE_SKIP_NODE_CHECK HAPMOE_MASTER_ADDR HAPMOE_MASTER_PORT 2>/dev/null)"\'; hapmoe_launch "$@"\' '
        'hapmoe-task "${words[@]:from}"',
        "        return",
        "    fi",
        f'    if [[ -n "${{HAPMOE_MPI_STEP:-}}" && -n "{size}" && "{size}" != {hosts} ]]; then',
        f'        [[ "{_rank_of("0")}" == 0 ]] && echo "launch.sh: mpirun started {size} torchruns, the plan runs {hosts} '
        f'nodes: give mpirun -np {hosts} --map-by ppr:1:node (one torchrun a node)" >&2',
        "        exit 2",
        "    fi",
    ]


def _this_hosts_agents(agents: list[Agent]) -> list[str]:
    """The agents to start here: all under --dry-run, else HAPMOE_NODE_RANK's (one torchrun node rank), the
    srun task's own when launch.sh's srun placed one task per agent (slurm_hostfile.nodes: task k is agent k),
    the host name's, or those of srun's node id (SLURM_NODEID counts hosts in the hostfile's order, and a host
    whose GPUs the plan splits over several agents runs them all, as its host name would)."""
    lines = [
        "    local -a agents=()",
        "    if [[ \"$HAPMOE_DRY_RUN\" == 1 ]]; then",
        f"        agents=({' '.join(str(a.node_rank) for a in agents)})",
        "    elif [[ -n \"${HAPMOE_NODE_RANK:-}\" ]]; then",
        "        agents=(\"$HAPMOE_NODE_RANK\")",
        "    elif [[ -n \"${HAPMOE_SRUN_TASK_PER_AGENT:-}\" && -n \"${SLURM_PROCID:-}\" ]]; then",
        "        agents=(\"$SLURM_PROCID\")  # srun placed one task per agent (slurm_hostfile.nodes)",
        "    else",
        "        case \"${HAPMOE_HOST:-$(hostname -s)}\" in",
    ]
    by_host: dict[str, list[int]] = {}
    for ag in agents:
        by_host.setdefault(ag.host, []).append(ag.node_rank)
    for host, ranks in by_host.items():
        lines.append(f"            {sh_quote(host)}) agents=({' '.join(map(str, ranks))}) ;;")
    hosts = len(by_host)
    lines += [
        "            *) local node_id=${SLURM_NODEID:-} node_from=SLURM_NODEID",
        "               if [[ -n \"${HAPMOE_MPI_STEP:-}\" ]]; then  # one torchrun a node, in mpirun's order (its host file's)",
        f"                   node_id={_rank_of()} node_from='the MPI rank'",
        "               fi",
        "               # else the node rank the script gives torchrun (Kubernetes' PyTorchJob, a per-node launcher), where",
        "               # the script runs as many nodes as the plan: the node order, the hostfile's lines",
        "               [[ -z \"$node_id\" ]] && node_rank=${node_rank:-${PET_NODE_RANK:-}} nnodes=${nnodes:-${PET_NNODES:-}}",
        f"               if [[ -z \"$node_id\" && -n \"$node_rank\" && \"$nnodes\" == {hosts} ]]; then",
        "                   node_id=$node_rank; node_from=\"the script's torchrun node rank\"",
        "               fi",
        "               case \"$node_id\" in  # srun: the allocation's node order, the hostfile's lines",
    ]
    for k, ranks in enumerate(by_host.values()):
        lines.append(f"                   {k}) agents=({' '.join(map(str, ranks))}) ;;")
    return lines + [
        "                   '') echo \"launch.sh: host ${HAPMOE_HOST:-$(hostname -s)} is not in hostfile; set HAPMOE_NODE_RANK or "
        "HAPMOE_HOST\" >&2; exit 2 ;;",
        f"                   *) echo \"launch.sh: $node_from $node_id is not a node of the hostfile (0-{hosts - 1})\" >&2; exit 2 ;;",
        "               esac ;;",
        "        esac",
        "    fi",
    ]


def _log_lines(spec: LaunchSpec) -> list[str]:
    """With `log_name`: everything the launch prints on this host also goes to one log beside launch.sh (not
    under --dry-run), whose path is printed first.  hapmoe_log starts it; in a job the script submits with sbatch
    (whose output sbatch writes elsewhere) the job's shell starts its own where it launches (_JOB_LOG)."""
    if spec.log_name is None:
        return []
    name = sh_quote(spec.log_name)
    return [
        "",
        "# One log per host beside launch.sh: what `cli.py calibrate --trials` reads.",
        "hapmoe_log() {",
        "    local dir=$HAPMOE_DIR",
        *_log_dir_lines(spec.log_dir),
        f'    HAPMOE_LOG="$dir/"{name}"-$(hostname -s).log"',
        '    echo "launch.sh: this host\'s output goes to $HAPMOE_LOG too" >&2',
        '    exec > >(tee "$HAPMOE_LOG") 2>&1',
        "}",
        'if [[ "$HAPMOE_DRY_RUN" != 1 ]]; then hapmoe_log; fi',
    ]


COMPANION = "megatron_args.txt"
"""A file every launcher directory holds beside launch.sh: where it is missing, launch.sh runs as a copy."""


def _log_dir_lines(written: str | None) -> list[str]:
    """bash lines that send the log to the directory the launcher was written to (`written`) when launch.sh's own
    directory does not hold its COMPANION: qsub (PBS, Torque) and bsub (LSF) run a copy of the job script from
    their spool, which the job's end deletes, and `calibrate --trials` reads the logs beside the written launch.sh.
    (sbatch's copy is resolved through scontrol before: _submitted_dir.)"""
    if written is None:
        return []
    where, companion = sh_quote(written), sh_quote(COMPANION)
    return [
        f'    if [[ ! -e "$dir/"{companion} ]]; then  # a copy of launch.sh (a scheduler\'s spool): where it was written',
        f"        if [[ -e {where}/{companion} ]]; then",
        f"            dir={where}",
        "        else",
        f'            echo "launch.sh: neither $dir nor "{where}" holds this launcher\'s "{companion}": this host\'s log'
        ' goes to $dir" >&2',
        "        fi",
        "    fi",
    ]


_JOB_LOG = ('    [[ -z "${HAPMOE_LOG:-}" && -z "${HAPMOE_SRUN_STEP:-}" && "$HAPMOE_DRY_RUN" != 1 ]] && hapmoe_log  '
            "# a submitted job's shell: its own log")
"""The line srun() and hapmoe_launch begin with in a trial launcher whose launch is in a job the script submits:
the job's output goes where sbatch writes it (slurm-<id>.out), not through launch.sh's log, so the job's shell, where
srun or mpirun gathers every rank's output, keeps the trial log beside launch.sh itself (not a task srun starts)."""


def script_launch_sh(script: LauncherScript, spec: LaunchSpec) -> str:
    """The user's script with the plan applied (see the module docstring)."""
    text = script.text
    site = script.site
    entry_name = script.entry_script.rsplit("/", 1)[-1]
    shadow = None
    if site is not None and site.via == "direct":
        text = text[: site.offset] + "hapmoe_launch " + text[site.offset :]
        how = f"`hapmoe_launch` inserted before `{site.word}` on line {site.line}"
    elif site is not None and site.via == "eval" and not site.nested:
        text = text[: site.offset] + "hapmoe_eval" + text[site.offset + len("eval") :]
        how = f"`eval` on line {site.line} became `hapmoe_eval`"
    else:
        shadow = script.launcher[0].rsplit("/", 1)[-1]
        how = f"the launch on line {site.line if site else '?'} reaches the plan through a `{shadow}` shell function"
    lines = text.split("\n")
    shebang = lines[0] if lines and lines[0].startswith("#!") else "#!/bin/bash"
    body = lines[1:] if lines and lines[0].startswith("#!") else lines
    leading = _leading_comments(body)
    out = [shebang]
    out += comment_lines(spec.header)
    src = script.path or "the input script"
    out += comment_lines(["", f"This is {src} with the plan applied: {how}.",
                          "Run it with the same arguments as the input script; `launch.sh --dry-run ARGS...` prints the",
                          "command every node would run."])
    if spec.notes:
        out += comment_lines([""] + [f"note: {n}" for n in spec.notes])
    out += body[:leading]  # the scheduler's directives, read only above the first command
    out += hapmoe_block(spec, entry_name, shadow, script.in_sbatch_job)
    out += body[leading:]
    result = "\n".join(out)
    return result if result.endswith("\n") else result + "\n"


def _leading_comments(lines: Sequence[str]) -> int:
    """How many of the script's lines (after the shebang) are comments or blank before its first command: where a
    batch scheduler's directives (`#SBATCH ...`) must stay, above every command of launch.sh's block."""
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return i
    return len(lines)


def generated_launch_sh(items: list[FlagItem], spec: LaunchSpec, launcher: Sequence[str] = ("torchrun",)) -> str:
    """A launcher for a run that came without a script: the run's flags in bash arrays per
    concern (checked first for the variables they refer to), and one launch statement through
    `hapmoe_launch`."""
    out = ["#!/bin/bash"]
    out += comment_lines(spec.header)
    out += comment_lines(["", "Run it on every host of the hostfile (or set HAPMOE_NODE_RANK); `launch.sh --dry-run`",
                          "prints the command every node would run."])
    if spec.notes:
        out += comment_lines([""] + [f"note: {n}" for n in spec.notes])
    out += hapmoe_block(spec, spec.entry_script.rsplit("/", 1)[-1], None)
    out.append("")
    if spec.refs:
        out.append("hapmoe_need_refs")
    arrays = arrays_of(items)
    for name, arr_items in arrays.items():
        out.append(f"{name}=(")
        out += [f"    {bash_item(i, spec.refs)}" for i in arr_items]
        out.append(")")
    refs = " ".join(f'"${{{n}[@]}}"' for n in arrays)
    out.append("")
    out.append(f"hapmoe_launch {' '.join(launcher)} {sh_quote(spec.entry_script)} {refs}")
    return "\n".join(out) + "\n"
