"""Megatron flag parsing: values, passthrough, layouts, malformed input (planner/inputs/megatron_flags.py,
planner/megatron/layout.py)."""

from __future__ import annotations

import shlex

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import PlannerInputError
from planner.inputs.megatron_flags import parse_megatron_flags
from planner.megatron import flags as flag_table
from planner.megatron.flags import READ_FLAGS
from planner.schemas import ModelSpec, TrainingSpec
from planner.schemas.parallel import ParallelConfig
from planner.megatron.layout import format_layout, layout_stages, parse_layout
from helpers.switch_cases import BASE as SWITCH_BASE, SWITCH_CASES, WORLD as SWITCH_WORLD


BASE = [
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
    "--vocab-size", "1000", "--seq-length", "128", "--max-position-embeddings", "128",
    "--micro-batch-size", "1", "--global-batch-size", "8",
]  # fmt: skip


def run_of(*extra: str, base: list[str] | None = None, **kw):
    return parse_megatron_flags([*(BASE if base is None else base), *extra], **kw)


def measured_rows() -> list[dict[str, str]]:
    """The published runs: shipped with the planner, plus ../shared/calibration/ rows when present."""
    from planner.calibration.runs import load_runs

    return load_runs()


# ---------------------------------------------------------------- values


def test_shape_and_training_values_are_read():
    """Every model/training/parallel flag lands in the matching schema field."""
    r = run_of(
        "--ffn-hidden-size", "256", "--swiglu", "--normalization", "RMSNorm",
        "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--qk-layernorm",
        "--kv-channels", "32", "--make-vocab-size-divisible-by", "64",
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--context-parallel-size", "2", "--sequence-parallel", "--bf16",
        "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
    )  # fmt: skip
    m, t, p = r.model, r.training, r.parallel
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.vocab_size) == (4, 64, 4, 1000)
    assert (m.ffn_hidden_size, m.kv_channels, m.make_vocab_size_divisible_by) == (256, 32, 64)
    assert m.swiglu and m.normalization == "RMSNorm" and m.untie_embeddings_and_output_weights
    assert m.add_bias_linear is False and m.qk_layernorm
    assert (p.tp, p.pp, p.cp, p.sequence_parallel) == (2, 2, 2, True)
    assert (t.micro_batch_size, t.global_batch_size, t.precision) == (1, 8, "bf16")
    assert t.use_distributed_optimizer and t.overlap_grad_reduce and t.overlap_param_gather and t.tp_comm_overlap
    assert r.passthrough == ()


def test_equals_form_matches_space_form():
    """`--flag=value` and `--flag value` parse to the same run."""
    spaced = run_of("--tensor-model-parallel-size", "2", "--recompute-modules", "core_attn")
    eq = parse_megatron_flags(
        [f"{a}={b}" for a, b in zip(BASE[::2], BASE[1::2])]
        + ["--tensor-model-parallel-size=2", "--recompute-modules=core_attn"]
    )
    assert spaced == eq


def test_passthrough_keeps_unknown_flags_verbatim_in_order():
    """Unused flags and their values (nargs included) pass through unchanged and in order."""
    argv = [
        "--lr", "1e-4", "--num-layers", "4", "--data-path", "0.5", "/d/a", "0.5", "/d/b",
        "--hidden-size", "64", "--tokenizer-type", "NullTokenizer", "--no-persist-layer-norm",
        "--num-attention-heads", "4", "--min-lr=1e-5", "--vocab-size", "1000",
        "--global-batch-size", "8", "--init-method-std", "-1e-3", "--use-fused-rmsnorm",
    ]  # fmt: skip
    r = parse_megatron_flags(argv)
    assert r.passthrough == (
        "--lr", "1e-4", "--data-path", "0.5", "/d/a", "0.5", "/d/b", "--tokenizer-type",
        "NullTokenizer", "--no-persist-layer-norm", "--min-lr=1e-5", "--init-method-std", "-1e-3", "--use-fused-rmsnorm",
    )  # fmt: skip


@pytest.mark.parametrize(
    "flag, suggestion",
    [("--num-expert", "--num-experts"), ("--tensor-parallel-size", "--tensor-model-parallel-size"),
     ("--seq-len", None), ("--bogus-flag", None)],
)  # fmt: skip
def test_unknown_flags_are_refused_like_megatrons_parser(flag, suggestion):
    """A flag Megatron's parser does not know (abbreviations included) is an error naming it,
    with the closest known flag when there is one; a typo no longer plans a dense model."""
    with pytest.raises(PlannerInputError) as exc:
        run_of(flag, "8")
    assert exc.value.field == flag and "unknown flag" in str(exc.value)
    if suggestion:
        assert f"did you mean {suggestion}?" in str(exc.value)


