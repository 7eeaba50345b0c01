"""Check FlagScale configurations with FlagScale's own code, on a CPU-only machine.

Runs with the Python of the FlagScale environment (`bash .ci/flagscale_env.sh` builds it and prints
its path): flag-scale 0.8.0, whose `megatron` is FlagScale's Megatron-LM fork.  Nothing of FlagScale
is copied here; everything below imports and calls it.

Inputs (any mix, one JSON result each, printed as a JSON list on stdout; exit 0 when it ran):

  CONFIG ...            a FlagScale experiment config as `python run.py --config-path DIR
                        --config-name NAME` reads it: a .yaml file, a conf directory holding
                        config.yaml, or a directory holding flagscale/conf/config.yaml (what
                        `hapmoe emit --runtime flagscale` writes).  The host file is the config's
                        experiment.runner.hostfile, looked up beside the config and up to three
                        directories above it, or --hostfile.
  --args-file FILE      a raw flag list (megatron_args.txt: shell words, as the planner writes them)
  --cases FILE|-        a JSON list of raw cases: {"name", "argv": [...], "world_size"?,
                        "hosts"?: "H800:8,MI300X:8" or [["H800", 8], ...], "env"?: {...}}
  --hosts TYPE:N,...    node types and process counts for --args-file (default: ranks laid out
                        mesh after mesh, each rank of its mesh's device type)
  --world-size N        for --args-file (default: the sum of the hosts, else of the mesh sizes)
  --env K=V             for --args-file: what the launcher exports (repeatable)
  --hostfile FILE       for --args-file: the hosts (FlagScale's parse_hostfile) when --hosts is absent
  --all-ranks           check every rank, not one rank per process mesh

What runs, per config, is what FlagScale runs before training starts:

1. YAML -> command line, FlagScale's runner (flagscale/runner/runner_train.py): hydra composes the
   config as run.py does; `SSHTrainRunner(config)` (its `_update_config_train` and
   `_get_args_megatron`, i.e. `flatten_dict_to_args`) and `SSHTrainRunner.run(dryrun=True)`, which
   writes each host's run script (`cmd="torchrun ... <entrypoint> <args>"`, with the host's
   `--hetero-current-device-type` from the host file's `type=`) and runs no ssh and no command.
   If `run()` itself fails, the error is reported as `runner_error` and the per-host commands are
   still produced by `SSHTrainRunner._run_each(..., dryrun=True)` for every host of the host file,
   with FlagScale's `update_nodes_envs` and `get_nproc_per_node`, so the arguments are checked too.
2. Per rank checked (rank 0, then the first rank of every other process mesh, as FlagScale's
   RankMapper numbers them): WORLD_SIZE/RANK/LOCAL_RANK set; the fork's
   `megatron.training.arguments.parse_args()`; then what `megatron.training.initialize.
   initialize_megatron` does with those args: `flagscale.train.arguments.FSTrainArguments(args)
   .pre_validate_args()`, `validate_args(args)`, `.post_validate_args()`; the micro-batch
   calculator (`init_num_microbatches_calculator`, as `set_global_variables` does); and
   `flagscale.train.hetero.parallel_context.ParallelContext(args)` (every process mesh, its
   process groups, the inter-mesh links and the global pp/embedding groups, then
   `core_transformer_config_from_args` and the DDP/optimizer/dataset configs).

Faked, as tools/megatron_validate.py does for Megatron: the process group (torch's "fake"
backend; `all_gather_object` answers for every rank what that rank would send: its device type
from the host file, its mesh index), two CUDA queries (compute capability 9.0), Transformer
Engine's version checks (a recent TE), and the tokenizer (`get_tokenizer` returns a stand-in
object: the dataset config only stores it).  The groups FlagScale creates with
args.distributed_backend (nccl, flagcx) are created on the fake backend too.
`--no-rope-fusion --transformer-impl local` are appended because Transformer Engine is not
installed.

Beyond FlagScale's checks, each result lists `placement`: the physical ranks and device types that
FlagScale's RankMapper gives each mesh, with a warning when they differ from the mesh's declared
device type (FlagScale itself never compares them).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import os
import re
import shlex
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any

APPENDED = ["--no-rope-fusion", "--transformer-impl", "local"]


# ------------------------------------------------------------------------------------------------
# FlagScale imports and CPU patches
# ------------------------------------------------------------------------------------------------
class FS:
    """FlagScale's modules, imported once (about 20 s: torch and the Megatron fork)."""

    def __init__(self) -> None:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import torch
            import megatron
            import megatron.training
            from megatron.core import parallel_state
            from megatron.core.num_microbatches_calculator import (
                destroy_num_microbatches_calculator,
                get_num_microbatches,
                init_num_microbatches_calculator,
            )
            from megatron.training import arguments
            from torch.testing._internal.distributed.fake_pg import FakeStore

            import flagscale
            from flagscale.train.arguments import FSTrainArguments
            from flagscale.train.hetero import parallel_context

        self.torch = torch
        self.megatron = megatron
        self.parallel_state = parallel_state
        self.arguments = arguments
        self.FakeStore = FakeStore
        self.FSTrainArguments = FSTrainArguments
        self.parallel_context = parallel_context
        self.init_mbc = init_num_microbatches_calculator
        self.destroy_mbc = destroy_num_microbatches_calculator
        self.get_num_microbatches = get_num_microbatches
        self.root = os.path.dirname(os.path.dirname(os.path.abspath(flagscale.__file__)))
        fork = os.path.join(self.root, "third_party", "Megatron-LM", "megatron")
        if os.path.dirname(os.path.abspath(megatron.__file__)) != fork:
            raise SystemExit(f"flagscale_validate: `megatron` is {megatron.__file__}, not FlagScale's fork {fork}")
        # CPU: the two CUDA queries the argument code makes, and Transformer Engine's versions.
        torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
        if hasattr(arguments, "get_device_arch_version"):
            arguments.get_device_arch_version = lambda: 9
        from megatron.core.transformer import transformer_config

        for module in (transformer_config, arguments):
            if hasattr(module, "is_te_min_version"):
                module.is_te_min_version = lambda *a, **k: True
        # ParallelContext.build_config builds the dataset config, which only stores the tokenizer
        # (building the real one needs its files): a stand-in object.
        stand_in = type("TokenizerStandIn", (), {})()
        megatron.training.get_tokenizer = lambda: stand_in
        # Process groups: the default group is torch's "fake" backend; the groups FlagScale creates
        # with args.distributed_backend (nccl, flagcx) are made on that backend too (NCCL needs GPUs).
        new_group = torch.distributed.new_group

        def fake_new_group(*a, **k):
            k["backend"], k["pg_options"] = None, None
            return new_group(*a, **k)

        torch.distributed.new_group = fake_new_group
        self._orig_all_gather_object = torch.distributed.all_gather_object

    def describe(self, exc: BaseException) -> str:
        """'Type: message (file:line)'; a bare assert is shown by its source line."""
        text = str(exc).strip()
        if not text:
            tb = traceback.extract_tb(exc.__traceback__)
            text = (tb[-1].line or "").strip() if tb else ""
        return f"{type(exc).__name__}: {text} ({self.where(exc)})"

    def where(self, exc: BaseException) -> str:
        """file:line of the innermost frame, relative to the FlagScale package when inside it."""
        tb = traceback.extract_tb(exc.__traceback__)
        if not tb:
            return "?"
        last = tb[-1]
        path = os.path.abspath(last.filename)
        if path.startswith(self.root + os.sep):
            path = os.path.relpath(path, self.root)
        else:
            path = os.path.basename(path)
        return f"{path}:{last.lineno}"


