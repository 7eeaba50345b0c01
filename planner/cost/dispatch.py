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
  - `flex` (DeepEP / HybridEP): a token goes once per destination *rank* inside a node (NVLink), and once
    per destination *node* across nodes (RDMA), where it is forwarded over NVLink to the ranks that need it
    (DeepEP `get_dispatch_layout`: `is_token_in_rank`; internode kernels send over RDMA to the same-index
    GPU of each target node).  RDMA and NVLink run concurrently: the time is the slower of the two.
  - `allgather` (MoEAllGatherTokenDispatcher): all-gather of every token over the TPxEP group, then a
    reduce-scatter back; each rank keeps the tokens of its experts.
* **ETP**: with expert tensor parallelism the received tokens are all-gathered over the ETP group before
  the expert FFN and reduce-scattered after it.

Imbalance (`Routing`): the busiest EP rank computes and receives `imbalance` x the mean.  Forced balancing
gives 1; a capacity factor c with `--moe-pad-expert-input-to-capacity` gives exactly c (every expert
computes its full capacity); dropless routing (aux-loss and similar) gives the calibrated
`moe_imbalance_factor` (profiles/corrections.yaml, fitted on the dropless published runs), capped by c
when a capacity factor drops the excess.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.communication import GroupLinks, LinkChoice, collective_s, link_bandwidth_share
from planner.cost.curves import interpolate_efficiency
from planner.cost.kernels import Kernels
from planner.schemas.model import ModelSpec
from planner.units import GB_BYTES, US_S

DROPLESS_IMBALANCE_DEFAULT = 1.1
"""Busiest EP rank over the mean under dropless routing with an auxiliary loss of coefficient
`AUX_LOSS_REFERENCE`, before calibration (assumption; the shipped value is fitted on the dropless published
runs: planner/calibration/fit.py, correction kind `moe_imbalance_factor`)."""
AUX_LOSS_REFERENCE = 1e-3
AUX_LOSS_MAX_PULL = 3.0
"""Cap on AUX_LOSS_REFERENCE / coefficient: routing with little or no balancing pull ('none')."""
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


@dataclass(frozen=True)
class Routing:
    """How unevenly a model's routing loads its EP ranks: `imbalance(ep)` is the busiest rank's tokens
    over the mean."""

    regime: str  # forced | capacity-padded | capacity | dropless | given | dense
    excess: float  # busiest rank over the mean, minus 1, for ep > 1 (dropless: scaled by the balancing pull)
    cap: float | None = None  # a capacity factor that drops what exceeds it
    assumed: str | None = None  # what was assumed, for the output

    def imbalance(self, ep: int) -> float:
        """With one EP rank every expert lives on every GPU and the grouped GEMM sums their loads: no
        rank is busier than another."""
        if self.regime in ("given", "capacity-padded"):
            return 1.0 + self.excess
        value = 1.0 + (self.excess if ep > 1 else 0.0)
        return min(value, self.cap) if self.cap is not None else value


def routing(model: ModelSpec, given: float | None, calibrated: float | None) -> Routing:
    """The routing regime of a model's flags.

    Dropless routing with an auxiliary loss: the busiest rank's excess load is the calibrated excess at
    the reference coefficient (1e-3) times AUX_LOSS_REFERENCE / coefficient (the auxiliary loss pulls
    expert loads back toward the mean with a force proportional to its coefficient, against a drift the
    language-model loss sets, so the equilibrium deviation goes as 1 / coefficient), capped for weak or
    absent balancing.  Sinkhorn routing balances by construction."""
    if given is not None:
        return Routing("given", given - 1.0)
    if not model.is_moe:
        return Routing("dense", 0.0)
    if model.moe_router_force_load_balancing:
        return Routing("forced", 0.0)
    cf = model.moe_expert_capacity_factor
    if cf is not None and model.moe_pad_expert_input_to_capacity:
        return Routing("capacity-padded", cf - 1.0)
    excess_ref = (calibrated if calibrated is not None else DROPLESS_IMBALANCE_DEFAULT) - 1.0
    assumed = None
    lb = model.moe_router_load_balancing_type
    if lb == "sinkhorn":
        pull = 0.0
    elif lb == "none":
        pull = AUX_LOSS_MAX_PULL
    else:
        coeff = model.trained_aux_loss_coeff  # what the launcher writes
        if model.aux_loss_coeff_assumed:
            assumed = (f"--moe-aux-loss-coeff {coeff:g} assumed for {lb} routing imbalance (the flag is unset; "
                       "Megatron's default 0.0 would mean no balancing; the launcher writes it)")
        pull = min(AUX_LOSS_MAX_PULL, AUX_LOSS_REFERENCE / coeff) if coeff > 0 else AUX_LOSS_MAX_PULL
    if model.moe_router_enable_expert_bias:
        pull = min(pull, EXPERT_BIAS_PULL)
    excess = excess_ref * pull
    if model.num_experts and model.moe_router_topk:  # at most every token on the same k experts
        excess = min(excess, model.num_experts / model.moe_router_topk - 1.0)
    return Routing("capacity" if cf is not None else "dropless", excess, cap=cf, assumed=assumed)


