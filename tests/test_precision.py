"""A device type without the run's precision (planner/precision.py): the T4's profile lists no bf16 peak
(profiles/devices/T4.yaml: fp16 and fp32 only), so a bf16 run leaves it idle with the reason, as the runtime
choice leaves out a type no job can hold; only a cluster none of whose types runs the precision is refused, and a
plan with a stage on such a type cannot be priced (estimate, estimate --plan and emit refuse it)."""

from __future__ import annotations

import json

import pytest

from helpers.cli import refused, run, solve_searches_once
from helpers.json_schema import check_json
from planner.api import load_inputs, runtime_choice
from planner.bench import planning_world
from planner.errors import PlannerInputError
from planner.inputs.cluster import describe_cluster, parse_cluster
from planner.inputs.resolve import resolve_run
from planner.runtime import MEGATRON, choose_runtime
from planner.schemas import Plan, StagePlan
from tools.fuzz.inputs import TINY_FLAGS

CLUSTER = "H800:8,T4:8"  # one vendor, one NCCL job: only the precision keeps the T4s out
PP2 = TINY_FLAGS + " --pipeline-model-parallel-size 2 --expert-model-parallel-size 8"  # stage 1 on the T4s
FP16 = PP2.replace("--bf16", "--fp16")


@pytest.mark.parametrize("requested", ["auto", "megatron"])
def test_a_type_without_the_precision_is_left_out_with_the_reason(profiles, requested):
    choice = choose_runtime(requested, parse_cluster(CLUSTER, profiles), profiles, "bf16")
    assert choice.runtime is MEGATRON and describe_cluster(choice.cluster, profiles) == "H800:8"
    assert list(choice.left_out) == ["T4"] and choice.lacks_precision == ("T4",)
    why = choice.left_out["T4"]
    assert why.startswith("T4 has no bf16") and "--fp16" in why
    fp16 = choose_runtime(requested, parse_cluster(CLUSTER, profiles), profiles, "fp16")
    assert describe_cluster(fp16.cluster, profiles) == CLUSTER and not fp16.left_out  # the T4 runs fp16


@pytest.mark.parametrize("model,fits", [("llama2-7b", True), ("mixtral-l", False)])
def test_a_type_without_the_precision_is_offered_as_its_own_job_only_where_the_model_fits(profiles, model, fits):
    """The T4s (2 nodes of 8, not the T4's usual 4) are offered as a job of their own in fp16, in the shape
    --cluster reads back, where the model may fit in them: LLaMA-2 7B (about 6.7e9 parameters x 18 bytes of
    weights, gradients and Adam state: 0.12 TB) in 16 x 15 GiB = 0.24 TB; never Mixtral-L (2.5 TB)."""
    cluster = parse_cluster("H800:8,T4:2x8", profiles)
    why = runtime_choice("auto", cluster, profiles, resolve_run(model=model, world_size=24)).left_out["T4"]
    assert why.startswith("T4 has no bf16") and "--fp16" in why
    assert ("plan them as a job of their own in fp16 (--cluster T4:2x8)" in why) is fits, why
    assert (f"no job of their own holds the model either: {model} fits nowhere on T4:2x8" in why) is not fits, why


def test_a_named_runtime_that_cannot_hold_the_rest_steers_to_auto_naming_every_idle_type():
    line = refused(run(["solve", "--model", "llama3-8b", "--runtime", "megatron", "--cluster", "H800:8,910B:8,T4:8",
                        "--quiet"]), "--runtime")
    assert "--runtime auto plans megatron on its 8 H800 and leaves its 8 910B + 8 T4 idle" in line


def test_a_cluster_none_of_whose_types_runs_the_precision_is_refused_naming_them(profiles):
    with pytest.raises(PlannerInputError) as err:
        load_inputs(model="llama2-7b", cluster="V100:8,T4:8")
    assert err.value.field == "--cluster"
    assert "V100 does not run bf16 (it runs fp16, fp32)" in str(err.value)
    assert "T4 does not run bf16 (it runs fp16, fp32)" in str(err.value)
    with pytest.raises(PlannerInputError):
        choose_runtime("auto", parse_cluster("V100:8,T4:8", profiles), profiles, "bf16")
    refused(run(["solve", "--model", "llama2-7b", "--cluster", "V100:8,T4:8", "--quiet"]), "--cluster")


