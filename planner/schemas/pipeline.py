"""Pipeline-send rules the cost model (planner/cost/model.py) and the search's solvers (solver_models/tables.py)
share: where a boundary between two stages leaves a node, and a stage's time with its pipeline sends.

A boundary: under Megatron's default rank order (tp-cp-ep-dp-pp) stage s+1's block of ranks follows stage s's,
and the ranks of one device type fill that type's nodes in order (the placement the planner writes,
planner/launcher/common.py `place_agents`), so whether two neighbouring stages share a node follows from where
the first one starts.
"""

from __future__ import annotations

import numpy as np


def pipeline_boundary_crosses_nodes(offset_gpus: int, sender_gpus: int, receiver_gpus: int, gpus_per_node: int) -> bool:
    """Whether a pipeline send between two consecutive stages of one device type leaves a node.

    The sender's block of ranks starts `offset_gpus` into its type's GPUs (the GPUs of that type the stages before
    it hold) and the receiver's block follows it; rank k of the sender sends to rank k of the receiver (the PP
    group of Megatron's default order tp-cp-ep-dp-pp strides by the stage size).  Some pair is on two nodes
    exactly when a node boundary falls inside the two blocks together, and the boundary's sends finish with the
    slowest pair."""
    first = offset_gpus // gpus_per_node
    last = (offset_gpus + sender_gpus + receiver_gpus - 1) // gpus_per_node
    return first != last


def pipeline_boundary_may_stay_in_node(sender_gpus: int, receiver_gpus: int, gpus_per_node: int) -> bool:
    """Whether some position in the pipeline lets the two stages' blocks share one node (the least a boundary
    between them can cost, wherever it lands: the search's lower bounds)."""
    return sender_gpus + receiver_gpus <= gpus_per_node


def stage_time_with_links(fwd, bwd, link_in, link_out):
    """A stage's time per micro-batch with its pipeline sends: forward `fwd` and backward `bwd` (seconds, or
    arrays of them), and its links (L, M) in and out (CostModel.p2p_parts; (0, 0): none):

        max(max(F + L_in, M_in) + B + L_out,  F + L_in + max(B + L_out, M_out))

    Under 1F1B (M = 0) it is F + B + both messages: the rank waits for each send.  Interleaved, Megatron
    (overlap_p2p_comm) posts a chunk's forward output and waits for it only before the rank's next forward, and a
    backward's input gradient before its next backward: in steady state a forward, a backward and the two waits
    repeat with period max(max(f, s_in) + b, f + s_out) per chunk (f, b the chunk's compute, s the message),
    which, times v chunks, is the form above with the v latencies (L) on top.  The discrete-event simulation
    with waits for sends (planner/simulate.py) runs at exactly this rate; its fill and drain take longer
    (tests/test_simulate_vs_model.py).  Each link's messages stay exposed for at least what outlasts the compute
    beside them (M_in - F, M_out - B).  The fill that interleaving adds to the bubble: model.link_fill_s."""
    l_in, m_in = link_in
    l_out, m_out = link_out
    return np.maximum(np.maximum(fwd + l_in, m_in) + bwd + l_out, fwd + l_in + np.maximum(bwd + l_out, m_out))