def test_every_unknown_flag_is_named_at_once():
    """A fork's launcher (ROCm/Megatron-LM's examples/deepseek_v3/train_deepseekv3.sh) passes several flags upstream
    does not know: the refusal names the first, and the others after it, once each, so one run shows them all (it
    named one per run: five runs to find five); known flags and their values are not named."""
    with pytest.raises(PlannerInputError) as exc:
        run_of("--no-async-tensor-model-parallel-allreduce", "--bf16", "--legacy-tokenizer", "--attention-sink-k", "0",
               "--moe-router-topk=2", "--legacy-tokenizer", "--attention-sink-k=0")
    assert exc.value.field == "--no-async-tensor-model-parallel-allreduce"
    assert str(exc.value).endswith("; also unknown: --legacy-tokenizer, --attention-sink-k")


@pytest.mark.parametrize("argv, flag, words", [
    (["--batch-size", "4"], "--batch-size", "use --micro-batch-size"),
    (["--warmup", "10"], "--warmup", "use --lr-warmup-fraction"),
    (["--model-parallel-size", "2"], "--model-parallel-size", "use --tensor-model-parallel-size"),
    (["--checkpoint-activations"], "--checkpoint-activations", "use --recompute-activations"),
    (["--no-position-embedding"], "--no-position-embedding", "--position-embedding-type rope"),
])  # fmt: skip
def test_flags_megatrons_validation_refuses_are_refused_with_the_replacement(argv, flag, words):
    """Megatron's parser knows these, but validate_args stops on them (tests/test_megatron_validator.py runs
    Megatron on each): the reader refuses them as Megatron does, naming what to use instead."""
    with pytest.raises(PlannerInputError) as exc:
        run_of(*argv)
    assert exc.value.field == flag and words in str(exc.value)
    run_of("--position-embedding-type", "rope", "--no-position-embedding")  # NoPE as rope's absence: accepted


def test_bf16_main_grads_are_read_and_need_the_precision_aware_optimizer():
    """--main-grads-dtype bf16 halves the gradient buffer (test_cost_mechanisms.py); without
    --use-precision-aware-optimizer Megatron's OptimizerConfig stops the launch, and so does the reader."""
    run = run_of("--use-distributed-optimizer", "--use-precision-aware-optimizer", "--main-grads-dtype", "bf16")
    assert run.training.main_grads_dtype == "bf16"
    assert "--main-grads-dtype" in run.passthrough  # written back as given
    with pytest.raises(PlannerInputError) as exc:
        run_of("--main-grads-dtype", "bf16")
    assert "--main-grads-dtype" in exc.value.field and "precision-aware optimizer" in str(exc.value)


@pytest.mark.parametrize("flag, bad, good, words", SWITCH_CASES, ids=[c[0] for c in SWITCH_CASES])
def test_passed_through_switches_megatron_refuses_without_their_needs_are_refused(flag, bad, good, words):
    """A switch the planner does not read but passes to the launcher, without what Megatron needs beside it
    (tests/helpers/switch_cases.py; Megatron's own validator refuses and accepts the same lists in
    tests/test_megatron_validator.py): refused naming the switch, before anything is written; with it, accepted."""
    from planner.api import estimate, load_inputs

    def price(extra: str):
        argv = " ".join(SWITCH_BASE + extra.split())
        return estimate(load_inputs(megatron_args=argv, cluster=f"H100:{SWITCH_WORLD}"))

    with pytest.raises(PlannerInputError) as exc:
        price(bad)
    assert exc.value.field == flag and words in str(exc.value)
    if good is not None:
        assert price(good).cost.iteration_time_s > 0


def test_fork_flags_pass_through_and_are_listed_as_not_modelled():
    """MindSpeed (910B) and Pai-Megatron-Patch flags are accepted, kept, and named in the notes."""
    from planner.inputs.megatron_flags import parse_megatron_draft

    draft = parse_megatron_draft([*BASE, "--use-fused-swiglu", "--patch-tokenizer-type", "Qwen2Tokenizer",
                                  "--swap-attention", "--n-shared-experts", "2"])  # fmt: skip
    assert draft.passthrough[-6:] == ["--use-fused-swiglu", "--patch-tokenizer-type", "Qwen2Tokenizer",
                                      "--swap-attention", "--n-shared-experts", "2"]  # fmt: skip
    assert any(n.startswith("MindSpeed flags") and "--swap-attention" in n for n in draft.notes)
    assert any(n.startswith("Pai-Megatron-Patch flags") and "--patch-tokenizer-type" in n for n in draft.notes)


# Pai-Megatron-Patch's own flags, as its examples pass them (alibaba/Pai-Megatron-Patch@a098ca5a
# megatron_patch/arguments.py): switches and valued flags alike
_PAI_FLAGS = ["--cpu-offloading", "--optimizer-offload-policy", "auto", "--optimizer-offload-chunk-size", "0",
              "--moe-topk", "2", "--num-shared-experts", "1", "--disable-bias-linear-fc", "--use-normhead",
              "--special-tokens", "<image>", "<video>", "--top-k", "5", "--repetition_penalty", "1.1"]
