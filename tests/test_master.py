"""The CP-SAT master over the degrees (solver_models/cpsat/master.py): its rule families, generated
from planner/megatron/rules.py, admit exactly the degrees the enumerator yields; on made-up rows it
picks the least row and proves it; and the rule predicates agree with check_plan."""

from __future__ import annotations

import itertools
import random

import pytest
from ortools.sat.python import cp_model

from planner.megatron import rules
from planner.megatron.rules import check_plan
from planner.schemas.plan import Plan, Recompute, StagePlan
from planner.search.certify import MEGATRON_FAMILIES, rule_families
from planner.search.space import SearchSpace, enumerate_globals, recompute_ladder
from solver_models.cpsat.master import DegreeMaster

from helpers.cases import reduced_cost_model


class _Collect(cp_model.CpSolverSolutionCallback):
    def __init__(self, variables):
        super().__init__()
        self.variables, self.seen = variables, set()

    def on_solution_callback(self):
        self.seen.add(tuple(self.value(v) for v in self.variables))


@pytest.mark.parametrize("preset,cluster,gbs",
                         [("mixtral-s", "H800:4,MI300X:4", 24), ("llama2-7b", "H100:4,A100:2", 12)])
def test_rule_families_admit_exactly_the_enumerated_degrees(preset, cluster, gbs):
    """Over the product of every family's values, the master's rule constraints alone (no rows'
    bounds, no objective) admit exactly the degree tuples enumerate_globals yields."""
    cm = reduced_cost_model(preset, 4, cluster, gbs)
    ladder = (Recompute.none(), Recompute.full("uniform", 1))
    space = SearchSpace(tp=(1, 2, 4), cp=(1, 2), mbs=(1, 2), vpp=(1, 2), recompute=ladder)
    gpn = {h: cm.gpus_per_node(h) for h in cm.cluster.gpus_by_type()}
    rank = {r.label: k for k, r in enumerate(recompute_ladder(cm.model, ladder))}
    enumerated = {(g.tp, g.cp, g.ep, g.etp, g.mbs, g.dp0, g.pp, g.vpp, rank[g.recompute.label])
                  for g in enumerate_globals(cm.model, cm.training, cm.cluster, space, gpn)}
    eps = sorted({t[2] for t in enumerated} | {1, 2, 4, 8}) if cm.model.is_moe else [1]
    domains = [space.tp, space.cp, eps, sorted({t[3] for t in enumerated} | set(space.tp)), space.mbs,
               range(1, 7), range(1, 5), space.vpp, range(len(ladder))]
    rows = list(itertools.product(*domains))
    master = DegreeMaster(MEGATRON_FAMILIES, rows, [0] * len(rows), rule_families(cm, space))
    model = master.model
    model.clear_objective()
    solver = cp_model.CpSolver()
    solver.parameters.enumerate_all_solutions = True
    solver.parameters.num_workers = 1
    cb = _Collect([master.deg[f] for f in MEGATRON_FAMILIES])
    solver.solve(model, cb)
    assert cb.seen == enumerated


def test_master_picks_the_least_row_and_proves_it():
    """Random rows: the master's optimum is the least value, and its bound equals it."""
    rng = random.Random(3)
    rows = [(rng.choice((1, 2, 4)), rng.randint(1, 8), rng.randint(1, 6)) for _ in range(300)]
    rows = list(dict.fromkeys(rows))
    values = [rng.randint(10**6, 10**8) for _ in rows]
    master = DegreeMaster(("tp", "dp", "pp"), rows, values, [])
    res = master.solve(time_limit_s=10, num_workers=2)
    assert res.status == "OPTIMAL" and res.objective_us == min(values) == res.bound_us
    assert values[res.row] == min(values)


def _plan(tp=1, cp=1, ep=1, etp=1, vpp=1, mbs=1, gbs=16, stages=((4, 1),), runtime="megatron", recompute=None):
    rc = recompute or [Recompute.none()] * len(stages)
    return Plan(runtime=runtime, tp=tp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, gbs=gbs, sequence_parallel=tp > 1,
                stages=tuple(StagePlan(device_type="H800", num_layers=n, dp=dp, recompute=r)
                             for (n, dp), r in zip(stages, rc)))


def _names(model, plan) -> set[str]:
    return {v.rule for v in check_plan(model, plan)}


def test_predicates_agree_with_check_plan():
    """Each boolean of planner/megatron/rules.py says yes exactly when check_plan raises none of
    the rules it stands for, over a grid of degrees."""
    moe = reduced_cost_model("mixtral-s", 8, "H800:8", 16).model
    dense = reduced_cost_model("llama2-7b", 8, "H800:8", 16).model
    for model in (moe, dense):
        for tp, cp, ep, etp, dp, mbs, pp, vpp, gbs in itertools.product(
                (1, 2, 3, 4, 8), (1, 2, 3), (1, 2, 3, 4), (1, 2, 4), (1, 2, 3, 4), (1, 2), (1, 2, 3), (1, 2), (12, 16)):
            if not model.is_moe and (ep != 1 or etp != tp):
                continue
            per = model.num_layers // pp
            stages = tuple((per + (model.num_layers - per * pp if i == pp - 1 else 0), dp) for i in range(pp))
            names = _names(model, _plan(tp, cp, ep, etp, vpp, mbs, gbs, stages))
            assert rules.tp_allowed(model, tp) == ("heads_tp" not in names and "query_groups_tp" not in names)
            assert rules.cp_allowed(model, cp) == ("seq_cp" not in names)
            assert rules.ep_allowed(model, ep) == ("experts_ep" not in names and "ep_needs_experts" not in names)
            if model.is_moe:
                assert rules.etp_allowed(model, tp, etp) == ("moe_etp_bias" not in names)
            assert rules.expert_folding_ok(tp, cp, dp, ep, etp) == ("expert_folding" not in names)
            assert rules.batch_ok(gbs, mbs, dp) == ("gbs_microbatch" not in names)
            if rules.batch_ok(gbs, mbs, dp):
                assert rules.interleave_ok(gbs, mbs, dp, pp, vpp) == (
                    "vpp_needs_pp" not in names and "vpp_microbatches" not in names)


def test_flagscale_predicates_agree_with_check_plan():
    """FlagScale's stage micro-batch, recompute and tied-embedding predicates against check_plan."""
    model = reduced_cost_model("llama2-7b", 8, "H800:8", 16).model
    tied = model.model_copy(update={"untie_embeddings_and_output_weights": False})
    sel, full, none = Recompute.selective(("core_attn",)), Recompute.full("uniform", 1), Recompute.none()
    for dps in itertools.product((1, 2, 3, 4), repeat=2):
        for rcs in itertools.product((none, sel, full, Recompute.selective(("core_attn", "layernorm"))), repeat=2):
            for m in (model, tied):
                plan = _plan(mbs=2, stages=((4, dps[0]), (4, dps[1])), runtime="flagscale", recompute=list(rcs))
                names = _names(m, plan)
                b = plan.mbs * dps[0]
                assert all(rules.flagscale_stage_mbs_ok(b, d) for d in dps) == ("flagscale_stage_mbs" not in names)
                assert rules.flagscale_recompute_ok([r.label for r in rcs]) == ("flagscale_recompute" not in names)
                if rules.flagscale_tied_embeddings(m, None):
                    assert rules.flagscale_shared_embedding_ok(*dps) == ("flagscale_shared_embedding_dp" not in names)
                else:
                    assert "flagscale_shared_embedding_dp" not in names
