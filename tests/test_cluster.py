"""--cluster parsing: presets, YAML files, and the TYPE:COUNT shorthand."""

from __future__ import annotations

import pytest
import yaml

from planner.errors import PlannerInputError
from planner.inputs.cluster import describe_cluster, parse_cluster, preset_paths
from planner.profile_tables import PROFILES_DIR, ProfileSet


def test_shorthand_canonicalises_types_and_keeps_order(profiles):
    """H800:16,mi300x:16,ascend910b:16 gives three groups of 2x8 in the order given, canonical names."""
    c = parse_cluster("H800:16,mi300x:16,ascend910b:16", profiles)
    assert [(g.device_type, g.num_nodes, g.gpus_per_node) for g in c.groups] == [
        ("H800", 2, 8), ("MI300X", 2, 8), ("910B", 2, 8)]
    assert c.world_size == 48
    assert c.device_types == ("H800", "MI300X", "910B")
    assert c.links == ()


def test_shorthand_partial_node_and_nodes_by_gpus(profiles):
    """A count below one node is one node of that many GPUs; NODESxGPUS sets both; spaces are fine."""
    c = parse_cluster(" A100 : 4 , H100:3x4 ", profiles)
    assert [(g.device_type, g.num_nodes, g.gpus_per_node) for g in c.groups] == [("A100", 1, 4), ("H100", 3, 4)]


@pytest.mark.parametrize("text,needles", [
    ("H800:12", ["H800:12", "multiple", "8"]),
    ("H800:0", ["H800:0", "positive"]),
    ("H800:abc", ["H800:abc", "positive"]),
    ("TPU:8", ["unknown device", "H800", "MI300X"]),
    ("H800:8,h800:8", ["twice"]),
    ("H800:8,", ["empty item"]),
    ("not-a-cluster", ["accepted forms", "TYPE:COUNT", "h800-mi300x"]),
    ("missing.yaml", ["file not found", "missing.yaml"]),
    ("", ["empty"]),
])
def test_bad_cluster_text_names_the_flag(profiles, text, needles):
    """Each bad --cluster value raises PlannerInputError on `--cluster` explaining what is wrong."""
    with pytest.raises(PlannerInputError) as info:
        parse_cluster(text, profiles)
    assert info.value.field == "--cluster"
    for needle in needles:
        assert needle in str(info.value), needle


PAPER = {
    "a100-910b": {"A100": 16, "910B": 16},
    "h800-16": {"H800": 16},
    "mi300x-16": {"MI300X": 16},
    "910b-16": {"910B": 16},
    "h800-mi300x": {"H800": 16, "MI300X": 16},
    "h800-910b": {"H800": 16, "910B": 16},
    "mi300x-910b": {"MI300X": 16, "910B": 16},
    "h800-mi300x-910b": {"H800": 16, "MI300X": 16, "910B": 16},
}


@pytest.mark.parametrize("name,counts", sorted(PAPER.items()))
def test_paper_presets(profiles, name, counts):
    """The paper's cluster settings are presets with the stated GPUs per type (case-insensitive name)."""
    c = parse_cluster(name.upper(), profiles)
    assert c.gpus_by_type() == counts and c.name == name


