"""Which runtime can run which cluster (profiles/runtimes.yaml, planner/runtime.py): the table, `--runtime auto`,
the refusals, and that the search, the launchers and `estimate` keep to it."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from cli import main
from planner.api import load_inputs, runtime_choice
from planner.errors import PlannerInputError
from planner.inputs.cluster import describe_cluster, parse_cluster
from planner.inputs.resolve import resolve_run
from planner.launcher import render_launch_files
from planner.placement import contiguous_order, type_blocks
from planner.cost.model import CostModel
from planner.profile_tables import PROFILES_DIR, ProfileSet
from planner.runtime import FLAGSCALE, MEGATRON, RUNTIMES, choose_runtime
from planner.schemas import Plan, StagePlan

README_CLUSTER = "H800:16,MI300X:16,910B:16"


def test_every_runtime_has_a_row_with_sources(profiles):
    """Each runtime with a launcher has a runtimes.yaml row; every entry names its source."""
    rows = profiles.runtime_rows()
    assert set(RUNTIMES) <= set(rows)
    for row in rows.values():
        assert all(v.source for v in row.vendors.values())
        assert all(g.source for g in row.cross_vendor) and all(r.source and r.why for r in row.refuses)
    assert rows["megatron"].cross_vendor == ()  # one vendor per upstream job


@pytest.mark.parametrize("cluster, megatron, flagscale", [
    ("H800:8", True, True),
    ("H800:8,A100:8", True, True),  # two NVIDIA types: one NCCL job
    ("MI300X:8", True, True),
    ("910B:8", True, False),  # MindSpeed on Ascend; FlagScale 0.8.0 trains on CUDA devices
    ("H800:8,MI300X:8", False, True),  # NVIDIA + AMD: FlagCX
    ("A100:8,910B:8", False, False),  # FlagCX's HCCL has no cross-vendor mode
    (README_CLUSTER, False, False),
])
def test_which_runtime_runs_which_cluster(profiles, cluster, megatron, flagscale):
    cl = parse_cluster(cluster, profiles)
    assert MEGATRON.can_run(cl, profiles).ok is megatron
    assert FLAGSCALE.can_run(cl, profiles).ok is flagscale


def test_auto_plans_the_part_one_job_can_span(profiles):
    """No runtime runs H800 + MI300X + 910B: auto takes FlagScale on H800 + MI300X (the most peak compute) and
    says why the 910Bs stay idle."""
    choice = choose_runtime("auto", parse_cluster(README_CLUSTER, profiles), profiles)
    assert choice.runtime is FLAGSCALE and describe_cluster(choice.cluster, profiles) == "H800:16,MI300X:16"
    assert list(choice.left_out) == ["910B"]
    assert "FlagCX's HCCL backend has no cross-vendor" in choice.left_out["910B"]
    run = resolve_run(model="llama2-7b", world_size=48)
    assert "plan them as a job of their own (--cluster 910B:16)" in \
        runtime_choice("auto", parse_cluster(README_CLUSTER, profiles), profiles, run).left_out["910B"]
    assert choose_runtime("auto", parse_cluster("H800:8,A100:8", profiles), profiles).runtime is MEGATRON


@pytest.mark.parametrize("spec,item", [("H800:8,H20:8,910B:8", "910B:8"), ("H800:8,H20:8,910B:2x4", "910B:2x4")])
def test_left_out_gpus_are_offered_as_a_job_of_their_own_only_where_the_model_may_fit(profiles, spec, item):
    """No runtime runs the 910Bs with the H800s and H20s.  LLaMA-2 7B (about 6.7e9 parameters x 18 bytes of
    weights, gradients and Adam state: 0.12 TB) may fit on the 8 910Bs (8 x 61 GiB = 0.52 TB): the note offers
    them as a job of their own, in the shape --cluster reads back (2x4 is not 910B:8).  Mixtral-L (about 1.4e11
    parameters: 2.5 TB of such state) fits nowhere on them: the note says so instead of offering them (walk: it
    offered --cluster 910B:8 where the model could not run)."""
    cluster = parse_cluster(spec, profiles)
    small = runtime_choice("auto", cluster, profiles, resolve_run(model="llama2-7b", world_size=24))
    assert f"plan them as a job of their own (--cluster {item})" in small.left_out["910B"], small.left_out
    big = runtime_choice("auto", cluster, profiles, resolve_run(model="mixtral-l", world_size=24))
    why = big.left_out["910B"]
    assert "--cluster" not in why and f"no job of their own holds the model either: mixtral-l fits nowhere on {item}" \
        in why, why
    assert why.startswith("no runtime runs 910B (Huawei) in one job with H800+H20")


def test_readme_first_command_plans_a_job_that_can_run():
    """The README's first command plans FlagScale over H800 + MI300X, the 910Bs idle with the reason."""
    res = CliRunner().invoke(main, ["solve", "--model", "mixtral-l", "--cluster", README_CLUSTER, "--backend", "hsdp",
                                    "--json", "--quiet"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["runtime"] == "flagscale" and d["plan"]["runtime"] == "flagscale"
    assert {s["device_type"] for s in d["plan"]["stages"]} <= {"H800", "MI300X"}
    assert d["idle_gpus"]["910B"]["count"] == 16 and "no runtime runs 910B" in d["idle_gpus"]["910B"]["why"]
    assert d["runtime_choice"]["requested"] == "auto" and d["runtime_choice"]["left_out"].keys() == {"910B"}


def test_megatron_on_a_cross_vendor_cluster_is_refused_in_one_line():
    """--runtime megatron on H800 + MI300X: exit 2, one line naming --runtime and steering to flagscale."""
    res = CliRunner().invoke(main, ["solve", "--model", "mixtral-s", "--cluster", "H800:8,MI300X:8", "--runtime",
                                    "megatron", "--quiet"])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --runtime: upstream Megatron-LM cannot run one job over")
    assert "use --runtime flagscale" in lines[0]


def test_a_profiles_dir_runtimes_yaml_replaces_rows(tmp_path, profiles):
    """A FlagCX build that mixes Huawei too (a user's runtimes.yaml) lets auto run the whole README cluster."""
    table = yaml.safe_load((PROFILES_DIR / "runtimes.yaml").read_text())
    row = table["runtimes"]["flagscale"]
    row["vendors"]["Huawei"] = {"library": "FlagCX (HCCL adaptor)", "source": "a site's own FlagCX build"}
    row["cross_vendor"][0]["vendors"] = ["NVIDIA", "AMD", "Huawei"]
    row["refuses"] = []
    (tmp_path / "runtimes.yaml").write_text(yaml.safe_dump({"runtimes": {"flagscale": row}}))
    mine = ProfileSet.load([tmp_path])
    choice = choose_runtime("auto", parse_cluster(README_CLUSTER, mine), mine)
    assert choice.runtime is FLAGSCALE and not choice.left_out
    assert mine.runtime_support("megatron") == profiles.runtime_support("megatron")  # the other rows stay


def test_a_bad_runtimes_yaml_is_refused_naming_the_file(tmp_path):
    (tmp_path / "runtimes.yaml").write_text(yaml.safe_dump({"runtimes": {"flagscale": {
        "title": "x", "uneven_stages": "y", "vendors": {"NVIDIA": {"library": "NCCL", "source": "s"}},
        "cross_vendor": [{"vendors": ["NVIDIA", "AMD"], "library": "FlagCX", "source": "s"}]}}}))
    with pytest.raises(PlannerInputError) as err:
        ProfileSet.load([tmp_path])
    assert err.value.field == "--profiles" and "runtimes.yaml" in str(err.value) and "AMD" in str(err.value)


def test_no_upstream_launcher_for_a_cross_vendor_plan(profiles):
    """An old plan.json or a hand-made plan: the megatron launcher refuses a job over NVIDIA + AMD."""
    run = load_inputs(model="mixtral-s", cluster="H800:8,MI300X:8").run
    plan = Plan(tp=1, ep=8, etp=1, gbs=run.training.global_batch_size,
                stages=(StagePlan(device_type="H800", num_layers=16, dp=8),
                        StagePlan(device_type="MI300X", num_layers=16, dp=8)))
    with pytest.raises(PlannerInputError) as err:
        render_launch_files(run, plan, parse_cluster("H800:8,MI300X:8", profiles))
    assert err.value.field == "--runtime" and "upstream Megatron-LM cannot run one job over" in str(err.value)


def test_estimate_of_upstream_flags_across_vendors_is_refused_unless_allowed():
    args = ["estimate", "--model", "mixtral-s", "--cluster", "H800:8,MI300X:8", "--pp", "2", "--ep", "8", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "--allow-invalid prices these flags anyway" in res.output
    res = CliRunner().invoke(main, [*args, "--allow-invalid", "--quiet"])
    assert res.exit_code == 0, res.output
    assert any("no upstream Megatron-LM job runs this" in n for n in json.loads(res.stdout)["notes"])


def test_interleaved_types_are_grouped_when_that_costs_nothing(profiles):
    """H100, A100, H100, A100 with the same layers: every grouped order is priced by the cost model, and the
    fastest is taken when it is no slower (here it is faster: fewer slow cross-type hops); the note says so."""
    inputs = load_inputs(model="llama2-7b", cluster="H100:8,A100:8", overrides={"gbs": 64})
    cost = CostModel(inputs.run.model, inputs.run.training, inputs.cluster, profiles)
    plan = Plan(tp=2, gbs=64, stages=tuple(StagePlan(device_type=t, num_layers=8, dp=2)
                                           for t in ("H100", "A100", "H100", "A100")))
    assert type_blocks(plan) == ["H100", "A100", "H100", "A100"]
    new, new_cost, note = contiguous_order(cost, plan, cost.evaluate(plan))
    assert len(type_blocks(new)) == 2 and sorted(s.device_type for s in new.stages) == ["A100"] * 2 + ["H100"] * 2
    assert new_cost.iteration_time_s < cost.evaluate(plan).iteration_time_s
    assert note.startswith("stages grouped by device type") and "faster than the order found" in note
    for order in (["H100", "H100", "A100", "A100"], ["A100", "A100", "H100", "H100"]):  # brute force: the best order
        other = plan.model_copy(update={"stages": tuple(StagePlan(device_type=t, num_layers=8, dp=2) for t in order)})
        assert new_cost.iteration_time_s <= cost.evaluate(other).iteration_time_s * (1 + 1e-12)
    assert contiguous_order(cost, new, new_cost) == (new, new_cost, None)  # already grouped: nothing to say


def test_the_hypothetical_all_vendor_runtime_is_flagscale_widened_and_never_runs(profiles):
    """runtimes.yaml's `hypothetical: all-vendors` (the bench's table "as the paper assumes"): applied with
    ProfileSet.assuming, FlagScale's row runs H800 + MI300X + 910B in one job and says HYPOTHETICAL, and
    nothing else changes (devices, links, the other rows).  It is no --runtime value, auto never picks it,
    and the launcher refuses its plans; the shipped profiles still leave the 910Bs idle."""
    from planner.runtime import RUNTIME_CHOICES, plannable_runtimes

    cl = parse_cluster(README_CLUSTER, profiles)
    assert "all-vendors" in profiles.hypothetical_runtimes() and "all-vendors" not in RUNTIME_CHOICES
    assert "all-vendors" not in profiles.runtime_rows() and choose_runtime("auto", cl, profiles).left_out
    paper = profiles.assuming("all-vendors")
    check = FLAGSCALE.can_run(cl, paper)
    assert check.ok and check.reason.startswith("HYPOTHETICAL all-vendor runtime")
    row = paper.runtime_support("flagscale")
    assert "FlagCX's HCCL adaptor carrying cross-vendor traffic" in row.hypothetical
    assert FLAGSCALE not in plannable_runtimes(paper)  # never --runtime auto's choice
    assert paper.runtime_support("megatron") == profiles.runtime_support("megatron")
    assert profiles.runtime_support("flagscale").hypothetical is None  # the shipped row is untouched
    # priced as FlagScale's NVIDIA + AMD jobs: a 910B stage meets the others over the same host-memory link
    for other in ("H800", "MI300X"):
        assert paper.cross_link(other, "910B", cl) == profiles.cross_link("H800", "MI300X", cl)
    run = load_inputs(model="mixtral-s", cluster="H800:8,910B:8").run
    plan = Plan(runtime="flagscale", tp=1, ep=8, etp=1, gbs=run.training.global_batch_size,
                stages=(StagePlan(device_type="H800", num_layers=20, dp=8),
                        StagePlan(device_type="910B", num_layers=12, dp=8)))
    for ps, says in ((paper, "is hypothetical"), (profiles, "FlagCX's HCCL backend has no cross-vendor")):
        with pytest.raises(PlannerInputError) as err:
            render_launch_files(run, plan, parse_cluster("H800:8,910B:8", profiles), profiles=ps)
        assert err.value.field == "--runtime" and says in str(err.value) and "no launcher written" in str(err.value)


def test_an_unknown_hypothetical_runtime_is_refused_naming_the_known_ones(profiles):
    from planner.errors import MissingProfileError

    with pytest.raises(MissingProfileError, match="hypothetical: all-vendors"):
        profiles.assuming("nope")