_PAI_MOE = ["--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "512"]


def test_pai_megatron_patch_flags_pass_through_with_their_nargs():
    """Every flag of Pai's arguments.py that upstream lacks is accepted with its own nargs and named as Pai's; a
    switch refuses a value as Pai's parser does."""
    from planner.inputs.megatron_flags import fork_flags_in, known_flags, parse_megatron_draft

    draft = parse_megatron_draft([*BASE, *_PAI_FLAGS])
    assert draft.passthrough[-len(_PAI_FLAGS):] == _PAI_FLAGS
    forks = fork_flags_in(_PAI_FLAGS)
    assert forks["Pai-Megatron-Patch"] == ["--cpu-offloading", "--optimizer-offload-policy",
                                           "--optimizer-offload-chunk-size", "--moe-topk", "--num-shared-experts",
                                           "--disable-bias-linear-fc", "--use-normhead", "--special-tokens",
                                           "--repetition_penalty"]
    assert forks["MindSpeed-LLM, Pai-Megatron-Patch"] == ["--top-k"]
    assert any(n.startswith("Pai-Megatron-Patch flags") and "--moe-topk" in n for n in draft.notes)
    assert known_flags()["--valid-data"].nargs == "+"  # nargs="+" in Pai's parser
    with pytest.raises(PlannerInputError, match="takes no value"):
        run_of("--cpu-offloading=1")


def test_pai_enable_shared_expert_is_read_as_upstreams_gated_shared_expert():
    """Pai's --enable-shared-expert builds one shared expert of --shared-moe-ffn-hidden-size with a sigmoid gate:
    read as --moe-shared-expert-intermediate-size with --moe-shared-expert-gate; without the switch Pai builds none;
    upstream's own flag wins."""
    from planner.inputs.megatron_flags import parse_megatron_draft

    shared = ["--shared-moe-ffn-hidden-size", "2048"]
    model = parse_megatron_draft([*BASE, *_PAI_MOE, *shared, "--enable-shared-expert"]).model
    assert model["moe_shared_expert_intermediate_size"] == 2048 and model["moe_shared_expert_gate"] is True
    model = parse_megatron_draft([*BASE, *_PAI_MOE, *shared]).model
    assert model.get("moe_shared_expert_intermediate_size") is None and not model.get("moe_shared_expert_gate")
    model = parse_megatron_draft([*BASE, *_PAI_MOE, *shared, "--enable-shared-expert",
                                  "--moe-shared-expert-intermediate-size", "1024"]).model
    assert model["moe_shared_expert_intermediate_size"] == 1024
    with pytest.raises(PlannerInputError, match="needs --shared-moe-ffn-hidden-size"):
        parse_megatron_draft([*BASE, *_PAI_MOE, "--enable-shared-expert"])


def test_switches_take_no_values_and_valued_flags_need_one():
    """Megatron's nargs: a switch followed by a value is an error; a valued flag needs its value."""
    with pytest.raises(PlannerInputError, match="unexpected value"):
        run_of("--no-persist-layer-norm", "yes")
    with pytest.raises(PlannerInputError, match="expects a value"):
        run_of("--lr")


@pytest.mark.parametrize(
    "extra, vocab, how",
    [
        (["--tokenizer-type", "GPT2BPETokenizer"], 50257, "GPT2BPETokenizer"),
        (["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "/m/Meta-Llama-3-8B"], 128256, "llama-3"),
        (["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "deepseek-ai/DeepSeek-V3"], 129280, "deepseek-v3"),
        (["--padded-vocab-size", "50304", "--tokenizer-type", "GPT2BPETokenizer"], 50304, "--padded-vocab-size"),
        (["--tokenizer-type", "NullTokenizer"], 32000, "assumed"),
    ],
)  # fmt: skip
def test_vocabulary_is_inferred_when_not_given(extra, vocab, how):
    """No --vocab-size: a readable tokenizer, --padded-vocab-size, the tokenizer type or a known
    model name give it, else a stated default; the note says which."""
    from planner.inputs.megatron_flags import parse_megatron_draft

    argv = [a for a in BASE if True]
    k = argv.index("--vocab-size")
    del argv[k : k + 2]
    draft = parse_megatron_draft(argv + extra)
    assert draft.model["vocab_size"] == vocab
    assert any(n.startswith("--vocab-size not given") and how in n for n in draft.notes)


def test_vocabulary_from_a_readable_tokenizer_file(tmp_path):
    """A tokenizer.json next to --tokenizer-model is counted (vocab entries plus added tokens)."""
    from planner.inputs.megatron_flags import parse_megatron_draft

    tok = {"model": {"vocab": {f"t{i}": i for i in range(1000)}}, "added_tokens": [{"id": 1000}, {"id": 1001}, {"id": 5}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    argv = [a for a in BASE]
    k = argv.index("--vocab-size")
    del argv[k : k + 2]
    draft = parse_megatron_draft(argv + ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tmp_path)])
    assert draft.model["vocab_size"] == 1002


def test_last_occurrence_wins_like_argparse():
    """A repeated flag takes its last value (the CSV's long-context rows repeat --max-position-embeddings)."""
    r = run_of("--max-position-embeddings", "4096", "--seq-length", "4096")
    assert r.model.max_position_embeddings == 4096 and r.model.seq_length == 4096


def test_query_groups_need_group_query_attention():
    """--num-query-groups is ignored unless --group-query-attention is set; GQA alone means 1 group."""
    assert run_of("--num-query-groups", "2").model.query_groups == 4
    assert run_of("--group-query-attention", "--num-query-groups", "2").model.query_groups == 2
    assert run_of("--group-query-attention").model.query_groups == 1


def test_moe_flags():
    """MoE flags: experts, top-k, sizes, layer pattern, capacity, dispatcher; 0 experts = dense."""
    r = run_of(
        "--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "96",
        "--moe-shared-expert-intermediate-size", "128", "--moe-layer-freq", "([0]+[1]*3)",
        "--moe-expert-capacity-factor", "1.25", "--moe-token-dispatcher-type", "alltoall",
        "--moe-grouped-gemm", "--moe-router-force-load-balancing", "--mtp-num-layers", "1",
        "--disable-bias-linear", "--position-embedding-type", "rope",
    )  # fmt: skip
    m = r.model
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size) == (8, 2, 96)
    assert m.moe_shared_expert_intermediate_size == 128
    assert m.layer_is_moe == (False, True, True, True)
    assert m.moe_expert_capacity_factor == 1.25 and m.moe_token_dispatcher_type == "alltoall"
    assert m.moe_grouped_gemm and m.moe_router_force_load_balancing and m.mtp_num_layers == 1
    assert run_of("--num-experts", "4", "--moe-layer-freq", "2").model.layer_is_moe == (True, False, True, False)
    assert run_of("--num-experts", "0").model.is_moe is False
    assert run_of("--num-experts", "4", "--moe-expert-capacity-factor", "-1").model.moe_expert_capacity_factor is None


def test_mla_flags():
    """Multi-latent attention ranks and head dims are read."""
    m = run_of(
        "--multi-latent-attention", "--q-lora-rank", "96", "--kv-lora-rank", "32",
        "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16",
    ).model  # fmt: skip
    assert m.multi_latent_attention
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim) == (96, 32, 16, 8, 16)


def test_precision():
    """--bf16/--fp16/--fp8-format choose the precision; none is fp32; bf16+fp16 is refused."""
    assert run_of("--fp16").training.precision == "fp16"
    assert run_of("--bf16", "--fp8-format", "hybrid").training.precision == "fp8"
    assert run_of().training.precision == "fp32"
    with pytest.raises(PlannerInputError, match="--bf16/--fp16"):
        run_of("--bf16", "--fp16")


def test_recompute_flags():
    """Recompute flags map to Recompute; --recompute-activations means selective."""
    r = run_of("--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe_act",
               "--lr", "1")
    assert r.parallel.recompute.granularity == "selective"
    assert r.parallel.recompute.modules == ("layernorm", "moe_act")
    assert r.passthrough == ("--lr", "1")  # nargs+ stops at the next flag
    full = run_of("--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "2")
    assert full.parallel.recompute.label == "full:block:2"
    assert run_of("--recompute-activations").parallel.recompute.granularity == "selective"
    assert run_of().parallel.recompute.granularity == "none"
    with pytest.raises(PlannerInputError, match="--recompute-method"):
        run_of("--recompute-granularity", "full", "--recompute-num-layers", "1")
    with pytest.raises(PlannerInputError, match="--recompute-num-layers"):
        run_of("--recompute-granularity", "selective", "--recompute-num-layers", "1")
    with pytest.raises(PlannerInputError, match="--recompute-modules"):
        run_of("--recompute-granularity", "selective", "--recompute-modules", "everything")


def test_sequence_parallel_off_at_tp1():
    """Megatron switches sequence parallelism off when TP is 1."""
    assert run_of("--sequence-parallel").parallel.sequence_parallel is False


def test_global_batch_default_needs_world_size():
    """Without --global-batch-size the default mbs*DP needs a world size; with one it is derived."""
    base = BASE[:-2]
    with pytest.raises(PlannerInputError, match="--global-batch-size"):
        parse_megatron_flags(base)
    r = parse_megatron_flags(
        [*base, "--micro-batch-size", "2", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"],
        world_size=16,
    )
    assert r.training.global_batch_size == 2 * 4  # mbs 2 x DP (16 / (2*2))
    with pytest.raises(PlannerInputError, match="world size"):
        parse_megatron_flags([*base, "--tensor-model-parallel-size", "4"], world_size=6)


# ---------------------------------------------------------------- layouts


def test_every_measured_run_parses():
    """Every megatron_args row of shared/calibration/measured_runs.csv parses (Megatron accepted them)."""
    rows = measured_rows()
    assert rows
    for row in rows:
        r = parse_megatron_flags(shlex.split(row["megatron_args"]))
        assert sum(r.parallel.stage_layers(r.model.num_layers)) == r.model.num_layers, row["id"]


def test_measured_qwen3_layouts():
    """The CSV's layouts give the stage split their grammar spells out."""
    rows = {r["megatron_args"] for r in measured_rows()}
    by_layout = {}
    for args in rows:
        r = parse_megatron_flags(shlex.split(args))
        if r.parallel.layout is not None:
            by_layout[(r.parallel.pp, tuple(stage.count("t") for stage in r.parallel.layout))] = r
    one_per = (0,) + (1,) * 94 + (0,)
    assert (32, one_per) in by_layout  # E|(t|)*94L at PP 32: 96 virtual stages, VPP 3
    r = by_layout[(32, one_per)]
    assert r.parallel.virtual_size(94) == 3
    assert r.parallel.stage_layers(94)[:2] == [2, 3] and r.parallel.stage_layers(94)[-1] == 2
    split = (2,) + (3,) * 30 + (2,)
    assert (8, split) in by_layout  # Et*2|(t*3|)*30t*2L at PP 8: VPP 4
    assert by_layout[(8, split)].parallel.stage_layers(94) == [11, 12, 12, 12, 12, 12, 12, 11]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Ettt|(tt|)*29,m|L", [3] + [2] * 29 + [0, 0]),  # megatron.md 1.2 (from the source)
        ("E|(t|)*3,m|m||L", [0, 1, 1, 1, 0, 0, 0, 0]),
        ("Et*3|(tt|)*29,m|L", [3] + [2] * 29 + [0, 0]),  # docs' DeepSeek-V3 example
        ("E||t|L", [0, 0, 1, 0]),  # empty stages are allowed
        ("E|(t|)*94L", [0] + [1] * 94 + [0]),
        ("Et*2|(t*3|)*30t*2L", [2] + [3] * 30 + [2]),
        ("EtL", [1]),
    ],
)
def test_parse_layout_examples(text, expected):
    """Layout strings from megatron.md and the CSV expand to the right decoder layers per stage."""
    assert parse_layout(text) == expected


def test_deepseek_layout_in_flags():
    """Docs example: 61 layers + 1 MTP, PP16, layout Et*3|(tt|)*29,m|L: rank 0 holds 3+2, rank 14/15 hold 2."""
    r = parse_megatron_flags([
        "--num-layers", "61", "--hidden-size", "64", "--num-attention-heads", "4", "--vocab-size", "100",
        "--global-batch-size", "32", "--mtp-num-layers", "1", "--pipeline-model-parallel-size", "16",
        "--pipeline-model-parallel-layout", "Et*3|(tt|)*29,m|L", "--position-embedding-type", "rope",
    ])  # fmt: skip
    per_rank = r.parallel.stage_layers(61)
    assert per_rank[0] == 5 and per_rank[1:14] == [4] * 13 and per_rank[14:] == [2, 2]
    assert r.parallel.virtual_size(61) == 2


def test_format_layout_matches_hand_written_strings():
    """format_layout writes the compact forms used in the CSV (written against Megatron's validator),
    and gives a user's layout back as Megatron reads it: empty stages, E-only and L-only stages and a
    standalone MTP stage stay where they were."""
    assert format_layout([0] + [1] * 94 + [0]) == "E|(t|)*94L"
    for text in ("E|(t|)*94L", "Et*3|(tt|)*29,m|L", "|Et*4|t*4|L", "E|t*8|mL|", "E|||t*8|L"):
        assert layout_stages(format_layout(layout_stages(text))) == layout_stages(text)
    assert format_layout([5]) == "Et*5L"
    assert format_layout([1, 1]) == "Et|tL"
    assert format_layout([3, 2, 2, 0], mtp_num_layers=1) == "Ettt|tt|tt|mL"
    assert layout_stages(format_layout([2] + [3] * 30 + [2]))[1] == "ttt"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=40), st.integers(0, 2))
def test_format_parse_roundtrip(counts, mtp):
    """parse_layout(format_layout(x)) == x for any non-negative counts; m's land in the last stage."""
    text = format_layout(counts, mtp_num_layers=mtp)
    assert parse_layout(text) == counts
    stages = layout_stages(text)
    assert stages[-1].count("m") == mtp and stages[0].startswith("E") and stages[-1].endswith("L")
    assert format_layout(stages) == text


@pytest.mark.parametrize(
    "text, words",
    [
        ("E|x|L", "Invalid layer character: x"),
        ("E t|L", "Invalid layer character:  "),
        ("E|t(", "Invalid layer character: \\("),
        ("", "expected a layout"),
        ("E|t*999999|L", "more than"),
        ("E|t*99999999|L", "too large"),
    ],
)
def test_bad_layouts(text, words):
    """Layouts Megatron's parser refuses raise PlannerInputError naming the flag, in Megatron's words."""
    with pytest.raises(PlannerInputError, match=words) as exc:
        parse_layout(text)
    assert exc.value.field == "--pipeline-model-parallel-layout"


def test_layout_consistency_with_other_flags():
    """Layout must match --num-layers, --mtp-num-layers and PP, and excludes the other split flags."""
    lay = ["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout"]
    assert run_of(*lay, "Ett|ttL").parallel.layout == ("Ett", "ttL")
    assert run_of(*lay, "|Ett|tt|L").parallel.layout == ("", "Ett", "tt", "L")  # E, L are markers (probe L1)
    for extra, words in [
        (("Ett|tL",), "Number of decoder layers 3must match num_layers 4"),
        (("Ett|t|tL",), "must be divisible by pipeline_model_parallel_size .num_stages=3, args.pipeline_model_"),
        (("Ett|ttmL",), "Number of mtp layers in layout must match mtp_num_layers"),
        (("t|E|tt|tL",), "The first layer must be embedding, but got LayerType.decoder"),
        (("E|L|tt|tt",), "The last layer must be loss, but got LayerType.decoder"),
        (("E|t|E|tttL",), "The first layer|Embedding must be specified exactly once"),
        (("Ett|ttL", "--decoder-first-pipeline-num-layers", "2"), "cannot be set with other pipeline layout"),
        (("Ett|ttL", "--num-virtual-stages-per-pipeline-rank", "2"), "No more than one"),
    ]:
        with pytest.raises(PlannerInputError, match=words):
            run_of(*lay, *extra)


def test_virtual_and_uneven_pipeline_flags():
    """VPP flags and first/last-stage flags follow Megatron's divisibility rules."""
    r = run_of("--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1")
    assert r.parallel.virtual_size(4) == 2
    r = run_of("--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2")
    assert r.parallel.vpp == 2
    with pytest.raises(PlannerInputError, match="divisible"):
        run_of("--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "4")
    with pytest.raises(PlannerInputError, match="greater than 1"):
        run_of("--num-virtual-stages-per-pipeline-rank", "2")
    base6 = ["--num-layers", "6", *BASE[2:]]
    r = parse_megatron_flags([*base6, "--pipeline-model-parallel-size", "3",
                              "--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers", "1"])
    assert r.parallel.stage_layers(6) == [2, 3, 1]
    with pytest.raises(PlannerInputError, match="middle stage: 5 must be divisible"):
        parse_megatron_flags([*base6, "--pipeline-model-parallel-size", "3", "--decoder-first-pipeline-num-layers", "1"])
    with pytest.raises(PlannerInputError, match="last stage: 1must be divisible by virtual"):
        parse_megatron_flags([*base6, "--pipeline-model-parallel-size", "3", "--decoder-first-pipeline-num-layers", "2",
                              "--decoder-last-pipeline-num-layers", "1", "--num-virtual-stages-per-pipeline-rank", "2"])
    with pytest.raises(PlannerInputError):
        parse_megatron_flags([*base6, "--pipeline-model-parallel-size", "4"])
    r = parse_megatron_flags([*base6, "--pipeline-model-parallel-size", "4",
                              "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"])
    assert r.parallel.stage_layers(6) == [1, 2, 2, 1]


# ---------------------------------------------------------------- malformed input


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--num-layers", "abc"], "--num-layers"),
        (["--num-layers"], "--num-layers"),
        (["--num-layers", "--hidden-size", "64"], "--num-layers"),
        (["--num-layers", "0"], "--num-layers"),
        (["--normalization", "BatchNorm"], "--normalization"),
        (["--moe-token-dispatcher-type", "magic"], "--moe-token-dispatcher-type"),
        (["--bf16=yes"], "--bf16"),
        (["--bf16", "stray"], "--bf16"),
        (["--recompute-modules"], "--recompute-modules"),
        (["--moe-expert-capacity-factor", "nan"], "--moe-expert-capacity-factor"),
        (["--num-experts", "4", "--moe-layer-freq", "[1]*3"], "--moe-layer-freq"),
        (["--num-experts", "4", "--moe-layer-freq", "[1, 1, 1, 1]"], "--moe-layer-freq"),
        (["--tensor-model-parallel-size", "3"], "--tensor-model-parallel-size"),
        (["--expert-model-parallel-size", "2"], "--expert-model-parallel-size"),
        (["--num-experts", "6", "--expert-model-parallel-size", "4"], "--expert-model-parallel-size"),
        (["--num-experts", "4", "--tensor-model-parallel-size", "2"], "--disable-bias-linear"),
        (["--overlap-param-gather"], "--overlap-param-gather"),
        (["--seq-length", "256"], "--max-position-embeddings"),
        (["--context-parallel-size", "3"], "--context-parallel-size"),
    ],
)
def test_malformed_values_name_the_flag(argv, field):
    """Bad values raise PlannerInputError whose field is the offending flag."""
    with pytest.raises(PlannerInputError) as exc:
        run_of(*argv)
    assert field in exc.value.field


