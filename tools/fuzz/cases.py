"""Fuzz cases: one generator per input kind, each a valid input with one mutation.

A case is a command line (`argv`, where `{d}` stands for the case's own directory) plus the files
it names.  `expect="reject"` means the input is certainly invalid: the command must exit with status
2 and one `error:` line that names one of `names` (a flag, a field or a file).  `expect="any"` means
the input may or may not be valid (a divisor that happens to break a rule, say): any exit status
0, 2 or 3 is fine, but never a traceback or a hang.

Case `i` of seed `s` is always the same case (`make_case(s, i)`), so every finding has a reproducer.
"""

from __future__ import annotations

import json
import math
import random
import shlex
from dataclasses import dataclass, replace
from typing import Callable

from tools.fuzz.classes import (
    gen_edited_plan, gen_extremes, gen_poisoned_log, gen_script_loop, gen_signal, gen_user_files,
)
from tools.fuzz.inputs import (
    BAD_DEVICES, DEVICES, HF_CONFIGS, SCRIPT, TINY_CLUSTER, TINY_FILE, TINY_FLAGS, TINY_MODEL, base_plan_document,
    h800_profile_document, log_text,
)
from tools.fuzz.mutations import (
    BIG_INT, DEVICE_FIELDS, FLOAT_VALUES, GROUP_FIELDS, HF_FAMILY_KEYS, HF_FAMILY_VALUES, HF_INT_KEYS, LINK_FIELDS,
    MODEL_FIELDS, NAN, TEXT_VALUES, TRAINING_FIELDS, FieldRule, document_mutations, to_json, to_yaml,
)
from planner.profile_tables import TIME_FACTOR_RANGE
from planner.schemas.types import MAX_GPUS, MAX_INT, MAX_LAYERS, PHYSICAL_RANGES


@dataclass(frozen=True)
class Case:
    index: int
    kind: str
    what: str
    argv: tuple[str, ...]
    files: tuple[tuple[str, bytes], ...] = ()  # relative path -> content; a path ending in "/" is a directory
    expect: str = "any"  # "reject" or "any"
    names: tuple[str, ...] = ()
    out: str | None = None  # relative path of the command's --out, checked for half-written output
    timeout_s: float = 30.0
    owned: tuple[str, ...] = ()  # case files the planner may replace (a genuine earlier output); all others
    # must be byte for byte the same afterwards, whatever the exit status (else: data loss)
    signal: tuple[str, float] | None = None  # (SIGTERM/SIGINT/SIGHUP, seconds): run as a process, signalled

    def command_line(self) -> str:
        """The command as a person would type it (files are listed separately)."""
        return "python cli.py " + " ".join(shlex.quote(_short(a.replace("{d}", "$D"))) for a in self.argv)

    def describe(self) -> str:
        files = ", ".join(f"{p} ({len(b)} bytes)" for p, b in self.files)
        return f"#{self.index} [{self.kind}] {self.what}: {self.command_line()}" + (f"  files: {files}" if files else "")


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else f"{text[:60]}...<{len(text)} chars>...{text[-30:]}"

# --------------------------------------------------------------------------------------------
# Generators, one per input kind
# --------------------------------------------------------------------------------------------

CaseParts = tuple[str, tuple[str, ...], dict[str, bytes], bool | None, tuple[str, ...], str | None]
Generator = Callable[[random.Random], CaseParts]
TINY_ARGS = ("--model", "{d}/" + TINY_FILE)


def _with_tiny(files: dict[str, bytes]) -> dict[str, bytes]:
    return {TINY_FILE: to_yaml(TINY_MODEL), **files}


def gen_flags(rng: random.Random) -> CaseParts:
    """CLI options of estimate/solve/compare: degrees, batch, recompute, layout, time limit, delta."""
    int_bad = ("0", "-1", "abc", "2.5", "nan", "inf", "", "²", "1e3", "9" * 30, "9" * 5000, "0x10", " 2", "+4")
    cluster = rng.choice(("H800:8", "H800:16", "H800:8,MI300X:8"))
    base = ["estimate", *TINY_ARGS, "--cluster", cluster]
    r = rng.random()
    if r < 0.45:
        opt = rng.choice(("--tp", "--pp", "--cp", "--ep", "--etp", "--vpp", "--mbs", "--gbs", "--seq"))
        if rng.random() < 0.5:
            value = rng.choice(int_bad)
            # click's int accepts surrounding spaces and a plus sign; "9"*30 is a valid int that a limit refuses
            valid = None if value in (" 2", "+4") else False
            return "flags", (*base, opt, value), _with_tiny({}), valid, (opt,), None
        value = str(rng.choice((1, 2, 3, 4, 8, 16, 32, 64, 7, 1024, 10**6)))
        certain = {("--tp", "3"), ("--ep", "3"), ("--pp", "3"), ("--tp", "16"), ("--tp", "32"), ("--cp", "3"),
                   ("--ep", "7"), ("--pp", "7"), ("--tp", "7")}
        return "flags", (*base, opt, value), _with_tiny({}), False if (opt, value) in certain else None, (opt,), None
    if r < 0.6:
        value = rng.choice(("none", "selective", "full", "full-block:1", "full-uniform:2", "selective:moe_act",
                            "bogus", "full-block:-1", "full-uniform:0", "selective:nosuch", "full:", "", "full-block:x",
                            "full-block:" + "9" * 5000))
        valid = None if value in ("none", "selective", "full", "full-block:1", "full-uniform:2", "selective:moe_act",
                                  "") else False
        return "flags", (*base, "--recompute", value), _with_tiny({}), valid, ("--recompute",), None
    if r < 0.7:
        value = rng.choice(("E|t*4|L", "Et*2|t*2L", "t*99999999999", "(t|)*100000", "bogus", "E|t|t|t|t|L", "",
                            "Et*4L", "|" * 1000, "E" + "t" * 4 + "L"))
        return "flags", (*base, "--pp", rng.choice(("1", "2")), "--layout", value), _with_tiny({}), None, \
            ("--layout", "layout"), None
    if r < 0.85:
        opt, bad_values, good_values = rng.choice((
            ("--time-limit", ("nan", "inf", "-1", "0", "abc", "", "1e309", "-inf"), ("0.5", "1", "2.5")),
            ("--delta", ("nan", "2", "-0.1", "inf", "x"), ("0", "0.2", "1")),
            ("--top", ("0", "-1", "x", "nan"), ("1", "3")),
            ("--backend", ("bogus", "", "CPSAT"), ("hsdp",)),
            ("--runtime", ("bogus", "megatron2"), ("flagscale",)),
        ))
        bad = rng.random() < 0.6
        value = rng.choice(bad_values if bad else good_values)
        argv = ("solve", *TINY_ARGS, "--cluster", cluster, "--quiet", "--time-limit", "2", opt, value)
        return "flags", argv, _with_tiny({}), False if bad else None, (opt,), None
    form = rng.choice(("unknown option", "missing value", "missing cluster", "two models", "no model", "extra argument"))
    if form == "unknown option":
        argv, names = (*base, "--tpp", "2"), ("--tpp",)
    elif form == "missing value":
        argv, names = (*base, rng.choice(("--tp", "--gbs", "--recompute"))), ("requires an argument", "--")
    elif form == "missing cluster":
        argv, names = ("estimate", *TINY_ARGS), ("--cluster",)
    elif form == "two models":
        argv, names = (*base, "--megatron-args", TINY_FLAGS), ("--model", "--megatron-args")
    elif form == "no model":
        argv, names = ("estimate", "--cluster", cluster), ("--model",)
    else:
        argv, names = (*base, "stray"), ("stray", "argument")
    return "flags", argv, _with_tiny({}), False, names, None


