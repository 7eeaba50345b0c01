"""The command line as users and scripts call it: help, JSON keys, exit codes, output files."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

from cli import main
from helpers.once import run_once

RUNNER = CliRunner()
SMALL = ["--model", "mixtral-s", "--cluster", "H800:8,MI300X:8", "--gbs", "64"]


def run(args: list[str]):
    return RUNNER.invoke(main, args, catch_exceptions=True)


def test_every_command_has_help():
    """`--help` works for the group and every command."""
    res = run(["--help"])
    assert res.exit_code == 0
    names = main.list_commands(click.Context(main))
    assert names == ["bench", "calibrate", "compare", "emit", "estimate", "profile", "solve"]
    for name in names:
        r = run([name, "--help"])
        assert r.exit_code == 0, (name, r.output)
        assert "Usage" in r.output


def test_option_help_names_only_the_commands_own_options():
    """An option's help names options of its own command only: estimate's --plot said "with --out they always go to
    OUT/plots", but estimate has no --out (solve's shared --plot help).  One after another command's name
    (`solve --out`) is that command's, so is one the output is passed "as" (`pass it as --profiles`), and one after
    "Megatron's" is Megatron's flag (`Megatron's --tensor-model-parallel-size`)."""
    import re

    ctx = click.Context(main)
    names = main.list_commands(ctx)
    option = re.compile(r"(?:\b([\w']+) )?(?<![\w-])(--[a-z][a-z-]*)")
    for name in names:
        command = main.get_command(ctx, name)
        params = [p for p in command.params if isinstance(p, click.Option)]
        own = {o for p in params for o in (*p.opts, *p.secondary_opts)}
        for p in params:
            named = {opt for before, opt in option.findall(p.help or "")
                     if before not in (*names, "as", "Megatron's")}
            assert named <= own, (name, p.opts[0], sorted(named - own))


def test_every_json_option_says_what_it_prints():
    """Each command's --json says what it prints in `--help` (compare's said nothing)."""
    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        for p in command.params:
            if isinstance(p, click.Option) and "--json" in p.opts:
                assert "JSON" in (p.help or ""), name


def test_every_option_of_every_command_has_help():
    """`--help` describes each option (estimate's and calibrate's --tp/--pp/--cp/--ep/--etp and compare's --delta
    showed a bare name); --help itself is click's."""
    ctx = click.Context(main)
    bare = [f"{name} {p.opts[0]}" for name in main.list_commands(ctx) for p in main.get_command(ctx, name).params
            if isinstance(p, click.Option) and not p.help and p.opts != ["--help"]]
    assert bare == []


def test_estimate_json_has_the_public_keys():
    """estimate --json prints one object with the documented keys, per-stage entries included."""
    res = run(["estimate", "--model", "mixtral-s", "--cluster", "H800:32", "--tp", "2", "--pp", "4", "--ep", "4",
               "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    for key in ("iteration_time_s", "tflops_per_gpu", "mfu", "max_memory_gib", "fits", "world_size", "stages"):
        assert key in d
    assert d["world_size"] == 32
    assert len(d["stages"]) == 4
    for s in d["stages"]:
        for key in ("device_type", "num_layers", "time_s", "memory_gib"):
            assert key in s
    assert sum(s["num_layers"] for s in d["stages"]) == 32


def test_estimate_reports_overflow_instead_of_failing():
    """A configuration that does not fit still gets its estimate, with fits false and the short stage."""
    res = run(["estimate", "--model", "mixtral-l", "--cluster", "H800:8", "--tp", "1", "--pp", "1", "--ep", "1",
               "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["fits"] is False
    assert d["overflow"]["short_gib"] > 0


@pytest.mark.parametrize(
    "args, field",
    [
        (["estimate", "--model", "nosuchmodel", "--cluster", "H800:8"], "model"),
        (["estimate", "--model", "mixtral-s", "--cluster", "XPU:8"], "XPU"),
        (["estimate", "--model", "mixtral-s", "--cluster", "H800:8", "--tp", "3"], "tensor"),
        (["estimate", "--model", "mixtral-s", "--cluster", "H800:8", "--ep", "3"], "expert"),
        (["estimate", "--model", "mixtral-s", "--cluster", "H800:8", "--pp", "3"], "3"),
        (["estimate", "--megatron-args", "--num-layers abc --hidden-size 64", "--cluster", "H800:8"], "--num-layers"),
        (["solve", "--model", "mixtral-s", "--cluster", "H800:8", "--gbs", "0"], "gbs"),
    ],
)
def test_bad_input_exits_2_with_a_message_and_no_traceback(args, field):
    """Bad input: exit status 2, one clear message naming the field, no traceback."""
    res = run(args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert field.lower() in res.output.lower()


def test_solve_json_and_out_dir(tmp_path):
    """solve --json has the public keys; --out writes plan.json, summary.md and a launcher that emit
    regenerates identically from plan.json."""
    # the same solve as test_display_details.py's and test_readable_output.py's --quiet test read
    res = run_once("solve", *SMALL, "--backend", "hsdp", "--json", "--quiet", out=True)
    assert res.exit_code == 0, res.stdout + res.stderr
    out = res.out
    d = json.loads(res.stdout)
    for key in ("status", "iteration_time_s", "tflops_per_gpu", "mfu", "search_time_s", "lower_bound_s",
                "world_size", "plan"):
        assert key in d
    assert d["status"] in ("OPTIMAL", "FEASIBLE")
    assert sum(s["num_layers"] for s in d["plan"]["stages"]) == 32
    saved = json.loads((out / "plan.json").read_text())
    assert saved["world_size"] == d["world_size"]
    assert (out / "summary.md").read_text().startswith("# Plan")
    args_txt = (out / "launch" / "megatron_args.txt").read_text()
    assert "--expert-model-parallel-size" in args_txt
    again = tmp_path / "again"
    r2 = run(["emit", "--plan", str(out / "plan.json"), "--out", str(again)])
    assert r2.exit_code == 0, r2.output
    assert (again / "megatron_args.txt").read_text() == args_txt


def test_solve_cpsat_reports_bound_and_gap():
    """The default backend reports CP-SAT's status, a lower bound no higher than the plan, and a gap."""
    res = run_once("solve", *SMALL, "--json", "--quiet")  # test_ranges.py reads the same solve
    assert res.exit_code == 0, res.stdout + res.stderr
    d = json.loads(res.stdout)
    assert d["backend"] == "cpsat"
    assert d["lower_bound_s"] <= d["solver_objective_s"] * (1 + 1e-9)
    assert 0 <= d["gap"] < 1


def test_infeasible_solve_exits_2_and_says_why(tmp_path):
    """A model that fits nowhere: exit 2, the stage, the shortfall, remedies, and no output written."""
    out = tmp_path / "nothing"
    res = run(["solve", "--model", "deepseek-v3", "--cluster", "H800:8", "--quiet", "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "GiB" in res.output and "short" in res.output
    # the layout counts GPUs: one TP=8 stage is 8 GPUs, not "1 stages: 1 H800"
    assert "1 stage of 8 GPUs: 8 H800" in res.output, res.output
    assert not out.exists()
    # device types the runtime choice left out are named (walk54: "fits nowhere on H800:8,H20:8" said nothing of
    # the 910B:8 beside them)
    res = run(["solve", "--model", "mixtral-l", "--cluster", "H800:8,H20:8,910B:8", "--quiet", "--time-limit", "10"])
    assert res.exit_code == 2 and "fits nowhere on H800:8,H20:8" in res.output, res.output
    assert "910B:8 of the cluster were not searched: no runtime runs 910B" in res.output, res.output


def test_time_limit_without_a_plan_exits_3_and_says_so(tmp_path):
    """A time limit that runs out before any configuration is solved is not called infeasible: exit
    3, a line that names the limit and what to do, nothing on stdout and nothing written."""
    out = tmp_path / "nothing"
    res = RUNNER.invoke(main, ["solve", "--model", "mixtral-l", "--cluster", "H800:16,A100:16,H20:16",
                               "--backend", "hsdp", "--time-limit", "0.1", "--json", "--out", str(out)])
    assert res.exit_code == 3, res.output
    assert "time limit" in res.stderr and "raise --time-limit" in res.stderr and "infeasible" not in res.stderr
    assert "likely none fits" not in res.stderr
    assert res.stdout == ""
    assert not out.exists()


def test_time_limit_without_a_plan_says_when_likely_nothing_fits():
    """DeepSeek-V3 on 128 H100: nothing fits (its 671e9 parameters' weights, grads and optimizer state are about
    12 TB against 128 x 80 GB; HS-DP took 229 s to prove it, cpsat 9 s).  When HS-DP's time runs out first, the line
    says that more time would likely not help and what would (the friendliest layout, priced: no search), still
    exit 3; where that layout fits (the test above: mixtral-l on 48 GPUs) it says only to raise the limit."""
    res = RUNNER.invoke(main, ["solve", "--model", "deepseek-v3", "--cluster", "H100:128", "--backend", "hsdp",
                               "--time-limit", "1", "--quiet"])
    assert res.exit_code == 3, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: time limit: no plan found within the 1 s time limit"), lines
    assert "likely none fits, so more time would not help" in lines[0] and "fits nowhere on H100:128" in lines[0]
    assert "what would: more GPUs: about" in lines[0] and "raise --time-limit" not in lines[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.integers(0, 9), pp=st.integers(0, 9), ep=st.integers(0, 9), mbs=st.integers(0, 5),
       gbs=st.integers(0, 300))
def test_estimate_never_crashes_on_random_degrees(tp, pp, ep, mbs, gbs):
    """Random valid and invalid degrees: estimate answers (exit 0) or refuses cleanly (exit 2)."""
    res = run(["estimate", "--model", "mixtral-s", "--cluster", "H800:16", "--tp", str(tp), "--pp", str(pp),
               "--ep", str(ep), "--mbs", str(mbs), "--gbs", str(gbs), "--json"])
    assert res.exit_code in (0, 2), res.output
    assert "Traceback" not in res.output
    if res.exit_code == 0:
        assert json.loads(res.output)["iteration_time_s"] > 0