def test_missing_required_flags_are_named_together():
    """All missing shape flags are listed in one error; a missing vocabulary is named too."""
    with pytest.raises(PlannerInputError) as exc:
        parse_megatron_flags(["--hidden-size", "64", "--lr", "1"])
    assert "--num-layers" in exc.value.field and "--num-attention-heads" in exc.value.field
    assert "--hidden-size" not in exc.value.field
    run = parse_megatron_flags(["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                "--global-batch-size", "8"])  # fmt: skip
    assert run.model.vocab_size == 32000  # no tokenizer to read: the stated default


def test_positional_before_flags_is_refused():
    """A bare value before any flag is an error, not silently dropped."""
    with pytest.raises(PlannerInputError, match="positional"):
        parse_megatron_flags(["pretrain_gpt.py", *BASE])


def test_flag_table_has_one_row_per_flag_and_names_real_fields():
    """planner/megatron/flags.py: one row per flag, one flag per reader dest, every field one of its
    section's spec, every rule's flag a row."""
    names = [f.name for f in flag_table.TABLE]
    assert len(names) == len(set(names))
    dests = [spec.dest for spec in READ_FLAGS.values()]
    assert len(dests) == len(set(dests))
    for section, spec in ((flag_table.MODEL_FLAGS, ModelSpec), (flag_table.TRAINING_FLAGS, TrainingSpec),
                          (flag_table.PARALLEL_FLAGS, ParallelConfig), (flag_table.OTHER_FLAGS, None)):
        for f in section:
            assert not f.field or (spec is not None and f.field in spec.model_fields), f.name
    assert all(name in flag_table.BY_NAME for behind in flag_table.RULE_FLAGS.values() for name in behind)


_KNOWN = sorted(READ_FLAGS)
_VALUES = st.one_of(
    st.sampled_from(["1", "2", "0", "-1", "8", "abc", "", "1.5", "E|t|L", "Ett|ttL", "([0]+[1]*3)", "RMSNorm",
                     "full", "selective", "uniform", "block", "core_attn", "alltoall", "hybrid", "nan", "1e9"]),
    st.text(max_size=6),
)
_TOKEN = st.one_of(
    st.sampled_from(_KNOWN),
    st.sampled_from(["--lr", "--data-path", "-x", "--", "--foo=bar"]),
    st.builds(lambda f, v: f"{f}={v}", st.sampled_from(_KNOWN), _VALUES),
    _VALUES,
)


_PAIR = st.tuples(st.sampled_from(_KNOWN), _VALUES).map(list)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_TOKEN.map(lambda t: [t]), _PAIR), max_size=20), st.booleans())
def test_random_flag_lists_raise_only_planner_input_errors(chunks, with_base):
    """Arbitrary token lists either parse or raise PlannerInputError, never another exception."""
    argv = (BASE if with_base else []) + [tok for chunk in chunks for tok in chunk]
    try:
        run = parse_megatron_flags(argv)
    except PlannerInputError as exc:
        assert exc.field  # names something
    else:
        assert run.model.num_layers > 0