MEGATRON_INT_FLAGS = ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
                      "--vocab-size", "--seq-length", "--max-position-embeddings", "--num-experts", "--moe-router-topk",
                      "--micro-batch-size", "--global-batch-size")


def gen_megatron_args(rng: random.Random) -> CaseParts:
    """--megatron-args: Megatron's flags with one value or flag changed."""
    tokens = TINY_FLAGS.split()
    cluster = rng.choice(("H800:8", "H800:16"))
    r = rng.random()
    names: tuple[str, ...]
    if r < 0.45:
        flag = rng.choice(MEGATRON_INT_FLAGS)
        value = rng.choice(("abc", "-4", "0", "2.5", "nan", "", "9" * 5000, "1e3", "²", "10000000000000", "true"))
        i = tokens.index(flag)
        tokens[i + 1] = value
        valid: bool | None = False
        if flag == "--num-experts" and value == "0":
            valid = None  # Megatron's 0 experts is a dense model
        what, names = f"{flag} {value[:20]}", (flag,)
    elif r < 0.6:
        value = rng.choice(("-1", "nan", "inf", "abc", "0", "1.25", "2"))
        tokens += ["--moe-expert-capacity-factor", value]
        # Megatron turns a negative (or, in the planner, zero) factor into None: dropless
        valid = None if value in ("1.25", "2", "-1", "0") else False
        what, names = f"--moe-expert-capacity-factor {value}", ("--moe-expert-capacity-factor", "capacity")
    elif r < 0.75:
        deg_flag = rng.choice(("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                               "--expert-model-parallel-size", "--expert-tensor-parallel-size",
                               "--context-parallel-size"))
        value = rng.choice(("1", "2", "3", "4", "8", "16", "32", "0", "-2", "x"))
        tokens += [deg_flag, value]
        valid = False if value in ("0", "-2", "x", "3") or (value in ("16", "32") and cluster == "H800:8"
                                                             and deg_flag != "--expert-tensor-parallel-size") else None
        what, names = f"{deg_flag} {value}", (deg_flag, "parallel", "world", "divisible")
    else:
        form = rng.choice(("drop --num-layers", "dangling flag", "positional", "unbalanced quote", "switch with value",
                           "unknown flag", "duplicate flag", "bad choice"))
        what = form
        if form == "drop --num-layers":
            i = tokens.index("--num-layers")
            del tokens[i:i + 2]
            valid, names = False, ("--num-layers",)
        elif form == "dangling flag":
            tokens.append("--seq-length")
            valid, names = False, ("--seq-length",)
        elif form == "positional":
            tokens.insert(0, "stray")
            valid, names = False, ("stray",)
        elif form == "unbalanced quote":
            tokens.append('"--foo')
            valid, names = False, ("--megatron-args", "quot")
        elif form == "switch with value":
            tokens.append("--swiglu=1")
            valid, names = False, ("--swiglu",)
        elif form == "unknown flag":
            tokens += ["--no-such-flag", "3"]
            valid, names = None, ("--no-such-flag",)
        elif form == "duplicate flag":
            tokens += ["--num-layers", "8"]
            valid, names = None, ("--num-layers",)
        else:
            i = tokens.index("--normalization")
            tokens[i + 1] = "BatchNorm"
            valid, names = False, ("--normalization",)
    args = " ".join(shlex.quote(t) if t and '"' not in t else (t or "''") for t in tokens)
    argv = ("estimate", "--megatron-args", args, "--cluster", cluster)
    return "megatron-args:" + what, argv, {}, valid, names, None


