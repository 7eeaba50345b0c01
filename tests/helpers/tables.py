"""Hand-made stage tables for the solver tests: each option's stage time the sum of its layers' times,
one memory unit per layer."""

from __future__ import annotations

import numpy as np

from planner.schemas.plan import Recompute
from planner.schemas.search import GlobalChoice, StageOption
from solver_models.scaling import INF_US
from solver_models.tables import FIRST, StageTables


def make_tables(layer_us: list[list[int]], *, pp: int = 2, m: int = 4, vpp: int = 1,
                option_type: list[int] | None = None, budget: list[int] | None = None,
                p2p_us: int | list[list[int]] = 0, first_extra_us: int = 0, cap_layers: list[float] | None = None,
                sync_per_layer_us: list[int] | None = None, dps: list[int] | None = None,
                recomputes: list[Recompute] | None = None, min_layer_us: list[int] | None = None,
                p2p_near_us: list[list[int]] | None = None, gpus_per_node: list[int] | None = None,
                traffic_us: list[list[list[int]]] | None = None,
                fill_us: list[list[list[int]]] | None = None) -> StageTables:
    """Tables where option o's stage core time is the sum of layer_us[o][j] over its layers (+
    first_extra_us on the first stage), memory is one unit per layer against cap_layers[o].  With
    `p2p_near_us` and `gpus_per_node`, links inside a node cost the near prices; with `traffic_us` ([far, near]
    per option pair) links carry M and each stage's forward is a third of its core (rounded down); with `fill_us`
    ([far, near]) each boundary adds X to the objective."""
    num_o, n_layers = len(layer_us), len(layer_us[0])
    option_type = option_type or list(range(num_o))
    n_types = max(option_type) + 1
    budget = budget or [1] * n_types
    dps = dps or [1] * num_o
    recomputes = recomputes or [Recompute.none()] * num_o
    cap_layers = cap_layers or [float(n_layers)] * num_o
    sync_per_layer_us = sync_per_layer_us or [0] * num_o
    shape = (num_o, 4, n_layers + 1, n_layers + 1)
    core = np.full(shape, INF_US, dtype=np.int64)
    sync = np.full(shape, INF_US, dtype=np.int64)
    static = np.full(shape, np.inf)
    for o in range(num_o):
        for p in range(4):
            for s in range(n_layers):
                for n in range(1, n_layers - s + 1):
                    core[o, p, s, n] = sum(layer_us[o][s:s + n]) + (first_extra_us if p == FIRST else 0)
                    sync[o, p, s, n] = sync_per_layer_us[o] * n
                    static[o, p, s, n] = float(n)
    if isinstance(p2p_us, int):
        p2p_us = [[p2p_us] * num_o for _ in range(num_o)]
    fwd = np.where(core < INF_US, core // 3, INF_US) if traffic_us is not None else None
    types = [f"T{k}" for k in range(n_types)]
    g = GlobalChoice("flagscale", 1, 1, 1, 1, 1, pp, vpp, dps[0], None)
    return StageTables(
        g=g, options=[StageOption(types[option_type[o]], dps[o], recomputes[o]) for o in range(num_o)],
        num_layers=n_layers, num_microbatches=m, core_us=core, sync_us=sync, static_bytes=static,
        act_bytes=np.zeros(shape), capacity_bytes=np.array(cap_layers, dtype=float),
        p2p_us=np.array(p2p_us, dtype=np.int64), inflight=np.zeros(pp),
        option_type=np.array(option_type, dtype=np.int64), option_gpus=np.array(dps, dtype=np.int64),
        types=types, budget=np.array(budget, dtype=np.int64),
        min_layer_us=np.array(min_layer_us or [min(r) for r in layer_us], dtype=np.int64),
        p2p_near_us=None if p2p_near_us is None else np.array(p2p_near_us, dtype=np.int64),
        gpus_per_node=None if gpus_per_node is None else np.array(gpus_per_node, dtype=np.int64),
        traffic_us=None if traffic_us is None else np.array(traffic_us, dtype=np.int64), fwd_us=fwd,
        fill_us=None if fill_us is None else np.array(fill_us, dtype=np.int64),
    )
