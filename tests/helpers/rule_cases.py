"""Random Megatron flag sets drawn from the rule families of planner/megatron/rules.py, for the property
test against Megatron's own validator (tests/test_megatron_properties.py).

Each case is a small GPT (4 to 12 layers, hidden 256) with random degrees and a random draw from every
rule family: parallel sizes and world size, batch, pipeline split (plain, VPP flags, first/last stage,
account-for, layouts with empty, embedding-only and loss-only chunks, some malformed), MoE routing
(top-k, pre-softmax, score function, expert bias, router groups, capacity and padding, dispatchers,
DeepEP, shared experts), MLA with or without group-query attention, MTP and position embeddings,
recompute, FP8 recipes, context-parallel communication, CUDA graphs with dropout, the expert-parallel
overlap, the parameter-gather overlaps, p2p overlap.  Seeded: the same seed gives the same cases.

`planner_verdict` is what `cli.py estimate` (without --allow-invalid) decides for the flags: refused
when the reader or the rules refuse them, with the rules that fired.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

from planner.api import load_inputs
from planner.cost.estimate import plan_from_run
from planner.errors import PlannerInputError
from planner.megatron.rules import check_plan
from planner.profile_tables import ProfileSet

HIDDEN, HEADS = 256, 8


@dataclass
class Case:
    name: str
    argv: list[str]
    world: int
    families: set[str] = field(default_factory=set)


def cluster_for(world: int) -> str:
    """An H100 cluster of `world` GPUs (one GPU a node when 8 do not divide it)."""
    return f"H100:{world}" if world <= 8 or world % 8 == 0 else f"H100:{world}x1"


def _pick(rng: random.Random, weighted: dict):
    return rng.choices(list(weighted), weights=list(weighted.values()))[0]


class _Draw:
    """One case being drawn: its flags and the rule families it touches."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.argv: list[str] = []
        self.families: set[str] = set()

    def add(self, family: str, *tokens) -> None:
        self.argv += [str(t) for t in tokens]
        self.families.add(family)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


def _layout(d: _Draw, layers: int, pp: int, mtp: int) -> str:
    """A layout for `layers` decoder layers on `pp` ranks: 1-3 chunks each, sometimes with E-only/L-only or
    empty chunks, sometimes malformed (a layer short, E misplaced, MTP in a wrong chunk)."""
    rng = d.rng
    vpp = rng.choice((1, 1, 2, 3))
    stages = pp * vpp
    counts = [0] * stages
    inner = list(range(1 if rng.random() < 0.5 else 0, stages - (1 if rng.random() < 0.5 else 0))) or [0]
    for _ in range(layers):
        counts[rng.choice(inner)] += 1
    if rng.random() < 0.1:
        counts[rng.randrange(stages)] += rng.choice((-1, 1)) if counts[0] else 1
    symbols = ["t" * max(c, 0) for c in counts]
    symbols[0] = "E" + symbols[0]
    tail = "m" * mtp + "L"
    if mtp and rng.random() < 0.2:
        where = rng.randrange(stages)
        symbols[where] += "m" * mtp
        tail = "L"
    symbols[-1] += tail
    if rng.random() < 0.1:
        symbols[0], symbols[-1] = symbols[-1], symbols[0]
    if rng.random() < 0.05:
        symbols.append("")
    return "|".join(symbols)