def gen_cluster(rng: random.Random) -> CaseParts:
    """--cluster: the shorthand, a preset name, or a cluster YAML file."""
    r = rng.random()
    base = ("estimate", *TINY_ARGS)
    if r < 0.45:
        items = []
        valid: bool | None = None
        names: tuple[str, ...] = ("--cluster",)
        for _ in range(rng.choice((1, 1, 2, 3))):
            if rng.random() < 0.2:
                dev = rng.choice(BAD_DEVICES)
                valid = False
            else:
                dev = rng.choice(DEVICES)
            if rng.random() < 0.3:
                count = rng.choice(("0", "-8", "abc", "²", "8.0", "9" * 300, "1e3", "", "8x0", "0x8", "2x2x2",
                                    "1000000x8", "131073", "12", "3x1025"))
                valid = False if count not in ("12",) else valid
            else:
                count = rng.choice(("8", "16", "4", "2x8", "1x4", "32"))
            items.append(f"{dev}:{count}")
        spec = ",".join(items)
        if rng.random() < 0.1:
            spec, valid = spec + ",", False
        if rng.random() < 0.05:
            spec, valid = f"{items[0]},{items[0]}", False
        if rng.random() < 0.05:
            spec, valid = "", False
        if valid is None and any(d.strip() in ("V100",) for d in (i.split(":")[0] for i in items)):
            valid = False  # V100 has no bf16
        return "cluster:shorthand", (*base, "--cluster", spec), _with_tiny({}), valid, names, None
    if r < 0.5:
        spec = rng.choice(("h800-mi300x", "H800-MI300X", "nosuch-preset", "h800-mi300x.yaml", "/nonexistent/c.yaml",
                           "x" * 300 + ".yaml", "/" + "a/" * 2100 + "c.yaml"))
        valid = None if spec.lower() == "h800-mi300x" else False
        return "cluster:preset", (*base, "--cluster", spec), _with_tiny({}), valid, ("--cluster",), None
    doc = json.loads(json.dumps(TINY_CLUSTER))
    fmt = "yaml"
    if r < 0.75:
        where = rng.choice(("group", "link"))
        if where == "group":
            key = rng.choice(sorted(GROUP_FIELDS))
            value, label = rng.choice(GROUP_FIELDS[key].values() if key != "device_type" else
                                      tuple((d, d) for d in BAD_DEVICES + DEVICES) + TEXT_VALUES)
            doc["groups"][0][key] = value
            valid = GROUP_FIELDS[key].accepts(value)
            if key == "device_type":
                valid = None if isinstance(value, str) and value.strip() in DEVICES else False
                if isinstance(value, str) and value.strip().upper() == "V100":
                    valid = False
            if key == "num_nodes" and valid is None:
                valid = None if value * 8 + 8 <= MAX_GPUS else False
            body, what = to_yaml(doc), f"groups[0].{key} = {label}"
        else:
            key = rng.choice(sorted(LINK_FIELDS))
            value, label = rng.choice(LINK_FIELDS[key].values())
            doc["links"][0][key] = value
            if key != "kind":
                doc["links"][0].setdefault("bandwidth_gb_per_s", 25.0)
                doc["links"][0].setdefault("latency_us", 10.0)
            valid = LINK_FIELDS[key].accepts(value)
            if key == "kind":
                valid = None if value == "host-memory" else False
            body, what = to_yaml(doc), f"links[0].{key} = {label}"
        names = ("--cluster", key)
    else:
        body, what, valid, names = document_mutations(rng, doc, fmt, {"name": FieldRule("text", optional=True)})
        names = ("--cluster",) + names
    return "cluster:" + what, (*base, "--cluster", "{d}/cluster.yaml"), _with_tiny({"cluster.yaml": body}), valid, \
        ("--cluster",), None


def gen_model_file(rng: random.Random) -> CaseParts:
    """--model FILE: a ModelSpec as YAML or JSON with one mutation."""
    fmt = rng.choice(("yaml", "yaml", "json"))
    name = f"model.{fmt}"
    doc = json.loads(json.dumps(TINY_MODEL))
    r = rng.random()
    names: tuple[str, ...]
    if r < 0.2:
        key = rng.choice(sorted(TRAINING_FIELDS))
        value, label = rng.choice(TRAINING_FIELDS[key].values() if TRAINING_FIELDS[key].kind != "choice" else
                                  TEXT_VALUES)
        doc["training"][key] = value
        body = (to_json if fmt == "json" else to_yaml)(doc)
        valid, what, names = TRAINING_FIELDS[key].accepts(value), f"training.{key} = {label}", (key,)
    elif r < 0.3:
        value = rng.choice((1, 2, "([0]+[1]*3)", "[1]*1000000000", "[0]*3+[1]", [0, 1, 1, 1], [0, 1], True, -1,
                            "abc", "9**9", 0, [0, 2, 1, 1], "([1]*4)*999999999"))
        doc["moe_layer_freq"] = value
        body = (to_json if fmt == "json" else to_yaml)(doc)
        # -1: every layer MoE, as Megatron computes `i % N == 0` (MindSpeed-LLM's examples give it)
        valid = None if value in (1, 2, -1, "([0]+[1]*3)", "[0]*3+[1]") or value == [0, 1, 1, 1] else False
        if value is True:
            valid = False
        what, names = f"moe_layer_freq = {value!r}", ("moe_layer_freq",)
    elif r < 0.35:
        doc["mtp_num_layers"] = rng.choice((1, 4, 100, 10000, 100000))
        body = (to_json if fmt == "json" else to_yaml)(doc)
        valid = False if doc["mtp_num_layers"] > MAX_LAYERS else None
        what, names = f"mtp_num_layers = {doc['mtp_num_layers']}", ("mtp_num_layers", "prediction")
    else:
        body, what, valid, names = document_mutations(rng, doc, fmt, MODEL_FIELDS)
    names = names + (name, "--model")
    files = {name: body}
    argv = ("estimate", "--model", "{d}/" + name, "--cluster", rng.choice(("H800:8", "H800:8,MI300X:8")))
    if rng.random() < 0.05:
        files = {name + "/": b""}
        valid, what, names = False, "the model path is a directory", ("--model",)
    return "model-file:" + what, argv, files, valid, names, None


HF_DEFAULTS: dict[str, dict[str, int]] = {
    "mixtral": {"num_experts_per_tok": 2},
    "glm4_moe": {"num_experts_per_tok": 8, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1},
    "olmoe": {"num_experts_per_tok": 8},
}
"""The transformers configuration classes' defaults of the keys that rules between fields read."""
HF_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def _whole(*values: object) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


