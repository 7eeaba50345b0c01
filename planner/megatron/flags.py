"""Megatron-LM's flags: the one table that maps them to the planner's fields, and back.

One row (`Flag`) per flag the planner knows, saying
  * how the flag reader takes it (`read`: argparse dest, kind, choices, range; None: the flag is
    not read and passes through verbatim), planner/inputs/megatron_flags.py;
  * the spec field it sets (`field`, a field of ModelSpec, TrainingSpec or ParallelConfig after the
    section it sits in), copied as read unless `derived` (the reader converts it:
    `draft_from_namespace`);
  * whether the plan decides it (`decided`: the launcher removes it from the user's flags and
    writes it from the plan), and the CLI option that overrides it (`override`, `--tp`);
  * the bash array of launch.sh it goes to (`array`; empty: by its prefix, `array_of`);
  * how the launcher writes it back from the spec (`write`; None: not written, e.g. observed flags,
    which pass through as the user gave them);
  * what it changes that the cost model does not price (`not_modelled`), named beside every
    prediction (`unmodelled_notes`).
`RULE_FLAGS` names the flags behind each rule of planner/megatron/rules.py.

A flag that changes the cost: add its row here (read, field, write), its field to the spec, and
price the field in planner/cost/.  Nothing here imports the reader or the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from planner.schemas.model import ModelSpec
from planner.schemas.parallel import ParallelConfig
from planner.schemas.training import MegatronSettings, TrainingSpec

MAX_COUNT = 100_000  # layers / pipeline stages: far above any real model, keeps per-layer lists small
MAX_SIZE = 1 << 40

LAYOUT_FLAG = "--pipeline-model-parallel-layout"
VPP_FLAG = "--num-virtual-stages-per-pipeline-rank"
LAYERS_PER_VIRTUAL_STAGE_FLAG = "--num-layers-per-virtual-pipeline-stage"

# launch.sh's bash arrays (concerns), in the order Megatron's examples write them
MODEL_ARGS, MOE_ARGS, DATA_ARGS = "MODEL_ARGS", "MOE_ARGS", "DATA_ARGS"
TRAINING_ARGS, PARALLEL_ARGS = "TRAINING_ARGS", "MODEL_PARALLEL_ARGS"
LOGGING_ARGS, OTHER_ARGS = "EVAL_AND_LOGGING_ARGS", "OTHER_ARGS"
CONCERN_ORDER = (MODEL_ARGS, MOE_ARGS, DATA_ARGS, TRAINING_ARGS, PARALLEL_ARGS, LOGGING_ARGS, OTHER_ARGS)


@dataclass(frozen=True)
class Read:
    """How the reader takes a flag: its argparse dest and kind (int | float | floats | str | true |
    false | list), the allowed choices and range.

    `observe`: the planner reads the value (it changes time or memory) but never decides it, so the
    user's own tokens also stay in `passthrough`, verbatim, and reach the launcher unchanged."""

    dest: str
    kind: str
    choices: tuple[str, ...] = ()
    min_value: float | None = None
    max_value: float | None = None
    observe: bool = False
    exclusive_min: bool = False  # a float must lie strictly above min_value
    fork_choices: tuple["ForkChoice", ...] = ()


@dataclass(frozen=True)
class ForkChoice:
    """A value a fork of Megatron-LM adds to a flag's choices: which fork, the upstream value the cost
    model prices it as, and what that leaves out (named beside the prediction)."""

    value: str
    fork: str
    priced_as: str
    why: str


# write(value of the row's field (None without one), the spec) -> the flag's values ([] for a
# switch), or None: the flag is not written
Writer = Callable[[Any, Any], "list[Any] | None"]


@dataclass(frozen=True)
class Flag:
    """One row of the table: the flag's `name`; how it is `read` (None: passes through unread); the
    `field` of its section's spec it sets, copied unless `derived`; whether the plan `decided`s it
    (the launchers write those from the plan); its launch.sh `array`; the CLI `override` that sets
    it; how the launcher `write`s it from the spec; what it changes that is `not_modelled`, and the cost model's
    mechanisms whose time that changes (`unpriced_in`: where no calibration run had the flag, a plan with it is
    outside the measured region there, planner/cost/mechanisms.py)."""

    name: str
    read: Read | None = None
    field: str = ""
    derived: bool = False
    decided: bool = False
    array: str = ""
    override: str = ""
    write: Writer | None = None
    not_modelled: str = ""
    unpriced_in: tuple[str, ...] = ()  # the mechanisms (planner/cost/mechanisms.py) whose time it changes unpriced


# -- how a flag is read ---------------------------------------------------------------------------
def _int(min_value: int = 1, max_value: int = MAX_SIZE, observe: bool = False) -> Read:
    return Read("", "int", min_value=min_value, max_value=max_value, observe=observe)


def _str(*choices: str, observe: bool = False, forks: tuple[ForkChoice, ...] = ()) -> Read:
    return Read("", "str", choices=choices, observe=observe, fork_choices=forks)


def _float(min_value: float | None = 0.0, max_value: float | None = None) -> Read:
    """A finite float above `min_value` (None: any), at most `max_value`."""
    return Read("", "float", min_value=min_value, max_value=max_value, exclusive_min=min_value is not None)


def _list(*choices: str, observe: bool = False, forks: tuple[ForkChoice, ...] = ()) -> Read:
    return Read("", "list", choices=choices, observe=observe, fork_choices=forks)


# values the forks add to upstream's choices (MindSpeed / MindSpeed-LLM parsers, Ascend/MindSpeed-LLM@c77308a1)
_FORK_DISPATCHERS = (
    ForkChoice("alltoall_seq", "MindSpeed", "alltoall", "the older all-to-all dispatcher over the sequence dim"),)
_FORK_BALANCING = tuple(ForkChoice(v, "MindSpeed-LLM", "aux_loss", why) for v, why in (
    ("pai_megatron_aux_loss", "Pai-Megatron's auxiliary loss"),
    ("group_limited_greedy", "DeepSeek-V2's group-limited routing"),
    ("softmax_topk", "a plain softmax top-k router"),
    ("sparsemixer_topk", "SparseMixer routing")))
_FORK_POSITIONS = (ForkChoice("alibi", "MindSpeed", "none", "ALiBi attention biases: no position parameters"),)


_TRUE = Read("", "true")
_SEEN = Read("", "true", observe=True)  # an observed switch


# -- how a flag is written back -------------------------------------------------------------------
def _value(unless: Any = None, when: Callable[[Any], bool] | None = None) -> Writer:
    """The field's value, unless it is None or `unless` (Megatron's default), or `when` is false."""
    return lambda v, spec: None if v is None or v == unless or (when and not when(spec)) else [v]


def _switch(on: bool = True, when: Callable[[Any], bool] | None = None) -> Writer:
    """A switch, given when the field is `on` (and `when` holds)."""
    return lambda v, spec: [] if bool(v) is on and not (when and not when(spec)) else None


def _moe(model: ModelSpec) -> bool:
    return model.is_moe


def _mla(model: ModelSpec) -> bool:
    return model.multi_latent_attention


def moe_layer_freq_text(pattern: Sequence[int]) -> str:
    """--moe-layer-freq as a list expression with runs compressed, e.g. ([0]*3+[1]*21); only the
    characters Megatron allows (,digits[]()+*)."""
    runs: list[tuple[int, int]] = []
    for v in pattern:
        if runs and runs[-1][0] == v:
            runs[-1] = (v, runs[-1][1] + 1)
        else:
            runs.append((v, 1))
    return "(" + "+".join(f"[{v}]*{n}" for v, n in runs) + ")"


