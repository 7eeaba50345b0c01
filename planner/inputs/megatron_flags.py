"""Read a Megatron-LM flag list (what `pretrain_gpt.py` receives) into a `MegatronRun`.

Parsing mirrors argparse as Megatron configures it (no abbreviations, last occurrence wins,
`--flag value` and `--flag=value`, store_true flags, nargs+ lists).  Which flags the planner reads,
and into which fields, is the flag table's (planner/megatron/flags.py); every other token is kept
verbatim, in order, in `passthrough`.

Two steps, so that callers can change things in between (see planner/inputs/resolve.py):
`parse_megatron_draft(argv)` -> `RunDraft` (plain dicts of ModelSpec / TrainingSpec /
ParallelConfig fields), then `build_run(draft)` -> validated `MegatronRun`.
`parse_megatron_flags(argv)` does both.  The pipeline layout grammar and the pipeline-split rules
are planner/megatron/layout.py's.
"""

from __future__ import annotations

import ast
import difflib
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from pydantic import ValidationError

from planner.errors import PlannerInputError
from planner.megatron.flags import (
    LAYOUT_FLAG,
    MODEL_FIELD_FLAGS,
    MODEL_FLAGS,
    PARALLEL_FIELD_FLAGS,
    PARALLEL_FLAGS,
    READ_FLAGS,
    REMOVED_FLAGS,
    SETTINGS_FIELD_FLAGS,
    SETTINGS_FLAGS,
    TRAINING_FIELD_FLAGS,
    TRAINING_FLAGS,
    Read,
    copied_fields,
    flag_value,
    rule_flag,
    unpriced_time_flags,
)
from planner.megatron.layout import check_pipeline, format_layout
from planner.megatron.rules import (
    cp_violations, ep_violations, etp_violations, input_violations, passthrough_violations, tp_violations,
)
from planner.schemas.model import ModelSpec, moe_pattern_from_freq
from planner.schemas.parallel import MegatronRun, ParallelConfig
from planner.schemas.plan import RECOMPUTE_MODULES, Recompute
from planner.schemas.training import TrainingSpec

REQUIRED_FLAGS = ("--num-layers", "--hidden-size", "--num-attention-heads")
# schema field -> the flag that sets it, for error messages
_MODEL_FIELD_NAMES = {**MODEL_FIELD_FLAGS, "name": "model name"}


# --------------------------------------------------------------------------------------------
# Tokens -> namespace (argparse semantics)
# --------------------------------------------------------------------------------------------


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


_NEGATIVE_NUMBER = re.compile(r"-[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?")


def is_flag_token(tok: str) -> bool:
    """True for an option token (`--x`, `-x`); negative numbers are values, as in argparse.
    (launch.sh's bash applies the same test, so both split flags from values alike.)"""
    return tok.startswith("-") and len(tok) > 1 and not _NEGATIVE_NUMBER.fullmatch(tok)


_is_flag = is_flag_token


FORK_CHOICES_KEY = "_fork_choices"  # ns entry: the fork choices read, as (flag, ForkChoice)
UNREAD_WORDS_KEY = "_unread_words"  # ns entry: text left for bash where a flag goes (`$(cat args.txt)`)


def _convert(name: str, spec: Read, raw: str, ns: dict[str, Any] | None = None) -> Any:
    """Convert one raw value of flag `name`; raise PlannerInputError saying what is allowed.  A value a
    fork adds to the choices is read as the upstream value it is priced as (recorded in `ns`)."""
    if spec.choices:
        if raw in spec.choices:
            return raw
        fork = next((f for f in spec.fork_choices if f.value == raw), None)
        if fork is None:
            extra = "".join(f", {f.value} ({f.fork})" for f in spec.fork_choices)
            raise PlannerInputError(name, f"invalid choice {raw!r}; allowed: {', '.join(spec.choices)}{extra}")
        if ns is not None:
            ns.setdefault(FORK_CHOICES_KEY, []).append((name, fork))
        return fork.priced_as
    if spec.kind in ("int", "ints"):
        try:
            value = int(raw.strip())
        except ValueError:
            raise PlannerInputError(name, f"expected an integer, got {raw!r}") from None
        if spec.min_value is not None and value < spec.min_value:
            raise PlannerInputError(name, f"must be an integer >= {int(spec.min_value)}, got {value}")
        if spec.max_value is not None and value > spec.max_value:
            raise PlannerInputError(name, f"must be an integer <= {int(spec.max_value)}, got {value}")
        return value
    if spec.kind in ("float", "floats"):
        try:
            value_f = float(raw.strip())
        except ValueError:
            raise PlannerInputError(name, f"expected a number, got {raw!r}") from None
        if value_f != value_f or value_f in (float("inf"), float("-inf")):
            raise PlannerInputError(name, f"expected a finite number, got {raw!r}")
        if spec.min_value is not None and (value_f <= spec.min_value if spec.exclusive_min else value_f < spec.min_value):
            relation = ">" if spec.exclusive_min else ">="
            raise PlannerInputError(name, f"must be {relation} {spec.min_value:g}, got {value_f:g}")
        if spec.max_value is not None and value_f > spec.max_value:
            raise PlannerInputError(name, f"must be <= {spec.max_value:g}, got {value_f:g}")
        return value_f
    if not raw:
        raise PlannerInputError(name, "expected a non-empty value")
    return raw