def hf_refused_between_fields(family: str, doc: dict) -> bool:
    """True when a rule between keys certainly refuses the config `doc` of `family` (each key alone valid):
    more experts per token than experts, query heads not a multiple of the KV heads, a head size that hidden / heads
    cannot give; GLM: no MoE layer after the first_k_dense_replace dense ones, experts that n_group cannot split
    into groups of two or more (Glm4MoeMoE ranks a group by its top-2 scores), topk_group over n_group; GLM and
    OLMoE: a rope_theta that is no integer Megatron's --rotary-base takes."""
    defaults = HF_DEFAULTS.get(family, {})

    def get(key: str, default: object = None) -> object:
        value = doc.get(key)
        return defaults.get(key, default) if value is None else value

    experts = next((doc[k] for k in HF_EXPERT_KEYS if doc.get(k) is not None), None)
    topk, heads, hidden = get("num_experts_per_tok"), doc.get("num_attention_heads"), doc.get("hidden_size")
    kv_heads = get("num_key_value_heads", heads)
    if _whole(experts, topk) and topk > experts:  # type: ignore[operator]
        return True
    if _whole(heads, kv_heads) and heads % kv_heads:  # type: ignore[operator]
        return True
    if doc.get("head_dim") is None and _whole(hidden, heads) and hidden % heads:  # type: ignore[operator]
        return True
    if family == "glm4_moe":
        layers, first_dense = doc.get("num_hidden_layers"), get("first_k_dense_replace")
        groups, group_topk = get("n_group"), get("topk_group")
        if _whole(layers) and isinstance(first_dense, int) and first_dense >= layers:  # type: ignore[operator]
            return True
        if _whole(experts, groups) and (experts % groups or experts // groups < 2):  # type: ignore[operator]
            return True
        if _whole(groups, group_topk) and groups > 1 and group_topk > groups:  # type: ignore[operator]
            return True
    theta = doc.get("rope_theta")
    if family in ("glm4_moe", "olmoe") and isinstance(theta, (int, float)) and not isinstance(theta, bool) \
            and 0 < theta < float("inf") and (theta != int(theta) or theta > MAX_INT):
        return True
    return False


HF_RELATED_KEYS: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("first_k_dense_replace", "mlp_only_layers"),
    "first_k_dense_replace": ("num_hidden_layers",),
    "num_attention_heads": ("num_key_value_heads", "hidden_size", "head_dim"),
    "num_key_value_heads": ("num_attention_heads",),
    "hidden_size": ("num_attention_heads", "head_dim"),
    **{key: ("num_experts_per_tok", "n_group") for key in HF_EXPERT_KEYS},
    "num_experts_per_tok": HF_EXPERT_KEYS,
    "n_group": ("n_routed_experts", "topk_group"),
    "topk_group": ("n_group",),
}
"""The keys a refusal of a changed key may name instead: the other side of a rule between keys."""


def _hf_key_names(key: str, value: object) -> tuple[str, ...]:
    """What the refusal of `key` = `value` must name: `config.json:KEY` (or a related key's), the field as the
    reader names it; a value JSON cannot hold (NaN, infinity, 5,000 digits) is refused as a document, by --model."""
    if value == BIG_INT or (isinstance(value, float) and not math.isfinite(value)):
        return ("--model", key)
    return tuple(f"config.json:{k}" for k in (key, *HF_RELATED_KEYS.get(key, ())))


def gen_hf_config(rng: random.Random) -> CaseParts:
    """--model config.json: a HuggingFace config of one family with one key changed.  A refusal of a changed key
    must name it as `config.json:KEY` (or a key it is checked against), not only the file or a Megatron field."""
    family = rng.choice(sorted(HF_CONFIGS))
    doc = json.loads(json.dumps(HF_CONFIGS[family]))
    r = rng.random()
    rules = {k: v for k, v in {**HF_INT_KEYS, **HF_FAMILY_KEYS.get(family, {})}.items() if k in doc}
    names: tuple[str, ...]
    if r < 0.6:
        key = rng.choice(sorted(rules))
        value, label = rng.choice(rules[key].values())
        if family in HF_FAMILY_VALUES and rng.random() < 0.3:
            key, value, label = rng.choice(HF_FAMILY_VALUES[family])
            rules = {**HF_INT_KEYS, **HF_FAMILY_KEYS[family]}
        doc[key] = value
        valid = rules[key].accepts(value)
        if value is None and key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size",
                                     "intermediate_size"):
            valid = False
        if value is None and (family, key) == ("mixtral", "num_experts_per_tok"):
            valid = None  # MixtralConfig's default, 2
        body, what, names = to_json(doc), f"{family}.{key} = {label}", _hf_key_names(key, value)
    elif r < 0.75:
        key, value, label = rng.choice((
            ("architectures", 5, "5"), ("architectures", "LlamaForCausalLM", "a string"), ("architectures", [5], "[5]"),
            ("model_type", 5, "5"), ("model_type", "gpt_neox", "an unsupported family"), ("model_type", None, "null"),
            ("mlp_only_layers", 5, "5"), ("mlp_only_layers", [[1]], "[[1]]"), ("mlp_only_layers", [-1], "[-1]"),
            ("mlp_only_layers", [99], "[99]"), ("mlp_only_layers", [True], "[true]"), ("mlp_only_layers", [1, 2], "[1, 2]"),
            ("first_k_dense_replace", -1, "-1"), ("first_k_dense_replace", 99, "99"), ("head_dim", 0, "0"),
            ("head_dim", "64", "'64'"), ("head_dim", 48, "48"), ("text_config", 5, "5"),
            ("tie_word_embeddings", "no", "'no'"), ("rope_theta", NAN, "NaN"),
        ))
        doc[key] = value
        body = to_json(doc)
        valid = None if (key, label) in (("mlp_only_layers", "[1, 2]"), ("head_dim", "48"), ("text_config", "5"),
                                         ("model_type", "null"), ("model_type", "an unsupported family"),
                                         ("rope_theta", "NaN")) else False
        if (key, label) == ("rope_theta", "NaN"):
            valid = False  # NaN is not JSON
        if key == "mlp_only_layers" and family != "qwen2_moe":
            valid = None  # other families ignore the key
        if key == "first_k_dense_replace" and family not in ("deepseek_v3", "glm4_moe"):
            valid = None
        what, names = f"{family}.{key} = {label}", _hf_key_names(key, value)
    else:
        body, what, valid, names = document_mutations(rng, doc, "json", {}, strict_keys=False)
        names += ("config.json", "--model")
    if valid is None and r < 0.75 and hf_refused_between_fields(family, doc):
        valid = False
    files = {"hf/config.json": body}
    target = rng.choice(("{d}/hf/config.json", "{d}/hf"))
    if rng.random() < 0.05:
        files = {"hf/config.json/": b""}
        valid, what, names = False, "config.json is a directory", ("config.json", "--model")
    argv = ("estimate", "--model", target, "--cluster", "H800:8")
    return "hf-config:" + what, argv, files, valid, names, None