_LAYOUT_TEXT = st.text(alphabet="EtmL|()*,0123456789x ", max_size=40)


@settings(max_examples=300, deadline=None)
@given(_LAYOUT_TEXT)
def test_random_layout_text_raises_only_planner_input_errors(text):
    """Arbitrary layout-like text either parses (into stages of Megatron's four symbols) or raises
    PlannerInputError naming the flag."""
    try:
        stages = layout_stages(text)
    except PlannerInputError as exc:
        assert exc.field == "--pipeline-model-parallel-layout"
    else:
        assert set("".join(stages)) <= set("EtmL")
        if stages != [""]:  # an empty layout has no text of its own
            assert layout_stages(format_layout(stages)) == stages


@pytest.mark.parametrize(
    "expr", ["[1]*9**99", "([1]*1000)*1000*1000", "[1]*" + "9" * 5000, "(1)+[1]", "[[1]]*4", "[0]*2+[1]*2 "]
)
def test_hostile_moe_layer_freq_is_refused_quickly(expr):
    """List expressions that would explode or are not 0/1 lists are refused without evaluating them."""
    with pytest.raises(PlannerInputError) as exc:
        run_of("--num-experts", "4", "--moe-layer-freq", expr)
    assert exc.value.field == "--moe-layer-freq"


