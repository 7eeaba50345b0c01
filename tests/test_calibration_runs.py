"""The cost model against the published measured runs (planner/calibration/published/, plus
../shared/calibration/ when present).  Run with `-s` to see the report; the same figures come from
`python -m planner.calibration.report --loo`.

Targets (issue "Cost model: order real MoE plans the way they measure", and issue 19 "Plans a user can trust"):
in-sample median |error| <= 8 %; every pair of rows on one model and cluster measured more than 3 % apart ordered
as measured; every run whose memory settings are known predicted to fit; worst in-sample |error| <= 30 %; the
dense rows no worse than before (median 6 %); leave-one-source-out median <= 12 % and signed median within
+-5 % (slow).
"""

from __future__ import annotations

import csv
import math
import re
import shlex

import pytest

from planner.calibration.fit import FIT_PARAMS, fit, leave_one_out
from planner.calibration.memory import load_memory_rows
from planner.calibration.report import (
    CORRECTIONS_YAML, NVIDIA_PERFORMANCE_SOURCES, ONE_LINER_MFU, TARGET_LOSO_MEDIAN_PCT, TARGET_LOSO_SIGNED_PCT,
    TARGET_MEDIAN_PCT, TARGET_WORST_PCT, build_report, shipped_factors,
)
from planner.calibration.runs import (
    SHIPPED_RUNS_CSV, SOURCE_KEYS, cases, load_runs, load_unfitted_runs, source_key,
)
from planner.profile_tables import ProfileSet

from helpers.held_out import loso_report


@pytest.fixture(scope="module")
def report_and_fit():
    """The report on the shipped corrections, and the fit on every row it made (from the uncalibrated tables)."""
    rep, result = build_report()
    print("\n" + rep.text())
    return rep, result


@pytest.fixture(scope="module")
def report(report_and_fit):
    return report_and_fit[0]


def test_every_row_is_priced(report):
    """Every shipped (and shared) row parses, prices, and gives a finite positive prediction."""
    ids = [r["id"] for r in load_runs()]
    assert [r.id for r in report.rows] == ids
    assert len(ids) >= 56 and SHIPPED_RUNS_CSV.is_file()
    assert all(r.predicted > 0 and math.isfinite(r.predicted) for r in report.rows)


def test_median_error_within_target(report):
    assert report.summary()["in_sample"]["median_abs_pct"] <= TARGET_MEDIAN_PCT, report.text()


def test_worst_error_within_target(report):
    """In-sample worst row, issue 31's real-routing table reported apart (report.ROUTING_BATCH says why)."""
    assert report.summary()["in_sample_targeted"]["worst_abs_pct"] <= TARGET_WORST_PCT, report.text()


def test_dense_rows_do_not_regress(report):
    """The dense rows' median stays at or below the 6 % they had before the MoE mechanisms."""
    assert report.summary()["in_sample_dense"]["median_abs_pct"] <= 6.0, report.text()


_DEEPEP_EP32 = "H800-qwen3-235B-tp2ep32pp8vpp4-deepep-mbs1-select-gbs2048"
KNOWN_MISORDERED = {
    **{(fast, _DEEPEP_EP32): "DeepEP across 4 nodes priced 1.6-1.9x too fast: the row is predicted 21% fast while "
                             "its alltoall twin is 5% fast (measured 1.375x apart, predicted 1.67x)"
       for fast in ("H800-qwen3-235B-tp2ep8pp32vpp3-mbs4-full-gbs4096",
                    "H800-qwen3-235B-tp1ep8pp32vpp3-mbs4-full-gbs4096",
                    "H800-qwen3-235B-tp2ep8pp32-mbs4-full-gbs8192",
                    "H800-qwen3-235B-tp1ep8pp32vpp3-mbs8-full-gbs8192",
                    "H800-qwen3-235B-tp2ep8pp32vpp3-mbs1-select-gbs2048",
                    "H800-qwen3-235B-tp1ep8pp32vpp3-mbs1-moe-gbs2048")},
    **{("H800-qwen3-235B-tp2ep8pp8-mbs1-select-gbs2048", slow):
       "distributed-optimizer overlap measured 6-8% slower at 128 micro-batches per step (the source: 'doesn't change "
       "much'); the model prices it 0.2 s faster"
       for slow in ("H800-qwen3-235B-tp2ep8pp8-mbs1-select-zero-gbs2048",
                    "H800-qwen3-235B-tp2ep8pp8-mbs1-select-zero-tpoverlap-gbs2048")},
    ("H800-qwen3-235B-tp2ep8pp32-mbs4-full-gbs8192", "H800-qwen3-235B-tp2ep8pp8-mbs1-select-zero-tpoverlap-gbs2048"):
        "PP8 without VPP near memory capacity priced 6-14% fast, PP32 with full recompute 9-12% slow",
    ("H800-qwen3-235B-tp2ep8pp32vpp3-mbs4-full-gbs4096", "H800-qwen3-235B-tp1ep8pp32vpp3-mbs1-moe-gbs2048"):
        "full recompute at micro-batch 4 priced 12% slow, MoE recompute at micro-batch 1 6% slow (measured 1.055x)",
}
"""(measured faster, measured slower) pairs of xtuner's forced-balance rows (annotation batch 4, issue 31) that the
model orders wrongly, each with the mechanism the rows show mispriced (planner/calibration/published/README.md).
Named here so that every other pair stays held to the order, and a new misordered pair fails."""


