"""The valid inputs every fuzz case starts from: a tiny MoE model (as YAML, as Megatron flags, as a
launcher script, as HuggingFace configs of six families), a two-type cluster, a solved plan.json and
a Megatron training log.  Each is small, so that a case runs in milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tools.fuzz.mutations import to_yaml

TINY_MODEL: dict[str, Any] = {
    "name": "tiny-moe",
    "num_layers": 4,
    "hidden_size": 256,
    "ffn_hidden_size": 512,
    "num_attention_heads": 8,
    "num_query_groups": 4,
    "vocab_size": 1024,
    "swiglu": True,
    "normalization": "RMSNorm",
    "add_bias_linear": False,
    "num_experts": 8,
    "moe_router_topk": 2,
    "moe_token_dispatcher_type": "alltoall",
    "moe_grouped_gemm": True,
    "training": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 1024, "precision": "bf16",
                 "use_distributed_optimizer": True},
}
TINY_FLAGS = ("--num-layers 4 --hidden-size 256 --ffn-hidden-size 512 --num-attention-heads 8 --group-query-attention "
              "--num-query-groups 4 --vocab-size 1024 --seq-length 1024 --max-position-embeddings 1024 --swiglu "
              "--normalization RMSNorm --disable-bias-linear --num-experts 8 --moe-router-topk 2 "
              "--moe-token-dispatcher-type alltoall --moe-grouped-gemm --micro-batch-size 1 --global-batch-size 64 "
              "--bf16 --use-distributed-optimizer")
TINY_CLUSTER: dict[str, Any] = {
    "name": "fuzz-cluster",
    "groups": [{"device_type": "H800", "num_nodes": 1, "gpus_per_node": 8},
               {"device_type": "MI300X", "num_nodes": 1, "gpus_per_node": 8}],
    "links": [{"between": ["H800", "MI300X"], "kind": "host-memory"}],
}
HF_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
              "vocab_size": 1024, "max_position_embeddings": 2048, "tie_word_embeddings": False},
    "mixtral": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 256,
                "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
                "vocab_size": 1024, "max_position_embeddings": 2048, "num_local_experts": 8,
                "num_experts_per_tok": 2},
    "qwen2_moe": {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 256,
                  "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
                  "num_key_value_heads": 4, "vocab_size": 1024, "max_position_embeddings": 2048, "num_experts": 8,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 256,
                  "decoder_sparse_step": 1, "mlp_only_layers": [0], "tie_word_embeddings": False},
    "deepseek_v3": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 256,
                    "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 1024,
                    "max_position_embeddings": 2048, "q_lora_rank": 128, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
                    "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
                    "moe_intermediate_size": 128, "n_shared_experts": 1, "first_k_dense_replace": 1,
                    "moe_layer_freq": 1, "num_nextn_predict_layers": 1},
    # GLM-4.5-Air's keys (tests/data/hf_configs/GLM-4.5-Air.json), shrunk; head_dim differs from hidden / heads and
    # n_group > 1, so that --kv-channels and group-limited routing are read
    "glm4_moe": {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 256,
                 "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
                 "head_dim": 64, "vocab_size": 1024, "max_position_embeddings": 2048, "hidden_act": "silu",
                 "rms_norm_eps": 1e-05, "rope_theta": 1000000, "partial_rotary_factor": 0.5, "attention_bias": True,
                 "use_qk_norm": True, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                 "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
                 "norm_topk_prob": True, "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1,
                 "tie_word_embeddings": False},
    # OLMoE-1B-7B-0924's keys (tests/data/hf_configs/OLMoE-1B-7B-0924.json), shrunk, with a clip_qkv to read
    "olmoe": {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 256,
              "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
              "vocab_size": 1024, "max_position_embeddings": 2048, "hidden_act": "silu", "rms_norm_eps": 1e-05,
              "rope_theta": 10000.0, "attention_bias": False, "num_experts": 8, "num_experts_per_tok": 2,
              "norm_topk_prob": False, "router_aux_loss_coef": 0.01, "clip_qkv": 8.0, "tie_word_embeddings": False},
}
SCRIPT = """#!/bin/bash
# a launcher as people write them
set -euo pipefail
GPUS_PER_NODE=${{GPUS_PER_NODE:-8}}
NNODES=${{NNODES:-1}}
CHECKPOINT_PATH=/ckpt/tiny
{extra}
MODEL_ARGS=(
    --num-layers {layers}
    --hidden-size 256
    --ffn-hidden-size 512
    --num-attention-heads 8
    --group-query-attention
    --num-query-groups 4
    --vocab-size 1024
    --seq-length 1024
    --max-position-embeddings 1024
    --swiglu
    --normalization RMSNorm
    --disable-bias-linear
)
MOE_ARGS=(--num-experts 8 --moe-router-topk 2 --moe-token-dispatcher-type alltoall --moe-grouped-gemm)
TRAIN_ARGS=(--micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer)
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py \\
    "${{MODEL_ARGS[@]}}" "${{MOE_ARGS[@]}}" "${{TRAIN_ARGS[@]}}" \\
    --save $CHECKPOINT_PATH
