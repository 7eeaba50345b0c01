"""Is --backend cpsat's certificate sound?  Small generated instances where brute force runs, each checked
two ways against it (issue 32):

* every configuration: the shape screen's bound (the degree master's prices, and its recompute setting's
  own), the CP-SAT pipeline block's value with the configuration's degrees fixed and its tight bound
  (planner/search/bounds.py, which the search settles configurations with before their stage solve) are at
  most the configuration's brute-force optimum over the exact integer tables (all three are relaxations);
* the instance: cpsat's OPTIMAL over the whole space (no pruning) is brute force's optimum, and its
  lower bound is at or below it.

An instance is a preset cut to a few layers on two device types of unequal memory, with a memory headroom
set at the edge: just below what the best plan without headroom needs on its fullest GPU, so that plan no
longer fits and the winners are memory-bound, often with middle stages of one class holding unequal
layer counts (the case a relaxation of one count per class got wrong).  Seeded: `generate(seed)` is
deterministic.

    python -m tools.soundness --seeds 200          # the longer sweep (tests/test_soundness.py runs a few)
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field

from planner.api import reduce_layers
from planner.cost.model import CostModel
from planner.errors import InfeasibleError
from planner.inputs.cluster import parse_cluster
from planner.inputs.resolve import resolve_run
from planner.profile_tables import ProfileSet
from planner.schemas.plan import Recompute
from planner.search.certify import MICROBATCH_SCOPE, BendersSearch
from planner.search.driver import search
from planner.search.settings import SearchResult, SearchSettings
from planner.search.space import SearchSpace
from solver_models.brute import solve_brute
from solver_models.cpsat.master import shape_bound_us
from solver_models.cpsat.pipeline import PipelineBlock

# NVIDIA pairs of unequal memory (one upstream Megatron-LM job holds them), and one NVIDIA + AMD pair for
# FlagScale's per-stage meshes
PAIRS = (("H800", "A100-40GB"), ("H20", "A100-40GB"), ("H100", "A100"), ("H800", "H20"), ("A100", "A100-40GB"))
FLAGSCALE_PAIR = ("H800", "MI300X")
PRESETS = ("mixtral-s", "llama2-7b", "qwen3-30b-a3b")
RECOMPUTE = (Recompute.none(), Recompute.selective(("core_attn",)), Recompute.full("uniform", 1),
             Recompute.full("block", 1), Recompute.full("block", 2))


@dataclass(frozen=True)
class Instance:
    seed: int
    preset: str
    layers: int
    cluster: str
    gbs: int
    space: SearchSpace
    headroom: float = 0.0  # set at the memory edge by at_memory_edge()

    def label(self) -> str:
        return (f"seed {self.seed}: {self.preset} {self.layers}L on {self.cluster} gbs {self.gbs} "
                f"{self.space.runtime} headroom {self.headroom:.4f}")


def cost_model(inst: Instance, headroom: float | None = None) -> CostModel:
    profiles = ProfileSet.load()
    cluster = parse_cluster(inst.cluster, profiles)
    run = reduce_layers(resolve_run(model=inst.preset, world_size=cluster.world_size,
                                    overrides={"gbs": inst.gbs}), inst.layers)
    return CostModel(run.model, run.training, cluster, profiles,
                     memory_headroom=inst.headroom if headroom is None else headroom)


def generate(seed: int) -> Instance:
    """The instance of a seed, its headroom not yet set (deterministic)."""
    rng = random.Random(seed)
    flagscale = rng.random() < 0.2
    a, b = FLAGSCALE_PAIR if flagscale else rng.choice(PAIRS)
    # flagscale's stages each choose a DP and a recompute mode: brute force runs on four GPUs and few layers
    n_a, n_b = rng.choice(((2, 2),) if flagscale else ((2, 2), (4, 2), (2, 4), (4, 4), (3, 3), (6, 2)))
    preset = rng.choice(PRESETS)
    layers = rng.randint(5, 7 if flagscale else 9)
    gbs = rng.choice((8, 16, 24))
    recompute = tuple(sorted(rng.sample(RECOMPUTE, 2), key=RECOMPUTE.index))
    if flagscale:
        space = SearchSpace(runtime="flagscale", tp=(1,), cp=(1,), mbs=(1, 2), selective=(),
                            stage_recompute=tuple(r for r in recompute if r.granularity != "selective")
                            or (Recompute.none(),))
    else:
        space = SearchSpace(tp=(1, 2) if rng.random() < 0.3 else (1,), cp=(1,), mbs=(1, 2),
                            vpp=rng.choice(((1,), (1, 2), (1, 2, 3))), recompute=recompute)
    return Instance(seed, preset, layers, f"{a}:{n_a},{b}:{n_b}", gbs, space)


def whole_space(cost: CostModel, space: SearchSpace, backend: str, time_limit_s: float = 600.0
                ) -> SearchResult | None:
    """The backend's search over the whole space (no pruning); None when nothing fits."""
    try:
        return search(cost, space, SearchSettings(backend=backend, time_limit_s=time_limit_s).without_pruning())
    except InfeasibleError:
        return None


