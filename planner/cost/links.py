"""Which link each communication group of a stage runs on.

Under Megatron's default rank order (tp-cp-ep-dp-pp; reference/megatron.md section 3) a stage owns a
contiguous block of TP*CP*DP ranks: TP ranks are adjacent, then CP, then DP; in the expert view ETP
is adjacent, then EP, then expert-DP.  A group whose ranks span more than one node runs at the
inter-node link's speed; an all-to-all that spans nodes sends part of its traffic on each link.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.schemas.device import LinkProfile


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


def _choice(intra: LinkProfile, inter: LinkProfile, span_ranks: int, gpus_per_node: int, stride: int,
            factors: tuple = ()) -> LinkChoice:
    """A group of `span_ranks` consecutive-block ranks with member stride `stride`."""
    if span_ranks <= gpus_per_node:
        return LinkChoice(intra=intra, inter=None, ranks_per_node=span_ranks // max(stride, 1), factors=factors)
    members_per_node = max(1, gpus_per_node // max(stride, 1))
    return LinkChoice(intra=intra, inter=inter, ranks_per_node=members_per_node, factors=factors)


def stage_group_links(
    *, intra: LinkProfile, inter: LinkProfile, gpus_per_node: int, tp: int, cp: int, dp: int, ep: int, etp: int,
    factors: dict[str, float] | None = None,
) -> GroupLinks:
    """Links of every group inside one stage (block of tp*cp*dp ranks).  `factors` are the
    device's calibrated collective corrections (time multipliers)."""
    gpn = gpus_per_node
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
    """Time of one collective on a group's link (see planner.profile_tables.collective_time_s for
    the per-link formula; `message_bytes` is the full buffer: the gathered output, the reduced
    input, or the per-rank send buffer of an all-to-all)."""
    from planner.profile_tables import collective_time_s

    if num_ranks <= 1 or message_bytes <= 0:
        return 0.0
    return link.factor(collective) * _collective_s(link, collective, message_bytes, num_ranks)


def _collective_s(link: LinkChoice, collective: str, message_bytes: float, num_ranks: int) -> float:
    from planner.profile_tables import collective_time_s

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
