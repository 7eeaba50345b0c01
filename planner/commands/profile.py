"""`cli.py profile`: measure a device with torch micro-benchmarks at the model's own shapes."""

from __future__ import annotations

import sys
import time

import click

from planner.cli_common import handle_errors
from planner.errors import PlannerInputError
from planner.inputs.presets import load_model_preset
from planner.output.run_dir import PROFILE_OUTPUT, check_out_dir
from planner.profiling.runner import ProfileOptions, default_ep_list, run_profile, write_profile

TORCH_MISSING = "install the profile extra: pip install -e '.[profile]'"
MAX_LIST_VALUE = 1024  # TP/EP/ETP degrees and micro-batch sizes a single-device benchmark can time


def _int_list(flag: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PlannerInputError(flag, f"expected comma-separated positive integers, got {text[:60]!r}") from None
    if not values or any(v <= 0 or v > MAX_LIST_VALUE for v in values):
        raise PlannerInputError(flag, f"expected comma-separated integers in 1..{MAX_LIST_VALUE}, got {text[:60]!r}")
    return values


@click.command("profile")
@click.option("--model", required=True, metavar="PRESET|FILE", help="model preset or YAML whose shapes are timed")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), required=True, help="what to measure")
@click.option("--out", "out_dir", required=True, metavar="DIR",
              help="output directory: devices/<name>.yaml + profile_report.json (pass it as --profiles); a "
                   "profiles directory is updated, any other non-empty directory is refused")
@click.option("--force", is_flag=True, help="write into a non-empty --out directory that is no profiles directory")
@click.option("--quick", is_flag=True, help="tiny shapes and few repeats (a smoke run; CPU: well under a minute)")
@click.option("--tp-list", default=None, help="TP sizes to time, e.g. 1,2,4,8 (default 1,2 quick/CPU, 1,2,4,8 GPU)")
@click.option("--ep-list", default=None, help="EP sizes for expert GEMMs (default: divisors of the expert count <= 8)")
@click.option("--etp-list", default=None, help="expert-TP sizes (default 1)")
@click.option("--mbs-list", default=None, help="micro-batch sizes (default 1, or 1,2 without --quick)")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default=None,
              help="kernel precision (default bf16 on GPU, fp32 on CPU)")
@click.option("--repeats", type=click.IntRange(min=1), default=None, help="timed runs per kernel (median)")
@click.option("--warmup", type=click.IntRange(min=0), default=None, help="untimed runs per kernel")
@click.option("--skip-collectives", is_flag=True, help="do not time collectives (GPU: take links from the shipped profile)")
@handle_errors
def command(model, device, out_dir, force, quick, tp_list, ep_list, etp_list, mbs_list, dtype, repeats, warmup,
            skip_collectives):
    """Measure kernels and collectives with torch; write a DeviceProfile (provenance measured).

    \b
    python cli.py profile --model mixtral-s --device cpu --quick --out prof/
    python cli.py estimate --model mixtral-s --cluster CPU-xxxxxx:2 --profiles prof/
    """
    # every argument is checked before torch is imported (seconds) and before anything is measured
    check_out_dir(out_dir, "--out", PROFILE_OUTPUT, force=force)
    spec, _training = load_model_preset(model)
    lists = {flag: _int_list(flag, text) for flag, text in
             (("--tp-list", tp_list), ("--ep-list", ep_list), ("--etp-list", etp_list), ("--mbs-list", mbs_list))}
    try:
        import torch  # noqa: F401
    except ImportError:
        click.echo(f"error: torch is not installed; {TORCH_MISSING}", err=True)
        sys.exit(2)
    gpu = device == "cuda"
    opts = ProfileOptions(
        model=spec, device=device, quick=quick,
        tp_list=lists["--tp-list"] or ([1, 2, 4, 8] if gpu and not quick else [1, 2]),
        ep_list=lists["--ep-list"] or default_ep_list(spec, 2 if quick else 8),
        etp_list=lists["--etp-list"] or [1],
        micro_batch_sizes=lists["--mbs-list"] or ([1] if quick else [1, 2]),
        dtype=dtype, warmup=warmup, repeats=repeats, skip_collectives=skip_collectives,
    )
    start = time.perf_counter()

    def progress(message: str) -> None:
        click.echo(f"[{time.perf_counter() - start:6.1f}s] {message}", err=True)

    outcome = run_profile(opts, progress)
    paths = write_profile(outcome, out_dir, force=force)
    click.echo(f"wrote {paths[0]} (device {outcome.profile.name}, provenance measured) and {paths[1]}")
    click.echo(f"use it: --cluster {outcome.profile.name}:{outcome.profile.gpus_per_node} --profiles {out_dir}")