HOSTILE_SCRIPT_LINES = (
    ("X=${X:-" * 5000 + "1" + "}" * 5000, "${X:-...} nested 5,000 deep"),
    ("Y=$((" + "-" * 50000 + "1))", "$(( followed by 50,000 minus signs"),
    ("Y=$((9**9**9))", "$((9**9**9))"),
    ("Y=$((2**62*4))", "$((2**62*4))"),
    ("((", "an unbalanced (("),
    ("(", "an unbalanced ("),
    ("Y=$(( 1 + ", "an unterminated $(("),
    ("Y='unterminated", "an unterminated quote"),
    ('Y="$(echo "$(echo hi)")"', "nested command substitution"),
    ("A=(" + " x" * 200000 + ")", "a 200,000-element array"),
    ("Z=" + "a" * 2_000_000, "a 2 MB line"),
    ("Z=" + "a" * 200_000, "a 200 KB line"),
    ("\n".join(f"A[{i}]=x" for i in range(20000)), "20,000 array assignments"),
    ("cat <<EOF\n" + "x\n" * 100 + "EOF", "a heredoc"),
    ("eval \"$(echo torchrun)\"", "eval"),
    ("source ./other.sh", "source"),
    ("Y=${#" * 100 + "X" + "}" * 100, "${# nested"),
    ("if [ 1 ]; then\n" * 200 + "fi\n" * 200, "200 nested ifs"),
    ("$(" * 2000 + ")" * 2000, "$( nested 2,000 deep"),
    ("Y=$((1/0))", "division by zero"),
    ("Y=$((10#99999999999999999999999999))", "an arithmetic number with 26 digits"),
    ("B=(${A[@]:" + "9" * 5000 + "})", "a slice with a 5,000-digit offset"),
    ("Y=${X:" + "9" * 5000 + "}", "a substring with a 5,000-digit offset"),
)


def script_size_limit() -> int:
    """The largest launcher script the planner reads, in bytes."""
    from planner.inputs import script
    from planner.inputs.files import MAX_DOCUMENT_BYTES

    return int(getattr(script, "MAX_SCRIPT_BYTES", MAX_DOCUMENT_BYTES))


def gen_script(rng: random.Random) -> CaseParts:
    """--megatron-script: a bash launcher with one hostile construct or changed flag."""
    r = rng.random()
    layers = "4"
    extra = ""
    valid: bool | None = None
    names: tuple[str, ...] = ("--megatron-script", "train.sh")
    if r < 0.55:
        extra, what = rng.choice(HOSTILE_SCRIPT_LINES)
    elif r < 0.7:
        layers = rng.choice(("abc", "-1", "0", "2.5", "${UNSET}", "9" * 5000, "$((1<<70))", "8", "$((2+2))"))
        what = f"--num-layers {layers[:20]}"
        valid = None if layers in ("8", "$((2+2))", "${UNSET}", "$((1<<70))") else False
        names = ("--num-layers", "--megatron-script", "train.sh")
    else:
        what = rng.choice(("no launch line", "non-UTF-8 byte", "empty", "NUL byte", "oversized", "BOM"))
    text = SCRIPT.format(extra=extra, layers=layers).encode()
    if what == "no launch line":
        text = b"\n".join(line for line in text.split(b"\n") if b"torchrun" not in line and b'"${' not in line
                          and b"--save" not in line)
        valid = False
    elif what == "non-UTF-8 byte":
        pos = rng.randrange(len(text))
        text, valid = text[:pos] + b"\xa5" + text[pos:], False
        names = ("--megatron-script", "train.sh", "UTF-8")
    elif what == "empty":
        text, valid = b"", False
    elif what == "NUL byte":
        text = text.replace(b"CHECKPOINT_PATH=/ckpt", b"CHECKPOINT_PATH=/ck\x00pt")
    elif what == "oversized":  # past the reader's limit when that is small enough to build; else a large valid file
        limit = script_size_limit()
        text += b"#" * ((limit + 1 - len(text)) if limit <= 4 << 20 else 2 << 20)
        valid = False if limit <= 4 << 20 else None
    elif what == "BOM":
        text = b"\xef\xbb\xbf" + text
    cmd = rng.choice(("estimate", "estimate", "solve"))
    argv: tuple[str, ...] = (cmd, "--megatron-script", "{d}/train.sh", "--cluster", "H800:8")
    if cmd == "solve":
        argv += ("--time-limit", "2", "--quiet")
    return "script:" + what, argv, {"train.sh": text}, valid, names, None


