"""An independent brute force over the whole documented search space (README, "The search
space"), for the tests: it imports nothing from planner/search or solver_models, only the rules
module (planner/megatron/rules.py) and the evaluator (planner/cost/model.py).

It enumerates every plan of the given menus: the degrees, every DP (a plan may leave GPUs idle),
every pipeline depth, every sequence of device types (and, on flagscale, of stage DPs and
recompute settings) and every layer split, keeps those check_plan accepts and that fit in
memory, and prices each with CostModel.  Exponential: for reduced models (a few layers) on small
clusters only.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from planner.cost.model import CostModel, GlobalShape, type_offsets
from planner.megatron.rules import check_plan
from planner.schemas.plan import Plan, Recompute, StagePlan
from planner.schemas.search import stage_min_layers


@dataclass(frozen=True)
class Menus:
    """The values the space offers (the README's menus, narrowed for a test).

    megatron: `recompute` is the global setting.  flagscale: `recompute` holds what a stage may
    choose on its own (none or full) and `selective` the settings every stage must share."""

    runtime: str = "megatron"
    tp: tuple[int, ...] = (1, 2, 4, 8)
    cp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] | None = None  # None: every divisor of the expert count
    etp: tuple[int, ...] | None = None  # None: the TP menu
    mbs: tuple[int, ...] = (1, 2, 4)
    vpp: tuple[int, ...] = (1,)
    recompute: tuple[Recompute, ...] = (Recompute.none(),)
    selective: tuple[Recompute, ...] = ()
    contiguous: bool = False  # megatron --contiguous-types (flagscale: always)


@dataclass
class OracleResult:
    best_s: float
    plan: Plan
    plans: int  # plans priced
    fitting: int  # plans that fit
    per_config: dict = field(default_factory=dict)  # (degrees) -> best seconds


def _compositions(n: int, k: int, vpp: int):
    """Ordered ways to write n as k parts, part i at least stage_min_layers(i, k, vpp)."""
    least = [stage_min_layers(i, k, vpp) for i in range(k)]
    spare = n - sum(least)
    if spare < 0:
        return
    for cuts in itertools.combinations(range(spare + k - 1), k - 1):
        prev, parts = -1, []
        for i, c in enumerate(cuts + (spare + k - 1,)):
            parts.append(c - prev - 1 + least[i])
            prev = c
        yield parts


class Oracle:
    def __init__(self, cost: CostModel, menus: Menus):
        self.cost, self.menus = cost, menus
        self.model, self.training = cost.model, cost.training
        self.budget = cost.cluster.gpus_by_type()
        self.gpn = {h: cost.domain_gpus(h) for h in self.budget}
        self.n_layers = self.model.num_layers
        self.best: tuple[float, Plan] | None = None
        self.plans = self.fitting = 0
        self.per_config: dict = {}
        self._stages: dict = {}  # priced stages, shared by the splits and sequences that repeat them

    # ---- the degrees ----
    def expert_menus(self, tp: int) -> list[tuple[int, int]]:
        m = self.model
        if not m.is_moe:
            return [(1, tp)]
        eps = self.menus.ep or tuple(e for e in range(1, m.num_experts + 1) if m.num_experts % e == 0)
        return [(ep, etp) for ep in eps for etp in (self.menus.etp or self.menus.tp)]

    def run(self) -> OracleResult | None:
        gbs = self.training.global_batch_size
        for tp in self.menus.tp:
            hosts = [h for h in self.budget if tp <= self.gpn[h]]
            if not hosts:
                continue
            for cp in self.menus.cp:
                for ep, etp in self.expert_menus(tp):
                    max_dp = max(self.budget[h] // (tp * cp) for h in hosts)
                    if self.menus.runtime == "megatron":
                        for mbs, dp, vpp, rc in itertools.product(self.menus.mbs, range(1, max_dp + 1),
                                                                  self.menus.vpp, self.menus.recompute):
                            if gbs % (mbs * dp):
                                continue  # the number of micro-batches must be whole
                            self.megatron(tp, cp, ep, etp, mbs, dp, vpp, rc, hosts)
                    else:
                        for b in range(1, max_dp * max(self.menus.mbs) + 1):
                            if gbs % b == 0:
                                self.flagscale(tp, cp, ep, etp, b, hosts)
        if self.best is None:
            return None
        best_s, plan = self.best
        # the winner once more, whole: the evaluator and the rules agree with how it was priced
        assert not check_plan(self.model, plan, self.training)
        assert math.isclose(self.cost.evaluate(plan).iteration_time_s, best_s, rel_tol=1e-12)
        return OracleResult(best_s, plan, self.plans, self.fitting, self.per_config)

    def sequences(self, choices: list[tuple[str, int]], pp: int, gpus_per_dp: int, contiguous: bool):
        """Every sequence of pp stage choices (device type, DP) whose GPUs per type stay within the
        cluster (and, when asked, whose device types form contiguous blocks)."""
        seq: list[tuple[str, int]] = []
        used = {h: 0 for h in self.budget}

        def extend():
            if len(seq) == pp:
                yield tuple(seq)
                return
            for h, dp in choices:
                if used[h] + gpus_per_dp * dp > self.budget[h]:
                    continue
                if contiguous and seq and seq[-1][0] != h and any(x[0] == h for x in seq):
                    continue
                used[h] += gpus_per_dp * dp
                seq.append((h, dp))
                yield from extend()
                seq.pop()
                used[h] -= gpus_per_dp * dp

        yield from extend()

    # ---- megatron: one DP and recompute, a device type per stage ----
    def megatron(self, tp, cp, ep, etp, mbs, dp, vpp, rc, hosts) -> None:
        for pp in range(1, self.n_layers // vpp + 1):
            probe = None
            found = False
            for seq in self.sequences([(h, dp) for h in hosts], pp, tp * cp, self.menus.contiguous):
                found = True
                stages = [(h, d, rc) for h, d in seq]
                if probe is None:  # the megatron rules do not read the device types
                    probe = self._rules_ok(tp, cp, ep, etp, mbs, vpp, stages)
                if not probe:
                    break
                self.splits(tp, cp, ep, etp, mbs, vpp, stages, key=(tp, cp, ep, etp, mbs, dp, pp, vpp, rc.label))
            if not found:
                break

    # ---- flagscale: per-stage DP and recompute ----
    def flagscale(self, tp, cp, ep, etp, b, hosts) -> None:
        choices = [(h, dp) for h in hosts for dp in range(1, self.budget[h] // (tp * cp) + 1)
                   if b % dp == 0 and b // dp in self.menus.mbs]  # a rank's micro-batch from the menu
        modes = [self.menus.recompute] + [(r,) for r in self.menus.selective]
        for pp in range(1, self.n_layers + 1):
            found = False
            for seq in self.sequences(choices, pp, tp * cp, contiguous=True):
                found = True
                for mode in modes:
                    for rcs in itertools.product(mode, repeat=pp):
                        stages = [(h, dp, rc) for (h, dp), rc in zip(seq, rcs)]
                        if not self._rules_ok(tp, cp, ep, etp, b // seq[0][1], 1, stages):
                            continue
                        self.splits(tp, cp, ep, etp, b // seq[0][1], 1, stages, key=(tp, cp, ep, etp, b, pp))
            if not found:
                break

    # ---- rules and prices ----
    def _plan(self, tp, cp, ep, etp, mbs, vpp, stages, layers) -> Plan:
        return Plan(runtime=self.menus.runtime, tp=tp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs,
                    gbs=self.training.global_batch_size, sequence_parallel=tp > 1,
                    stages=tuple(StagePlan(device_type=h, num_layers=n, dp=dp, recompute=rc)
                                 for (h, dp, rc), n in zip(stages, layers)))

    def _rules_ok(self, tp, cp, ep, etp, mbs, vpp, stages) -> bool:
        """check_plan on the stages with the most even layer split (every rule but the layout's
        depends on the stages alone; the splits keep the layout rules themselves)."""
        pp = len(stages)
        if sum(stage_min_layers(i, pp, vpp) for i in range(pp)) > self.n_layers:
            return False
        base, extra = divmod(self.n_layers, pp)
        layers = [base + (1 if i < extra else 0) for i in range(pp)]
        return not check_plan(self.model, self._plan(tp, cp, ep, etp, mbs, vpp, stages, layers), self.training)

    def splits(self, tp, cp, ep, etp, mbs, vpp, stages, key) -> None:
        """Every layer split of these stages (at least stage_min_layers each, the space's own bound),
        priced; the best kept."""
        pp = len(stages)
        template = self._plan(tp, cp, ep, etp, mbs, vpp, stages, [1] * pp)
        g = GlobalShape.of(template)
        offsets = type_offsets([(h, tp * cp * dp) for h, dp, _ in stages])
        for layers in _compositions(self.n_layers, pp, vpp):
            self.plans += 1
            costs = []
            start = 0
            fits = True
            for i, ((h, dp, rc), n) in enumerate(zip(stages, layers)):
                prev = stages[i - 1] if i else None
                nxt = stages[i + 1] if i + 1 < pp else None
                key_i = (g, i, h, dp, rc.label, start, n, prev[:2] if prev else None, nxt[:2] if nxt else None,
                         offsets[i])
                sc = self._stages.get(key_i)
                if sc is None:
                    sc = self._stages[key_i] = self.cost.stage(
                        g, index=i, device_type=h, start=start, end=start + n, dp=dp, recompute=rc,
                        prev_type=prev[0] if prev else None, next_type=nxt[0] if nxt else None,
                        prev_dp=prev[1] if prev else None, next_dp=nxt[1] if nxt else None,
                        offset_gpus=offsets[i])
                if not sc.fits:
                    fits = False
                    break
                costs.append(sc)
                start += n
            if not fits:
                continue
            self.fitting += 1
            # combine() reads the plan's degrees and stage DPs, not its layer counts: the template
            # prices every split of these stages
            t = self.cost.combine(template, costs).iteration_time_s
            if t < self.per_config.get(key, math.inf):
                self.per_config[key] = t
            if self.best is None or t < self.best[0]:
                self.best = (t, self._plan(tp, cp, ep, etp, mbs, vpp, stages, layers))


def brute_force(cost: CostModel, menus: Menus) -> OracleResult | None:
    """The best plan of the space the menus describe (None: nothing fits)."""
    return Oracle(cost, menus).run()