def at_memory_edge(inst: Instance) -> Instance | None:
    """The instance with its headroom just below what brute force's best plan without headroom needs on
    its fullest GPU (by a seeded 0.1-8%), so that plan no longer fits; None when nothing fits at all."""
    free = whole_space(cost_model(inst, 0.0), inst.space, "brute")
    if free is None:
        return None
    used = max(s.memory_bytes / s.device_memory_bytes for s in free.costs[0].stages)
    eps = random.Random(inst.seed + 7919).uniform(0.001, 0.08)
    return Instance(inst.seed, inst.preset, inst.layers, inst.cluster, inst.gbs, inst.space,
                    headroom=max(0.0, 1.0 - used * (1.0 - eps)))


@dataclass
class Verdict:
    instance: Instance
    configs_checked: int = 0
    block_above: list[str] = field(default_factory=list)  # configurations whose block value exceeds brute force
    screen_above: list[str] = field(default_factory=list)  # ... whose shape screen's bound does
    tight_above: list[str] = field(default_factory=list)  # ... whose tight bound does
    brute_s: float | None = None
    cpsat_s: float | None = None
    cpsat_status: str | None = None
    cpsat_bound_s: float | None = None

    @property
    def sound(self) -> bool:
        agree = self.brute_s is None and self.cpsat_s is None or (
            self.brute_s is not None and self.cpsat_s is not None and self.cpsat_status == "OPTIMAL"
            and abs(self.cpsat_s - self.brute_s) <= 1e-9 * self.brute_s
            and self.cpsat_bound_s is not None and self.cpsat_bound_s <= self.brute_s * (1 + 1e-9))
        return agree and not self.block_above and not self.screen_above and not self.tight_above


def check(inst: Instance) -> Verdict:
    """Both checks of the module docstring on one instance (its headroom as given)."""
    cost = cost_model(inst)
    v = Verdict(inst)
    bs = BendersSearch(cost, inst.space, SearchSettings(time_limit_s=600).without_pruning(), time.perf_counter(),
                       None)
    book, lv = bs.book, bs.levels
    vpps = lv.domains[lv.vpp] if lv.vpp else (1,)
    book.price_master(float("inf"))
    for key, shape in book.shapes.items():
        block = bs._block(key, list(range(len(book.settings))))
        m = lv.microbatches(*(value for f, value in zip(lv.shape, key) if f in MICROBATCH_SCOPE))
        coarse = shape_bound_us(book.master[key], book.classes, book.groups, m, vpps) if book.master.get(key) else None
        for g in shape.choices():
            sol = solve_brute(bs._tables(g, exact=True))
            if sol is None:
                continue
            best_us = sol.objective_us / g.vpp
            row = book.block(key)[book.settings.index(g.recompute)]
            own = shape_bound_us(row, book.classes, book.groups, m, vpps) if row else None
            if coarse is None or coarse > best_us or own is None or own > best_us:
                v.screen_above.append(f"{g.label()}: screen {coarse} us, with its recompute's prices {own} us > "
                                      f"brute force {best_us:.0f} us")
            tight = bs._tight_us(g, None)
            if tight > best_us:
                v.tight_above.append(f"{g.label()}: tight bound {tight:.0f} us > brute force {best_us:.0f} us")
            fixed = PipelineBlock(block.spec)
            for f, value in book.block_degrees(g).items():
                fixed.model.add(fixed.x[f] == value)
            res = fixed.solve(time_limit_s=30, num_workers=1)
            v.configs_checked += 1
            if res.objective_us is None or res.objective_us > best_us:
                v.block_above.append(f"{g.label()}: block {res.status} {res.objective_us} us > brute force "
                                     f"{best_us:.0f} us (stages {sol.stages})")
    brute = whole_space(cost, inst.space, "brute")
    cpsat = whole_space(cost, inst.space, "cpsat")
    if brute is not None:
        v.brute_s = brute.best[0].objective_s
    if cpsat is not None:
        v.cpsat_s, v.cpsat_status, v.cpsat_bound_s = cpsat.best[0].objective_s, cpsat.status, cpsat.lower_bound_s
    return v


def instances(seeds) -> list[Instance]:
    """The seeds' instances at their memory edge (seeds where nothing fits at all are skipped)."""
    out = []
    for seed in seeds:
        inst = at_memory_edge(generate(seed))
        if inst is not None:
            out.append(inst)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=100, help="how many seeds (from --first)")
    ap.add_argument("--first", type=int, default=0)
    args = ap.parse_args(argv)
    bad = 0
    t0 = time.perf_counter()
    for seed in range(args.first, args.first + args.seeds):
        inst = at_memory_edge(generate(seed))
        if inst is None:
            print(f"seed {seed}: nothing fits, skipped", flush=True)
            continue
        v = check(inst)
        bad += not v.sound
        print(f"{'ok  ' if v.sound else 'FAIL'} {inst.label()}: {v.configs_checked} configurations, brute "
              f"{v.brute_s}, cpsat {v.cpsat_status} {v.cpsat_s} bound {v.cpsat_bound_s}", flush=True)
        for line in v.block_above + v.screen_above + v.tight_above:
            print("     " + line)
    print(f"{bad} unsound of {args.seeds} seeds in {time.perf_counter() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