def _pipeline(d: _Draw, layers: int, pp: int, mtp: int) -> None:
    if pp == 1 and not d.chance(0.1):
        return
    kind = _pick(d.rng, {"plain": 4, "vpp": 2, "layers_per_vs": 1, "first_last": 2, "account": 1, "layout": 3})
    if kind == "vpp":
        d.add("pipeline", "--num-virtual-stages-per-pipeline-rank", d.rng.choice((1, 2, 3)))
    elif kind == "layers_per_vs":
        d.add("pipeline", "--num-layers-per-virtual-pipeline-stage", d.rng.choice((1, 2)))
    elif kind == "first_last":
        if d.chance(0.7):
            d.add("pipeline", "--decoder-first-pipeline-num-layers", d.rng.randint(1, max(1, layers - 1)))
        if d.chance(0.5):
            d.add("pipeline", "--decoder-last-pipeline-num-layers", d.rng.randint(1, max(1, layers // 2)))
        if d.chance(0.2):
            d.add("pipeline", "--num-virtual-stages-per-pipeline-rank", 2)
    elif kind == "account":
        d.add("pipeline", "--account-for-embedding-in-pipeline-split")
        if d.chance(0.8):
            d.add("pipeline", "--account-for-loss-in-pipeline-split")
        if d.chance(0.4):
            d.add("pipeline", "--num-virtual-stages-per-pipeline-rank", d.rng.choice((2, 3)))
    elif kind == "layout":
        d.add("layout", "--pipeline-model-parallel-layout", _layout(d, layers, pp, mtp))
    if d.chance(0.05):
        d.add("pipeline", "--no-overlap-p2p-communication")


def _moe(d: _Draw, tp: int, experts: int, ep: int) -> None:
    """MoE flags."""
    rng = d.rng
    topk = rng.choice((1, 2, 2, 4))
    d.add("moe", "--num-experts", experts, "--moe-router-topk", min(topk, experts))
    d.add("moe", "--expert-model-parallel-size", ep)
    if d.chance(0.3):
        d.add("moe", "--expert-tensor-parallel-size", rng.choice((1, 2)))
    if d.chance(0.9):
        d.add("moe", "--disable-bias-linear")
    if tp > 1:
        d.add("moe", "--sequence-parallel")
    dispatcher = _pick(rng, {"allgather": 2, "alltoall": 3, "flex": 1, None: 2})
    if dispatcher:
        d.add("dispatcher", "--moe-token-dispatcher-type", dispatcher)
    if d.chance(0.05):
        d.add("dispatcher", "--moe-enable-deepep")
    if d.chance(0.5):
        d.add("moe", "--moe-grouped-gemm")
    if topk == 1 and d.chance(0.5):
        d.add("router", "--moe-router-pre-softmax")
    if d.chance(0.15):
        d.add("router", "--moe-router-score-function", rng.choice(("sigmoid", "softmax")))
    if d.chance(0.1):
        d.add("router", "--moe-router-enable-expert-bias")
    if d.chance(0.12):
        d.add("router_groups", "--moe-router-num-groups", rng.choice((2, 3, 4)))
        if d.chance(0.8):
            d.add("router_groups", "--moe-router-group-topk", rng.choice((1, 2, 3)))
    elif d.chance(0.03):
        d.add("router_groups", "--moe-router-group-topk", 1)
    if d.chance(0.12):
        d.add("capacity", "--moe-expert-capacity-factor", rng.choice((1.0, 1.5)))
    if d.chance(0.1):
        d.add("capacity", "--moe-pad-expert-input-to-capacity")
    if d.chance(0.1):
        d.add("router", "--moe-router-load-balancing-type", rng.choice(("sinkhorn", "seq_aux_loss", "none")))
    if d.chance(0.12):
        d.add("shared_experts", "--moe-shared-expert-intermediate-size", 256)
        if d.chance(0.5):
            d.add("shared_experts", "--moe-shared-expert-overlap")
    if d.chance(0.15):
        d.add("ep_overlap", "--overlap-moe-expert-parallel-comm")
        if d.chance(0.2):
            d.add("ep_overlap", "--delay-wgrad-compute")


def _attention(d: _Draw) -> int:
    """Attention and position flags; returns the MTP layers."""
    rng = d.rng
    if d.chance(0.1):
        d.add("mla", "--multi-latent-attention", "--q-lora-rank", 64, "--kv-lora-rank", 32, "--qk-head-dim", 32,
              "--qk-pos-emb-head-dim", 16, "--v-head-dim", 32)
    if d.chance(0.3):
        d.add("gqa", "--group-query-attention", "--num-query-groups", rng.choice((1, 2, 4, 8)))
    mtp = rng.choice((1, 1, 2)) if d.chance(0.12) else 0
    if mtp:
        d.add("mtp", "--mtp-num-layers", mtp)
    if mtp or d.chance(0.2):
        d.add("position", "--position-embedding-type", _pick(rng, {"rope": 4, "none": 1, "learned_absolute": 2}))
    return mtp


def _recompute(d: _Draw) -> None:
    rng = d.rng
    kind = _pick(rng, {None: 5, "selective": 3, "full": 2})
    if kind == "selective":
        modules = rng.sample(["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"],
                             rng.randint(1, 3))
        d.add("recompute", "--recompute-granularity", "selective", "--recompute-modules", *modules)
    elif kind == "full":
        d.add("recompute", "--recompute-granularity", "full", "--recompute-method", rng.choice(("uniform", "block")),
              "--recompute-num-layers", rng.choice((1, 2)))


def _precision_and_overlaps(d: _Draw, cp: int) -> None:
    rng = d.rng
    if d.chance(0.15):
        d.add("fp8", "--fp8-format", rng.choice(("hybrid", "e4m3")))
        if d.chance(0.6):
            d.add("fp8", "--fp8-recipe", rng.choice(("delayed", "tensorwise", "blockwise")))
    dist_opt = d.chance(0.5)
    if dist_opt:
        d.add("dist_opt", "--use-distributed-optimizer")
    if dist_opt and d.chance(0.5) or d.chance(0.1):
        d.add("overlap", "--overlap-grad-reduce")
        if dist_opt and d.chance(0.5) or d.chance(0.1):
            d.add("overlap", "--overlap-param-gather")
            if d.chance(0.2):
                d.add("overlap_step", "--overlap-param-gather-with-optimizer-step", "--ckpt-format",
                      rng.choice(("torch", "torch", "torch_dist")))
    if "fp8" in d.families and d.chance(0.3) or d.chance(0.02):
        d.add("fp8", "--fp8-param-gather")
    if (cp > 1 and d.chance(0.4)) or d.chance(0.04):
        types = rng.choice((["p2p"], ["a2a"], ["allgather"], ["a2a+p2p"], ["p2p", "a2a"]))
        d.add("cp", "--cp-comm-type", *types)
        if "a2a+p2p" in types and d.chance(0.8) or d.chance(0.2):
            sizes = rng.choice(([cp, 1], [1, cp], [cp, 1], [2, 2], [4, 2]))
            d.add("cp", "--hierarchical-context-parallel-sizes", *sizes)
    if d.chance(0.08):
        impl = rng.choice(("local", "transformer_engine", "full_iteration"))
        d.add("cuda_graph", "--cuda-graph-impl", impl)
        if impl == "full_iteration":
            d.add("cuda_graph", "--no-check-for-nan-in-loss-and-grad")
        if d.chance(0.5):
            d.add("cuda_graph", "--attention-dropout", 0.0)
        if d.chance(0.3):
            d.add("cuda_graph", "--hidden-dropout", 0.0)


def draw_case(rng: random.Random, index: int) -> Case:
    d = _Draw(rng)
    layers = rng.choice((4, 6, 8, 12))
    seq = rng.choice((512, 1024, 1536))
    tp = _pick(rng, {1: 4, 2: 4, 4: 2, 8: 1, 3: 0.3})
    pp = _pick(rng, {1: 4, 2: 3, 3: 1, 4: 2})
    cp = _pick(rng, {1: 6, 2: 2, 4: 1})
    dp = rng.choice((1, 2, 3, 4))
    moe = rng.random() < 0.5
    experts = rng.choice((4, 6, 8, 16))
    ep = rng.choice([e for e in (1, 2, 4, 8) if e <= experts] + [3] * (rng.random() < 0.05)) if moe else 1
    if (tp * cp * dp) % ep and rng.random() < 0.8:
        dp = ep // math.gcd(tp * cp, ep) * rng.choice((1, 2))  # mostly keep the experts foldable
    world = tp * pp * cp * dp + (1 if rng.random() < 0.04 else 0)
    mbs = rng.choice((1, 1, 2))
    gbs = mbs * dp * rng.choice((1, 2, 4, 8)) + (1 if rng.random() < 0.06 else 0)
    d.add("base", "--num-layers", layers, "--hidden-size", HIDDEN, "--num-attention-heads", HEADS, "--seq-length", seq,
          "--max-position-embeddings", seq, "--micro-batch-size", mbs, "--global-batch-size", gbs, "--vocab-size", 1024,
          "--tokenizer-type", "NullTokenizer", "--mock-data", "--bf16", "--transformer-impl", "local")
    d.add("degrees", "--tensor-model-parallel-size", tp, "--pipeline-model-parallel-size", pp)
    if cp > 1:
        d.add("degrees", "--context-parallel-size", cp)
    mtp = _attention(d)
    if moe:
        _moe(d, tp, experts, ep)
    _pipeline(d, layers, pp, mtp)
    _recompute(d)
    _precision_and_overlaps(d, cp)
    return Case(f"case{index:03d}", d.argv, world, d.families)


def draw_cases(seed: int, n: int) -> list[Case]:
    rng = random.Random(seed)
    return [draw_case(rng, i) for i in range(n)]


_PROFILES: list[ProfileSet] = []


def profiles() -> ProfileSet:
    if not _PROFILES:
        _PROFILES.append(ProfileSet.load())
    return _PROFILES[0]


def planner_verdict(case: Case) -> tuple[bool, list[str]]:
    """(accepted, reasons): what `estimate` without --allow-invalid decides for the flags, and every
    refusal the planner has for them (the reader's and the rules', as --allow-invalid lists them), each
    "rule: message"."""
    try:
        strict = load_inputs(megatron_args=list(case.argv), cluster=cluster_for(case.world), profiles=profiles())
        plan, _ = plan_from_run(strict.run, strict.cluster, strict.profiles)
        accepted = not check_plan(strict.run.model, plan, strict.run.training)
    except PlannerInputError:
        accepted = False
    notes: list[str] = []
    try:
        inputs = load_inputs(megatron_args=list(case.argv), cluster=cluster_for(case.world), profiles=profiles(),
                             allow_invalid=True, on_note=notes.append)
    except PlannerInputError as exc:
        return accepted, [f"reader: {exc}"]
    reasons = [f"{m.group(2)}: {m.group(1)}" for n in notes
               if (m := re.fullmatch(r"Megatron would refuse these flags \(.*?\): (.*) \[(\w+)\]", n, re.S))]
    try:
        plan, _ = plan_from_run(inputs.run, inputs.cluster, inputs.profiles)
    except PlannerInputError as exc:
        return accepted, reasons + [f"plan: {exc}"]
    return accepted, reasons + [f"{v.rule}: {v.message}" for v in check_plan(inputs.run.model, plan, inputs.run.training)]
