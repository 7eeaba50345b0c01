"""Values the input did not state, which the planner filled in: listed on the run as `assumed`.

Each one is printed as "assumed" with the option that sets it (terminal, JSON `assumed`, summary.md).
Two moments: `input_assumptions` runs when the run is resolved (planner/inputs/resolve.py) and sees
what the source stated; `imbalance_assumption` runs once the profiles are known, because a
calibration (`--profiles DIR`) may state the MoE imbalance.

What counts as assumed, by source:
* preset (`--model mixtral-s`): its global batch and sequence length, and for MoE its token
  dispatcher (presets state the usual Megatron MoE recipe, not your run);
* HF config.json: the global batch (Megatron's default micro-batch x DP), the sequence length
  (the planner's default, capped by the model's context) and the dispatcher (the MoE recipe);
* Megatron flags (`--megatron-args`, `--megatron-script`): any of --global-batch-size,
  --seq-length, --vocab-size, --moe-token-dispatcher-type the flags leave out;
* a model YAML of your own: the global batch when its training block has none;
* dropout, unless the source states both --attention-dropout and --hidden-dropout (or the model file's training
  block both fields): Megatron's default 0.1, which the launcher keeps and the cost model prices;
* the allocator (expandable segments), unless the input script's environment sets PYTORCH_CUDA_ALLOC_CONF (or
  PYTORCH_ALLOC_CONF): the reserved memory is priced with it, and the written launch.sh sets it where the
  environment sets none;
* every MoE model: the router imbalance, unless --moe-imbalance, forced balancing (or padding
  to a capacity factor) or the user's own calibration (`--profiles DIR`) gives it; the shipped
  calibration, fitted on published runs, is still an assumption about the user's router; its source names the
  router setting it rests on (a preset's, HF config's or model YAML's unstated --moe-aux-loss-coeff, priced and
  written as 0.01; flags that leave it out train with Megatron's 0.0, no balancing loss, which no published figure
  measures: extrapolated).
A CLI override (--gbs, --seq) states the value.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from planner.cost.memory import EXPANDABLE_SEGMENTS_ASSUMED
from planner.cost.model import CostModel
from planner.schemas.parallel import Assumption, MegatronRun
from planner.schemas.plan import Plan

DISPATCHER_FLAG = "--moe-token-dispatcher-type"
IMBALANCE_FLAG = "--moe-imbalance"

SOURCES = ("preset", "model-file", "hf-config", "flags")


def _given(flags: Sequence[str], flag: str) -> bool:
    return any(tok == flag or tok.startswith(flag + "=") for tok in flags)


def input_assumptions(
    run: MegatronRun,
    *,
    source: str,
    source_name: str,
    stated_training: Mapping[str, Any],
    stated_model: Mapping[str, Any],
    flags: Sequence[str] = (),
    overrides: Mapping[str, Any] | None = None,
) -> tuple[Assumption, ...]:
    """The assumptions of a resolved run.  `source` is one of SOURCES; `stated_training` /
    `stated_model` are the fields the source itself gave (before defaults were filled in);
    `flags` the Megatron flags for source "flags"; `overrides` the CLI overrides applied."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; allowed: {', '.join(SOURCES)}")
    ov = {k for k, v in (overrides or {}).items() if v is not None}
    model, training = run.model, run.training
    out: list[Assumption] = []
    where = {"preset": f"preset {source_name}", "hf-config": "not in config.json",
             "model-file": f"not in {source_name}", "flags": "not in the flags"}[source]

    if "gbs" not in ov:
        if source in ("preset", "hf-config"):  # neither states your batch
            out.append(Assumption(name="global batch size", value=training.global_batch_size, flag="--gbs",
                                  source=where))
        elif "global_batch_size" not in stated_training:
            out.append(Assumption(name="global batch size", value=training.global_batch_size, flag="--gbs",
                                  source=f"{where}; Megatron's default micro-batch x DP"))
    if "seq" not in ov:
        if source in ("preset", "hf-config"):
            out.append(Assumption(name="sequence length", value=model.seq_length, flag="--seq", source=where))
        elif source == "flags" and "seq_length" not in stated_model:
            out.append(Assumption(name="sequence length", value=model.seq_length, flag="--seq", source=where))
    if source == "flags" and not _given(flags, "--vocab-size"):
        out.append(Assumption(name="vocabulary", value=model.vocab_size, flag="--vocab-size", source=where))
    if "attention_dropout" not in stated_training or "hidden_dropout" not in stated_training:
        out.append(_dropout_assumption(run, source, where))
    if training.expandable_segments is None and EXPANDABLE_SEGMENTS_ASSUMED:
        out.append(Assumption(
            name="allocator", value="expandable_segments:True", flag="PYTORCH_CUDA_ALLOC_CONF",
            source=f"{where if source != 'flags' else 'no allocator variable in the input'}: the reserved memory is "
                   "priced with expandable segments, as NVIDIA's Megatron-Bridge launch templates set them (torch's "
                   "default is off, which reserves more); the written launch.sh sets it where the environment sets "
                   "none; export it in a --megatron-script to state yours"))
    if model.is_moe:
        if source in ("preset", "hf-config"):
            out.append(Assumption(name="token dispatcher", value=model.moe_token_dispatcher_type,
                                  flag=DISPATCHER_FLAG, source=f"{where} (usual MoE recipe)"))
        elif source == "flags" and "moe_token_dispatcher_type" not in stated_model:
            out.append(Assumption(name="token dispatcher", value=model.moe_token_dispatcher_type,
                                  flag=DISPATCHER_FLAG, source=f"{where}; Megatron's default"))
    return tuple(out)