def test_plan_pairs_are_ordered_as_measured(report):
    """Rows on one model, sequence and cluster that differ in plan, batch, dispatcher, routing or precision, compared
    per sample: every pair measured more than 3 % apart is ordered as measured (closer pairs are ties), but for the
    real-routing rows (report.ROUTING_BATCH) and the named KNOWN_MISORDERED pairs."""
    assert len(report.pairs) >= 140 and sum(not p.tie for p in report.pairs) >= 130
    pairs = {(p.faster_measured, p.slower_measured) for p in report.pairs}
    assert set(KNOWN_MISORDERED) <= pairs, set(KNOWN_MISORDERED) - pairs
    wrong = [p for p in report.pairs if not p.ordered and not p.tie and not p.routing
             and (p.faster_measured, p.slower_measured) not in KNOWN_MISORDERED]
    assert not wrong, wrong


def test_runs_with_known_memory_settings_fit(report):
    known = [r for r in report.rows if r.memory_settings == "known"]
    assert len(known) >= 44
    assert [r.id for r in known if not r.fits] == []


def test_beats_one_liner_where_mfu_is_far_from_45_percent(report):
    """Where measured MFU is far from the one-liner's 45 % the model must be closer than the one-liner."""
    far = [r for r in report.rows if r.far_from_one_liner]
    assert len(far) >= 10
    assert [r.id for r in far if abs(r.error_pct) >= abs(r.one_liner_error_pct)] == []


def test_one_liner_is_the_readme_definition(report):
    """The one-liner's TFLOP/s/GPU is 0.45 x the H100 dense BF16 peak (989) on every H100 TFLOP/s row,
    FP8 rows included (MFU is against the BF16 peak)."""
    rows = [r for r in report.rows if r.metric == "tflops_per_gpu" and r.id.startswith("H100")]
    assert rows and all(r.one_liner == pytest.approx(ONE_LINER_MFU * 989.0) for r in rows)


def test_shipped_corrections_are_the_fit(profiles, report_and_fit):
    """profiles/corrections.yaml is what planner.calibration.fit gives on the shipped rows (nobody edited a
    factor by hand): every fitted parameter within 1 %."""
    _, result = report_and_fit  # build_report's fit: fit(cases(base), base=base) on the uncalibrated tables
    shipped = shipped_factors(profiles)
    stale = {n: (shipped[n], f) for n, f in result.factors.items() if abs(shipped[n] / f - 1) > 0.01}
    assert not stale, f"{CORRECTIONS_YAML} is stale; run python -m planner.calibration.report --write: {stale}"
    assert {p.name for p in FIT_PARAMS} == set(result.factors)


@pytest.mark.slow
def test_leave_one_out_refits_without_the_row():
    """Leave-one-out predictions exist for every row and differ from in-sample ones exactly where the
    row calibrated a parameter; a row alone on its parameter falls back to the uncalibrated value."""
    base = ProfileSet.uncalibrated()
    all_cases = cases(base)
    result, ev = fit(all_cases, base=base)
    used: dict[str, dict[str, float]] = {}
    loo = leave_one_out(result, ev, used)
    assert set(loo) == {c.id for c in all_cases}
    profiles = result.profiles()
    for c in all_cases:
        fitted_on = [p for p in FIT_PARAMS if c.id in ev.fit_rows[p.name]]
        if not fitted_on:
            assert loo[c.id] == pytest.approx(c.price(profiles).iteration_time_s, rel=1e-9)
        for p in fitted_on:
            if ev.fit_rows[p.name] == {c.id}:
                assert used[c.id][p.name] == p.default  # nothing else calibrates it
    assert any(len(ev.fit_rows[p.name]) == 1 for p in FIT_PARAMS)  # the FP8 recipes have one row each