@dataclass(frozen=True)
class KnownFlag:
    """A flag some parser accepts: its argparse nargs ("0" for a switch, "1", "?", "*", "+") and
    where it comes from ("megatron" or a fork's name)."""

    nargs: str
    source: str


_DATA_DIR = Path(__file__).resolve().parent / "data"
MEGATRON_FLAGS_FILE = _DATA_DIR / "megatron_flags.tsv"  # tools/dump_megatron_flags.py writes it
FORK_FLAGS_FILE = _DATA_DIR / "fork_flags.tsv"


@functools.lru_cache(maxsize=1)
def known_flags() -> dict[str, KnownFlag]:
    """Every option string of Megatron-LM's parser (megatron-core 0.19.2), plus the flags of the
    usual forks (MindSpeed, Pai-Megatron-Patch) that upstream does not know."""
    out: dict[str, KnownFlag] = {}
    for path, fixed in ((FORK_FLAGS_FILE, None), (MEGATRON_FLAGS_FILE, "megatron")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("--"):
                continue
            flag, nargs, third = (line.split("\t") + ["", ""])[:3]
            out[flag] = KnownFlag(nargs, fixed or third)
    return out


def unknown_flag_error(name: str, later: Sequence[str] = ()) -> PlannerInputError:
    """Megatron's parser refuses a flag it does not know (no abbreviations): say so, with the
    closest known flag, and name the unknown flags among the `later` tokens too (a fork's script often
    has several: one refusal for each would take as many runs)."""
    close = difflib.get_close_matches(name, list(known_flags()), n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]}?" if close else ""
    table = known_flags()
    others = [f for f in dict.fromkeys(t.partition("=")[0] for t in later if isinstance(t, str) and t.startswith("--"))
              if f != name and f not in table and f not in READ_FLAGS]
    also = f"; also unknown: {', '.join(others)}" if others else ""
    return PlannerInputError(
        name, f"unknown flag: Megatron-LM's parser (megatron-core 0.19.2) does not accept it, nor abbreviations{hint}{also}"
    )


def _unresolved(tok: str) -> bool:
    """Text the script reader left for bash (`${EXTRA_ARGS}`, `$1`, `$(cmd)`)."""
    return tok.startswith("$") or tok.startswith("`")