@pytest.mark.parametrize("freq, first_dense, pattern", [
    ("-1", None, None), ("-2", None, (1, 0, 1, 0)), ("-1", "-1", None), ("1", "-1", None), ("-1", "1", (0, 1, 1, 1)),
])
def test_negative_moe_layer_freq_and_first_dense_read_as_megatron_computes_them(freq, first_dense, pattern):
    """Megatron makes layer i MoE when i % moe_layer_freq == 0 (Python's %: -N picks what N does) and MindSpeed-LLM
    when also i >= first_k_dense_replace: its examples' `--moe-layer-freq -1 --first-k-dense-replace -1` is every
    layer MoE (Ascend/MindSpeed-LLM@c77308a1 mindspeed_llm/core/transformer/transformer_block.py)."""
    extra = ["--first-k-dense-replace", first_dense] if first_dense is not None else []
    assert run_of("--num-experts", "4", "--moe-layer-freq", freq, *extra).model.moe_layer_pattern == pattern


def test_zero_moe_layer_freq_is_refused():
    """Megatron divides by --moe-layer-freq: 0 is refused, naming the flag."""
    with pytest.raises(PlannerInputError, match="must not be 0") as exc:
        run_of("--num-experts", "4", "--moe-layer-freq", "0")
    assert exc.value.field == "--moe-layer-freq"


