"""Click options shared by estimate, solve, compare and friends."""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import click

from planner.cli_common import EnvDefaultOption, FiniteFloat, shown
from planner.errors import PlannerInputError
from planner.uncertainty import shipped_uncertainty
from planner.output.run_dir import PLOTS_OUTPUT, check_out_dir

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
def cluster_options(required: bool = True) -> list:
    """--cluster (required, except where another input names the cluster) and --profiles."""
    return [
        click.option("--cluster", required=required, default=None, metavar="SPEC",
                     help="TYPE:COUNT[,TYPE:COUNT...] (e.g. H800:16,MI300X:16,910B:16), a preset name, or a YAML file"),
        click.option("--profiles", "profile_dirs", multiple=True, type=click.Path(file_okay=False),
                     help="directory of measured profiles / corrections (overrides shipped ones; repeatable)"),
    ]


CLUSTER_OPTIONS = cluster_options()
TRAINING_OVERRIDES = [
    click.option("--mbs", type=click.IntRange(min=1), default=None, help="micro-batch size"),
    click.option("--gbs", type=click.IntRange(min=1), default=None, help="global batch size"),
    click.option("--seq", type=click.IntRange(min=1), default=None, help="sequence length"),
]
ASSUMPTION_OPTIONS = [
    click.option("--moe-imbalance", "moe_imbalance", type=float, default=None, metavar="FACTOR",
                 help="MoE router imbalance: max/mean tokens per expert (>= 1; default: a calibration from "
                      "--profiles, else the shipped calibration of the published runs; the output lists the "
                      "value used and where it came from)"),
]
TIME_LIMIT_ENV = "HAPMOE_TIME_LIMIT"  # when set, the default of solve's and compare's --time-limit


def time_limit_option(help_text: str):
    """--time-limit S (default 60 s, or $HAPMOE_TIME_LIMIT when it is set; the option wins)."""
    return click.option("--time-limit", "time_limit_s", type=FiniteFloat(min=0.1), default=60.0, show_default=True,
                        envvar=TIME_LIMIT_ENV, show_envvar=True, cls=EnvDefaultOption, help=help_text)


MAX_MEMORY_HEADROOM = 0.9
HEADROOM_OPTIONS = [
    click.option("--memory-headroom", "memory_headroom", type=FiniteFloat(min=0.0, max=MAX_MEMORY_HEADROOM),
                 default=None, metavar="FRACTION",
                 help=f"fraction of each device's memory a plan keeps free, 0 to {MAX_MEMORY_HEADROOM:g} (default "
                      f"{shipped_uncertainty().memory_headroom:g}: the memory model's worst measured "
                      f"under-prediction, profiles/uncertainty.yaml)"),
]
DEFAULT_PLOT_DIR = "plots"


def display_options(with_out: bool) -> list:
    """--plot [DIR] and --wide; `with_out`: the command also has --out, which then holds the plots."""
    out = "; with --out they always go to OUT/plots" if with_out else ""
    return [
        click.option("--plot", "plot_dir", is_flag=False, flag_value="", default=None, metavar="[DIR]",
                     help=f"draw the placement, a pipeline timeline and memory per stage (PNG + JSON data + "
                          f"summary.md) into DIR (default ./{DEFAULT_PLOT_DIR}){out}"),
        click.option("--wide", is_flag=True, help="a wider table: communication and memory broken down per stage"),
    ]


PARALLEL_OVERRIDES = [
    click.option("--tp", type=click.IntRange(min=1), default=None,
                 help="tensor-parallel size (Megatron's --tensor-model-parallel-size)"),
    click.option("--pp", type=click.IntRange(min=1), default=None,
                 help="pipeline stages (Megatron's --pipeline-model-parallel-size)"),
    click.option("--cp", type=click.IntRange(min=1), default=None,
                 help="context-parallel size (Megatron's --context-parallel-size)"),
    click.option("--ep", type=click.IntRange(min=1), default=None,
                 help="expert-parallel size (Megatron's --expert-model-parallel-size)"),
    click.option("--etp", type=click.IntRange(min=1), default=None,
                 help="expert tensor-parallel size (Megatron's --expert-tensor-parallel-size)"),
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


def check_plot_dir(plot_dir: str | None, out_dir: str | None, inputs: Sequence[str | None] = ()) -> str | None:
    """Where --plot writes when there is no --out (None: no plots), checked as every output directory is
    (planner/output/run_dir.py: new, empty or earlier pictures; never over the user's files); with --out
    the plots always go to OUT/plots, so a --plot DIR there is refused rather than ignored."""
    if plot_dir is None:
        return None
    if out_dir is not None:
        if plot_dir:
            raise PlannerInputError("--plot", f"with --out the plots go to {out_dir}/plots; give --plot without a "
                                    "directory, or drop --out")
        return None
    where = plot_dir or DEFAULT_PLOT_DIR
    hint = "" if plot_dir else " (the default of --plot; give --plot DIR for another)"
    try:
        check_out_dir(where, "--plot", PLOTS_OUTPUT, inputs=inputs)
    except PlannerInputError as exc:
        raise PlannerInputError("--plot", str(exc).removeprefix("--plot: ") + hint) from None
    return where


def input_files(*values: str | None) -> list[str]:
    """The options' values that name existing files: the inputs an output may never overwrite."""
    out = []
    for v in values:
        if isinstance(v, str) and v and "\x00" not in v and len(v) < 4096:
            try:
                if os.path.isfile(v):
                    out.append(v)
            except (OSError, ValueError):
                pass
    return out


def note_printer(quiet: bool = False):
    """The `on_note` of planner.api.load_inputs: each note on stderr as `note: ...` (none under --quiet)."""
    if quiet:
        return None
    return lambda note: click.echo(f"note: {shown(note)}", err=True)


def launcher_inputs(script) -> list[str]:
    """A launcher script (planner.inputs.script.LauncherScript) and the files it sources from its own
    directory: inputs an output may never overwrite."""
    if script is None or not script.path:
        return []
    base = os.path.dirname(script.path)
    return [script.path, *(os.path.join(base, rel) for rel in script.sourced)]