def parse_flag_namespace(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Split `argv` into {dest: value} for the flags the reader takes (READ_FLAGS) and the verbatim
    passthrough tokens.

    As Megatron's argparse parser: a flag must be one it knows, spelled in full (fork flags are
    accepted and passed through); every flag takes the values its nargs says; a value no flag
    takes is an error.  Text the script reader could not resolve (`${EXTRA}`) passes through.
    """
    ns: dict[str, Any] = {}
    passthrough: list[str] = []
    last_flag = ""
    open_values = False  # the last passthrough flag may take more values (nargs ? * +)
    i = 0
    n = len(argv)
    table = known_flags()
    while i < n:
        tok = argv[i]
        if not isinstance(tok, str):
            raise PlannerInputError("megatron args", f"every token must be a string, got {tok!r}")
        if not _is_flag(tok):
            if open_values or _unresolved(tok):
                if not open_values:  # where a flag goes: what bash makes of it when the script runs is not read
                    ns.setdefault(UNREAD_WORDS_KEY, []).append(tok)
                passthrough.append(tok)
                i += 1
                continue
            where = f"after {last_flag}" if last_flag else "before any flag"
            raise PlannerInputError(
                last_flag or "megatron args",
                f"unexpected value {tok!r} {where}; pretrain_gpt.py takes no positional arguments",
            )
        name, eq, explicit = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        spec = READ_FLAGS.get(name)
        i += 1
        last_flag = name
        open_values = False
        if spec is None:
            known = table.get(name)
            if known is None:
                raise unknown_flag_error(name, argv[i:])
            if name in REMOVED_FLAGS:
                raise PlannerInputError(name, f"Megatron-LM refuses it (validate_args): {REMOVED_FLAGS[name]}")
            passthrough.append(tok)
            if eq:
                if known.nargs == "0":
                    raise PlannerInputError(name, f"takes no value (a switch), got {explicit!r}")
                continue
            if known.nargs == "1":
                if i >= n or (_is_flag(argv[i]) and not _is_number(argv[i])):
                    raise PlannerInputError(name, "expects a value, but none was given")
                passthrough.append(argv[i])
                i += 1
            elif known.nargs != "0":
                open_values = True
            continue
        start = i - 1
        i = _read_flag(name, spec, eq, explicit, argv, i, ns)
        if spec.observe:
            passthrough.extend(argv[start:i])
    return ns, passthrough


def _read_flag(name: str, spec: Read, eq: str, explicit: str, argv: Sequence[str], i: int,
               ns: dict[str, Any]) -> int:
    """Read the value(s) of one known flag whose values start at argv[i] into `ns`; return the index
    of the next token."""
    n = len(argv)
    if spec.kind in ("true", "false"):
        if eq:
            raise PlannerInputError(name, f"takes no value (a switch), got {explicit!r}")
        ns[spec.dest] = spec.kind == "true"
        return i
    if spec.kind in ("list", "floats", "ints"):
        values = [explicit] if eq else []
        while not eq and i < n and isinstance(argv[i], str) and not _is_flag(argv[i]):
            values.append(argv[i])
            i += 1
        if not values:
            allowed = ", ".join(spec.choices) if spec.choices else "numbers"
            raise PlannerInputError(name, f"expects one or more values; allowed: {allowed}")
        ns[spec.dest] = [_convert(name, spec, v, ns) for v in values]
        return i
    if eq:
        raw = explicit
    else:
        if i >= n or not isinstance(argv[i], str) or _is_flag(argv[i]):
            allowed = f"one of {', '.join(spec.choices)}" if spec.choices else f"a {spec.kind} value"
            raise PlannerInputError(name, f"expects {allowed}, but no value was given")
        raw = argv[i]
        i += 1
    ns[spec.dest] = _convert(name, spec, raw, ns)
    return i


def drop_flags(argv: Sequence[str], names: set[str] | frozenset[str]) -> list[str]:
    """argv without the flags in `names` and the values that follow each (`--flag=value` takes none)."""
    out: list[str] = []
    skip = False
    for tok in argv:
        if is_flag_token(tok):
            name = tok.split("=", 1)[0]
            if name in names:
                skip = "=" not in tok
                continue
            skip = False
        elif skip:
            continue
        out.append(tok)
    return out


def fork_flags_in(passthrough: Sequence[str], *, read: bool = True) -> dict[str, list[str]]:
    """{fork: [flags]} of the passthrough flags that only a fork of Megatron-LM knows (`read`: with the
    ones the planner reads into the model too)."""
    table = known_flags()
    out: dict[str, list[str]] = {}
    for tok in passthrough:
        if _is_flag(tok):
            name = tok.partition("=")[0]
            known = table.get(name)
            if not read and name in READ_FLAGS:
                continue
            if known is not None and known.source != "megatron" and name not in out.get(known.source, []):
                out.setdefault(known.source, []).append(name)
    return out


# --------------------------------------------------------------------------------------------
# --moe-layer-freq
# --------------------------------------------------------------------------------------------

_FREQ_CHARS = set(",0123456789[]()+*")


def _eval_freq(node: ast.AST, limit: int) -> int | list[int]:
    """Evaluate ints, int lists, list + list and list * int, refusing anything longer than `limit`."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        items = [_eval_freq(e, limit) for e in node.elts]
        if not all(isinstance(v, int) for v in items):
            raise ValueError("list items must be integers")
        return items  # type: ignore[return-value]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _eval_freq(node.left, limit), _eval_freq(node.right, limit)
        if isinstance(node.op, ast.Add):
            if isinstance(left, list) and isinstance(right, list) and len(left) + len(right) <= limit:
                return left + right
            raise ValueError("'+' joins two lists")
        if isinstance(left, int) and isinstance(right, list):
            left, right = right, left
        if isinstance(left, list) and isinstance(right, int):
            if len(left) * max(right, 0) > limit:
                raise ValueError(f"the list would have more than {limit} entries")
            return left * right
        raise ValueError("'*' repeats a list by an integer")
    raise ValueError("only integers, [lists], '+' and '*' are allowed")


def moe_pattern_from_flag(freq: int | str, num_layers: int) -> tuple[int, ...]:
    """Megatron's --moe-layer-freq (int N, or a list expression such as `([0]*3+[1]*58)`) as a
    per-layer 0/1 tuple.  Evaluated without `eval`, so huge or hostile expressions are refused."""
    text = str(freq)
    if text.strip().lstrip("-").isdigit() and len(text.strip()) <= 7:  # an int, as Megatron's moe_freq_type reads it
        return moe_pattern_from_freq(int(text), num_layers)
    if not text or any(c not in _FREQ_CHARS for c in text):
        raise ValueError(f"Invalid pattern: {text} (expected an int or a list expression like ([0]+[1]*23) using "
                         "only the characters ,digits[]()+*, no spaces)")
    try:
        value = _eval_freq(ast.parse(text, mode="eval").body, max(num_layers, 1))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"moe-layer-freq {text!r} is not a valid list expression: {exc}") from None
    return moe_pattern_from_freq(value, num_layers)