def test_a_shipped_row_wins_over_a_shared_row_with_its_id(tmp_path):
    """The shipped file is the curated copy: a shared row with a shipped id is left out, a new one is added, so the
    fit is the same with and without ../shared beside the clone."""
    shipped = load_runs(shared=None, shared_new=None, shared_routing=None)
    first = shipped[0]
    shared = tmp_path / "measured_runs.csv"
    with shared.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=[k for k in first if k != "origin"])
        w.writeheader()
        w.writerow({k: v for k, v in first.items() if k != "origin"} | {"value": "123456"})
        w.writerow({k: v for k, v in first.items() if k != "origin"} | {"id": "new-shared-row"})
    rows = load_runs(shared=shared, shared_new=None, shared_routing=None)
    by_id = {r["id"]: r for r in rows}
    assert by_id[first["id"]]["value"] == first["value"] and by_id[first["id"]]["origin"] == first["origin"]
    assert [r["id"] for r in rows] == [r["id"] for r in shipped] + ["new-shared-row"]


def test_every_shipped_row_has_a_named_source():
    """Each shipped row's source column matches one of the documented source keys (runs.SOURCE_KEYS), and the rows
    come from at least the eleven publications and software stacks the README names."""
    keys = {key for _, key in SOURCE_KEYS}
    rows = load_runs(shared=None, shared_new=None, shared_routing=None)
    assert {source_key(r) for r in rows} <= keys
    assert len({source_key(r) for r in rows}) >= 11
    assert source_key({"source": "x", "source_key": "mine"}) == "mine"


def test_megatron_ci_time_rows_are_their_memory_rows_runs():
    """Megatron-LM's CI rows (source key megatron-lm-ci) time the runs whose peaks measured_memory.csv holds: each
    has a memory row with the same id, source, cluster and flags, so the one source is held out together."""
    runs = [r for r in load_runs(shared=None, shared_new=None, shared_routing=None)
            if source_key(r) == "megatron-lm-ci"]
    memory = {r["id"]: r for r in load_memory_rows(shared=None)}
    assert len(runs) >= 3
    for r in runs:
        m = memory[r["id"]]
        assert r["metric"] == "iteration_time_s"
        assert (r["source"], r["cluster"], r["megatron_args"]) == (m["source"], m["cluster"], m["megatron_args"])


@pytest.mark.slow
def test_leave_one_source_out_within_target():
    """Issue 19: refit without each source in turn and predict its rows: median |error| <= 12 % and the signed median
    within +-5 % (a model that is right on the sources it saw and optimistic on a new one fails this).  The report
    is `build_report(loso=True)`'s, built once per test run (test_ranges' held-out range tests read it too)."""
    rep = loso_report()
    s = rep.summary()["leave_one_source_out"]
    print(rep.text())
    assert s["rows"] == len(rep.rows)
    assert s["median_abs_pct"] <= TARGET_LOSO_MEDIAN_PCT, s
    assert abs(s["signed_median_pct"]) <= TARGET_LOSO_SIGNED_PCT, s


def test_unfitted_runs_are_priced_apart_from_the_fit(report):
    """planner/calibration/published/unfitted_runs.csv: every row says why it is not fitted, none is a calibration
    row (the fit never sees it), and the report prices each with the shipped corrections and range."""
    unfitted = load_unfitted_runs()
    assert len(unfitted) >= 10
    assert not {r["id"] for r in unfitted} & {r["id"] for r in load_runs()}
    assert [c.id for c in report.unfitted] == [r["id"] for r in unfitted]
    for c in report.unfitted:
        assert c.why_not_fitted and math.isfinite(c.nominal_s) and c.low_s <= c.nominal_s <= c.high_s
    doc = report.to_json()["unfitted"]
    assert doc["summary"]["rows"] == len(unfitted)
    assert doc["summary"]["covered"] == sum(c.covered for c in report.unfitted)
    # the groups the README quotes: NVIDIA's performance publications against the rest, and one group per device type;
    # each row in exactly one of the two source groups and one device group
    groups, devices = doc["groups"], {_device(r) for r in unfitted}
    nvidia = [r for r in unfitted if source_key(r) in NVIDIA_PERFORMANCE_SOURCES]
    assert 0 < groups["NVIDIA's performance publications"]["rows"] == len(nvidia) < len(unfitted)
    assert groups["NVIDIA's performance publications"]["rows"] + groups["the other sources"]["rows"] == len(unfitted)
    assert {k for k in groups if k.startswith("on ")} == {f"on {d}" for d in devices}
    assert sum(groups[f"on {d}"]["rows"] for d in devices) == len(unfitted)
    assert sum(groups[f"on {d}"]["covered"] for d in devices) == doc["summary"]["covered"]


def _source_rows(key: str) -> list[dict[str, str]]:
    return [r for r in load_unfitted_runs() if source_key(r) == key]


def _int_flags(row: dict[str, str]) -> dict[str, int]:
    """The row's integer-valued flags, keyed by flag name (e.g. "--hidden-size")."""
    a = shlex.split(row["megatron_args"])
    return {k: int(v) for k, v in zip(a, a[1:]) if k.startswith("--") and v.isdigit()}


