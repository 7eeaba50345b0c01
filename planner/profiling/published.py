"""Profile tables from published component benchmarks: profiles/published/components.csv -> device overlays.

Each row of components.csv is one figure a public benchmark printed (its `source` names the repository,
file and commit, or the URL, and the table or panel), measured on `measured_on` and applied to the devices of
`applies_to` (same chip and clocks).  `python -m planner.profiling.published --write` turns them into device
overlays in profiles/published/devices/, in the format `cli.py profile` writes (planner/profiling/tables.py
conventions), with provenance kind `published`; planner/profile_tables.py layers them over the datasheet
tables, through the same path as a user's `--profiles DIR`.

Tables and their arithmetic (the cost model's conventions):
- `attention_efficiency` (size = causal forward FLOP per call): at each sequence length, the forward+backward
  efficiency of a causal call, (1 + R) / (1/e_fwd_causal + R/e_bwd_causal) with R = ATTENTION_BWD_OVER_FWD (the
  model prices backward as R x forward), where e_bwd_causal = e_bwd x e_fwd_causal / e_fwd (the backward
  figure is non-causal: it is scaled by the forward's causal/non-causal ratio at the same length, an assumption
  stated in the provenance).  Where the benchmark published the causal backward itself (`attention_bwd_causal`,
  NVIDIA/cudnn-frontend's SDPA benchmark on GB200 and GB300), e_bwd_causal is that figure and nothing is assumed:
  the curve is `causal_attention_curve`.
- `grouped_gemm_efficiency` (size = tokens per expert): a multiplier on the device's dense GEMM efficiency at
  the whole grouped call's FLOP, tile padding taken out (as kernels.py `grouped_gemm_s` reads it): the median
  over rows at one size of achieved / (peak x gemm_efficiency(call FLOP) x padding).
- `windowed_attention_efficiency` (size = the band's forward FLOP per call): a sliding-window call's forward+backward
  efficiency, (1 + R) / (1/e_fwd + R/e_bwd) from its published forward and backward (`attention_window_fwd`,
  `attention_window_bwd`); kernels.py `attention_s` reads it for the band of a sliding-window layer.
- `flash_attention_efficiency` (size = causal forward FLOP per call): the FlashAttention package's causal
  forward+backward efficiency, value / peak, from a figure that times forward and backward together with the
  model's FLOP convention; kernels.py `attention_s` reads it for `--attention-backend flash`.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from planner.cost.curves import interpolate_efficiency
from planner.cost.kernels import ATTENTION_BWD_OVER_FWD, GROUPED_GEMM_TILE_ROWS
from planner.profile_tables import PROFILES_DIR, ProfileSet
from planner.schemas.device import EfficiencyCurve, EfficiencyPoint, Provenance

PUBLISHED_DIR = PROFILES_DIR / "published"
COMPONENTS_CSV = PUBLISHED_DIR / "components.csv"
FLASH_TABLE = "flash2_attention_fwd_bwd_causal"
"""components.csv table of the FlashAttention package's forward+backward figures (`flash_attention_efficiency`)."""
CAUSAL_BWD_TABLE = "attention_bwd_causal"
"""components.csv table of a published causal backward (the forward's pair is `attention_fwd_causal`)."""
WINDOW_TABLES = ("attention_window_fwd", "attention_window_bwd")
"""components.csv tables of a sliding-window call's forward and backward (`windowed_attention_efficiency`)."""
TABLES = ("attention_fwd", "attention_fwd_causal", "attention_bwd", CAUSAL_BWD_TABLE, *WINDOW_TABLES, "grouped_gemm",
          FLASH_TABLE)
COLUMNS = ("id", "table", "measured_on", "applies_to", "shape", "size", "call_flop", "value", "unit", "peak_tflops",
           "source", "notes")
HEADER = ("# Written by `python -m planner.profiling.published --write` from profiles/published/components.csv\n"
          "# (one published benchmark figure per row, each with its source); do not edit by hand.\n")