def _precision(*precisions: str, values: tuple[str, ...] = ()) -> Writer:
    return lambda p, _: list(values) if p in precisions else None


def _rows(*flags: Flag) -> tuple[Flag, ...]:
    """A section of the table, each read flag with its argparse dest (by default the flag's name, as
    argparse spells dests)."""
    return tuple(replace(f, read=replace(f.read, dest=f.name.removeprefix("--").replace("-", "_")))
                 if f.read is not None and not f.read.dest else f for f in flags)


# --------------------------------------------------------------------------------------------------
# The table.  Each section in the order the launcher writes its flags; `field` names a field of the
# section's spec.
# --------------------------------------------------------------------------------------------------
MODEL_FLAGS = _rows(  # ModelSpec (reference/megatron.md 1.7): every field is written back
    Flag("--num-layers", _int(1, MAX_COUNT), "num_layers", array=MODEL_ARGS, write=_value()),
    Flag("--hidden-size", _int(), "hidden_size", array=MODEL_ARGS, write=_value()),
    Flag("--ffn-hidden-size", _int(), "ffn_hidden_size", array=MODEL_ARGS, write=_value()),
    Flag("--num-attention-heads", _int(), "num_attention_heads", array=MODEL_ARGS, write=_value()),
    Flag("--group-query-attention", _TRUE, array=MODEL_ARGS,  # turns --num-query-groups on
         write=lambda _, m: [] if m.num_query_groups is not None else None),
    Flag("--num-query-groups", _int(), "num_query_groups", derived=True, array=MODEL_ARGS, write=_value()),
    Flag("--kv-channels", _int(), "kv_channels", array=MODEL_ARGS, write=_value()),
    Flag("--seq-length", _int(), "seq_length", array=MODEL_ARGS, override="seq", write=_value()),
    Flag("--max-position-embeddings", _int(), "max_position_embeddings", array=MODEL_ARGS,
         write=lambda v, m: [v or m.seq_length]),
    Flag("--vocab-size", _int(), "vocab_size", array=DATA_ARGS, write=_value()),
    Flag("--make-vocab-size-divisible-by", _int(), "make_vocab_size_divisible_by", array=MODEL_ARGS,
         write=_value(unless=128)),
    # positions
    Flag("--position-embedding-type",
         _str("learned_absolute", "rope", "yarn", "mrope", "relative", "none", forks=_FORK_POSITIONS),
         "position_embedding_type", derived=True, array=MODEL_ARGS, write=_value(unless="learned_absolute")),
    Flag("--use-rotary-position-embeddings", _SEEN, "position_embedding_type", derived=True,
         array=MODEL_ARGS),  # the older spelling of --position-embedding-type rope
    Flag("--rotary-base", _int(), "rotary_base", array=MODEL_ARGS, write=_value(unless=10000)),
    Flag("--rotary-percent", _float(0.0, 1.0), "rotary_percent", array=MODEL_ARGS, write=_value(unless=1.0)),
    Flag("--use-rope-scaling", _TRUE, "use_rope_scaling", array=MODEL_ARGS, write=_switch()),
    Flag("--rope-scaling-factor", _float(), "rope_scaling_factor", array=MODEL_ARGS, write=_value(unless=8.0)),
    Flag("--rotary-scaling-factor", _float(), "rotary_scaling_factor", array=MODEL_ARGS, write=_value(unless=1.0)),
    Flag("--mscale", _float(None), "mscale", array=MODEL_ARGS, write=_value(unless=1.0)),
    Flag("--mscale-all-dim", _float(None), "mscale_all_dim", array=MODEL_ARGS, write=_value(unless=0.0)),
    # activation, norm, biases, embeddings
    Flag("--swiglu", _TRUE, "swiglu", array=MODEL_ARGS, write=_switch()),
    Flag("--quick-geglu", _TRUE, "quick_geglu", array=MODEL_ARGS, write=_switch()),
    Flag("--squared-relu", _TRUE, "squared_relu", array=MODEL_ARGS, write=_switch()),
    Flag("--normalization", _str("LayerNorm", "RMSNorm"), "normalization", array=MODEL_ARGS,
         write=_value(unless="LayerNorm")),
    Flag("--norm-epsilon", _float(), "norm_epsilon", array=MODEL_ARGS, write=_value(unless=1e-5)),
    Flag("--untie-embeddings-and-output-weights", _TRUE, "untie_embeddings_and_output_weights", array=MODEL_ARGS,
         write=_switch()),
    Flag("--activation-func-clamp-value", _float(), "activation_func_clamp_value", array=MODEL_ARGS,
         write=_value()),
    Flag("--no-rope-fusion", Read("apply_rope_fusion", "false"), "apply_rope_fusion", array=MODEL_ARGS,
         write=_switch(on=False)),
    Flag("--disable-bias-linear", Read("add_bias_linear", "false"), "add_bias_linear", array=MODEL_ARGS,
         write=_switch(on=False)),
    Flag("--add-qkv-bias", _TRUE, "add_qkv_bias", array=MODEL_ARGS, write=_switch()),
    Flag("--qk-layernorm", _TRUE, "qk_layernorm", array=MODEL_ARGS, write=_switch()),
    # sliding-window attention
    Flag("--window-size", _str(), "window_size", derived=True, array=MODEL_ARGS,
         write=lambda v, m: None if v is None else [f"{v[0]},{v[1]}"]),
    Flag("--window-attn-skip-freq", _str(), "window_attn_skip_freq", derived=True, array=MODEL_ARGS,
         write=lambda v, m: None if v is None else [v if isinstance(v, int) else moe_layer_freq_text(v)]),
    # multi-latent attention
    Flag("--multi-latent-attention", _TRUE, "multi_latent_attention", array=MODEL_ARGS, write=_switch()),
    Flag("--q-lora-rank", _int(), "q_lora_rank", array=MODEL_ARGS, write=_value(when=_mla)),
    Flag("--kv-lora-rank", _int(), "kv_lora_rank", array=MODEL_ARGS, write=_value(when=_mla)),
    Flag("--qk-head-dim", _int(), "qk_head_dim", array=MODEL_ARGS, write=_value(when=_mla)),
    Flag("--qk-pos-emb-head-dim", _int(0), "qk_pos_emb_head_dim", array=MODEL_ARGS, write=_value(when=_mla)),
    Flag("--v-head-dim", _int(), "v_head_dim", array=MODEL_ARGS, write=_value(when=_mla)),
    Flag("--mtp-num-layers", _int(0, MAX_COUNT), "mtp_num_layers", array=MODEL_ARGS, write=_value(unless=0)),
    # mixture of experts (1.4)
    Flag("--num-experts", _int(0), "num_experts", derived=True, array=MOE_ARGS, write=_value(when=_moe)),
    Flag("--moe-router-topk", _int(), "moe_router_topk", array=MOE_ARGS, write=_value(when=_moe)),
    Flag("--moe-ffn-hidden-size", _int(), "moe_ffn_hidden_size", array=MOE_ARGS, write=_value(when=_moe)),
    Flag("--moe-shared-expert-intermediate-size", _int(), "moe_shared_expert_intermediate_size", array=MOE_ARGS,
         write=_value(when=_moe)),
    Flag("--moe-shared-expert-gate", _TRUE, "moe_shared_expert_gate", array=MOE_ARGS, write=_switch(when=_moe)),
    Flag("--moe-layer-freq", _str(), "moe_layer_pattern", derived=True, array=MOE_ARGS,
         write=lambda v, m: [moe_layer_freq_text(v)] if m.is_moe and v is not None else None),
    Flag("--moe-expert-capacity-factor", Read("", "float"), "moe_expert_capacity_factor", derived=True,
         array=MOE_ARGS, write=_value(when=_moe)),
    Flag("--moe-token-dispatcher-type", _str("allgather", "alltoall", "flex", forks=_FORK_DISPATCHERS),
         "moe_token_dispatcher_type",
         array=MOE_ARGS, write=_value(when=_moe)),
    Flag("--moe-grouped-gemm", _TRUE, "moe_grouped_gemm", array=MOE_ARGS, write=_switch(when=_moe)),
    Flag("--moe-router-force-load-balancing", _TRUE, "moe_router_force_load_balancing", array=MOE_ARGS,
         write=_switch(when=_moe)),
    Flag("--moe-router-score-function", _str("softmax", "sigmoid", "sqrtsoftplus"), "moe_router_score_function",
         array=MOE_ARGS, write=_value(unless="softmax", when=_moe)),
    Flag("--moe-router-pre-softmax", _TRUE, "moe_router_pre_softmax", array=MOE_ARGS, write=_switch(when=_moe)),
    Flag("--moe-router-topk-scaling-factor", _float(), "moe_router_topk_scaling_factor", array=MOE_ARGS,
         write=_value(when=_moe)),
    Flag("--moe-router-dtype", _str("fp32", "fp64"), "moe_router_dtype", array=MOE_ARGS, write=_value(when=_moe)),
    # observed: read, never decided; a script's own tokens pass through as given, a spec's are written
    Flag("--moe-flex-dispatcher-backend", _str("deepep", "hybridep", observe=True), "moe_flex_dispatcher_backend",
         array=MOE_ARGS, write=_value(unless="deepep", when=lambda m: m.is_moe and m.moe_token_dispatcher_type == "flex")),
    Flag("--moe-pad-expert-input-to-capacity", _SEEN, "moe_pad_expert_input_to_capacity", array=MOE_ARGS,
         write=_switch(when=_moe)),
    Flag("--moe-router-load-balancing-type",
         _list("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none", observe=True, forks=_FORK_BALANCING),
         "moe_router_load_balancing_type", derived=True, array=MOE_ARGS, write=_value(when=_moe)),
    Flag("--moe-aux-loss-coeff", Read("", "floats", min_value=0.0, observe=True), "moe_aux_loss_coeff",
         derived=True, array=MOE_ARGS,
         write=lambda v, spec: [f"{spec.trained_aux_loss_coeff:g}"] if spec.is_moe and spec.trained_aux_loss_coeff
         else None),  # 0: Megatron's default, left out as a command that leaves it out
    Flag("--moe-router-enable-expert-bias", _SEEN, "moe_router_enable_expert_bias", array=MOE_ARGS,
         write=_switch(when=_moe)),
    Flag("--moe-router-num-groups", _int(1, MAX_COUNT, observe=True), "moe_router_num_groups", array=MOE_ARGS,
         write=_value(when=_moe)),
    Flag("--moe-router-group-topk", _int(1, MAX_COUNT, observe=True), "moe_router_group_topk", array=MOE_ARGS,
         write=_value(when=_moe)),
    # MindSpeed / MindSpeed-LLM spellings of model settings: read into the model, passed through as given
    # (their upstream rows above write the model back)
    Flag("--multi-head-latent-attention", _SEEN, "multi_latent_attention", derived=True, array=MODEL_ARGS),
    Flag("--qk-nope-head-dim", _int(observe=True), "qk_head_dim", derived=True, array=MODEL_ARGS),
    Flag("--qk-rope-head-dim", _int(0, observe=True), "qk_pos_emb_head_dim", derived=True, array=MODEL_ARGS),
    Flag("--moe-intermediate-size", _int(observe=True), "moe_ffn_hidden_size", derived=True, array=MOE_ARGS),
    Flag("--n-shared-experts", _int(0, observe=True), "moe_shared_expert_intermediate_size", derived=True,
         array=MOE_ARGS),
    Flag("--first-k-dense-replace", _int(-MAX_COUNT, MAX_COUNT, observe=True), "moe_layer_pattern", derived=True,
         array=MOE_ARGS),
    Flag("--routed-scaling-factor", Read("", "float", min_value=0.0, exclusive_min=True, observe=True),
         "moe_router_topk_scaling_factor", derived=True, array=MOE_ARGS),
    # Pai-Megatron-Patch's spelling of a gated shared expert (its qwen1_5 / qwen2 MoE layers,
    # alibaba/Pai-Megatron-Patch@a098ca5a megatron_patch/model/qwen2/moe/moe_layer.py and transformer/mlp.py)
    Flag("--enable-shared-expert", _SEEN, "moe_shared_expert_gate", derived=True, array=MOE_ARGS),
    Flag("--shared-moe-ffn-hidden-size", _int(observe=True), "moe_shared_expert_intermediate_size", derived=True,
         array=MOE_ARGS),
    # not read: their arrays only
    *(Flag(name, array=MODEL_ARGS) for name in (
        "--use-mcore-models", "--no-position-embedding", "--init-method-std")),
)

