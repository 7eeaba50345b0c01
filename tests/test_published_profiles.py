"""The profile tables built from published component benchmarks (profiles/published/, planner/profiling/published.py):
every figure has a source, the shipped overlays are what the builder makes of them, and the cost model reads them
through the same layering as a user's --profiles DIR."""

from __future__ import annotations

import pytest
import yaml

from planner.cost.curves import interpolate_efficiency
from planner.cost.kernels import ATTENTION_BWD_OVER_FWD
from planner.profile_tables import ProfileSet
from planner.profiling.published import COMPONENTS_CSV, PUBLISHED_DIR, TABLES, load_components, overlays, render


@pytest.fixture(scope="module")
def rows():
    return load_components()


def test_every_row_is_a_published_figure_with_its_source(rows):
    """Each row names its table, where it was measured, the devices it applies to, and a source with a commit or
    URL; values are positive TFLOP/s against the stated dense peak."""
    assert len(rows) >= 20 and COMPONENTS_CSV.is_file()
    for r in rows:
        assert r["table"] in TABLES, r["id"]
        assert ("@" in r["source"] or "http" in r["source"] or "pull/" in r["source"]), r["id"]
        assert float(r["value"]) > 0 and float(r["peak_tflops"]) > 0 and r["applies_to"].split(), r["id"]
    assert len({r["id"] for r in rows}) == len(rows)


def test_shipped_overlays_are_the_builder_output(rows):
    """profiles/published/devices/*.yaml are exactly what `python -m planner.profiling.published --write` makes of
    components.csv (nobody edited a table by hand)."""
    built = overlays(rows, ProfileSet.uncalibrated())
    files = sorted(p.stem for p in (PUBLISHED_DIR / "devices").glob("*.yaml"))
    assert files == sorted(built)
    for name, overlay in built.items():
        assert (PUBLISHED_DIR / "devices" / f"{name}.yaml").read_text(encoding="utf-8") == render(overlay), name


def test_attention_point_is_the_hand_computed_combination(profiles):
    """At 4096 tokens (causal forward 275 GFLOP per call) the curve is (1+R)/(1/e_fc + R/e_bc) of the cuDNN figures
    518 (causal fwd), 609 (fwd) and 499 (bwd, non-causal) TFLOP/s over 989, with e_bc = e_b * e_fc / e_f."""
    e_fc, e_f, e_b = 518 / 989, 609 / 989, 499 / 989
    e_bc = e_b * e_fc / e_f
    r = ATTENTION_BWD_OVER_FWD
    expected = (1 + r) / (1 / e_fc + r / e_bc)
    curve = profiles.device("H100").attention_efficiency
    assert interpolate_efficiency(curve, 274877906944.0) == pytest.approx(expected, abs=1e-4)
    assert curve.provenance.kind == "published"


def test_grouped_gemm_falls_at_few_tokens_per_expert(profiles):
    """The published figures put 512 tokens per expert (9-16% of peak) far below 2048-4096 (40-66%): the
    multiplier at 512 is under a third of the one at 4096, on H100 and on H800 (same die)."""
    for dev in ("H100", "H800"):
        curve = profiles.device(dev).grouped_gemm_efficiency
        assert curve.provenance.kind == "published"
        assert interpolate_efficiency(curve, 512) < interpolate_efficiency(curve, 4096) / 3
    assert "applied to H800" in profiles.device("H800").grouped_gemm_efficiency.provenance.source


def test_a_users_measured_table_beats_the_published_one(tmp_path):
    """--profiles DIR layers over profiles/published/ as it layers over the datasheet: a measured attention table
    replaces the published one, and the manifest lists all three layers."""
    measured = {"points": [{"size": 1e9, "efficiency": 0.3}, {"size": 1e12, "efficiency": 0.6}],
                "provenance": {"kind": "measured", "source": "cli.py profile on node-3"}}
    (tmp_path / "devices").mkdir()
    (tmp_path / "devices" / "h100.yaml").write_text(yaml.safe_dump({"name": "H100", "attention_efficiency": measured}))
    ps = ProfileSet.load([str(tmp_path)])
    assert ps.device("H100").attention_efficiency.provenance.kind == "measured"
    assert ps.device("H100").grouped_gemm_efficiency.provenance.kind == "published"
    row = next(r for r in ps.provenance_manifest() if r["name"] == "H100")
    assert len(row["layers"]) == 3 and {"published", "measured"} <= set(row["provenance_kinds"])