@dataclass(frozen=True)
class DispatchCost:
    """One MoE layer's routing and token movement, forward, one micro-batch, the busiest GPU."""

    router_s: float
    permute_s: float
    comm_s: float  # dispatch + combine
    etp_s: float  # ETP all-gather + reduce-scatter
    copies_per_token: float  # token copies this GPU's experts compute, per local token
    tokens_per_expert: float

    @property
    def total_s(self) -> float:
        return self.router_s + self.permute_s + self.comm_s + self.etp_s


def _stream_s(link, nbytes: float) -> float:
    """Streaming `nbytes` out of one GPU over `link` at its all-to-all efficiency (one latency)."""
    if nbytes <= 0:
        return 0.0
    eff = interpolate_efficiency(link.efficiency["all_to_all"], nbytes)
    share = link_bandwidth_share(link, "all_to_all", 8)
    return link.latency_us * US_S + nbytes / (link.bandwidth_gb_per_s * GB_BYTES * share * eff)


def _flex_comm_s(model: ModelSpec, links: LinkChoice, local_tokens: float, ep: int, act_bytes: int) -> float:
    """One DeepEP/HybridEP dispatch (or combine) of this GPU's tokens."""
    e, k, h = model.num_experts or 1, model.moe_router_topk, model.hidden_size
    token_bytes = h * act_bytes
    ranks_hit = expected_destination_ranks(e, ep, k) - p_group_hit(e, ep, k)  # other ranks, inside or out
    nvl_s = _stream_s(links.intra, local_tokens * token_bytes * ranks_hit)
    if links.inter is None:
        return nvl_s * links.factor("all_to_all")
    nodes = max(1, round(ep / max(links.ranks_per_node, 1)))
    remote_nodes = (nodes - 1) * p_node_hit(model, nodes)
    rdma_s = _stream_s(links.inter, local_tokens * token_bytes * remote_nodes)
    return max(nvl_s, rdma_s) * links.factor("all_to_all")


def moe_dispatch(
    model: ModelSpec, *, kernels: Kernels, links: GroupLinks, local_tokens: float, ep: int, etp: int,
    imbalance: float, act_bytes: int,
) -> DispatchCost:
    """Routing and token movement of one MoE layer (see the module docstring)."""
    e = model.num_experts or 1
    k = model.moe_router_topk
    h = model.hidden_size
    dispatcher = model.moe_token_dispatcher_type
    corr = kernels.corrections[f"dispatch_{dispatcher}"]
    t_l = local_tokens
    copies = etp * k * imbalance  # token copies per local token this GPU's experts compute (after ETP gather)
    local_experts = max(1, e // ep)
    tokens_per_expert = t_l * copies / local_experts

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

    comm_s = 0.0
    if ep > 1 or (dispatcher == "allgather" and etp > 1):
        if dispatcher == "alltoall":
            comm_s = 2 * imbalance * collective_s(links.ep, "all_to_all", sent, ep)
        elif dispatcher == "flex":
            comm_s = 2 * imbalance * _flex_comm_s(model, links.ep, t_l, ep, act_bytes)
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
    return DispatchCost(router_s=router_s, permute_s=permute_s, comm_s=comm_s, etp_s=etp_s,
                        copies_per_token=copies, tokens_per_expert=tokens_per_expert)