_DTYPES = ("fp32", "fp16", "bf16", "fp8")
_GRAPH_MODULES = ("full", "full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
_GRAPH_MEMORY = "CUDA graphs: the graph pools' memory (their saving in host time is priced)"
TRAINING_FLAGS = _rows(  # TrainingSpec (1.5, 1.6, 1.8)
    Flag("--micro-batch-size", _int(), "micro_batch_size", decided=True, array=TRAINING_ARGS, override="mbs"),
    Flag("--global-batch-size", _int(), "global_batch_size", decided=True, array=TRAINING_ARGS, override="gbs"),
    Flag("--bf16", _TRUE, "precision", derived=True, array=TRAINING_ARGS, write=_precision("bf16", "fp8")),
    Flag("--fp16", _TRUE, "precision", derived=True, array=TRAINING_ARGS, write=_precision("fp16")),
    Flag("--fp8-format", Read("fp8", "str", choices=("e4m3", "hybrid")), "precision", derived=True,
         array=TRAINING_ARGS, write=_precision("fp8", values=("hybrid",))),
    Flag("--fp8-recipe", _str("delayed", "tensorwise", "blockwise", "mxfp8", observe=True), "fp8_recipe",
         array=TRAINING_ARGS),
    Flag("--fp8-param-gather", _SEEN, "fp8_param_gather", array=TRAINING_ARGS),
    Flag("--grad-reduce-in-bf16", _SEEN, "grad_reduce_in_bf16", array=TRAINING_ARGS),
    Flag("--use-precision-aware-optimizer", _SEEN, "use_precision_aware_optimizer", array=TRAINING_ARGS),
    Flag("--main-params-dtype", _str("fp32", "fp16", observe=True), "main_params_dtype", array=TRAINING_ARGS),
    Flag("--main-grads-dtype", _str("fp32", "bf16", observe=True), "main_grads_dtype", array=TRAINING_ARGS),
    Flag("--exp-avg-dtype", _str(*_DTYPES, observe=True), "exp_avg_dtype", array=TRAINING_ARGS),
    Flag("--exp-avg-sq-dtype", _str(*_DTYPES, observe=True), "exp_avg_sq_dtype", array=TRAINING_ARGS),
    # observed: they change activation memory (planner/cost/memory.py), never decided
    Flag("--attention-backend", _str("flash", "fused", "unfused", "local", "auto", observe=True), "attention_backend",
         array=MODEL_ARGS),
    # written where a model file, preset or HF config states another value than Megatron's default (0.1)
    Flag("--hidden-dropout", Read("", "float", min_value=0.0, max_value=1.0, observe=True), "hidden_dropout",
         array=MODEL_ARGS, write=_value(unless=0.1)),
    Flag("--attention-dropout", Read("", "float", min_value=0.0, max_value=1.0, observe=True), "attention_dropout",
         array=MODEL_ARGS, write=_value(unless=0.1)),
    Flag("--overlap-moe-expert-parallel-comm", _SEEN, "overlap_moe_expert_parallel_comm", array=TRAINING_ARGS),
    # the reserved FP32 logits segment of the unfused loss is priced (planner/cost/memory.py loss_reserved_bytes)
    Flag("--cross-entropy-loss-fusion", _SEEN, "cross_entropy_loss_fusion", array=TRAINING_ARGS, write=_switch(),
         unpriced_in=("gemm",), not_modelled="fused cross-entropy: its time and its allocated logits memory are "
                                             "priced as the unfused loss's"),
    Flag("--delay-wgrad-compute", _SEEN, "delay_wgrad_compute", array=TRAINING_ARGS, unpriced_in=("expert_dispatch",),
         not_modelled="the EP overlap is priced as measured without it (NVIDIA's Nsight figure: 37% of the dispatch "
                      "hidden in a step pairing a forward with a backward); splitting out the weight-gradient GEMMs "
                      "widens the window the dispatch hides behind, by an amount no published figure measures"),
    Flag("--moe-shared-expert-overlap", _SEEN, "moe_shared_expert_overlap", array=MOE_ARGS),
    Flag("--cp-comm-type", _list("p2p", "a2a", "allgather", "a2a+p2p", observe=True), "cp_comm_type", derived=True,
         array=PARALLEL_ARGS),
    Flag("--use-distributed-optimizer", _TRUE, "use_distributed_optimizer", array=PARALLEL_ARGS, write=_switch()),
    Flag("--use-megatron-fsdp", _SEEN, "use_megatron_fsdp", array=PARALLEL_ARGS),
    Flag("--cuda-graph-impl", _str("none", "local", "transformer_engine", "full_iteration", observe=True),
         "cuda_graph_impl", array=TRAINING_ARGS, not_modelled=_GRAPH_MEMORY),
    *(Flag(name, _list(*_GRAPH_MODULES, observe=True), "cuda_graph_scope", array=TRAINING_ARGS,
           not_modelled=_GRAPH_MEMORY) for name in ("--cuda-graph-scope", "--cuda-graph-modules")),
    Flag("--data-parallel-sharding-strategy", _str("no_shard", "optim", "optim_grads", "optim_grads_params",
                                                   observe=True), "data_parallel_sharding_strategy", array=PARALLEL_ARGS),
    Flag("--overlap-grad-reduce", _TRUE, "overlap_grad_reduce", array=PARALLEL_ARGS, write=_switch()),
    Flag("--overlap-param-gather", _TRUE, "overlap_param_gather", array=PARALLEL_ARGS, write=_switch()),
    Flag("--tp-comm-overlap", _TRUE, "tp_comm_overlap", array=PARALLEL_ARGS, write=_switch()),
    *(Flag(name, array=PARALLEL_ARGS) for name in (
        "--distributed-backend", "--hetero-use-cpu-communication")),
)

PARALLEL_FLAGS = _rows(  # ParallelConfig and the recompute setting (1.1-1.3); written from the plan
    Flag("--tensor-model-parallel-size", _int(), "tp", decided=True, array=PARALLEL_ARGS, override="tp"),
    Flag("--pipeline-model-parallel-size", _int(1, MAX_COUNT), "pp", decided=True, array=PARALLEL_ARGS,
         override="pp"),
    Flag("--context-parallel-size", _int(), "cp", decided=True, array=PARALLEL_ARGS, override="cp"),
    Flag("--expert-model-parallel-size", _int(), "ep", decided=True, array=PARALLEL_ARGS, override="ep"),
    Flag("--expert-tensor-parallel-size", _int(), "etp", decided=True, array=PARALLEL_ARGS, override="etp"),
    Flag(LAYERS_PER_VIRTUAL_STAGE_FLAG, _int(), "num_layers_per_virtual_stage", decided=True, array=PARALLEL_ARGS),
    Flag(VPP_FLAG, _int(1, MAX_COUNT), "vpp", decided=True, array=PARALLEL_ARGS, override="vpp"),
    Flag(LAYOUT_FLAG, _str(), "layout", decided=True, array=PARALLEL_ARGS, override="layout"),
    # MindSpeed-LLM's layers per pipeline stage (Ascend/MindSpeed-LLM@c77308a1 mindspeed_llm/features_manager/
    # pipeline_parallel/num_layer_list.py, which refuses a list that is not one count per stage): read as the layout
    # it stands for; the plan's own split replaces it
    Flag("--num-layer-list", _str(), "layout", derived=True, decided=True, array=PARALLEL_ARGS),
    Flag("--decoder-first-pipeline-num-layers", _int(), "first_stage_layers", decided=True, array=PARALLEL_ARGS),
    Flag("--decoder-last-pipeline-num-layers", _int(), "last_stage_layers", decided=True, array=PARALLEL_ARGS),
    Flag("--account-for-embedding-in-pipeline-split", _TRUE, "account_for_embedding_in_pipeline_split",
         decided=True, array=PARALLEL_ARGS),
    Flag("--account-for-loss-in-pipeline-split", _TRUE, "account_for_loss_in_pipeline_split", decided=True,
         array=PARALLEL_ARGS),
    Flag("--sequence-parallel", _TRUE, "sequence_parallel", decided=True, array=PARALLEL_ARGS),
    Flag("--recompute-granularity", _str("full", "selective"), "recompute", derived=True, decided=True,
         array=TRAINING_ARGS, override="recompute"),
    Flag("--recompute-method", _str("uniform", "block"), "recompute", derived=True, decided=True,
         array=TRAINING_ARGS),
    Flag("--recompute-num-layers", _int(0), "recompute", derived=True, decided=True, array=TRAINING_ARGS),
    Flag("--recompute-modules", _list(), "recompute", derived=True, decided=True,
         array=TRAINING_ARGS),
    Flag("--recompute-activations", _TRUE, "recompute", derived=True, decided=True, array=TRAINING_ARGS),
    # not read, decided by the plan all the same
    *(Flag(name, decided=True, array=PARALLEL_ARGS) for name in (
        "--virtual-pipeline-model-parallel-size", "--microbatch-group-size-per-virtual-pipeline-stage",
        "--use-tp-pp-dp-mapping")),
    Flag("--moe-layer-recompute", decided=True, array=TRAINING_ARGS),
    # FlagScale's heterogeneous flags (planner/launcher/flagscale.py)
    *(Flag(name, decided=True, array=PARALLEL_ARGS) for name in (
        "--enable-hetero", "--hetero-process-meshes", "--hetero-device-types", "--hetero-current-device-type",
        "--hetero-pipeline-layer-split", "--expert-tensor-parallel-size-per-process-mesh",
        "--use-partial-reduce-for-shared-embedding", "--standalone-embedding-stage")),
    *(Flag(name, decided=True, array=TRAINING_ARGS) for name in (
        "--recompute-granularity-per-stage-micro-batch", "--recompute-method-per-stage-micro-batch",
        "--recompute-num-layers-per-stage-micro-batch")),
)

_GRAPHS = "CUDA graphs: less launch overhead, more memory for graph pools"
OTHER_FLAGS = _rows(
    *(Flag(name, array=DATA_ARGS) for name in ("--mock-data", "--split", "--vocab-file", "--merge-file",
                                                "--num-workers")),
    *(Flag(name, array=LOGGING_ARGS) for name in ("--no-load-optim", "--no-load-rng", "--finetune",
                                                   "--timing-log-level", "--timing-log-option")),
    # Flags that change time or memory but that the cost model does not price: each one present is
    # named beside the prediction.  When one becomes modelled, give it a field and price it.
    *(Flag(name, not_modelled=text, unpriced_in=tuple(mechanisms.split())) for name, mechanisms, text in (
        ("--fine-grained-activation-offloading", "memory_bound",
         "offloads activations to host memory: activation memory lower, PCIe traffic added"),
        ("--optimizer-cpu-offload", "memory_bound",
         "runs the optimizer step on the CPU: optimizer memory lower, step time different"),
        ("--moe-router-padding-for-fp8", "expert_gemm",
         "pads expert inputs to FP8 GEMM alignment: slightly more expert work"),
        ("--moe-permute-fusion", "memory_bound", "fused permute/unpermute kernels: fewer memory passes than priced"),
        ("--moe-router-fusion", "memory_bound", "fused router kernels: fewer memory passes than priced"),
        ("--moe-upcycling-granularity", "expert_gemm",
         "upcycled experts: expert shapes differ from --moe-ffn-hidden-size"),
        ("--moe-latent-size", "expert_gemm expert_dispatch", "latent MoE: expert inputs projected to a smaller size"),
        ("--swap-attention", "memory_bound", "MindSpeed: swaps attention activations to host memory"),
        ("--use-mc2", "collectives", "MindSpeed: fuses TP communication into compute (mc2): TP time lower than priced"),
        ("--moe-alltoall-overlap-comm", "expert_dispatch", "MindSpeed: overlaps the EP all-to-all with compute"),
        ("--use-fused-rmsnorm", "memory_bound", "MindSpeed fused kernel: norm time lower than priced"),
        ("--use-fused-swiglu", "memory_bound", "MindSpeed fused kernel: activation time lower than priced"),
        ("--use-distributed-optimizer-offload", "memory_bound", "offloads optimizer states"),
        ("--hybrid-context-parallel", "collectives",
         "hybrid context parallelism: attention communication differs from the CP model"),
        ("--delay-param-gather", "collectives", "parameter gather scheduling differs from the priced overlap"),
        ("--manual-gc", "host", "Python garbage collection at fixed intervals: small time effect"),
        ("--empty-unused-memory-level", "host",
         "frees cached memory between phases: small time and peak-memory effect"),
        ("--use-cpu-initialization", "", "initialisation only"),
        ("--sequence-packing", "attention",
         "packed variable-length sequences: attention work differs from full-length sequences"),
        ("--softmax-type", "attention",
         "attention sinks (off-by-one or learnable softmax): cuDNN runs them inside its fused attention kernel; "
         "their cost is not priced (no published figure)"),
        # Megatron-LM megatron/training/determinism.py (@d98e8a64): NCCL_ALGO=Ring, NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
        # (TE's deterministic attention backward), CUBLAS_WORKSPACE_CONFIG=:4096:8, torch.use_deterministic_algorithms
        ("--deterministic-mode", "gemm attention expert_gemm memory_bound collectives",
         "deterministic kernels (Megatron's CI runs): NCCL's ring algorithm, Transformer Engine's deterministic "
         "attention backward, a fixed cuBLAS workspace and torch's deterministic algorithms"),
        ("--no-gradient-accumulation-fusion", "memory_bound",
         "weight gradients accumulated by a separate pass: more memory traffic"),
        *((name, "gemm attention", "a hybrid Mamba / attention / MLP layer pattern: every layer is priced as a "
                                   "transformer layer (attention and MLP), Mamba layers are not")
          for name in ("--hybrid-override-pattern", "--hybrid-layer-pattern")),
        ("--is-hybrid-model", "gemm attention",
         "a hybrid Mamba model: every layer is priced as a transformer layer (attention and MLP), Mamba layers are "
         "not"),
        # Megatron-LM's other switches that change a training step's time or memory (megatron-core 0.19.2's parser,
        # megatron/training/arguments.py and transformer_config.py @d98e8a64): fused or unfused kernels
        ("--use-transformer-engine-op-fuser", "expert_gemm gemm memory_bound",
         "Transformer Engine's operation fuser: fused MLP kernels (with NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 on Blackwell, "
         "one CuTe-DSL kernel runs the experts' grouped GEMMs with their activation and quantisation): MLP time "
         "lower than priced"),
        ("--use-grouped-gemm-for-dense-mlp", "gemm memory_bound",
         "the dense MLP through the fused grouped-MLP path (with the operation fuser, MXFP8 on Blackwell): fewer "
         "memory passes than priced"),
        ("--use-grouped-gemm-for-shared-expert", "gemm memory_bound",
         "the shared expert through Transformer Engine's grouped SwiGLU fusion: fewer memory passes than priced"),
        ("--moe-permute-fusion-into-hybridep", "memory_bound expert_dispatch",
         "token permutation fused into HybridEP's dispatch: fewer memory passes than priced"),
        ("--fused-residual-rmsnorm", "memory_bound",
         "the residual add fused into RMSNorm's backward: fewer memory passes than priced"),
        ("--mla-down-proj-fusion", "gemm memory_bound",
         "MLA's q/kv down-projections fused with the input norm: fewer kernels and memory passes than priced"),
        ("--use-fused-weighted-squared-relu", "memory_bound",
         "a fused weighted squared-ReLU expert activation: fewer memory passes than priced"),
        *((name, "memory_bound", f"{what} unfused: more memory passes than priced") for name, what in (
            ("--no-masked-softmax-fusion", "scale-mask-softmax (unfused attention)"),
            ("--no-bias-swiglu-fusion", "bias-SwiGLU"), ("--no-bias-gelu-fusion", "bias-GeLU"),
            ("--no-bias-dropout-fusion", "bias-dropout-add"),
            ("--disable-jit-fuser", "the JIT-fused elementwise ops"))),
        ("--no-persist-layer-norm", "memory_bound",
         "the persistent layer-norm kernel off (local transformer implementation): norm time differs from priced"),
        ("--fp32-residual-connection", "memory_bound",
         "the residual stream in FP32: more activation memory and memory traffic than priced"),
        # precision
        *((name, "gemm expert_gemm", "weight-gradient GEMMs in BF16 instead of FP8: slower than priced")
          for name in ("--no-fp8-wgrad", "--disable-fp8-wgrad")),
        *((name, "gemm expert_gemm", "layers at the start or end kept in BF16 instead of FP8: slower than priced")
          for name in ("--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16")),
        ("--fp8-output-proj", "gemm", "the output (logits) projection in MXFP8: faster than priced"),
        *((name, "gemm expert_gemm memory_bound",
           "NVFP4 GEMMs (Blackwell): priced as the run's BF16 or FP8 GEMMs; faster than priced, weights and casts "
           "differ") for name in ("--fp4-format", "--fp4-recipe")),
        ("--fp4-param-gather", "collectives", "NVFP4 parameter all-gather: less memory and traffic than priced"),
        # memory: offloading and chunking
        *((name, "memory_bound", "offloads the named modules' inputs to host memory (fine-grained activation "
           "offloading): activation memory lower, PCIe traffic added")
          for name in ("--offload-modules", "--activation-offload-fraction")),
        ("--cpu-offloading-num-layers", "memory_bound", "offloads that many layers' activations to host memory"),
        ("--moe-paged-stash", "memory_bound",
         "a paged stash of the routed experts' activations (device and host buffers): activation memory differs "
         "from priced"),
        ("--mlp-chunks-for-training", "memory_bound",
         "the MLP computed in sequence chunks: activation memory lower, more kernels than priced"),
        ("--ep-overlap-early-attn-memory-release", "",
         "the EP overlap releases attention activations early: peak memory lower than priced"),
        # host, communication and schedule
        ("--optimizer-cuda-graph", "host", "the optimizer step in a CUDA graph: less host time than priced"),
        ("--use-nccl-ub", "collectives",
         "NCCL user-buffer registration for DP/FSDP buffers: fewer SMs taken from the compute they overlap"),
        ("--high-priority-a2a-comm-stream", "expert_dispatch",
         "the EP overlap's communication stream at high priority: its scheduling differs from the measured overlap"),
        ("--high-priority-stream-groups", "collectives",
         "communicators on high-priority streams: overlap scheduling differs from priced"),
        ("--overlap-dispatch-backward-with-experts-wgrad", "expert_dispatch",
         "expert weight gradients overlapped with the EP all-to-all (FSDP): less dispatch exposed than priced"),
        ("--use-ring-exchange-p2p", "pipeline_sends", "a custom ring-exchange kernel for pipeline sends"),
        ("--tp-comm-overlap-rs-dgrad", "collectives",
         "the TP reduce-scatter overlapped with the data-gradient GEMM: less TP time exposed than priced"),
        *((name, "collectives", "one of --tp-comm-overlap's overlaps turned off: more TP time exposed than priced")
          for name in ("--no-tp-comm-bulk-wgrad", "--disable-tp-comm-bulk-wgrad", "--no-tp-comm-bulk-dgrad",
                       "--disable-tp-comm-bulk-dgrad", "--no-tp-comm-overlap-ag", "--disable-tp-comm-overlap-ag",
                       "--no-tp-comm-overlap-rs", "--disable-tp-comm-overlap-rs")),
        ("--ddp-reduce-scatter-with-fp32-accumulation", "collectives",
         "the gradient reduce-scatter as an all-to-all with local FP32 accumulation: traffic differs from the ring "
         "priced"),
        *((name, "collectives", "the data-parallel buckets' size: overlap granularity differs from priced")
          for name in ("--ddp-bucket-size", "--ddp-num-buckets")),
        *((name, "collectives", "PP stages launch their gradient reduces independently: overlap differs from priced")
          for name in ("--no-align-grad-reduce", "--disable-align-grad-reduce")),
        ("--create-all-gather-group", "collectives",
         "a separate all-gather group overlaps the reduce-scatter and the all-gather"),
        # MoE routing and shapes
        ("--moe-router-padding-for-quantization", "expert_gemm",
         "pads expert inputs to quantised-GEMM alignment: slightly more expert work"),
        ("--moe-router-force-biased", "expert_gemm expert_dispatch",
         "a random expert bias on the router logits: routing imbalance differs from the one priced"),
        ("--moe-expert-rank-capacity-factor", "expert_gemm expert_dispatch",
         "a fixed per-rank receive capacity (static shapes): expert work and dispatch padded to it"),
        # architecture the cost model prices as the plain transformer
        ("--experimental-attention-variant", "attention",
         "an attention variant (gated delta net, DSA) priced as softmax attention"),
        ("--linear-attention-freq", "attention", "linear-attention layers, priced as softmax attention"),
        ("--attention-output-gate", "gemm", "an output gate on attention: one more GEMM than priced"),
        *((name, "collectives memory_bound",
           "weights sharded beyond TP and re-materialised (GTP): memory lower, all-gathers added")
          for name in ("--tensor-parallel-num-weight-shards", "--expert-tensor-parallel-num-weight-shards")),
        # valued flags: a value other than PRICED_AS_IS's
        ("--optimizer", "memory_bound",
         "an optimizer other than Adam: its states and its step are priced as Adam's (two FP32 moments and a master "
         "copy per parameter; Muon adds Newton-Schulz iterations on every weight matrix, SGD and Lion keep one state)"),
        ("--flash-attention-version", "attention",
         "FlashAttention 3 or 4 pinned: faster than the FlashAttention-2 rates --attention-backend flash is priced at"),
        ("--pipeline-model-parallel-comm-backend", "pipeline_sends", "pipeline sends over UCC instead of NCCL"),
        *((name, "", "Megatron-FSDP's buffer precision: its memory differs from the BF16/FP32 buffers priced")
          for name in ("--megatron-fsdp-main-params-dtype", "--megatron-fsdp-main-grads-dtype",
                       "--megatron-fsdp-grad-comm-dtype")),
    )),
)


SETTINGS_FLAGS = _rows(  # MegatronSettings: read for Megatron's rules only, passed through as given
    Flag("--hierarchical-context-parallel-sizes", Read("", "ints", min_value=1, observe=True),
         "hierarchical_context_parallel_sizes", array=PARALLEL_ARGS, unpriced_in=("collectives",),
         not_modelled="hierarchical CP: attention communication differs from the CP model"),
    Flag("--no-overlap-p2p-communication", Read("overlap_p2p_comm", "false", observe=True), "overlap_p2p_comm",
         array=PARALLEL_ARGS),
    Flag("--overlap-param-gather-with-optimizer-step", _SEEN, "overlap_param_gather_with_optimizer_step",
         array=PARALLEL_ARGS),
    Flag("--num-distributed-optimizer-instances", _int(observe=True), "num_distributed_optimizer_instances",
         array=PARALLEL_ARGS),
    Flag("--ckpt-format", _str(observe=True), "ckpt_format", array=LOGGING_ARGS),
    Flag("--use-torch-fsdp2", _SEEN, "use_torch_fsdp2", unpriced_in=("collectives",),
         not_modelled="PyTorch FSDP2 sharding: memory lower, extra all-gathers per layer"),
    Flag("--transformer-impl", _str("transformer_engine", "local", "inference_optimized", observe=True),
         "transformer_impl", array=MODEL_ARGS),
    # older spellings of --cuda-graph-impl local and transformer_engine
    Flag("--enable-cuda-graph", _SEEN, "enable_cuda_graph", not_modelled=_GRAPHS, unpriced_in=("host",)),
    Flag("--external-cuda-graph", _SEEN, "external_cuda_graph", not_modelled=_GRAPHS, unpriced_in=("host",)),
    Flag("--moe-input-jitter-eps", Read("", "float", min_value=0.0, observe=True), "moe_input_jitter_eps",
         array=MOE_ARGS),
    Flag("--moe-enable-deepep", _SEEN, "moe_enable_deepep", array=MOE_ARGS),  # older spelling: flex with DeepEP
    Flag("--distribute-saved-activations", _SEEN, "distribute_saved_activations", array=TRAINING_ARGS),
    Flag("--overlap-p2p-communication-warmup-flush", _SEEN, "overlap_p2p_comm_warmup_flush", array=PARALLEL_ARGS,
         unpriced_in=("pipeline_sends",), not_modelled="pipeline sends overlapped in the warm-up and flush too"),
    Flag("--defer-embedding-wgrad-compute", _SEEN, "defer_embedding_wgrad_compute", array=TRAINING_ARGS,
         unpriced_in=("gemm",),
         not_modelled="the embedding's weight-gradient GEMMs deferred into the pipeline flush: part of the bubble "
                      "hidden"),
    Flag("--cpu-offloading", _SEEN, "cpu_offloading", not_modelled="offloads activations or weights to host memory",
         unpriced_in=("memory_bound",)),
    Flag("--no-check-for-nan-in-loss-and-grad", Read("check_for_nan_in_loss_and_grad", "false", observe=True),
         "check_for_nan_in_loss_and_grad"),
)


TABLE: tuple[Flag, ...] = MODEL_FLAGS + TRAINING_FLAGS + PARALLEL_FLAGS + SETTINGS_FLAGS + OTHER_FLAGS
BY_NAME: dict[str, Flag] = {f.name: f for f in TABLE}


# --------------------------------------------------------------------------------------------------
# Views of the table
# --------------------------------------------------------------------------------------------------
READ_FLAGS: dict[str, Read] = {f.name: f.read for f in TABLE if f.read is not None}
"""The flags the reader takes: name -> how."""

PLAN_DECIDED_FLAGS: frozenset[str] = frozenset(f.name for f in TABLE if f.decided)
"""Flags the plan decides: removed from the user's flags and written from the plan."""

OVERRIDE_FLAGS: dict[str, str] = {f.override: f.name for f in TABLE if f.override}
"""CLI override (`tp` for --tp) -> the Megatron flag it sets."""

PRECISION_FLAGS: tuple[str, ...] = tuple(f.name for f in TRAINING_FLAGS if f.field == "precision")

NOT_MODELLED: dict[str, str] = {f.name: f.not_modelled for f in TABLE if f.not_modelled}
UNPRICED_IN: dict[str, tuple[str, ...]] = {f.name: f.unpriced_in for f in TABLE if f.unpriced_in}
"""Flag -> the cost model's mechanisms whose time it changes without a price (planner/cost/mechanisms.py)."""
UNPRICED_ENV: dict[str, tuple[str, tuple[str, ...], str]] = {
    # Megatron-LM megatron/training/determinism.py (@d98e8a64) sets both under --deterministic-mode
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": ("0", ("attention",), "Transformer Engine's deterministic attention backward"),
    "NCCL_ALGO": ("", ("collectives",), "NCCL's collective algorithm pinned instead of NCCL's own choice"),
}
"""Environment variable -> (the value that changes time unpriced, "" for any; mechanisms; what it does): a script's
environment setting that changes a mechanism's time as an UNPRICED_IN flag does (`unpriced_env`)."""
UNPRICED_IN.update({f"{name}={value}" if value else name: mechanisms
                    for name, (value, mechanisms, _) in UNPRICED_ENV.items()})


def unpriced_env(env) -> list[tuple[str, str]]:
    """(entry, note) per environment setting of UNPRICED_ENV in `env` (a script's environment): the entry as
    TrainingSpec.unpriced_flags records it (`NAME=value`, or `NAME` for any value)."""
    out = []
    for name, (value, _, what) in UNPRICED_ENV.items():
        got = (env.get(name) or "").strip()
        if got and (not value or got == value):
            out.append((f"{name}={value}" if value else name,
                        f"{name}={got} is not modelled: {what}; the prediction ignores it"))
    return out


REMOVED_FLAGS: dict[str, str] = {
    "--batch-size": "--batch-size argument is no longer valid, use --micro-batch-size instead",
    "--warmup": "--warmup argument is no longer valid, use --lr-warmup-fraction instead",
    "--model-parallel-size": "--model-parallel-size is no longer valid, use --tensor-model-parallel-size instead",
    "--checkpoint-activations": "--checkpoint-activations is no longer valid, use --recompute-activations, or, for "
                                "more control, --recompute-granularity and --recompute-method.",
}
"""Flags Megatron's parser still lists but its validate_args refuses whatever their value (megatron/training/
arguments.py @d98e8a64, 'Deprecated arguments'): the message it stops with.  A launcher that passes one cannot
start, so the reader refuses it too.  (--no-position-embedding is refused unless the position embedding is rope, and
other switches without what they need: planner/megatron/rules.py `passthrough_violations`.)"""

PRICED_AS_IS: dict[str, frozenset[str]] = {
    "--softmax-type": frozenset({"vanilla"}), "--optimizer": frozenset({"adam"}),
    "--flash-attention-version": frozenset({"2"}), "--pipeline-model-parallel-comm-backend": frozenset({"nccl"}),
    "--megatron-fsdp-main-params-dtype": frozenset({"fp32"}), "--megatron-fsdp-main-grads-dtype": frozenset({"auto"}),
    "--megatron-fsdp-grad-comm-dtype": frozenset({"auto"}),
}
"""Flag -> values that leave the run as the cost model prices it (Megatron's default softmax)."""

FORK_VALUES: dict[str, dict[str, str]] = {
    **{f.name: {c.value: c.priced_as for c in f.read.fork_choices} for f in TABLE if f.read and f.read.fork_choices},
    "--tokenizer-type": {"PretrainedFromHF": "HuggingFaceTokenizer"},  # MindSpeed-LLM's name for it
    # Pai-Megatron-Patch adds it to the choices (megatron_patch/arguments.py get_patch_args, @a098ca5a): Adam with
    # its states offloaded, priced as Adam (--optimizer's note names it)
    "--optimizer": {"hybridadam": "adam"},
}
"""Flag -> {value only a fork accepts: upstream's equivalent} (upstream's parser refuses the fork's value)."""
"""Flag -> what it changes and the prediction does not include."""


def copied_fields(section: Sequence[Flag]) -> list[tuple[str, str]]:
    """(dest, field) of the section's flags whose value the reader copies into the field as read."""
    return [(f.read.dest, f.field) for f in section if f.read is not None and f.field and not f.derived]


def field_flags(section: Sequence[Flag], spec: type) -> dict[str, str]:
    """Field of `spec` -> the flag that sets it (the first of the section's rows), in the spec's field
    order (for error messages)."""
    first: dict[str, str] = {}
    for f in section:
        first.setdefault(f.field, f.name)
    return {name: first[name] for name in spec.model_fields if name in first}


MODEL_FIELD_FLAGS = field_flags(MODEL_FLAGS, ModelSpec)
TRAINING_FIELD_FLAGS = {**field_flags(TRAINING_FLAGS, TrainingSpec), "precision": "/".join(PRECISION_FLAGS)}
PARALLEL_FIELD_FLAGS = field_flags(PARALLEL_FLAGS, ParallelConfig)
SETTINGS_FIELD_FLAGS = field_flags(SETTINGS_FLAGS, MegatronSettings)


def _written(section: Sequence[Flag], spec: Any) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for f in section:
        if f.write is None:
            continue
        values = f.write(getattr(spec, f.field) if f.field else None, spec)
        if values is not None:
            out.append((f.name, [str(v) for v in values]))
    return out


def model_flags(model: ModelSpec) -> list[tuple[str, list[str]]]:
    """(flag, values) that give Megatron this ModelSpec (Megatron defaults left out where safe)."""
    return _written(MODEL_FLAGS, model)


def training_flags(training: TrainingSpec) -> list[tuple[str, list[str]]]:
    """(flag, values) for the precision and optimizer/overlap settings of a TrainingSpec (batch
    sizes come from the plan)."""
    return _written(TRAINING_FLAGS, training)


# -- launch.sh arrays --------------------------------------------------------------------------------
_PREFIX_ARRAYS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("--recompute",), TRAINING_ARGS),
    (("--moe-",), MOE_ARGS),
    (("--data-", "--tokenizer-", "--train-data", "--valid-data", "--test-data"), DATA_ARGS),
    (("--log-", "--tensorboard", "--wandb-", "--eval-", "--save", "--load", "--ckpt-"), LOGGING_ARGS),
)


