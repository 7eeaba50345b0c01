"""MoE token routing and dispatch: how unevenly tokens land on expert-parallel ranks, and what moving
them costs, per Megatron token dispatcher.

Per MoE layer, per micro-batch, on the busiest GPU of an expert-parallel group, forward (the backward
moves the same bytes the other way):

* **Router**: the gating GEMM (tokens x hidden x experts) and softmax/top-k over the experts (FP32).
* **Permute / unpermute**: gathering k copies of each token into expert order and the weighted sum back
  (memory-bound).  The `alltoall` dispatcher also re-sorts the received chunks by local expert and back
  (`sort_chunks_by_idxs`) when a rank holds more than one expert.
* **Dispatch + combine on the wire**, by `--moe-token-dispatcher-type`:
  - `alltoall` (MoEAlltoAllTokenDispatcher): permutes first, so a token goes once per selected expert
    (k copies), to every EP rank, over NVLink inside a node and the NIC across nodes (`communication.collective_s`).
    Before it, in the forward only, the split sizes: every rank's tokens per expert all-gathered over the TPxEP
    group (E int64 per rank, latency-bound; across nodes where EP spans them) and copied to the host.
  - `flex` (DeepEP / HybridEP): a token goes once per destination *rank* inside a node (NVLink), and once
    per destination *node* across nodes (RDMA), where it is forwarded over NVLink to the ranks that need it
    (DeepEP `get_dispatch_layout`: `is_token_in_rank`; internode kernels send over RDMA to the same-index
    GPU of each target node).  RDMA and NVLink run concurrently: the time is the slower of the two.  Each
    leg runs at the bandwidth its backend reaches on that link kind in published dispatch and combine
    benchmarks (profiles/published/dispatch.csv, `dispatch_table`), as a fraction of the benchmarked link's
    rated bandwidth, applied to this cluster's link: DeepEP's and HybridEP's own figures where published
    for the device, else another GPU-initiated EP kernel's on the same link kind, else the link's
    all-to-all curve.
  - `allgather` (MoEAllGatherTokenDispatcher): all-gather of every token over the TPxEP group, then a
    reduce-scatter back; each rank keeps the tokens of its experts.
* **ETP**: with expert tensor parallelism the received tokens are all-gathered over the ETP group before
  the expert FFN and reduce-scattered after it.

Imbalance (`Routing`): the busiest EP rank computes and receives `imbalance` x the mean.  Forced balancing
(`--moe-router-force-load-balancing`) gives 1; a capacity factor c with `--moe-pad-expert-input-to-capacity`
gives exactly c (every expert computes its full capacity); `--moe-imbalance` (or a measured max/mean from
`calibrate --router-stats`) gives its value.  Otherwise the router really routes, and the imbalance follows from
its settings (`Routing.imbalance`): tokens per expert spread log-normally around the mean (per-rank token counts
of DeepSeek-V3's routing fit a log-normal best: DeepEP PR #393), with a spread (standard deviation over mean) of
EXPERT_LOAD_CV at the reference auxiliary-loss coefficient (a published load-balancing loss), scaled
by the balancing pull of the run's coefficient (or expert bias), plus the sampling noise of the tokens per expert in
one micro-batch (Poisson: 1/sqrt(tokens)); a capacity factor clips every expert at c x the mean (the excess is
dropped); an EP rank holds E/EP experts, and the busiest of EP ranks lies the expected maximum of EP standard normals
above the mean of their sums.  So the imbalance grows with EP size, falls with more experts per rank and longer
sequences, and stops at the capacity factor.  The busiest rank receives `imbalance` x the mean tokens (dispatch and
combine) and computes them at the rate of a balanced rank's grouped GEMM (planner/cost/layer.py `_expert_gemm_s`).
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass
from functools import lru_cache

from planner.cost.communication import GroupLinks, LinkChoice, collective_s, link_bandwidth_share
from planner.cost.curves import interpolate_efficiency
from planner.cost.kernels import Kernels
from planner.profile_tables import PROFILES_DIR
from planner.schemas.device import LinkProfile
from planner.schemas.model import ModelSpec
from planner.units import GB_BYTES, US_S

EXPERT_LOAD_CV = math.sqrt(1.87 - 1.0)
"""Spread of tokens per expert (standard deviation over mean) under real routing with an auxiliary loss of
coefficient `AUX_LOSS_REFERENCE`: 0.93, from a measured load-balancing loss.  Qwen3-30B-A3B (128 experts, top-8,
router_aux_loss_coef 1e-3) trained with real routing on 8 B200 logs a load-balancing loss of 1.87, where "enforced
balancing usually sits around 1.0 to 1.2" (mlc-ai/pith-train issue #79; shared/reference/components-t4.md 3c).
The loss is E x sum_i f_i P_i (f_i an expert's share of the routed tokens, P_i its mean router probability); with P
tracking f it is E x sum_i f_i^2 = 1 + cv^2, so cv = sqrt(0.87).  Not fitted to end-to-end runs.

Checked against the published step-time A/B of real routing (tests/test_cost_mechanisms.py): the Megatron MoE Model
Zoo's Qwen3-235B on 256 H100 (TP4 EP8 PP8 VPP4, DeepEP, 16 experts per rank), dropless over forced balance, measured
1.24 / 1.21 / 1.15 / 1.09x at 16k / 32k / 64k / 128k tokens per sequence, is priced 1.15 / 1.11 / 1.08 / 1.05x: the
fall with the sequence (the experts' share of the step shrinks) is reproduced, about half the penalty is.  A spread
of 1.7 prices that sweep within 3%, but then the real-routing calibration rows of other plans (Qwen3-235B TP2 EP8
all-to-all at 4k, DeepSeek-V2-Lite on 910B, Mixtral) come out 7-18% slower than measured and the leave-one-source-out
median error rises from 9.3% to 10.6%: the loss reading is kept, and P being smoother than f makes it a lower
bound."""
AUX_LOSS_REFERENCE = 1e-3
AUX_LOSS_MAX_PULL = 3.0
"""Cap on AUX_LOSS_REFERENCE / coefficient: routing with little or no balancing pull ('none', or an auxiliary loss of
coefficient 0, Megatron's default).  An extrapolation, not a measurement: no published figure gives the expert loads of
a router trained without balancing (shared/reference/components-t4.md 3c has GLM-5's, 'no aux loss', only as the
straggler a rebalancer removes), so such a run's routing is priced with it, said so where its imbalance is printed
(NO_BALANCING_SOURCE), and its expert mechanisms read as unmeasured (planner/cost/mechanisms.py ROUTING_WORDS)."""
NO_BALANCING_SOURCE = (f"no published figure measures routing trained without a balancing loss, so this is "
                       f"extrapolated: the cap of {AUX_LOSS_MAX_PULL:g}x the reference's spread is unmeasured, and such "
                       "a router can collapse onto a few experts (GShard and Switch Transformer add their balancing "
                       "loss against it), far beyond the cap; state --moe-aux-loss-coeff (Megatron's MoE examples use "
                       "1e-2) or measure the routing (calibrate --router-stats)")
SINKHORN_SOURCE = ("Sinkhorn routing (--moe-router-load-balancing-type sinkhorn) is assumed to balance the experts' loads "
                   "fully (no spread beyond the sampling noise of the tokens per expert): no calibration run or published "
                   "figure measures a Sinkhorn-balanced router, so this is an assumption, extrapolated and unmeasured")
"""Where a Sinkhorn router's imbalance comes from, printed with it: `balancing_pull` gives Sinkhorn 0 because its
normalisation makes the routing probabilities doubly stochastic over a batch, not because a run measured it (its top-k
of the normalised scores need not be even), so its expert mechanisms read as unmeasured (planner/cost/mechanisms.py
UNMEASURED_BALANCING_WORDS)."""
EXPERT_BIAS_PULL = 0.1
"""Auxiliary-loss-free balancing (`--moe-router-enable-expert-bias`, DeepSeek-V3) adjusts a per-expert bias
every step toward balance; assumed to keep loads as close to the mean as an auxiliary loss ten times the
reference coefficient (assumption: no published rank-level imbalance figure)."""
ROUTER_PASSES = 4
"""FP32 router passes over tokens x experts: logits write, softmax read + write, top-k read."""


def p_group_hit(num_experts: int, groups: int, topk: int) -> float:
    """Probability that a token's top-k experts (uniform, distinct) include one of a given group's
    `num_experts / groups` experts: 1 - C(E - E/g, k) / C(E, k)."""
    if groups <= 1 or num_experts <= 0:
        return 1.0
    k = min(topk, num_experts)
    per = num_experts / groups
    miss = 1.0
    for i in range(k):
        miss *= max(num_experts - per - i, 0.0) / (num_experts - i)
    return 1.0 - miss


def p_node_hit(model: ModelSpec, nodes: int) -> float:
    """Probability that a token's experts include one on a given node, experts split evenly over `nodes`.
    With group-limited routing (`--moe-router-num-groups G --moe-router-group-topk g`, DeepSeek-V3's
    node-limited routing) a token picks its k experts among the experts of g of the G groups; when groups
    are no finer than nodes, a node is used only if one of its groups is picked."""
    e, k = model.num_experts or 1, model.moe_router_topk
    groups, picked = model.moe_router_num_groups, model.moe_router_group_topk
    if not groups or not picked or groups % nodes or picked >= groups:
        return p_group_hit(e, nodes, k)
    per_node = groups // nodes  # groups on one node
    # P(at least one of the node's groups is among the g picked of G), then a uniform top-k inside them
    p_node_picked = 1.0 - _comb_ratio(groups - per_node, groups, picked)
    picked_experts = picked * e // groups
    node_experts = min(per_node, picked) * e // groups
    p_expert_on_node = 1.0 - _comb_ratio(picked_experts - node_experts, picked_experts, k)
    return p_node_picked * p_expert_on_node


def _comb_ratio(a: float, b: float, k: int) -> float:
    """C(a, k) / C(b, k) for a <= b."""
    out = 1.0
    for i in range(k):
        out *= max(a - i, 0.0) / (b - i)
    return out


def expected_destination_ranks(num_experts: int, ep: int, topk: int) -> float:
    """Expected number of distinct EP ranks (experts split evenly over `ep`) one token's top-k experts
    live on: ep x p_group_hit."""
    if ep <= 1 or num_experts <= 0:
        return 1.0
    return ep * p_group_hit(num_experts, ep, topk)


@lru_cache(maxsize=None)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for n = 1; 1.42 for 8, 2.07 for 32), by quadrature of
    x n phi(x) Phi(x)^(n-1) over [-10, 10]."""
    if n <= 1:
        return 0.0
    steps, lo, hi = 4000, -10.0, 10.0
    dx = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * dx
        phi = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        w = 0.5 if i in (0, steps) else 1.0
        total += w * x * n * phi * _normal_cdf(x) ** (n - 1)
    return total * dx


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def clipped_lognormal(cv: float, cap: float | None) -> tuple[float, float]:
    """(mean, variance) of min(X, cap) for X log-normal with mean 1 and standard deviation `cv` (no cap: 1, cv^2)."""
    if cap is None or cv <= 0:
        return (min(1.0, cap) if cap is not None else 1.0), (cv * cv if cap is None else 0.0)
    s2 = math.log1p(cv * cv)
    s, mu, lc = math.sqrt(s2), -s2 / 2, math.log(cap)
    above = 1.0 - _normal_cdf((lc - mu) / s)
    mean = _normal_cdf((lc - mu - s2) / s) + cap * above
    second = math.exp(2 * mu + 2 * s2) * _normal_cdf((lc - mu - 2 * s2) / s) + cap * cap * above
    return mean, max(0.0, second - mean * mean)


@dataclass(frozen=True)
class Routing:
    """How unevenly a model's routing loads its EP ranks: `imbalance(ep, tokens)` is the busiest rank's tokens
    over the mean."""

    regime: str  # forced | capacity-padded | capacity | dropless | given | dense
    value: float = 1.0  # given, capacity-padded: the imbalance itself
    load_cv: float = 0.0  # real routing: spread of tokens per expert (standard deviation over mean)
    cap: float | None = None  # a capacity factor that drops what exceeds it
    num_experts: int = 1
    topk: int = 1
    assumed: str | None = None  # what was assumed, for the output
    source: str = ""  # where load_cv came from, for the output
    unmeasured_balancing: str | None = None  # the router's balancing no calibration run trained with: 'none' (nothing
    # balances it: ModelSpec.unbalanced_routing) or 'sinkhorn'; its spread is extrapolated

    @property
    def unbalanced(self) -> bool:
        """Real routing with no balancing pull (ModelSpec.unbalanced_routing): extrapolated."""
        return self.unmeasured_balancing == "none"

    @property
    def fill(self) -> float:
        """Tokens every expert's GEMM computes, over the balanced mean: the capacity factor when experts are padded
        to capacity (each expert runs exactly c x the mean), else 1 (real routing spreads the busiest rank's tokens
        unevenly over its experts: its grouped GEMM is priced as `imbalance` times a balanced one's)."""
        return self.value if self.regime == "capacity-padded" else 1.0

    def imbalance(self, ep: int, tokens_per_rank: float | None = None) -> float:
        """The busiest of `ep` EP ranks' expert tokens over the balanced mean, each rank routing `tokens_per_rank`
        tokens per micro-batch (None: no sampling noise).  With one EP rank every expert lives on every GPU: only
        what a capacity factor drops changes the work."""
        if self.regime in ("given", "capacity-padded"):
            return self.value
        if self.regime in ("forced", "dense"):
            return 1.0
        e, k = max(self.num_experts, 1), max(self.topk, 1)
        per_expert = tokens_per_rank * max(ep, 1) * k / e if tokens_per_rank else math.inf
        cv = math.sqrt(self.load_cv ** 2 + (1.0 / per_expert if per_expert > 0 else 0.0))
        mean, var = clipped_lognormal(cv, self.cap)
        local = max(1, e // max(ep, 1))
        value = mean + expected_max_normal(max(ep, 1)) * math.sqrt(var / local)
        bound = max(ep, 1) * min(k, local) / k  # every token's experts on one rank
        return min(value, bound, self.cap if self.cap is not None else math.inf)


def routing(model: ModelSpec, given: float | None, measured: float | None = None) -> Routing:
    """The routing regime of a model's flags.  `given`: --moe-imbalance (the busiest rank over the mean, used as
    it is); `measured`: max/mean tokens per expert from `calibrate --router-stats` of this model (its spread is
    read back from it: the expected maximum of E log-normal experts).

    Real routing with an auxiliary loss: the spread of expert loads is EXPERT_LOAD_CV at the reference
    coefficient (1e-3) times AUX_LOSS_REFERENCE / coefficient (the auxiliary loss pulls expert loads back toward
    the mean with a force proportional to its coefficient, against a drift the language-model loss sets, so the
    equilibrium deviation goes as 1 / coefficient), capped for weak or absent balancing.  Sinkhorn routing
    balances by construction."""
    if given is not None:
        return Routing("given", value=given)
    if not model.is_moe:
        return Routing("dense")
    if model.moe_router_force_load_balancing:
        return Routing("forced")
    cf = model.moe_expert_capacity_factor
    if cf is not None and model.moe_pad_expert_input_to_capacity:
        return Routing("capacity-padded", value=cf)
    e, k = model.num_experts or 1, model.moe_router_topk
    regime = "capacity" if cf is not None else "dropless"
    if measured is not None:
        return Routing(regime, load_cv=_cv_of_max(measured, e), cap=cf, num_experts=e, topk=k,
                       source=f"measured router statistics: max/mean tokens per expert {measured:g}")
    pull = balancing_pull(model)
    source = (f"tokens per expert spread {EXPERT_LOAD_CV:.2f} x the mean at --moe-aux-loss-coeff "
              f"{AUX_LOSS_REFERENCE:g} (a published load-balancing loss of 1.87: pith-train #79), "
              f"x{pull:.3g} for this router's balancing")
    unmeasured = _unmeasured_balancing(model)
    if unmeasured is not None:
        source += f"; {NO_BALANCING_SOURCE if unmeasured == 'none' else SINKHORN_SOURCE}"
    return Routing(regime, load_cv=EXPERT_LOAD_CV * pull, cap=cf, num_experts=e, topk=k,
                   assumed=_balancing_assumed(model), source=source, unmeasured_balancing=unmeasured)


def _unmeasured_balancing(model: ModelSpec) -> str | None:
    """The router's balancing where no calibration run trained with it: 'none' (nothing pulls it toward balance) or
    'sinkhorn' (priced as fully balanced, SINKHORN_SOURCE); None for a balancing the calibration measured."""
    if model.unbalanced_routing:
        return "none"
    if model.moe_router_load_balancing_type == "sinkhorn" and not model.moe_router_force_load_balancing:
        return "sinkhorn"
    return None


def balancing_pull(model: ModelSpec) -> float:
    """How far the router's balancing lets expert loads spread, over the reference auxiliary loss's: 0 for Sinkhorn,
    AUX_LOSS_REFERENCE / coefficient for an auxiliary loss (the coefficient the run trains with), AUX_LOSS_MAX_PULL at
    most (no balancing: 'none' or coefficient 0), EXPERT_BIAS_PULL at most with expert bias."""
    lb = model.moe_router_load_balancing_type
    coeff = model.trained_aux_loss_coeff
    if lb == "sinkhorn":
        pull = 0.0
    elif lb == "none" or coeff <= 0:
        pull = AUX_LOSS_MAX_PULL
    else:
        pull = min(AUX_LOSS_MAX_PULL, AUX_LOSS_REFERENCE / coeff)
    return min(pull, EXPERT_BIAS_PULL) if model.moe_router_enable_expert_bias else pull


def _balancing_assumed(model: ModelSpec) -> str | None:
    """What the routing's price assumes about the router's balancing, for the output: a coefficient a preset, HF
    config or model YAML left unstated, or a router trained with no balancing at all (its spread extrapolated: the
    routing's `source` says so)."""
    lb = model.moe_router_load_balancing_type
    if model.aux_loss_coeff_assumed:
        return (f"--moe-aux-loss-coeff {model.trained_aux_loss_coeff:g} assumed for {lb} routing imbalance (the model "
                "states none; Megatron-LM's MoE examples use it; the launcher writes it)")
    if not model.unbalanced_routing:
        return None
    how = ("--moe-router-load-balancing-type none" if lb == "none"
           else f"{lb} with --moe-aux-loss-coeff 0 (Megatron's default where the flags leave it out)")
    return f"{how}: the run trains with no load-balancing loss, as the launcher keeps it"


def _cv_of_max(max_over_mean: float, experts: int) -> float:
    """The log-normal spread whose expected maximum over `experts` experts is `max_over_mean`:
    ln m = -s^2/2 + s z(E) solved for s (the smaller root), cv = sqrt(exp(s^2) - 1)."""
    z, ln_m = expected_max_normal(experts), math.log(max(max_over_mean, 1.0))
    s = z - math.sqrt(max(z * z - 2 * ln_m, 0.0))
    return math.sqrt(math.expm1(s * s))


@dataclass(frozen=True)
class DispatchCost:
    """One MoE layer's routing and token movement, forward, one micro-batch, the busiest GPU."""

    router_s: float
    permute_s: float
    comm_s: float  # dispatch + combine
    etp_s: float  # ETP all-gather + reduce-scatter
    copies_per_token: float  # token copies this GPU's experts compute, per local token
    tokens_per_expert: float  # rows of one expert's GEMM: the balanced mean, times the fill (padding to capacity)
    load: float  # the busiest rank's expert work over `local experts x tokens_per_expert` (imbalance / fill)
    counts_s: float = 0.0  # forward only: the all-gather of tokens per expert the alltoall dispatcher's splits need

    @property
    def total_s(self) -> float:
        """The forward's seconds."""
        return self.router_s + self.permute_s + self.comm_s + self.etp_s + self.counts_s


DISPATCH_CSV = PROFILES_DIR / "published" / "dispatch.csv"
GPU_INITIATED_BACKENDS = ("deepep", "hybridep", "uccl-ep")
"""EP kernels that drive the links from the GPU (DeepEP and its kin): where the run's own backend has no published
figure on a link, another of these stands for what such kernels reach on it."""
LINK_CLASSES = {"nvlink": "nvlink", "xgmi": "xgmi", "hccs": "hccs", "infiniband": "rdma", "roce": "rdma",
                "ethernet": "rdma", "slingshot": "rdma", "efa": "efa"}
"""LinkProfile.kind -> the link column of dispatch.csv: a verbs NIC (InfiniBand, RoCE, ...) is `rdma`; AWS's EFA, whose
GPU-initiated EP kernels run over libfabric (DeepEP through NVSHMEM's host proxy, UCCL-EP through its own) and
measure apart from them (AWS's ep-backend-comparison tables), is `efa`."""


@dataclass(frozen=True)
class DispatchBandwidth:
    """What a backend's dispatch (or combine) reaches on one link kind: a fraction of the link's rated per-GPU
    bandwidth, at the per-rank buffer the benchmark moved, from the rows of dispatch.csv named in `rows`."""

    efficiency: float
    payload_bytes: float
    rows: tuple[str, ...]


@lru_cache(maxsize=1)
def _dispatch_rows() -> tuple[dict[str, str], ...]:
    with DISPATCH_CSV.open(newline="", encoding="utf-8") as fh:
        return tuple(csv.DictReader(fh))


@lru_cache(maxsize=None)
def dispatch_table(device: str, backend: str, link_kind: str, ranks: int, direction: str) -> DispatchBandwidth | None:
    """The published dispatch (or combine) bandwidth of `backend` on `link_kind` for `device` at `ranks` EP ranks:
    its own rows (else another GPU-initiated backend's) that apply to the device, at the benchmarked EP size
    nearest `ranks` (in log2), BF16 rows where there are any (Megatron dispatches BF16 tokens); the median of their
    bandwidth over the benchmarked link's rated bandwidth, at most 1 (a figure above the link's rate counts bytes the
    benchmark's own accounting adds, such as tokens kept on the node: the leg priced here is the link's).  None
    where nothing was published."""
    link = LINK_CLASSES.get(link_kind)
    rows = [r for r in _dispatch_rows() if r["link"] == link and r["direction"] == direction
            and device in r["applies_to"].split()]
    own = [r for r in rows if r["backend"] == backend]
    rows = own or [r for r in rows if r["backend"] in GPU_INITIATED_BACKENDS]
    if not rows:
        return None
    nearest = min(abs(math.log2(int(r["ranks"]) / max(ranks, 1))) for r in rows)
    rows = [r for r in rows if abs(math.log2(int(r["ranks"]) / max(ranks, 1))) == nearest]
    rows = [r for r in rows if r["dtype"] == "bf16"] or rows
    effs = [float(r["bandwidth_gb_per_s"]) / float(r["link_gb_per_s"]) for r in rows]
    payload = statistics.median(int(r["tokens"]) * int(r["hidden"]) * 2 for r in rows)
    return DispatchBandwidth(efficiency=min(1.0, statistics.median(effs)), payload_bytes=payload,
                             rows=tuple(r["id"] for r in rows))


def _stream_s(link: LinkProfile, nbytes: float, table: DispatchBandwidth | None = None) -> float:
    """Streaming `nbytes` out of one GPU over `link` (one latency): at the published dispatch bandwidth `table`
    (scaled down for smaller buffers as the link's all-to-all curve falls from the benchmarked buffer), else at
    the link's all-to-all efficiency."""
    if nbytes <= 0:
        return 0.0
    curve = link.efficiency["all_to_all"]
    eff = interpolate_efficiency(curve, nbytes)
    if table is not None:
        eff = table.efficiency * min(1.0, eff / interpolate_efficiency(curve, table.payload_bytes))
    share = link_bandwidth_share(link, "all_to_all", 8) if table is None else 1.0
    return link.latency_us * US_S + nbytes / (link.bandwidth_gb_per_s * GB_BYTES * share * eff)


def _flex_comm_s(model: ModelSpec, links: LinkChoice, local_tokens: float, ep: int, act_bytes: int,
                 device: str) -> float:
    """One DeepEP/HybridEP dispatch and combine of this GPU's tokens: per direction, the slower of the NVLink leg
    (a copy per other rank hit) and the RDMA leg (a copy per remote node hit), each at its own published
    bandwidth (`dispatch_table`)."""
    e, k, h = model.num_experts or 1, model.moe_router_topk, model.hidden_size
    backend = model.moe_flex_dispatcher_backend
    token_bytes = h * act_bytes
    ranks_hit = expected_destination_ranks(e, ep, k) - p_group_hit(e, ep, k)  # other ranks, inside or out
    nvl_bytes = local_tokens * token_bytes * ranks_hit
    nodes = max(1, round(ep / max(links.ranks_per_node, 1))) if links.inter is not None else 1
    rdma_bytes = local_tokens * token_bytes * (nodes - 1) * p_node_hit(model, nodes) if nodes > 1 else 0.0
    total = 0.0
    for direction in ("dispatch", "combine"):
        nvl_s = _stream_s(links.intra, nvl_bytes,
                          dispatch_table(device, backend, links.intra.kind, min(ep, links.ranks_per_node), direction))
        rdma_s = _stream_s(links.inter, rdma_bytes, dispatch_table(device, backend, links.inter.kind, ep, direction)
                           ) if rdma_bytes else 0.0
        total += max(nvl_s, rdma_s)
    return total


EFA_FLEX_RATIO = (1.06, 1.61)
"""The range of measured over predicted iteration time of AWS's DeepSeek-V3 training on 256 p6-b300 with UCCL-EP's
DeepEP drop-in across EFA nodes (micro-batch 1; micro-batch 4; micro-batch 4 with EP overlap and VPP 2): what
EFA_FLEX_NOTE quotes (a test re-prices the three cells and checks the quote)."""
EFA_FLEX_NOTE = (
    "{backend} dispatch with EP across nodes over EFA is priced from dispatch microbenchmarks on EFA (DeepEP's reaches "
    "78-92% of the NIC on p5 H100: profiles/published/dispatch.csv), but training runs slower than that: over EFA, "
    "NVSHMEM (DeepEP's transport) goes through a host proxy thread rather than GPU-initiated RDMA. AWS measured "
    "Megatron-Bridge training of Qwen3-30B-A3B on 64 p5 H100 with DeepEP at 1.03-1.07x NCCL all-to-all's iteration "
    "time at EP16 (2 nodes) and 1.28-1.86x at EP32 (4 nodes), with UCCL-EP at 1.3-2.9x (awslabs/awsome-distributed-ai "
    "@95b939cd 3.test_cases/megatron/megatron-bridge/qwen3-30b/benchmarks/RESULTS.md), and DeepSeek-V3 on 256 p6-b300 "
    "(EP32 across 4 nodes) with UCCL-EP's DeepEP drop-in at 1.13x NCCL's time at micro-batch 1 and 0.64x at "
    "micro-batch 4, with EP overlap or without: {lo:.2f}-{hi:.2f}x this planner's estimate (.../dsv3/benchmarks/"
    "RESULTS.md). Which dispatcher wins over EFA depends on the GPU and the micro-batch: measure a short trial of "
    "both (solve --out writes one)")
"""What the estimate of a flex (DeepEP/HybridEP) dispatch across EFA nodes does not price (`fabric_notes`)."""
EFA_ALLTOALL_RATIO = {4: (1.21, 2.12), 1: (0.94, 1.14)}
"""Per micro-batch size, the range of measured over predicted iteration time of AWS's training rows with NCCL's
all-to-all across EFA nodes (held-out rows of planner/calibration/published/unfitted_runs.csv, `python -m
planner.calibration.report`): what EFA_ALLTOALL_NOTE quotes (a test re-prices the rows and checks the quote)."""
EFA_ALLTOALL_NOTE = (
    "alltoall dispatch with EP across nodes over EFA is priced at the device's inter-node all-to-all curve (AWS's "
    "NCCL all-to-all microbenchmarks on EFA: busbw 40-45 GB/s per GPU at 32-64 ranks on p5 H100, at or above that "
    "price; 74-105 GB/s at 16-64 ranks on p6-b300, from 10% below it to 53% above: awslabs/awsome-distributed-ai "
    "@95b939cd micro-benchmarks/expert-parallelism/ep-backend-comparison/RESULTS*.md), but AWS's Megatron-Bridge "
    "training with it ran slower: Qwen3-30B-A3B on 64 p5 H100, Qwen3-235B-A22B on 32-64 p6-b300, DeepSeek-V3 and "
    "Kimi-K2 on 128-256 p6-b300 (EP16-EP32 across 2-4 nodes) measured {lo:.2f}-{hi:.2f}x this planner's estimate "
    "at micro-batch 4 and {lo1:.2f}-{hi1:.2f}x at micro-batch 1, where the host bounds the step; the all-to-all at "
    "about half its microbenchmark rate would account for most of it (no profile published), and on p6-b300 "
    "UCCL-EP's DeepEP drop-in ran DeepSeek-V3 36% faster than it at micro-batch 4 (with EP overlap or without). Keep "
    "EP inside a node where it fits, or measure a short trial (solve --out writes one) before trusting this "
    "estimate")
"""What the estimate of NCCL's all-to-all dispatch across EFA nodes does not price (`fabric_notes`)."""


def fabric_notes(cost, plan) -> list[str]:
    """Notes on a plan's expert dispatch over a fabric whose measured training time its price misses: dispatch
    with EP across nodes over EFA, flex (DeepEP/HybridEP) or NCCL's all-to-all (`cost` a CostModel)."""
    model = cost.model
    dispatcher = model.moe_token_dispatcher_type
    if not model.is_moe or plan.ep <= 1 or dispatcher not in ("flex", "alltoall"):
        return []
    for st in plan.stages:
        links = cost.group_links(st.device_type, tp=plan.tp, cp=plan.cp, dp=st.dp, ep=plan.ep, etp=plan.etp).ep
        if links.inter is not None and links.inter.kind == "efa":
            if dispatcher == "alltoall":
                (lo, hi), (lo1, hi1) = EFA_ALLTOALL_RATIO[4], EFA_ALLTOALL_RATIO[1]
                return [EFA_ALLTOALL_NOTE.format(lo=lo, hi=hi, lo1=lo1, hi1=hi1)]
            return [EFA_FLEX_NOTE.format(backend={"deepep": "DeepEP", "hybridep": "HybridEP"}.get(
                model.moe_flex_dispatcher_backend, model.moe_flex_dispatcher_backend), lo=EFA_FLEX_RATIO[0],
                hi=EFA_FLEX_RATIO[1])]
    return []


def moe_dispatch(
    model: ModelSpec, *, kernels: Kernels, links: GroupLinks, local_tokens: float, ep: int, etp: int,
    imbalance: float, act_bytes: int, fill: float = 1.0,
) -> DispatchCost:
    """Routing and token movement of one MoE layer (see the module docstring).  `fill`: Routing.fill."""
    e = model.num_experts or 1
    k = model.moe_router_topk
    h = model.hidden_size
    dispatcher = model.moe_token_dispatcher_type
    corr = kernels.corrections[f"dispatch_{dispatcher}"]
    t_l = local_tokens
    copies = etp * k * imbalance  # token copies per local token this GPU's experts compute (after ETP gather)
    local_experts = max(1, e // ep)
    tokens_per_expert = t_l * etp * k * fill / local_experts

    router_flop = 2.0 * t_l * h * e
    router_s = kernels.gemm_s(router_flop, router_flop) + kernels.memory_s(ROUTER_PASSES * t_l * e * 4)

    token_bytes = h * act_bytes
    sent = t_l * k * token_bytes  # this GPU's token copies
    received = t_l * k * imbalance * token_bytes  # arriving at the busiest rank
    permute_bytes = 2 * sent + 2 * (sent + t_l * token_bytes)  # permute: gather k copies; unpermute: sum back
    if dispatcher == "alltoall" and local_experts > 1:
        permute_bytes += 2 * 2 * received  # sort_chunks_by_idxs after dispatch and before combine
    if dispatcher == "allgather":
        permute_bytes += 2 * t_l * ep * etp * token_bytes  # masking the gathered tokens
    permute_s = kernels.memory_s(permute_bytes)

    comm_s = counts_s = 0.0
    if dispatcher == "alltoall" and ep * etp > 1:
        # MoEAlltoAllTokenDispatcher.preprocess (megatron/core/transformer/moe/token_dispatcher.py @d98e8a64): the
        # all-to-all's split sizes need every rank's tokens per expert, all-gathered over the TPxEP group (E int64
        # per rank) before the device-to-host copy the host then waits for: a latency-bound collective on the
        # forward's critical path, across nodes where EP spans them.  The dispatcher's correction scales it with
        # the all-to-all: every second of the dispatcher's communication is expert dispatch's
        # (planner/cost/mechanisms.py).
        counts_s = corr * collective_s(links.expert_group, "all_gather", e * 8.0 * ep * etp, ep * etp)
    if ep > 1 or (dispatcher == "allgather" and etp > 1):
        if dispatcher == "alltoall":
            comm_s = 2 * imbalance * collective_s(links.ep, "all_to_all", sent, ep)
        elif dispatcher == "flex":
            comm_s = imbalance * _flex_comm_s(model, links.ep, t_l, ep, act_bytes, kernels.device.name)
        else:  # allgather over the TPxEP group, reduce-scatter back
            gathered = t_l * token_bytes * ep * etp
            comm_s = (collective_s(links.expert_group, "all_gather", gathered, ep * etp)
                      + collective_s(links.expert_group, "reduce_scatter", gathered, ep * etp))
        comm_s *= corr
    etp_s = 0.0
    if etp > 1 and dispatcher != "allgather":
        gathered = etp * t_l * k * imbalance * token_bytes
        etp_s = collective_s(links.etp, "all_gather", gathered, etp) + collective_s(
            links.etp, "reduce_scatter", gathered, etp)
    return DispatchCost(router_s=router_s, permute_s=permute_s, comm_s=comm_s, etp_s=etp_s, counts_s=counts_s,
                        copies_per_token=copies, tokens_per_expert=tokens_per_expert, load=imbalance / fill)
