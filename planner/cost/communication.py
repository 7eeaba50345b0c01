"""How long a collective over a group of ranks takes: the alpha-beta formula on one link, and the link
each communication group of a stage runs on.

One link (`collective_time_s`): alpha-beta ring cost, nccl-tests' bus-bandwidth convention, the link's
efficiency curve per collective (profiles/README.md, "Collective time").

A group (`stage_group_links`, `collective_s`): under Megatron's default rank order (tp-cp-ep-dp-pp;
reference/megatron.md section 3) a stage owns a contiguous block of TP*CP*DP ranks: TP ranks are adjacent,
then CP, then DP; in the expert view ETP is adjacent, then EP, then expert-DP.  A node here is the GPUs that share
the intra-node link (`domain_gpus`: one host, or the hosts of a scale-up domain such as a GB200 NVL72 rack's NVLink
trays).  A group whose ranks span more than one node runs at the inter-node link's speed; an all-to-all that spans nodes sends part of its
traffic on each link.  Calibrated time multipliers per collective (profiles/corrections.yaml) apply here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.curves import interpolate_efficiency
from planner.errors import MissingProfileError
from planner.profile_tables import COLLECTIVES
from planner.schemas.device import LinkProfile
from planner.units import GB_BYTES, US_S

MESH_LINK_KINDS = frozenset({"xgmi", "hccs", "roce-mesh"})
"""Intra-node links wired as a full mesh: `bandwidth_gb_per_s` is the sum over all peer links."""
MESH_PEERS = 7
"""Peers of one device in an 8-device full mesh (MI300X xGMI, 910B HCCS, Gaudi2 on-chip RoCE)."""


# --------------------------------------------------------------------------------------------- one link


def volume_factor(collective: str, num_ranks: int) -> float:
    """Bytes each rank moves per byte of `message_bytes` (nccl-tests' bus factor): 2(n-1)/n for
    all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for point-to-point."""
    n = num_ranks
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "p2p":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")


def latency_steps(collective: str, num_ranks: int) -> int:
    """Latency terms one collective pays (ring algorithms): 2(n-1) for all-reduce, n-1 for all-gather,
    reduce-scatter and all-to-all, 1 for point-to-point."""
    n = num_ranks
    if collective == "all_reduce":
        return 2 * (n - 1)
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return n - 1
    if collective == "p2p":
        return 1
    raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")


def link_bandwidth_share(link: LinkProfile, collective: str, num_ranks: int) -> float:
    """Fraction of `link.bandwidth_gb_per_s` a collective over `num_ranks` ranks can use.

    1.0 except on full-mesh links (MESH_LINK_KINDS), whose bandwidth is the sum over 7 peer links:
    a p2p uses one of them (1/7) and a collective over n ranks of one node uses n-1 of them."""
    if link.kind not in MESH_LINK_KINDS:
        return 1.0
    if collective == "p2p":
        return 1.0 / MESH_PEERS
    return min(1.0, max(num_ranks - 1, 1) / MESH_PEERS)


def collective_time_s(link: LinkProfile, collective: str, message_bytes: float, num_ranks: int) -> float:
    """Seconds for one collective on `link` (alpha-beta, ring algorithm).

        time = steps(n) * latency + volume(n) * message_bytes / busbw
        busbw = bandwidth * share(n) * efficiency[collective](message_bytes)

    with n = num_ranks and, following nccl-tests' bus-bandwidth convention,

        all_reduce:                  volume 2(n-1)/n, steps 2(n-1)
        all_gather, reduce_scatter:  volume  (n-1)/n, steps  (n-1)
        all_to_all:                  volume  (n-1)/n, steps  (n-1)
        p2p:                         volume 1,        steps 1

    `message_bytes` is the full buffer: the all-reduced tensor, the gathered output, the
    reduce-scatter input, the per-rank all-to-all send buffer (own chunk included), the p2p message.
    `share(n)` is `link_bandwidth_share` (1 except on full-mesh links).  The shipped efficiency curves
    are bandwidth-only (the latency term was subtracted when they were fitted), so the two terms do not
    double count.  Returns 0.0 for one rank or an empty message.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    if message_bytes < 0 or math.isnan(message_bytes):
        raise ValueError(f"message_bytes must be >= 0, got {message_bytes}")
    if num_ranks == 1 or message_bytes == 0:
        return 0.0
    curve = link.efficiency.get(collective)
    if curve is None:
        raise MissingProfileError(
            f"link kind {link.kind!r} has no efficiency curve for {collective!r}; it lists {sorted(link.efficiency)}"
        )
    n = num_ranks
    busbw_bytes_per_s = (
        link.bandwidth_gb_per_s * GB_BYTES * link_bandwidth_share(link, collective, n)
        * interpolate_efficiency(curve, message_bytes)
    )
    latency_s = latency_steps(collective, n) * link.latency_us * US_S
    return latency_s + volume_factor(collective, n) * message_bytes / busbw_bytes_per_s


# --------------------------------------------------------------------------------------------- a group's link


@dataclass(frozen=True)
class LinkChoice:
    """A group's link: `intra` inside one node, plus `inter` when the group spans nodes."""

    intra: LinkProfile
    inter: LinkProfile | None
    ranks_per_node: int
    factors: tuple[tuple[str, float], ...] = ()  # calibrated time multipliers per collective

    def factor(self, collective: str) -> float:
        for name, f in self.factors:
            if name == collective:
                return f
        return 1.0


@dataclass(frozen=True)
class GroupLinks:
    tp: LinkChoice
    cp: LinkChoice
    ep: LinkChoice
    etp: LinkChoice
    dp: LinkChoice
    edp: LinkChoice
    expert_group: LinkChoice  # the ETPxEP ranks of one expert group, contiguous (allgather dispatcher)


def _choice(intra: LinkProfile, inter: LinkProfile, span_ranks: int, domain_gpus: int, stride: int,
            factors: tuple = ()) -> LinkChoice:
    """A group of `span_ranks` consecutive-block ranks with member stride `stride`."""
    if span_ranks <= domain_gpus:
        return LinkChoice(intra=intra, inter=None, ranks_per_node=span_ranks // max(stride, 1), factors=factors)
    members_per_node = max(1, domain_gpus // max(stride, 1))
    return LinkChoice(intra=intra, inter=inter, ranks_per_node=members_per_node, factors=factors)


def stage_group_links(
    *, intra: LinkProfile, inter: LinkProfile, domain_gpus: int, tp: int, cp: int, dp: int, ep: int, etp: int,
    factors: dict[str, float] | None = None,
) -> GroupLinks:
    """Links of every group inside one stage (block of tp*cp*dp ranks).  `factors` are the
    device's calibrated collective corrections (time multipliers)."""
    gpn = domain_gpus
    edp = max(1, tp * cp * dp // (etp * ep))
    f = tuple(sorted((factors or {}).items()))
    return GroupLinks(
        tp=_choice(intra, inter, tp, gpn, 1, f),
        cp=_choice(intra, inter, tp * cp, gpn, tp, f),
        ep=_choice(intra, inter, etp * ep, gpn, etp, f),
        etp=_choice(intra, inter, etp, gpn, 1, f),
        dp=_choice(intra, inter, tp * cp * dp, gpn, tp * cp, f),
        edp=_choice(intra, inter, etp * ep * edp, gpn, etp * ep, f),
        expert_group=_choice(intra, inter, etp * ep, gpn, 1, f),
    )


def collective_s(link: LinkChoice, collective: str, message_bytes: float, num_ranks: int) -> float:
    """Time of one collective on a group's link (`collective_time_s` per link, this device's calibrated
    factor; `message_bytes` is the full buffer: the gathered output, the reduced input, or the per-rank
    send buffer of an all-to-all)."""
    if num_ranks <= 1 or message_bytes <= 0:
        return 0.0
    return link.factor(collective) * _collective_s(link, collective, message_bytes, num_ranks)


def _collective_s(link: LinkChoice, collective: str, message_bytes: float, num_ranks: int) -> float:
    if link.inter is None:
        return collective_time_s(link.intra, collective, message_bytes, num_ranks)
    if collective == "all_to_all":
        # each rank sends (n-1)/n of its buffer; the share bound for other nodes goes over the NIC
        local = max(link.ranks_per_node - 1, 0)
        remote = num_ranks - 1 - local
        share = 1.0 / (num_ranks - 1)
        intra_t = collective_time_s(link.intra, collective, message_bytes, num_ranks) * local * share
        inter_t = collective_time_s(link.inter, collective, message_bytes, num_ranks) * remote * share
        return max(intra_t, inter_t)
    if link.ranks_per_node > 1:
        # NCCL drives every member's NIC: r members per node give about r x NIC, capped by the
        # intra-node link that feeds them
        bw = min(link.inter.bandwidth_gb_per_s * link.ranks_per_node, link.intra.bandwidth_gb_per_s)
        return collective_time_s(link.inter.model_copy(update={"bandwidth_gb_per_s": bw}), collective,
                                 message_bytes, num_ranks)
    return collective_time_s(link.inter, collective, message_bytes, num_ranks)
