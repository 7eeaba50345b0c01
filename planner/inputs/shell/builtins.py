"""The shell builtins and small utilities the launcher-script reader evaluates as bash would, as pure
functions over strings: field splitting by IFS, `echo`, `printf`, `read`, `expr`, `seq`, `basename`,
`dirname`, util-linux `getopt`, and the job geometry `#SBATCH` lines give a Slurm job (its SLURM_* variables).

Each raises ValueError where bash would fail or where the result depends on something the reader does
not know; the interpreter then reads the command as one whose output is unknown."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Sequence

from planner.errors import PlannerInputError
from planner.inputs.slurm_options import VALUED, Scheduler, SlurmOptionError, long_option

IFS_DEFAULT = " \t\n"
MAX_SEQ_WORDS = 100_000  # `seq` longer than this is not expanded (a loop bound, not a flag list)


# --------------------------------------------------------------------------------------------
# Field splitting
# --------------------------------------------------------------------------------------------
def ifs_spans(value: str, ifs: str | None) -> list[tuple[int, int]]:
    """bash's field splitting of an unquoted expansion: the (start, end) of each field.  IFS
    whitespace around a delimiter is part of it and runs of it are one delimiter; each other IFS
    character ends a field (`a,,b` has an empty middle field; a trailing delimiter adds none)."""
    ifs = IFS_DEFAULT if ifs is None else ifs
    if not ifs:
        return [(0, len(value))] if value else []
    ws = {c for c in ifs if c in IFS_DEFAULT}
    start, end = 0, len(value)
    while start < end and value[start] in ws:
        start += 1
    while end > start and value[end - 1] in ws:
        end -= 1
    spans: list[tuple[int, int]] = []
    i = field_start = start
    while i < end:
        c = value[i]
        if c not in ifs:
            i += 1
            continue
        spans.append((field_start, i))
        non_ws_seen = c not in ws
        i += 1
        while i < end and value[i] in ifs and (value[i] in ws or not non_ws_seen):
            non_ws_seen = non_ws_seen or value[i] not in ws
            i += 1
        field_start = i
    if field_start < end:
        spans.append((field_start, end))
    return spans


def ifs_split(value: str, ifs: str | None, keep: Sequence[str] = ()) -> tuple[list[str], bool, bool]:
    """(fields, starts with a delimiter, ends with a delimiter): text before or after an expansion
    that starts or ends with IFS whitespace, or ends with any IFS character, is not joined to it.
    `keep`: text the reader left for bash to expand (`$(date "+%F %T")`), not split where it stands inside the
    value: bash splits what it prints, which the reader does not know; read as one word, as where it stands alone."""
    masked, held = _mask(value, keep, IFS_DEFAULT if ifs is None else ifs)
    spans = ifs_spans(masked, ifs)
    ifs = IFS_DEFAULT if ifs is None else ifs
    lead = bool(masked) and bool(ifs) and masked[0] in ifs and masked[0] in IFS_DEFAULT
    trail = bool(masked) and bool(ifs) and masked[-1] in ifs
    return [_unmask(masked[a:b], held) for a, b in spans], lead, trail


def _mask(value: str, keep: Sequence[str], ifs: str) -> tuple[str, dict[str, str]]:
    """`value` with each text of `keep` that holds an IFS character replaced by a token that holds none (a NUL,
    which no bash value holds, around a private-use character); the tokens and the texts they stand for."""
    held: dict[str, str] = {}
    for text in sorted(keep, key=len, reverse=True):
        if text and text in value and any(c in ifs for c in text):
            token = f"\0{chr(0xE000 + len(held))}\0"
            held[token] = text
            value = value.replace(text, token)
    return value, held


def _unmask(field: str, held: dict[str, str]) -> str:
    for token, text in held.items():
        field = field.replace(token, text)
    return field


# --------------------------------------------------------------------------------------------
# echo / printf
# --------------------------------------------------------------------------------------------
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "r": "\r", "v": "\v",
            "e": "\x1b", "E": "\x1b", '"': '"', "'": "'"}
_ESCAPE_RE = re.compile(r"\\(0[0-7]{0,3}|[0-7]{1,3}|x[0-9A-Fa-f]{1,2}|c|.)", re.S)


def backslash_escapes(text: str, *, octal_zero: bool = False) -> tuple[str, bool]:
    """`echo -e` / printf's %b / a printf format: escapes replaced; and whether `\\c` stopped the output."""
    out: list[str] = []
    pos = 0
    for m in _ESCAPE_RE.finditer(text):
        out.append(text[pos : m.start()])
        code = m.group(1)
        pos = m.end()
        if code == "c":
            return "".join(out), True
        if code[0] == "x":
            out.append(chr(int(code[1:], 16)))
        elif code[0].isdigit() and (code[0] == "0" or not octal_zero):
            digits = code[1:] if code[0] == "0" and octal_zero else code
            out.append(chr(int(digits or "0", 8) & 0xFF))
        else:
            out.append(_ESCAPES.get(code, "\\" + code))
    out.append(text[pos:])
    return "".join(out), False


