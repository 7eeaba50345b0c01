"""The planner's parameter count against the model Megatron itself builds (issue 31: a gated MLP has three
matrices, --quick-geglu included).

tools/megatron_params.py builds megatron-core's GPT model on PyTorch's meta device in the validator environment
(`.ci/megatron_env.sh`) and counts its parameters; the flags it gets are the ones the planner's launcher writes for
the model (planner/megatron/flags.py `model_flags`), on one GPU.  Checked for every preset, every HuggingFace config
fixture and every structure of model among the published calibration runs, each with its layers cut to a few of
every kind (`_fewer_layers`: the sizes of every layer are the model's own).  Without that environment the test skips.
"""

from __future__ import annotations

import itertools
import json
import shlex
import subprocess

import pytest

from planner.calibration.runs import load_runs
from planner.cost.flops import parameter_counts
from planner.inputs.hf_config import model_from_hf_config
from planner.inputs.megatron_flags import parse_megatron_flags
from planner.inputs.presets import list_model_presets, load_model_preset
from planner.megatron.flags import model_flags
from planner.schemas.model import ModelSpec

from helpers import hf_configs
from helpers.megatron import NEEDS_MEGATRON, PYTHON, ROOT

pytestmark = [pytest.mark.slow, NEEDS_MEGATRON]  # builds ~25 models in Megatron (15 s; 60 s at their full depth)


NO_PARAMETERS = {"name", "moe_layer_pattern", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
                 "moe_router_force_load_balancing", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
                 "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_router_score_function",
                 "moe_router_pre_softmax", "moe_router_dtype", "moe_grouped_gemm", "moe_router_topk_scaling_factor"}
"""Settings that add or remove no parameter (routing, dispatch, kernels) and sizes that only scale them."""


def _structure(model: ModelSpec) -> str:
    """What decides which parameters a model has (its switches and which optional sizes it sets), not how many:
    the runs' models are built once per structure the presets and configs do not already have."""
    fields = model.model_dump(exclude=NO_PARAMETERS)
    return json.dumps({k: v if isinstance(v, (bool, str)) else v is None for k, v in fields.items()}, sort_keys=True)


def _buildable(model: ModelSpec) -> ModelSpec:
    """On one CPU process: the alltoall dispatcher (DeepEP needs TPxEP > 1; dispatchers hold no parameters), and
    no QK norms on multi-latent attention without a Q latent, which megatron-core 0.19's local (non-Transformer-
    Engine) layer specs cannot build (DeepSeek-V2-Lite: "qk_layernorm requires TransformerEngine ..."; counted
    without them on both sides, the KV latent norm is checked on DeepSeek-V3)."""
    update = {"moe_token_dispatcher_type": "alltoall"} if model.is_moe else {}
    if model.multi_latent_attention and model.q_lora_rank is None and model.qk_layernorm:
        update["qk_layernorm"] = False
    return model.model_copy(update=update)


DENSE_RUN, MOE_RUN = 2, 3
"""The most layers `_fewer_layers` keeps of each run of like layers: a model with both kinds keeps different numbers
of each, so a count that takes one kind's number of layers for the other's still differs from Megatron's."""


def _fewer_layers(model: ModelSpec) -> ModelSpec:
    """The model with each run of like layers (dense or MoE; windowed or not, where the windows are given per layer)
    cut to at most DENSE_RUN or MOE_RUN layers, in order: every kind of layer stays, the last one too (an MTP layer
    is built like it), at the model's own sizes, and the counts per layer are what Megatron checks.  Building a
    model's every layer took most of the test's minute (DeepSeek-V3: 9 s) and checks nothing more: the planner
    multiplies each kind's count by its number of layers (`parameter_counts`)."""
    windows = model.layer_is_windowed if isinstance(model.window_attn_skip_freq, tuple) else None
    kinds = list(zip(model.layer_is_moe, windows or itertools.repeat(None)))
    kept = [k for kind, run in itertools.groupby(kinds) for k in list(run)[: MOE_RUN if kind[0] else DENSE_RUN]]
    update: dict = {"num_layers": len(kept)}
    if model.moe_layer_pattern is not None:
        update["moe_layer_pattern"] = tuple(int(moe) for moe, _ in kept)
    if windows is not None:
        update["window_attn_skip_freq"] = tuple(int(w) for _, w in kept)
    return model.model_validate({**model.model_dump(), **update})


def _models() -> dict[str, ModelSpec]:
    """Every preset and HuggingFace config fixture (those equal to a preset once), and the calibration runs' models
    of a structure not among them (`_structure`)."""
    models = {f"preset {p}": load_model_preset(p)[0] for p in list_model_presets()}
    for name in dir(hf_configs):
        cfg = getattr(hf_configs, name)
        model = model_from_hf_config(cfg, name) if isinstance(cfg, dict) and "model_type" in cfg else None
        if model and all(model.model_dump(exclude={"name"}) != m.model_dump(exclude={"name"}) for m in models.values()):
            models[f"config.json {name}"] = model
    seen = {_structure(m) for m in models.values()}
    for row in load_runs():
        model = parse_megatron_flags(shlex.split(row["megatron_args"])).model
        if _structure(model) not in seen:
            seen.add(_structure(model))
            models[f"run {row['id']}"] = model
    return {name: _buildable(_fewer_layers(model)) for name, model in models.items()}


def test_parameter_count_is_the_model_megatron_builds():
    models = _models()
    cases = [{"name": name, "argv": [t for flag, values in model_flags(m) for t in (flag, *values)]
              + ["--micro-batch-size", "1", "--global-batch-size", "8"]} for name, m in models.items()]
    proc = subprocess.run([PYTHON, str(ROOT / "tools" / "megatron_params.py")], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = {r["name"]: r for r in json.loads(proc.stdout)}
    assert not [f"{n}: {r['error']}" for n, r in built.items() if not r["ok"]]
    wrong = {name: (sum(parameter_counts(m).values()), built[name]["parameters"]) for name, m in models.items()
             if sum(parameter_counts(m).values()) != built[name]["parameters"]}
    assert not wrong, wrong
    assert any(m.quick_geglu for m in models.values())  # gpt-oss's gated experts are among them
    kinds = {(m.layer_is_moe[-1], m.mtp_num_layers > 0, m.multi_latent_attention, bool(m.moe_shared_expert_intermediate_size))
             for m in models.values()}
    assert {(True, True, True, True), (False, False, False, False)} <= kinds  # MoE + MTP + MLA + shared; dense
    assert any(not all(m.layer_is_moe) and any(m.layer_is_moe) for m in models.values())  # dense and MoE layers