# --------------------------------------------------------------------------------------------
# Vocabulary size when --vocab-size is not given
# --------------------------------------------------------------------------------------------
DEFAULT_VOCAB_SIZE = 32000
# Unpadded vocabulary of well-known tokenizers: `vocab_size` in each model's HuggingFace
# config.json (GPT-2: the 50257 entries of its vocab.json).  Matched, in this order, against the
# tokenizer type, then the tokenizer path and the run's name (lower case).
_TOKENIZER_TYPE_VOCAB = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000}
_NAME_VOCAB: tuple[tuple[str, int], ...] = (
    ("gpt-oss", 201088), ("gptoss", 201088),
    ("deepseek-v3", 129280), ("deepseek_v3", 129280), ("deepseekv3", 129280), ("deepseek-r1", 129280),
    ("deepseek-v2", 102400), ("deepseek_v2", 102400), ("deepseekv2", 102400),
    ("qwen", 151936),
    ("llama-3", 128256), ("llama3", 128256), ("llama_3", 128256),
    ("llama-2", 32000), ("llama2", 32000), ("llama_2", 32000),
    ("mixtral-8x22b", 32768), ("mixtral_8x22b", 32768), ("8x22b", 32768),
    ("mixtral", 32000), ("mistral", 32000),
    ("gpt2", 50257), ("gpt-2", 50257),
)  # fmt: skip


def _tokenizer_file_vocab(path_text: str) -> tuple[int, str] | None:
    """Entries of a readable tokenizer.json (model vocab plus added tokens) or vocab file."""
    if not path_text or _unresolved(path_text):
        return None
    path = Path(path_text).expanduser()
    candidates = [path / "tokenizer.json", path / "vocab.json"] if path.is_dir() else [path]
    for cand in candidates:
        try:
            if not cand.is_file() or cand.stat().st_size > 64 << 20:
                continue
            text = cand.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        try:
            data = json.loads(text)
        except ValueError:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            if lines and cand.suffix in (".txt", ".vocab"):
                return len(lines), f"from the {len(lines)} lines of {cand}"
            continue
        if isinstance(data, dict) and isinstance(data.get("model"), dict) and isinstance(data["model"].get("vocab"), (dict, list)):
            vocab = data["model"]["vocab"]
            ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
            ids |= {t.get("id") for t in data.get("added_tokens") or [] if isinstance(t, dict)}
            return len(ids), f"from the tokens of {cand}"
        if isinstance(data, dict) and data and all(isinstance(v, int) for v in data.values()):
            return len(data), f"from the {len(data)} entries of {cand}"
    return None


def infer_vocab_size(passthrough: Sequence[str], name: str = "") -> tuple[int, str]:
    """(vocab size, how it was found) from the tokenizer flags, in this order: a readable
    tokenizer (tokenizer.json, or the vocab file's entries); --padded-vocab-size; the tokenizer
    type or a known model name in the tokenizer path or the run's name; a HF config.json next to
    the tokenizer; else DEFAULT_VOCAB_SIZE.  The plan barely depends on it."""
    model_path = flag_value(passthrough, "--tokenizer-model") or ""
    for path_text in (model_path, flag_value(passthrough, "--vocab-file") or ""):
        found = _tokenizer_file_vocab(path_text)
        if found is not None:
            return found
    padded = flag_value(passthrough, "--padded-vocab-size")
    if padded and padded.isdigit() and int(padded) > 0:
        return int(padded), "from --padded-vocab-size"
    ttype = flag_value(passthrough, "--tokenizer-type") or ""
    if ttype in _TOKENIZER_TYPE_VOCAB:
        return _TOKENIZER_TYPE_VOCAB[ttype], f"assumed for --tokenizer-type {ttype}"
    named = (("the tokenizer path", model_path), ("the vocab file", flag_value(passthrough, "--vocab-file") or ""),
             ("--patch-tokenizer-type", flag_value(passthrough, "--patch-tokenizer-type") or ""),
             ("the run's name", name))
    for where, text in named:
        low = text.lower()
        for key, vocab in _NAME_VOCAB:
            if key in low:
                return vocab, f"assumed from {where} ({key!r} in {text!r})"
    if model_path and not _unresolved(model_path):
        cfg = Path(model_path).expanduser() / "config.json"
        try:
            data = json.loads(cfg.read_text(encoding="utf-8")) if cfg.is_file() else None
        except (OSError, ValueError, UnicodeDecodeError):
            data = None
        if isinstance(data, dict) and isinstance(data.get("vocab_size"), int) and data["vocab_size"] > 0:
            return data["vocab_size"], f"from {cfg}"
    return DEFAULT_VOCAB_SIZE, "assumed (no readable tokenizer or known model name; give --vocab-size to set it)"


# --------------------------------------------------------------------------------------------
# Namespace -> draft -> MegatronRun
# --------------------------------------------------------------------------------------------


@dataclass
class RunDraft:
    """Field dicts for ModelSpec, TrainingSpec and ParallelConfig before validation.

    `parallel["layout"]` holds the layout *string* (or None) until `build_run` parses it;
    `parallel["recompute"]` holds a Recompute.
    """

    model: dict[str, Any]
    training: dict[str, Any]
    parallel: dict[str, Any]
    passthrough: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was assumed or not modelled, for the user


