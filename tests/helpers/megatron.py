"""Megatron-LM's own validator (tools/megatron_validate.py) from the tests: where its environment is,
and one call that checks a batch of flag lists in one process (one import of Megatron)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tools.megatron_validate import megatron_python

ROOT = Path(__file__).resolve().parents[2]
VALIDATE = ROOT / "tools" / "megatron_validate.py"


PYTHON = megatron_python()
NEEDS_MEGATRON = pytest.mark.skipif(
    PYTHON is None,
    reason="Megatron's validator environment is not built (bash .ci/megatron_env.sh builds it: Python 3.12, "
    "megatron-core 0.19.2, torch); set HAPMOE_MEGATRON_PYTHON to use another",
)


def validate(cases: list[dict], timeout_s: float = 900) -> dict[str, dict]:
    """{name: {"ok", "error"}} for cases {"name", "argv", "world_size", "env"}, in one subprocess."""
    assert PYTHON is not None
    proc = subprocess.run([PYTHON, str(VALIDATE)], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["name"]: r for r in json.loads(proc.stdout)}
