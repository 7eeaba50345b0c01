"""The memory model (planner/cost/memory.py, the memory parts of planner/cost/model.py): the terms issue 19
added, each checked against a hand count; the whole against measured peaks (planner/calibration/memory.py) and
against Megatron's own theoretical memory report (tools/megatron_memory.py, in the validator environment)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from planner.calibration.memory import TARGET_MEDIAN_ABS_PCT, TARGET_WORST_UNDER_PCT, memory_rows, summarise
from planner.cost.estimate import plan_from_run
from planner.cost.memory import COMM_BUFFER_GIB, comm_buffer_bytes, process_groups
from planner.cost.model import CostModel, GlobalShape, StageMemory
from planner.inputs.cluster import parse_cluster
from planner.inputs.megatron_flags import parse_megatron_flags
from planner.profile_tables import ProfileSet
from planner.units import GIB_BYTES
from tools.megatron_validate import megatron_python

ROOT = Path(__file__).resolve().parents[1]
GPT = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 "
       "--micro-batch-size 2 --global-batch-size 64 --vocab-size 32000 --bf16 --untie-embeddings-and-output-weights "
       "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2")


def _priced(flags: str, cluster: str = "H100:16", headroom: float = 0.0):
    profiles = ProfileSet.load()
    cl = parse_cluster(cluster, profiles)
    run = parse_megatron_flags(shlex.split(flags), world_size=cl.world_size)
    plan, _ = plan_from_run(run, cl, profiles)
    return run, plan, CostModel(run.model, run.training, cl, profiles, memory_headroom=headroom).evaluate(plan)


def test_dropout_masks_are_one_byte_per_element_of_each_bias_dropout_add():
    """Megatron's default --hidden-dropout 0.1: each layer's two bias-dropout-add steps keep a 1-byte mask of
    [s, b, h] (TP2 without SP: the whole sequence), and the first stage's embedding dropout one more."""
    _, plan, with_do = _priced(GPT + " --attention-dropout 0.0")
    _, _, without = _priced(GPT + " --attention-dropout 0.0 --hidden-dropout 0.0")
    s, b, h = 2048, 2, 2048
    for i, (a, z) in enumerate(zip(with_do.stages, without.stages)):
        layers = plan.stages[i].num_layers
        masks = a.inflight_microbatches * (layers * 2 * s * b * h + (s * b * h if i == 0 else 0))
        assert a.activations_bytes - z.activations_bytes == pytest.approx(masks)


def test_unfused_attention_keeps_the_softmax_output_per_layer():
    """--attention-backend unfused: 2 * (heads/TP) * s^2 * b bytes per layer and in-flight micro-batch over the
    flash kernel's statistics; with attention dropout a mask (1 byte) and the dropped copy (2 bytes) more: 5as^2b
    (Korthikanti et al. 2022, Table 2)."""
    base = GPT + " --hidden-dropout 0.0"
    _, plan, flash = _priced(base + " --attention-dropout 0.0")
    _, _, unfused = _priced(base + " --attention-dropout 0.0 --attention-backend unfused")
    _, _, unfused_do = _priced(base + " --attention-backend unfused")
    a_local, s, b = 16 / 2, 2048, 2
    stats = 4 * a_local * s * b  # flash: FP32 softmax statistics per head and token
    for i, st in enumerate(flash.stages):
        per_mb_layers = st.inflight_microbatches * plan.stages[i].num_layers
        grew = unfused.stages[i].activations_bytes - st.activations_bytes
        scores = 2 * a_local * s * s * b  # one BF16 s x s tensor of this GPU's heads
        transient = 2 * scores  # raw scores and the softmax gradient while one layer runs
        assert grew == pytest.approx(per_mb_layers * (scores - stats) + transient, rel=1e-9)
        grew_do = unfused_do.stages[i].activations_bytes - st.activations_bytes
        assert grew_do == pytest.approx(per_mb_layers * (2.5 * scores - stats) + transient, rel=1e-9)


