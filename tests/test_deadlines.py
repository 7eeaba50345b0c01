"""Deadlines: cost tables on deep models built option by option under the search's deadline, read one stage
at a time, and kept within a memory budget.

Found by the fuzzer: a 1024-layer model with `--time-limit 3` ran 14-18 s and took 4 GB, because a
configuration's tables (O x 4 x (N+1)^2 cells, four arrays) were written and read in single numpy
calls that no deadline could interrupt.  These tests check the rewritten pieces against direct,
cell-by-cell definitions, and that a deadline passing inside them ends the search cleanly.  A time
limit used up by reading the inputs is named as such.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

import planner.search.tables as table_module
from planner.cost.model import CostModel
from planner.schemas.search import stage_min_layers
from planner.errors import SearchTimeLimitError
from planner.search.driver import search
from planner.search.settings import SearchSettings
from planner.search.space import SearchSpace, enumerate_globals, stage_options
from planner.search.tables import TableBuilder
from solver_models.tables import DeadlinePassed, position

from helpers.cases import reduced_cost_model

SPACE = SearchSpace(tp=(1, 2), cp=(1,), mbs=(1,), vpp=(1, 2), max_pp=4)


def _configs(cm: CostModel, count: int):
    gpn = {h: cm.domain_gpus(h) for h in cm.cluster.gpus_by_type()}
    out = []
    for g in enumerate_globals(cm.model, cm.training, cm.cluster, SPACE, gpn):
        opts = stage_options(g, cm.model, cm.training, cm.cluster, SPACE, gpn)
        if opts and g.pp > 1:
            out.append((g, opts))
    return out[:: max(1, len(out) // count)][:count]


def test_fit_range_matches_cell_by_cell_memory_test():
    """lo/hi per (option, stage, start) are the least and greatest layer counts whose memory
    (static + in-flight x activations) fits the option's capacity, checked cell by cell."""
    cm = reduced_cost_model("mixtral-s", 8, "H800:8,MI300X:8", 64)
    tb = TableBuilder(cm)
    checked = 0
    for g, opts in _configs(cm, 20):
        t = tb.build(g, opts)
        lo, hi = t.fit_range()
        N = t.num_layers
        for o, i, start in itertools.product(range(t.num_options), range(t.pp), range(N + 1)):
            p = position(i, t.pp)
            fit = [n for n in range(N + 1)
                   if t.static_bytes[o, p, start, n] + t.inflight[i] * t.act_bytes[o, p, start, n]
                   <= t.capacity_bytes[o]]
            want_hi = max(fit) if fit else 0
            want_lo = max(min(fit) if fit else 1, stage_min_layers(i, t.pp, g.vpp))
            assert (lo[o, i, start], hi[o, i, start]) == (want_lo, want_hi), (g.label(), o, i, start)
            checked += 1
    assert checked > 500


def test_layer_kind_signatures_match_their_definition():
    """Two ranges share a signature exactly when their layer kinds are the same sequence, and each
    signature's representative range has that sequence."""
    pattern = [0, 0, 1, 1, 0, 1, 1, 1, 0, 1]
    cm = reduced_cost_model("mixtral-s", len(pattern), "H800:8", 32, pattern=pattern)
    sig, reps = TableBuilder(cm)._signatures()
    kinds = cm.model.layer_is_moe
    N = len(kinds)
    ranges = [(s, n) for s in range(N) for n in range(1, N - s + 1)]
    for (s1, n1), (s2, n2) in itertools.combinations(ranges, 2):
        same = kinds[s1:s1 + n1] == kinds[s2:s2 + n2]
        assert (sig[s1, n1] == sig[s2, n2]) == same, ((s1, n1), (s2, n2))
    for s, n in ranges:
        rs, rn = reps[sig[s, n]]
        assert kinds[rs:rs + rn] == kinds[s:s + n]
    assert len(reps) == len({kinds[s:s + n] for s, n in ranges})


def test_a_passed_deadline_stops_the_build_and_the_memory_test():
    cm = reduced_cost_model("mixtral-s", 8, "H800:8,MI300X:8", 64)
    g, opts = _configs(cm, 1)[0]
    with pytest.raises(DeadlinePassed):
        TableBuilder(cm).build(g, opts, deadline=time.perf_counter() - 1.0)
    t = TableBuilder(cm).build(g, opts, deadline=time.perf_counter() + 3600.0)
    t.deadline = time.perf_counter() - 1.0
    t.__dict__.pop("_fit_range", None)
    with pytest.raises(DeadlinePassed):
        t.fit_range()


