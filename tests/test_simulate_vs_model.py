"""The cost model's pipeline formula against the discrete-event simulation (planner/simulate.py) on real plans."""

from __future__ import annotations

import pytest

from planner.baselines.common import build_plan, cost_model
from planner.bench import pipeline_inputs
from planner.cost.model import chunk_stall_layers
from planner.inputs.cluster import parse_cluster
from planner.inputs.resolve import resolve_run
from planner.megatron.layout import chunk_split
from planner.profile_tables import ProfileSet
from planner.schemas.plan import Recompute
from planner.simulate import analytic_1f1b_s, simulate_pipeline
from tools import pipeline_gap


def priced(profiles, model, cluster_name, *, tp=1, ep=1, dp, pp, vpp=1, types=None, layers=None):
    """PlanCost of a megatron plan (full recompute so every shape fits) with GBS = 16 x GPUs."""
    cluster = parse_cluster(cluster_name, profiles)
    run = resolve_run(model=model, world_size=cluster.world_size, overrides={"gbs": 16 * cluster.world_size})
    n = run.model.num_layers
    plan = build_plan(tp=tp, cp=1, ep=ep, etp=1, mbs=1, gbs=run.training.global_batch_size, dp=dp,
                      types=types or [cluster.device_types[0]] * pp, layers=layers or [n // pp] * pp,
                      recompute=Recompute.full("uniform", 1), vpp=vpp)
    pc = cost_model(run, cluster, profiles).evaluate(plan)
    assert pc.fits
    return pc


UNIFORM = [
    ("mixtral-s", "h800-16", dict(ep=8, dp=8, pp=2)),
    ("mixtral-s", "h800-16", dict(ep=8, dp=4, pp=4)),
    ("llama2-7b", "a100-910b", dict(dp=8, pp=4)),
]


@pytest.mark.parametrize("model,cluster,kw", UNIFORM)
def test_uniform_stages_simulation_within_one_percent(profiles, model, cluster, kw):
    """On same-device, even-split plans the simulated 1F1B pipeline is within 1% of the cost model's formula."""
    pc = priced(profiles, model, cluster, **kw)
    fwd, bwd, p2p = pipeline_inputs(pc)
    sim = simulate_pipeline(fwd, bwd, pc.num_microbatches, p2p_s=p2p)
    assert sim.iteration_time_s == pytest.approx(pc.pipeline_s, rel=0.01)
    # the per-boundary decomposition reproduces the formula exactly (same inputs, same algebra)
    assert analytic_1f1b_s(fwd, bwd, pc.num_microbatches, p2p) == pytest.approx(pc.pipeline_s, rel=1e-9)


def test_interleaved_uniform_within_one_percent(profiles):
    """With VPP=2 the interleaved schedule's simulation matches the formula's v-fold smaller bubble within 1%."""
    pc = priced(profiles, "mixtral-s", "h800-16", ep=8, dp=4, pp=4, vpp=2)
    fwd, bwd, p2p = pipeline_inputs(pc)
    sim = simulate_pipeline(fwd, bwd, pc.num_microbatches, p2p_s=p2p, schedule="interleaved", vpp=2)
    assert sim.iteration_time_s == pytest.approx(pc.pipeline_s, rel=0.01)


def test_non_uniform_stages_difference_reported(profiles):
    """On a heterogeneous, non-uniform plan the difference is printed; the simulation never exceeds the formula
    (the formula charges every stage both links per micro-batch) and stays within 5% of it."""
    pc = priced(profiles, "mixtral-s", "h800-910b", ep=8, dp=4, pp=8,
                types=["910B"] * 4 + ["H800"] * 4, layers=[3, 3, 3, 3, 5, 5, 5, 5])
    fwd, bwd, p2p = pipeline_inputs(pc)
    sim = simulate_pipeline(fwd, bwd, pc.num_microbatches, p2p_s=p2p)
    diff = sim.iteration_time_s / pc.pipeline_s - 1
    print(f"non-uniform stages: simulated {sim.iteration_time_s:.4f} s, formula {pc.pipeline_s:.4f} s, "
          f"difference {diff:+.2%}")
    assert sim.iteration_time_s <= pc.pipeline_s * (1 + 1e-9)
    assert abs(diff) < 0.05


def test_pipeline_inputs_split_each_link_between_two_stages(profiles):
    """Every boundary's send is charged to both neighbours, so the boundaries sum to half the stages' pp_comm_s."""
    pc = priced(profiles, "mixtral-s", "h800-910b", ep=8, dp=4, pp=8,
                types=["910B"] * 4 + ["H800"] * 4, layers=[3, 3, 3, 3, 5, 5, 5, 5])
    _, _, p2p = pipeline_inputs(pc)
    assert len(p2p) == 7
    assert sum(p2p) == pytest.approx(sum(s.pp_comm_s for s in pc.stages) / 2, rel=1e-9)
    assert p2p[3] > p2p[0]  # the 910B -> H800 boundary crosses device types: the slowest link


SLOW_NODES = "groups: [{device_type: V100, num_nodes: 4, gpus_per_node: 4, inter_node_bandwidth_gb_per_s: 0.3125}]\n"
SMALL_GPT = ("--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
             "--max-position-embeddings 1024 --vocab-size 52256 --fp16 --micro-batch-size 2")


@pytest.mark.parametrize("pp,vpp,gbs", [(4, 2, 32), (4, 2, 128), (8, 1, 32), (2, 2, 64)])
def test_slow_links_simulation_with_waits_matches_the_formula(tmp_path, pp, vpp, gbs):
    """On 4 nodes of 4 V100 with 10 Gb/s between them (a message outlasts a chunk's compute), the simulated
    schedule with Megatron's waits for sends is within 8% of the formula, interleaved or not."""
    from helpers.cases import flags_cost_model

    path = tmp_path / "slow.yaml"
    path.write_text(SLOW_NODES)
    extra = f" --pipeline-model-parallel-size {pp} --global-batch-size {gbs}"
    if vpp > 1:
        extra += f" --num-virtual-stages-per-pipeline-rank {vpp}"
    _, plan, cm = flags_cost_model(SMALL_GPT + extra, str(path))
    pc = cm.evaluate(plan)
    fwd, bwd, p2p = pipeline_inputs(pc)
    sim = simulate_pipeline(fwd, bwd, pc.num_microbatches, p2p_s=p2p, schedule="interleaved" if vpp > 1 else "1f1b",
                            vpp=vpp, wait_for_sends=True)
    print(f"pp{pp} vpp{vpp} m{pc.num_microbatches}: simulated {sim.iteration_time_s:.4f} s, formula "
          f"{pc.pipeline_s:.4f} s")
    assert sim.iteration_time_s == pytest.approx(pc.pipeline_s, rel=0.08)


def test_interleaved_formula_tracks_the_simulation_over_link_speeds():
    """Uniform stages, PP 2-8, VPP 2-4, m = PP..8 PP, messages from a tenth of a chunk's forward to three times its
    backward: the formula (model.stage_time_with_links, link_fill_s, the schedule sum) against the simulation
    with waits for sends: median within 1%, every case within 25% (the worst where the wrap-around link, which the
    formula does not price, carries much: PP 2)."""
    import statistics

    from planner.cost.model import link_fill_s
    from planner.schemas.pipeline import stage_time_with_links

    ratios = []
    for f_c, b_c, s in [(2.0, 4.0, 0.2), (2.0, 4.0, 3.0), (2.0, 4.0, 12.0)]:
        for pp in (2, 4, 8):
            for v in (2, 4):
                for m in (pp, 4 * pp):
                    fwd, bwd, p2p = [f_c * v] * pp, [b_c * v] * pp, [s] * (pp - 1)
                    links = [(0.0, 0.0)] + [(0.0, v * x) for x in p2p] + [(0.0, 0.0)]
                    t = [float(stage_time_with_links(fwd[i], bwd[i], links[i], links[i + 1])) for i in range(pp)]
                    formula = sum(t) / v + (m - 1 / v) * max(t) + sum(link_fill_s(v, *link) for link in links[1:-1])
                    sim = simulate_pipeline(fwd, bwd, m, p2p_s=p2p, schedule="interleaved", vpp=v, wait_for_sends=True)
                    ratios.append(sim.iteration_time_s / formula)
    print(f"simulated / formula over {len(ratios)} cases: median {statistics.median(ratios):.3f}, "
          f"{min(ratios):.3f}..{max(ratios):.3f}")
    assert abs(statistics.median(ratios) - 1) < 0.01
    assert all(0.75 < r < 1.25 for r in ratios)


def _stall_layers(pp: int, vpp: int, n: int) -> float:
    """The simulated steady-state stall per micro-batch, in layers' time, of PP equal ranks of n layers over vpp
    chunks (planner/megatron/layout.py's split), forward : backward 1 : 2: the slope between 2 and 4 rounds of PP
    micro-batches over the rank's own time."""
    fwd, bwd = [float(n)] * pp, [2.0 * n] * pp
    chunks = chunk_split([n] * pp, vpp)
    t = [simulate_pipeline(fwd, bwd, r * pp, schedule="interleaved", vpp=vpp, chunk_layers=chunks).iteration_time_s
         for r in (2, 4)]
    return ((t[1] - t[0]) / (2 * pp) / (3.0 * n) - 1.0) * n


@pytest.mark.parametrize("pp,vpp,n", [(6, 4, 6), (8, 8, 12), (8, 3, 7), (8, 4, 11), (16, 4, 6), (16, 8, 20),
                                      (8, 2, 3), (8, 8, 16), (4, 3, 4), (3, 2, 3), (8, 4, 3)])
def test_chunk_stall_follows_the_simulated_schedule(pp, vpp, n):
    """The cost model's stall of unequal chunks (model.chunk_stall_layers) against the discrete-event simulation of
    Megatron's interleaved schedule: within 0.02 layer from 6 ranks with at least one layer a chunk, never above
    it, and none with equal chunks."""
    sim = _stall_layers(pp, vpp, n)
    priced = chunk_stall_layers(n, vpp, pp)
    if n % vpp == 0:
        assert priced == 0.0 and abs(sim) < 0.01
    elif pp >= 6 and n >= vpp:
        assert priced == pytest.approx(sim, abs=0.02)
    else:
        assert priced <= sim + 0.01 and sim - priced <= 0.34


def test_interleaved_schedule_by_hand_slower_rank_first():
    """Megatron's interleaved 1F1B (schedules.py: rank r warms up with (PP - r - 1) * 2 + (VPP - 1) * PP forwards;
    virtual micro-batch k is chunk (k mod PP*VPP) // PP, reversed for backward, of micro-batch
    (k // (PP*VPP)) * PP + k mod PP) at PP 2, VPP 2, 4 micro-batches, per chunk rank 0 f = 1, b = 2 and rank 1
    f = 0.5, b = 1 (t = 6 and 3 per micro-batch).  Fmc / Bmc: micro-batch m, chunk c.

    Rank 0 (4 warm-up forwards): F00 F10 F01 F11 | F20 B01 F30 B11 F21 B00 F31 B10 | B21 B31 B20 B30.
    Rank 1 (2):                  F00 F10 | F01 B01 F11 B11 F20 B00 F30 B10 F21 B21 F31 B31 | B20 B30.
    Rank 0 runs back to back from 0: F00 [0,1] F10 [1,2] F01 [2,3] (rank 1's F00 [1,1.5]) F11 [3,4] (F10 [2,2.5])
    F20 [4,5] B01 [5,7] (rank 1: F01 [3,3.5] B01 [3.5,4.5]) F30 [7,8] B11 [8,10] (F11 [4.5,5] B11 [5,6])
    F21 [10,11] (F20 [6,6.5]) B00 [11,13] (B00 [7,8]) F31 [13,14] (F30 [8,8.5]) B10 [14,16] (B10 [10,11])
    B21 [16,18] (F21 [11,11.5] B21 [11.5,12.5]) B31 [18,20] (F31 [14,14.5] B31 [14.5,15.5]) B20 [20,22]
    (B20 [18,19]) B30 [22,24] (B30 [20,21]): every input is there before rank 0 wants it, so the iteration is
    m * t0 = 24 with no bubble.  The cost model's sum t_i / v + (m - 1/v) max t_i = 4.5 + 21 = 25.5 charges
    rank 1's chunk (t1 / v = 1.5) as bubble though rank 1 works while rank 0 does.

    Reversed (the slower rank last), rank 1 starts at 0.5 (rank 0's F00), is never idle after (24 s of work, so
    it ends at 24.5), and rank 0's last backward chunk takes 1 more: 25.5, the formula exactly."""
    slow_first = simulate_pipeline([2.0, 1.0], [4.0, 2.0], 4, schedule="interleaved", vpp=2)
    assert slow_first.iteration_time_s == pytest.approx(24.0)
    assert slow_first.busy_s[0] == pytest.approx(24.0)
    rank1_ends = sorted(e.end_s for e in slow_first.events if e.stage == 1)
    assert rank1_ends[-1] == pytest.approx(21.0)
    slow_last = simulate_pipeline([1.0, 2.0], [2.0, 4.0], 4, schedule="interleaved", vpp=2)
    rank1 = [e for e in slow_last.events if e.stage == 1]
    assert min(e.start_s for e in rank1) == pytest.approx(0.5) and max(e.end_s for e in rank1) == pytest.approx(24.5)
    assert slow_last.iteration_time_s == pytest.approx(25.5)
    t, v, m = [6.0, 3.0], 2, 4
    formula = sum(t) / v + (m - 1 / v) * max(t)
    assert formula == pytest.approx(25.5)  # slower rank last: exact; first: 1.5 (6.25%) over


@pytest.mark.parametrize("vpp", [1, 2, 3])
def test_evaluate_and_timeline_differ_by_the_fill_unless_a_slower_stage_comes_first(vpp):
    """The small MoE of tests/test_trials_mixed.py at PP 2 on H800:8,A100:8 (tools/pipeline_gap.py): the synthetic
    log's timeline (planner/simulate.py on the stages' forward and backward seconds, sends inside them) is the cost
    model's iteration less the interleaved links' fill, which it cannot see, to 1e-9, where the stages are equal
    or the slower one is last (4/4, 2/6); with the slower H800 stage first (6/2) the formula's bubble over-charges
    it as in the hand case above: 0.8% at VPP 1, 3-4% more than the fill interleaved."""
    for layers, over_lo, over_hi in (((4, 4), 0.0, 0.0), ((2, 6), 0.0, 0.0), ((6, 2), 0.005, 0.05)):
        pc = pipeline_gap.priced(ProfileSet.load(), "H800:8,A100:8", ("H800", "A100"), layers, vpp)
        fill_s = sum(s.fill_out_s for s in pc.stages)
        over = (pc.iteration_time_s - fill_s) / pipeline_gap.timeline_s(pc, vpp) - 1
        print(f"{layers} vpp{vpp}: evaluate {pc.iteration_time_s:.4f} s, fill {fill_s:.4f} s, over {over:+.2%}")
        assert over_lo - 1e-9 <= over <= over_hi + 1e-9, (layers, over)