def array_of(name: str) -> str:
    """The bash array (concern) of a Megatron flag in launch.sh: its row's, else by its prefix."""
    flag = BY_NAME.get(name)
    if flag is not None and flag.array:
        return flag.array
    for prefixes, array in _PREFIX_ARRAYS:
        if name.startswith(prefixes):
            return array
    return TRAINING_ARGS if name.startswith("-") else OTHER_ARGS


# -- rules -> flags --------------------------------------------------------------------------------
RULE_FLAGS: dict[str, tuple[str, ...]] = {
    "heads_tp": ("--tensor-model-parallel-size",),
    "query_groups_tp": ("--tensor-model-parallel-size",),
    "seq_cp": ("--context-parallel-size", "--seq-length"),
    "seq_tp_sp": ("--sequence-parallel", "--seq-length", "--tensor-model-parallel-size"),
    "ep_needs_experts": ("--expert-model-parallel-size",),
    "experts_ep": ("--expert-model-parallel-size",),
    "expert_folding": ("--expert-model-parallel-size", "--expert-tensor-parallel-size"),
    "moe_tp_sequence_parallel": ("--sequence-parallel",),
    "moe_etp_bias": ("--disable-bias-linear", "--expert-tensor-parallel-size"),
    "gbs_microbatch": ("--global-batch-size", "--micro-batch-size"),
    "vpp_needs_pp": (VPP_FLAG,),
    "vpp_microbatches": (VPP_FLAG,),
    "layout_layers": (LAYOUT_FLAG,),
    "layout_stages_pp": (LAYOUT_FLAG, "--pipeline-model-parallel-size"),
    "layout_embedding": (LAYOUT_FLAG,),
    "layout_loss": (LAYOUT_FLAG,),
    "layout_mtp": (LAYOUT_FLAG, "--mtp-num-layers"),
    "vpp_flags": (VPP_FLAG, LAYOUT_FLAG, LAYERS_PER_VIRTUAL_STAGE_FLAG),
    "pipeline_split": ("--pipeline-model-parallel-size",),
    "pipeline_split_vpp": (VPP_FLAG,),
    "pipeline_split_build": ("--pipeline-model-parallel-size", VPP_FLAG),
    "cuda_graph": ("--cuda-graph-impl",),
    "tp_comm_overlap_sp": ("--tp-comm-overlap",),
    "overlap_param_gather": ("--overlap-param-gather",),
    # the model's and the run's other flags (rules.model_violations, settings_violations)
    "mtp_position_embedding": ("--position-embedding-type", "--mtp-num-layers"),
    "mla_gqa": ("--group-query-attention", "--multi-latent-attention"),
    "moe_ffn_without_experts": ("--moe-ffn-hidden-size", "--num-experts"),
    "moe_capacity": ("--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity",
                     "--moe-router-load-balancing-type"),
    "moe_expert_bias": ("--moe-router-score-function", "--moe-router-enable-expert-bias"),
    "moe_topk_one": ("--moe-router-pre-softmax", "--moe-router-topk"),
    "moe_router_groups": ("--moe-router-num-groups", "--moe-router-group-topk"),
    "moe_dispatcher": ("--moe-token-dispatcher-type", "--moe-enable-deepep"),
    "moe_shared_expert_overlap": ("--moe-shared-expert-overlap", "--moe-token-dispatcher-type"),
    "moe_aux_loss_coeff": ("--moe-aux-loss-coeff", "--moe-router-load-balancing-type"),
    "cp_comm_type": ("--cp-comm-type", "--hierarchical-context-parallel-sizes", "--context-parallel-size"),
    "overlap_param_gather_step": ("--overlap-param-gather-with-optimizer-step",),
    "fp8_param_gather": ("--fp8-param-gather",),
    "main_grads_dtype": ("--main-grads-dtype", "--use-precision-aware-optimizer"),
    "megatron_fsdp": ("--ckpt-format", "--use-megatron-fsdp"),
    "delay_wgrad_compute": ("--delay-wgrad-compute",),
    # the run's flags against the plan (rules.degree_flag_violations, recompute_violations)
    "ep_overlap": ("--overlap-moe-expert-parallel-comm",),
    "recompute_modules": ("--recompute-modules",),
    "fp8_delayed_recompute": ("--recompute-modules", "--fp8-recipe"),
    "mtp_recompute": ("--recompute-num-layers",),
    "cuda_graph_recompute": ("--recompute-granularity", "--cuda-graph-impl"),
    "cpu_offloading": ("--cpu-offloading",),
    "distribute_saved_activations": ("--distribute-saved-activations",),
    "defer_embedding_wgrad": ("--defer-embedding-wgrad-compute",),
    "p2p_warmup_flush": ("--overlap-p2p-communication-warmup-flush",),
    "flex_tp_ep": ("--expert-model-parallel-size", "--tensor-model-parallel-size"),
    "dist_opt_instances": ("--num-distributed-optimizer-instances",),
    "torch_fsdp2": ("--use-torch-fsdp2",),
}
"""Rule of planner/megatron/rules.py -> the flags behind it, the one to change first."""


