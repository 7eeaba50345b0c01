"""The search's lower bounds (planner/search/bounds.py): the GPU-budget test against brute-force
enumeration, and the whole bound against each configuration's exact optimum (brute force over the
integer tables) in both runtimes, with and without a plan to beat."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import numpy as np
import pytest

from planner.schemas.plan import Recompute
from planner.search.bounds import OptionBound, _budget_test, _holds, _holds_each, lower_bound_s, option_bound, \
    stage_free_bytes
from planner.schemas.search import GlobalChoice, StageOption
from planner.search.screening import Configurations
from planner.search.space import SearchSpace, enumerate_globals, stage_options
from solver_models.brute import solve_brute
from solver_models.fitting import has_fitting_layout
from planner.search.tables import TableBuilder

from helpers.cases import reduced_cost_model

TYPES = ("H800", "MI300X", "910B")


def _brute_max_layers(cell: np.ndarray, options, budget: dict[str, int], tp: int) -> int:
    """Most layers PP stages can hold (each on an option with >= 1 layer in its cell, GPUs per type
    within budget), by enumerating every option sequence; -1 when no sequence is valid."""
    best = -1
    pp = cell.shape[0]
    for seq in itertools.product(range(len(options)), repeat=pp):
        if any(cell[i, o] < 1 for i, o in enumerate(seq)):
            continue
        used: dict[str, int] = {}
        for o in seq:
            used[options[o].device_type] = used.get(options[o].device_type, 0) + tp * options[o].dp
        if any(used[h] > budget[h] for h in used):
            continue
        best = max(best, int(sum(cell[i, o] for i, o in enumerate(seq))))
    return best


@pytest.mark.parametrize("uniform_dp", [False, True], ids=["per-stage-dp", "one-dp"])
def test_budget_test_matches_enumeration(uniform_dp):
    """The budget DP answers 'can these stages hold N layers?' exactly as enumeration does: yes at
    the enumerated maximum, no one layer above it (per-stage DP: the general DP; one DP for all
    options: the stage-count DP the megatron runtime uses)."""
    rng = random.Random(7)
    checked = 0
    for _ in range(60):
        n_types = rng.randint(1, 3)
        types = TYPES[:n_types]
        tp = rng.choice((1, 2))
        dps = [rng.choice((1, 2))] if uniform_dp else [1, 2, 4]
        options = [StageOption(h, dp, Recompute.none()) for h in types for dp in dps if rng.random() < 0.8]
        if not options:
            continue
        budget = {h: tp * rng.randint(1, 6) for h in types}
        pp = rng.randint(1, 4)
        cell = np.array([[rng.randint(0, 5) for _ in options] for _ in range(pp)], dtype=np.int64)
        g = GlobalChoice("flagscale", tp, 1, 1, 1, 4, pp, 1, 1, None)
        test = _budget_test(g, options, budget)
        assert test is not None
        most = _brute_max_layers(cell, options, budget, tp)
        if most < 0:
            assert not test(cell, 1)
            continue
        assert test(cell, most), (cell.tolist(), options, budget)
        assert not test(cell, most + 1), (cell.tolist(), options, budget)
        checked += 1
    assert checked >= 25


CASES = [
    # (model preset, layers kept, MoE pattern or None, cluster, global batch, runtime)
    ("mixtral-s", 6, None, "H800:8,MI300X:8,910B:8", 48, "flagscale"),
    ("llama2-7b", 8, None, "H800:8,A100:8,910B:8", 32, "flagscale"),
    ("mixtral-s", 6, None, "H800:8,MI300X:8,910B:8", 48, "megatron"),
    ("deepseek-v2-lite", 6, (0, 1, 1, 0, 1, 1), "H800:8,MI300X:8", 32, "megatron"),
    ("deepseek-v2-lite", 5, (0, 0, 1, 1, 1), "H800:8,MI300X:8,910B:8", 48, "flagscale"),
    # memory-tight: big layers and a large vocabulary, so the embedding and output layer matter
    ("qwen3-235b-a22b", 4, None, "H800:8,910B:8", 16, "megatron"),
    ("qwen3-235b-a22b", 4, None, "H800:8,MI300X:8", 16, "flagscale"),
    # Megatron-FSDP (ZeRO-3): a stage holds two layers' unsharded parameters once, whatever its layers, and the
    # ends' unsharded copy spread over them, so n one-layer stages overstate an n-layer one
    ("qwen3-235b-a22b", 4, None, "H800:8", 16, "megatron", "optim_grads_params"),
    ("mixtral-s", 6, None, "H800:8,MI300X:8", 48, "flagscale", "optim_grads_params"),
]


# every configuration of the memory-tight case on megatron: about 15 s, so in the slow run
SLOW_CASES = {("qwen3-235b-a22b", "megatron", None)}


@pytest.mark.parametrize("case", [
    pytest.param(c, id=f"{c[0]}-{c[5]}-{len(c[3].split(','))}types" + ("-fsdp" if len(c) > 6 else ""),
                 marks=pytest.mark.slow if (c[0], c[5], c[6] if len(c) > 6 else None) in SLOW_CASES else ())
    for c in CASES
])
def test_bound_never_exceeds_the_exact_optimum(case):
    """For sampled configurations with PP 2..4 (dense, MoE, and mixed dense/MoE layers; with Megatron-FSDP): the
    cheap and the tight bound and the screening's relaxed one (its shape's, with the memory test of weights,
    gradients and optimizer state alone) are at most brute force's optimum; given a plan to beat, the tight bound
    is unchanged when below it and at least that plan when not; and has_fitting_layout says a layout fits
    exactly when brute force finds one."""
    preset, layers, pattern, cluster, gbs, runtime, *fsdp = case
    cm = reduced_cost_model(preset, layers, cluster, gbs, pattern=pattern, fsdp=fsdp[0] if fsdp else None)
    model, training, cl = cm.model, cm.training, cm.cluster
    kinds = {k: model.layer_is_moe.count(k) for k in (False, True)}
    ladder = (Recompute.none(), Recompute.selective(("core_attn",)), Recompute.full("block", 1),
              Recompute.full("block", 2), Recompute.full("uniform", 1))
    space = SearchSpace(runtime=runtime, mbs=(1, 2), recompute=ladder,
                        stage_recompute=(Recompute.none(), Recompute.full("uniform", 1)))
    gpn = {h: cm.domain_gpus(h) for h in cl.gpus_by_type()}
    tb = TableBuilder(cm)
    budget = cl.gpus_by_type()
    configs = [g for g in enumerate_globals(model, training, cl, space, gpn) if 2 <= g.pp <= 4]
    screen = Configurations(cm, space, tb)
    for shape in screen.shapes():
        screen.shape_bounds(shape)
    checked = fit_checked = 0  # fit_checked: configurations where nothing fits
    # memory-tight cases: every third of their 5,200 configurations (the bound's memory side decides many of them;
    # every one cost the slow run 50 s more); the others: about 24
    step = 3 if preset.startswith("qwen3-235b") else max(1, len(configs) // 24)
    for g in configs[::step]:
        opts = stage_options(g, model, training, cl, space, gpn)
        if not opts or len(opts) ** g.pp > 20_000:
            continue
        t = tb.build(g, opts)
        sol = solve_brute(t)
        # the memory-pruning rule's feasibility test agrees with brute force on every configuration
        assert has_fitting_layout(t) == (sol is not None), g.label()
        fit_checked += sol is None
        if g.pp <= 3 and checked % 4 == 0:
            # and without the contiguity rule (device types in any order)
            t.contiguous_types = False
            assert has_fitting_layout(t) == (solve_brute(t) is not None), g.label()
            t.contiguous_types = True
        gs = tb.shape(g)
        obs = {o: option_bound(cm, replace(gs, vpp=1, pp=2), o) for o in opts}
        room = {o: stage_free_bytes(cm, replace(gs, vpp=1, pp=2), o) for o in opts}
        inflight = [cm.inflight_microbatches(gs, i) for i in range(g.pp)]
        m = gs.num_microbatches
        lb = lower_bound_s(obs, g, opts, budget, layers, m, inflight, tight=True, kind_counts=kinds, free_at=room)
        if sol is None:
            continue
        opt_s = sol.objective_us * 1e-6 / g.vpp
        slack_s = (m * g.vpp + g.pp) * 1e-6  # the tables round each stage time to 1 us
        assert lb <= opt_s + slack_s, g.label()
        assert screen.relaxed_bound(g) <= opt_s + slack_s, g.label()
        cheap = lower_bound_s(obs, g, opts, budget, layers, m, inflight, tight=False, kind_counts=kinds)
        assert cheap <= opt_s + slack_s, g.label()
        for beat in (opt_s, 0.5 * (lb + opt_s), 0.99 * lb, 1.5 * opt_s):
            lb_beat = lower_bound_s(obs, g, opts, budget, layers, m, inflight, tight=True, beat_s=beat,
                                    kind_counts=kinds, free_at=room)
            assert lb_beat <= max(opt_s + slack_s, beat), g.label()
            if lb < beat:
                assert lb_beat == pytest.approx(lb, rel=1e-12), g.label()
            else:
                assert lb_beat >= beat or math.isclose(lb_beat, beat), g.label()
        checked += 1
    print(f"\n{case[0]} {runtime}: {len(configs)} configurations, {checked} checked, {fit_checked} with no layout that fits")
    assert checked >= 5
    if preset.startswith("qwen3-235b") and runtime == "megatron":
        # the memory-tight case does exercise "nothing fits" (on flagscale the enumeration itself
        # already leaves out the stage counts whose GPUs the cluster cannot hold)
        assert fit_checked >= 5


def test_max_rates_match_enumeration():
    """The fluid bound's largest summed rate of exactly k stages within each type's GPU budget
    equals enumeration over every multiset of stage options."""
    from planner.search.bounds import OptionBound, _max_rates

    rng = random.Random(11)
    for _ in range(40):
        types = TYPES[: rng.randint(1, 3)]
        options = [StageOption(h, dp, Recompute.none()) for h in types for dp in (1, 2, 4) if rng.random() < 0.7]
        if not options:
            continue
        ob = {o: OptionBound(layer_s=rng.uniform(0.01, 0.1) / o.dp ** rng.uniform(0.7, 1.0), layer_static_bytes=1.0,
                             layer_act_bytes=1.0, free_bytes=1.0) for o in options}
        budget = {h: rng.randint(1, 7) for h in types}
        g = GlobalChoice("flagscale", 1, 1, 1, 1, 4, 1, 1, 1, None)
        rates = _max_rates(g, options, tuple(ob[o].layer_s for o in options), budget, max_stages=6)
        for k in range(0, 7):
            best = -math.inf
            for combo in itertools.combinations_with_replacement(options, k):
                used = {h: sum(o.dp for o in combo if o.device_type == h) for h in types}
                if all(used[h] <= budget[h] for h in types):
                    best = max(best, sum(1.0 / ob[o].layer_s for o in combo))
            got = rates[k] if k < len(rates) else -math.inf
            assert got == pytest.approx(best) if math.isfinite(best) else got == -math.inf, (k, budget, options)


def test_block_recompute_spares_only_the_layers_a_stage_holds():
    """Full block recompute of k = 4 layers per chunk at VPP 8 re-runs at most 32 layers of a stage, but never
    more than it holds.  One option, 100 bytes free per stage, 30 static and 1 activation byte per layer per
    micro-batch, a re-run layer spares 0.9 of it, 8 micro-batches in flight: n layers take n x 30.8 while
    n <= 32, so a stage holds 3 (4 take 123.2), and 2 stages hold 6 of the 8 layers: nothing fits, which the
    cheap and the tight bound both say (math.inf).  Sparing 32 layers' worth whatever the stage holds
    (100 + 8 x 32 x 0.9 = 330.4 bytes over 38 per layer) would let 8 fit per stage."""
    o = StageOption("H800", 1, Recompute.full("block", 4))
    ob = {o: OptionBound(layer_s=0.01, layer_static_bytes=30.0, layer_act_bytes=1.0, free_bytes=100.0,
                         kinds=((True, 0.01, 30.0, 1.0),), block_layers=4, stage_extra_s=0.001,
                         act_saved_bytes=0.9)}
    g = GlobalChoice("megatron", 1, 1, 1, 1, 1, 2, 8, 1, o.recompute)
    inflight = [8.0, 8.0]
    assert _holds(100.0, 8.0, 30.0, 1.0, 32, 0.9, 8) == 3
    for tight in (False, True):
        assert lower_bound_s(ob, g, [o], {"H800": 8}, 8, 16, inflight, tight=tight) == math.inf
        # 6 layers do fit: both bounds are finite there
        assert math.isfinite(lower_bound_s(ob, g, [o], {"H800": 8}, 6, 16, inflight, tight=tight))


def test_layers_held_match_enumeration():
    """`_holds` (scalar) and `_holds_each` (arrays) give the greatest n <= count with
    n x (static + a x act) - a x min(n, rerun) x min(saved, act) <= room (brute force over n) on 2,000 seeded
    stages, with and without block recompute, rooms below zero included."""
    rng = np.random.default_rng(7)
    cases = []
    for _ in range(2000):
        room, static, act = float(rng.uniform(-20, 1000)), float(rng.uniform(0, 50)), float(rng.uniform(0, 30))
        saved = float(rng.uniform(0, 40))
        load, rerun = float(rng.choice([1.0, 2.5, 7.25, 14.0])), int(rng.choice([0, 1, 2, 4, 8, 32]))
        count = int(rng.integers(1, 80))
        fit = [n for n in range(count + 1) if room >= 0 and n * (static + load * act)
               - load * min(n, rerun) * min(saved, act) <= room * (1 + 1e-12)]
        one = _holds(room, load, static, act, rerun, saved, count)
        assert one == max(fit, default=0), (room, load, static, act, rerun, saved, count)
        cases.append((room, load, static, act, rerun, saved, count, one))
    for count in {c[6] for c in cases}:
        sub = np.array([c for c in cases if c[6] == count])
        got = _holds_each(sub[:, 0], sub[:, 1], sub[:, 2], sub[:, 3], sub[:, 4], sub[:, 5], count)
        assert got.tolist() == sub[:, 7].tolist()


def test_pipeline_bounds_of_one_micro_batch_with_no_rate_are_infinite_not_nan():
    """One micro-batch (m x VPP - 1 = 0) where no stage option holds the layers (no rate): 0 x inf made the relaxed
    bound NaN (a RuntimeWarning on a Megatron-FSDP search), which compares false with everything in the search's
    queue; it is infinite."""
    import warnings

    from planner.search.bounds import ShapeBounds

    class Group:
        count = 4

    sb = ShapeBounds.__new__(ShapeBounds)  # the fields pipeline_bounds reads, as __init__ sets them
    sb.groups, sb.rates, sb.held, sb.sum_lb, sb.m = [Group()], [np.zeros(3)], [np.full(3, 10)], 1.0, 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sb.pipeline_bounds(((1, 1), (2, 1))).tolist() == [math.inf, math.inf]
