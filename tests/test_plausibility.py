"""Issue 23, item 4: plausibility at the boundary.  Physical ranges for link, node and device figures,
one node shape per device type, links given once between types the cluster has, `links` a list, an
integer head_dim, --moe-imbalance within num_experts/topk; calibrate refuses corrections beyond 10x, a
measured MFU above 100% and logs that hold several runs; a poisoned corrections file is named.  Each
example of the issue is a test here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers.cli import refused, run
from planner.api import estimate, load_inputs
from planner.profile_tables import TIME_CORRECTION_KINDS, ProfileSet
from tools.fuzz.inputs import HF_CONFIGS, h800_profile_document, log_text

TWO_TYPES = {"groups": [{"device_type": "H800", "num_nodes": 1, "gpus_per_node": 8},
                        {"device_type": "MI300X", "num_nodes": 1, "gpus_per_node": 8}]}


def cluster_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def both_commands(model: Path, cluster: Path) -> list[list[str]]:
    base = ["--model", str(model), "--cluster", str(cluster)]
    return [["estimate", *base], ["solve", *base, "--quiet", "--time-limit", "5"]]


GROUPS = "groups: [{device_type: H800, num_nodes: 1, gpus_per_node: 8}, {device_type: MI300X, num_nodes: 1, gpus_per_node: 8}]\n"


@pytest.mark.parametrize("text,field", [
    (GROUPS + "links: [{between: [H800, MI300X], kind: ethernet, bandwidth_gb_per_s: 25, latency_us: 1e300}]",
     "latency_us"),
    (GROUPS + "links: [{between: [H800, MI300X], kind: ethernet, bandwidth_gb_per_s: 1e-300, latency_us: 10}]",
     "bandwidth_gb_per_s"),
    ("groups: [{device_type: H800, num_nodes: 2, gpus_per_node: 8, intra_node_bandwidth_gb_per_s: 1e-12}]",
     "intra_node_bandwidth_gb_per_s"),
    ("groups: [{device_type: H800, num_nodes: 2, gpus_per_node: 8, inter_node_bandwidth_gb_per_s: 1.0e+300}]",
     "inter_node_bandwidth_gb_per_s"),
], ids=["latency 1e300", "bandwidth 1e-300", "intra-node 1e-12 GB/s", "inter-node 1e300 GB/s"])
def test_link_figures_outside_the_physical_range_are_refused(tmp_path, tiny, text, field):
    """They gave OverflowError or an internal AssertionError in solve, and estimate accepted them."""
    cluster = cluster_file(tmp_path, text)
    for args in both_commands(tiny, cluster):
        line = refused(run(args), "--cluster")
        assert field in line and "physical range" in line


def test_figures_at_the_ends_of_the_range_are_planned(tmp_path, tiny):
    cluster = cluster_file(tmp_path, "groups: [{device_type: H800, num_nodes: 2, gpus_per_node: 8, "
                                     "intra_node_bandwidth_gb_per_s: 0.1, inter_node_bandwidth_gb_per_s: 10000}]")
    for args in both_commands(tiny, cluster):
        res = run(args)
        assert res.exit_code == 0, res.output


def test_one_device_type_in_two_node_sizes_is_refused(tmp_path, tiny):
    """The first group's GPUs per node were used for all, so the price depended on the groups' order."""
    for order in ((8, 2), (2, 8)):
        cluster = cluster_file(tmp_path, "groups: [" + ", ".join(
            f"{{device_type: H800, num_nodes: {16 // g}, gpus_per_node: {g}}}" for g in order) + "]")
        line = refused(run(["estimate", "--model", str(tiny), "--cluster", str(cluster)]), "--cluster")
        assert "gpus_per_node" in line and "one node shape per device type" in line
    same = cluster_file(tmp_path, "groups: [{device_type: H800, num_nodes: 1, gpus_per_node: 8}, "
                                  "{device_type: H800, num_nodes: 1, gpus_per_node: 8}]")
    assert run(["estimate", "--model", str(tiny), "--cluster", str(same)]).exit_code == 0


def test_one_device_type_on_two_networks_is_refused(tmp_path, tiny):
    """walk54: two H800 groups, one node on EFA and three on InfiniBand, were planned as one group: the first
    group's inter_node_kind applied to all four nodes (EP across nodes was priced and reported as EFA, or as
    InfiniBand with the groups swapped), silently.  The bandwidth overrides were already refused so."""
    for kinds in (("efa", "infiniband"), ("infiniband", "efa")):
        cluster = cluster_file(tmp_path, "groups: [" + ", ".join(
            f"{{device_type: H800, num_nodes: {n}, gpus_per_node: 8, inter_node_kind: {k}}}"
            for n, k in zip((1, 3), kinds)) + "]")
        line = refused(run(["estimate", "--model", str(tiny), "--cluster", str(cluster)]), "--cluster")
        assert "groups[1].inter_node_kind" in line and "one node shape per device type" in line
    same = cluster_file(tmp_path, "groups: [{device_type: H800, num_nodes: 1, gpus_per_node: 8, inter_node_kind: efa}, "
                                  "{device_type: H800, num_nodes: 3, gpus_per_node: 8, inter_node_kind: efa}]")
    assert run(["estimate", "--model", str(tiny), "--cluster", str(same)]).exit_code == 0


@pytest.mark.parametrize("links,needle", [
    ("[{between: [H800, MI300X], kind: ethernet}, {between: [MI300X, H800], kind: infiniband}]", "already links[0]"),
    ("[{between: [H800, 910B], kind: ethernet}]", "no 910B GPUs"),
    ("[{between: [H800, H800], kind: ethernet}]", "with itself"),
    ("false", "must be a list"),
], ids=["a pair given twice", "a type the cluster lacks", "a type with itself", "links: false"])
def test_links_are_given_once_between_two_types_of_the_cluster(tmp_path, tiny, links, needle):
    cluster = cluster_file(tmp_path, GROUPS + f"links: {links}")
    for args in both_commands(tiny, cluster):
        assert needle in refused(run(args), "--cluster")


def test_a_float_head_dim_is_refused(tmp_path):
    """A float head_dim equal to hidden/heads was silently accepted."""
    doc = dict(HF_CONFIGS["llama"], head_dim=32.0)  # 256 / 8
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(doc))
    assert "head_dim" in refused(run(["estimate", "--model", str(tmp_path / "hf"), "--cluster", "H800:8"]), "head_dim")


def test_yaml_numbers_without_a_dot_are_numbers(tmp_path, tiny):
    """YAML 1.2 reads 1e300 as a number; the message is about its range, not about quotes."""
    cluster = cluster_file(tmp_path, GROUPS + "links: [{between: [H800, MI300X], kind: ethernet, "
                                              "bandwidth_gb_per_s: 25, latency_us: 1e300}]")
    line = refused(run(["estimate", "--model", str(tiny), "--cluster", str(cluster)]), "latency_us")
    assert "string" not in line and "1e+300 us" in line


def test_device_profiles_outside_the_physical_range_are_refused(tmp_path, tiny):
    for key, value in (("memory_gib", 1e6), ("hbm_bandwidth_tb_per_s", 1e-300), ("peak_tflops", {"bf16": 1e9})):
        doc = h800_profile_document()
        doc[key] = value
        (tmp_path / "prof" / "devices").mkdir(parents=True, exist_ok=True)
        (tmp_path / "prof" / "devices" / "H800.yaml").write_text(yaml.safe_dump(doc))
        line = refused(run(["estimate", "--model", str(tiny), "--cluster", "H800:8", "--profiles",
                            str(tmp_path / "prof")]), "--profiles")
        assert key in line and "H800.yaml" in line


def test_moe_imbalance_beyond_num_experts_over_topk_is_refused_at_the_boundary(tiny):
    """`--moe-imbalance 1e300` was reported as "iteration time is nan"."""
    line = refused(run(["estimate", "--model", str(tiny), "--cluster", "H800:8", "--moe-imbalance", "1e300"]),
                   "--moe-imbalance")
    assert "num_experts / topk = 8/2 = 4" in line
    assert run(["estimate", "--model", str(tiny), "--cluster", "H800:8", "--moe-imbalance", "4"]).exit_code == 0


# ---- calibration poisoned ---------------------------------------------------------------------------

MIXTRAL = ["--model", "mixtral-s", "--cluster", "H800:32", "--tp", "2", "--pp", "4", "--ep", "4"]


@pytest.fixture(scope="module")
def mixtral_ms() -> float:
    inputs = load_inputs(model="mixtral-s", cluster="H800:32", overrides={"tp": 2, "pp": 4, "ep": 4})
    return estimate(inputs).cost.iteration_time_s * 1e3


def write_log(path: Path, ms: float, n: int = 10, gbs: int = 1024) -> Path:
    path.write_bytes(log_text([f"{ms:.1f}"] * n, gbs=gbs, memory=False))
    return path


def test_a_log_ten_times_faster_than_the_model_is_refused(tmp_path, mixtral_ms):
    """It wrote corrections that imply 273% MFU (issue 23); the measured MFU is checked first."""
    log = write_log(tmp_path / "fast.log", mixtral_ms / 10)
    line = refused(run(["calibrate", "--megatron-log", str(log), *MIXTRAL, "--out", str(tmp_path / "cal")]),
                   "--megatron-log")
    assert "MFU" in line and "above the devices' peak" in line and not (tmp_path / "cal").exists()


def test_a_log_fifty_times_slower_is_refused(tmp_path, mixtral_ms):
    """It wrote a x47.9 factor without a warning (issue 23)."""
    log = write_log(tmp_path / "slow.log", mixtral_ms * 50)
    line = refused(run(["calibrate", "--megatron-log", str(log), *MIXTRAL, "--out", str(tmp_path / "cal")]),
                   "--megatron-log")
    assert "10x" in line and not (tmp_path / "cal").exists()


def test_two_runs_in_one_log_are_not_blended(tmp_path, mixtral_ms):
    """Two runs concatenated were blended (issue 23): refused, naming where the second starts; --log-run
    picks one, and its factor is that run's alone."""
    log = tmp_path / "two.log"
    log.write_bytes(write_log(tmp_path / "a", mixtral_ms).read_bytes() + write_log(tmp_path / "b", mixtral_ms * 3)
                    .read_bytes())
    line = refused(run(["calibrate", "--megatron-log", str(log), *MIXTRAL, "--out", str(tmp_path / "cal")]),
                   "--megatron-log")
    assert "holds 2 runs" in line and "line 11" in line and "--log-run" in line
    factors = {}
    for k in (1, 2):
        res = run(["calibrate", "--megatron-log", str(log), *MIXTRAL, "--out", str(tmp_path / f"cal{k}"),
                   "--log-run", str(k), "--json"])
        assert res.exit_code == 0, res.output
        factors[k] = json.loads(res.output[res.output.index("{"):])["global_factor"]
    assert factors[1] == pytest.approx(1.0, abs=0.01) and factors[2] > 2.0
    refused(run(["calibrate", "--megatron-log", str(log), *MIXTRAL, "--out", str(tmp_path / "c3"), "--log-run", "3"]),
            "--log-run")