def test_selective_core_attn_recompute_drops_the_unfused_softmax():
    base = GPT + " --hidden-dropout 0.0 --attention-dropout 0.0 --attention-backend unfused"
    _, plan, kept = _priced(base)
    _, _, dropped = _priced(base + " --recompute-granularity selective --recompute-modules core_attn")
    softmax = 2 * (16 / 2) * 2048 * 2048 * 2  # BF16 softmax output of one layer, this GPU's heads
    for i, st in enumerate(kept.stages):
        layer_mbs = st.inflight_microbatches * plan.stages[i].num_layers
        assert st.activations_bytes - dropped.stages[i].activations_bytes == pytest.approx(layer_mbs * softmax)


def test_the_mtp_stage_holds_a_duplicate_word_embedding():
    """gpt_model.py builds LanguageModelEmbedding when pre_process or mtp_process: with PP > 1 the MTP (last)
    stage holds V x h / TP more parameters than the MTP layer alone adds; with PP 1 it is the same embedding."""
    mtp = " --mtp-num-layers 1"
    gpt = GPT + " --position-embedding-type rope"  # Megatron's MTP needs RoPE (or no position embedding)
    pp1 = gpt.replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size 1")
    run, _, plain2 = _priced(gpt)
    _, _, mtp2 = _priced(gpt + mtp)
    _, _, plain1 = _priced(pp1)
    _, _, mtp1 = _priced(pp1 + mtp)
    added_pp2 = mtp2.stages[-1].weights_bytes - plain2.stages[-1].weights_bytes
    added_pp1 = mtp1.stages[-1].weights_bytes - plain1.stages[-1].weights_bytes
    embedding_bf16 = run.model.padded_vocab_size(2) * 2048 / 2 * 2
    assert added_pp2 - added_pp1 == pytest.approx(embedding_bf16)
    assert mtp2.stages[0].weights_bytes == plain2.stages[0].weights_bytes


def test_communicator_buffers_follow_the_plans_process_groups():
    """One buffer set per group of more than one rank the stage communicates over (NVIDIA/nccl#964 per
    communicator; HCCL 2 x HCCL_BUFFSIZE), so the term depends on the plan."""
    assert process_groups(tp=1, cp=1, dp=1, pp=1, ep=1, etp=1, moe=False, tied_embedding_stage=False) == ()
    assert process_groups(tp=8, cp=1, dp=1, pp=1, ep=1, etp=1, moe=False, tied_embedding_stage=False) == (
        "world", "tensor")
    moe = process_groups(tp=2, cp=2, dp=4, pp=4, ep=8, etp=1, moe=True, tied_embedding_stage=True)
    assert moe == ("world", "tensor", "context", "pipeline", "data", "expert", "expert-data", "model", "embedding")
    assert "expert-tensor" in process_groups(tp=1, cp=1, dp=8, pp=1, ep=2, etp=4, moe=True, tied_embedding_stage=False)
    assert comm_buffer_bytes("NVIDIA", moe) == pytest.approx(9 * COMM_BUFFER_GIB["NVIDIA"] * GIB_BYTES)
    assert comm_buffer_bytes("Huawei", moe) < comm_buffer_bytes("NVIDIA", moe)
    _, _, tp_only = _priced(GPT.replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size 1"),
                            cluster="H100:2")
    _, _, with_dp = _priced(GPT, cluster="H100:16")
    assert tp_only.stages[0].comm_buffer_bytes < with_dp.stages[0].comm_buffer_bytes


def test_headroom_takes_memory_off_what_a_plan_may_use():
    _, _, none = _priced(GPT)
    _, _, ten = _priced(GPT, headroom=0.10)
    a, b = none.stages[0], ten.stages[0]
    assert a.memory_bytes == b.memory_bytes and a.device_memory_bytes == b.device_memory_bytes
    assert b.capacity_bytes == pytest.approx(0.9 * a.device_memory_bytes)
    assert ten.memory_headroom == 0.10 and b.to_json()["usable_gib"] == pytest.approx(0.9 * b.to_json()["capacity_gib"])


def test_measured_peaks(profiles):
    """Issue 19's targets on measured peak memory: median |error| <= 10%, and no run whose allocated peak was
    measured predicted more than 10% below it.  The reserved-memory row, compared with the recorded reserved peak,
    is the one the recorded cache share is fitted on: in the median, not held to the bound here (its held-out
    figure is test_leave_one_source_out_prices_reserved_rows_with_the_other_sources_share's business)."""
    rows = memory_rows(profiles)
    assert len(rows) >= 7
    summary = summarise(rows)
    assert summary.median_abs_pct <= TARGET_MEDIAN_ABS_PCT, summary
    allocated = [r for r in rows if r.metric == "max_allocated_gib"]
    assert all(r.error_pct >= TARGET_WORST_UNDER_PCT for r in allocated), [(r.id, r.error_pct) for r in allocated]