MEASURED_ON_NOTES = {
    (("GB200",), "B200"): (
        "measured on GB200, applied to B200: the same Blackwell die (B200), run at GB200's power and clocks (2500 "
        "against HGX B200's 2250 TFLOP/s dense BF16, stas00/ml-engineering @744d01e compute/accelerator/README.md); "
        "the efficiency, over each part's own peak, is taken as the die's (ASSUMED: the kernel scales with the clock)"),
    (("GB300",), "B300"): (
        "measured on GB300, applied to B300: the same Blackwell Ultra die (B300), run at GB300's power and clocks "
        "(2500 against HGX B300's 2250 TFLOP/s dense BF16, ml-engineering @744d01e); the efficiency, over each part's "
        "own peak, is taken as the die's (ASSUMED: the kernel scales with the clock).  B300 takes GB300's figures, not "
        "B200's: Blackwell Ultra doubles the SFU throughput (MUFU.EX2) that attention's softmax runs on "
        "(developer.nvidia.com/blog/making-softmax-more-efficient-with-nvidia-blackwell-ultra/), and the same "
        "benchmark at the same commit runs 1.10-1.21x faster forward+backward on GB300 than on GB200 at the same 2500 "
        "TFLOP/s peak (llama3.1 preset, causal: forward 1.12-1.25x, backward 1.08-1.22x, 2k-32k tokens; the gpt_oss "
        "preset's 128-token window 1.04-1.06x)"),
}
"""Why a figure measured on one part applies to another (keyed by the sorted measuring parts and the device)."""


def load_components(path: Path = COMPONENTS_CSV) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        if r["table"] not in TABLES:
            raise ValueError(f"{path}: row {r['id']}: unknown table {r['table']!r}; known: {', '.join(TABLES)}")
        if r["unit"] != "TFLOP/s" or not r["source"].strip():
            raise ValueError(f"{path}: row {r['id']}: TFLOP/s figures with a source only")
    return rows


def _efficiency(row: dict[str, str]) -> float:
    return float(row["value"]) / float(row["peak_tflops"])


def _ids(rows: list[dict[str, str]]) -> str:
    return ", ".join(r["id"] for r in rows)


def attention_curve(rows: list[dict[str, str]]) -> EfficiencyCurve:
    by_seq: dict[int, dict[str, dict[str, str]]] = defaultdict(dict)
    for r in rows:
        by_seq[int(r["size"])][r["table"]] = r
    r_bwd = ATTENTION_BWD_OVER_FWD
    points = []
    for seq, t in sorted(by_seq.items()):
        if set(t) != {"attention_fwd", "attention_fwd_causal", "attention_bwd"}:
            continue
        e_fc, e_f, e_b = (_efficiency(t[k]) for k in ("attention_fwd_causal", "attention_fwd", "attention_bwd"))
        e_bc = e_b * e_fc / e_f
        points.append(EfficiencyPoint(size=float(t["attention_fwd_causal"]["call_flop"]),
                                      efficiency=round((1 + r_bwd) / (1 / e_fc + r_bwd / e_bc), 4)))
    source = (f"published: cuDNN fused attention (the kernel Transformer Engine runs for Megatron) on H100 SXM5, "
              f"head dim 128, as the FlashAttention-3 paper measured it (components.csv rows {_ids(rows)}); "
              f"forward+backward efficiency of a causal call = (1+{r_bwd:g})/(1/e_fwd_causal + {r_bwd:g}/e_bwd_causal), "
              "e_bwd_causal = e_bwd x e_fwd_causal/e_fwd (ASSUMED: the published backward is non-causal); size = "
              "the causal forward FLOP of the benchmark call (batch x seq = 16k tokens, 16 heads of 128)")
    return EfficiencyCurve(points=tuple(points), provenance=Provenance(kind="published", source=source))


def _fwd_bwd_points(rows: list[dict[str, str]], fwd: str, bwd: str) -> tuple[tuple[EfficiencyPoint, ...], list[int]]:
    """(1+R)/(1/e_fwd + R/e_bwd) at each sequence length from a published forward and backward of the same call,
    each figure over its own device's peak; size = the forward's call FLOP."""
    by_seq: dict[int, dict[str, dict[str, str]]] = defaultdict(dict)
    for r in rows:
        if r["table"] not in (fwd, bwd):
            raise ValueError(f"row {r['id']}: expected {fwd} or {bwd}, not {r['table']}")
        if r["table"] in by_seq[int(r["size"])]:
            raise ValueError(f"row {r['id']}: two {r['table']} figures at sequence {r['size']}")
        by_seq[int(r["size"])][r["table"]] = r
    r_bwd = ATTENTION_BWD_OVER_FWD
    points = []
    for seq, t in sorted(by_seq.items()):
        if set(t) != {fwd, bwd}:
            raise ValueError(f"sequence {seq}: a {fwd} and a {bwd} figure, both or neither")
        e_f, e_b = _efficiency(t[fwd]), _efficiency(t[bwd])
        points.append(EfficiencyPoint(size=float(t[fwd]["call_flop"]),
                                      efficiency=round((1 + r_bwd) / (1 / e_f + r_bwd / e_b), 4)))
    return tuple(points), sorted(by_seq)


