"""Run FlagScale's own heterogeneous auto-tuner standalone: its search space, its strategy
enumeration and its pruning, on a model and a cluster, without launching a job.

Runs with the Python of the FlagScale environment (`bash .ci/flagscale_env.sh` prints it).  Nothing
of FlagScale is copied here: the tuner is `flagscale.runner.auto_tuner.AutoTuner` (flag-scale 0.8.0),
built as `python run.py ... action=auto_tune` builds it, in hetero mode
(`train.system.hetero.enable_hetero: true`), which makes it use `flagscale/runner/auto_tuner/hetero/`:
`HeteroSearcher` (space and strategies), `HeteroPruner` (hetero rules, then the base `Pruner`:
memory model and history rules), `HeteroGenerator` (strategy -> task config).

What the tuner does after that, `AutoTuner.tune()`, is not run: for each candidate it launches a
training job (`SSHTrainRunner.run`, ssh to every host), waits for it, greps the job's log for
"elapsed time per iteration" and the peak memory, and finally runs the fastest.  It has no cost
model: without a cluster nothing ranks the candidates but the order of its grid (`GridAlgo`, or,
with `experiment.auto_tuner.memory_model`, the theoretical memory, largest first).  So this tool
prints every candidate the tuner would launch, in its order, with the search time; the first is the
one it would run first.  Its history rules prune only on measured results (a faster smaller
micro-batch, an OOM), so here they prune nothing; its memory model (`memory_model.default_model`:
`flagscale/train/theoretical_memory_usage.py`) runs when the config asks for it (`--gpu-memory-mb`)
and is homogeneous: it prices mesh 0's TP and DP with the global PP.

Inputs, one of:

  --config FILE [--hostfile FILE]
      a FlagScale auto-tune experiment config (e.g. flag_scale/examples/aquila/conf/
      hetero_auto_tuner.yaml) with its experiment.auto_tuner.space; the host file (`NAME slots=N
      type=T`) from the config or --hostfile.
  --train FILE --cluster TYPE:N,...  [--nproc-per-node 8] [--space JSON]
                                     [--gpu-memory-mb MB [--gpu-utilization LO,HI]]
      the model from a FlagScale train config (system/model/data: e.g. the
      flagscale/conf/train/hapmoe.yaml that `hapmoe emit --runtime flagscale` writes) and a cluster
      (TYPE:N GPUs, nodes of --nproc-per-node); a host file is written with one line per node, and
      one mesh template per device type, in cluster order: [TP, CP, EP, DP, PP] =
      ['auto', 1, 'auto' for MoE else 1, 'auto', 'auto'] ('auto' = every divisor of the mesh's
      GPUs); --space (JSON) replaces any key of experiment.auto_tuner.space (FlagScale's defaults
      otherwise: micro_batch_size [1], use_distributed_optimizer [true, false], sequence_parallel
      [true, false], use_recompute [true, false], ...).

  --validate N   run the first N candidates' task configs (HeteroGenerator.gen) through FlagScale's
                 own runner and checks (tools/flagscale_validate.py)
  --limit N      candidates printed (default 50; 0 = all); the counts cover all
  --full-only    print only candidates whose meshes add up to every GPU of the host file (a filter of
                 ours: the tuner also proposes meshes on a subset of the nodes, but its runner
                 launches on every host, so FlagScale refuses them: "World size mismatch")
  --time-limit S stop the tuner after S seconds (reported as timed out, with what it had)
  --skip-history-rules
                 leave out the base Pruner's history rules: every one needs a measured performance
                 or an OOM in the history, so before any job ran they prune nothing, but they compare
                 each strategy with all earlier ones (quadratic: 133 s for 1,388 strategies)

Output: one JSON object on stdout; exit 0 when it ran.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

KEYS = (
    "idx", "hetero_device_types", "hetero_process_meshes", "pipeline_model_parallel_size",
    "hetero_pipeline_layer_split", "micro_batch_size", "use_distributed_optimizer", "sequence_parallel",
    "use_recompute", "recompute_method", "recompute_granularity", "recompute_num_layers",
    "num_layers_per_virtual_pipeline_stage", "memory_model", "pruned", "prune_reason",
)


class TimeLimit(Exception):
    pass


def parse_cluster(spec: str) -> list[tuple[str, int]]:
    out = []
    for part in spec.split(","):
        typ, _, n = part.strip().rpartition(":")
        out.append((typ, int(n)))
    return out


def build_config(ns: argparse.Namespace, work: str) -> tuple[Any, list[str]]:
    """The auto-tune experiment config, composed by hydra as run.py composes it."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    notes: list[str] = []
    exp_dir = os.path.join(work, "exp")
    if ns.config:
        path = os.path.abspath(ns.config)
        overrides = [f"++experiment.exp_dir={exp_dir}"]
        if ns.hostfile:
            overrides.append(f"++experiment.runner.hostfile={os.path.abspath(ns.hostfile)}")
        with initialize_config_dir(config_dir=os.path.dirname(path), version_base=None):
            config = compose(config_name=os.path.splitext(os.path.basename(path))[0], overrides=overrides)
        hf = config.experiment.runner.get("hostfile", None)
        if hf and not os.path.isabs(hf):
            cand = os.path.join(os.path.dirname(path), hf)
            if os.path.isfile(cand):
                config.experiment.runner.hostfile = cand
        return config, notes

    with open(ns.train) as f:
        import yaml

        train = yaml.safe_load(f)
    cluster = parse_cluster(ns.cluster)
    nproc = ns.nproc_per_node
    lines, types = [], []
    for typ, gpus in cluster:
        if typ not in types:
            types.append(typ)
        full, rest = divmod(gpus, nproc)
        for i in range(full + (1 if rest else 0)):
            lines.append(f"{typ.lower()}-node{sum(1 for ln in lines if ln.startswith(typ.lower() + '-'))} "
                         f"slots={nproc if i < full else rest} type={typ}")
    hostfile = os.path.join(work, "hostfile")
    with open(hostfile, "w") as f:
        f.write("\n".join(lines) + "\n")
    model = train.setdefault("model", {})
    system = train.setdefault("system", {})
    moe = bool(model.get("num_experts"))
    hetero = system.setdefault("hetero", {})
    hetero["enable_hetero"] = True
    hetero["hetero_device_types"] = types
    hetero.setdefault("hetero_current_device_type", types[0])
    hetero.pop("expert_tensor_parallel_size_per_process_mesh", None)
    hetero.pop("use_partial_reduce_for_shared_embedding", None)
    space: dict[str, Any] = {
        "hetero_process_meshes": [x for _ in types for x in ("auto", 1, "auto" if moe else 1, "auto", "auto")],
        "hetero_pipeline_layer_split": "auto",
    }
    space.update(json.loads(ns.space) if ns.space else {})
    # What FlagScale's generator and runner need of a train config that a plain Megatron one lacks.
    if "optimizer" not in model:
        model["optimizer"] = {"lr_scheduler": {}}
        notes.append("train.model.optimizer.lr_scheduler: {} added (HeteroGenerator.gen asserts it)")
    if "logging" not in system:
        system["logging"] = {}
        notes.append("train.system.logging: {} added (HeteroGenerator.gen sets its log_interval)")
    ckpt = system.setdefault("checkpoint", {})
    if "save_interval" not in ckpt and "save_interval" not in system.get("logging", {}):
        ckpt["save_interval"] = 2000
        notes.append("train.system.checkpoint.save_interval: 2000 added (FlagScale's runner always passes --save)")
    system.pop("recompute", None)  # the tuner decides recompute; per-stage lists would be stale
    if ns.gpu_memory_mb:
        data = train.setdefault("data", {})
        if "vocab_size" in data and "tokenizer" not in data:
            data["tokenizer"] = {"vocab_size": data.pop("vocab_size")}
            notes.append("train.data.vocab_size moved to train.data.tokenizer.vocab_size (the memory model reads it there; "
                         "the same --vocab-size flag)")
    experiment = {
        "exp_name": "hapmoe_autotune",
        "exp_dir": exp_dir,
        "task": {"type": "train", "backend": "megatron", "entrypoint": "flagscale/train/train_gpt.py"},
        "runner": {"backend": "torchrun", "nnodes": len(lines), "nproc_per_node": nproc, "hostfile": hostfile},
        "envs": {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(nproc)), "CUDA_DEVICE_MAX_CONNECTIONS": 1},
        "auto_tuner": {"space": space, "control": {"max_time_per_task": 300, "train_iters": 5}},
    }
    if ns.gpu_memory_mb:
        memory_model: dict[str, Any] = {"gpu_memory": ns.gpu_memory_mb}
        if ns.gpu_utilization:  # FlagScale's default [0.2, 0.8]: prunes plans using under 20% or over 80%
            memory_model["gpu_utilization"] = [float(x) for x in ns.gpu_utilization.split(",")]
        experiment["auto_tuner"]["memory_model"] = memory_model
    conf_dir = os.path.join(work, "conf")
    os.makedirs(os.path.join(conf_dir, "train"), exist_ok=True)
    with open(os.path.join(conf_dir, "train", "model.yaml"), "w") as f:
        yaml.safe_dump(train, f, sort_keys=False)
    with open(os.path.join(conf_dir, "config.yaml"), "w") as f:
        yaml.safe_dump({"defaults": [{"train": "model"}, "_self_"], "experiment": experiment, "action": "auto_tune"},
                       f, sort_keys=False)
    with initialize_config_dir(config_dir=conf_dir, version_base=None):
        config = compose(config_name="config")
    OmegaConf.set_struct(config, False)
    return config, notes