# --------------------------------------------------------------------------------------------- Megatron's formula

_PYTHON = megatron_python()
BASE = ("--seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --vocab-size 32000 "
        "--tokenizer-type NullTokenizer --mock-data --bf16 --disable-bias-linear --untie-embeddings-and-output-weights "
        "--normalization RMSNorm --num-layers 16 --hidden-size 4096 --num-attention-heads 32 --global-batch-size 64 "
        "--tensor-model-parallel-size 2 --sequence-parallel --recompute-activations")
MOE = " --ffn-hidden-size 14336 --swiglu --group-query-attention --num-query-groups 8 --num-experts 8 --moe-router-topk 2"
THEORY_CASES = {  # name: (flags, world size, Megatron's activation formula applies)
    "dense PP1 distributed optimizer": (BASE + " --use-distributed-optimizer", 16, True),
    "dense PP4": (BASE + " --use-distributed-optimizer --pipeline-model-parallel-size 4", 32, True),
    "dense PP4 VPP2": (BASE + " --use-distributed-optimizer --pipeline-model-parallel-size 4 "
                       "--num-layers-per-virtual-pipeline-stage 2", 32, True),
    "dense PP2 plain optimizer": (BASE + " --pipeline-model-parallel-size 2", 8, True),
    "GQA SwiGLU MoE EP8 PP2": (BASE + MOE + " --moe-grouped-gemm --expert-model-parallel-size 8 "
                               "--pipeline-model-parallel-size 2 --use-distributed-optimizer", 32, False),
    "MoE EP4 plain optimizer": (BASE + MOE + " --expert-model-parallel-size 4", 16, False),
}


