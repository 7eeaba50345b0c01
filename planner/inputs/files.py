"""Reading the files a user names (model, cluster, plan, HF config, script, log), safely.

Every way a file can be unusable becomes one `PlannerInputError` that names the flag and the file:
a missing file, a directory, a path too long for the system, a file too large, bytes that are not
UTF-8, invalid JSON or YAML, a document nested deeper than `MAX_NESTING_DEPTH`, an integer with
thousands of digits, NaN or infinity in JSON, a repeated key, a key that is not a string, or a YAML
alias bomb.  The depth is checked on the parser's event stream before any object is built, so a
50,000-deep YAML document never reaches the recursive composer (JSON's C decoder stops itself).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any, BinaryIO, Literal

import yaml

from planner.errors import PlannerInputError
from planner.schemas.types import control_character_problem

MAX_DOCUMENT_BYTES = 1 << 20  # model, cluster, plan, HF config files: 1 MiB (real ones are a few KiB)
MAX_NESTING_DEPTH = 64  # lists/mappings inside each other (real files: <= 6)
MAX_DOCUMENT_NODES = 1_000_000  # values in a document, aliases expanded (stops YAML "billion laughs")
MAX_PATH_CHARS = 4096  # the usual PATH_MAX; one name may have at most 255


def _too_long(flag: str, path: str) -> PlannerInputError:
    return PlannerInputError(
        flag, f"path too long ({len(path)} characters; the system allows 255 per name and {MAX_PATH_CHARS} in all): "
              f"{_short(path)}"
    )


def _short(text: str, limit: int = 80) -> str:
    """A long path or value, shortened for a one-line message."""
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 4:]}"


def path_kind(path: str | Path, flag: str) -> Literal["file", "dir", "missing", "other"]:
    """What is at `path`, without an OSError escaping: too long a path or a NUL byte in it is a
    PlannerInputError naming `flag`; a path through a regular file counts as missing."""
    text = os.fspath(path)
    if "\x00" in text:
        raise PlannerInputError(flag, "the path contains a NUL character")
    if len(text) > MAX_PATH_CHARS:
        raise _too_long(flag, text)
    try:
        st = os.stat(text)
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise _too_long(flag, text) from None
        if exc.errno == errno.ELOOP:
            raise PlannerInputError(flag, f"{_short(text)}: too many levels of symbolic links") from None
        raise PlannerInputError(flag, f"cannot access {_short(text)}: {exc.strerror}") from None
    except ValueError:
        raise PlannerInputError(flag, "the path contains a character the system refuses") from None
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    return "file" if stat.S_ISREG(st.st_mode) else "other"


def open_regular(path: str | Path, flag: str) -> BinaryIO:
    """`path` opened for reading in binary, once it is known to be a regular file: the check is made on
    the opened file (opened without blocking, so a FIFO or a device never hangs the planner, and a file
    swapped for one after a check is still refused).  Every failure is one PlannerInputError naming `flag`."""
    text_path = os.fspath(path)
    kind = path_kind(text_path, flag)
    shown = _short(text_path)
    if kind == "missing":
        raise PlannerInputError(flag, f"file not found: {shown}")
    if kind == "dir":
        raise PlannerInputError(flag, f"{shown} is a directory, not a file")
    try:
        fd = os.open(text_path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise PlannerInputError(flag, f"cannot read {shown}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PlannerInputError(flag, f"{shown} is not a regular file (a pipe, socket or device is never read)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text(path: str | Path, flag: str, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """The UTF-8 text of a regular file; every failure is one PlannerInputError naming `flag` and the file."""
    shown = _short(os.fspath(path))
    with open_regular(path, flag) as fh:
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise PlannerInputError(flag, f"cannot read {shown}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise PlannerInputError(flag, f"{shown} is larger than {max_bytes} bytes; this is not a file of this kind")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PlannerInputError(
            flag, f"{shown} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


# --------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------


class _DocumentError(ValueError):
    pass


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _DocumentError(f"the number {_short(text, 40)} is out of range (not a finite float)")
    return value


def _no_constant(text: str) -> Any:
    raise _DocumentError(f"{text} is not valid JSON (numbers must be finite)")


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DocumentError(f"the key {_short(key, 40)!r} appears twice in one object")
        out[key] = value
    return out


def parse_json(text: str, flag: str, source: str) -> Any:
    """A JSON document, checked (see the module docstring)."""
    try:
        data = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant,
                          object_pairs_hook=_unique_pairs)
    except _DocumentError as exc:
        raise PlannerInputError(flag, f"{source}: {exc}") from None
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise PlannerInputError(flag, f"{source} is not valid JSON: {exc.msg} ({where})") from None
    except RecursionError:
        raise PlannerInputError(flag, f"{source}: nested deeper than {MAX_NESTING_DEPTH} levels") from None
    except ValueError as exc:  # an integer with more digits than Python converts
        raise PlannerInputError(flag, f"{source}: {_number_problem(exc)}") from None
    _check_tree(data, flag, source)
    return data


def _number_problem(exc: Exception) -> str:
    text = str(exc)
    if "digits" in text:
        return "an integer has thousands of digits; no field takes a number that large"
    return _short(text, 120)


# --------------------------------------------------------------------------------------------
# YAML
# --------------------------------------------------------------------------------------------

_FAST = bool(getattr(yaml, "__with_libyaml__", False))
_ParseLoader = yaml.CSafeLoader if _FAST else yaml.SafeLoader


class _UniqueKeyLoader(_ParseLoader):  # type: ignore[misc, valid-type]
    """SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} appears twice in one mapping", key_node.start_mark
                    )
                seen.add(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a key is a list or mapping, not a name", key_node.start_mark
                ) from None
        return super().construct_mapping(node, deep=deep)