def _recompute_from_ns(ns: dict[str, Any]) -> Recompute:
    """Megatron's recompute flags as one Recompute (granularity None means no recompute), refused in
    Megatron's words (validate_args, TransformerConfig)."""
    granularity = ns.get("recompute_granularity")
    if ns.get("recompute_activations"):
        granularity = "selective"  # args.py: --recompute-activations sets selective
    method = ns.get("recompute_method")
    num_layers = ns.get("recompute_num_layers")
    modules = tuple(ns.get("recompute_modules") or ("core_attn",))
    if granularity is None:
        return Recompute()
    if granularity == "selective":
        if method is not None:
            raise PlannerInputError("--recompute-method",
                                    "recompute method is not yet supported for selective recomputing granularity")
        if num_layers is not None:
            raise PlannerInputError("--recompute-num-layers",
                                    "When using recompute_granularity: selective recompute_num_layers must be None.")
        bad = sorted(set(modules) - set(RECOMPUTE_MODULES))
        if bad:
            raise PlannerInputError("--recompute-modules", f"Invalid choices for recompute_modules: {set(bad)}. "
                                    f"Allowed modules are: {set(RECOMPUTE_MODULES)}")
        return Recompute.selective(modules)
    if method is None:
        raise PlannerInputError(
            "--recompute-method",
            f'Using recompute_granularity: {granularity} so recompute_method must be "block" or "uniform"')
    if num_layers is None:
        per_rank = ns.get("num_layers", 0) // max(ns.get("pipeline_model_parallel_size", 1), 1)
        raise PlannerInputError(
            "--recompute-num-layers",
            f"When using recompute_granularity: {granularity} recompute_num_layers must be between 1 and "
            f"num_layers_per_pipeline_rank: {per_rank}")
    if method == "uniform" and num_layers < 1:
        raise PlannerInputError("--recompute-num-layers", "must be >= 1 with --recompute-method uniform (Megatron "
                                "accepts 0 and its uniform recompute loop then never ends)")
    return Recompute.full(method, num_layers)


def _precision_from_ns(ns: dict[str, Any]) -> str:
    if ns.get("bf16") and ns.get("fp16"):
        raise PlannerInputError("--bf16/--fp16", "are mutually exclusive; give one")
    if ns.get("fp8"):
        return "fp8"
    if ns.get("bf16"):
        return "bf16"
    if ns.get("fp16"):
        return "fp16"
    return "fp32"


def draft_from_namespace(ns: dict[str, Any], passthrough: list[str], *, name: str = "custom") -> RunDraft:
    """Interpret Megatron's parsed arguments the way args.py does, as schema field dicts."""
    missing = [f for f in REQUIRED_FLAGS if READ_FLAGS[f].dest not in ns]
    if missing:  # Megatron's words: validate_args, then _check_arg_is_not_none
        said = ["either num-layers or encoder-num-layers should be specified" if f == "--num-layers"
                else f"{READ_FLAGS[f].dest} argument is None" for f in missing]
        raise PlannerInputError(", ".join(missing), "; ".join(said) + " (required model shape flags)"
                                + "".join(f"; {_unread_words_said(ns)}: give the flags they hold with --megatron-args"
                                          for _ in ns.get(UNREAD_WORDS_KEY, [])[:1]))
    notes: list[str] = []
    if ns.get(UNREAD_WORDS_KEY):
        notes.append(f"{_unread_words_said(ns)}: the flags they hold are not read nor priced (give them with "
                     "--megatron-args); launch.sh stops if they pass a priced flag other than was read")
    model: dict[str, Any] = {"name": name}
    model.update({f: ns[dest] for dest, f in copied_fields(MODEL_FLAGS) if dest in ns})
    if "vocab_size" not in ns:
        model["vocab_size"], how = infer_vocab_size(passthrough, name)
        notes.append(f"--vocab-size not given: {model['vocab_size']} {how}")
    for fork, flags in fork_flags_in(passthrough, read=False).items():
        notes.append(f"{fork} flags passed through, not modelled: {' '.join(flags)}")
    read_forks = [f for flags in fork_flags_in(passthrough).values() for f in flags if f in READ_FLAGS]
    if read_forks:
        notes.append(f"read into the model (fork spellings, passed through as given): {' '.join(read_forks)}")
    for flag, choice in ns.get(FORK_CHOICES_KEY, []):
        notes.append(f"{flag} {choice.value} ({choice.fork}: {choice.why}) is passed through and priced as "
                     f"{choice.priced_as}")
    if ns.get("use_rotary_position_embeddings"):  # args.py: the older spelling wins
        model["position_embedding_type"] = "rope"
    elif "position_embedding_type" in ns:
        model["position_embedding_type"] = ns["position_embedding_type"]
    if ns.get("quick_geglu"):
        notes.append("--quick-geglu is a gated MLP, priced with its three weight matrices; TFLOP/s/GPU and MFU count "
                     "it with two, as Megatron's own FLOP count does (it gives the gate to --swiglu only)")
    if ns.get("group_query_attention"):
        model["num_query_groups"] = ns.get("num_query_groups", 1)  # Megatron's default is 1
    num_experts = ns.get("num_experts")
    model["num_experts"] = num_experts or None  # 0 means dense
    if ns.get("moe_enable_deepep") and model.get("moe_token_dispatcher_type") == "flex":
        model["moe_flex_dispatcher_backend"] = "deepep"  # the older spelling of the DeepEP backend
    lb_types = ns.get("moe_router_load_balancing_type")
    if lb_types:
        model["moe_router_load_balancing_type"] = lb_types[0]
    coeffs = ns.get("moe_aux_loss_coeff")
    # one coefficient per balancing type, their sum the pull; unset, Megatron's default 0.0: the run has no auxiliary
    # loss, and the launcher keeps it so (schemas/model.py AUX_LOSS_ASSUMED is for descriptions that are no command)
    if coeffs or model["num_experts"] is not None:
        model["moe_aux_loss_coeff"] = sum(coeffs) if coeffs else 0.0
    cf = ns.get("moe_expert_capacity_factor")
    model["moe_expert_capacity_factor"] = cf if cf is not None and cf > 0 else None
    if "seq_length" not in ns:
        max_pos = ns.get("max_position_embeddings")
        default_seq = ModelSpec.model_fields["seq_length"].default
        if max_pos is not None and max_pos < default_seq:
            model["seq_length"] = max_pos
    _moe_layers(ns, model)
    _window_layers(ns, model)
    _fork_model_flags(ns, model)

    training: dict[str, Any] = {f: ns[dest] for dest, f in copied_fields(TRAINING_FLAGS) if dest in ns}
    training["precision"] = _precision_from_ns(ns)
    cp_types = ns.get("cp_comm_type")
    if cp_types:
        training["cp_comm_type"] = cp_types[0]
    training["megatron"] = _settings_from_ns(ns)

    parallel: dict[str, Any] = {f: ns[dest] for dest, f in copied_fields(PARALLEL_FLAGS) if dest in ns}
    parallel["recompute"] = _recompute_from_ns(ns)
    _num_layer_list(ns, parallel)
    return RunDraft(model=model, training=training, parallel=parallel, passthrough=list(passthrough), notes=notes)