def echo_text(args: list[str]) -> str:
    """What `echo ARGS` writes (options -n, -e, -E as bash's builtin reads them)."""
    newline, escapes = True, False
    while args and re.fullmatch(r"-[neE]+", args[0]):
        newline = newline and "n" not in args[0]
        escapes = ("e" in args[0]) or (escapes and "E" not in args[0])
        args = args[1:]
    text = " ".join(args)
    if escapes:
        text, stop = backslash_escapes(text, octal_zero=True)
        if stop:
            return text
    return text + ("\n" if newline else "")


_CONVERSION = re.compile(r"%([-+ #0]*)(\*|\d+)?(?:\.(\*|\d*))?([diouxXfFeEgGcsbq%])")


def _printf_int(arg: str) -> int:
    text = arg.strip()
    if text[:1] in ("'", '"') and len(text) >= 2:
        return ord(text[1])  # printf '%d' "'A" is the character's code
    if not text:
        return 0
    try:
        return int(text, 0) if not re.fullmatch(r"[-+]?0[0-7]+", text) else int(text, 8)
    except ValueError:
        raise ValueError(f"printf: {arg!r}: invalid number") from None


def _printf_one(flags: str, width: str | None, precision: str | None, conv: str, arg: str) -> str:
    spec = "%" + flags + (width or "") + ("." + precision if precision is not None else "")
    if conv in "diouxX":
        value = _printf_int(arg)
        if conv == "u" and value < 0:
            value += 1 << 64
        return (spec + {"i": "d", "u": "d"}.get(conv, conv)) % value
    if conv in "fFeEgG":
        try:
            return (spec + conv) % float(arg or "0")
        except ValueError:
            raise ValueError(f"printf: {arg!r}: invalid number") from None
    if conv == "c":
        return (spec + "s") % arg[:1]
    if conv == "b":
        return (spec + "s") % backslash_escapes(arg, octal_zero=True)[0]
    if conv == "q":
        return (spec + "s") % shlex.quote(arg)
    return (spec + "s") % arg


def printf_text(fmt: str, args: list[str]) -> str:
    """What `printf FORMAT ARGS` writes: the format reused until the arguments run out."""
    fmt, _ = backslash_escapes(fmt, octal_zero=True)
    out: list[str] = []
    args = list(args)
    while True:
        pos, used = 0, False
        for m in _CONVERSION.finditer(fmt):
            out.append(fmt[pos : m.start()])
            pos = m.end()
            flags, width, precision, conv = m.groups()
            if conv == "%":
                out.append("%")
                continue
            if width == "*":
                width, used = str(_printf_int(args.pop(0) if args else "0")), True
            if precision == "*":
                precision, used = str(_printf_int(args.pop(0) if args else "0")), True
            arg = args.pop(0) if args else ""
            used = True
            out.append(_printf_one(flags, width, precision, conv, arg))
        out.append(fmt[pos:])
        if not args or not used:
            return "".join(out)


# --------------------------------------------------------------------------------------------
# read
# --------------------------------------------------------------------------------------------
def read_fields(line: str, names: int, ifs: str | None) -> list[str]:
    """`read NAME...` of one line: one field per name, the last taking the rest of the line."""
    spans = ifs_spans(line, ifs)
    if names <= 0:
        return []
    if len(spans) <= names:
        return [line[a:b] for a, b in spans] + [""] * (names - len(spans))
    head = [line[a:b] for a, b in spans[: names - 1]]
    rest = line[spans[names - 1][0] :]
    ws = set(IFS_DEFAULT if ifs is None else ifs) & set(IFS_DEFAULT)
    return head + [rest.rstrip("".join(ws))]