def test_a_poisoned_corrections_file_is_named(tmp_path):
    """A corrections file fitted to another run made every later `estimate --profiles` fail with a
    message blaming the model (issue 23); now a factor beyond 10x is refused naming the file, and a
    prediction it makes implausible names it too."""
    prof = tmp_path / "prof"
    prof.mkdir()
    kinds = TIME_CORRECTION_KINDS

    def corrections(factor: float) -> None:
        rows = [{"device": "H800", "kind": k, "factor": factor,
                 "provenance": {"kind": "calibrated", "source": "a log of another run"}} for k in kinds]
        (prof / "corrections.yaml").write_text(yaml.safe_dump(rows))

    corrections(47.9)
    line = refused(run(["estimate", *MIXTRAL, "--profiles", str(prof)]), "--profiles")
    assert "corrections.yaml" in line and "47.9" in line
    corrections(0.11)  # within 10x, but H800's GEMMs would run at 7x their peak (issue 33: refused as it loads)
    line = refused(run(["estimate", *MIXTRAL, "--profiles", str(prof)]), "--profiles")
    assert "of its peak" in line and "impossible speed" in line and str(prof / "corrections.yaml") in line


def test_the_routing_imbalance_is_capped_for_a_model_it_cannot_fit_not_refused(tmp_path):
    """The real-routing imbalance (a spread measured on other models' routers) would put a 4-expert top-4 model's
    busiest of 2 EP ranks above what it can hold (every token already uses both ranks): the run is priced with the
    imbalance capped at 1, also beside a --profiles directory of the user's that states no imbalance (the property
    test's 4-expert cases were refused before)."""
    from planner.cost.dispatch import routing

    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "corrections.yaml").write_text(
        "- device: H800\n  kind: gemm\n  factor: 1.0\n  provenance: {kind: calibrated, source: test}\n")
    args = ("--num-layers 2 --hidden-size 256 --num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 "
            "--micro-batch-size 1 --global-batch-size 8 --num-experts 4 --moe-router-topk 4 --moe-grouped-gemm")
    for dirs in ((), (str(prof),)):
        inputs = load_inputs(megatron_args=args, cluster="H800:8", profile_dirs=dirs)
        assert inputs.profiles.moe_imbalance_factor() is None
        assert routing(inputs.run.model, None, None).imbalance(2, 512) == 1.0
        assert routing(inputs.run.model.model_copy(update={"num_experts": 8}), None, None).imbalance(2, 512) > 1.0