def test_mindspeed_num_layer_list_is_read_as_the_layout_it_stands_for():
    """MindSpeed-LLM's --num-layer-list (one layer count per pipeline stage) is the run's split, MTP and loss after the
    last stage's layers; it and an upstream split together, or text that is no count list, are refused by name."""
    base = ["--num-layers", "5", *BASE[2:], "--pipeline-model-parallel-size", "2"]
    run = run_of("--num-layer-list", "3,2", "--mtp-num-layers", "1", "--position-embedding-type", "rope", base=base)
    assert run.parallel.layout == ("Ettt", "ttmL")
    for extra, match in ((["--num-layer-list", "3,2", "--decoder-first-pipeline-num-layers", "3"], "not both"),
                         (["--num-layer-list", "3;2"], "one layer count per pipeline stage")):
        with pytest.raises(PlannerInputError, match=match) as exc:
            run_of(*extra, base=base)
        assert exc.value.field == "--num-layer-list"


def test_huge_counts_are_refused():
    """Layer and stage counts far beyond any model are refused before anything is allocated."""
    with pytest.raises(PlannerInputError, match="--pipeline-model-parallel-size"):
        run_of("--pipeline-model-parallel-size", "99999999999")
    with pytest.raises(PlannerInputError, match="--num-layers"):
        parse_megatron_flags(["--num-layers", "1" * 5000, *BASE[2:]])
    with pytest.raises(PlannerInputError, match="too large"):
        parse_layout("E|t*" + "9" * 5000 + "|L")


