"""Shipped device profiles, link kinds, corrections and the collective cost formula."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from helpers.cli import refused, run
from planner.errors import PlannerInputError
from planner.cost.communication import collective_time_s
from planner.cost.curves import interpolate_efficiency
from planner.profile_tables import PROFILES_DIR, ProfileSet
from planner.schemas.cluster import ClusterSpec, CrossTypeLink, NodeGroup
from planner.schemas.device import DeviceProfile, EfficiencyCurve, LinkProfile, Provenance

REQUIRED = ["V100", "T4", "A40", "A100-40GB", "A100", "A800", "H100", "H800", "H20", "H200", "B200", "L40S",
            "MI250X", "MI300X", "MI325X", "910B", "Gaudi2"]
GIB = 2**30
MIB = 2**20


def _flat_link(bw_gb_per_s: float, eff: float, latency_us: float, kind: str = "test") -> LinkProfile:
    prov = Provenance(kind="datasheet-derived", source="unit test")
    curve = EfficiencyCurve(points=({"size": 1.0, "efficiency": eff},), provenance=prov)
    return LinkProfile(kind=kind, bandwidth_gb_per_s=bw_gb_per_s, latency_us=latency_us,
                       efficiency={c: curve for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")},
                       provenance=prov)


def _all_provenances(obj):
    if isinstance(obj, Provenance):
        yield obj
    elif hasattr(type(obj), "model_fields"):
        for name in type(obj).model_fields:
            yield from _all_provenances(getattr(obj, name))
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _all_provenances(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _all_provenances(v)


def test_every_required_device_is_shipped(profiles):
    """The brief's device list is all present under its canonical name."""
    assert set(REQUIRED) <= set(profiles.names())


@pytest.mark.parametrize("path", sorted((PROFILES_DIR / "devices").glob("*.yaml")), ids=lambda p: p.stem)
def test_device_file_validates_with_provenance_everywhere(path):
    """Each device file is a valid DeviceProfile, named after its file, and every table carries provenance."""
    prof = DeviceProfile.model_validate(yaml.safe_load(path.read_text()))
    assert prof.name == path.stem
    curves = [prof.gemm_efficiency, prof.attention_efficiency, prof.grouped_gemm_efficiency]
    for link in (prof.intra_node, prof.inter_node):
        assert set(link.efficiency) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"}
        assert link.provenance.source.strip()
        curves += list(link.efficiency.values())
    for curve in curves:
        assert curve.provenance.source.strip()
    assert prof.datasheet.source.strip()
    assert all(p.source.strip() for p in _all_provenances(prof))
    # overhead is a few GiB and leaves most of the memory usable
    assert 1.0 <= prof.memory_overhead_gib <= 0.1 * prof.memory_gib


# T4 (issue 31 item 10's mixed cluster: one node of 4 V100 and nodes of 4 T4)
T4_GPT = ("--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --max-position-embeddings 1024 "
          "--vocab-size 52256 --global-batch-size 32 --micro-batch-size 2 --pipeline-model-parallel-size 4")


def test_t4_profile_matches_its_component_measurements(profiles):
    """T4 runs fp16 and fp32, no bf16; it has the memory the framework sees with ECC on (nvidia-smi 15109 MiB); its
    4096^3 GEMM point is the sustained power-capped cuBLAS figure (24 of 65 TFLOP/s, NVIDIA forum 264462), its best
    point stays below the short-burst torch.mm figure (42.71) and below V100's best, which beats T4 in those bursts
    too (94.84 of 125); its memory-bound rate is the measured torch copy, 240 GB/s."""
    t4 = profiles.device("Tesla-T4")
    assert t4.name == "T4" and set(t4.peak_tflops) == {"fp16", "fp32"}
    assert t4.memory_gib == pytest.approx(15109 * MIB / GIB, abs=0.01)
    assert interpolate_efficiency(t4.gemm_efficiency, 2 * 4096**3) * t4.peak_tflops["fp16"] == pytest.approx(24.0, rel=1e-3)
    top = max(p.efficiency for p in t4.gemm_efficiency.points)
    assert top < 42.71 / 65.0
    assert top < max(p.efficiency for p in profiles.device("V100").gemm_efficiency.points)
    assert t4.hbm_bandwidth_tb_per_s * t4.hbm_efficiency * 1e3 == pytest.approx(240.0, rel=1e-3)
    assert (t4.intra_node.kind, t4.gpus_per_node) == ("pcie", 4)