# YAML 1.2 reads `1e300`, `1e-12` and `1.5e3` as numbers; PyYAML's YAML 1.1 resolver reads them as strings
# (it wants a dot and a signed exponent), which would refuse a number the user wrote as one
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?([0-9][0-9_]*(\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))


# libyaml 0.2.6 (in the PyYAML 6.0.4 wheels) refuses 1,000 levels itself, in its scanner, which reads
# ahead of the events; its problem text is the only sign that it did, and 1,000 > MAX_NESTING_DEPTH.
_LIBYAML_DEPTH_PROBLEM = "nesting depth"


def _yaml_too_deep(text: str) -> bool:
    """Nesting depth from the parser's event stream (libyaml's parser keeps a state stack, it does not
    recurse), checked before the recursive composer runs; libyaml's own depth limit counts as too deep."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_ParseLoader):
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_NESTING_DEPTH:
                    return True
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
    except yaml.MarkedYAMLError as exc:
        if _LIBYAML_DEPTH_PROBLEM in (exc.problem or ""):
            return True
        raise
    return False


def parse_yaml(text: str, flag: str, source: str) -> Any:
    """A YAML document (safe subset), checked (see the module docstring)."""
    try:
        too_deep = _yaml_too_deep(text)
        data = None if too_deep else yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        where = f" (line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1})" if exc.problem_mark else ""
        problem = exc.problem or exc.context or "syntax error"
        raise PlannerInputError(flag, f"{source} is not valid YAML: {problem}{where}") from None
    except yaml.YAMLError as exc:
        raise PlannerInputError(flag, f"{source} is not valid YAML: {_short(' '.join(str(exc).split()), 120)}") from None
    except RecursionError:
        raise PlannerInputError(flag, f"{source}: nested deeper than {MAX_NESTING_DEPTH} levels") from None
    except ValueError as exc:  # int("1" * 5000) in the constructor
        raise PlannerInputError(flag, f"{source}: {_number_problem(exc)}") from None
    if too_deep:
        raise PlannerInputError(flag, f"{source}: nested deeper than {MAX_NESTING_DEPTH} levels")
    _check_tree(data, flag, source)
    return data


def _check_tree(data: Any, flag: str, source: str) -> None:
    """Walk the built document without recursion: bounded depth and size (aliases expanded)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_DOCUMENT_NODES:
            raise PlannerInputError(flag, f"{source}: more than {MAX_DOCUMENT_NODES} values (aliases expanded)")
        if depth > MAX_NESTING_DEPTH:
            raise PlannerInputError(flag, f"{source}: nested deeper than {MAX_NESTING_DEPTH} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def load_document(path: str | Path, flag: str) -> Any:
    """A JSON (`.json`) or YAML (anything else) file, read and checked."""
    text = read_text(path, flag)
    source = _short(os.fspath(path))
    if os.fspath(path).lower().endswith(".json"):
        return parse_json(text, flag, source)
    return parse_yaml(text, flag, source)


def name_from_path(name: str, flag: str, what: str) -> str:
    """`name`, taken from a file or directory name (`what`: which one, and what it names), as the output will show
    it: refused naming `flag` when it holds a control character, as a name stated in a file is (DisplayText)."""
    problem = control_character_problem(name)
    if problem is not None:
        raise PlannerInputError(flag, f"{what}: {problem}")
    return name


def require_string_keys(data: dict[Any, Any], flag: str, where: str) -> None:
    """Mapping keys are field names: refuse `5: 3` or `true: x` in a YAML mapping."""
    for key in data:
        if not isinstance(key, str):
            raise PlannerInputError(flag, f"{where} has the key {key!r}; keys are field names (strings)")