def test_solve_plans_the_types_that_run_the_precision_and_says_why_the_rest_is_idle(monkeypatch):
    solve_searches_once(monkeypatch)  # the text run prints the --json run's search
    res = run(["solve", "--megatron-args", PP2, "--cluster", CLUSTER, "--backend", "hsdp", "--json", "--quiet"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    check_json("solve", d)
    assert {s["device_type"] for s in d["plan"]["stages"]} == {"H800"}
    assert d["runtime_choice"]["device_types"] == ["H800"] and list(d["runtime_choice"]["left_out"]) == ["T4"]
    assert d["idle_gpus"]["T4"]["count"] == 8 and d["idle_gpus"]["T4"]["why"].startswith("T4 has no bf16")
    # the flags' own plan puts stage 1 on the T4s: compared as a plan that cannot be priced, not a crash
    assert d["user_plan"]["priced"] is False and "stage 1 runs on T4, which has no bf16" in d["user_plan"]["error"]
    text = " ".join(run(["solve", "--megatron-args", PP2, "--cluster", CLUSTER, "--backend", "hsdp",
                         "--quiet"]).output.split())
    assert "T4 left out (see the notes)" in text and "note: 8 T4 GPUs stay idle: T4 has no bf16" in text


def test_an_infeasible_solve_names_the_type_it_left_out_for_the_precision():
    res = run(["solve", "--model", "mixtral-s", "--cluster", CLUSTER, "--backend", "hsdp", "--quiet"])
    assert res.exit_code == 2 and "fits nowhere on H800:8" in res.output, res.output
    assert "T4:8 of the cluster were not searched: T4 has no bf16" in res.output


def test_compare_names_the_type_it_left_out_for_the_precision():
    """Two GPUs of each type: the left-out T4s are what this checks (compare's two searches of the tiny model on the
    eight H800 took 8 s)."""
    args = ["compare", "--megatron-args", TINY_FLAGS, "--cluster", "H800:2,T4:2", "--time-limit", "10", "--no-brute"]
    res = run([*args, "--json"])
    assert res.exit_code == 0, res.output
    left = json.loads(res.stdout)["left_out"]
    assert list(left) == ["T4"] and left["T4"]["count"] == 2 and left["T4"]["why"].startswith("T4 has no bf16")


def test_estimate_of_a_plan_with_a_stage_on_such_a_type_is_refused(tmp_path):
    """The flags' plan spans the whole cluster: stage 1 on the T4s has no bf16 peak to be priced with, --allow-invalid
    or not; in fp16 the same flags are priced."""
    for extra in ([], ["--allow-invalid"]):
        line = refused(run(["estimate", "--megatron-args", PP2, "--cluster", CLUSTER, *extra]), "--cluster")
        assert "stage 1 runs on T4, which has no bf16" in line and "--cluster H800:8" in line
    assert run(["estimate", "--megatron-args", FP16, "--cluster", CLUSTER, "--quiet"]).exit_code == 0


def _bare_plan(path, second: str, dp: int) -> str:
    plan = Plan(tp=1, ep=dp, etp=1, gbs=64, stages=(StagePlan(device_type="H800", num_layers=2, dp=dp),
                                                    StagePlan(device_type=second, num_layers=2, dp=dp)))
    path.write_text(json.dumps(plan.model_dump(mode="json")))
    return str(path)


def test_a_saved_plan_on_such_a_type_is_refused_and_one_beside_it_is_priced(tmp_path):
    on_t4 = _bare_plan(tmp_path / "t4.json", "T4", 8)
    given = ["--megatron-args", TINY_FLAGS, "--cluster", CLUSTER]
    line = refused(run(["estimate", "--plan", on_t4, *given]), "--plan")
    assert "stage 1 runs on T4, which has no bf16" in line
    line = refused(run(["emit", "--plan", on_t4, *given, "--out", str(tmp_path / "out")]), "--plan")
    assert "stage 1 runs on T4, which has no bf16" in line and not (tmp_path / "out").exists()
    beside = run(["estimate", "--plan", _bare_plan(tmp_path / "h800.json", "H800", 4), *given, "--quiet"])
    assert beside.exit_code == 0, beside.output  # the T4s idle: nothing to price on them


def test_bench_plans_the_public_runtime_on_the_types_that_run_the_precision(profiles):
    """A type without the precision is no reason for the hypothetical all-vendor runtime: it stays idle under
    any runtime."""
    world = planning_world(parse_cluster(CLUSTER, profiles), profiles, "bf16")
    assert not world.hypothetical and world.choice.runtime is MEGATRON
    assert describe_cluster(world.choice.cluster, profiles) == "H800:8" and list(world.choice.left_out) == ["T4"]


def test_the_flags_plan_on_a_type_without_the_precision_is_refused_before_its_layout_rules(tmp_path):
    """fuzz seed 77777 case 12: on V100:2x8,MI300X:32 (48 GPUs) the flags' global batch 64 is no multiple of DP 48,
    and the V100s have no bf16; the estimate named --global-batch-size, so the user fixed the batch to meet the
    precision refusal next.  The precision comes first, naming --cluster and the GPUs that run bf16."""
    from tools.fuzz.inputs import TINY_MODEL
    from tools.fuzz.mutations import to_yaml

    model = tmp_path / "tiny.yaml"
    model.write_bytes(to_yaml(TINY_MODEL))
    line = refused(run(["estimate", "--model", str(model), "--cluster", "V100:2x8,mi300x:32"]), "--cluster")
    assert "V100 has no bf16" in line and "--cluster MI300X:32" in line and "global-batch" not in line, line