"""
LOG_LINE = (" [2024-11-20 08:{minute:02d}:00] iteration {it:>8}/{total:>8} | consumed samples: {samples:>12} | "
            "elapsed time per iteration (ms): {elapsed} | throughput per GPU (TFLOP/s/GPU): 12.0 | "
            "learning rate: 1.000000E-04 | global batch size: {gbs:>5} | lm loss: 8.000000E+00 |")
MEMORY_LINE = ("[Rank {rank}] (after {it} iterations) memory (MB) | allocated: {a} | max allocated: {a} | "
               "reserved: {r} | max reserved: {r}")

DEVICES = ("H800", "MI300X", "910B", "A100", "H100", "h800", "mi300x", "V100", "A40", "Gaudi2")
BAD_DEVICES = ("XPU", "", "H8OO", "H800 H800", "Ｈ800", "\u200bH800", "-", "*")
TINY_FILE = "tiny.yaml"  # the name TINY_MODEL gets in a case's directory

_CACHE: dict[str, Any] = {}  # documents built once per process: the base plan, the H800 profile


def base_plan_document() -> dict[str, Any]:
    """A valid plan.json for the tiny model on H800:8 (EP 8, DP 8), built with the planner's own types."""
    if "doc" not in _CACHE:
        import os
        import tempfile

        from planner.inputs.plan_file import made_for
        from planner.inputs.resolve import resolve_run
        from planner.output.report import plan_json
        from planner.profile_tables import ProfileSet
        from planner.schemas.cluster import ClusterSpec, NodeGroup
        from planner.schemas.plan import Plan, StagePlan

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, TINY_FILE)
            with open(path, "wb") as fh:
                fh.write(to_yaml(TINY_MODEL))
            run = resolve_run(model=path, world_size=8)
        cluster = ClusterSpec(name="H800:8", groups=(NodeGroup(device_type="H800", num_nodes=1, gpus_per_node=8),))
        plan = Plan(runtime="megatron", tp=1, cp=1, ep=8, etp=1, vpp=1, mbs=1, gbs=64, sequence_parallel=False,
                    stages=(StagePlan(device_type="H800", num_layers=4, dp=8),))
        _CACHE["doc"] = {
            "status": "OPTIMAL", "runtime": "megatron", "model": run.model.name, "cluster": "H800:8",
            "world_size": 8, "cluster_gpus": 8, "num_microbatches": plan.num_microbatches, "plan": plan_json(plan),
            "inputs": {"run": run.model_dump(mode="json"), "cluster": cluster.model_dump(mode="json")},
            "made_for": made_for(run, cluster, ProfileSet.load()),
        }
    return json.loads(json.dumps(_CACHE["doc"]))


def log_text(elapsed: list[str], *, gbs: int = 64, memory: bool = True, timers: str = "") -> bytes:
    """A Megatron log: one iteration line per elapsed time (ms, as text), memory lines after the first,
    and `timers` (a timer block) after the third."""
    lines = []
    for i, value in enumerate(elapsed, 1):
        lines.append(LOG_LINE.format(minute=i % 60, it=i, total=len(elapsed), samples=i * gbs, elapsed=value, gbs=gbs))
        if memory and i == 1:
            lines += [MEMORY_LINE.format(rank=r, it=i, a="1000.00", r="1200.00") for r in (0, 4)]
        if timers and i == 3:
            lines.append(timers)
    return ("\n".join(lines) + "\n").encode()


def h800_profile_document() -> dict[str, Any]:
    """The shipped H800 device profile as a mapping (a fresh copy each call)."""
    if "device" not in _CACHE:
        source = Path(__file__).resolve().parents[2] / "profiles" / "devices" / "H800.yaml"
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        _CACHE["device"] = yaml.load(source.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506
    return json.loads(json.dumps(_CACHE["device"]))