def gen_plan(rng: random.Random) -> CaseParts:
    """emit --plan plan.json: a solved plan with one field changed."""
    doc = base_plan_document()
    r = rng.random()
    names: tuple[str, ...] = ("--plan",)
    valid: bool | None
    if r < 0.25:
        where, key, value = rng.choice((
            ("plan", "pp", 2), ("plan", "dp", [4]), ("plan", "dp", 4), ("plan", "num_microbatches", 3),
            ("plan", "world_size", 16), ("top", "world_size", 4), ("top", "num_microbatches", 1),
            ("top", "runtime", "flagscale"), ("top", "cluster", "H800:16"), ("top", "cluster_gpus", 7),
            ("plan", "gbs", 32), ("plan", "gbs", 63), ("plan", "mbs", 3),
        ))
        (doc["plan"] if where == "plan" else doc)[key] = value
        valid, what = False, f"{where}.{key} = {value!r} contradicts the stages"
    elif r < 0.55:
        key = rng.choice(("tp", "cp", "ep", "etp", "vpp", "mbs", "gbs", "sequence_parallel", "runtime"))
        rule = {"sequence_parallel": FieldRule("bool"),
                "runtime": FieldRule("choice", choices=("megatron", "flagscale"))}.get(key, FieldRule("int", 1, 2**17))
        value, label = rng.choice(rule.values())
        doc["plan"][key] = value
        valid = rule.accepts(value)
        what = f"plan.{key} = {label}"
    elif r < 0.7:
        key, value = rng.choice((
            ("num_layers", -1), ("num_layers", "4"), ("num_layers", 3), ("dp", 0), ("dp", True), ("dp", 16),
            ("device_type", "XPU"), ("device_type", "MI300X"), ("device_type", 5), ("recompute", {"granularity": "x"}),
            ("recompute", {"granularity": "full"}), ("recompute", "none"), ("extra", 1),
        ))
        doc["plan"]["stages"][0][key] = value
        valid, what = False, f"plan.stages[0].{key} = {value!r}"
    elif r < 0.8:
        key, value = rng.choice((
            ("num_nodes", 10**6), ("num_nodes", True), ("gpus_per_node", 0), ("device_type", "XPU"),
            ("intra_node_bandwidth_gb_per_s", -1.0), ("intra_node_bandwidth_gb_per_s", "fast"), ("num_nodes", 2),
        ))
        doc["inputs"]["cluster"]["groups"][0][key] = value
        valid = None if (key, value) == ("num_nodes", 2) else False
        what = f"inputs.cluster.groups[0].{key} = {value!r}"
    elif r < 0.85:
        key, value = rng.choice((("num_layers", 8), ("num_layers", True), ("hidden_size", "256"),
                                 ("num_attention_heads", 0), ("vocab_size", 10**30)))
        doc["inputs"]["run"]["model"][key] = value
        valid, what = False, f"inputs.run.model.{key} = {value!r}"
    else:
        body, what, valid, extra = document_mutations(rng, doc, "json", {}, strict_keys=False)
        if what == "unknown key" or what == "missing key":
            valid = None
        return "plan:" + what, ("emit", "--plan", "{d}/plan.json", "--out", "{d}/launch"), {"plan.json": body}, \
            valid, ("--plan",), "launch"
    return "plan:" + what, ("emit", "--plan", "{d}/plan.json", "--out", "{d}/launch"), {"plan.json": to_json(doc)}, \
        valid, names, "launch"


def gen_log(rng: random.Random) -> CaseParts:
    """calibrate --megatron-log: a Megatron log with bad numbers, plus router statistics."""
    n = 8
    values = ["12.0"] * n
    files: dict[str, bytes] = {}
    extra: tuple[str, ...] = ()
    r = rng.random()
    valid: bool | None = None
    names: tuple[str, ...] = ("--megatron-log",)
    timers = ""
    bad = ("inf", "nan", "-5.0", "0.0", "1e300", "abc", "", "-inf", "1e12", "NaN", "1.2.3")
    if r < 0.3:
        value = rng.choice(bad)
        values = [value] * n
        valid, what = False, f"every elapsed time = {value!r}"
    elif r < 0.45:
        for i in rng.sample(range(n), rng.randrange(1, n - 3)):
            values[i] = rng.choice(bad)
        what = "some elapsed times unreadable"
    elif r < 0.55:
        timers, what = rng.choice((
            ("INFO:megatron.core.timers:(min, max) time across ranks (ms):\n    forward-backward ...: (1.2.3, 4)",
             "a garbled timer"),
            ("INFO:megatron.core.timers:times across ranks (ms):\n  forward-compute:\n     rank  0: 1e400",
             "a timer of 1e400"),
            ("INFO:megatron.core.timers:(min, max) time across ranks (ms):\n    forward-backward ...: (" + "9" * 400
             + ", 5)", "a 400-digit timer"),
            ("INFO:megatron.core.timers:times across ranks (ms):\n  forward-compute:\n     rank  " + "9" * 5000
             + ": 1.0", "a 5,000-digit rank"),
        ))
    elif r < 0.62:
        text = log_text(values).decode().replace("iteration        1/", "iteration " + "9" * 5000 + "/")
        files["run.log"] = text.replace("allocated: 1000.00", "allocated: " + "9" * 400).encode()
        what = "a 5,000-digit iteration number and a 400-digit memory figure"
    elif r < 0.72:
        rows, what, valid = rng.choice((
            ("layer,expert,tokens\n0,0,10\n0,1,nan\n", "router tokens NaN", False),
            ("layer,expert,tokens\n0,0,10\n0,1,-3\n", "router tokens negative", False),
            ("layer,expert,tokens\n0,0,10\n0,99,3\n", "router expert 99 of 8", False),
            ("layer,expert\n0,0\n", "router CSV without tokens", False),
            ("layer,expert,tokens\n0,0,inf\n0,1,1\n", "router tokens inf", False),
            ("layer,expert,tokens\n0,0,10\n0,1,12\n", "router statistics", None),
            ("layer,expert,tokens\n0,0,1" + "0" * 5000 + "\n", "router tokens with 5,000 digits", None),
        ))
        files["router.csv"] = rows.encode()
        names = ("--router-stats",)
        extra = ("--router-stats", "{d}/router.csv")
    elif r < 0.8:
        what = rng.choice(("an empty log", "a non-UTF-8 log", "a directory", "a missing log", "skip everything"))
        if what == "an empty log":
            files["run.log"], valid = b"", False
        elif what == "a non-UTF-8 log":
            files["run.log"] = log_text(values).replace(b"lm loss", b"lm \xa5loss")
        elif what == "a directory":
            files["run.log/"], valid = b"", False
        elif what == "a missing log":
            files["run.log/"], valid = b"", False  # placeholder, removed below: no run.log at all
        else:
            extra, valid = ("--skip-iterations", "8"), False
    else:
        what = "a valid log"
    if "run.log" not in files and "run.log/" not in files:
        files["run.log"] = log_text(values, timers=timers)
    if what == "a missing log":
        del files["run.log/"]
    argv = ("calibrate", "--megatron-log", "{d}/run.log", *TINY_ARGS, "--cluster", "H800:8", "--out", "{d}/cal", *extra)
    return "log:" + what, argv, _with_tiny(files), valid, names, "cal"


