"""Mutations: the wrong values a fuzz case puts into a field, what each field accepts, and the
structural changes to a whole JSON/YAML document (nesting, aliases, bytes, size, keys).

`FieldRule.accepts(value)` is False only when the value is certainly invalid (a case built from it
must be refused); None when the value has the right kind and range and may still be refused by a
rule between fields.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

import yaml

from planner.schemas.types import (
    MAX_BATCH, MAX_EXPERTS, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LENGTH, MAX_SIZE, PHYSICAL_RANGES,
)

NAN, INF = float("nan"), float("inf")
BIG_INT = "__FUZZ_BIG_INT__"  # replaced by a 5,000-digit integer in the serialized text
BIG_DIGITS = "9" * 5000

# (value, label) pairs that fit an int / float / bool / text field of the wrong kind or range
INT_VALUES: tuple[tuple[Any, str], ...] = (
    (True, "true"), (False, "false"), ("8", "the string '8'"), ("abc", "text"), (2.5, "2.5"), (4.0, "4.0"),
    (-1, "-1"), (0, "0"), (10**9, "10^9"), (10**30, "10^30"), (BIG_INT, "a 5,000-digit integer"), (None, "null"),
    ([4], "a list"), ({"a": 1}, "a mapping"), (NAN, "NaN"), (INF, "infinity"), ("", "an empty string"),
    ("²", "a superscript digit"), (3, "3"), (2, "2"), (16, "16"), (7, "7"), (12345, "12345"),
)
FLOAT_VALUES: tuple[tuple[Any, str], ...] = (
    (True, "true"), ("1.5", "the string '1.5'"), ("abc", "text"), (-1.0, "-1.0"), (0.0, "0.0"), (NAN, "NaN"),
    (INF, "infinity"), (-INF, "-infinity"), (1e308, "1e308"), (BIG_INT, "a 5,000-digit integer"), (None, "null"),
    ([1.0], "a list"), (1e-300, "1e-300"), (2, "2"), (1.25, "1.25"),
)
BOOL_VALUES: tuple[tuple[Any, str], ...] = (
    ("no", "the string 'no'"), ("yes", "the string 'yes'"), ("true", "the string 'true'"), (1, "1"), (0, "0"),
    (None, "null"), ([], "a list"), (2.0, "2.0"),
)
TEXT_VALUES: tuple[tuple[Any, str], ...] = (
    ("bogus", "an unknown name"), (5, "5"), (None, "null"), ("", "an empty string"), (True, "true"), ([], "a list"),
)


@dataclass(frozen=True)
class FieldRule:
    """What a field accepts: kind int/float/bool/choice/text, a range, optional (null allowed)."""

    kind: str
    low: float | None = None
    high: float | None = None
    optional: bool = False
    low_open: bool = False  # float fields with gt (not ge)
    choices: tuple[str, ...] = ()

    def values(self) -> tuple[tuple[Any, str], ...]:
        return {"int": INT_VALUES, "float": FLOAT_VALUES, "bool": BOOL_VALUES}.get(self.kind, TEXT_VALUES)

    def accepts(self, value: Any) -> bool | None:
        """True/False when certain, None when the value has the right kind and range (it may still be
        refused by a rule between fields)."""
        if value is None:
            return None if self.optional else False
        if value == BIG_INT:
            return False
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                return False
            return None if self._in_range(value) else False
        if self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return False
            return None if self._in_range(value) else False
        if self.kind == "bool":
            return None if isinstance(value, bool) else False
        if self.kind == "choice":
            return None if value in self.choices else False
        return None if isinstance(value, str) else False

    def _in_range(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or value <= self.high


MODEL_FIELDS: dict[str, FieldRule] = {
    "num_layers": FieldRule("int", 1, MAX_LAYERS),
    "hidden_size": FieldRule("int", 1, MAX_SIZE),
    "ffn_hidden_size": FieldRule("int", 1, MAX_SIZE, optional=True),
    "num_attention_heads": FieldRule("int", 1, MAX_SIZE),
    "num_query_groups": FieldRule("int", 1, MAX_SIZE, optional=True),
    "kv_channels": FieldRule("int", 1, MAX_SIZE, optional=True),
    "vocab_size": FieldRule("int", 1, MAX_SIZE),
    "num_experts": FieldRule("int", 1, MAX_EXPERTS, optional=True),
    "moe_router_topk": FieldRule("int", 1, MAX_EXPERTS),
    "moe_ffn_hidden_size": FieldRule("int", 1, MAX_SIZE, optional=True),
    "mtp_num_layers": FieldRule("int", 0, MAX_LAYERS),
    "qk_pos_emb_head_dim": FieldRule("int", 0, MAX_SIZE),
    "moe_expert_capacity_factor": FieldRule("float", 0, MAX_EXPERTS, optional=True, low_open=True),
    "swiglu": FieldRule("bool"),
    "add_bias_linear": FieldRule("bool"),
    "moe_grouped_gemm": FieldRule("bool"),
    "qk_layernorm": FieldRule("bool"),
    "untie_embeddings_and_output_weights": FieldRule("bool"),
    "normalization": FieldRule("choice", choices=("LayerNorm", "RMSNorm")),
    "moe_token_dispatcher_type": FieldRule("choice", choices=("allgather", "alltoall", "flex")),
    "name": FieldRule("text"),
}
REQUIRED_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "groups")
TRAINING_FIELDS: dict[str, FieldRule] = {
    "micro_batch_size": FieldRule("int", 1, MAX_BATCH),
    "global_batch_size": FieldRule("int", 1, MAX_BATCH),
    "seq_length": FieldRule("int", 1, MAX_SEQ_LENGTH),
    "precision": FieldRule("choice", choices=("bf16", "fp16", "fp8", "fp32")),
    "use_distributed_optimizer": FieldRule("bool"),
}
def _physical(name: str, optional: bool = False) -> FieldRule:
    """A float field with the physical range the schemas check (planner/schemas/types.py)."""
    low, high, _unit, _real = PHYSICAL_RANGES[name]
    return FieldRule("float", low, high, optional=optional)


GROUP_FIELDS: dict[str, FieldRule] = {
    "num_nodes": FieldRule("int", 1, MAX_GPUS),
    "gpus_per_node": FieldRule("int", 1, 1024),
    "intra_node_bandwidth_gb_per_s": _physical("bandwidth", optional=True),
    "inter_node_bandwidth_gb_per_s": _physical("bandwidth", optional=True),
    "device_type": FieldRule("text"),
}
LINK_FIELDS: dict[str, FieldRule] = {
    "bandwidth_gb_per_s": _physical("bandwidth"),
    "latency_us": _physical("latency"),
    "kind": FieldRule("text"),
}
HF_INT_KEYS: dict[str, FieldRule] = {
    "hidden_size": FieldRule("int", 1, MAX_SIZE),
    "intermediate_size": FieldRule("int", 1, MAX_SIZE),
    "num_hidden_layers": FieldRule("int", 1, MAX_LAYERS),
    "num_attention_heads": FieldRule("int", 1, MAX_SIZE),
    "num_key_value_heads": FieldRule("int", 1, MAX_SIZE, optional=True),
    "vocab_size": FieldRule("int", 1, MAX_SIZE),
    "max_position_embeddings": FieldRule("int", 1, MAX_SEQ_LENGTH, optional=True),
    "num_local_experts": FieldRule("int", 1, MAX_EXPERTS),
    "num_experts": FieldRule("int", 1, MAX_EXPERTS),
    "num_experts_per_tok": FieldRule("int", 1, MAX_EXPERTS),
    "moe_intermediate_size": FieldRule("int", 1, MAX_SIZE),
    "shared_expert_intermediate_size": FieldRule("int", 0, MAX_SIZE, optional=True),
    "decoder_sparse_step": FieldRule("int", 1, MAX_SIZE, optional=True),
    "q_lora_rank": FieldRule("int", 1, MAX_SIZE, optional=True),
    "kv_lora_rank": FieldRule("int", 1, MAX_SIZE),
    "qk_nope_head_dim": FieldRule("int", 1, MAX_SIZE),
    "qk_rope_head_dim": FieldRule("int", 0, MAX_SIZE),
    "v_head_dim": FieldRule("int", 1, MAX_SIZE),
    "n_routed_experts": FieldRule("int", 0, MAX_EXPERTS, optional=True),
    "n_shared_experts": FieldRule("int", 0, MAX_EXPERTS, optional=True),
    "first_k_dense_replace": FieldRule("int", 0, 4, optional=True),
    "moe_layer_freq": FieldRule("int", 1, MAX_SIZE, optional=True),
    "num_nextn_predict_layers": FieldRule("int", 0, MAX_LAYERS, optional=True),
    "tie_word_embeddings": FieldRule("bool", optional=True),
}
_POSITIVE = FieldRule("float", 0, None, optional=True, low_open=True)
_FLAG = FieldRule("bool", optional=True)
_HF_COMMON_KEYS: dict[str, FieldRule] = {
    "hidden_act": FieldRule("choice", choices=("silu", "swish")),  # the gated MLP's; null is no activation
    "rms_norm_eps": _POSITIVE,
    "rope_theta": _POSITIVE,  # an integer too (Megatron's --rotary-base): checked between fields
    "attention_bias": _FLAG,
    "norm_topk_prob": _FLAG,
}
HF_FAMILY_KEYS: dict[str, dict[str, FieldRule]] = {
    # planner/inputs/hf_config.py `_glm4_moe`: the keys it reads besides HF_INT_KEYS, and the keys whose rule
    # differs (Glm4MoeConfig gives moe_intermediate_size 1408 and num_experts_per_tok 8 by default; experts are
    # required; first_k_dense_replace and topk_group are bounded by other keys, checked between fields)
    "glm4_moe": {
        **_HF_COMMON_KEYS,
        "head_dim": FieldRule("int", 1, MAX_SIZE, optional=True),
        "partial_rotary_factor": FieldRule("float", 0, 1, optional=True, low_open=True),
        "use_qk_norm": _FLAG,
        "n_routed_experts": FieldRule("int", 1, MAX_EXPERTS),
        "num_experts_per_tok": FieldRule("int", 1, MAX_EXPERTS, optional=True),
        "moe_intermediate_size": FieldRule("int", 1, MAX_SIZE, optional=True),
        "first_k_dense_replace": FieldRule("int", 0, MAX_LAYERS, optional=True),
        "n_group": FieldRule("int", 1, MAX_SIZE, optional=True),
        "topk_group": FieldRule("int", 1, MAX_SIZE, optional=True),
        "routed_scaling_factor": _POSITIVE,
    },
    # `_olmoe`: OlmoeConfig's num_experts_per_tok defaults to 8; the balancing loss's weight is >= 0
    "olmoe": {
        **_HF_COMMON_KEYS,
        "num_experts_per_tok": FieldRule("int", 1, MAX_EXPERTS, optional=True),
        "router_aux_loss_coef": FieldRule("float", 0, None, optional=True),
        "clip_qkv": _POSITIVE,
        "partial_rotary_factor": FieldRule("float", 0, 1, optional=True, low_open=True),
    },
}
HF_FAMILY_VALUES: dict[str, tuple[tuple[str, Any, str], ...]] = {
    # (key, value, label): values at the edges of the rules between keys, which the generic ones rarely hit
    "glm4_moe": (
        ("n_group", 8, "8 (groups of one expert)"), ("n_group", 4, "4"), ("topk_group", 2, "2"),
        ("n_routed_experts", 2, "2 (one per group)"), ("n_routed_experts", 4, "4"), ("num_hidden_layers", 1, "1"),
        ("first_k_dense_replace", 3, "3"), ("first_k_dense_replace", 0, "0"), ("partial_rotary_factor", 1.5, "1.5"),
        ("rope_theta", 1.5, "1.5"), ("num_experts_per_tok", None, "null (default 8)"),
        ("num_experts_per_tok", 8, "8"), ("n_shared_experts", 0, "0"), ("n_shared_experts", None, "null (default 1)"),
    ),
    "olmoe": (
        ("num_experts", 1, "1"), ("num_experts", 0, "0"), ("num_experts_per_tok", None, "null (default 8)"),
        ("num_experts_per_tok", 9, "9"), ("router_aux_loss_coef", -0.01, "-0.01"), ("router_aux_loss_coef", 0, "0"),
        ("clip_qkv", None, "null"), ("num_key_value_heads", 4, "4"), ("num_key_value_heads", 3, "3"),
        ("partial_rotary_factor", 0.25, "0.25"), ("partial_rotary_factor", 2, "2"), ("rope_theta", 1e308, "1e308"),
    ),
}


DEVICE_FIELDS: dict[str, FieldRule] = {
    "memory_gib": _physical("memory"),
    "memory_overhead_gib": FieldRule("float", 0, None),
    "hbm_bandwidth_tb_per_s": _physical("hbm"),
    "hbm_efficiency": FieldRule("float", 0, 1, low_open=True),
    "gpus_per_node": FieldRule("int", 1, 1024),
}


# --------------------------------------------------------------------------------------------
# Serializing documents (with the few values JSON/YAML cannot spell directly)
# --------------------------------------------------------------------------------------------


def to_json(doc: Any) -> bytes:
    text = json.dumps(doc, indent=1, allow_nan=True)
    return text.replace(f'"{BIG_INT}"', BIG_DIGITS).encode()


def to_yaml(doc: Any) -> bytes:
    text = yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False, allow_unicode=True,
                     width=1 << 20)
    return text.replace(BIG_INT, BIG_DIGITS).encode("utf-8")


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _alias_bomb(levels: int = 9, width: int = 9) -> bytes:
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * width)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return ("\n".join(lines) + "\n").encode()


def _raw_nested(depth: int, style: str) -> bytes:
    if style == "json":
        return ("[" * depth + "1" + "]" * depth).encode()
    if style == "flow":
        return ("x: " + "[" * depth + "1" + "]" * depth + "\n").encode()
    return ("x:\n" + "".join("  " * i + "- \n" for i in range(min(depth, 3000)))).encode()


def document_mutations(rng: random.Random, doc: dict[str, Any], fmt: str, rules: dict[str, FieldRule],
                       *, strict_keys: bool = True) -> tuple[bytes, str, bool | None, tuple[str, ...]]:
    """(file bytes, what, valid?, names) for one mutation of a mapping document.  valid is False when
    the result is certainly invalid, None when it may be valid."""
    dump = to_json if fmt == "json" else to_yaml
    choice = rng.random()
    if choice < 0.55 and rules:  # one field, one value
        key = rng.choice(sorted(rules))
        value, label = rng.choice(rules[key].values())
        mutated = json.loads(json.dumps(doc, allow_nan=True))
        mutated[key] = value
        valid = rules[key].accepts(value)
        return dump(mutated), f"{key} = {label}", valid, (key,)
    structural = [
        "unknown key", "integer key", "duplicate key", "deep nesting", "deep raw nesting", "alias bomb",
        "truncated", "non-UTF-8 byte", "empty", "BOM", "NUL byte", "top-level list", "oversized", "comment only",
        "missing key",
    ]
    what = rng.choice(structural)
    base = dump(doc)
    if what == "unknown key":
        mutated = dict(doc, nmu_layers=4)
        return dump(mutated), what, False if strict_keys else None, ("nmu_layers", "unknown")
    if what == "integer key":
        if fmt == "json":
            return base, "unchanged", None, ()
        return base + b"5: 3\n", what, False if strict_keys else None, ("key 5", "5")
    if what == "duplicate key":
        key = next(iter(doc))
        if fmt == "json":
            text = base.decode().rstrip().rstrip("}") + f', "{key}": {json.dumps(doc[key])}}}'
            return text.encode(), what, False, (key, "twice")
        return base + f"{key}: {json.dumps(doc[key])}\n".encode(), what, False, (key, "twice")
    if what == "deep nesting":
        key = rng.choice(sorted(doc))
        depth = rng.choice((65, 200, 900, 2000))
        mutated = dict(doc, **{key: _nested(depth)})
        try:
            return dump(mutated), f"{key} nested {depth} deep", False, ("nested", "deep")
        except RecursionError:
            return _raw_nested(depth, fmt if fmt == "json" else "flow"), f"nested {depth} deep", False, ("nested",)
    if what == "deep raw nesting":
        depth = rng.choice((100, 5000, 50000))
        style = "json" if fmt == "json" else rng.choice(("flow", "block"))
        return _raw_nested(depth, style), f"{style} nested {depth} deep", False, ("nested", "deep")
    if what == "alias bomb":
        if fmt == "json":
            return base, "unchanged", None, ()
        return _alias_bomb(), what, False, ("values", "aliases")
    if what == "truncated":
        cut = rng.randrange(1, max(2, len(base) - 1))
        return base[:cut], f"truncated at {cut}", False if fmt == "json" else None, ("json", "yaml", "valid")
    if what == "non-UTF-8 byte":
        pos = rng.randrange(len(base))
        return base[:pos] + bytes([rng.choice((0xA5, 0xFF, 0xC3, 0x80))]) + base[pos:], what, False, ("UTF-8",)
    if what == "empty":
        return b"", what, False, ("expected", "mapping", "object", "json")
    if what == "BOM":
        return b"\xef\xbb\xbf" + base, what, None, ()
    if what == "NUL byte":
        pos = rng.randrange(len(base))
        return base[:pos] + b"\x00" + base[pos:], what, False, ("valid", "character", "control")
    if what == "top-level list":
        return dump([doc]), what, False, ("mapping", "object", "expected")
    if what == "oversized":
        pad = b"#" * (1 << 20) if fmt != "json" else b" " * (1 << 20)
        return base + b"\n" + pad + b"\n", what, False, ("larger",)
    if what == "comment only":
        return (b"# nothing here\n" if fmt != "json" else b"null"), what, False, ("mapping", "expected", "object")
    key = rng.choice(sorted(doc))
    mutated = {k: v for k, v in doc.items() if k != key}
    return dump(mutated), f"without {key}", False if key in REQUIRED_KEYS else None, (key,)