def _dropout_assumption(run: MegatronRun, source: str, where: str) -> Assumption:
    """Dropout the input left at Megatron's default (0.1 attention, 0.1 hidden), which the written launcher keeps: the
    cost model prices its time (a fused attention core's dropout, the hidden-dropout masks), and NVIDIA's recipes for
    current models turn both off."""
    tr = run.training
    flag = ("--attention-dropout, --hidden-dropout" if source == "flags"
            else "training: attention_dropout, hidden_dropout")  # the two values shown, attention/hidden
    how = ("--attention-dropout and --hidden-dropout" if source == "flags"
           else "attention_dropout and hidden_dropout in a model YAML's training block")
    return Assumption(name="dropout", value=f"{tr.attention_dropout:g}/{tr.hidden_dropout:g}", flag=flag,
                      source=f"{where}: attention/hidden at Megatron's default, which the launcher keeps and the "
                             f"cost model prices (NVIDIA's recipes set 0.0; set {how})")


def imbalance_assumption(run: MegatronRun, cluster, profiles, *, user_profiles: bool = False,
                         whose: str = "the input's") -> MegatronRun:
    """The run with the MoE router imbalance (the busiest EP rank's tokens over the mean) added to
    `assumed` unless something states it: --moe-imbalance, forced balancing or a capacity factor
    with padding (the cost model's routing regime), or router statistics from the user's own --profiles
    (`user_profiles`).  The value printed is the one the run's own plan gets (its EP size and tokens per micro-batch);
    other plans get their own (planner/cost/dispatch.py `Routing.imbalance`).  The shipped calibration (published
    runs) is an assumption about your router.  `whose`: the plan the run's degrees are, in words ("the pick's")."""
    model = run.model
    if user_profiles and profiles.moe_imbalance_factor() is not None:
        return run  # the user's own router statistics state it (measured_imbalance_notes)
    real = _real_routing(run, cluster, profiles, whose)
    if real is None:
        return run
    routing, ep, value, at = real
    notes = [routing.assumed] if routing.assumed else []
    local = model.num_experts // ep
    experts = f"{local} expert{'s' if local != 1 else ''}"
    others = "every plan, the pick included, gets" if whose == "the pick's" else "a plan of other degrees gets"
    source = (f"real routing {at}, {experts} per rank; {others} its own at its EP size and micro-batch: "
              f"{routing.source}{_clipped(model)}")
    if value < 1.0:
        notes.append("below 1: the capacity drops tokens, and the busiest rank computes less than the balanced load")
    source = "; ".join([source] + notes)
    extra = Assumption(name="MoE imbalance", value=round(value, 4), flag=IMBALANCE_FLAG, source=source)
    return run.model_copy(update={"assumed": tuple(run.assumed) + (extra,)})


def _real_routing(run: MegatronRun, cluster, profiles, whose: str = "the input's"):
    """(routing, EP size, the busiest rank's load over the mean, that EP in words) of the run's own plan under real
    routing (its EP size, else 8; its tokens per micro-batch), or None where nothing is left to assume: a dense
    model, --moe-imbalance, forced balancing or padding to capacity."""
    model, training = run.model, run.training
    if not model.is_moe or training.moe_imbalance_factor is not None or model.moe_router_force_load_balancing:
        return None
    routing = CostModel(model, training, cluster, profiles).routing
    if routing.regime not in ("dropless", "capacity"):
        return None
    par = run.parallel
    sp = par.tp if par.tp > 1 and par.sequence_parallel else 1
    ep = par.ep if par.ep > 1 else 8
    at = f"at {whose} EP {ep}" if par.ep > 1 else f"at EP {ep} ({whose} EP is 1)"
    return routing, ep, routing.imbalance(ep, training.micro_batch_size * model.seq_length / par.cp / sp), at


def _clipped(model) -> str:
    cf = model.moe_expert_capacity_factor
    return f", clipped at --moe-expert-capacity-factor {cf:g}" if cf is not None else ""


def measured_imbalance_notes(run: MegatronRun, cluster, profiles, whose: str = "the input's") -> list[str]:
    """The MoE imbalance the user's own router statistics (--profiles, `calibrate --router-stats`) give the run:
    not an assumption, but a value the output names with where it came from, as --moe-imbalance promises (the
    shipped corrections hold none: a calibrated imbalance comes from a --profiles directory)."""
    if not profiles.user_files or profiles.moe_imbalance_factor() is None:
        return []
    real = _real_routing(run, cluster, profiles, whose)
    if real is None:
        return []
    routing, _, value, at = real
    return [f"MoE imbalance {value:.4g} (the busiest EP rank's tokens over the mean, {at}; every plan, the pick "
            f"included, gets its own at its EP size) from your router statistics in --profiles: {routing.source}"
            f"{_clipped(run.model)}"]


def as_planned(run: MegatronRun, plan: Plan) -> MegatronRun:
    """The run with the degrees and micro-batch of `plan` (solve's pick, a saved plan priced by estimate --plan):
    what the notes about the run's own plan (the MoE imbalance at its EP size and tokens per micro-batch) describe."""
    parallel = run.parallel.model_copy(update={"tp": plan.tp, "cp": plan.cp, "ep": plan.ep,
                                               "sequence_parallel": plan.sequence_parallel})
    return run.model_copy(update={"parallel": parallel,
                                  "training": run.training.model_copy(update={"micro_batch_size": plan.mbs})})