def gen_out_dir(rng: random.Random) -> CaseParts:
    """--out of solve, emit and calibrate: empty, under a file, unwritable, too long, non-empty."""
    cmd = rng.choice(("solve", "emit", "calibrate"))
    form = rng.choice(("empty", "under a file", "/proc", "long name", "long path", "non-empty", "earlier output",
                       "existing file", "new", "NUL"))
    files: dict[str, bytes] = {"regular": b"x"}
    out = {"empty": "", "under a file": "{d}/regular/out", "/proc": "/proc/hapmoe-fuzz/out", "long name": "{d}/" + "o" * 300,
           "long path": "{d}/" + "o/" * 2100, "non-empty": "{d}/full", "earlier output": "{d}/earlier",
           "existing file": "{d}/regular", "new": "{d}/new/deeper", "NUL": "{d}/a\x00b"}[form]
    if form == "non-empty":
        files["full/notes.txt"] = b"mine"
    if form == "earlier output":
        marker = {"solve": "plan.json", "emit": "launch.sh", "calibrate": "corrections.yaml"}[cmd]
        files[f"earlier/{marker}"] = b"[]\n" if cmd == "calibrate" else b"old\n"
        files["earlier/notes.txt"] = b"mine"
    valid = None if form in ("earlier output", "new") else False
    if cmd == "solve":
        argv = ("solve", *TINY_ARGS, "--cluster", "H800:8", "--time-limit", "2", "--quiet", "--out", out)
    elif cmd == "emit":
        files["plan.json"] = to_json(base_plan_document())
        argv = ("emit", "--plan", "{d}/plan.json", "--out", out)
    else:
        files["run.log"] = log_text(["12.0"] * 8)
        argv = ("calibrate", "--megatron-log", "{d}/run.log", *TINY_ARGS, "--cluster", "H800:8", "--out", out)
    rel = out.replace("{d}/", "") if out.startswith("{d}/") and form in ("non-empty", "earlier output", "new") else None
    return f"out:{cmd} {form}", argv, _with_tiny(files), valid, ("--out",), rel


def gen_solve(rng: random.Random) -> CaseParts:
    """solve and compare on small inputs, with sizes that stress the time limit."""
    cmd = rng.choice(("solve", "solve", "solve", "compare"))
    cluster = rng.choice(("H800:8", "H800:8,MI300X:8", "H800:16,910B:16", "A100:8,910B:8", "H800:4"))
    doc = json.loads(json.dumps(TINY_MODEL))
    doc["num_layers"] = rng.choice((1, 2, 3, 4, 8, 12, 24, 1, 2, 3, 4, 8, 12, 24, 256, 1024))
    if rng.random() < 0.3:
        doc["num_experts"] = rng.choice((1, 2, 16, 64))
        doc["moe_router_topk"] = 1
    argv: tuple[str, ...] = (cmd, "--model", "{d}/model.yaml", "--cluster", cluster, "--time-limit",
                             rng.choice(("1", "2", "3")))
    if cmd == "solve":
        argv += ("--quiet", "--backend", rng.choice(("cpsat", "hsdp")), "--runtime", rng.choice(("megatron", "flagscale")))
        if rng.random() < 0.2:
            argv += ("--no-prune",)
    elif rng.random() < 0.3:
        argv += ("--brute",)
    what = f"{cmd} {doc['num_layers']} layers, {doc['num_experts']} experts on {cluster}"
    return "solve:" + what, argv, {"model.yaml": to_yaml(doc)}, None, (), None


def gen_solve_large(rng: random.Random) -> CaseParts:
    """solve and compare on presets and large clusters: a search must stop near --time-limit."""
    model = rng.choice(("mixtral-s", "mixtral-l", "qwen3-235b-a22b", "deepseek-v3", "llama2-70b"))
    nodes = rng.choice((16, 64, 128, 384))
    cluster = rng.choice((f"H800:{8 * nodes}", f"H800:{8 * nodes},MI300X:{8 * nodes}",
                          f"H800:{8 * nodes},MI300X:{8 * nodes},910B:{8 * nodes}"))
    limit = rng.choice(("2", "5"))
    cmd = rng.choice(("solve", "solve", "compare"))
    argv: tuple[str, ...] = (cmd, "--model", model, "--cluster", cluster, "--time-limit", limit)
    argv += ("--quiet",) if cmd == "solve" else (("--brute",) if rng.random() < 0.5 else ())
    return f"solve-large:{cmd} {model} on {cluster}, --time-limit {limit}", argv, {}, None, (), None


def gen_profiles(rng: random.Random) -> CaseParts:
    """--profiles DIR: a corrections.yaml or a device file with one mutation."""
    names: tuple[str, ...] = ("--profiles",)
    files: dict[str, bytes] = {}
    if rng.random() < 0.6:
        row = {"device": "H800", "kind": "gemm", "factor": 1.1,
               "provenance": {"kind": "calibrated", "source": "fuzz"}}
        r = rng.random()
        if r < 0.5:
            value, label = rng.choice(FLOAT_VALUES)
            row["factor"] = value
            valid = FieldRule("float", *TIME_FACTOR_RANGE).accepts(value)
            body, what = to_yaml([row]), f"corrections factor = {label}"
        elif r < 0.7:
            key, value = rng.choice((("kind", "bogus"), ("device", "XPU"), ("device", ""), ("kind", 5),
                                     ("provenance", {"kind": "guessed", "source": "x"}), ("extra", 1)))
            row[key] = value
            body, what, valid = to_yaml([row]), f"corrections {key} = {value!r}", False
        elif r < 0.8:
            body, what, valid = to_yaml([row, row]), "a correction given twice", False
        else:
            body, what, valid, _ = document_mutations(rng, {"corrections": [row]}, "yaml", {}, strict_keys=False)
            if what in ("unknown key", "missing key", "comment only", "empty"):
                valid = None
        files["prof/corrections.yaml"] = body
    else:
        doc = h800_profile_document()
        r = rng.random()
        if r < 0.6:
            key = rng.choice(sorted(DEVICE_FIELDS))
            value, label = rng.choice(DEVICE_FIELDS[key].values())
            doc[key] = value
            valid, what = DEVICE_FIELDS[key].accepts(value), f"device {key} = {label}"
        elif r < 0.8:
            value, label = rng.choice(FLOAT_VALUES)
            doc["peak_tflops"]["bf16"] = value
            valid = FieldRule("float", *PHYSICAL_RANGES["peak"][:2]).accepts(value)
            what = f"device peak_tflops.bf16 = {label}"
        else:
            value, label = rng.choice(FLOAT_VALUES)
            doc["gemm_efficiency"]["points"][0]["efficiency"] = value
            valid = FieldRule("float", 0, 1.2, low_open=True).accepts(value)
            what = f"device gemm efficiency = {label}"
        files["prof/devices/H800.yaml"] = to_yaml(doc)
    argv = ("estimate", *TINY_ARGS, "--cluster", "H800:8", "--profiles", "{d}/prof")
    return "profiles:" + what, argv, _with_tiny(files), valid, names, None