def rule_flag(rule: str) -> str:
    """The Megatron flag a rule's refusal names (the first behind it); a rule named after its switch
    (planner/megatron/rules.py passthrough_violations) names the switch."""
    return rule if rule.startswith("--") else RULE_FLAGS[rule][0]


def rule_options(rule: str) -> str | None:
    """The CLI options that change a rule's flags (`--ep/--etp`), else the flags themselves; None for
    a rule no flag stands behind."""
    flags = (rule,) if rule.startswith("--") else RULE_FLAGS.get(rule)
    if flags is None:
        return None
    options = ["--" + BY_NAME[f].override for f in flags if f in BY_NAME and BY_NAME[f].override]
    return "/".join(options or flags)


def flag_value(tokens: Sequence[str], flag: str) -> str | None:
    """The value `flag` was given in a token list (`--flag value` or `--flag=value`; the last occurrence wins, as
    in argparse), else None."""
    value = None
    for k, tok in enumerate(tokens):
        if tok == flag and k + 1 < len(tokens):
            value = tokens[k + 1]
        elif tok.startswith(flag + "="):
            value = tok.split("=", 1)[1]
    return value


def _not_modelled_in(passthrough: Iterable[str]) -> list[str]:
    """The flags of `passthrough` that change time or memory unpriced (NOT_MODELLED), in order, each once; one
    given only values the cost model prices as they are (PRICED_AS_IS) left out."""
    seen: list[str] = []
    toks = list(passthrough)
    for i, tok in enumerate(toks):
        name, eq, value = tok.partition("=")
        if name not in NOT_MODELLED or name in seen:
            continue
        if not eq:
            value = toks[i + 1] if i + 1 < len(toks) and not toks[i + 1].startswith("--") else ""
        if value and value in PRICED_AS_IS.get(name, ()):
            continue
        seen.append(name)
    return seen


