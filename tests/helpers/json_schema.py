"""docs/schema/*.json loaded once, and a check of a --json object against its command's schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import referencing
from referencing.jsonschema import DRAFT202012

from planner.output.report import SCHEMA_VERSION

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "docs" / "schema"
SCHEMAS: dict[str, dict] = {p.stem: json.loads(p.read_text()) for p in sorted(SCHEMA_DIR.glob("*.json"))}
REGISTRY = referencing.Registry().with_resources(
    [(doc["$id"], DRAFT202012.create_resource(doc)) for doc in SCHEMAS.values()])


def validator(command: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(SCHEMAS[command], registry=REGISTRY)


def documented_keys(command: str) -> set[str]:
    """Top-level keys a command's schema describes: its own and those of the parts it includes (allOf)."""
    doc = SCHEMAS[command]
    keys = set(doc.get("properties", {}))
    for part in doc.get("allOf", []):
        keys |= set(REGISTRY.resolver().lookup(part["$ref"]).contents.get("properties", {}))
    return keys


def check_json(command: str, payload: dict) -> None:
    """The object follows docs/schema/COMMAND.json, has this version, and prints no undocumented top-level key."""
    errors = sorted(validator(command).iter_errors(payload), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message[:300]}" for e in errors)
    assert payload["schema_version"] == SCHEMA_VERSION
    undocumented = set(payload) - documented_keys(command)
    assert not undocumented, f"{command} --json prints keys docs/schema/{command}.json does not describe: {undocumented}"
