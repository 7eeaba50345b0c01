"""Stand-ins for Slurm, Open MPI, torchrun and python that run an emitted launch.sh as the scheduler would, and record
every process that would start training (tests/test_launch_simulated.py).  No real Slurm: each stub is a small Python
program that reads its options as the real one does (for the options these tests use) and starts its tasks as local
processes, each told its node by SIM_HOST (the `hostname` stub prints it).

- sbatch: reads the job script's #SBATCH lines (above its first command) and its own options, copies the script to
  <spool>/job<ID>/slurm_script and runs that copy on the job's first node, with SLURM_JOB_* and SLURM_NTASKS* set as
  sbatch sets them, and under an --export without ALL (its option, else SBATCH_EXPORT, else #SBATCH) only SLURM_*
  (and the stubs' SIM_* and PATH) of the environment, with SLURM_EXPORT_ENV set; with SIM_SBATCH_OUTPUT the job's
  output goes to slurm-<id>.out, as sbatch writes it, not to sbatch's caller; scontrol answers `show hostnames` (expanding a compressed list) and `show job` (Command= the submitted file's full path).
- srun: one process per task (SLURM_HOSTFILE's first -n lines with --distribution=arbitrary, where
  srun ignores --ntasks-per-node), with SLURM_PROCID/SLURM_NODEID/SLURM_LOCALID/SLURM_STEP_NODELIST (compressed
  as Slurm writes it, n[0-1], with SIM_HOSTLIST=compressed); -N/-n/
  --ntasks-per-node its own, else the job's (SLURM_NNODES, SLURM_NTASKS, SLURM_NTASKS_PER_NODE, as srun reads them);
  --distribution=arbitrary with SLURM_HOSTFILE puts task k on the file's line k; --export=NONE passes SLURM_* only.
- mpirun: -np processes over --hostfile's slots (or SIM_NODES'; --map-by ppr:N:node or -npernode N: N a host), with OMPI_COMM_WORLD_RANK/LOCAL_RANK, the environment
  of a remote node (-x NAME[=VALUE] only) on every node but the first.
- nvidia-smi: the GPUs of SIM_HOST's type (SIM_GPUS: `host=TYPE ...`), for launch.sh's node check.
- torchrun / python -m torch.distributed.run / python ENTRY: write one JSON record {kind, argv, env} to $SIM_REC;
  torchrun's node rank 0 prints the file SIM_LOG names (a training log), where set.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COMMON = r'''
import json, os, re, shutil, subprocess, sys, uuid

def nodes():
    return os.environ.get("SIM_NODES", "n0 n1 n2 n3 n4 n5 n6 n7").split()

def compress(names):
    """Slurm's compressed host list of `names` in their order (n0,n1,n3,m7 -> n[0-1,3],m7), as SIM_HOSTLIST=compressed
    asks; else the names with commas."""
    if os.environ.get("SIM_HOSTLIST") != "compressed":
        return ",".join(names)
    groups = []  # [prefix, width, [numbers]] of neighbours
    for n in names:
        m = re.match(r"^(.*?)(\d+)$", n)
        key = (m.group(1), len(m.group(2))) if m else (n, None)
        if groups and m and groups[-1][:2] == list(key):
            groups[-1][2].append(int(m.group(2)))
        else:
            groups.append([*key, [int(m.group(2))] if m else []])
    out = []
    for prefix, width, nums in groups:
        if width is None or len(nums) == 1:
            out.append(prefix if width is None else f"{prefix}{nums[0]:0{width}d}")
            continue
        spans = []
        for x in nums:
            if spans and x == spans[-1][1] + 1:
                spans[-1][1] = x
            else:
                spans.append([x, x])
        out.append(prefix + "[" + ",".join(f"{a:0{width}d}" + (f"-{b:0{width}d}" if b > a else "") for a, b in spans)
                   + "]")
    return ",".join(out)

def expand(hostlist):
    """The names of a host list (one bracket a name at most: what `compress` writes)."""
    out = []
    for item in re.findall(r"[^,\[]*(?:\[[^\]]*\][^,]*)?", hostlist):
        m = re.match(r"^(.*)\[([^\]]*)\](.*)$", item)
        if not item:
            continue
        if not m:
            out.append(item)
            continue
        for span in m.group(2).split(","):
            a, _, b = span.partition("-")
            out += [f"{m.group(1)}{x:0{len(a)}d}{m.group(3)}" for x in range(int(a), int(b or a) + 1)]
    return out

def job_nodes():
    listed = os.environ.get("SLURM_JOB_NODELIST_SIM")
    return listed.split(",") if listed else nodes()

def record(kind, argv):
    keep = ("SIM_HOST", "SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR",
            "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "HAPMOE_SRUN_TASK_PER_AGENT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
            "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    path = os.path.join(os.environ["SIM_REC"], f"{kind}-{uuid.uuid4().hex}.json")
    with open(path, "w") as f:
        json.dump({"kind": kind, "argv": argv, "env": env}, f)
'''

SRUN = r'''
VALUED = {"-N", "-n", "-c", "-p", "-o", "-e", "-J", "-t", "-w", "-m", "--nodes", "--ntasks", "--ntasks-per-node",
          "--partition", "--output", "--error", "--job-name", "--time", "--nodelist", "--distribution", "--export",
          "--mpi", "--cpus-per-task", "--gpus-per-node", "--container-image", "--container-mounts",
          "--container-workdir"}
args = sys.argv[1:]
opt = {}
while args and args[0].startswith("-"):
    a = args.pop(0)
    if a == "--":
        break
    if a.startswith("--") and "=" in a:
        name, value = a.split("=", 1)
    elif a in VALUED:
        name, value = a, args.pop(0)
    elif len(a) > 2 and a[:2] in VALUED:
        name, value = a[:2], a[2:]
    else:
        name, value = a, ""
    opt[{"--nodes": "-N", "--ntasks": "-n", "--distribution": "-m"}.get(name, name)] = value
env = os.environ
job = job_nodes()
n_nodes = int(opt.get("-N") or env.get("SLURM_NNODES") or len(job))
per_node = opt.get("--ntasks-per-node") or (None if "-n" in opt else env.get("SLURM_NTASKS_PER_NODE"))
if "-n" in opt:
    ntasks = int(opt["-n"])
elif per_node:
    ntasks = int(per_node) * n_nodes
else:
    ntasks = int(env.get("SLURM_NTASKS") or n_nodes)
if opt.get("-m", "").startswith("arbitrary"):  # srun(1): the tasks in the file's order, -n (own or the job's) of them
    lines = [ln.split()[0] for ln in open(env["SLURM_HOSTFILE"]) if ln.strip()]
    if "-n" not in opt and not (opt.get("--ntasks-per-node") and opt.get("-N")):
        ntasks = int(env.get("SLURM_NTASKS") or len(lines))
    if len(lines) < ntasks:
        sys.exit(f"srun: error: SLURM_HOSTFILE lists {len(lines)} tasks, fewer than {ntasks}")
    hosts = lines[:ntasks]
    missing = [h for h in hosts if h not in job]
    if missing:
        sys.exit(f"srun: error: hosts {missing} are not in the job's allocation {job}")
else:
    if n_nodes > len(job):
        sys.exit(f"srun: error: {n_nodes} nodes requested, the job holds {len(job)}")
    step = job[:n_nodes]
    hosts = []
    base, extra = divmod(ntasks, n_nodes)
    for i, h in enumerate(step):  # block distribution
        hosts += [h] * (base + (1 if i < extra else 0))
step_nodes = list(dict.fromkeys(hosts))
export = opt.get("--export", "ALL")
procs = []
local = {}
for k, h in enumerate(hosts):
    if export.split(",")[0] == "NONE":
        tenv = {n: v for n, v in env.items() if n.startswith(("SLURM_", "SIM_"))}
        for extra in export.split(",")[1:]:
            name, _, value = extra.partition("=")
            tenv[name] = value if _ else env.get(name, "")
        tenv.setdefault("PATH", env["PATH"])
    else:
        tenv = dict(env)
    tenv.update(SLURM_PROCID=str(k), SLURM_NODEID=str(step_nodes.index(h)), SLURM_LOCALID=str(local.get(h, 0)),
                SLURM_STEP_NODELIST=compress(step_nodes), SLURM_STEP_NUM_TASKS=str(len(hosts)),
                SLURM_STEP_NUM_NODES=str(len(step_nodes)), SIM_HOST=h, SLURMD_NODENAME=h)
    local[h] = local.get(h, 0) + 1
    procs.append(subprocess.Popen(args, env=tenv))
codes = [p.wait() for p in procs]
with open(os.path.join(env["SIM_REC"], "srun-steps.log"), "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")
sys.exit(max(codes, default=0))
'''

SBATCH = r'''
import itertools
args = sys.argv[1:]
if args and not args[0].startswith("-"):
    path = os.path.abspath(args[0]); text = open(path).read(); script_args = args[1:]; opts = []
else:
    opts = []
    while args and args[0].startswith("-"):
        opts.append(args.pop(0))
    if args:
        path = os.path.abspath(args[0]); text = open(path).read(); script_args = args[1:]
    else:
        path = None; text = sys.stdin.read(); script_args = []
directives = []
for line in text.split("\n")[1:]:
    s = line.strip()
    if s and not s.startswith("#"):
        break
    if line.startswith("#SBATCH"):
        directives += line.split()[1:]
def value(name, short=None):
    found = None
    for words in (directives, opts):
        for i, w in enumerate(words):
            if w.startswith(name + "="):
                found = w.split("=", 1)[1]
            elif w == name or (short and w == short):
                found = words[i + 1]
            elif short and w.startswith(short) and len(w) > 2:
                found = w[2:]
    return found
n_nodes = int(value("--nodes", "-N") or 1)
job = nodes()[:n_nodes]
jobid = os.environ.get("SIM_JOB_ID", "7")
spool = os.path.join(os.environ["SIM_SPOOL"], f"job{jobid}")
os.makedirs(spool, exist_ok=True)
copy = os.path.join(spool, "slurm_script")
with open(copy, "w") as f:
    f.write(text)
os.chmod(copy, 0o755)
export = value("--export") if any(w.startswith("--export") for w in opts) else None
export = export or os.environ.get("SBATCH_EXPORT") or value("--export") or "ALL"
if "ALL" in export.upper().split(","):
    env = dict(os.environ)
else:  # sbatch --export=NONE: only SLURM_* (here also SIM_* and PATH, the stubs'), and what the list names
    env = {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "SIM_")) or k == "PATH"}
    for entry in export.split(",")[1:] if export.upper().startswith("NONE") else export.split(","):
        name, eq, val = entry.partition("=")
        if eq:
            env[name] = val
        elif name in os.environ:
            env[name] = os.environ[name]
    env["SLURM_EXPORT_ENV"] = export  # as sbatch sets it for the job's srun (src/sbatch/opt.c)
env.update(SLURM_JOB_ID=jobid, SLURM_JOB_NUM_NODES=str(n_nodes), SLURM_NNODES=str(n_nodes),
           SLURM_JOB_NODELIST=",".join(job), SLURM_JOB_NODELIST_SIM=",".join(job), SLURM_SUBMIT_DIR=os.getcwd(),
           SLURM_NODEID="0", SLURM_PROCID="0", SIM_HOST=job[0], SIM_SUBMITTED=path or "")
per_node = value("--ntasks-per-node")
if per_node:
    env.update(SLURM_NTASKS_PER_NODE=per_node, SLURM_NTASKS=str(int(per_node) * n_nodes))
ntasks = value("--ntasks", "-n")
if ntasks:
    env["SLURM_NTASKS"] = ntasks
print(f"Submitted batch job {jobid}")
sys.stdout.flush()
if os.environ.get("SIM_SBATCH_OUTPUT"):  # as sbatch does: the job's output to slurm-<id>.out, not the caller's
    with open(os.path.join(os.getcwd(), f"slurm-{jobid}.out"), "w") as out:
        sys.exit(subprocess.run([copy, *script_args], env=env, cwd=os.getcwd(), stdout=out,
                                stderr=subprocess.STDOUT).returncode)
sys.exit(subprocess.run([copy, *script_args], env=env, cwd=os.getcwd()).returncode)
'''

SCONTROL = r'''
a = sys.argv[1:]
if a[:2] == ["show", "hostnames"]:  # the list given, else the job's
    print("\n".join(expand(a[2]) if len(a) > 2 else job_nodes()))
elif a[:2] == ["show", "job"]:
    print(f"JobId={os.environ.get('SLURM_JOB_ID')} JobName=x\n   Command={os.environ.get('SIM_SUBMITTED') or '(null)'}")
'''

MPIRUN = r'''
args = sys.argv[1:]
np_ = None; hostfile = None; exported = {}
VALUED = {"--bind-to", "-H", "--host", "-mca", "--mca"}
per_node = None
while args and args[0].startswith("-"):
    a = args.pop(0)
    if a in ("-map-by", "--map-by"):
        m = re.fullmatch(r"ppr:(\d+):node", args.pop(0))
        per_node = int(m.group(1)) if m else per_node
    elif a in ("-npernode", "--npernode"):
        per_node = int(args.pop(0))
    elif a in ("-np", "-n", "--np"):
        np_ = int(args.pop(0))
    elif a in ("--hostfile", "-hostfile", "--machinefile"):
        hostfile = args.pop(0)
    elif a == "-x":
        name, eq, val = args.pop(0).partition("=")
        exported[name] = val if eq else os.environ.get(name, "")
    elif a in ("-mca", "--mca"):
        args.pop(0); args.pop(0)
    elif a in VALUED:
        args.pop(0)
slots = []
if hostfile:
    for line in open(hostfile):
        w = line.split("#")[0].split()
        if not w:
            continue
        n = next((int(x.split("=")[1]) for x in w[1:] if x.startswith("slots=")), 1)
        slots += [w[0]] * (n if per_node is None else per_node)
else:
    slots = [os.environ.get("SIM_HOST", "localhost")] * (np_ or 1)
np_ = np_ or len(slots)
if np_ > len(slots):
    sys.exit(f"mpirun: {np_} processes, {len(slots)} slots")
first = slots[0]
procs = []; local = {}
for r in range(np_):
    h = slots[r]
    if h == os.environ.get("SIM_HOST", first):
        tenv = dict(os.environ)
    else:  # a remote node: orted's environment (a login shell's), plus -x
        tenv = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME") or k.startswith("SIM_")}
    tenv.update(exported)
    tenv.update(OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE=str(np_),
                OMPI_COMM_WORLD_LOCAL_RANK=str(local.get(h, 0)), SIM_HOST=h)
    local[h] = local.get(h, 0) + 1
    procs.append(subprocess.Popen(args, env=tenv))
sys.exit(max(p.wait() for p in procs))
'''

TORCHRUN = r'''
record("torchrun", sys.argv[1:])
a = sys.argv[1:]
if os.environ.get("SIM_LOG") and "--node-rank" in a and a[a.index("--node-rank") + 1] == "0":
    print(open(os.environ["SIM_LOG"]).read(), end="")  # the training log, as node 0's ranks print it
'''

PYTHON = r'''
a = sys.argv[1:]
if a and a[0] == "-c":
    print(8)
elif a[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
    record("torchrun", a[2:])
else:
    while a and a[0].startswith("-"):
        a.pop(0)
    record("rank", a)
'''

HOSTNAME = r'''
print(os.environ.get("SIM_HOST", "login0"))
'''

NVIDIA_SMI = r'''
gpus = dict(pair.split("=") for pair in os.environ.get("SIM_GPUS", "").split())  # host=type
name = gpus.get(os.environ.get("SIM_HOST", ""))
if name is None:
    sys.exit("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")
print("\n".join([f"NVIDIA {name} 80GB HBM3"] * 8))
'''

STUBS = {"srun": SRUN, "sbatch": SBATCH, "scontrol": SCONTROL, "mpirun": MPIRUN, "torchrun": TORCHRUN,
         "python": PYTHON, "python3": PYTHON, "hostname": HOSTNAME, "nvidia-smi": NVIDIA_SMI}


def write_stubs(bindir: Path) -> Path:
    """The stub programs in `bindir` (made), each run by this interpreter."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name, body in STUBS.items():
        path = bindir / name
        path.write_text(f"#!{sys.executable} -S\n" + COMMON + body)
        path.chmod(0o755)
    return bindir


def records(rec: Path) -> list[dict]:
    """Every recorded process: {kind: torchrun|rank, argv, env}."""
    return [json.loads(p.read_text()) for p in sorted(rec.glob("*.json"))]