def unpriced_time_flags(passthrough: Iterable[str]) -> tuple[str, ...]:
    """The flags of `passthrough` whose time effect the cost model does not price (UNPRICED_IN), sorted: the
    run's TrainingSpec.unpriced_flags, which the evidence compares with the calibration runs'."""
    return tuple(sorted(name for name in _not_modelled_in(passthrough) if name in UNPRICED_IN))


def unmodelled_notes(passthrough: Iterable[str], training=None) -> list[str]:
    """One note per flag in `passthrough` (the run's flags the planner does not read) that changes time
    or memory but is not priced, and (`training`, a TrainingSpec) for a setting priced without a measurement of
    its own (unfused attention)."""
    seen = _not_modelled_in(passthrough)
    notes = [f"{name} is not modelled: {NOT_MODELLED[name]}; the prediction ignores it" for name in seen]
    if training is not None and training.attention_backend == "flash":
        notes.append("--attention-backend flash: Transformer Engine runs the FlashAttention package, not cuDNN's fused "
                     "attention; on H100, H800 and H200 it is priced at FlashAttention-2's published rates (0.65-0.75x "
                     "cuDNN's, profiles/published/components.csv); FlashAttention-3, where installed, runs faster than "
                     "priced")
    if training is not None and training.unfused_attention:
        notes.append(f"--attention-backend {training.attention_backend}: the s x s scores are priced from their "
                     "GEMMs and HBM passes (planner/cost/layer.py UNFUSED_SCORE_PASSES), not from a measured unfused "
                     "attention kernel")
    return notes
