"""The profile tables built from published component benchmarks (profiles/published/, planner/profiling/published.py):
every figure has a source, the shipped overlays are what the builder makes of them, and the cost model reads them
through the same layering as a user's --profiles DIR."""

from __future__ import annotations

import pytest
import yaml

from planner.cost.curves import interpolate_efficiency
from planner.cost.kernels import ATTENTION_BWD_OVER_FWD, Kernels
from planner.profile_tables import ProfileSet
from planner.profiling.published import COMPONENTS_CSV, PUBLISHED_DIR, TABLES, load_components, overlays, render

from helpers.cases import flags_cost_model


@pytest.fixture(scope="module")
def rows():
    return load_components()


def test_every_row_is_a_published_figure_with_its_source(rows):
    """Each row names its table, where it was measured, the devices it applies to (or, applied to none, says why in
    its notes), and a source with a commit or URL; values are positive TFLOP/s against the stated dense peak."""
    assert len(rows) >= 20 and COMPONENTS_CSV.is_file()
    for r in rows:
        assert r["table"] in TABLES, r["id"]
        assert ("@" in r["source"] or "http" in r["source"] or "pull/" in r["source"]), r["id"]
        assert float(r["value"]) > 0 and float(r["peak_tflops"]) > 0, r["id"]
        assert r["applies_to"].split() or r["notes"].startswith("NOT APPLIED ("), r["id"]
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


def _attention_core_s(flags: str, cluster: str) -> float:
    _, plan, cost = flags_cost_model(flags, cluster)
    return dict(cost.evaluate(plan).stages[0].parts)["attention_core"]


ATTN = ("--num-layers 2 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 "
        "--vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 --bf16")
"""One attention call per layer of 2 x 4096^2 x 32 x 128 = 137.4 GFLOP (causal forward), the size of the published
figures' 2048-token point (16k tokens of 16 heads): no interpolation between points."""


def test_flash_backend_runs_flashattention2_on_h100_and_nothing_changes_on_a100(profiles):
    """`--attention-backend flash` makes Transformer Engine run the FlashAttention package (Megatron sets
    NVTE_FUSED_ATTN=0): on H100 its attention core takes cuDNN's combined efficiency at 137.4 GFLOP over
    FlashAttention-2's published 265 TFLOP/s / 989 longer (flash-attention's H100 benchmark, causal, head dim 128);
    on A100, whose table is FlashAttention-2 already, nothing changes."""
    e_cudnn = interpolate_efficiency(profiles.device("H100").attention_efficiency, 137438953472.0)
    auto = _attention_core_s(ATTN, "H100:8")
    flash = _attention_core_s(ATTN + " --attention-backend flash", "H100:8")
    assert flash / auto == pytest.approx(e_cudnn / (265 / 989), rel=5e-4)  # the tables keep 4 decimals
    assert 1.3 < flash / auto < 1.6
    a100 = (_attention_core_s(ATTN, "A100:8"), _attention_core_s(ATTN + " --attention-backend flash", "A100:8"))
    assert a100[0] == pytest.approx(a100[1], rel=1e-12)
    assert profiles.device("A100").flash_attention_efficiency is None


def test_a_users_measured_attention_table_prices_the_flash_backend_too(tmp_path):
    """A measured attention table (`cli.py profile` times the kernel the user's stack runs) wins over the published
    FlashAttention-2 table as it wins over the published cuDNN one."""
    measured = {"points": [{"size": 1e9, "efficiency": 0.3}, {"size": 1e12, "efficiency": 0.6}],
                "provenance": {"kind": "measured", "source": "cli.py profile on node-3"}}
    (tmp_path / "devices").mkdir()
    (tmp_path / "devices" / "h100.yaml").write_text(yaml.safe_dump({"name": "H100", "attention_efficiency": measured}))
    ps = ProfileSet.load([str(tmp_path)])
    kernels = [Kernels(ps.device("H100"), {"attention": 1.0}, "bf16", None, flash_attention=f) for f in (False, True)]
    assert kernels[0].attention_s(1e11) == kernels[1].attention_s(1e11)
    shipped = Kernels(ProfileSet.load().device("H100"), {"attention": 1.0}, "bf16", None, flash_attention=True)
    assert shipped.attention_s(1e11) > kernels[1].attention_s(1e11) * 1.5