# ------------------------------------------------------------------------------------------------
# Device map: which device type each physical rank has
# ------------------------------------------------------------------------------------------------
def parse_hosts(spec: Any) -> list[tuple[str | None, int]]:
    """'H800:8,MI300X:8' or [['H800', 8], ...] -> [(type, nproc), ...]."""
    if spec is None:
        return []
    if isinstance(spec, str):
        out = []
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            typ, _, n = part.rpartition(":")
            out.append((typ or None, int(n)))
        return out
    return [(t, int(n)) for t, n in spec]


def runs(values: list[Any]) -> list[list[Any]]:
    """[a, a, b] -> [[a, 2], [b, 1]] (compact per-rank lists in the output)."""
    out: list[list[Any]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def runs_of_ints(values: list[int]) -> list[list[int]]:
    """[0, 1, 2, 5] -> [[0, 2], [5, 5]] (first, last) ranges."""
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][1] + 1 == v:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out


def flag_values(argv: list[str], flag: str) -> list[str] | None:
    """The values after the last occurrence of `flag` (up to the next --flag)."""
    idx = [i for i, t in enumerate(argv) if t == flag]
    if not idx:
        return None
    vals = []
    for t in argv[idx[-1] + 1 :]:
        if t.startswith("--"):
            break
        vals.append(t)
    return vals