def _estimate_json(flags: str, cluster: str) -> dict:
    res = run(["estimate", "--megatron-args", flags, "--cluster", cluster, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_t4_clusters_estimate_and_refuse_bf16():
    """`estimate` prices an fp16 GPT (PP4) on 4 T4 and on 4 V100 + 12 T4: a time and per-stage memory that fits each
    device; the same plan on 4 T4 is slower than on 4 V100.  A bf16 run on T4 is refused, naming --cluster."""
    t4 = _estimate_json(T4_GPT + " --fp16", "T4:4")
    v100 = _estimate_json(T4_GPT + " --fp16", "V100:4")
    mixed = _estimate_json(T4_GPT + " --fp16", "V100:4,T4:12")
    assert 0 < v100["iteration_time_s"] < t4["iteration_time_s"]
    assert mixed["world_size"] == 16 and {s["device_type"] for s in mixed["stages"]} == {"V100", "T4"}
    for est in (t4, mixed):
        assert est["iteration_time_s"] > 0 and est["fits"]
        assert all(0 < s["memory_gib"] <= s["usable_gib"] for s in est["stages"])
    line = refused(run(["estimate", "--megatron-args", T4_GPT + " --bf16", "--cluster", "T4:4"]), "--cluster")
    assert "T4 does not run bf16" in line


def test_910b_marked_low_confidence(profiles):
    """The 910B's datasheet numbers are flagged as low confidence in its provenance text."""
    dev = profiles.device("910B")
    assert "low confidence" in dev.datasheet.source.lower()
    assert "low confidence" in dev.intra_node.provenance.source.lower()


def test_names_are_case_insensitive_and_aliases_resolve(profiles):
    """Lookups ignore case and accept the documented aliases."""
    assert profiles.canonical_name("h800") == "H800"
    assert profiles.canonical_name("mi300x") == "MI300X"
    assert profiles.canonical_name("A100-80GB") == "A100"
    assert profiles.canonical_name("a100-40gb") == "A100-40GB"
    assert profiles.canonical_name("Ascend910B") == "910B"
    assert profiles.canonical_name("ascend-910b") == "910B"
    assert profiles.device("gaudi2").name == "Gaudi2"


def test_unknown_device_lists_known_names(profiles):
    """An unknown device raises PlannerInputError on field `device` listing the known names."""
    with pytest.raises(PlannerInputError) as info:
        profiles.device("TPUv9")
    assert info.value.field == "device"
    text = str(info.value)
    assert "TPUv9" in text and "H800" in text and "MI300X" in text and "910B" in text


def test_relative_datasheet_facts(profiles):
    """H800 NVLink is cut below H100's; 910B is slower than H800; V100 has no BF16; A800 NVLink < A100."""
    assert profiles.device("H800").intra_node.bandwidth_gb_per_s < profiles.device("H100").intra_node.bandwidth_gb_per_s
    assert profiles.device("A800").intra_node.bandwidth_gb_per_s < profiles.device("A100").intra_node.bandwidth_gb_per_s
    assert profiles.device("910B").peak_flop_per_s("bf16") < profiles.device("H800").peak_flop_per_s("bf16")
    assert profiles.device("H800").peak_flop_per_s("bf16") == pytest.approx(989e12)
    assert "bf16" not in profiles.device("V100").peak_tflops
    assert profiles.device("MI300X").memory_gib > profiles.device("H800").memory_gib


def test_gemm_curves_match_reference_measurements(profiles):
    """A100 GEMM efficiency at 1024^3 and 8192^3 equals the Azure cuBLASLt TFLOP/s over 312 (hardware.md s4.1)."""
    a100 = profiles.device("A100").gemm_efficiency
    assert interpolate_efficiency(a100, 2 * 1024**3) == pytest.approx(119.4 / 312, rel=1e-3)
    assert interpolate_efficiency(a100, 2 * 8192**3) == pytest.approx(253.7 / 312, rel=1e-3)
    for name, mamf_over_peak in [("H100", 794.5 / 989), ("B200", 1745.0 / 2250), ("MI300X", 668.4 / 1307),
                                 ("Gaudi2", 418.7 / 432), ("MI325X", 784.9 / 1307)]:
        top = max(p.efficiency for p in profiles.device(name).gemm_efficiency.points)
        assert top <= mamf_over_peak * 1.001, name  # no curve beats the best measured shape
        assert top >= 0.9 * mamf_over_peak, name
    for name in profiles.names():
        effs = [p.efficiency for p in profiles.device(name).gemm_efficiency.points]
        assert effs[0] < effs[-1] and max(effs) <= 1.0, name  # small GEMMs are less efficient


def test_interpolate_clamps_and_is_linear_in_log_size():
    """Below/above the points the end values hold; at the geometric mean of two points it is their average."""
    prov = Provenance(kind="measured", source="test")
    curve = EfficiencyCurve(points=({"size": 1e3, "efficiency": 0.2}, {"size": 1e5, "efficiency": 0.8}), provenance=prov)
    assert interpolate_efficiency(curve, 1.0) == 0.2
    assert interpolate_efficiency(curve, 0.0) == 0.2
    assert interpolate_efficiency(curve, 1e9) == 0.8
    assert interpolate_efficiency(curve, 1e4) == pytest.approx(0.5)
    assert interpolate_efficiency(curve, 1e3) == 0.2 and interpolate_efficiency(curve, 1e5) == 0.8


def test_collective_alpha_beta_formula_on_a_flat_link():
    """On a flat-efficiency link the time is exactly steps*latency + volume*bytes/(bw*eff)."""
    link = _flat_link(100.0, 0.5, 10.0)
    n, size = 4, 1e9
    busbw = 100e9 * 0.5
    assert collective_time_s(link, "all_reduce", size, n) == pytest.approx(2 * 3 * 10e-6 + 1.5 * size / busbw)
    assert collective_time_s(link, "all_gather", size, n) == pytest.approx(3 * 10e-6 + 0.75 * size / busbw)
    assert collective_time_s(link, "reduce_scatter", size, n) == pytest.approx(3 * 10e-6 + 0.75 * size / busbw)
    assert collective_time_s(link, "all_to_all", size, n) == pytest.approx(3 * 10e-6 + 0.75 * size / busbw)
    assert collective_time_s(link, "p2p", size, 2) == pytest.approx(10e-6 + size / busbw)


def test_collective_time_zero_for_one_rank_and_grows_with_bytes(profiles):
    """One rank or zero bytes cost nothing; every shipped link's time rises strictly with message size."""
    for name in profiles.names():
        for link in (profiles.device(name).intra_node, profiles.device(name).inter_node):
            for coll in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"):
                assert collective_time_s(link, coll, 1e9, 1) == 0.0
                assert collective_time_s(link, coll, 0.0, 8) == 0.0
                times = [collective_time_s(link, coll, float(s), 8) for s in (1e3, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10)]
                assert all(b > a for a, b in zip(times, times[1:])), (name, link.kind, coll)


def test_all_reduce_is_about_twice_reduce_scatter_for_large_messages(profiles):
    """With equal curves (A100 ring), a 4 GiB all-reduce takes ~2x a reduce-scatter of the same buffer."""
    link = profiles.device("A100").intra_node
    ar = collective_time_s(link, "all_reduce", 4 * GIB, 8)
    rs = collective_time_s(link, "reduce_scatter", 4 * GIB, 8)
    assert ar / rs == pytest.approx(2.0, rel=0.01)


@pytest.mark.parametrize("device,size,busbw_gb_per_s", [
    ("H100", 1 * MIB, 43.7), ("H100", 16 * MIB, 234.5), ("H100", GIB, 466.4),
    ("A100", 1 * MIB, 36.2), ("A100", 64 * MIB, 166.6), ("A100", GIB, 228.1),
])
def test_collective_time_reproduces_measured_busbw(profiles, device, size, busbw_gb_per_s):
    """8-GPU all-reduce bus bandwidth from collective_time_s matches the nccl-tests curves in hardware.md s4.4."""
    t = collective_time_s(profiles.device(device).intra_node, "all_reduce", size, 8)
    assert 2 * 7 / 8 * size / t / 1e9 == pytest.approx(busbw_gb_per_s, rel=0.02)


def test_mesh_links_use_one_peer_link_for_p2p(profiles):
    """On MI300X's xGMI mesh a 2-GPU all-reduce runs near the measured single-link 47.7 GB/s, not 448."""
    link = profiles.device("MI300X").intra_node
    t = collective_time_s(link, "all_reduce", 4 * GIB, 2)
    assert 4 * GIB / t / 1e9 == pytest.approx(47.7, rel=0.15)
    t8 = collective_time_s(link, "all_reduce", 4 * GIB, 8)
    assert 2 * 7 / 8 * 4 * GIB / t8 / 1e9 == pytest.approx(312.9, rel=0.05)


def test_deepep_intranode_all_to_all_on_h800(profiles):
    """H800 NVLink all-to-all of a large buffer runs near DeepEP's measured ~153 GB/s (hardware.md s4.5)."""
    t = collective_time_s(profiles.device("H800").intra_node, "all_to_all", 256 * MIB, 8)
    assert 7 / 8 * 256 * MIB / t / 1e9 == pytest.approx(153, rel=0.1)


def test_cross_links_defaults_and_cluster_override(profiles):
    """Different vendors meet over host memory; same vendor uses the slower NIC; a cluster's declared link wins."""
    hm = profiles.cross_link("H800", "mi300x")
    assert hm.kind == "host-memory" and 10 <= hm.bandwidth_gb_per_s <= 20 and 50 <= hm.latency_us <= 100
    assert profiles.cross_link("910B", "H800").kind == "host-memory"
    same = profiles.cross_link("H100", "A100")
    assert same.kind == "infiniband" and same.bandwidth_gb_per_s == profiles.device("A100").inter_node.bandwidth_gb_per_s
    assert profiles.cross_link("H800", "H800") == profiles.device("H800").inter_node
    cluster = ClusterSpec(
        groups=(NodeGroup(device_type="H800", num_nodes=2, gpus_per_node=8),
                NodeGroup(device_type="MI300X", num_nodes=2, gpus_per_node=8)),
        links=(CrossTypeLink(between=("MI300X", "H800"), kind="roce", bandwidth_gb_per_s=40.0, latency_us=15.0),),
    )
    declared = profiles.cross_link("h800", "MI300X", cluster)
    assert (declared.kind, declared.bandwidth_gb_per_s, declared.latency_us) == ("roce", 40.0, 15.0)
    assert "p2p" in declared.efficiency
    assert (PROFILES_DIR / "links.yaml").is_file()


def test_group_links_apply_overrides(profiles):
    """A node group's bandwidth overrides replace the device's link bandwidth, keeping its curves."""
    g = NodeGroup(device_type="H800", num_nodes=1, gpus_per_node=8, inter_node_bandwidth_gb_per_s=25.0)
    intra, inter = profiles.group_links(g)
    assert inter.bandwidth_gb_per_s == 25.0 and intra == profiles.device("H800").intra_node
    assert inter.efficiency == profiles.device("H800").inter_node.efficiency


def test_shipped_load_is_cached():
    """Loading the shipped set twice returns the same object (lru_cache)."""
    assert ProfileSet.load() is ProfileSet.load()


def test_provenance_manifest_hashes_files(profiles):
    """The manifest names each device's file, its provenance kinds, and the file's real sha256."""
    rows = {(r["item"], r["name"]): r for r in profiles.provenance_manifest()}
    row = rows[("device", "H800")]
    path = PROFILES_DIR.parent / row["file"]
    assert row["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert row["provenance_kinds"] == ["datasheet-derived", "published"]  # profiles/published/ layered on it
    assert any(item == "links" for item, _ in rows)


def test_corrections_round_trip(tmp_path):
    """A corrections.yaml in --profiles DIR sets multipliers, the * wildcard, and the additive memory term."""
    (tmp_path / "corrections.yaml").write_text(yaml.safe_dump([
        {"device": "h800", "kind": "gemm", "factor": 1.15, "provenance": {"kind": "calibrated", "source": "run 1"}},
        {"device": "*", "kind": "all_to_all", "factor": 1.3, "provenance": {"kind": "calibrated", "source": "run 2"}},
        {"device": "MI300X", "kind": "all_to_all", "factor": 1.6, "provenance": {"kind": "calibrated", "source": "run 3"}},
        {"device": "910B", "kind": "memory_overhead_gib", "factor": 2.5, "provenance": {"kind": "measured", "source": "x"}},
        {"device": "*", "kind": "moe_imbalance_factor", "factor": 1.3, "provenance": {"kind": "calibrated", "source": "r"}},
    ]))
    ps = ProfileSet.load([tmp_path])
    shipped = ProfileSet.load()
    assert ps.correction("H800", "gemm") == 1.15
    assert ps.correction("H100", "gemm") == shipped.correction("H100", "gemm")  # the shipped calibration stays
    assert ps.correction("H100", "all_to_all") == 1.3
    assert ps.correction("mi300x", "all_to_all") == 1.6
    assert ps.correction("Ascend910B", "memory_overhead_gib") == 2.5
    assert ps.correction("H800", "memory_overhead_gib") == 0.0
    assert ps.corrections_for("H800")["gemm"] == 1.15
    assert ps.moe_imbalance_factor() == 1.3 and ProfileSet.uncalibrated().moe_imbalance_factor() is None
    # the loaded corrections' kinds: the user's (calibrated, measured) over the shipped published ratios
    assert any(r["item"] == "corrections" and r["provenance_kinds"] == ["calibrated", "measured", "published"]
               for r in ps.provenance_manifest())
    assert ProfileSet.load().correction("H800", "gemm") == shipped.correction("H800", "gemm") != 1.15
    with pytest.raises(PlannerInputError):
        ps.correction("H800", "flops")


@pytest.mark.parametrize("row,needle", [
    ({"device": "H800", "kind": "gemmm", "factor": 1.1, "provenance": {"kind": "calibrated", "source": "s"}}, "gemmm"),
    ({"device": "Z9", "kind": "gemm", "factor": 1.1, "provenance": {"kind": "calibrated", "source": "s"}}, "Z9"),
    ({"device": "H800", "kind": "gemm", "factor": 0.0, "provenance": {"kind": "calibrated", "source": "s"}}, "0.1..10"),
    # a calibration of a log 50x slower than the run wrote x47.9 (issue 23): beyond 10x either way is refused
    ({"device": "H800", "kind": "gemm", "factor": 47.9, "provenance": {"kind": "calibrated", "source": "s"}}, "0.1..10"),
    ({"device": "H800", "kind": "memory_overhead_gib", "factor": -3.0,
      "provenance": {"kind": "calibrated", "source": "s"}}, "0..1024"),
    ({"device": "H800", "kind": "gemm", "factor": 1.1}, "provenance"),
    ({"device": "*", "kind": "moe_imbalance_factor", "factor": 0.9, "provenance": {"kind": "calibrated", "source": "s"}},
     "1..65536"),
])
def test_bad_corrections_are_rejected(tmp_path, row, needle):
    """Bad corrections rows raise PlannerInputError on --profiles naming what is wrong."""
    (tmp_path / "corrections.yaml").write_text(yaml.safe_dump([row]))
    with pytest.raises(PlannerInputError) as info:
        ProfileSet.load([tmp_path])
    assert info.value.field == "--profiles" and needle in str(info.value)


def test_measured_partial_profile_overrides_shipped_tables(tmp_path):
    """A partial device file in --profiles DIR/devices replaces just its tables and shows as measured."""
    measured = {"points": [{"size": 1e9, "efficiency": 0.3}, {"size": 1e12, "efficiency": 0.7}],
                "provenance": {"kind": "measured", "source": "cli.py profile on node-3"}}
    (tmp_path / "devices").mkdir()
    (tmp_path / "devices" / "h800.yaml").write_text(yaml.safe_dump({
        "name": "h800", "gemm_efficiency": measured,
        "intra_node": {"bandwidth_gb_per_s": 160.0, "efficiency": {"p2p": measured}},
    }))
    ps = ProfileSet.load([str(tmp_path)])
    dev = ps.device("H800")
    shipped = ProfileSet.load().device("H800")
    assert dev.gemm_efficiency.provenance.kind == "measured"
    assert dev.intra_node.bandwidth_gb_per_s == 160.0
    assert dev.intra_node.efficiency["p2p"].provenance.kind == "measured"
    assert dev.intra_node.efficiency["all_reduce"] == shipped.intra_node.efficiency["all_reduce"]
    assert dev.attention_efficiency == shipped.attention_efficiency and dev.memory_gib == shipped.memory_gib
    row = next(r for r in ps.provenance_manifest() if r["name"] == "H800")
    assert len(row["layers"]) == 3 and "measured" in row["provenance_kinds"]  # datasheet, published, measured


def test_new_device_from_profiles_dir(tmp_path):
    """A complete device file with a new name adds a device; an incomplete one names the missing fields."""
    raw = yaml.safe_load((PROFILES_DIR / "devices" / "H800.yaml").read_text())
    raw.update(name="X1", aliases=["x-one"])
    (tmp_path / "devices").mkdir()
    (tmp_path / "devices" / "X1.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "profile_report.json").write_text("{}")  # written beside by cli.py profile; not read
    ps = ProfileSet.load([tmp_path])
    assert ps.canonical_name("X-ONE") == "X1" and "X1" in ps.names()
    (tmp_path / "devices" / "X1.yaml").write_text(yaml.safe_dump({"name": "X1", "vendor": "Acme"}))
    with pytest.raises(PlannerInputError) as info:
        ProfileSet.load([tmp_path])
    assert "memory_gib" in str(info.value)


def test_profiles_dir_must_exist(tmp_path):
    """A --profiles path that is not a directory is an input error naming the flag."""
    with pytest.raises(PlannerInputError) as info:
        ProfileSet.load([tmp_path / "nope"])
    assert info.value.field == "--profiles"


def test_readme_documents_every_field():
    """profiles/README.md mentions every DeviceProfile and LinkProfile field and the corrections kinds."""
    text = (PROFILES_DIR / "README.md").read_text()
    for name in list(DeviceProfile.model_fields) + list(LinkProfile.model_fields):
        assert f"`{name}`" in text, name
    for kind in ("measured", "datasheet-derived", "calibrated", "corrections.yaml", "memory_overhead_gib", "--profiles"):
        assert kind in text