def _cluster(row: dict[str, str]):
    """The row's cluster (TYPE:COUNT, or a preset such as p5-h100-64 for AWS's EFA nodes)."""
    from planner.inputs.cluster import parse_cluster
    from planner.profile_tables import ProfileSet
    return parse_cluster(row["cluster"], ProfileSet.load())


def _gpus(row: dict[str, str]) -> int:
    return _cluster(row).world_size


def _device(row: dict[str, str]) -> str:
    return _cluster(row).groups[0].device_type


def _token_throughput_seconds(row: dict[str, str]) -> float:
    """The seconds of a row converted from tokens per GPU per second, as its notes quote it ("GBS x SEQ / (TOKENS x
    GPUS) = T s"), checked against the row's own batch, sequence and GPU count."""
    gbs, seq, per_gpu, gpus, _ = re.search(r"(\d+) x (\d+) / \(([\d.]+) x (\d+)\) = ([\d.]+) s", row["notes"]).groups()
    f = _int_flags(row)
    assert (f["--global-batch-size"], f["--seq-length"]) == (int(gbs), int(seq)), row["id"]
    assert int(gpus) == _gpus(row), row["id"]
    return int(gbs) * int(seq) / (float(per_gpu) * int(gpus))


def _megatron_flop(f: dict[str, int], *, causal: bool = False) -> float:
    """Megatron Core's FLOP count of an iteration (core_r0.9-0.11, GQA, SwiGLU, top-k experts; `causal`: the attention
    term halved, as Megatron counts it since 2025-03): 12 B s l h^2 ((1 + g/a + s/h) + 1.5 k F/h + V/(2 l h))."""
    b, s, l, h = f["--global-batch-size"], f["--seq-length"], f["--num-layers"], f["--hidden-size"]
    attention = s / h / (2 if causal else 1)
    return 12 * b * s * l * h ** 2 * ((1 + f["--num-query-groups"] / f["--num-attention-heads"] + attention)
                                      + 1.5 * f.get("--moe-router-topk", 1) * f["--ffn-hidden-size"] / h
                                      + f["--vocab-size"] / (2 * l * h))


def test_sc21_rows_are_the_papers_throughput_in_seconds():
    """The SC21 rows' seconds are the paper's TFLOP/s per GPU (Table 1, quoted in each row's notes) turned into time
    with its own FLOP count, eq. (3): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with V = 51200, recomputed here from the
    row's flags and cluster."""
    rows = _source_rows("megatron-lm-sc21")
    assert len(rows) == 10
    for r in rows:
        f = _int_flags(r)
        b, s, l, h = (f[k] for k in ("--global-batch-size", "--seq-length", "--num-layers", "--hidden-size"))
        tflops = float(re.search(r"derived from ([0-9.]+) TFLOP/s/GPU", r["notes"]).group(1))
        flop = 96 * b * s * l * h ** 2 * (1 + s / (6 * h) + 51200 / (16 * l * h))
        assert float(r["value"]) == pytest.approx(flop / (tflops * 1e12 * _gpus(r)), abs=1e-3), r["id"]


def test_flagperf_rows_are_the_suites_token_throughput_in_seconds():
    """FlagPerf's rows: the seconds are the suite's tokens per GPU per second (quoted in each row's notes) turned back
    into time, global batch x sequence / (tokens/GPU/s x GPUs), with the batch, sequence and GPU count of the row's
    own flags and cluster."""
    rows = _source_rows("flagperf")
    assert len(rows) >= 15
    for r in rows:
        assert float(r["value"]) == pytest.approx(_token_throughput_seconds(r), abs=1e-3), r["id"]


def test_bridge_summary_held_out_rows_are_the_tables_token_throughput_in_seconds():
    """The held-out rows of Megatron-Bridge's performance summary (v0.4.2's '26.04.01 NeMo Container' pre-training
    tables, v0.5.1's '26.06 NeMo Container' pre-training and SFT tables, the '26.08 NeMo Container' tables first tagged
    in v0.6.0):
    the seconds are the table's tokens per GPU per second (quoted in each row's notes, and as its 'Published' figure)
    turned back into time, global batch x sequence / (tokens/GPU/s x GPUs), with the batch, sequence and GPU count of the
    row's own flags and cluster; none of them is a fitted row of that source."""
    rows = _source_rows("megatron-bridge-performance-summary")
    assert len(rows) >= 5
    fitted = {r["id"] for r in load_runs() if source_key(r) == "megatron-bridge-performance-summary"}
    for r in rows:
        assert r["id"] not in fitted, r["id"]
        assert any(tag in r["source"] and container in r["source"]
                   for tag, container in (("v0.4.2", "26.04.01"), ("v0.5.1", "26.06 NeMo Container"),
                                          ("v0.6.0", "26.08 NeMo Container"))), r["id"]
        assert float(r["value"]) == pytest.approx(_token_throughput_seconds(r), abs=1e-3), r["id"]
        published = re.search(r"Published (\d+) tok/s/GPU", r["notes"]).group(1)
        assert re.search(rf"/ \({published} x \d+\) =", r["notes"]), r["id"]


