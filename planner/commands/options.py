"""Click options shared by estimate, solve, compare and friends, and the input resolution they share."""

from __future__ import annotations

from typing import Any, Callable

import click

from planner.errors import PlannerInputError
from planner.megatron.flags import OVERRIDE_FLAGS

MODEL_OPTIONS = [
    click.option("--model", "model", default=None, metavar="PRESET|FILE",
                 help="model preset name (e.g. mixtral-s), a YAML file, or a HuggingFace config.json"),
    click.option("--megatron-args", default=None, metavar='"FLAGS"', help="Megatron-LM flags for pretrain_gpt.py"),
    click.option("--megatron-script", default=None, type=click.Path(dir_okay=False), metavar="FILE",
                 help="a bash launcher script that runs pretrain_gpt.py; its own arguments go after `--`; "
                      "with --megatron-args, those flags override the script's"),
]
# `cli.py solve --megatron-script train.sh -- /ckpt /data`: the script's own arguments
SCRIPT_ARGS = [click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT_ARG...]")]
CLUSTER_OPTIONS = [
    click.option("--cluster", required=True, metavar="SPEC",
                 help="TYPE:COUNT[,TYPE:COUNT...] (e.g. H800:16,MI300X:16,910B:16), a preset name, or a YAML file"),
    click.option("--profiles", "profile_dirs", multiple=True, type=click.Path(file_okay=False),
                 help="directory of measured profiles / corrections (overrides shipped ones; repeatable)"),
]
TRAINING_OVERRIDES = [
    click.option("--mbs", type=click.IntRange(min=1), default=None, help="micro-batch size"),
    click.option("--gbs", type=click.IntRange(min=1), default=None, help="global batch size"),
    click.option("--seq", type=click.IntRange(min=1), default=None, help="sequence length"),
]
ASSUMPTION_OPTIONS = [
    click.option("--moe-imbalance", "moe_imbalance", type=float, default=None, metavar="FACTOR",
                 help="MoE router imbalance: max/mean tokens per expert (>= 1; default: a calibration from "
                      "--profiles, else 1.1)"),
]
DEFAULT_PLOT_DIR = "plots"
DISPLAY_OPTIONS = [
    click.option("--plot", "plot_dir", is_flag=False, flag_value="", default=None, metavar="[DIR]",
                 help=f"draw the placement, a pipeline timeline and memory per stage (PNG + JSON data + "
                      f"summary.md) into DIR (default ./{DEFAULT_PLOT_DIR}); with --out they always go to OUT/plots"),
    click.option("--wide", is_flag=True, help="a wider table: communication and memory broken down per stage"),
]
PARALLEL_OVERRIDES = [
    click.option("--tp", type=click.IntRange(min=1), default=None),
    click.option("--pp", type=click.IntRange(min=1), default=None),
    click.option("--cp", type=click.IntRange(min=1), default=None),
    click.option("--ep", type=click.IntRange(min=1), default=None),
    click.option("--etp", type=click.IntRange(min=1), default=None),
    click.option("--vpp", type=click.IntRange(min=1), default=None, help="virtual stages per pipeline rank"),
    click.option("--layout", default=None, help="pipeline layout string, Megatron grammar (E|t*4|...|L)"),
    click.option("--recompute", default=None,
                 help="none | selective | full | full-block:K | full-uniform:K"),
]


def apply_options(options: list) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for opt in reversed(options):
            fn = opt(fn)
        return fn

    return deco


def check_plot_dir(plot_dir: str | None, out_dir: str | None) -> str | None:
    """Where --plot writes when there is no --out (None: no plots); with --out the plots always go
    to OUT/plots, so a --plot DIR there is refused rather than ignored."""
    from planner.errors import PlannerInputError

    if plot_dir is None:
        return None
    if out_dir is not None:
        if plot_dir:
            raise PlannerInputError("--plot", f"with --out the plots go to {out_dir}/plots; give --plot without a "
                                    "directory, or drop --out")
        return None
    return plot_dir or DEFAULT_PLOT_DIR


def load_inputs(*, model, megatron_args, megatron_script, cluster, profile_dirs, overrides: dict,
                moe_imbalance: float | None = None, script_args=(), quiet: bool = False, allow_invalid: bool = False):
    """Resolve (MegatronRun, ClusterSpec, ProfileSet) from CLI options.  The run lists in `assumed`
    the values no input stated (planner/inputs/assumed.py); what the input reader did not model is
    printed on stderr, one `note:` line each."""
    import math

    from planner.errors import PlannerInputError
    from planner.inputs.assumed import IMBALANCE_FLAG, imbalance_assumption
    from planner.inputs.cluster import parse_cluster
    from planner.inputs.resolve import resolve_run
    from planner.profile_tables import ProfileSet

    if moe_imbalance is not None and not (math.isfinite(moe_imbalance) and moe_imbalance >= 1.0):
        raise PlannerInputError(IMBALANCE_FLAG, f"expected a finite number >= 1 (max/mean tokens per expert), "
                                f"got {moe_imbalance}")
    profiles = ProfileSet.load(extra_dirs=list(profile_dirs or ()))
    cluster_spec = parse_cluster(cluster, profiles)
    clean = {k: v for k, v in overrides.items() if v is not None}
    notes: list[str] = []
    try:
        run = resolve_run(model=model, megatron_args=megatron_args, megatron_script=megatron_script,
                          script_args=list(script_args or ()), world_size=cluster_spec.world_size, overrides=clean,
                          notes=notes, allow_invalid=allow_invalid)
    except PlannerInputError as exc:
        raise _in_override_terms(exc, clean) from None
    check_precision(run.training.precision, cluster_spec, profiles)
    if not quiet:
        for note in notes:
            click.echo(f"note: {note}", err=True)
    if moe_imbalance is not None:
        run = run.model_copy(update={"training": run.training.model_copy(
            update={"moe_imbalance_factor": float(moe_imbalance)})})
    run = imbalance_assumption(run, cluster_spec, profiles, user_profiles=bool(profile_dirs))
    return run, cluster_spec, profiles


def _in_override_terms(exc, overrides: dict):
    """An error about a Megatron flag that a CLI override set names the override too (`--ep`, not only
    `--expert-model-parallel-size`)."""
    field = getattr(exc, "field", "")
    for key, flag in OVERRIDE_FLAGS.items():
        if key in overrides and field == flag:
            message = str(exc)[len(field) + 2:] if str(exc).startswith(field + ": ") else str(exc)
            return PlannerInputError(f"--{key} ({flag})", message)
    return exc


def check_precision(precision: str, cluster_spec, profiles) -> None:
    """Every device of the cluster must run the run's precision (a V100 has no bf16)."""
    from planner.errors import MissingProfileError

    for device_type in cluster_spec.device_types:
        device = profiles.device(device_type)
        try:
            device.peak_flop_per_s(precision)
        except MissingProfileError:
            supported = ", ".join(sorted(device.peak_tflops))
            raise PlannerInputError(
                "--cluster",
                f"{device_type} does not run {precision} (it runs {supported}); choose other devices, or a "
                f"precision it runs (--fp16 in --megatron-args, or precision: in the model file's training block)",
            ) from None