def _num_layer_list(ns: dict[str, Any], parallel: dict[str, Any]) -> None:
    """MindSpeed-LLM's --num-layer-list a,b,...: the decoder layers of each pipeline stage, first to last, as the
    layout string it stands for (the MTP layers and the loss after the last stage's)."""
    text = ns.get("num_layer_list")
    if text is None:
        return
    if any(parallel.get(f) is not None for f in ("layout", "first_stage_layers", "last_stage_layers")):
        raise PlannerInputError("--num-layer-list", f"give it or {LAYOUT_FLAG} / --decoder-first/last-pipeline-num-"
                                "layers, not both: each sets the layers of every pipeline stage")
    try:
        counts = [int(v) for v in str(text).split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 0:
        raise PlannerInputError("--num-layer-list", f"expected one layer count per pipeline stage, separated by "
                                f"commas (e.g. 8,8,7,7), got {text!r}")
    parallel["layout"] = format_layout(counts, mtp_num_layers=ns.get("mtp_num_layers") or 0)


def _settings_from_ns(ns: dict[str, Any]) -> dict[str, Any]:
    """MegatronSettings fields (the flags only Megatron's rules read), as validate_args derives them."""
    out: dict[str, Any] = {f: ns[dest] for dest, f in copied_fields(SETTINGS_FLAGS) if dest in ns}
    for key in ("hierarchical_context_parallel_sizes",):
        if key in out:
            out[key] = tuple(out[key])
    out["cp_comm_types"] = tuple(ns.get("cp_comm_type") or ())
    if len(ns.get("moe_router_load_balancing_type") or ()) > 1:
        out["moe_router_load_balancing_types"] = tuple(ns["moe_router_load_balancing_type"])
    out["moe_aux_loss_coeffs"] = tuple(ns.get("moe_aux_loss_coeff") or ())
    return out


def _moe_layers(ns: dict[str, Any], model: dict[str, Any]) -> None:
    """--moe-layer-freq, and MindSpeed-LLM's --first-k-dense-replace K (layers below K are dense; its examples' -1,
    like any K <= 0, makes none dense: MindSpeed-LLM's transformer_block builds layer i as MoE when i >= K)."""
    freq, first_dense = ns.get("moe_layer_freq"), max(ns.get("first_k_dense_replace") or 0, 0)
    if model["num_experts"] is None or (freq is None and not first_dense):
        return
    flag = "--moe-layer-freq" if freq is not None else "--first-k-dense-replace"
    try:
        pattern = moe_pattern_from_flag(freq if freq is not None else 1, ns["num_layers"])
    except ValueError as exc:
        raise PlannerInputError(flag, str(exc)) from None
    if first_dense >= ns["num_layers"]:
        raise PlannerInputError("--first-k-dense-replace", f"must be below --num-layers ({ns['num_layers']}), "
                                f"got {first_dense}")
    pattern = (0,) * first_dense + pattern[first_dense:]
    model["moe_layer_pattern"] = None if all(pattern) else pattern


def _window_layers(ns: dict[str, Any], model: dict[str, Any]) -> None:
    """--window-size as Megatron's tuple_type reads it ("127,0" or "(127,0)"), and --window-attn-skip-freq as its
    moe_freq_type does (an int, or a list expression of one 0/1 per layer)."""
    if "window_size" in ns:
        text = str(ns["window_size"]).strip().strip("()")
        try:
            sides = tuple(int(v) for v in text.split(","))
        except ValueError:
            sides = ()
        if len(sides) != 2:
            raise PlannerInputError("--window-size", f"expected two integers 'left,right', got {ns['window_size']!r}")
        model["window_size"] = sides
    if "window_attn_skip_freq" in ns:
        text = str(ns["window_attn_skip_freq"]).strip()
        if "[" not in text:
            try:
                model["window_attn_skip_freq"] = int(text)
            except ValueError:
                raise PlannerInputError("--window-attn-skip-freq", f"expected an integer or a list expression such as "
                                        f"([1]*3+[0])*9, got {text!r}") from None
            return
        if any(c not in _FREQ_CHARS for c in text):
            raise PlannerInputError("--window-attn-skip-freq", f"{text!r}: only the characters ,digits[]()+* are "
                                    "allowed")
        try:
            value = _eval_freq(ast.parse(text, mode="eval").body, max(ns["num_layers"], 1))
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            raise PlannerInputError("--window-attn-skip-freq", f"{text!r} is not a valid list expression: {exc}") \
                from None
        if not isinstance(value, list):
            raise PlannerInputError("--window-attn-skip-freq", f"{text!r} does not evaluate to a list")
        model["window_attn_skip_freq"] = tuple(value)


def _fork_model_flags(ns: dict[str, Any], model: dict[str, Any]) -> None:
    """MindSpeed's and Pai-Megatron-Patch's spellings of MLA and shared experts, where the upstream flag is not
    given."""
    if ns.get("multi_head_latent_attention"):
        model["multi_latent_attention"] = True
    for fork, upstream in (("qk_nope_head_dim", "qk_head_dim"), ("qk_rope_head_dim", "qk_pos_emb_head_dim"),
                           ("moe_intermediate_size", "moe_ffn_hidden_size"),
                           ("routed_scaling_factor", "moe_router_topk_scaling_factor")):
        if fork in ns and upstream not in model and not (fork == "routed_scaling_factor" and ns[fork] == 1.0):
            model[upstream] = ns[fork]
    shared = ns.get("n_shared_experts")
    if shared and model.get("moe_shared_expert_intermediate_size") is None and model["num_experts"] is not None:
        expert = model.get("moe_ffn_hidden_size") or model.get("ffn_hidden_size")
        if expert is None:
            raise PlannerInputError("--n-shared-experts", "needs --moe-ffn-hidden-size (the size of one expert)")
        model["moe_shared_expert_intermediate_size"] = shared * expert  # MindSpeed-LLM: n x the expert's size
    _pai_shared_expert(ns, model)


def _pai_shared_expert(ns: dict[str, Any], model: dict[str, Any]) -> None:
    """Pai-Megatron-Patch's --enable-shared-expert: one shared expert of --shared-moe-ffn-hidden-size with a sigmoid
    gate (its qwen1_5 / qwen2 MoE layers, alibaba/Pai-Megatron-Patch@a098ca5a), upstream's
    --moe-shared-expert-intermediate-size with --moe-shared-expert-gate, where those are not given.  Without
    --enable-shared-expert Pai builds no shared expert, whatever its size says."""
    if not ns.get("enable_shared_expert") or model["num_experts"] is None \
            or model.get("moe_shared_expert_intermediate_size") is not None:
        return
    size = ns.get("shared_moe_ffn_hidden_size")
    if size is None:
        raise PlannerInputError("--enable-shared-expert", "needs --shared-moe-ffn-hidden-size (the shared expert's "
                                "size: Pai-Megatron-Patch builds its shared expert from it)")
    model["moe_shared_expert_intermediate_size"] = size
    model["moe_shared_expert_gate"] = True


def _unread_words_said(ns: dict[str, Any]) -> str:
    words = ", ".join(dict.fromkeys(ns[UNREAD_WORDS_KEY]))
    return f"the command passes {words} where flags go, which only bash expands when the script runs"


def parse_megatron_draft(argv: Sequence[str], *, name: str = "custom") -> RunDraft:
    """Parse a flag list into a RunDraft (not yet validated as a whole)."""
    ns, passthrough = parse_flag_namespace(list(argv))
    return draft_from_namespace(ns, passthrough, name=name)


def _validation_to_input_error(exc: ValidationError, flags: dict[str, str], section: str) -> PlannerInputError:
    """Name the flag behind the first pydantic error."""
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ())]
    if len(loc) > 1 and loc[0] == "megatron":  # TrainingSpec.megatron (MegatronSettings)
        loc = loc[1:]
    key = loc[0] if loc else ""
    msg = str(err.get("msg", exc)).removeprefix("Value error, ")
    if key:
        where = flags.get(key, f"{section}.{key}")
    else:  # a whole-model rule: name the flags its message mentions
        named = [flag for f, flag in flags.items() if re.search(rf"\b{f}\b", msg)]
        where = "/".join(dict.fromkeys(named)) or section
    return PlannerInputError(where, msg)