@pytest.mark.parametrize("path", sorted((PROFILES_DIR / "clusters").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_preset_loads_with_known_devices(profiles, path):
    """Every shipped preset parses, names itself after its file, and uses known devices in whole nodes."""
    c = parse_cluster(path.stem, profiles)
    assert c.name == path.stem
    for g in c.groups:
        assert profiles.canonical_name(g.device_type) == g.device_type
        assert g.gpus_per_node == profiles.device(g.device_type).gpus_per_node
    assert path.stem in preset_paths(profiles)


def test_yaml_file_with_overrides_and_links(profiles, tmp_path):
    """A cluster file canonicalises names, defaults gpus_per_node, keeps overrides, fills link defaults."""
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump({
        "groups": [
            {"device_type": "h800", "num_nodes": 2, "inter_node_bandwidth_gb_per_s": 25.0},
            {"device_type": "Ascend-910B", "num_gpus": 16},
        ],
        "links": [{"between": ["H800", "ascend910b"], "kind": "ethernet"}],
    }))
    c = parse_cluster(str(f), profiles)
    assert c.name == "mine"
    assert [(g.device_type, g.num_nodes, g.gpus_per_node) for g in c.groups] == [("H800", 2, 8), ("910B", 2, 8)]
    assert c.groups[0].inter_node_bandwidth_gb_per_s == 25.0
    link = c.cross_link("910B", "H800")
    eth = profiles.link_kind("ethernet")
    assert link is not None and (link.bandwidth_gb_per_s, link.latency_us) == (eth.bandwidth_gb_per_s, eth.latency_us)
    resolved = profiles.cross_link("H800", "910B", c)
    assert resolved.kind == "ethernet"
    assert profiles.cross_link("H800", "910B").kind == "host-memory"  # without the cluster: the vendor default


@pytest.mark.parametrize("body,needle", [
    ({"groups": [{"device_type": "H800", "num_nodes": 2, "colour": "red"}]}, "colour"),
    ({"groups": []}, "groups"),
    ({"groupz": [{"device_type": "H800", "num_nodes": 2}]}, "groupz"),
    ({"groups": [{"device_type": "H800", "num_gpus": 12}]}, "num_gpus"),
    ({"groups": [{"device_type": "H800", "num_nodes": 0}]}, "num_nodes"),
    ({"groups": [{"device_type": "H800", "num_nodes": 1}], "links": [{"between": ["H800"], "kind": "roce"}]}, "between"),
    ({"groups": [{"device_type": "H800", "num_nodes": 1}],
      "links": [{"between": ["H800", "MI300X"], "kind": "carrier-pigeon"}]}, "carrier-pigeon"),
    ({"groups": [{"device_type": "H100", "num_nodes": 2, "inter_node_kind": "pigeon"}]}, "inter_node_kind"),
])
def test_bad_cluster_file_names_the_key(profiles, tmp_path, body, needle):
    """A bad cluster file raises PlannerInputError on --cluster naming the offending key."""
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(body))
    with pytest.raises(PlannerInputError) as info:
        parse_cluster(str(f), profiles)
    assert info.value.field == "--cluster" and needle in str(info.value)


def test_presets_from_profiles_dir(tmp_path):
    """A --profiles DIR/clusters/*.yaml file becomes a preset name."""
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "lab.yaml").write_text(yaml.safe_dump(
        {"name": "lab", "groups": [{"device_type": "A800", "num_nodes": 1}]}))
    ps = ProfileSet.load([tmp_path])
    assert parse_cluster("lab", ps).gpus_by_type() == {"A800": 8}


def test_a_group_states_its_fabric_and_the_links_carry_it(profiles, tmp_path):
    """`inter_node_kind: efa` (AWS's EFA) replaces the device's NIC kind between nodes and keeps its curves and rate;
    a pool of the group keeps it too."""
    f = tmp_path / "aws.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"device_type": "H100", "num_nodes": 2, "inter_node_kind": "efa"}]}))
    c = parse_cluster(str(f), profiles)
    intra, inter = profiles.group_links(c.groups[0])
    default = profiles.device("H100").inter_node
    assert (inter.kind, intra.kind) == ("efa", "nvlink")
    assert (inter.bandwidth_gb_per_s, inter.efficiency) == (default.bandwidth_gb_per_s, default.efficiency)
    assert profiles.group_links(parse_cluster("H100:16", profiles).groups[0])[1].kind == "infiniband"
    assert parse_cluster("p5-h100-64", profiles).groups[0].inter_node_kind == "efa"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"groups": [{"device_type": "H100", "num_nodes": 2, "inter_node_kind": "ib"}]}))
    with pytest.raises(PlannerInputError) as info:
        parse_cluster(str(bad), profiles)
    assert all(k in str(info.value) for k in ("inter_node_kind", "infiniband", "efa")), str(info.value)