def test_parallel_folding_rows_are_the_papers_throughput_in_seconds():
    """The MoE Parallel Folding paper's rows (arXiv 2504.14960): the seconds are the paper's TFLOP/s per GPU (Table 2) or
    its MFU times its 989.5 TFLOP/s peak (Tables 1, 3, 4), both quoted in each row's notes, turned into time with the FLOP
    count of the paper's Megatron (core_r0.10/0.11, full s/h attention term), recomputed here from the row's flags and
    cluster; and the notes' causal-count alternative is 3.4% shorter."""
    rows = _source_rows("moe-parallel-folding-paper")
    assert len(rows) >= 12
    for r in rows:
        f = _int_flags(r)
        tflops = re.search(r"The paper's ([\d.]+) TFLOP/s per GPU", r["notes"])
        mfu = re.search(r"The paper's ([\d.]+)% MFU", r["notes"])
        per_gpu = float(tflops.group(1)) if tflops else float(mfu.group(1)) / 100 * 989.5
        assert float(r["value"]) == pytest.approx(_megatron_flop(f) / (per_gpu * 1e12 * _gpus(r)), abs=1e-3), r["id"]
        causal = float(re.search(r"3\.4% shorter \(([\d.]+) s\)", r["notes"]).group(1))
        assert causal == pytest.approx(_megatron_flop(f, causal=True) / (per_gpu * 1e12 * _gpus(r)), abs=1e-3), r["id"]


def test_rocm_doc_rows_are_the_screenshots_token_throughput_in_seconds():
    """The MI300X rows of the ROCm Megatron-LM docs: the seconds are the screenshot's tokens per GPU per second turned
    back into time, global batch x sequence / (tokens/GPU/s x GPUs), and Megatron Core 0.9's FLOP count at the row's
    flags over that time matches the screenshot's TFLOP/s per GPU (both quoted in each row's notes): the model shape,
    vocabulary and time agree."""
    rows = _source_rows("rocm-megatron-lm-docs")
    assert len(rows) >= 2
    for r in rows:
        seconds = _token_throughput_seconds(r)
        assert float(r["value"]) == pytest.approx(seconds, abs=1e-3), r["id"]
        shown = float(re.search(r"against the screenshot's ([\d.]+)", r["notes"]).group(1))
        assert _megatron_flop(_int_flags(r)) / (seconds * _gpus(r) * 1e12) == pytest.approx(shown, rel=1e-3), r["id"]


