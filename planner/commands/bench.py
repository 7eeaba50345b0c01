"""`cli.py bench`: HAPMoE against the baselines on the paper's scenario suite (all under the cost model)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from planner.baselines import PLANNERS
from planner.bench import (
    BENCH_FILES, QUICK_SUITE, SEARCH_TIME_MD, SECTIONS, SUITE, TABLE2_MD, TABLE3_MD, TUNER_MD, BenchSettings, run_bench,
)
from planner.bench_flagscale import TUNER
from planner.cli_common import FiniteFloat, handle_errors
from planner.errors import PlannerInputError
from planner.output.run_dir import BENCH_OUTPUT, StagedOutput, check_out_dir
from planner.profile_tables import ProfileSet


@click.command("bench")
@click.option("--out", "out_dir", default="bench-results", show_default=True, metavar="DIR",
              help=f"directory for {', '.join(BENCH_FILES)} and PNG plots (earlier bench results there are "
                   "overwritten; any other non-empty directory is refused)")
@click.option("--force", is_flag=True, help="write into a non-empty --out directory that holds no bench results")
@click.option("--quick", is_flag=True, help="a reduced suite (3 scenarios, one planned for the hypothetical all-vendor "
              "runtime; 2 cluster sizes)")
@click.option("--time-limit", "time_limit_s", type=FiniteFloat(min=1.0), default=None,
              help="seconds per search (default 60; 15 with --quick)")
@click.option("--flagscale-time-limit", "flagscale_time_limit_s", type=FiniteFloat(min=0.0), default=None,
              help="seconds for HAPMoE's flagscale-runtime search, 0 to skip (default 30; 0 with --quick)")
@click.option("--flagscale-tuner-time-limit", "tuner_time_limit_s", type=FiniteFloat(min=0.0), default=None,
              help="seconds for FlagScale's own auto-tuner per scenario, run beside HAPMoE where FlagScale runs the "
                   "cluster (needs FlagScale's environment: .ci/flagscale_env.sh); 0 skips it (default 120; 0 with "
                   "--quick)")
@click.option("--scaling-time-limit", "scaling_time_limit_s", type=FiniteFloat(min=1.0), default=None,
              help="seconds per search of the cluster-size study (default 60; 8 with --quick)")
@click.option("--scaling-sizes", default=None, metavar="N,N,...",
              help="GPU counts of the search-time study (default 48,96,192,384,768,1024; '' to skip)")
@click.option("--planners", default=None, metavar="NAME,...",
              help="planners to run (default all: mi,alpa,metis,hetermoe,deepspeed,ablation,hapmoe,flagscale-tuner)")
@click.option("--scenario", "scenario_filter", default=None, help="run only scenarios whose name contains this")
@click.option("--quiet", is_flag=True, help="no progress on stderr")
@handle_errors
def command(out_dir, force, quick, time_limit_s, flagscale_time_limit_s, tuner_time_limit_s, scaling_time_limit_s,
            scaling_sizes, planners, scenario_filter, quiet):
    """Run every planner on the scenario suite and write the paper's comparisons.

    \b
    python cli.py bench --out bench-results
    python cli.py bench --quick --out /tmp/bench
    """
    check_out_dir(out_dir, "--out", BENCH_OUTPUT, force=force)
    settings = BenchSettings.for_quick() if quick else BenchSettings()
    if time_limit_s is not None:
        settings.time_limit_s = time_limit_s
    if flagscale_time_limit_s is not None:
        settings.flagscale_time_limit_s = flagscale_time_limit_s
    if scaling_time_limit_s is not None:
        settings.scaling_time_limit_s = scaling_time_limit_s
    if tuner_time_limit_s is not None:
        settings.tuner_time_limit_s = tuner_time_limit_s
    if scaling_sizes is not None:
        try:
            settings.scaling_sizes = tuple(int(x) for x in scaling_sizes.split(",") if x.strip())
            if any(n > 1 << 17 for n in settings.scaling_sizes):
                raise ValueError
        except ValueError:
            raise PlannerInputError("--scaling-sizes", f"expected comma-separated GPU counts (at most 131072), "
                                                        f"got {scaling_sizes!r}")
        if any(n < 24 or n % 8 for n in settings.scaling_sizes):
            raise PlannerInputError("--scaling-sizes", "each size must be a multiple of 8 and at least 24 "
                                                        "(three device types in whole 8-GPU nodes)")
    if planners is not None:
        names = tuple(p.strip() for p in planners.split(",") if p.strip())
        known = (*PLANNERS, TUNER)
        bad = [p for p in names if p not in known]
        if bad:
            raise PlannerInputError("--planners", f"unknown {bad}; known: {', '.join(known)}")
        if "ablation" in names and "hapmoe" not in names:
            names = names + ("hapmoe",)
        settings.planners = names
    if scenario_filter is not None:
        suite = QUICK_SUITE if quick else SUITE
        if not any(scenario_filter in sc.name for sc in suite):
            raise PlannerInputError("--scenario", f"{scenario_filter!r} matches no scenario of the "
                                                  f"{'quick ' if quick else ''}suite; scenarios: "
                                                  f"{', '.join(sc.name for sc in suite)}")
    settings.scenario_filter = scenario_filter

    def progress(line: str) -> None:
        if not quiet:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    with StagedOutput(out_dir, "--out", BENCH_OUTPUT, force=force) as staging:  # published when the bench is done
        report = run_bench(staging, ProfileSet.load(), settings, progress=progress)
    s = report.summary
    click.echo(f"wrote {len(report.files)} files to {out_dir}: {', '.join(report.files)}")
    for section in SECTIONS:  # runnable first
        part = s[section]
        gm, mr = part.get("geomean_speedup_vs_mi"), part.get("min_ratio_vs_best_baseline")
        click.echo(f"{part['title']}: geomean speedup vs MI (heterogeneous MoE) "
                   + (f"{gm:.2f}x" if gm else "n/a (no heterogeneous MoE scenario)")
                   + (f"; HAPMoE / best baseline, worst scenario {mr:.3f} ({part.get('min_ratio_scenario')})"
                      if mr is not None else "")
                   + (f" [{len(part['hypothetical_scenarios'])} scenario(s) planned for a HYPOTHETICAL runtime]"
                      if part["hypothetical_scenarios"] else ""))
    for loss in s.get("hapmoe_slower_than_a_baseline", []):
        click.echo(f"HAPMoE slower than {loss['baseline']} on {loss['scenario']} ({loss['ratio']:.3f}): {loss['why']}")
    click.echo("")
    for name in (TABLE2_MD, TABLE3_MD, TUNER_MD, SEARCH_TIME_MD):
        click.echo((Path(out_dir) / name).read_text())