def test_tables_are_the_same_with_and_without_a_deadline():
    cm = reduced_cost_model("mixtral-s", 8, "H800:8,MI300X:8", 64)
    for g, opts in _configs(cm, 3):
        a = TableBuilder(cm).build(g, opts)
        b = TableBuilder(cm).build(g, opts, deadline=time.perf_counter() + 3600.0)
        for name in ("core_us", "sync_us", "static_bytes", "act_bytes", "capacity_bytes", "p2p_us", "min_layer_us"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert np.array_equal(a.fit_range()[0], b.fit_range()[0])
        assert np.array_equal(a.fit_range()[1], b.fit_range()[1])


def test_cache_stays_within_its_budget_and_rebuilds_the_same(monkeypatch):
    cm = reduced_cost_model("mixtral-s", 8, "H800:8,MI300X:8", 64)
    configs = _configs(cm, 3)
    assert len(configs) == 3
    first = TableBuilder(cm).build(*configs[0])
    monkeypatch.setattr(table_module, "CACHE_BYTES", 1)
    tb = TableBuilder(cm)
    for g, opts in configs:
        tb.build(g, opts)
        assert len(tb._cache) == 1  # only the newest is kept under a one-byte budget
    again = tb.build(*configs[0])
    assert np.array_equal(first.core_us, again.core_us)
    assert np.array_equal(first.static_bytes, again.static_bytes)


@pytest.mark.parametrize("backend", ["hsdp", "cpsat"])
def test_deadline_inside_a_table_build_ends_the_search_cleanly(monkeypatch, backend):
    """When the time limit passes while a configuration's tables are built, that configuration
    counts as not reached: the search stops with the time-limit error (no plan yet), not a crash."""
    cm = reduced_cost_model("mixtral-s", 8, "H800:8,MI300X:8", 64)

    def late(self, g, options, deadline=None):
        raise DeadlinePassed()

    monkeypatch.setattr(TableBuilder, "build", late)
    settings = SearchSettings(backend=backend, time_limit_s=5.0)
    with pytest.raises(SearchTimeLimitError):
        search(cm, SPACE, settings)


def test_time_limit_spent_reading_the_inputs_is_named(monkeypatch):
    """When reading the inputs uses up --time-limit, solve exits 3 and says so (not "0 of 0
    configurations solved")."""
    from click.testing import CliRunner

    import planner.commands.solve as solve_command
    from cli import main

    real = solve_command.load_inputs

    def slow(**kwargs):
        out = real(**kwargs)
        time.sleep(0.3)
        return out

    monkeypatch.setattr(solve_command, "load_inputs", slow)
    result = CliRunner().invoke(main, ["solve", "--model", "llama2-7b", "--cluster", "H800:8", "--time-limit", "0.2",
                                       "--quiet"])
    assert result.exit_code == 3, result.output
    assert "reading the inputs took" in result.output and "--time-limit" in result.output
    assert "Traceback" not in result.output


def test_a_passed_deadline_stops_the_cpsat_stage_model_build():
    from solver_models.cpsat.model import solve_cpsat

    cm = reduced_cost_model("mixtral-s", 8, "H800:8,MI300X:8", 64)
    g, opts = _configs(cm, 1)[0]
    t = TableBuilder(cm).build(g, opts)
    t.fit_range()  # computed before the deadline; the model build itself must notice it
    t.deadline = time.perf_counter() - 1.0
    settings = SearchSettings(backend="cpsat", time_limit_s=5.0).solver_settings()
    with pytest.raises(DeadlinePassed):
        solve_cpsat(t, upper_bound_us=None, settings=settings)


def test_deadline_inside_a_stage_solve_keeps_the_plan_found(monkeypatch):
    """--backend cpsat: the deadline passes inside the stage models after the first plan: the
    search returns that plan (FEASIBLE, not a crash), and neither reported bound exceeds the
    certified optimum of the whole space."""
    import solver_models.cpsat.model as cpsat_model

    cm = reduced_cost_model("mixtral-s", 8, "H800:8,MI300X:8", 64)
    optimum = search(cm, SPACE, SearchSettings(backend="cpsat", time_limit_s=60.0).without_pruning())
    assert optimum.status == "OPTIMAL"
    best_s = optimum.best[0].objective_s
    real = cpsat_model.all_cells
    calls = {"n": 0}

    def late_after_one(t, **kwargs):
        calls["n"] += 1
        if calls["n"] > 1:
            raise DeadlinePassed()
        return real(t, **kwargs)

    monkeypatch.setattr(cpsat_model, "all_cells", late_after_one)
    for settings in (SearchSettings(backend="cpsat", time_limit_s=30.0),
                     SearchSettings(backend="cpsat", time_limit_s=30.0).without_pruning()):
        calls["n"] = 0
        cut = search(cm, SPACE, settings)
        assert cut.best and math.isfinite(cut.costs[0].iteration_time_s)
        assert cut.status == "FEASIBLE" and cut.timed_out
        assert cut.best[0].objective_s >= best_s - 1e-9
        for bound in (cut.lower_bound_s, cut.pruned_lower_bound_s):
            assert bound is None or bound <= best_s + 1e-9