def causal_attention_curve(rows: list[dict[str, str]]) -> EfficiencyCurve:
    """Forward+backward efficiency of a causal call from a published causal forward and causal backward at each
    sequence length (the same benchmark call)."""
    points, seqs = _fwd_bwd_points(rows, "attention_fwd_causal", CAUSAL_BWD_TABLE)
    r_bwd = ATTENTION_BWD_OVER_FWD
    on = sorted({r["measured_on"] for r in rows})
    peaks = sorted({r["peak_tflops"] for r in rows})
    source = (f"published: cuDNN fused attention (the kernel Transformer Engine runs for Megatron), BF16, causal, head "
              f"dim 128, forward and backward each timed on {', '.join(on)} by NVIDIA/cudnn-frontend's SDPA benchmark "
              f"(cuDNN 9.22.0; components.csv rows {_ids(rows)}); forward+backward efficiency of a causal call = "
              f"(1+{r_bwd:g})/(1/e_fwd_causal + {r_bwd:g}/e_bwd_causal), both figures published (the causal backward "
              f"measured, nothing assumed; the benchmark counts backward FLOP as {r_bwd:g} x forward over the unmasked "
              f"elements, the model's convention), e = TFLOP/s / {'/'.join(peaks)} (the measuring part's dense BF16 "
              f"peak); size = the causal forward FLOP of the benchmark call ({seqs[0]}-{seqs[-1]} tokens, 128 "
              f"sequence-heads of 128: batch 2 x 64 query heads); smaller calls clamped to the {seqs[0]}-token point")
    return EfficiencyCurve(points=points, provenance=Provenance(kind="published", source=source))


def windowed_attention_curve(rows: list[dict[str, str]]) -> EfficiencyCurve:
    """Forward+backward efficiency of a sliding-window call (the band of the score matrix), from its published
    forward and backward at each sequence length."""
    points, seqs = _fwd_bwd_points(rows, *WINDOW_TABLES)
    r_bwd = ATTENTION_BWD_OVER_FWD
    on = sorted({r["measured_on"] for r in rows})
    peaks = sorted({r["peak_tflops"] for r in rows})
    source = (f"published: cuDNN fused attention over a 128-token sliding window (top-left causal), BF16, head dim 64, "
              f"forward and backward each timed on {', '.join(on)} by NVIDIA/cudnn-frontend's SDPA benchmark, gpt_oss "
              f"preset (cuDNN 9.22.0; components.csv rows {_ids(rows)}); forward+backward efficiency = "
              f"(1+{r_bwd:g})/(1/e_fwd + {r_bwd:g}/e_bwd), e = TFLOP/s / {'/'.join(peaks)} (the measuring part's "
              f"dense BF16 peak) with the benchmark's FLOP count over the band's unmasked elements (W(W+1)/2 + (S-W)W "
              f"per sequence-head, backward {r_bwd:g} x forward: the model's `windowed_attn_core_flop` exactly, for "
              f"--window-size {128 - 1},0); size = the band's forward FLOP per call ({seqs[0]}-{seqs[-1]} tokens, "
              f"256 sequence-heads of 64: batch 2 x 128 heads), clamped outside; the kernel runs at 6-8% of peak at "
              f"every length (time linear in the sequence), far below a full causal call of the same FLOP")
    return EfficiencyCurve(points=points, provenance=Provenance(kind="published", source=source))


def flash_curve(rows: list[dict[str, str]]) -> EfficiencyCurve:
    points = tuple(EfficiencyPoint(size=float(r["call_flop"]), efficiency=round(_efficiency(r), 4))
                   for r in sorted(rows, key=lambda r: float(r["call_flop"])))
    source = (f"published: FlashAttention-2 (the flash-attn package, which Transformer Engine runs for Megatron's "
              f"--attention-backend flash) on H100 SXM5, head dim 128, causal, forward+backward as its repository's "
              f"benchmark measured it (components.csv rows {_ids(rows)}); efficiency = TFLOP/s / 989 with the "
              "benchmark's FLOP count (forward + 2.5 x forward, causal halved), the model's convention; size = the "
              "causal forward FLOP of the benchmark call (batch x seq = 16k tokens, 16 heads of 128)")
    return EfficiencyCurve(points=points, provenance=Provenance(kind="published", source=source))


