"""The memo tables the screen pricing reads (planner/search/prices.py, planner/cost/model.py, planner/cost/ranges.py,
planner/cost/curves.py) never hand back a figure priced for something else: keys narrowed to what a figure reads
(a layer without its stage's DP, a stage's own bytes without its device, micro-batch and recompute, the part factors
without PP and VPP) give what a fresh cost model gives, and two searches priced one after the other in one process
give the prices each gets in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from planner.api import load_inputs, make_space, runtime_choice
from planner.cost.model import CostModel, GlobalShape
from planner.cost.ranges import RangeModel
from planner.schemas.plan import Recompute
from planner.search.prices import PriceBook
from planner.search.tables import TableBuilder

ROOT = Path(__file__).resolve().parents[1]
CASES = (("qwen3-30b-a3b", "H100:16"), ("mixtral-l", "H800:16,MI300X:16,910B:16"))

DIGEST = """
import hashlib, pickle, sys
from tests.test_pricing_caches import master_prices
for model, cluster in zip(sys.argv[1::2], sys.argv[2::2]):
    print(hashlib.sha256(pickle.dumps(master_prices(model, cluster))).hexdigest())
"""


def _ranges(model: str, cluster: str):
    inp = load_inputs(model=model, cluster=cluster, allow_invalid=True)
    choice = runtime_choice("auto", inp.cluster, inp.profiles, inp.run, None)
    space = make_space(inp.run, choice.runtime.name)
    return RangeModel(inp.run.model, inp.run.training, choice.cluster, inp.profiles), space


def master_prices(model: str, cluster: str) -> dict:
    """The screen's prices of every shape (the pessimistic end, as `solve` searches), no time limit."""
    ranges, space = _ranges(model, cluster)
    cost = ranges.high
    book = PriceBook(cost, space, TableBuilder(cost, contiguous_types=space.contiguous))
    assert book.price_master(float("inf"))
    return book.master


def _digests(*cases: tuple[str, str]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT)] + sys.path)}
    out = subprocess.run([sys.executable, "-c", DIGEST, *(x for case in cases for x in case)], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == len(cases)
    return out


def test_two_searches_in_one_process_price_as_fresh_processes():
    """Each case priced in a process of its own, and both in one process (either order): the same prices."""
    alone = [_digests(case)[0] for case in CASES]
    assert alone[0] != alone[1]
    assert _digests(*CASES) == alone
    assert _digests(*reversed(CASES)) == list(reversed(alone))


def _shape(cm: CostModel, **kw) -> GlobalShape:
    base = dict(tp=2, cp=1, ep=4, etp=1, vpp=1, mbs=1, gbs=64, dp0=4, pp=2, sequence_parallel=True)
    return GlobalShape(**{**base, **kw})


@pytest.fixture(scope="module")
def qwen():
    return _ranges("qwen3-30b-a3b", "H100:16")[0]


def _fresh(cm: CostModel) -> CostModel:
    return CostModel(cm.model, cm.training, cm.cluster, cm.profiles, memory_headroom=cm.memory_headroom)


def test_layers_priced_in_one_model_are_fresh_ones(qwen):
    """A layer's price reads no DP link: layers asked for one after the other in one model (every DP, micro-batch
    and kind, so a key missing any of what the layer reads hands back a stale one) are what a fresh model prices
    for each, and the layer's DP links are left out (a read fails)."""
    cm = qwen.nominal
    asked = [(dp, mbs, moe) for dp in (2, 8) for mbs in (1, 4) for moe in (True, False)]
    got = [cm.layer(_shape(cm, dp0=dp), "H100", dp, mbs, moe) for dp, mbs, moe in asked]
    assert got == [_fresh(cm).layer(_shape(cm, dp0=dp), "H100", dp, mbs, moe) for dp, mbs, moe in asked]
    assert got[0] != got[2]  # the micro-batch changes the price
    links = cm.layer_links("H100", tp=2, cp=1, ep=4, etp=1)
    assert links.dp is None and links.edp is None
    assert links.ep == cm.group_links("H100", tp=2, cp=1, dp=8, ep=4, etp=1).ep


def test_stage_own_bytes_are_the_stage_core_s(qwen):
    """stage_own_bytes, memoised without device, micro-batch, VPP and recompute, is weights + grads + optimizer of
    the stage core with each of them (asked in an order that would hand back a stale entry if any mattered)."""
    cm = qwen.nominal
    for mbs, vpp, rec in ((1, 1, Recompute.none()), (2, 2, Recompute.full("uniform", 1)), (4, 1, Recompute.none())):
        for dp, pp in ((4, 2), (2, 1)):
            g = _shape(cm, mbs=mbs, vpp=vpp, dp0=dp, pp=pp)
            for kinds in ((True,), (True, True), (False, True)):
                for first, last in ((False, False), (True, False), (False, True)):
                    core = cm.stage_core_of_kinds(g, device_type="H100", kinds=kinds, dp=dp, recompute=rec,
                                                  is_first=first, is_last=last)
                    own = cm.stage_own_bytes(g, kinds=kinds, dp=dp, is_first=first, is_last=last)
                    assert own == core.weights_bytes + core.grads_bytes + core.optimizer_bytes


def test_part_factors_across_pipelines_are_fresh_ones(qwen):
    """The range end's part factors, memoised without PP, VPP and the global batch, equal a fresh range's for
    every stage asked one after the other (recompute granularities, micro-batches, DPs, pipelines)."""
    high = qwen.high
    stages = [(replace(_shape(high), mbs=mbs, dp0=dp, pp=pp, vpp=vpp), dp, rec)
              for mbs in (1, 8) for dp in (1, 4) for pp, vpp in ((2, 1), (4, 2))
              for rec in (Recompute.none(), Recompute.full("uniform", 1))]
    got = [high.part_factors(g, "H100", dp, rec) for g, dp, rec in stages]
    fresh = [_ranges("qwen3-30b-a3b", "H100:16")[0].high.part_factors(g, "H100", dp, rec) for g, dp, rec in stages]
    assert got == fresh
    assert len({tuple(sorted(f.items())) for f in got}) > 1  # the stages' factors differ


def test_stage_sync_is_the_stage_core_s():
    """stage_sync_s, which prices a stage's times without its memory, is its core's sync_s at both ends of the
    range and at the nominal model, whether the core was priced before or not."""
    ranges = _ranges("qwen3-30b-a3b", "H100:16")[0]
    stages = [(_shape(ranges.high, mbs=mbs, vpp=vpp, pp=4), start, end, rec)
              for mbs in (1, 2) for vpp in (1, 2) for start, end in ((0, 1), (3, 9), (0, 12))
              for rec in (Recompute.none(), Recompute.full("block", 2), Recompute.full("uniform", 1))]
    for cm in (ranges.high, ranges.low, ranges.nominal):
        for g, start, end, rec in stages:
            kw = dict(device_type="H100", start=start, end=end, dp=4, recompute=rec, is_first=False, is_last=False)
            before = cm.stage_sync_s(g, **kw)  # no core yet (the first end asked) or the nominal's core
            assert before == cm.stage_core(g, **kw).sync_s == cm.stage_sync_s(g, **kw)
