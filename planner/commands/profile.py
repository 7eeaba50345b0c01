"""`cli.py profile`: measure a device with torch micro-benchmarks at the model's own shapes."""

from __future__ import annotations

import shlex
import sys
import time

import click

from planner.cli_common import handle_errors
from planner.errors import PlannerInputError
from planner.inputs.presets import load_model_preset
from planner.output.run_dir import PROFILE_OUTPUT, check_out_dir
from planner.profile_tables import ProfileSet
from planner.profiling.runner import ProfileOptions, default_ep_list, run_profile, write_profile
from planner.profiling.shapes import allowed_tps, check_splits
from planner.runtime import plannable_runtimes

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
    python cli.py profile --model mixtral-s --device cuda --out prof/
    python cli.py solve --model mixtral-s --cluster H100:8 --profiles prof/    # the --cluster it prints
    python cli.py profile --model mixtral-s --device cpu --quick --out cpu/   # a smoke test of the profiler
    python cli.py estimate --model mixtral-s --cluster CPU-xxxxxx:2 --profiles cpu/ --allow-invalid

    A CPU profile is no plannable device (no runtime runs a CPU): solve refuses it, estimate prices it with
    --allow-invalid.
    """
    # every argument is checked before torch is imported (seconds) and before anything is measured
    check_out_dir(out_dir, "--out", PROFILE_OUTPUT, force=force)
    spec, _training = load_model_preset(model)
    lists = {flag: _int_list(flag, text) for flag, text in
             (("--tp-list", tp_list), ("--ep-list", ep_list), ("--etp-list", etp_list), ("--mbs-list", mbs_list))}
    gpu = device == "cuda"
    tps = lists["--tp-list"] or allowed_tps(spec, [1, 2, 4, 8] if gpu and not quick else [1, 2])
    eps = lists["--ep-list"] or default_ep_list(spec, 2 if quick else 8)
    check_splits(spec, tps, eps, quick)
    if skip_collectives and not gpu:
        raise PlannerInputError("--skip-collectives", "a CPU has no shipped profile to take its links from; "
                                "drop --skip-collectives (--device cpu times the collectives on two local processes)")
    try:
        import torch  # noqa: F401
    except ImportError:
        click.echo(f"error: torch is not installed; {TORCH_MISSING}", err=True)
        sys.exit(2)
    opts = ProfileOptions(
        model=spec, device=device, quick=quick, tp_list=tps, ep_list=eps,
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
    for line in next_step(outcome.profile, model, out_dir):
        click.echo(line)


def next_step(profile, model: str, out_dir: str) -> list[str]:
    """What to run with the profile just written: `--cluster NAME:N --profiles DIR` where a runtime of
    profiles/runtimes.yaml runs the device; otherwise (a CPU: a smoke test of the profiler) the one command that
    prices on it, `estimate ... --allow-invalid`, since solve and a plain estimate refuse it."""
    cluster = f"{profile.name}:{profile.gpus_per_node}"
    profiles = ProfileSet.load(extra_dirs=[out_dir])
    if any(rt.can_run([profile.name], profiles).ok for rt in plannable_runtimes(profiles)):
        return [f"use it: --cluster {cluster} --profiles {out_dir}"]
    what = ("a CPU profile is a smoke test of the profiler, not a plannable device" if profile.vendor == "cpu"
            else f"{profile.name} ({profile.vendor}) is not a plannable device")
    return [f"{what}: no runtime of profiles/runtimes.yaml runs it, so solve (and estimate without --allow-invalid) "
            f"refuse it; to price the model on it:",
            f"  python cli.py estimate --model {shlex.quote(model)} --cluster {cluster} --profiles "
            f"{shlex.quote(out_dir)} --allow-invalid"]