def _row(rid: str, table: str, seq: int, call_flop: float, tflops: float, peak: float = 2500.0) -> dict[str, str]:
    return {"id": rid, "table": table, "measured_on": "GB200", "applies_to": "B200", "shape": "synthetic",
            "size": str(seq), "call_flop": str(call_flop), "value": str(tflops), "unit": "TFLOP/s",
            "peak_tflops": str(peak), "source": "test @0", "notes": ""}


def test_a_published_causal_backward_is_combined_without_the_scaling_assumption():
    """Rows of `attention_bwd_causal` (a benchmark that times the causal backward itself) pair with the causal
    forward at each length: (1+R)/(1/e_fc + R/e_bc), each figure over its own peak, and the provenance says nothing is
    assumed; a length with a forward and no backward is an error, not a silent gap."""
    rows = [_row("f2k", "attention_fwd_causal", 2048, 1.374e11, 1097), _row("b2k", "attention_bwd_causal", 2048,
                                                                          1.374e11, 885),
            _row("f8k", "attention_fwd_causal", 8192, 2.199e12, 1574), _row("b8k", "attention_bwd_causal", 8192,
                                                                          2.199e12, 1332)]
    r = ATTENTION_BWD_OVER_FWD
    curve = overlays(rows, ProfileSet.uncalibrated())["B200"]["attention_efficiency"]
    for p, (f, b) in zip(curve["points"], ((1097, 885), (1574, 1332))):
        assert p["efficiency"] == pytest.approx((1 + r) / (2500 / f + r * 2500 / b), abs=1e-4)
    source = curve["provenance"]["source"]
    assert "nothing assumed" in source and "ASSUMED: the published backward" not in source
    assert "measured on GB200, applied to B200" in source
    with pytest.raises(ValueError, match="both or neither"):
        overlays(rows[:3], ProfileSet.uncalibrated())


def test_a_sliding_window_band_is_priced_on_its_own_curve():
    """`attention_window_fwd` / `attention_window_bwd` rows make `windowed_attention_efficiency`; the attention core
    reads it for a sliding-window layer's band (`windowed=True`), keeps the causal curve for everything else and for
    the FlashAttention backend, and a device without one prices the band on the causal curve as before."""
    rows = [_row("wf", "attention_window_fwd", 4096, 3.38e10, 161), _row("wb", "attention_window_bwd", 4096,
                                                                        3.38e10, 182)]
    overlay = overlays(rows, ProfileSet.uncalibrated())["B200"]
    assert set(overlay) == {"name", "windowed_attention_efficiency"}
    r = ATTENTION_BWD_OVER_FWD
    e = (1 + r) / (2500 / 161 + r * 2500 / 182)
    assert overlay["windowed_attention_efficiency"]["points"][0]["efficiency"] == pytest.approx(e, abs=1e-4)
    base = ProfileSet.uncalibrated().device("B200")
    dev = base.model_copy(update={"windowed_attention_efficiency": base.attention_efficiency.model_validate(
        overlay["windowed_attention_efficiency"])})
    k = Kernels(dev, {"attention": 1.0}, "bf16", None)
    band = 3.38e10
    assert k.attention_s(band, windowed=True) == pytest.approx(band / (2250e12 * round(e, 4)), rel=1e-9)
    assert k.attention_s(band) == Kernels(base, {"attention": 1.0}, "bf16", None).attention_s(band)
    flash = Kernels(dev, {"attention": 1.0}, "bf16", None, flash_attention=True)
    assert flash.attention_s(band, windowed=True) == flash.attention_s(band)
    plain = Kernels(base.model_copy(update={"windowed_attention_efficiency": None}), {"attention": 1.0}, "bf16", None)
    assert plain.attention_s(band, windowed=True) == plain.attention_s(band)