@pytest.mark.slow
@pytest.mark.skipif(_PYTHON is None, reason="Megatron's validator environment is not built (bash .ci/megatron_env.sh)")
def test_against_megatrons_theoretical_memory_report(profiles):
    """Weights, gradients and optimizer state of the most loaded stage agree with Megatron's own formula
    (theoretical_memory_usage.py, bytes per parameter 18, or 6 + 12/DP with the distributed optimizer) on every
    configuration; activations of the first stage within 5% where Megatron's formula applies (dense, MHA,
    non-gated MLP: it ignores GQA, SwiGLU and MoE, NVIDIA/Megatron-LM#1784)."""
    cases, ours = [], {}
    for name, (flags, world, _) in THEORY_CASES.items():
        cl = parse_cluster(f"H100:{world}", profiles)
        run = parse_megatron_flags(shlex.split(flags), world_size=world)
        plan, _ = plan_from_run(run, cl, profiles)
        st = CostModel(run.model, run.training, cl, profiles, memory_headroom=0.0).evaluate(plan).stages[0]
        ours[name] = (st.weights_bytes + st.grads_bytes + st.optimizer_bytes, st.activations_bytes)
        cases.append({"name": name, "argv": shlex.split(flags), "world_size": world,
                      "num_microbatches": plan.num_microbatches})
    proc = subprocess.run([_PYTHON, str(ROOT / "tools" / "megatron_memory.py")], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for r in json.loads(proc.stdout):
        assert r["ok"], (r["name"], r["error"])
        static, act = ours[r["name"]]
        assert static == pytest.approx(r["weight_and_optimizer_bytes"], rel=0.003), r["name"]
        if THEORY_CASES[r["name"]][2]:
            assert act == pytest.approx(r["activation_bytes"], rel=0.05), r["name"]


# --------------------------------------------------------------------------------------------- the allocator's cache


def test_reserved_peak_is_the_allocated_peak_and_the_allocators_cache():
    """Per stage: reserved = allocated + the cache fraction of the run's allocator settings x the activations (+ the
    unfused loss's FP32 logits segment on the last stage: test_unfused_loss_reserves_an_fp32_copy_of_the_logits);
    expandable segments cache less than PyTorch's default allocator; unstated settings are priced as assumed; the
    fit check and the reported memory are the reserved peak and the memory outside the allocator (JSON: both peaks,
    by name)."""
    from planner.cost.memory import ALLOCATOR_CACHE_FRACTION, EXPANDABLE_SEGMENTS_ASSUMED

    run, plan, unstated = _priced(GPT)
    profiles = ProfileSet.load()
    cl = parse_cluster("H100:16", profiles)
    priced = {}
    for setting in (True, False):
        training = run.training.model_copy(update={"expandable_segments": setting})
        priced[setting] = CostModel(run.model, training, cl, profiles, memory_headroom=0.0).evaluate(plan)
    assert ALLOCATOR_CACHE_FRACTION[True] < ALLOCATOR_CACHE_FRACTION[False]
    for setting, cost in priced.items():
        for st, same in zip(cost.stages, unstated.stages):
            assert st.allocated_bytes == pytest.approx(same.allocated_bytes)  # the allocator changes no tensor
            assert st.reserved_bytes == pytest.approx(st.allocated_bytes + st.loss_reserved_bytes
                                                      + ALLOCATOR_CACHE_FRACTION[setting] * st.activations_bytes)
            assert st.memory_bytes == pytest.approx(st.reserved_bytes + st.other_bytes)
            j = st.to_json()
            assert j["peak_allocated_gib"] * GIB_BYTES == pytest.approx(st.allocated_bytes)
            assert j["peak_reserved_gib"] * GIB_BYTES == pytest.approx(st.reserved_bytes)
            assert j["memory_gib"] * GIB_BYTES == pytest.approx(st.memory_bytes)
    assert unstated.max_reserved_gib == pytest.approx(priced[EXPANDABLE_SEGMENTS_ASSUMED].max_reserved_gib)
    assert priced[False].max_reserved_gib > priced[True].max_reserved_gib > priced[True].max_allocated_gib
    assert {"max_allocated_gib", "max_reserved_gib", "max_memory_gib"} <= set(unstated.to_json())


def test_unfused_loss_reserves_an_fp32_copy_of_the_logits():
    """Without --cross-entropy-loss-fusion (Megatron's default) the last stage reserves, beyond its allocated peak and
    the allocator's cache, one FP32 copy of a micro-batch's logits per loss head (planner/cost/memory.py
    loss_reserved_bytes): tokens x vocab/TP x 4 bytes, here 2 x 2048 x 32000/2 x 4 = 262,144,000, with and without
    expandable segments, and twice with one MTP depth; none with the fused loss, none on the first stage; the
    allocated peak is the same, and the fit check (the search's held static bytes) counts it."""
    fp32_logits = 2 * 2048 * (32000 // 2) * 4
    profiles = ProfileSet.load()
    cl = parse_cluster("H100:16", profiles)
    for extra, heads in (("", 1), (" --position-embedding-type rope --mtp-num-layers 1", 2)):
        run, plan, _ = _priced(GPT + extra)
        for setting in (True, False):
            priced = {}
            for fused in (False, True):
                training = run.training.model_copy(update={"expandable_segments": setting,
                                                           "cross_entropy_loss_fusion": fused})
                priced[fused] = CostModel(run.model, training, cl, profiles, memory_headroom=0.0).evaluate(plan)
            (first_u, last_u), (first_f, last_f) = priced[False].stages, priced[True].stages
            assert last_u.allocated_bytes == pytest.approx(last_f.allocated_bytes)
            assert last_u.loss_reserved_bytes == heads * fp32_logits and last_f.loss_reserved_bytes == 0.0
            assert last_u.reserved_bytes - last_f.reserved_bytes == pytest.approx(heads * fp32_logits)
            assert last_u.held_static_bytes - last_f.held_static_bytes == pytest.approx(heads * fp32_logits)
            assert first_u.reserved_bytes == pytest.approx(first_f.reserved_bytes)
    assert parse_megatron_flags(shlex.split(GPT + " --cross-entropy-loss-fusion"),
                                world_size=16).training.cross_entropy_loss_fusion
    assert not parse_megatron_flags(shlex.split(GPT), world_size=16).training.cross_entropy_loss_fusion


def test_qk_layernorm_keeps_the_q_and_k_norm_inputs_and_statistics():
    """--qk-layernorm: each layer keeps, per token and in-flight micro-batch, the Q and K norms' saved inputs (BF16,
    (heads + query groups) / TP x head_dim) and their FP32 statistics per head row (4 bytes for RMSNorm, 8 for
    LayerNorm: the mean too); GPT at TP2 without SP: 4096 tokens x (16 + 16) / 2 heads x (2 x 128 + 8) bytes per layer,
    and with 4 query groups (16 + 4) / 2 heads; MLA's latent norms are not this term."""
    from planner.cost.memory import activation_bytes_per_token

    s_b = 2048 * 2
    for extra, heads, stats in (("", 16 + 16, 8), (" --normalization RMSNorm", 16 + 16, 4),
                                (" --group-query-attention --num-query-groups 4", 16 + 4, 8)):
        _, plan, plain = _priced(GPT + extra)
        run, _, qk = _priced(GPT + extra + " --qk-layernorm")
        per_layer = s_b * heads / 2 * (2 * 128 + stats)
        for i, (a, z) in enumerate(zip(qk.stages, plain.stages)):
            kept = a.inflight_microbatches * plan.stages[i].num_layers * per_layer
            assert a.activations_bytes - z.activations_bytes == pytest.approx(kept)
    mla = run.model.model_copy(update={"multi_latent_attention": True, "qk_layernorm": True})
    acts = activation_bytes_per_token(mla, run.training, is_moe=False, tp=2, etp=1, sequence_parallel=False)
    assert acts.qk_norm == 0.0


def test_fit_check_is_on_the_reserved_peak_and_the_search_agrees():
    """A headroom that leaves room for the allocated peak but not for the allocator's cache: the stage does not
    fit, and the search's test (held_static_bytes + in-flight x held_act_per_microbatch_bytes <= capacity_bytes)
    says the same as the evaluator's, on either side of the line."""
    run, plan, cost = _priced(GPT)
    st = max(cost.stages, key=lambda s: s.memory_bytes)
    dev = st.device_memory_bytes
    between = (st.allocated_bytes + st.other_bytes + st.memory_bytes) / 2  # above allocated + other, below reserved
    for usable, fits in ((between, False), (st.memory_bytes * 1.001, True)):
        _, _, c = _priced(GPT, headroom=1.0 - usable / dev)
        s = c.stages[st.index]
        assert s.fits is fits
        held = s.held_static_bytes + s.inflight_microbatches * s.held_act_per_microbatch_bytes
        assert held == pytest.approx(s.memory_bytes)
        assert (held <= s.capacity_bytes * (1 + 1e-12)) is fits


def test_the_memory_screen_is_the_evaluators_fit_check():
    """CostModel.fits (the stages' memory alone, which the baselines screen with) says what evaluate(plan).fits says,
    on the line too: usable memory a hair under, at and over the fullest stage's peak; its figures are the cores'."""
    profiles = ProfileSet.load()
    cluster = parse_cluster("H100:16", profiles)
    run = parse_megatron_flags(shlex.split(GPT), world_size=cluster.world_size)
    plan, _ = plan_from_run(run, cluster, profiles)
    cost = CostModel(run.model, run.training, cluster, profiles, memory_headroom=0.0).evaluate(plan)
    st = max(cost.stages, key=lambda s: s.memory_bytes)
    verdicts = set()
    for usable in (st.memory_bytes * (1 - 1e-15), st.memory_bytes, st.memory_bytes * (1 + 1e-15)):
        model = CostModel(run.model, run.training, cluster, profiles,
                          memory_headroom=1.0 - usable / st.device_memory_bytes)
        assert model.fits(plan) is model.evaluate(plan).fits
        verdicts.add(model.fits(plan))
    assert verdicts == {True, False}
    screen, priced = (CostModel(run.model, run.training, cluster, profiles) for _ in range(2))
    for i, (s, (start, end)) in enumerate(zip(plan.stages, plan.layer_ranges())):
        where = dict(device_type=s.device_type, start=start, end=end, dp=s.dp, recompute=s.recompute,
                     is_first=i == 0, is_last=i == plan.pp - 1)
        memory = screen.stage_memory(GlobalShape.of(plan), **where)
        core = priced.stage_core(GlobalShape.of(plan), **where)
        assert memory == StageMemory(**{k: getattr(core, k) for k in memory.__dataclass_fields__})


@pytest.mark.parametrize("line,expected", [
    ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", True),
    ("export PYTORCH_CUDA_ALLOC_CONF='max_split_size_mb:512,expandable_segments:True'", True),
    ("export PYTORCH_ALLOC_CONF=expandable_segments:False", False),
    ("export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512", False),
    ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # set, never exported: torchrun does not see it", None),
    ("", None),
])
def test_allocator_settings_are_read_from_the_script(tmp_path, line, expected):
    """The launcher script's environment, as the shell interpreter evaluates it: an exported allocator variable (or
    one given before the launcher word) sets the run's expandable_segments; one the script only assigns does not
    reach the training processes."""
    from planner.inputs.resolve import resolve_run

    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\n{line}\ntorchrun --nproc-per-node 8 pretrain_gpt.py {GPT}\n")
    run = resolve_run(megatron_script=str(script))
    assert run.training.expandable_segments is expected
    assert ("allocator" in {a.name for a in run.assumed}) is (expected is None)  # listed as assumed when unstated
    prefixed = tmp_path / "prefixed.sh"
    prefixed.write_text(f"#!/bin/bash\nPYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torchrun --nproc-per-node 8 "
                        f"pretrain_gpt.py {GPT}\n")
    assert resolve_run(megatron_script=str(prefixed)).training.expandable_segments is True


# ------------------------------------------------------------------------------ the reserved peak a long run records

MOE = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 4096 --max-position-embeddings 4096 "
       "--micro-batch-size 1 --global-batch-size 64 --vocab-size 32000 --bf16 --untie-embeddings-and-output-weights "
       "--num-experts 16 --moe-router-topk 2 --moe-ffn-hidden-size 1024 --expert-model-parallel-size 8 "
       "--moe-grouped-gemm --moe-aux-loss-coeff 1e-3 --use-distributed-optimizer")


@pytest.mark.parametrize("extra,vary", [
    ("", True),  # dropless aux-loss routing: expert buffers change size every micro-batch
    (" --moe-expert-capacity-factor 1.0", True),  # dropped below capacity: sizes still move
    (" --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity", False),
    (" --moe-router-force-load-balancing", False),
])
def test_recorded_reserved_peak_grows_into_free_memory_only_where_shapes_vary(extra, vary):
    """Where tensor sizes vary between micro-batches the recorded reserved peak is the needed one plus
    RECORDED_CACHE_SHARE of the device memory left to the allocator above it (never beyond the device less the
    memory outside the allocator); with fixed shapes, and for a dense model, it is the needed one.  The fit check
    is on the needed peak either way (the allocator releases its cache before it would run out)."""
    from planner.cost.memory import RECORDED_CACHE_SHARE, shapes_vary

    run, _, cost = _priced(MOE + extra, cluster="H100:8")
    _, _, fixed = _priced(MOE + " --moe-router-force-load-balancing", cluster="H100:8")
    assert shapes_vary(run.model) is vary
    for st, same in zip(cost.stages, fixed.stages):
        ceiling = st.device_memory_bytes - st.other_bytes
        share = RECORDED_CACHE_SHARE if vary else 0.0
        assert st.recorded_reserved_bytes == pytest.approx(st.reserved_bytes + share * (ceiling - st.reserved_bytes))
        assert st.reserved_bytes <= st.recorded_reserved_bytes <= ceiling
        assert st.memory_bytes == pytest.approx(st.reserved_bytes + st.other_bytes)  # the fit check: needed only
        assert st.to_json()["peak_reserved_recorded_gib"] * GIB_BYTES == pytest.approx(st.recorded_reserved_bytes)
    assert cost.to_json()["max_reserved_recorded_gib"] == pytest.approx(cost.max_reserved_recorded_gib)
    _, _, dense = _priced(GPT)
    assert all(st.recorded_reserved_bytes == st.reserved_bytes for st in dense.stages)
    from planner.output.report import memory_line
    said = memory_line(cost.to_json())
    assert (f"up to {cost.max_reserved_recorded_gib:.1f} GiB reserved" in said) is vary, said
    assert "up to" not in memory_line(dense.to_json())


def test_shipped_recorded_cache_share_is_the_fit(profiles):
    """RECORDED_CACHE_SHARE is what the measured reserved peaks of variable-shape runs give today (to 0.01), and
    each of them then lies between the needed reserved peak and the device memory left to the allocator."""
    from planner.calibration.memory import fit_recorded_cache_share
    from planner.cost.memory import RECORDED_CACHE_SHARE

    rows = memory_rows(profiles)
    fitted = fit_recorded_cache_share(rows)
    assert fitted is not None and RECORDED_CACHE_SHARE == pytest.approx(fitted, abs=0.005)
    for r in rows:
        if r.metric == "max_reserved_gib" and r.shapes_vary:
            assert r.predicted_reserved_gib <= r.measured_gib <= r.predicted_reserved_gib + r.free_gib, r.id



def test_shipped_unitemised_allocated_memory_is_the_fit_and_every_stage_carries_it(profiles):
    """UNITEMISED_ALLOCATED_GIB is what the measured allocated peaks give today (to 0.01 GiB); it is the same in
    every stage, inside the allocated peak (and so the reserved one) and named in the stage's JSON."""
    from planner.calibration.memory import fit_unitemised_gib
    from planner.cost.memory import UNITEMISED_ALLOCATED_GIB

    rows = memory_rows(profiles)
    fitted = fit_unitemised_gib(rows)
    assert fitted is not None and UNITEMISED_ALLOCATED_GIB == pytest.approx(fitted, abs=0.01)
    assert all(r.unitemised_gib == pytest.approx(UNITEMISED_ALLOCATED_GIB) for r in rows)
    run = parse_megatron_flags(shlex.split(
        "--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 "
        "--vocab-size 32000 --micro-batch-size 2 --global-batch-size 64 --pipeline-model-parallel-size 2 --bf16"),
        world_size=8)
    cluster = parse_cluster("H100:8", profiles)
    plan, _ = plan_from_run(run, cluster, profiles)
    for st in CostModel(run.model, run.training, cluster, profiles).evaluate(plan).stages:
        itemised = st.weights_bytes + st.grads_bytes + st.optimizer_bytes + st.activations_bytes
        assert st.allocated_bytes - itemised == pytest.approx(UNITEMISED_ALLOCATED_GIB * 2**30)
        assert st.to_json()["unitemised_gib"] == pytest.approx(UNITEMISED_ALLOCATED_GIB)

def test_leave_one_source_out_prices_reserved_rows_with_the_other_sources_share():
    """A row held out with its source is priced with the share fitted on the other sources' reserved rows of
    variable-shape runs (their median), or 0 when none is left, and with the unitemised allocated memory fitted on
    their allocated rows (the median of measured less itemised), or 0 when none is left: it adds to the needed peak
    and takes from the free memory the share applies to."""
    from helpers.cases import memory_row_stub
    from planner.calibration.memory import fit_recorded_cache_share, fit_unitemised_gib, loso_errors

    def row(id_, source, metric, measured, needed, free, vary=True):
        return memory_row_stub(id_, metric, measured, needed, source=source, free=free, vary=vary)

    a = row("a", "org/one x", "max_reserved_gib", 60.0, 40.0, 40.0)  # share 0.5
    b = row("b", "org/two y", "max_reserved_gib", 55.0, 40.0, 60.0)  # share 0.25
    c = row("c", "org/two z", "max_reserved_gib", 49.0, 40.0, 30.0, vary=False)  # fixed shapes: not fitted on
    d = row("d", "org/three", "max_allocated_gib", 50.0, 45.0, 30.0)  # 5 GiB above its itemised prediction
    assert fit_recorded_cache_share([a, b, c, d]) == pytest.approx(0.375)
    assert fit_unitemised_gib([a, b, c, d]) == pytest.approx(5.0) and fit_unitemised_gib([a, b, c]) is None
    held = loso_errors([a, b, c, d])
    assert held["a"] == pytest.approx(100 * (40.0 + 5.0 + 0.25 * (40.0 - 5.0) - 60.0) / 60.0)  # b's share, d's 5
    assert held["b"] == pytest.approx(100 * (40.0 + 5.0 + 0.5 * (60.0 - 5.0) - 55.0) / 55.0)  # a's share, d's 5
    assert held["c"] == pytest.approx(100 * (40.0 + 5.0 - 49.0) / 49.0)  # fixed shapes: the needed peak
    assert held["d"] == pytest.approx(d.error_pct)  # no other allocated row: nothing added
    assert loso_errors([a])["a"] == pytest.approx(100 * (40.0 - 60.0) / 60.0)  # nothing left to fit on