def test_vpp_counts_the_accounted_embedding_and_loss_as_layers():
    """Qwen3-235B on 256 GPUs, TP2 PP8 VPP4 with --account-for-embedding/loss-in-pipeline-split:
    Megatron counts the embedding and the loss as layers, (94 + 2) / 8 = 12 per rank, which VPP 4
    divides (transformer_config.py, megatron-core 0.19).  Without the flags, 94 / 8 does not split."""
    base = ["--num-layers", "94", "--hidden-size", "4096", "--num-attention-heads", "64", "--group-query-attention",
            "--num-query-groups", "4", "--vocab-size", "151936", "--seq-length", "4096", "--max-position-embeddings",
            "4096", "--global-batch-size", "1024", "--tensor-model-parallel-size", "2",
            "--pipeline-model-parallel-size", "8", "--num-virtual-stages-per-pipeline-rank", "4"]  # fmt: skip
    run = parse_megatron_flags(base + ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"])
    assert run.parallel.stage_layers(94) == [11] + [12] * 6 + [11] and run.parallel.vpp == 4
    with pytest.raises(PlannerInputError, match="num_layers=94 should be divisible"):  # the model build's assert
        parse_megatron_flags(base)
    with pytest.raises(PlannerInputError, match=r"each pipeline rank: 12\(after enable .* byvirtual_pipeline_model_parallel_size5"):
        parse_megatron_flags(base[:-1] + ["5", "--account-for-embedding-in-pipeline-split",
                                          "--account-for-loss-in-pipeline-split"])


def test_allow_invalid_keeps_megatrons_refusal_as_a_note():
    """Degrees Megatron would refuse raise by default; allow_invalid turns them into notes."""
    from planner.inputs.megatron_flags import build_run, parse_megatron_draft

    argv = [*BASE, "--tensor-model-parallel-size", "3"]
    with pytest.raises(PlannerInputError, match=r"num_attention_heads \(4\) must be a multiple of tensor_model_parallel_size \(3\)"):
        parse_megatron_flags(argv)
    draft = parse_megatron_draft(argv)
    run = build_run(draft, allow_invalid=True)
    assert run.parallel.tp == 3 and any("heads_tp" in n for n in draft.notes)