# --------------------------------------------------------------------------------------------
# NVLink domains beyond one host (GB200/GB300 NVL72)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,shape", [
    # (trays, GPUs per tray, domain): NVIDIA's launcher gives a job all its trays up to a rack's 18, else the
    # largest tray count up to 18 that divides the job's (Megatron-Bridge scripts/performance/utils/executors.py)
    ("GB200:8", (2, 4, 8)),
    ("GB200:72", (18, 4, 72)),
    ("GB200:256", (64, 4, 64)),  # 64 trays: 16 divides 64, 17 and 18 do not
    ("GB300:96", (24, 4, 48)),  # 24 trays: 12
    ("GB200:76", (19, 4, 4)),  # 19 trays, a prime: domains of one tray
    ("B200:64", (8, 8, 8)),  # an HGX node is its own domain
])
def test_nvl72_domains_follow_the_segment_rule(profiles, text, shape):
    (g,) = parse_cluster(text, profiles).groups
    assert (g.num_nodes, g.gpus_per_node, g.domain_gpus) == shape


def test_a_cluster_file_states_its_domain(profiles, tmp_path):
    f = tmp_path / "nvl.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"device_type": "GB200", "num_gpus": 144, "scale_up_domain_gpus": 72}]}))
    (g,) = parse_cluster(str(f), profiles).groups
    assert (g.num_nodes, g.gpus_per_node, g.domain_gpus) == (36, 4, 72)


@pytest.mark.parametrize("group,needles", [
    ({"device_type": "GB200", "num_gpus": 144, "scale_up_domain_gpus": 70}, ("scale_up_domain_gpus", "multiple")),
    ({"device_type": "GB200", "num_gpus": 128, "scale_up_domain_gpus": 72}, ("scale_up_domain_gpus", "whole domains",
                                                                             "segment")),
    ({"device_type": "GB200", "num_gpus": 64, "scale_up_domain_gpus": 0}, ("scale_up_domain_gpus",)),
])
def test_a_bad_domain_is_refused_by_name(profiles, tmp_path, group, needles):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({"groups": [group]}))
    with pytest.raises(PlannerInputError) as info:
        parse_cluster(str(f), profiles)
    assert info.value.field == "--cluster" and all(n in str(info.value) for n in needles), str(info.value)


def test_a_domain_smaller_than_the_rack_is_named_in_the_output(profiles):
    """GB200:76 (19 trays, a prime) gets one-tray domains by NVIDIA's --segment rule: the output says so and
    what would span trays (GB200:72); GB200:256 says its 64-GPU domains; a full rack, a part of one, and 8-GPU
    hosts say nothing."""
    from planner.inputs.cluster import domain_notes

    def notes(spec):
        return domain_notes(parse_cluster(spec, profiles), profiles)

    (odd,) = notes("GB200:76")
    assert "NVLink domains of 4 GPUs (1 host)" in odd and "divides 19" in odd and "--cluster GB200:72" in odd
    (big,) = notes("GB200:256")
    assert "NVLink domains of 64 GPUs (16 hosts)" in big and "divides 64" in big and "--cluster" not in big
    assert notes("GB200:72") == notes("GB300:64") == notes("GB200:8") == notes("H100:16") == []
    # trays of 3 GPUs (not the GB200's usual 4): the suggestion gives the node shape, which GB200:72 would not
    (three,) = notes("GB200:29x3")
    assert "--cluster GB200:24x3 leaves the rest out" in three, three
    assert parse_cluster("GB200:24x3", profiles).groups[0].domain_gpus == 72