def test_corrections_that_make_kernels_faster_than_peak_are_refused(tmp_path, mixtral_ms):
    """calibrate on a log 1.5x faster than the model (MFU below 100%, so it was accepted) wrote a GEMM factor of
    0.68: GEMMs at 116% of the H800's peak, which `estimate --profiles` then used (issue 33).  Now calibrate refuses
    to write them, and estimate refuses such a file, naming --profiles; the shipped corrections stay below peak."""
    assert ProfileSet.load().faster_than_peak() == []
    log = write_log(tmp_path / "fast.log", mixtral_ms / 1.5)
    line = refused(run(["calibrate", "--megatron-log", str(log), *MIXTRAL, "--out", str(tmp_path / "cal")]),
                   "--megatron-log")
    assert "of its peak" in line and "impossible speed" in line and not (tmp_path / "cal").exists()
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "corrections.yaml").write_text(yaml.safe_dump([{"device": "H800", "kind": "gemm", "factor": 0.68,
                                                             "provenance": {"kind": "calibrated", "source": "a log"}}]))
    line = refused(run(["estimate", *MIXTRAL, "--profiles", str(prof)]), "--profiles")
    best = max(p.efficiency for p in ProfileSet.load().device("H800").gemm_efficiency.points)
    assert best / 0.68 > 1 > best / 0.9 and f"H800's GEMMs run at {best / 0.68:.0%} of its peak" in line
    (prof / "corrections.yaml").write_text(yaml.safe_dump([{"device": "H800", "kind": "gemm", "factor": 0.9,
                                                             "provenance": {"kind": "calibrated", "source": "a log"}}]))
    assert run(["estimate", *MIXTRAL, "--profiles", str(prof)]).exit_code == 0  # 88% of peak: possible