# --------------------------------------------------------------------------------------------
# expr, seq, basename, dirname
# --------------------------------------------------------------------------------------------
def expr_value(args: list[str]) -> str:
    """`expr A OP B` for integers (+ - * / %) and comparisons, `expr length S`."""
    if len(args) == 2 and args[0] == "length":
        return str(len(args[1]))
    if len(args) == 1:
        return args[0]
    if len(args) != 3:
        raise ValueError("expr: only `A OP B` is read")
    a, op, b = args
    if op in ("=", "!=", "<", ">", "<=", ">="):
        try:
            x, y = int(a), int(b)
            return str(int({"=": x == y, "!=": x != y, "<": x < y, ">": x > y, "<=": x <= y, ">=": x >= y}[op]))
        except ValueError:
            return str(int({"=": a == b, "!=": a != b, "<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]))
    try:
        x, y = int(a), int(b)
    except ValueError:
        raise ValueError(f"expr: {a!r} {op} {b!r}: not integers") from None
    if op in ("/", "%") and y == 0:
        raise ValueError("expr: division by zero")
    funcs = {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y,
             "/": lambda: int(x / y), "%": lambda: x - int(x / y) * y}
    if op not in funcs:
        raise ValueError(f"expr: operator {op!r} is not read")
    return str(funcs[op]())


def seq_words(args: list[str]) -> list[str]:
    """`seq [FIRST [STEP]] LAST` over integers."""
    try:
        nums = [int(a) for a in args]
    except ValueError:
        raise ValueError("seq: only integers are read") from None
    if not 1 <= len(nums) <= 3:
        raise ValueError("seq: expected FIRST [STEP] LAST")
    first, step, last = (1, 1, nums[0]) if len(nums) == 1 else (nums[0], nums[1] if len(nums) == 3 else 1, nums[-1])
    if step == 0:
        raise ValueError("seq: the step is 0")
    count = max(0, (last - first) // step + 1)
    if count > MAX_SEQ_WORDS:
        raise ValueError(f"seq: more than {MAX_SEQ_WORDS} numbers")
    return [str(first + k * step) for k in range(count)]


def _getopt_quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


@dataclass(frozen=True)
class _GetoptSpec:
    """What getopt's own options say: the short options, the long ones (name -> '', ':' or '::'), -a, quoting and
    whether non-options are permuted to the end."""

    short: str
    long_specs: dict[str, str]
    alternative: bool
    quoted: bool
    permute: bool


def _getopt_spec(args: list[str]) -> tuple[_GetoptSpec, list[str]]:
    """getopt's own options, and the parameters to parse (getopt_text)."""
    short: str | None = None
    longs: list[str] = []
    alternative, quoted = False, True
    k = 0
    while k < len(args):
        a = args[k]
        if a in ("-o", "--options") and k + 1 < len(args):
            short, k = args[k + 1], k + 2
        elif a.startswith("--options="):
            short, k = a.split("=", 1)[1], k + 1
        elif a.startswith("-o") and not a.startswith("--"):
            short, k = a[2:], k + 1
        elif a in ("-l", "--long", "--longoptions") and k + 1 < len(args):
            longs, k = longs + args[k + 1].split(","), k + 2
        elif a.startswith(("--long=", "--longoptions=")):
            longs, k = longs + a.split("=", 1)[1].split(","), k + 1
        elif a.startswith("-l") and not a.startswith("--") and len(a) > 2:
            longs, k = longs + a[2:].split(","), k + 1
        elif a in ("-n", "--name", "-s", "--shell") and k + 1 < len(args):
            if a in ("-s", "--shell") and args[k + 1] not in ("bash", "sh"):
                raise ValueError(f"getopt: shell {args[k + 1]!r} is not read")
            k += 2
        elif a in ("-a", "--alternative"):
            alternative, k = True, k + 1
        elif a in ("-u", "--unquoted"):
            quoted, k = False, k + 1
        elif a in ("-q", "--quiet", "-Q", "--quiet-output"):
            k += 1
        elif a == "--":
            k += 1
            break
        elif a.startswith("-"):
            raise ValueError(f"getopt: option {a!r} of getopt itself is not read")
        else:
            break
    params = args[k:]
    if short is None:
        if not params:
            raise ValueError("getopt: missing optstring")
        short, params, quoted = params[0], params[1:], False  # the old form: getopt prints it unquoted
    permute = not short.startswith(("+", "-"))
    short = short.lstrip("+-")
    long_specs: dict[str, str] = {}
    for spec in (x.strip() for x in longs):
        if spec:
            name = spec.rstrip(":")
            long_specs[name] = spec[len(name):]
    return _GetoptSpec(short, long_specs, alternative, quoted, permute), params


def _getopt_long(body: str, i: int, params: list[str], long_specs: dict[str, str], out: list[str], errors: list[str],
                 q) -> int:
    """One long option `--NAME[=VALUE]` (at params[i]) into `out`; the index of the next parameter."""
    name, eq, value = body.partition("=")
    matches = [n for n in long_specs if n == name] or [n for n in long_specs if n.startswith(name)]
    if len(matches) != 1:
        errors.append(f"option '--{name}' is {'ambiguous' if matches else 'unrecognized'}")
        return i + 1
    kind = long_specs[matches[0]]
    out.append(f"--{matches[0]}")
    if kind == ":":
        if eq:
            out.append(q(value))
        elif i + 1 < len(params):
            out.append(q(params[i + 1]))
            return i + 2
        else:
            out.pop()
            errors.append(f"option '--{name}' requires an argument")
    elif kind == "::":
        out.append(q(value if eq else ""))
    elif eq:
        out.pop()
        errors.append(f"option '--{name}' doesn't allow an argument")
    return i + 1


def getopt_text(args: list[str]) -> tuple[str, bool]:
    """util-linux `getopt` (the enhanced one option loops use: `eval set -- "$(getopt -o l: --long layers: -- "$@")"`):
    its options (-o, -l/--long/--longoptions, -n, -a, -q, -Q, -s bash, -u; or the first word as the short options),
    then the parameters parsed as getopt(3) does: short clusters (`-abc`, `-lVALUE`, `-l VALUE`, `::` optional
    attached only), long options (`--x=V`, `--x V`, unique abbreviations; with -a also one dash), permuted (non-options
    after `--`, unless the short options start with `+` or `-`); the output as getopt prints it for bash, and whether
    every parameter parsed (an unknown option, or one missing its argument, is left out: getopt says so on stderr and
    exits 1).  ValueError for an option of getopt itself that is not read."""
    spec, params = _getopt_spec(args)
    short, long_specs, alternative, quoted, permute = (spec.short, spec.long_specs, spec.alternative,
                                                       spec.quoted, spec.permute)
    out: list[str] = []
    rest: list[str] = []
    errors: list[str] = []
    q = _getopt_quote if quoted else (lambda w: w)

    i = 0
    while i < len(params):
        a = params[i]
        if a == "--":
            rest += params[i + 1:]
            break
        if a.startswith("--"):
            i = _getopt_long(a[2:], i, params, long_specs, out, errors, q)
            continue
        if alternative and a.startswith("-") and len(a) > 1 and a[1:].partition("=")[0] in long_specs:
            i = _getopt_long(a[1:], i, params, long_specs, out, errors, q)
            continue
        if not a.startswith("-") or a == "-":
            if not permute:
                rest += params[i:]
                break
            rest.append(a)
            i += 1
            continue
        j = 1
        while j < len(a):
            c = a[j]
            at = short.find(c)
            if c == ":" or at < 0:
                errors.append(f"invalid option -- '{c}'")
                j += 1
                continue
            kind = ":" * (len(short[at + 1:]) - len(short[at + 1:].lstrip(":")))
            out.append(f"-{c}")
            if kind:
                if j + 1 < len(a):
                    out.append(q(a[j + 1:]))
                elif kind == ":" and i + 1 < len(params):
                    out.append(q(params[i + 1]))
                    i += 1
                elif kind == ":":
                    out.pop()
                    errors.append(f"option requires an argument -- '{c}'")
                else:
                    out.append(q(""))
                break
            j += 1
        i += 1
    return "".join(f" {w}" for w in out) + " --" + "".join(f" {q(w)}" for w in rest), not errors


def basename_of(args: list[str]) -> str:
    if not args:
        raise ValueError("basename: missing operand")
    name = args[0].rstrip("/").rsplit("/", 1)[-1] or ("/" if args[0].startswith("/") else "")
    if len(args) > 1 and name.endswith(args[1]) and name != args[1]:
        name = name[: -len(args[1])]
    return name


def dirname_of(args: list[str]) -> str:
    if not args:
        raise ValueError("dirname: missing operand")
    path = args[0].rstrip("/")
    if "/" not in path:
        return "/" if args[0].startswith("/") else "."
    head = path.rsplit("/", 1)[0].rstrip("/")
    return head or "/"


# --------------------------------------------------------------------------------------------
# Slurm: the job geometry #SBATCH lines (or sbatch's own options) give
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SchedulerValue:
    """A variable the scheduler sets when the job runs, the value the reader gives it, and where
    that value comes from (`#SBATCH --nodes=2` on line 3, --cluster); `stated`: by the script itself (its
    `#SBATCH` lines, sbatch's options), not by the reader from --cluster."""

    name: str
    value: str
    source: str
    stated: bool = True


# the SLURM_* variables the reader gives a job on --cluster (planner/inputs/script.py `cluster_geometry`): what a
# reading of the script may take from the cluster it is read for
CLUSTER_GEOMETRY_VARS = frozenset({"SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"})

_SBATCH_LINE = re.compile(r"#SBATCH\s+(.*)")
_SBATCH_KEYS = {"-N": "nodes", "--nodes": "nodes", "--ntasks-per-node": "ntasks-per-node", "-n": "ntasks",
                "--ntasks": "ntasks", "--gpus-per-node": "gpus-per-node", "--gres": "gres", "-G": "gpus",
                "--gpus": "gpus", "--gpus-per-task": "gpus-per-task", "--ntasks-per-gpu": "ntasks-per-gpu",
                "--tasks-per-node": "ntasks-per-node", "--gpu-bind": "gpu-bind", "--tres-bind": "tres-bind",
                "--tres-per-task": "tres-per-task", "--export": "export"}
# --tasks-per-node: --ntasks-per-node's second name (slurm_opt.c)
GPU_KEYS = frozenset({"gpus-per-node", "gres", "gpus", "gpus-per-task"})  # `[type:]count`; gres: `gres_gpus`


def sbatch_options(words: list[str], scheduler: Scheduler = "sbatch") -> dict[str, str]:
    """The job-geometry options among sbatch's (or srun's) words (`--nodes=2`, `-N 2`, `-N2`, `-G16`,
    `--gres=gpu:8`, `--ntasks-per-n 8`: a long option by an unambiguous prefix, planner/inputs/slurm_options.py
    `long_option`, whose SlurmOptionError an ambiguous one raises); the value of another option that takes one is
    skipped with it, not read as an option."""
    out: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = long_option(words[i], scheduler)
        name, eq, value = word.partition("=")
        if not eq and re.fullmatch(r"-[NnG]\d+", word):
            name, value, eq = word[:2], word[2:], "="
        key = _SBATCH_KEYS.get(name)
        if not eq and i + 1 < len(words) and (key is not None or word in VALUED[scheduler]):
            value, i = words[i + 1], i + 1
        if key is not None:
            out[key] = value
        i += 1
    return out


def sbatch_directives(text: str, first_line: int = 1, path: str | None = None) -> list[tuple[int, dict[str, str]]]:
    """(line, options) of the `#SBATCH` lines sbatch reads: those before the first command (`first_line`: the
    line `text` starts on in its file `path`, a here-document's); PlannerInputError naming the line for an option
    sbatch refuses as ambiguous."""
    out: list[tuple[int, dict[str, str]]] = []
    for k, line in enumerate(text.splitlines(), first_line):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        m = _SBATCH_LINE.match(stripped)
        if m:
            try:
                words = shlex.split(m.group(1), comments=True)
            except ValueError:
                continue
            try:
                opts = sbatch_options(words)
            except SlurmOptionError as exc:
                raise PlannerInputError(f"{path}:{k}" if path else f"line {k}", f"#SBATCH: {exc}") from None
            if opts:
                out.append((k, opts))
    return out


def gpu_count(value: str) -> str:
    """The GPU count of `8`, `h100:8`, `gpu:8` or `gpu:h100:8` ('' where it has none)."""
    last = value.split(",")[0].rsplit(":", 1)[-1]
    return last if last.isdigit() else ""


# Slurm's count suffixes (src/common/slurm_protocol_defs.c `suffix_mult`, case-insensitive)
_SUFFIX_MULT = {"": 1} | {s: 1024 ** p for p, c in enumerate("kmgtp", 1) for s in (c, f"{c}ib")} | {
    f"{c}b": 1000 ** p for p, c in enumerate("kmgtp", 1)}
_GRES_COUNT = re.compile(r"(\d+)([a-zA-Z]*)")


def _gres_number(text: str) -> int | None:
    """A gres count (`8`, `1k`) as Slurm reads it (`_is_valid_number`: digits, then a suffix of `suffix_mult`);
    None where `text` is not one."""
    m = _GRES_COUNT.fullmatch(text)
    mult = _SUFFIX_MULT.get(m.group(2).lower()) if m else None
    return int(m.group(1)) * mult if m and mult is not None else None


def gres_gpus(value: str) -> str | None:
    """The GPUs on each node a --gres list asks for: the sum of its `gpu` entries' counts, as digits; None where
    it has no `gpu` entry (`nvme:1`, `shard:2`: no GPU count); '' where Slurm would not read it (`gpu:8(S:0-1)`,
    `none`, text the reader left unexpanded: `gpu:$N`, `$GRES`).

    The grammar (srun(1)/sbatch(1) --gres: "a comma-delimited list ... The format for each entry in the list is
    name[[:type]:count] ... count ... with a default value of 1 ... can have a suffix of k|K, m|M, g|G, t|T, p|P"), as
    Slurm parses it (src/common/slurm_protocol_defs.c `slurm_get_next_tres`, called from src/interfaces/gres.c
    `_get_next_gres`; slurm_opt.c `arg_set_gres` puts `gres/` in front of each entry, `gres_prepend_tres_type`):
    an entry may start `gres/`; its last `:` part is the count where it is a number (digits and a suffix), else the
    type (count 1), and a type followed by another `:` part is refused; the name is matched exactly (`gpu`); an
    entry of count 0 asks for nothing."""
    if value.lower() == "none" or "$" in value or "`" in value:
        return ""
    total: int | None = None
    for entry in value.split(","):
        parts = entry.removeprefix("gres/").split(":")
        if parts == [""]:
            continue  # an empty entry, as Slurm skips it
        count = _gres_number(parts[-1]) if len(parts) > 1 else 1
        if len(parts) > 3 or "" in parts or (count is None and len(parts) == 3):
            return ""  # `gpu:`, `gpu:a:b:8`, `gpu:8(S:0-1)`: refused by Slurm
        if parts[0] == "gpu":
            total = (total or 0) + (count if count is not None else 1)
    return None if total is None else str(total)


def tres_gpus(value: str) -> str | None:
    """The GPUs each task gets from a --tres-per-task list (`gres/gpu=2`, `gres/gpu:a100=2`, `cpu=4,gres/gpu=2`): the
    sum of its `gres/gpu` entries' counts, as digits; None where it has no such entry (`cpu=4`); '' where Slurm would
    not read it or the reader left it unexpanded.

    srun(1) --tres-per-task: "a comma-delimited list ... trestype[/tresname]=count", e.g. `gres/gpu:a100=2`; "with
    gres/gpu ... will implicitly set --tres-bind=gres/gpu:per_task:<tres_per_task>, or if multiple gpu types are
    specified --tres-bind=gres/gpu:per_task:<gpus_per_task_type_sum>".  Slurm (SchedMD/slurm
    284c3b95f08a2dc2478499837b03355e1b9c5c75, src/common/slurm_opt.c `_validate_tres_per_task`) writes a `gres:`
    entry as `gres/` (`slurm_format_tres_string`), sets --gpus-per-task from the gpu entries
    (`_set_tres_per_task_from_sibling_opt`) and binds their sum to each task (`_implicitly_bind_tres_per_task`);
    each entry's count follows its last `=` (a number with a suffix, else refused) or `:`
    (src/common/slurm_protocol_defs.c `slurm_get_next_tres`), else 1."""
    if "$" in value or "`" in value:
        return ""
    total: int | None = None
    for entry in value.split(","):
        kind, slash, rest = entry.replace("gres:", "gres/", 1).partition("/")
        if kind != "gres" or not slash:
            continue  # cpu=4, license/ansys=1: not a GPU
        name, count = _tres_entry(rest)
        if count is None or not name:
            return ""  # `gres/gpu=x`, `gres/=2`: refused by Slurm
        if name.split(":", 1)[0] == "gpu":
            total = (total or 0) + count
    return None if total is None else str(total)


def _tres_entry(text: str) -> tuple[str, int | None]:
    """(name, count) of a tres entry after its `gres/` (`gpu:a100=2`, `gpu:a100:2`, `gpu`): the count after its last
    `=` (None where not a number), else after its last `:` where that is one, else 1 (`slurm_get_next_tres`)."""
    if "=" in text:
        name, _, count = text.rpartition("=")
        return name, _gres_number(count)
    name, colon, last = text.rpartition(":")
    count = _gres_number(last) if colon else None
    return (name, count) if count is not None else (text, 1)


def gpu_value(key: str, value: str) -> str | None:
    """The count an sbatch_options key's value gives: the GPU count of a GPU option (`gpu_count`, `gres_gpus`,
    `tres_gpus`; None where a --gres or --tres-per-task asks for no GPU), else the value as given."""
    if key == "gres":
        return gres_gpus(value)
    if key == "tres-per-task":
        return tres_gpus(value)
    return gpu_count(value) if key in GPU_KEYS else value


def slurm_values(options: dict[str, tuple[str, str]]) -> list[SchedulerValue]:
    """SLURM_* variables of a job with these options ({key: (value, where given)}); only integers."""
    def num(key: str) -> tuple[str, str] | None:
        value, where = options.get(key, ("", ""))
        count = gpu_value(key, value)
        return (count, where) if count is not None and count.isdigit() else None

    out: list[SchedulerValue] = []
    nodes, per, tasks = num("nodes"), num("ntasks-per-node"), num("ntasks")
    gpus = num("gpus-per-node") or num("gres")
    if nodes:
        out += [SchedulerValue(n, nodes[0], nodes[1]) for n in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES")]
    if per:
        out += [SchedulerValue(n, per[0], per[1]) for n in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")]
    if tasks is None and nodes and per:
        tasks = (str(int(nodes[0]) * int(per[0])), f"{nodes[1]} and {per[1]}")
    if tasks:
        out += [SchedulerValue(n, tasks[0], tasks[1]) for n in ("SLURM_NTASKS", "SLURM_NPROCS")]
    if gpus:
        out += [SchedulerValue(n, gpus[0], gpus[1]) for n in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE")]
    for key in ("gpus", "gpus-per-task", "ntasks-per-gpu"):  # sbatch sets each where the job asks for it
        given = num(key) or (num("tres-per-task") if key == "gpus-per-task" else None)  # its gres/gpu: the same
        if given:
            out.append(SchedulerValue(f"SLURM_{key.upper().replace('-', '_')}", given[0], given[1]))
    for key in ("gpu-bind", "tres-bind"):  # the GPUs each task sees, as given (sbatch(1): SLURM_GPU_BIND; the
        if key in options:  # job's SLURM_TRES_BIND, src/common/env.c), which srun reads as its own (srun/opt.c)
            out.append(SchedulerValue(f"SLURM_{key.upper().replace('-', '_')}", *options[key]))
    if "export" in options and options["export"][0].upper() != "ALL":  # src/sbatch/opt.c sets it for srun, which
        out.append(SchedulerValue("SLURM_EXPORT_ENV", *options["export"]))  # reads it as --export (srun_export.py)
    return out


def sbatch_values(text: str, command_words: list[str] | None = None, *, path: str | None = None,
                  first_line: int = 1) -> list[SchedulerValue]:
    """The SLURM_* variables a job script's `#SBATCH` lines (and sbatch's own options, which win) set; `path` and
    `first_line`: the file the text is in and its line there, for where each value comes from."""
    options: dict[str, tuple[str, str]] = {}
    for line, opts in sbatch_directives(text, first_line, path):
        for key, value in opts.items():
            options[key] = (value, f"`#SBATCH --{key}={value}` ({f'{path}:{line}' if path else f'line {line}'})")
    for key, value in sbatch_options(command_words or []).items():
        options[key] = (value, f"`sbatch --{key}={value}`")
    return slurm_values(options)