def _check_parallel_rules(model: ModelSpec, parallel: dict[str, Any], deferred: list) -> dict[str, Any]:
    """The world-size-free rules of planner/megatron/rules.py for the flags' degrees (added to
    `deferred` as (flag, violation)); Megatron switches SP off when TP == 1."""
    p = dict(parallel)
    tp, ep, cp = p.get("tp", 1), p.get("ep", 1), p.get("cp", 1)
    etp = p.get("etp") or tp
    found = tp_violations(model, tp) + cp_violations(model, cp) + ep_violations(model, ep) + etp_violations(model, etp)
    deferred.extend((rule_flag(v.rule), v) for v in found)
    if tp == 1:
        p["sequence_parallel"] = False  # Megatron switches SP off when TP == 1
    return p


def build_run(draft: RunDraft, *, world_size: int | None = None, allow_invalid: bool = False) -> MegatronRun:
    """Validate a draft as a whole and return the MegatronRun.

    Flags that cannot describe a run at all (a layout that does not add up, layers that cannot be
    placed) raise PlannerInputError.  Degrees Megatron would refuse (planner/megatron/rules.py: heads and
    query groups over TP, experts over EP, VPP over each rank's layers, ...) raise it too, with
    Megatron's message, unless `allow_invalid`: then they are added to `draft.notes`.

    A missing global batch size becomes Megatron's default mbs*DP when `world_size` is known
    (DP = world / (TP*PP*CP)); otherwise it is an error naming --global-batch-size.
    """
    try:
        model = ModelSpec(**draft.model)
    except ValidationError as exc:
        raise _validation_to_input_error(exc, _MODEL_FIELD_NAMES, "model") from None
    except TypeError as exc:
        raise PlannerInputError("model", str(exc)) from None
    deferred: list[tuple[str, Any]] = []
    overlap_p2p = draft.training.get("megatron", {}).get("overlap_p2p_comm", True)
    parallel = _check_parallel_rules(model, check_pipeline(draft.parallel, model, deferred, overlap_p2p_comm=overlap_p2p),
                                     deferred)
    training = dict(draft.training)
    if training.get("global_batch_size") is None:
        training.pop("global_batch_size", None)
        if world_size is None:
            raise PlannerInputError(
                "--global-batch-size",
                "missing; give it, or a world size so that Megatron's default micro-batch*DP applies",
            )
        model_parallel = parallel.get("tp", 1) * parallel.get("pp", 1) * parallel.get("cp", 1)
        if world_size <= 0 or world_size % model_parallel:
            raise PlannerInputError(
                "world size",
                f"{world_size} is not divisible by TP*PP*CP = {model_parallel}",
            )
        training["global_batch_size"] = training.get("micro_batch_size", 1) * (world_size // model_parallel)
    training["unpriced_flags"] = tuple(sorted(set(unpriced_time_flags(draft.passthrough))
                                              | set(training.get("unpriced_flags", ()))))  # + the script's environment
    try:
        training_spec = TrainingSpec(**training)
    except ValidationError as exc:
        raise _validation_to_input_error(exc, {**TRAINING_FIELD_FLAGS, **SETTINGS_FIELD_FLAGS}, "training") from None
    deferred += [(rule_flag(v.rule), v) for v in input_violations(model, training_spec)
                 + passthrough_violations(model, training_spec, draft.passthrough)]
    if deferred and not allow_invalid:
        flag, first = deferred[0]
        more = "".join(f"; {v.message} ({v.hint})" for _, v in deferred[1:])
        raise PlannerInputError(flag, f"{first.message} ({first.hint}){more}")
    for flag, violation in deferred:
        draft.notes.append(f"Megatron would refuse these flags ({flag}): {violation.message} [{violation.rule}]")
    try:
        parallel_cfg = ParallelConfig(**parallel)
        return MegatronRun(
            model=model, training=training_spec, parallel=parallel_cfg, passthrough=tuple(draft.passthrough)
        )
    except ValidationError as exc:
        raise _validation_to_input_error(exc, PARALLEL_FIELD_FLAGS, "parallel") from None


def parse_megatron_flags(
    argv: Sequence[str], *, world_size: int | None = None, name: str = "custom"
) -> MegatronRun:
    """Parse pretrain_gpt.py's flag list into a validated MegatronRun (see module docstring)."""
    return build_run(parse_megatron_draft(argv, name=name), world_size=world_size)