def grouped_curve(rows: list[dict[str, str]], gemm: EfficiencyCurve) -> EfficiencyCurve:
    by_size: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        m = int(r["size"])
        padding = m / (math.ceil(m / GROUPED_GEMM_TILE_ROWS) * GROUPED_GEMM_TILE_ROWS)
        by_size[m].append(_efficiency(r) / (interpolate_efficiency(gemm, float(r["call_flop"])) * padding))
    points = tuple(EfficiencyPoint(size=float(m), efficiency=round(statistics.median(v), 4))
                   for m, v in sorted(by_size.items()))
    source = (f"published: BF16 grouped expert GEMMs on H100 SXM5 (components.csv rows {_ids(rows)}): Transformer "
              "Engine GroupedLinear (TE 2.2 and 2.7) at 2048 and 4096 tokens per expert, the grouped_gemm package's "
              "five backends at 512; multiplier = median of achieved / (989 TFLOP/s x gemm_efficiency at the whole "
              "call's FLOP x tile padding), gemm_efficiency being the device's datasheet-derived curve; clamped "
              "outside 512-4096 tokens per expert. Megatron runs TE's GroupedLinear; no TE figure below 2048 tokens "
              "per expert is published (a search of TE, Megatron-LM, PyTorch, DeepGEMM and SonicMoE sources, 2026-12), "
              "so the 512-token point, another library's, may understate what TE reaches there")
    return EfficiencyCurve(points=points, provenance=Provenance(kind="published", source=source))


def overlays(rows: list[dict[str, str]], base: ProfileSet) -> dict[str, dict]:
    """Device name -> overlay (the keys a device file may replace), built from the component rows."""
    devices = sorted({d for r in rows for d in r["applies_to"].split()})
    out: dict[str, dict] = {}
    for dev in devices:
        mine = [r for r in rows if dev in r["applies_to"].split()]
        overlay: dict = {"name": dev}
        attention = [r for r in mine if r["table"].startswith("attention") and r["table"] not in WINDOW_TABLES]
        if attention:
            causal_bwd = any(r["table"] == CAUSAL_BWD_TABLE for r in attention)
            curve = causal_attention_curve(attention) if causal_bwd else attention_curve(attention)
            overlay["attention_efficiency"] = curve.model_dump(mode="json")
        window = [r for r in mine if r["table"] in WINDOW_TABLES]
        if window:
            overlay["windowed_attention_efficiency"] = windowed_attention_curve(window).model_dump(mode="json")
        flash = [r for r in mine if r["table"] == FLASH_TABLE]
        if flash:
            overlay["flash_attention_efficiency"] = flash_curve(flash).model_dump(mode="json")
        grouped = [r for r in mine if r["table"] == "grouped_gemm"]
        if grouped:
            overlay["grouped_gemm_efficiency"] = grouped_curve(grouped, base.device(dev).gemm_efficiency).model_dump(
                mode="json")
        measured_on = sorted({r["measured_on"] for r in mine} - {dev})
        if measured_on:
            note = MEASURED_ON_NOTES.get((tuple(measured_on), dev)) or (
                f"measured on {', '.join(measured_on)}, applied to {dev}: the same SM90 die and clocks (only "
                "NVLink, memory or FP64 differ, which these kernels do not use)")
            for key in ("attention_efficiency", "windowed_attention_efficiency", "flash_attention_efficiency",
                        "grouped_gemm_efficiency"):
                if key in overlay:
                    overlay[key]["provenance"]["source"] += "; " + note
        out[dev] = overlay
    return out


def render(overlay: dict) -> str:
    return HEADER + yaml.safe_dump(overlay, sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.profiling.published", description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite profiles/published/devices/*.yaml")
    args = ap.parse_args(argv)
    built = overlays(load_components(), ProfileSet.uncalibrated())  # only the datasheet GEMM curve is read
    for name, overlay in built.items():
        path = PUBLISHED_DIR / "devices" / f"{name}.yaml"
        text = render(overlay)
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}", file=sys.stderr)
        else:
            stale = not path.is_file() or path.read_text(encoding="utf-8") != text
            print(f"{path}: {'differs from the components (run with --write)' if stale else 'up to date'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