def with_current_type(argv: list[str], device_type: str | None) -> list[str]:
    """What FlagScale's runner does per host (SSHTrainRunner._run_each): set
    --hetero-current-device-type to the host's type."""
    if device_type is None:
        return list(argv)
    argv = list(argv)
    if "--hetero-current-device-type" in argv:
        argv[argv.index("--hetero-current-device-type") + 1] = device_type
    else:
        argv += ["--hetero-current-device-type", device_type]
    return argv


# ------------------------------------------------------------------------------------------------
# Validation of one job: per-rank argument lists
# ------------------------------------------------------------------------------------------------
def validate_job(
    fs: FS,
    argv_of_rank,  # rank -> argv
    device_of_rank: list[str | None],
    env,  # dict, or rank -> dict: what the launcher exports
    all_ranks: bool = False,
    nproc_of_rank=None,
) -> dict[str, Any]:
    torch = fs.torch
    world = len(device_of_rank)
    checked: list[dict[str, Any]] = []
    state: dict[str, Any] = {}

    def fake_all_gather_object(object_list, obj, group=None):
        # What every rank would send, for the two payloads FlagScale gathers.
        if isinstance(obj, dict) and set(obj) == {"rank", "device_type"}:  # RankMapper
            for p in range(world):
                object_list[p] = {"rank": p, "device_type": device_of_rank[p] or obj["device_type"]}
        elif isinstance(obj, dict) and set(obj) == {"rank", "process_mesh_idx"}:  # ParallelContext
            args = state["args"]
            mapper = fs.parallel_context.RankMapper(args)
            bounds, acc = [], 0
            for tp, cp, _ep, dp, pp in args.hetero_process_meshes:
                acc += tp * cp * dp * pp
                bounds.append(acc)
            for p in range(world):
                logical = mapper.to_logical_ranks([p])[0]
                idx = next((i for i, b in enumerate(bounds) if logical < b), len(bounds) - 1)
                object_list[p] = {"rank": p, "process_mesh_idx": idx}
        else:
            raise RuntimeError(f"flagscale_validate: unexpected all_gather_object payload {obj!r}")

    def check_rank(rank: int) -> dict[str, Any]:
        argv = argv_of_rank(rank)
        nproc = nproc_of_rank(rank) if nproc_of_rank else world
        os.environ.update({"WORLD_SIZE": str(world), "RANK": str(rank), "LOCAL_RANK": str(rank % max(nproc, 1))})
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        os.environ.update({k: str(v) for k, v in (env(rank) if callable(env) else env).items()})
        sys.argv = ["train_gpt.py", *argv, *APPENDED]
        info: dict[str, Any] = {"rank": rank, "device_type": device_of_rank[rank]}
        stage = "parse_args"
        sink = io.StringIO()
        torch.distributed.all_gather_object = fake_all_gather_object
        fs_args = None
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                args = fs.arguments.parse_args()
                state["args"] = args
                torch.distributed.init_process_group(
                    backend="fake", rank=rank, world_size=world, store=fs.FakeStore()
                )
                hetero = args.hetero_process_meshes is not None
                if hetero:  # megatron/training/initialize.py: initialize_megatron
                    stage = "pre_validate_args"
                    fs_args = fs.FSTrainArguments(args)
                    fs_args.pre_validate_args()
                stage = "validate_args"
                fs.arguments.validate_args(args, {})
                if hetero:
                    stage = "post_validate_args"
                    fs_args.post_validate_args()
                stage = "num_microbatches"
                fs.destroy_mbc()
                fs.init_mbc(
                    rank, args.rampup_batch_size, args.global_batch_size, args.micro_batch_size,
                    args.data_parallel_size, args.decrease_batch_size_if_needed,
                )
                info["num_microbatches"] = fs.get_num_microbatches()
                fs.destroy_mbc()
                if hetero:
                    stage = "parallel_context"
                    ctx = fs.parallel_context.ParallelContext(args)
                    info["mesh"] = ctx._current_process_mesh_index
                    info["logical_rank"] = ctx._rank_mapper.to_logical_ranks([rank])[0]
                    state["mapper"] = ctx._rank_mapper
                    state["meshes"] = [list(m) for m in args.hetero_process_meshes]
                else:
                    stage = "initialize_model_parallel"
                    try:
                        fs.parallel_state.initialize_model_parallel(
                            tensor_model_parallel_size=args.tensor_model_parallel_size,
                            pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                            virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
                            context_parallel_size=args.context_parallel_size,
                            expert_model_parallel_size=args.expert_model_parallel_size,
                            expert_tensor_parallel_size=args.expert_tensor_parallel_size,
                            create_gloo_process_groups=False,
                        )
                    finally:
                        fs.parallel_state.destroy_model_parallel()
                for key, name in (
                    ("tp", "tensor_model_parallel_size"), ("cp", "context_parallel_size"),
                    ("ep", "expert_model_parallel_size"), ("etp", "expert_tensor_parallel_size"),
                    ("dp", "data_parallel_size"), ("pp", "pipeline_model_parallel_size"),
                    ("mbs", "micro_batch_size"), ("sequence_parallel", "sequence_parallel"),
                ):
                    info[key] = getattr(args, name, None)
            info.update(ok=True, error=None, stage=None)
        except SystemExit as exc:  # argparse: unknown flag, bad value
            lines = [ln for ln in sink.getvalue().splitlines() if "error" in ln.lower()]
            info.update(ok=False, stage=stage, error=(lines[-1] if lines else f"argparse exited with {exc.code}").strip())
        except BaseException as exc:  # noqa: BLE001 - report whatever FlagScale raised
            info.update(ok=False, stage=stage, error=fs.describe(exc))
        finally:
            if fs_args is not None and fs_args.rank_mapper is not None:
                state.setdefault("mapper", fs_args.rank_mapper)
            fs.destroy_mbc()
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
            torch.distributed.all_gather_object = fs._orig_all_gather_object
        return info

    first = check_rank(0)
    checked.append(first)
    if first["ok"] and "meshes" in state:
        mapper, meshes = state["mapper"], state["meshes"]
        ranks: list[int] = []
        if all_ranks:
            ranks = list(range(1, world))
        else:
            offset = 0
            for tp, cp, _ep, dp, pp in meshes:
                if offset < world:
                    phys = mapper.to_physical_ranks([offset])[0]
                    if phys != 0 and phys not in ranks:
                        ranks.append(phys)
                offset += tp * cp * dp * pp
        for r in ranks:
            info = check_rank(r)
            checked.append(info)
            if not info["ok"]:
                break
    bad = next((c for c in checked if not c["ok"]), None)
    # Where FlagScale's RankMapper puts each mesh (not a FlagScale check: FlagScale never compares
    # a mesh's declared device type with the devices its ranks have).
    placement, warnings_ = [], []
    if "meshes" in state and "mapper" in state:
        mapper, offset = state["mapper"], 0
        types = flag_values(argv_of_rank(0), "--hetero-device-types") or []
        for i, (tp, cp, _ep, dp, pp) in enumerate(state["meshes"]):
            size = tp * cp * dp * pp
            phys = mapper.to_physical_ranks(list(range(offset, min(offset + size, world))))
            got = runs([device_of_rank[p] for p in phys])
            declared = types[i] if i < len(types) else None
            placement.append({"mesh": i, "declared": declared, "ranks": runs_of_ints(phys), "devices": got})
            if declared is not None and any(t is not None and t != declared for t, _n in got):
                warnings_.append(f"mesh {i} is declared {declared} but FlagScale's RankMapper gives it ranks of {got}")
            offset += size
    return {
        "ok": bad is None,
        "error": None if bad is None else bad["error"],
        "stage": None if bad is None else bad["stage"],
        "rank": None if bad is None else bad["rank"],
        "world_size": world,
        "device_types_by_rank": runs(device_of_rank),
        "checked": checked,
        "placement": placement,
        "warnings": warnings_,
    }