def gen_misc(rng: random.Random) -> CaseParts:
    """profile and bench argument checks (never a real measurement or bench run), --profiles, --help."""
    form = rng.choice(("profile bad list", "profile bad model", "profile bad out", "bench no match",
                       "bench bad sizes", "bench bad time", "bench bad planner", "profiles dir missing",
                       "profiles dir file", "help"))
    base_profile = ("profile", "--model", "mixtral-s", "--device", "cpu", "--quick", "--out", "{d}/prof")
    if form == "profile bad list":
        flag = rng.choice(("--tp-list", "--ep-list", "--mbs-list"))
        value = rng.choice(("0", "a,b", "-1", "", "9" * 5000, "1,,x", "99999"))
        return "misc:" + form, (*base_profile, flag, value), {}, False, (flag,), "prof"
    if form == "profile bad model":
        return "misc:" + form, ("profile", "--model", "nosuch", "--device", "cpu", "--out", "{d}/prof"), {}, False, \
            ("--model",), "prof"
    if form == "profile bad out":
        return "misc:" + form, ("profile", "--model", "mixtral-s", "--device", "cpu", "--out", ""), {}, False, \
            ("--out",), None
    if form == "bench no match":
        return "misc:" + form, ("bench", "--quick", "--scenario", "nomatch", "--out", "{d}/b"), {}, False, \
            ("--scenario",), "b"
    if form == "bench bad sizes":
        value = rng.choice(("abc", "7", "48,x", "9" * 5000, "999999999"))
        return "misc:" + form, ("bench", "--quick", "--scaling-sizes", value, "--out", "{d}/b"), {}, False, \
            ("--scaling-sizes",), "b"
    if form == "bench bad time":
        value = rng.choice(("nan", "inf", "0", "-1"))
        return "misc:" + form, ("bench", "--quick", "--time-limit", value, "--out", "{d}/b"), {}, False, \
            ("--time-limit",), "b"
    if form == "bench bad planner":
        return "misc:" + form, ("bench", "--quick", "--planners", "nosuch", "--out", "{d}/b"), {}, False, \
            ("--planners",), "b"
    if form == "profiles dir missing":
        return "misc:" + form, ("estimate", *TINY_ARGS, "--cluster", "H800:8", "--profiles", "{d}/nope"), \
            _with_tiny({}), False, ("--profiles", "nope"), None
    if form == "profiles dir file":
        return "misc:" + form, ("estimate", *TINY_ARGS, "--cluster", "H800:8", "--profiles", "{d}/" + TINY_FILE), \
            _with_tiny({}), False, ("--profiles",), None
    return "misc:" + form, (rng.choice(("solve", "estimate", "emit", "calibrate", "profile", "bench", "compare")),
                            "--help"), {}, None, (), None


GENERATORS: dict[str, tuple[Generator, float]] = {
    "flags": (gen_flags, 0.16),
    "megatron-args": (gen_megatron_args, 0.10),
    "cluster": (gen_cluster, 0.12),
    "model-file": (gen_model_file, 0.14),
    "hf-config": (gen_hf_config, 0.12),
    "script": (gen_script, 0.08),
    "plan": (gen_plan, 0.10),
    "log": (gen_log, 0.07),
    "out-dir": (gen_out_dir, 0.04),
    "solve": (gen_solve, 0.03),
    "solve-large": (gen_solve_large, 0.003),
    "profiles": (gen_profiles, 0.04),
    "misc": (gen_misc, 0.04),
    # issue 23's classes (tools/fuzz/classes.py)
    "user-files": (gen_user_files, 0.05),
    "edited-plan": (gen_edited_plan, 0.04),
    "signal": (gen_signal, 0.01),
    "script-loop": (gen_script_loop, 0.015),
    "extremes": (gen_extremes, 0.05),
    "poisoned-log": (gen_poisoned_log, 0.04),
}
KINDS = tuple(GENERATORS)


def make_case(seed: int, index: int, kinds: tuple[str, ...] = KINDS) -> Case:
    """Case `index` of the stream for `seed` (deterministic)."""
    rng = random.Random(f"{seed}:{index}")
    names = [k for k in KINDS if k in kinds]
    weights = [GENERATORS[k][1] for k in names]
    kind = rng.choices(names, weights)[0]
    parts = GENERATORS[kind][0](rng)
    label, argv, files, valid, err_names, out = parts[:6]
    extra: dict = parts[6] if len(parts) > 6 else {}  # type: ignore[misc]
    heavy = kind.startswith("solve") or any(a in ("solve", "compare") for a in argv[:1])
    return Case(
        index=index, kind=kind, what=label.split(":", 1)[-1], argv=tuple(argv),
        files=tuple(sorted(files.items())), expect="reject" if valid is False else "any",
        names=tuple(n for n in err_names if n), out=out, timeout_s=extra.get("timeout_s", 60.0 if heavy else 30.0),
        owned=tuple(extra.get("owned", ())), signal=extra.get("signal"),
    )


def distinct(cases: list[Case]) -> list[Case]:
    """`cases` without the repeats: a case equal to an earlier one but for its index (the stream drew the same
    input twice: the same command line, files, signal and expectation) runs the same command on the same input."""
    seen: set[Case] = set()
    out = []
    for case in cases:
        key = replace(case, index=0)
        if key not in seen:
            seen.add(key)
            out.append(case)
    return out


__all__ = ["Case", "GENERATORS", "KINDS", "distinct", "make_case"]