# --------------------------------------------------------------------------------------------
# The description the planner prints and writes reads back as the same cluster
# --------------------------------------------------------------------------------------------
SHAPES = ["H800:16", "H800:2x6", "H800:4", "H800:1x4", "h800:1x8", "H800:12x8", "GB200:72", "GB200:18x4",
          "GB200:2x8", "GB200:76", "GB300:96", "T4:4", "T4:2x8", "V100:4,T4:12", "A100:3x4,H100:16",
          "H800:16,MI300X:2x4,910B:8", "910B:1x2,H800:2x8"]
PRESETS = sorted(p.stem for p in (PROFILES_DIR / "clusters").glob("*.yaml"))


def _unnamed(cluster):
    return cluster.model_copy(update={"name": ""})


@pytest.mark.parametrize("spec", SHAPES + PRESETS)
def test_the_description_parses_back_to_the_same_cluster(profiles, spec):
    """parse(describe(c)) == c (the name aside: a preset described by its GPUs is named by them) for single and
    mixed types, node shapes other than the device's usual one, and every shipped preset, those with a NIC of
    their own (p5/p6: EFA) included."""
    cluster = parse_cluster(spec, profiles)
    again = parse_cluster(describe_cluster(cluster, profiles), profiles)
    assert _unnamed(again) == _unnamed(cluster), describe_cluster(cluster, profiles)


@pytest.mark.parametrize("spec,text", [
    ("H800:2x6", "H800:2x6"),  # was H800:12, which --cluster refuses (not a multiple of 8)
    ("GB200:2x8", "GB200:2x8"),  # was GB200:16, which --cluster reads as 4 trays of 4
    ("H800:1x4", "H800:4"), ("H800:2x8", "H800:16"), ("GB200:18x4", "GB200:72"),  # the usual node: TYPE:COUNT
    ("p5-h100-64", "p5-h100-64"),  # H100:64 would drop its EFA
    ("h800-mi300x", "H800:16,MI300X:16"),
])
def test_the_description_gives_the_node_shape_where_the_count_does_not(profiles, spec, text):
    assert describe_cluster(parse_cluster(spec, profiles), profiles) == text


def test_a_yaml_cluster_is_described_by_its_shorthand_or_refused_not_misread(profiles, tmp_path):
    """A cluster file of usual nodes reads back from its shorthand; one with what the shorthand cannot say (a
    link, an override, a scale-up domain of its own, a type in two groups) is described by its name, the
    shorthand of its GPUs and what that leaves out, a text --cluster refuses rather than reading as another
    cluster."""
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({"groups": [{"device_type": "h800", "num_nodes": 2},
                                                {"device_type": "A100", "num_nodes": 3, "gpus_per_node": 4}]}))
    cluster = parse_cluster(str(plain), profiles)
    assert describe_cluster(cluster, profiles) == "H800:16,A100:3x4"
    assert _unnamed(parse_cluster("H800:16,A100:3x4", profiles)) == _unnamed(cluster)
    odd = [{"groups": [{"device_type": "H800", "num_nodes": 2}, {"device_type": "MI300X", "num_nodes": 2}],
            "links": [{"between": ["H800", "MI300X"], "kind": "roce", "bandwidth_gb_per_s": 25, "latency_us": 10}]},
           {"groups": [{"device_type": "H800", "num_nodes": 2, "inter_node_bandwidth_gb_per_s": 25}]},
           {"groups": [{"device_type": "GB200", "num_gpus": 144, "scale_up_domain_gpus": 36}]},
           {"groups": [{"device_type": "H800", "num_nodes": 1}, {"device_type": "H800", "num_nodes": 1}]}]
    said = ["link H800-MI300X roce", "H800 inter_node_bandwidth_gb_per_s 25.0", "GB200 scale_up_domain_gpus 36",
            "H800 in 2 groups"]
    for k, (body, words) in enumerate(zip(odd, said)):
        path = tmp_path / f"lab{k}.yaml"
        path.write_text(yaml.safe_dump(body))
        text = describe_cluster(parse_cluster(str(path), profiles), profiles)
        assert text.startswith(f"lab{k} (") and words in text, text
        with pytest.raises(PlannerInputError):
            parse_cluster(text, profiles)