# ------------------------------------------------------------------------------------------------
# (b) raw flag lists
# ------------------------------------------------------------------------------------------------
def default_device_map(argv: list[str], world: int | None) -> tuple[list[str | None], list[str]]:
    """Ranks laid out mesh after mesh, each of its mesh's device type (the planner's stage order)."""
    notes = []
    meshes = [int(v) for v in flag_values(argv, "--hetero-process-meshes") or []]
    types = flag_values(argv, "--hetero-device-types") or []
    current = (flag_values(argv, "--hetero-current-device-type") or [None])[0]
    devices: list[str | None] = []
    if meshes and len(meshes) % 5 == 0 and len(types) == len(meshes) // 5:
        for i in range(0, len(meshes), 5):
            tp, cp, _ep, dp, pp = meshes[i : i + 5]
            devices += [types[i // 5]] * (tp * cp * dp * pp)
        notes.append("device types per rank: mesh after mesh (no hosts given)")
    if world is None:
        world = len(devices) or 1
        notes.append(f"world size {world}: the sum of the mesh sizes (no hosts or world size given)")
    if len(devices) != world:
        devices = [current] * world
        notes.append("device types per rank: every rank --hetero-current-device-type")
    return devices, notes


def raw_case(fs: FS, case: dict[str, Any], all_ranks: bool) -> dict[str, Any]:
    argv = [str(a) for a in case["argv"]]
    hosts = parse_hosts(case.get("hosts"))
    notes: list[str] = []
    nproc_of = None
    if hosts:
        devices = [t for t, n in hosts for _ in range(n)]
        ranks_nproc = [n for _t, n in hosts for _ in range(n)]
        nproc_of = lambda r: ranks_nproc[r]  # noqa: E731
        if case.get("world_size") not in (None, len(devices)):
            notes.append(f"world_size {case['world_size']} replaced by the hosts' {len(devices)}")
    else:
        world = case.get("world_size")
        devices, notes = default_device_map(argv, int(world) if world is not None else None)
    result = validate_job(
        fs, lambda r: with_current_type(argv, devices[r]), devices, case.get("env", {}), all_ranks, nproc_of
    )
    return {"name": case.get("name", ""), "source": "argv", **result, "notes": notes, "argv": argv}


# ------------------------------------------------------------------------------------------------
# (a) YAML: FlagScale's runner turns the config into per-host command lines
# ------------------------------------------------------------------------------------------------
def locate_config(path: str) -> tuple[str, str]:
    """(config dir, config name) for a .yaml file, a conf dir or an emit output dir."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        for cand in (path, os.path.join(path, "flagscale", "conf"), os.path.join(path, "conf")):
            if os.path.isfile(os.path.join(cand, "config.yaml")):
                return cand, "config"
        raise FileNotFoundError(f"no config.yaml in {path}, {path}/flagscale/conf or {path}/conf")
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    return os.path.dirname(path), os.path.splitext(os.path.basename(path))[0]


def locate_hostfile(name: str | None, conf_dir: str) -> str | None:
    if not name:
        return None
    if os.path.isabs(name):
        return name if os.path.isfile(name) else None
    d = conf_dir
    for _ in range(4):
        cand = os.path.join(d, name)
        if os.path.isfile(cand):
            return cand
        d = os.path.dirname(d)
    return None


_VERBOSE = False


def quiet_flagscale_logger() -> None:
    """FlagScale's logger logs every config and every (dry-run) ssh command at INFO."""
    if not _VERBOSE:
        import logging

        logging.getLogger("FlagScale").setLevel(logging.ERROR)


_CMD = re.compile(r'^cmd="(.*)"$', re.M)


def runner_commands(config_path: str, hostfile: str | None, workdir: str) -> dict[str, Any]:
    """Per-host commands from FlagScale's own runner (dry run), in `workdir`."""
    from hydra import compose, initialize_config_dir

    from flagscale.runner import runner_train
    from flagscale.runner.utils import get_nproc_per_node, update_nodes_envs

    quiet_flagscale_logger()

    conf_dir, name = locate_config(config_path)
    exp_dir = os.path.join(workdir, "exp")
    overrides = [f"++experiment.exp_dir={exp_dir}"]
    with initialize_config_dir(config_dir=conf_dir, version_base=None):
        probe = compose(config_name=name)
    declared = probe.experiment.runner.get("hostfile", None)
    hostfile_used = os.path.abspath(hostfile) if hostfile else locate_hostfile(declared, conf_dir)
    notes = []
    if declared and hostfile_used is None:
        notes.append(f"host file {declared!r} not found beside the config: FlagScale runs on localhost only")
    overrides.append(f"++experiment.runner.hostfile={hostfile_used}" if hostfile_used else "++experiment.runner.hostfile=null")
    with initialize_config_dir(config_dir=conf_dir, version_base=None):
        config = compose(config_name=name, overrides=overrides)
    entry = config.experiment.task.entrypoint
    out: dict[str, Any] = {"config": os.path.join(conf_dir, name + ".yaml"), "hostfile": hostfile_used, "notes": notes}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        runner = runner_train.SSHTrainRunner(config)
        try:
            runner.run(dryrun=True)
            out["runner_error"] = None
        except BaseException as exc:  # noqa: BLE001
            tb = traceback.extract_tb(exc.__traceback__)
            loc = f"{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else "?"
            # multiprocessing re-raises the worker's exception; its text carries the worker's traceback
            m = re.findall(r'File ".*?/(flagscale/[^"]+)", line (\d+)', str(getattr(exc, "__cause__", "") or ""))
            if m:
                loc = f"{m[-1][0]}:{m[-1][1]}"
            out["runner_error"] = f"{type(exc).__name__}: {exc} ({loc})"
            # Still produce each host's command with the runner's own per-host code.
            if runner.resources is not None:
                nnodes = len(runner.resources)
                for node_rank, (host, info) in enumerate(runner.resources.items()):
                    envs = update_nodes_envs(runner.user_envs, host, info)
                    nproc = get_nproc_per_node(info["slots"], config.experiment.runner.get("nproc_per_node", None), None)
                    runner._run_each(host, host, 29500, nnodes, node_rank, nproc, device_type=info["type"],
                                     dryrun=True, cur_envs=envs)
    scripts = glob.glob(os.path.join(exp_dir, "**", "host_*_run.sh"), recursive=True)
    hosts = []
    for path in scripts:
        m = re.match(r"host_(\d+)_(.*)_run\.sh$", os.path.basename(path))
        text = open(path).read()
        cmd = _CMD.search(text)
        if not m or not cmd:
            continue
        words = shlex.split(cmd.group(1))
        if entry not in words:
            raise RuntimeError(f"entrypoint {entry} not in the runner's command: {cmd.group(1)[:200]}")
        at = words.index(entry)
        launcher, argv = words[:at], words[at + 1 :]
        nproc = int((flag_values(launcher, "--nproc_per_node") or ["1"])[0])
        env = dict(w.split("=", 1) for w in launcher if re.match(r"^[A-Za-z_][A-Za-z_0-9]*=", w))
        dtype = (flag_values(argv, "--hetero-current-device-type") or [None])[0]
        hosts.append({"node_rank": int(m.group(1)), "host": m.group(2), "nproc": nproc, "device_type": dtype,
                      "env": env, "argv": argv})
    hosts.sort(key=lambda h: h["node_rank"])
    out["hosts"] = hosts
    # Words bash would expand inside the run script's cmd="..." (FlagScale does not resolve them).
    dollars = sorted({w for h in hosts for w in h["argv"] if "$" in w})
    if dollars:
        out["notes"].append(
            "left to bash by FlagScale's run script (cmd=\"...\" expands them, to the run script's own "
            f"arguments, i.e. empty): {dollars}"
        )
    return out


def yaml_case(fs: FS, config_path: str, hostfile: str | None, all_ranks: bool) -> dict[str, Any]:
    name = config_path
    config_path = os.path.abspath(config_path)
    hostfile = os.path.abspath(hostfile) if hostfile else None
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="flagscale-validate-") as work:
        os.chdir(work)
        try:
            conv = runner_commands(config_path, hostfile, work)
        except BaseException as exc:  # noqa: BLE001
            return {"name": name, "source": "yaml", "ok": False, "stage": "runner",
                    "error": f"{type(exc).__name__}: {exc} ({fs.where(exc)})", "runner_error": None}
        finally:
            os.chdir(cwd)
    hosts = conv.pop("hosts")
    base = {"name": name, "source": "yaml", **conv}
    if not hosts:
        return {**base, "ok": False, "stage": "runner", "error": conv.get("runner_error") or "the runner wrote no command"}
    devices: list[str | None] = []
    host_of_rank: list[int] = []
    for i, h in enumerate(hosts):
        devices += [h["device_type"]] * h["nproc"]
        host_of_rank += [i] * h["nproc"]
    result = validate_job(
        fs,
        lambda r: hosts[host_of_rank[r]]["argv"],
        devices,
        lambda r: hosts[host_of_rank[r]]["env"],
        all_ranks,
        lambda r: hosts[host_of_rank[r]]["nproc"],
    )
    # ok means FlagScale can both launch it (runner) and accept it (arguments, meshes);
    # args_ok: the arguments and meshes alone.
    result["args_ok"] = result["ok"]
    if conv.get("runner_error") and result["ok"]:
        result.update(ok=False, stage="runner", error=conv["runner_error"])
    return {
        **base,
        **result,
        "hosts": [{k: h[k] for k in ("node_rank", "host", "nproc", "device_type", "env")} for h in hosts],
        "argv": hosts[0]["argv"],
    }


# ------------------------------------------------------------------------------------------------
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="*", help="FlagScale experiment configs (.yaml, conf dir, or emit dir)")
    p.add_argument("--hostfile", help="host file for the configs (default: the config's, found beside it)")
    p.add_argument("--args-file", action="append", default=[], help="raw flag list (megatron_args.txt)")
    p.add_argument("--cases", help="JSON list of raw cases, - for stdin")
    p.add_argument("--hosts", help="TYPE:N,... for --args-file")
    p.add_argument("--world-size", type=int, help="world size for --args-file")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="for --args-file: what the launcher exports (e.g. CUDA_DEVICE_MAX_CONNECTIONS=1)")
    p.add_argument("--all-ranks", action="store_true", help="check every rank, not one per process mesh")
    p.add_argument("--verbose", action="store_true", help="let FlagScale's own log through (on stderr)")
    ns = p.parse_args()
    warnings.filterwarnings("ignore")
    # FlagScale's logger and Megatron's prints write to stdout: send fd 1 to stderr while they
    # run, and keep the real stdout for the JSON.
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    global _VERBOSE
    _VERBOSE = ns.verbose
    t0 = time.time()
    fs = FS()
    t_import = time.time() - t0
    results = []
    for cfg in ns.configs:
        t = time.time()
        results.append(yaml_case(fs, cfg, ns.hostfile, ns.all_ranks) | {"seconds": round(time.time() - t, 2)})
    cases = []
    hosts = ns.hosts
    if ns.args_file and not hosts and ns.hostfile:  # the host file's nodes, read by FlagScale
        from flagscale.runner.utils import parse_hostfile

        quiet_flagscale_logger()
        hosts = [[info["type"], info["slots"]] for info in (parse_hostfile(ns.hostfile) or {}).values()]
    env = dict(kv.split("=", 1) for kv in ns.env)
    for path in ns.args_file:
        with open(path) as f:
            argv = shlex.split(f.read(), comments=True)
        cases.append({"name": path, "argv": argv, "world_size": ns.world_size, "hosts": hosts, "env": env})
    if ns.cases:
        cases += json.load(sys.stdin if ns.cases == "-" else open(ns.cases))
    for case in cases:
        t = time.time()
        results.append(raw_case(fs, case, ns.all_ranks) | {"seconds": round(time.time() - t, 2)})
    json.dump(results, out, indent=1)
    out.write("\n")
    out.flush()
    print(f"flagscale_validate: {len(results)} input(s), {sum(r['ok'] for r in results)} accepted, "
          f"import {t_import:.1f} s, total {time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
