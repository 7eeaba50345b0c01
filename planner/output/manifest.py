"""The manifest: how the planner knows which files in a directory it wrote.

Every directory a command writes (`solve --out`, `--plot`, `emit --out`, `profile`/`calibrate --out`,
`bench --out`) holds `hapmoe-manifest.json`: for each file the planner wrote there, its path relative
to the directory, its size, its SHA-256 and the command that wrote it.  A file is the planner's only
while it is listed *and* unchanged (same size and hash); a file that is not listed, or that was edited
since, is the user's.  The staged writer (planner/output/run_dir.py) replaces or deletes only the
planner's files; everything else in the directory is left as it is.

`survey(DIR)` reads a directory against its manifest.  A manifest that cannot be read (not JSON, not
the format below) is no manifest: the directory is then not the planner's, and the file itself is
treated as the user's.

    {"format": "hapmoe-manifest/1", "family": "plan",
     "files": [{"path": "plan.json", "bytes": 1234, "sha256": "...", "writer": "solve --out"}, ...]}
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

MANIFEST_NAME = "hapmoe-manifest.json"
FORMAT = "hapmoe-manifest/1"
STAGING_PREFIX = ".hapmoe-"  # the staged writer's temporary directories (never listed, never counted)
MAX_SURVEY_ENTRIES = 100_000  # a directory with more entries is not read further (and is no earlier output)
MAX_MANIFEST_BYTES = 16 << 20


@dataclass
class Survey:
    """An existing directory read against its manifest.  Paths are relative, with '/' separators."""

    root: Path
    family: str | None = None  # the manifest's family, None without a readable manifest
    listed: dict[str, dict[str, Any]] = field(default_factory=dict)  # every manifest entry by path
    ours: set[str] = field(default_factory=set)  # listed and unchanged: the planner's files
    changed: set[str] = field(default_factory=set)  # listed, but edited since (now the user's)
    others: list[str] = field(default_factory=list)  # files and links the manifest does not list
    truncated: bool = False  # more than MAX_SURVEY_ENTRIES entries: not read to the end

    @property
    def empty(self) -> bool:
        """Nothing but empty directories (and the writer's own staging debris)."""
        return not (self.ours or self.changed or self.others or self.truncated or self.family)

    def users_files(self) -> list[str]:
        """The files that are the user's: not listed, or edited since the planner wrote them."""
        return sorted(set(self.others) | self.changed)

    def within(self, prefix: str) -> Survey:
        """The files under `prefix` (a subdirectory's path ending in '/'), paths kept whole; no family
        (the manifest is the directory's above)."""
        def inside(paths: Iterable[str]) -> list[str]:
            return [p for p in paths if p.startswith(prefix)]
        return Survey(root=self.root, listed={p: self.listed[p] for p in inside(self.listed)},
                      ours=set(inside(self.ours)), changed=set(inside(self.changed)), others=inside(self.others),
                      truncated=self.truncated)

    def writer_of(self, rel: str) -> str | None:
        entry = self.listed.get(rel)
        return entry.get("writer") if entry else None


def file_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def entry_for(path: Path, rel: str, writer: str) -> dict[str, Any]:
    return {"path": rel, "bytes": path.stat().st_size, "sha256": file_digest(path), "writer": writer}


def manifest_text(entries: Iterable[dict[str, Any]], family: str) -> str:
    rows = sorted(entries, key=lambda e: e["path"])
    return json.dumps({"format": FORMAT, "family": family,
                       "note": "files the HAPMoE planner wrote here; it replaces or deletes only these, and only "
                               "while unchanged (same size and SHA-256)",
                       "files": rows}, indent=1) + "\n"


def read_manifest(root: Path) -> tuple[str | None, dict[str, dict[str, Any]]]:
    """(family, {path: entry}) from DIR/hapmoe-manifest.json; (None, {}) when absent or unreadable."""
    path = root / MANIFEST_NAME
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_MANIFEST_BYTES:
            return None, {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None, {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("family"), str):
        return None, {}
    listed: dict[str, dict[str, Any]] = {}
    for row in data.get("files") if isinstance(data.get("files"), list) else []:
        if _valid_entry(row):
            listed[row["path"]] = row
    return data["family"], listed


def _valid_entry(row: Any) -> bool:
    if not isinstance(row, dict):
        return False
    rel, size, digest, writer = row.get("path"), row.get("bytes"), row.get("sha256"), row.get("writer")
    return (isinstance(rel, str) and rel and not rel.startswith("/") and ".." not in rel.split("/")
            and isinstance(size, int) and not isinstance(size, bool) and isinstance(digest, str)
            and isinstance(writer, str))


def survey(root: Path) -> Survey:
    """Read `root` (an existing directory) against its manifest: which files are the planner's."""
    family, listed = read_manifest(root)
    out = Survey(root=root, family=family, listed=listed)
    seen = 0
    for rel, kind in _walk(root):
        seen += 1
        if seen > MAX_SURVEY_ENTRIES:
            out.truncated = True
            break
        if rel == MANIFEST_NAME and family is not None:
            continue
        entry = listed.get(rel)
        if entry is None or kind != "file":
            out.others.append(rel)
        elif entry_unchanged(root / rel, entry):
            out.ours.add(rel)
        else:
            out.changed.add(rel)
    return out


def entry_unchanged(path: Path, entry: dict[str, Any]) -> bool:
    """Whether the file at `path` is still the one the manifest entry describes (size and SHA-256)."""
    try:
        return path.stat().st_size == entry["bytes"] and file_digest(path) == entry["sha256"]
    except OSError:
        return False


def _walk(root: Path):
    """(relative path, "file" | "link" | "other") for everything under root but directories, without
    following links; the top level's staging directories are skipped."""
    stack = [("", root)]
    while stack:
        prefix, directory = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if not prefix and e.name.startswith(STAGING_PREFIX):
                continue
            rel = prefix + e.name
            if e.is_symlink():
                yield rel, "link"
            elif e.is_dir(follow_symlinks=False):
                stack.append((rel + "/", Path(e.path)))
            elif e.is_file(follow_symlinks=False):
                yield rel, "file"
            else:
                yield rel, "other"


__all__ = ["MANIFEST_NAME", "STAGING_PREFIX", "Survey", "entry_for", "entry_unchanged", "file_digest", "manifest_text",
           "read_manifest", "survey"]