def quiet(verbose: bool) -> None:
    """FlagScale's loggers (created at import, INFO) log every strategy."""
    if not verbose:
        for name in ("FlagScale", "FlagScale-AutoTuner"):
            logging.getLogger(name).setLevel(logging.ERROR)


def strategy_json(s: dict[str, Any]) -> dict[str, Any]:
    out = {k: s[k] for k in KEYS if k in s}
    meshes = s.get("hetero_process_meshes") or []
    out["world_size"] = sum(tp * cp * dp * pp for tp, cp, _ep, dp, pp in meshes)
    return out


def run(ns: argparse.Namespace) -> dict[str, Any]:
    from omegaconf import OmegaConf

    result: dict[str, Any] = {"ok": False, "error": None, "tuner": "flag-scale 0.8.0 flagscale.runner.auto_tuner.AutoTuner (hetero)"}
    work = tempfile.mkdtemp(prefix="flagscale-autotune-")
    cwd = os.getcwd()
    os.chdir(work)
    candidates: list[dict[str, Any]] = []
    stats = {"strategies": None, "pruned": 0, "pruned_by_memory_model": 0, "candidates": 0}
    seconds: dict[str, float] = {}
    tuner = None
    try:
        config, notes = build_config(ns, work)
        result["notes"] = notes
        result["hostfile"] = open(config.experiment.runner.hostfile).read().splitlines() if config.experiment.runner.get("hostfile") else None
        result["space"] = OmegaConf.to_container(config.experiment.auto_tuner.get("space", {}), resolve=True)
        result["model"] = {k: config.train.model.get(k) for k in (
            "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
            "num_experts", "moe_router_topk", "micro_batch_size", "global_batch_size",
            "untie_embeddings_and_output_weights") if k in config.train.model}
        from flagscale.runner.auto_tuner import AutoTuner

        quiet(ns.verbose)
        if ns.skip_history_rules:
            from flagscale.runner.auto_tuner.prune import pruner as pruner_module

            pruner_module._HISTORY_BASED_PRUNE_FUNC = []
            notes.append("history rules skipped (--skip-history-rules): each needs a measured performance or OOM")
        if ns.time_limit:
            def on_alarm(*_a):
                raise TimeLimit()

            signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, ns.time_limit)
        t0 = time.perf_counter()
        tuner = AutoTuner(config)  # HeteroSearcher.build_space + build_strategies (+ memory model)
        seconds["build"] = time.perf_counter() - t0
        stats["strategies"] = len(tuner.searcher.strategies)
        t1 = time.perf_counter()
        # AutoTuner.gen() without the HeteroGenerator's per-task config copy: the search and the pruner,
        # in the tuner's own order, until need_stop().
        while not tuner.need_stop():
            strategy = tuner.searcher.search()
            while strategy and tuner.pruner.prune(strategy, tuner.history):
                strategy = tuner.searcher.search()
            if not strategy:
                break
            # not launched: nothing measured (the history rules read these)
            strategy.setdefault("performance", None)
            strategy.setdefault("max_mem", None)
            # a copy: the tuner may hand out the same strategy object twice (see "order" below)
            candidates.append({**strategy, "idx": len(candidates) + 1})
        seconds["prune"] = time.perf_counter() - t1
        seconds["search"] = seconds["build"] + seconds["prune"]
        result["ok"] = True
    except TimeLimit:
        result["error"] = f"time limit: the tuner ran past {ns.time_limit} s"
        result["timed_out"] = True
    except BaseException as exc:  # noqa: BLE001
        last = traceback.extract_tb(exc.__traceback__)[-1]
        result["error"] = f"{type(exc).__name__}: {exc} ({os.path.basename(last.filename)}:{last.lineno})"
    finally:
        if ns.time_limit:
            signal.setitimer(signal.ITIMER_REAL, 0)
        os.chdir(cwd)
    if tuner is not None:
        stats["strategies"] = len(tuner.searcher.strategies)
        stats["pruned"] = tuner.pruner.pruned_count
        stats["pruned_by_memory_model"] = tuner.pruner.pruned_by_memory_model
        reasons: dict[str, int] = {}
        for h in tuner.history:
            if h.get("pruned"):
                key = h.get("prune_reason") or ("memory model" if h.get("max_mem") == "OOM" or "memory_model" in h else "history")
                reasons[key] = reasons.get(key, 0) + 1
        stats["pruned_reasons"] = reasons
    stats["candidates"] = len(candidates)
    unique = {json.dumps(strategy_json({k: v for k, v in c.items() if k != "idx"}), sort_keys=True) for c in candidates}
    stats["unique_candidates"] = len(unique)
    if len(candidates) > 1 and strategy_json({**candidates[0], "idx": 0}) == strategy_json({**candidates[-1], "idx": 0}):
        result["order"] = ("AutoTuner.__init__ leaves GridAlgo.idx at -1 on a fresh start, so the tuner searches the "
                           "last strategy first and again at the end")
    if tuner is not None:
        stats["total_cards"] = int(tuner.config.experiment.auto_tuner.cards)
        stats["candidates_on_fewer_cards"] = sum(1 for c in candidates if strategy_json(c)["world_size"] != stats["total_cards"])
    result["seconds"] = {k: round(v, 3) for k, v in seconds.items()}
    result["counts"] = stats
    listed = candidates
    if ns.full_only and tuner is not None:  # ours, not the tuner's: FlagScale's runner launches every host
        listed = [c for c in candidates if strategy_json(c)["world_size"] == stats["total_cards"]]
    limit = len(listed) if ns.limit == 0 else ns.limit
    result["candidates"] = [strategy_json(c) for c in listed[:limit]]
    result["first"] = strategy_json(candidates[0]) if candidates else None
    try:
        if ns.validate and candidates and tuner is not None:
            result["validated"] = validate(tuner, candidates[: ns.validate], work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def validate(tuner, candidates: list[dict[str, Any]], work: str) -> list[dict[str, Any]]:
    """Each candidate's task config (HeteroGenerator.gen) through FlagScale's runner and checks."""
    from omegaconf import OmegaConf

    sys.path.insert(0, HERE)
    import flagscale_validate as fv

    fv._VERBOSE = False
    fs = fv.FS()
    out = []
    for c in candidates:
        try:
            task = tuner.generator.gen(copy.deepcopy(c))
        except BaseException as exc:  # noqa: BLE001
            out.append({"idx": c["idx"], "ok": False, "stage": "generator", "error": fs.describe(exc)})
            continue
        path = os.path.join(work, "tasks", f"task_{c['idx']}.yaml")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        OmegaConf.save(task, path)
        r = fv.yaml_case(fs, path, None, False)
        out.append({"idx": c["idx"], "ok": r["ok"], "args_ok": r.get("args_ok"), "stage": r.get("stage"),
                    "error": r.get("error"), "world_size": r.get("world_size"),
                    "warnings": r.get("warnings", [])})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="FlagScale auto-tune experiment config")
    p.add_argument("--hostfile", help="host file for --config")
    p.add_argument("--train", help="FlagScale train config (system/model/data)")
    p.add_argument("--cluster", help="TYPE:GPUS,... for --train")
    p.add_argument("--nproc-per-node", type=int, default=8)
    p.add_argument("--space", help="JSON: keys of experiment.auto_tuner.space to set")
    p.add_argument("--gpu-memory-mb", type=float, help="turn on FlagScale's memory model with this budget")
    p.add_argument("--gpu-utilization", help="LO,HI for the memory model (FlagScale's default 0.2,0.8)")
    p.add_argument("--validate", type=int, default=0, help="check the first N candidates with FlagScale's validator")
    p.add_argument("--limit", type=int, default=50, help="candidates printed (0 = all)")
    p.add_argument("--time-limit", type=float, help="seconds")
    p.add_argument("--full-only", action="store_true",
                   help="list only candidates whose meshes use every GPU of the host file (the counts cover all)")
    p.add_argument("--skip-history-rules", action="store_true",
                   help="leave out the pruner's history rules (quadratic; they prune nothing before any job ran)")
    p.add_argument("--verbose", action="store_true", help="FlagScale's logs on stderr")
    ns = p.parse_args()
    if bool(ns.config) == bool(ns.train) or (ns.train and not ns.cluster):
        p.error("give --config, or --train with --cluster")
    warnings.filterwarnings("ignore")
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # FlagScale prints (strategy=..., its logger) go to stderr
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if not ns.verbose:  # the tuner logs (and prints) every strategy
            logging.disable(logging.INFO)
            stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        result = run(ns)
    result["seconds"]["total_with_imports"] = round(time.perf_counter() - t0, 3)
    json.dump(result, out, indent=1)
    out.write("\n")
    out.flush()


if __name__ == "__main__":
    main()
