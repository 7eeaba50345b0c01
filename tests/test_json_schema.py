"""docs/schema/*.json against the real --json output of solve, estimate, compare and calibrate.

The schemas are JSON Schema (draft 2020-12) files that document every public key; common.json holds the
parts the commands share.  Each test runs a command on a small input, validates what it printed, and checks
that every top-level key it printed is documented, so a key added to the output without its description
fails here (add it to the command's file in docs/schema/)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from cli import main
from helpers.json_schema import SCHEMAS, check_json as check, validator
from planner.output.report import SCHEMA_VERSION
from tools.fuzz.inputs import TINY_FLAGS

RUNNER = CliRunner()


def json_of(args: list[str]) -> dict:
    res = RUNNER.invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_the_schemas_are_valid_json_schema_and_agree_on_the_version():
    assert set(SCHEMAS) >= {"common", "solve", "estimate", "compare", "calibrate"}
    for name, doc in SCHEMAS.items():
        jsonschema.Draft202012Validator.check_schema(doc)
        assert doc["$id"] == f"urn:hapmoe:schema:{name}"
    assert SCHEMAS["common"]["$defs"]["schema_version"]["const"] == SCHEMA_VERSION


@pytest.mark.parametrize("backend", ["cpsat", "hsdp"])
def test_solve_json_follows_the_schema(tiny, backend):
    """Both backends; with flags that hold a plan of their own, so user_plan is there too."""
    payload = json_of(["solve", "--megatron-args", TINY_FLAGS + " --tensor-model-parallel-size 2 --sequence-parallel",
                       "--cluster", "H800:4", "--backend", backend, "--top", "2", "--json", "--quiet"])
    assert payload["user_plan"]["priced"] is True
    check("solve", payload)


def test_estimate_json_follows_the_schema_also_when_nothing_fits():
    fits = json_of(["estimate", "--model", "mixtral-s", "--cluster", "H800:32", "--tp", "2", "--pp", "4", "--ep", "4",
                    "--json"])
    check("estimate", fits)
    short = json_of(["estimate", "--model", "mixtral-l", "--cluster", "H800:8", "--tp", "1", "--pp", "1", "--ep", "1",
                     "--json"])
    assert short["fits"] is False and short["overflow"]["short_gib"] > 0
    check("estimate", short)


def test_compare_json_follows_the_schema(tiny):
    payload = json_of(["compare", "--model", str(tiny), "--cluster", "H800:4", "--layers", "2", "--brute", "--json"])
    assert {r["backend"] for r in payload["results"]} == {"cpsat", "hsdp", "brute"}
    check("compare", payload)


def test_calibrate_json_follows_the_schema(tmp_path):
    """One run's log (the fixture of tests/test_calibration.py, on llama2-7b cut to 8 layers): the report carries
    schema_version, follows docs/schema/calibrate.json, and calibration_report.json holds the same object less
    `written`.  (The --trials shape is checked in tests/test_trials.py.)"""
    root = Path(__file__).resolve().parents[1]
    model = tmp_path / "llama2-7b-8l.yaml"
    text = (root / "profiles" / "models" / "llama2-7b.yaml").read_text()
    model.write_text(re.sub(r"(?m)^num_layers: \d+", "num_layers: 8", text).replace("name: llama2-7b", "name: l8"))
    out = tmp_path / "calib"
    log = root / "tests" / "data" / "logs" / "megatron_core018_minmax.log"
    payload = json_of(["calibrate", "--megatron-log", str(log), "--model", str(model), "--cluster", "H100:8",
                       "--tp", "2", "--pp", "2", "--gbs", "64", "--out", str(out), "--json",
                       "--allow-memory-excess"])  # the fixture's memory is beyond what calibrate writes unasked
    check("calibrate", payload)
    written = json.loads((out / "calibration_report.json").read_text())
    assert written == {k: v for k, v in payload.items() if k != "written"}
    bad = copy.deepcopy(payload)
    bad["stages"][0].pop("predicted_memory_gib")
    assert list(validator("calibrate").iter_errors(bad))


def test_the_schemas_refuse_what_they_should(tiny):
    """The schema is not vacuous: a wrong status, a missing stage time, another version and a plan without
    stages are each refused."""
    good = json_of(["solve", "--model", str(tiny), "--cluster", "H800:4", "--json", "--quiet"])
    check("solve", good)
    edits = {
        "status": lambda d: d.__setitem__("status", "DONE"),
        "stage time": lambda d: d["stages"][0].pop("time_s"),
        "version": lambda d: d.__setitem__("schema_version", SCHEMA_VERSION + 1),
        "plan stages": lambda d: d["plan"].__setitem__("stages", []),
        "lower bound": lambda d: d.__setitem__("lower_bound_s", "soon"),
    }
    for what, edit in edits.items():
        bad = copy.deepcopy(good)
        edit(bad)
        assert list(validator("solve").iter_errors(bad)), what