def test_aws_rows_are_the_published_iteration_times():
    """AWS's awsome-distributed-ai rows: the Qwen3-30B-A3B (H100) and Qwen3-235B-A22B (B300) seconds are RESULTS.md's
    mean iteration time (its table cell quoted in each row's notes: bold or not, with or without an 's'), and its tok/s
    (GBS x seq / time) and MODEL TFLOP/s/GPU (a causal FLOP count at the row's flags, attention projections sized by
    --kv-channels, top-k experts of --moe-ffn-hidden-size) follow from that time; the DeepSeek-V3 and Kimi-K2 (MLA)
    rows' seconds are in the quoted cell and the table's MODEL TFLOP/s/GPU, quoted too, follows from them with
    Megatron-Bridge v0.4.2's own count (training/utils/flop_utils.py: MLA projections, causal core attention, the MTP
    layer and head, vocabulary padded to 1280 x TP); the B200 GPT row's seconds are the page's ~134 TFLOP/s/GPU turned into time with Megatron core_v0.17.0's causal count
    (GeLU MLP of 4h, vocabulary padded to 128 x TP), which gives back the page's ~6.4 s/iter."""
    rows = _source_rows("aws-awsome-distributed")
    assert len(rows) >= 26 and sum(_device(r) == "B300" for r in rows) == 19
    assert all(_cluster(r).groups[0].inter_node_kind == "efa" for r in rows)  # p5 / p6 nodes over EFA
    for r in rows:
        f, gpus, value = _int_flags(r), _gpus(r), float(r["value"])
        b, s, l, h = (f[k] for k in ("--global-batch-size", "--seq-length", "--num-layers", "--hidden-size"))
        if "--multi-latent-attention" in r["megatron_args"]:
            quote = re.search(r"Quoted: '([^']*)'", r["notes"]).group(1)
            assert re.search(rf"(?<![\d.]){re.escape(r['value'])}(?!\d)", quote), r["id"]
            tflops = re.search(r"TFLOP/s/GPU \(table ([\d.]+)", r["notes"]).group(1)
            assert tflops in quote, r["id"]
            dense, moe = (int(x) for x in re.search(r"\[0\]\*(\d+)\+\[1\]\*(\d+)", r["megatron_args"]).groups())
            mtp = f.get("--mtp-num-layers", 0)
            n, moe = l + mtp, moe + mtp  # the MTP layer is an MoE layer, as the last decoder layer is
            a, qk, rope, v = (f[k] for k in ("--num-attention-heads", "--qk-head-dim", "--qk-pos-emb-head-dim",
                                             "--v-head-dim"))
            attn = 6 * n * (f["--q-lora-rank"] * (h + a * (qk + rope) + 1)
                            + f["--kv-lora-rank"] * (h + a * (qk + v) + 1)
                            + h * rope + a * v * h + s * a * (qk + rope) / 2 + s * a * v / 2)
            mlp = 18 * h * (f["--ffn-hidden-size"] * dense + moe * (f["--moe-router-topk"] * f["--moe-ffn-hidden-size"]
                                                                  + f["--moe-shared-expert-intermediate-size"]))
            pad = 1280 * f["--tensor-model-parallel-size"]
            vocab = -(-f["--vocab-size"] // pad) * pad
            flop = b * s * (mlp + attn + 6 * mtp * (3 * h + 2 * h * h) + 6 * h * vocab * (mtp + 1))
            assert flop / (value * gpus * 1e12) == pytest.approx(float(tflops), rel=2e-3), r["id"]
        elif "--num-experts" in f:
            quoted = re.search(r"Quoted: '\|[^']*?\| \**([\d.]+)(?: s)? · ([\d.]+) · ([\d.]+)k\** \|'", r["notes"])
            t, tflops, ktok = (float(x) for x in quoted.groups())
            assert value == t, r["id"]
            # the table's tok/s (to 0.1k) is of the unrounded time (to 0.01 s)
            assert b * s / (value + 0.005) - 50 <= ktok * 1e3 <= b * s / (value - 0.005) + 50, r["id"]
            a, d, g = f["--num-attention-heads"], f["--kv-channels"], f["--num-query-groups"]
            per_token = l * (6 * (h * (a * d + 2 * g * d) + a * d * h) + 6 * f["--moe-router-topk"] * 3 * h
                             * f["--moe-ffn-hidden-size"] + 6 * s * a * d) + 6 * h * f["--vocab-size"]
            assert per_token * b * s / (value * gpus * 1e12) == pytest.approx(tflops, rel=2e-3), r["id"]
        else:
            tflops = float(re.search(r"Steady \*\*~([\d.]+) TFLOP/s/GPU", r["notes"]).group(1))
            pad = 128 * f["--tensor-model-parallel-size"]
            v = -(-f["--vocab-size"] // pad) * pad
            flop = 12 * b * s * l * h ** 2 * (2 + s / (2 * h) + 4 + v / (2 * l * h))
            assert value == pytest.approx(flop / (tflops * 1e12 * gpus), abs=1e-3), r["id"]
            assert value == pytest.approx(float(re.search(r"~([\d.]+) s/iter", r["notes"]).group(1)), rel=0.01), r["id"]


def test_pre_flash_attention_rows_run_unfused_attention():
    """annotations.csv `extra_flags` says what a row's software did without a flag of today's Megatron, each with why:
    the Megatron-LM 2020 and NeMo-Megatron 2022 rows predate FlashAttention (their notes or launcher configs say so), so
    they are priced with explicit score GEMMs and softmax passes, as the SC21 rows are; no other row is touched."""
    from planner.calibration.runs import load_annotations
    ann = load_annotations()
    annotated = {i for i, a in ann.items() if "--attention-backend" in (a.get("extra_flags") or "")}
    assert annotated == {"V100-gpt2-1B", "V100-gpt2-4B", "A100-gpt2-1B-2020", "A100-gpt2-4B-2020",
                         "A100-gpt3-5B-8", "A100-gpt3-175B-64"}
    assert all(ann[i]["extra_flags_why"].strip() for i in annotated)
    by_id = {c.id: c for c in cases(ProfileSet.load())}
    for i in annotated:
        assert by_id[i].run.training.attention_backend == "unfused", i
        assert "--attention-backend" not in next(r for r in load_runs() if r["id"] == i)["megatron_args"], i
    assert all(c.run.training.attention_backend == "auto" for c in by_id.values() if c.id not in annotated)
    # and the two 2020 tensor-parallel rows without the sequence parallelism their flags carry (it arrived in 2022)
    dropped = {i for i, a in ann.items() if a.get("drop_flags")}
    assert dropped == {"V100-gpt2-4B", "A100-gpt2-4B-2020"} and dropped <= annotated
    for i in dropped:
        assert "--sequence-parallel" in next(r for r in load_runs() if r["id"] == i)["megatron_args"]
        assert not by_id[i].plan.sequence_parallel and by_id[i].plan.tp == 4, i


def test_dropout_annotations_state_what_ran():
    """annotations.csv `extra_flags` carries the dropout each source's scripts, configs or model providers set where the
    row's own flags leave Megatron's default (0.1) in place, each with the file, commit and line in `extra_flags_why`:
    the parsed run takes them, no row states a dropout twice, and the rows whose sources set nothing keep 0.1."""
    from planner.calibration.runs import load_annotations
    ann = load_annotations()
    by_id = {c.id: c for c in cases(ProfileSet.load())}
    rows = {r["id"]: r for r in load_runs()}
    for i, c in by_id.items():
        extra = shlex.split(ann.get(i, {}).get("extra_flags") or "")
        own = shlex.split(rows[i]["megatron_args"])
        for flag, field in (("--attention-dropout", "attention_dropout"), ("--hidden-dropout", "hidden_dropout")):
            stated = [float(t[k + 1]) for t in (own, extra) for k, x in enumerate(t) if x == flag]
            assert len(stated) <= 1, (i, flag)
            if flag in extra:
                assert "dropout: " in ann[i]["extra_flags_why"], i
            assert getattr(c.run.training, field) == (stated[0] if stated else 0.1), (i, flag)
    zero = {i for i, c in by_id.items() if c.run.training.attention_dropout == 0.0 and c.run.training.hidden_dropout == 0.0}
    assert {i for i in by_id if i.startswith(("H100-gpt-", "V100-gpt2-", "A100-gpt2-", "A100-gpt3-"))}.isdisjoint(zero)
    assert len(zero) == len(by_id) - 11, sorted(set(by_id) - zero)


def test_legacy_software_constant_prices_legacy_rows_only():
    """The six rows run with 2020-2022 software (annotations.csv `software: legacy`) are priced with their devices'
    `gemm_legacy_software` factor on their dense GEMMs (GA100's; V100, without a measured curve, has none); every other
    row, and every plan the planner prices, at the device's own GEMM correction (for A100/A800: none, its measured
    curve).  Hand check: with that factor at
    1 a legacy row costs what the cost model gives it directly, and raising it slows the row's GEMMs only."""
    from planner.calibration.runs import LEGACY_SOFTWARE, case_from_row, load_annotations, load_unfitted_runs
    from planner.cost.model import CostModel
    from planner.schemas.device import Provenance

    shipped = ProfileSet.load()
    ann = load_annotations()
    legacy = {i for i, a in ann.items() if a.get("software") == LEGACY_SOFTWARE}
    assert legacy == {"V100-gpt2-1B", "V100-gpt2-4B", "A100-gpt2-1B-2020", "A100-gpt2-4B-2020",
                      "A100-gpt3-5B-8", "A100-gpt3-175B-64"}
    for dev in ("A100", "A800"):
        assert shipped.correction(dev, "gemm") == 1.0, dev  # today's kernels: the measured curve
        assert shipped.correction(dev, "gemm_legacy_software") > 1.2, dev  # the old stacks ran slower
    # V100 has no measured curve (the A100 curve scaled): its 2020 rows calibrate its `gemm` itself
    assert shipped.correction("V100", "gemm") > 1.1 and shipped.correction("V100", "gemm_legacy_software") == 1.0
    by_id = {c.id: c for c in cases(shipped)}
    prov = Provenance(kind="calibrated", source="test")
    for i in legacy - {"V100-gpt2-1B", "V100-gpt2-4B"}:
        c = by_id[i]
        direct = CostModel(c.run.model, c.run.training, c.cluster, shipped).evaluate(c.plan)
        assert c.price(shipped).iteration_time_s > 1.05 * direct.iteration_time_s, i
        neutral = shipped.with_corrections({(d, "gemm_legacy_software"): 1.0 for d in c.device_types}, prov)
        assert c.price(neutral).iteration_time_s == pytest.approx(direct.iteration_time_s, rel=1e-12), i
        # the factor is on dense GEMMs only: the row's time grows by less than the factor itself
        factor = shipped.correction(c.device_types[0], "gemm_legacy_software")
        assert c.price(shipped).iteration_time_s < factor * direct.iteration_time_s, i
    # a current-stack A100 run (SC21, held out) is priced as the cost model prices it, without the legacy factor
    sc21 = case_from_row(next(r for r in load_unfitted_runs() if r["id"] == "A100-sc21-gpt-1T"), shipped, ann)
    assert sc21.software == ""
    direct = CostModel(sc21.run.model, sc21.run.training, sc21.cluster, shipped).evaluate(sc21.plan)
    assert sc21.price(shipped).iteration_time_s == direct.iteration_time_s
    bumped = shipped.with_corrections({(d, "gemm_legacy_software"): 3.0 for d in ("A100", "A800")}, prov)
    assert CostModel(sc21.run.model, sc21.run.training, sc21.cluster, bumped).evaluate(
        sc21.plan).iteration_time_s == direct.iteration_time_s  # the cost model never reads the legacy factor


def test_unknown_software_annotation_is_refused():
    from planner.calibration.runs import case_from_row
    row = next(r for r in load_runs() if r["id"] == "A100-gpt2-1B-2020")
    with pytest.raises(ValueError, match="software 'ancient'"):
        case_from_row(row, ProfileSet.load(), {row["id"]: {"memory_settings": "unknown", "software": "ancient"}})


def test_rocm61_rows_carry_the_published_mi300x_gemm_ratio(report):
    """The two held-out MI300X rows ran AMD's ROCm 6.1 image (unfitted_runs.csv `software: legacy`).  Their dense GEMMs
    carry MI300X's `gemm_legacy_software` from profiles/published/corrections.yaml: published, not fitted, the ratio of
    one benchmark (ml-engineering's MAMF) on ROCm 6.3 with TunableOp (668.4 TFLOP/s, the top of the MI300X curve) to the
    same on ROCm 6.1 (450), by hand 668.4 / 450 = 1.4853.  Every other held-out row is current software; the fit starts
    from the published factor and never refits it; the cost model never reads it."""
    from planner.calibration.runs import LEGACY_SOFTWARE, case_from_row
    from planner.cost.model import CostModel

    shipped = ProfileSet.load()
    assert shipped.correction("MI300X", "gemm_legacy_software") == pytest.approx(668.4 / 450, abs=1e-4)
    entry = next(e for e in shipped.correction_entries() if (e.device, e.kind) == ("MI300X", "gemm_legacy_software"))
    assert entry.provenance.kind == "published" and "ROCm 6.1" in entry.provenance.source
    assert ProfileSet.uncalibrated().correction("MI300X", "gemm_legacy_software") == entry.factor
    assert ProfileSet.uncalibrated().correction("A100", "gemm_legacy_software") == 1.0  # fitted ones are not there
    assert not any(p.kind == "gemm_legacy_software" and "MI300X" in p.devices for p in FIT_PARAMS)
    rows = load_unfitted_runs()
    legacy = {r["id"] for r in rows if r["software"] == LEGACY_SOFTWARE}
    assert legacy == {"MI300X-rocm-llama2-70b-tp8-sgd", "MI300X-rocm-llama2-70b-16-tp8-sgd"}
    assert all(r["software"] == "" for r in rows if r["id"] not in legacy)
    checks = {c.id: c for c in report.unfitted}
    for r in rows:
        if r["id"] not in legacy:
            continue
        c = case_from_row(r, shipped, {})
        assert c.software == LEGACY_SOFTWARE
        direct = CostModel(c.run.model, c.run.training, c.cluster, shipped).evaluate(c.plan)
        legacy_s = c.price(shipped).iteration_time_s
        assert checks[r["id"]].nominal_s == pytest.approx(legacy_s, rel=1e-9)  # the report prices it so
        # the ratio is on dense GEMMs only: slower than today's software, by less than the ratio itself
        assert direct.iteration_time_s * 1.1 < legacy_s < direct.iteration_time_s * entry.factor
    bad = dict(next(r for r in rows if r["id"] in legacy), software="rocm61")
    with pytest.raises(ValueError, match="unfitted_runs.csv row .*software 'rocm61'"):
        case_from_row(bad, shipped, {})


def test_check_published_runs_has_help_and_refuses_unknown_options(monkeypatch, capsys, tmp_path):
    """`python -m tools.check_published_runs --help` prints its usage and exits 0 (it read `--help` as a CSV path,
    skipped it and printed "0 rows priced, 0 refused"); an unknown option exits 2; the CSV paths given are still the
    tables it prices (one that is not a file skipped), the default tables without any."""
    from tools import check_published_runs as tool

    priced: list = []
    monkeypatch.setattr(tool, "check", lambda paths: (priced.append(list(paths)), (0, 0))[1])
    with pytest.raises(SystemExit) as exc:
        tool.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("usage: python -m tools.check_published_runs") and "CSV" in out
    assert "rows priced" not in out and priced == []
    with pytest.raises(SystemExit) as exc:
        tool.main(["--bogus"])
    assert exc.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert tool.main([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]) == 0
    assert tool.main([]) == 0
    assert priced == [[str(tmp_path / "a.csv"), str(tmp_path / "b.csv")], list(tool.DEFAULT_TABLES)]
    assert "0 rows priced, 0 refused" in capsys.readouterr().out
