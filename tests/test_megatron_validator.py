"""Megatron-LM's own validator on what the planner emits and on the rules it claims.

The validator needs megatron-core >= 0.17 (megatron.training), which needs Python >= 3.12, so it
runs in a separate environment that `.ci/megatron_env.sh` builds once outside the clone
(~/.cache/hapmoe/megatron-venv).  tools/megatron_validate.py runs parse_args, validate_args,
core_transformer_config_from_args, the micro-batch calculator and initialize_model_parallel on a
fake process group (reference/megatron.md section 5) for a batch of flag lists in one process.
Without that environment every test here skips, saying why.

Checked: every golden launcher and every launcher the corpus tests emit (fork-only flags, which
upstream's parser does not know, are removed first and listed); and controls that Megatron must
refuse (or accept) exactly where the planner's own rules and flag reader do.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

from planner.errors import PlannerInputError
from planner.inputs.megatron_flags import fork_flags_in, known_flags, parse_megatron_flags
from planner.launcher import render_launch_files
from planner.megatron.flags import FORK_VALUES, REMOVED_FLAGS

from helpers.cases import flags_cost_model
from helpers.corpus import CORPUS, NAMES, solved
from helpers.hf_configs import GPT_OSS_120B
from helpers.launch import args_of, dense_plan, ep_overlap_launch, hf_config_launch
from helpers.megatron import NEEDS_MEGATRON, validate
from helpers.switch_cases import BASE, SWITCH_CASES, WORLD as SWITCH_WORLD

HERE = Path(__file__).parent
pytestmark = [
    pytest.mark.slow,  # imports Megatron in a subprocess and solves every corpus script
    NEEDS_MEGATRON,
]

QWEN3_235B = (
    "--num-layers 94 --hidden-size 4096 --num-attention-heads 64 --group-query-attention --num-query-groups 4 "
    "--seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 1024 "
    "--vocab-size 151936 --tokenizer-type NullTokenizer --mock-data --bf16 --tensor-model-parallel-size 2 "
    "--pipeline-model-parallel-size 8 --num-virtual-stages-per-pipeline-rank 4 --num-experts 128 --moe-router-topk 8 "
    "--expert-model-parallel-size 8 --sequence-parallel --disable-bias-linear"
).split()
ACCOUNT = ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]

# name -> (argv, world size): controls with a known answer
CONTROLS: dict[str, tuple[list[str], int]] = {
    "typo --num-expert": (BASE + ["--num-expert", "8"], 8),
    "PP4 x EP8 on 8 GPUs": (BASE + "--num-experts 8 --disable-bias-linear --pipeline-model-parallel-size 4 "
                            "--expert-model-parallel-size 8".split(), 8),
    "Qwen3-235B TP2 PP8 VPP4 accounted": (QWEN3_235B + ACCOUNT, 256),
    "Qwen3-235B TP2 PP8 VPP4 not accounted": (QWEN3_235B, 256),
    "heads over TP": (BASE + ["--tensor-model-parallel-size", "3"], 3),
    **{f"removed {flag}": (BASE + [flag] + ([] if flag == "--checkpoint-activations" else ["2"]), 8)
       for flag in REMOVED_FLAGS},
    "learned positions with --no-position-embedding": (BASE + ["--no-position-embedding"], 8),
    "rope with --no-position-embedding": (BASE + ["--position-embedding-type", "rope", "--no-position-embedding"], 8),
    **{f"switch {flag} without": (BASE + bad.split(), SWITCH_WORLD) for flag, bad, _, _ in SWITCH_CASES},
    **{f"switch {flag} with": (BASE + good.split(), SWITCH_WORLD) for flag, _, good, _ in SWITCH_CASES if good},
}


PIPELINE_SPLITS = [((4, 4, 4, 4), 1), ((3, 5, 5, 5), 1), ((5, 5, 5, 2), 1), ((3, 6, 6, 7), 1), ((7, 9), 1),
                   ((6, 4, 5, 7), 1), ((8, 0, 8), 1), ((7, 6, 5, 4), 3), ((4, 4), 2)]
EP_OVERLAP_CASES = [(2, True), (1, True), (2, False)]
"""(TP, --overlap-moe-expert-parallel-comm) of the launches whose CUDA_DEVICE_MAX_CONNECTIONS test_launcher.py checks."""
ARCH_CASES = {"GB200:16": 10, "B200:16": 10, "H100:16": 9}
"""TP 2 launches on Blackwell and Hopper, judged at the GPUs' own compute capability: launch.sh exports
CUDA_DEVICE_MAX_CONNECTIONS=1 on Hopper only (test_launcher.py), and Megatron asks it there only."""
TP2_FLAGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings "
             "1024 --vocab-size 32000 --tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 1 "
             "--global-batch-size 64 --bf16")


def _concrete(argv: list[str]) -> list[str]:
    """Text the planner left for bash (`$1`, `${DATA}`, `$(cmd)`) replaced by a path: the
    validator checks flags, not files."""
    return [re.sub(r"\$\([^)]*\)|\$\{[^}]*\}|\$\w+", "/tmp/x", a) if "$" in a else a for a in argv]


def _upstream_only(argv: list[str]) -> tuple[list[str], list[str]]:
    """argv without the flags only a fork knows (and their values), and those flags; a value only a
    fork accepts (MindSpeed's alltoall_seq) becomes upstream's equivalent."""
    table = known_flags()
    out, dropped, skip = [], [], False
    for k, tok in enumerate(argv):
        tok = FORK_VALUES.get(argv[k - 1], {}).get(tok, tok) if k else tok
        name = tok.partition("=")[0]
        if tok.startswith("--") and name in table:
            skip = table[name].source != "megatron"
            if skip:
                dropped.append(name)
                continue
        elif tok.startswith("--"):
            skip = False
        elif skip:
            continue
        out.append(tok)
    return out, dropped


def _exported(launch_sh: Path) -> dict[str, str]:
    """CUDA_DEVICE_MAX_CONNECTIONS as launch.sh sets it (or the input script it wraps)."""
    return _exported_text(launch_sh.read_text())


def _exported_text(text: str) -> dict[str, str]:
    m = re.findall(r"export CUDA_DEVICE_MAX_CONNECTIONS=\$?\{?[A-Z_]*:?-?(\d+)", text)
    return {"CUDA_DEVICE_MAX_CONNECTIONS": m[-1]} if m else {}


def _world(launch_sh: Path) -> int:
    m = re.search(r"world size (\d+)", launch_sh.read_text())
    assert m, launch_sh
    return int(m.group(1))


@lru_cache(maxsize=1)
def results() -> dict[str, dict]:
    """Every case through Megatron's validator in one subprocess (one import of Megatron)."""
    cases = []
    for golden in ("dense_megatron", "moe_megatron"):
        d = HERE / "golden" / golden
        argv = shlex.split((d / "megatron_args.txt").read_text())
        cases.append({"name": f"golden/{golden}", "argv": _concrete(argv), "world_size": _world(d / "launch.sh"),
                      "env": _exported(d / "launch.sh")})
    for c in reversed(CORPUS):  # the corpus tests solve in order, in another worker: meet them halfway
        solved(c["script"])
    for c in CORPUS:
        out = solved(c["script"])
        argv, _ = _upstream_only(shlex.split((out / "launch" / "megatron_args.txt").read_text()))
        world = json.loads((out / "plan.json").read_text())["plan"]["world_size"]
        cases.append({"name": f"corpus/{c['script']}", "argv": _concrete(argv), "world_size": world,
                      "env": _exported(out / "launch" / "launch.sh")})
    for counts, vpp in PIPELINE_SPLITS:  # the pipeline split flags test_launcher.py emits
        run, plan, cluster = dense_plan(list(counts), vpp=vpp)
        cases.append({"name": f"split/{counts}/vpp{vpp}", "argv": args_of(render_launch_files(run, plan, cluster)),
                      "world_size": plan.world_size})
    for tp, ovl in EP_OVERLAP_CASES:  # CUDA_DEVICE_MAX_CONNECTIONS as launch.sh exports it with the EP overlap
        files, world = ep_overlap_launch(tp, ovl)
        argv, _ = _upstream_only(args_of(files))
        cases.append({"name": f"ep-overlap/tp{tp}/{ovl}", "argv": _concrete(argv), "world_size": world,
                      "env": _exported_text(files["launch.sh"])})
    with tempfile.TemporaryDirectory() as tmp:  # gpt-oss from its config.json: windows and clamp written back
        files, world = hf_config_launch(GPT_OSS_120B, "B200:64", {"tp": 1, "pp": 4, "ep": 8, "mbs": 1, "gbs": 1280,
                                                                 "seq": 4096}, tmp)
    argv, _ = _upstream_only(args_of(files))
    cases.append({"name": "hf/gpt-oss-120b", "argv": _concrete(argv), "world_size": world,
                  "env": _exported_text(files["launch.sh"])})
    for cluster, arch in ARCH_CASES.items():
        run, plan, cm = flags_cost_model(TP2_FLAGS, cluster)
        files = render_launch_files(run, plan, cm.cluster)
        cases.append({"name": f"arch/{cluster}", "argv": _concrete(args_of(files)), "world_size": plan.world_size,
                      "env": _exported_text(files["launch.sh"]), "arch": arch})
        if arch >= 10:  # the same launch judged as if on Hopper: refused for the unset variable
            cases.append({**cases[-1], "name": f"arch/{cluster}/as-hopper", "arch": 9})
    for name, (argv, world) in CONTROLS.items():
        cases.append({"name": f"control/{name}", "argv": argv, "world_size": world,
                      "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}})
    return validate(cases)


@pytest.mark.parametrize("golden", ["dense_megatron", "moe_megatron"])
def test_golden_launchers_pass_megatrons_validator(golden):
    r = results()[f"golden/{golden}"]
    assert r["ok"], r["error"]


@pytest.mark.parametrize("tp,overlap", EP_OVERLAP_CASES)
def test_ep_overlap_launches_pass_megatrons_validator(tp, overlap):
    """Megatron accepts the flags and the CUDA_DEVICE_MAX_CONNECTIONS launch.sh exports with and without the EP
    overlap (32 with it, also at TP 2, where Megatron only warns; 1 without it, which it requires at TP 2)."""
    r = results()[f"ep-overlap/tp{tp}/{overlap}"]
    assert r["ok"], r["error"]


@pytest.mark.parametrize("cluster", list(ARCH_CASES))
def test_tp_launches_set_max_connections_as_megatron_asks_on_each_architecture(cluster):
    """Megatron accepts a TP 2 launch at its GPUs' own compute capability (Blackwell: no CUDA_DEVICE_MAX_CONNECTIONS
    exported, none asked; Hopper: 1 exported, 1 asked); the Blackwell launch judged as Hopper is refused, so the
    check can fail."""
    r = results()[f"arch/{cluster}"]
    assert r["ok"], r["error"]
    if ARCH_CASES[cluster] >= 10:
        hopper = results()[f"arch/{cluster}/as-hopper"]
        assert not hopper["ok"] and "CUDA_DEVICE_MAX_CONNECTIONS" in hopper["error"], hopper


def test_gpt_oss_from_its_config_launches_with_its_windows_and_clamp_and_megatron_accepts_them():
    """A plan of gpt-oss-120b read from its HuggingFace config.json writes the sliding-window layers and the clamp the
    cost model prices (--window-size 127,0, --window-attn-skip-freq 2, --activation-func-clamp-value 7.0), and
    Megatron's validator accepts the launch."""
    r = results()["hf/gpt-oss-120b"]
    assert r["ok"], r["error"]
    with tempfile.TemporaryDirectory() as tmp:
        files, _ = hf_config_launch(GPT_OSS_120B, "B200:64", {"tp": 1, "pp": 4, "ep": 8, "mbs": 1, "gbs": 1280,
                                                             "seq": 4096}, tmp)
    argv = args_of(files)
    for flag, value in (("--window-size", "127,0"), ("--window-attn-skip-freq", "2"),
                        ("--activation-func-clamp-value", "7.0")):
        assert argv[argv.index(flag) + 1] == value, flag


@pytest.mark.parametrize("name", NAMES)
def test_every_emitted_corpus_launcher_passes_megatrons_validator(name):
    """The flags launch.sh passes (megatron_args.txt), fork-only flags aside, are accepted by
    Megatron's parser, validate_args, the config classes, the micro-batch calculator and the
    process-group setup."""
    r = results()[f"corpus/{name}"]
    assert r["ok"], r["error"]


@pytest.mark.parametrize("counts, vpp", PIPELINE_SPLITS)
def test_emitted_pipeline_splits_pass_megatrons_validator(counts, vpp):
    """Uniform, first/last-stage and layout splits (with interleaving too), as the launcher emits
    them, are accepted by Megatron, layout checks of TransformerConfig included."""
    r = results()[f"split/{counts}/vpp{vpp}"]
    assert r["ok"], r["error"]


def test_megatron_refuses_a_typo_and_so_does_the_planner():
    r = results()["control/typo --num-expert"]
    assert not r["ok"] and "unrecognized arguments: --num-expert" in r["error"]
    with pytest.raises(PlannerInputError, match="did you mean --num-experts"):
        parse_megatron_flags(CONTROLS["typo --num-expert"][0])


@pytest.mark.parametrize("flag", sorted(REMOVED_FLAGS))
def test_megatron_refuses_its_removed_flags_and_so_does_the_planner(flag):
    """Flags Megatron's parser lists but validate_args refuses: a launcher passing one cannot start, so the
    reader stops there too (exit 2, naming the flag and its replacement)."""
    argv, _ = CONTROLS[f"removed {flag}"]
    assert not results()[f"control/removed {flag}"]["ok"]
    with pytest.raises(PlannerInputError) as exc:
        parse_megatron_flags(argv)
    assert exc.value.field == flag and "no longer valid" in str(exc.value)


@pytest.mark.parametrize("flag, good", [(c[0], c[2]) for c in SWITCH_CASES], ids=[c[0] for c in SWITCH_CASES])
def test_megatron_refuses_passed_through_switches_without_their_needs_as_the_planner_does(flag, good):
    """The switch lists tests/test_inputs_flags.py shows the planner refusing (and accepting): Megatron refuses the
    same ones and accepts the same ones."""
    r = results()[f"control/switch {flag} without"]
    assert not r["ok"], flag
    if good is not None:
        r = results()[f"control/switch {flag} with"]
        assert r["ok"], r["error"]


def test_megatron_takes_no_position_embedding_only_with_rope_and_so_does_the_planner():
    assert not results()["control/learned positions with --no-position-embedding"]["ok"]
    with pytest.raises(PlannerInputError, match="--position-embedding-type rope"):
        parse_megatron_flags(CONTROLS["learned positions with --no-position-embedding"][0])
    assert results()["control/rope with --no-position-embedding"]["ok"]
    parse_megatron_flags(CONTROLS["rope with --no-position-embedding"][0])


def test_megatron_refuses_bad_expert_folding_with_the_planners_message():
    """PP4 x EP8 on 8 GPUs: refused by Megatron's process-group setup with the message the
    planner's rule gives."""
    from planner.megatron.rules import expert_violations

    r = results()["control/PP4 x EP8 on 8 GPUs"]
    run = parse_megatron_flags(CONTROLS["PP4 x EP8 on 8 GPUs"][0])
    (violation,) = expert_violations(run.model, tp=1, cp=1, dp=2, ep=8, etp=1, pp=4)
    assert not r["ok"] and violation.message in r["error"]


def test_megatron_and_the_planner_agree_on_the_accounted_vpp_split():
    """Qwen3-235B, TP2 PP8 VPP4 with --account-for-embedding/loss-in-pipeline-split: Megatron
    accepts it (96 / 8 / 4) and so does the planner.  Without the flags validate_args lets it
    pass, but Megatron's model build asserts 94 % 8 == 0 (transformer_block.py); the planner
    refuses it before launch with that assertion's message."""
    assert results()["control/Qwen3-235B TP2 PP8 VPP4 accounted"]["ok"]
    parse_megatron_flags(QWEN3_235B + ACCOUNT)
    assert results()["control/Qwen3-235B TP2 PP8 VPP4 not accounted"]["ok"]  # validation only
    with pytest.raises(PlannerInputError, match="num_layers=94 should be divisible by config.pipeline_model_parallel_size=8"):
        parse_megatron_flags(QWEN3_235B)


def test_megatron_refuses_heads_over_tp_with_the_planners_message():
    r = results()["control/heads over TP"]
    assert not r["ok"] and "num_attention_heads (8) must be a multiple of tensor_model_parallel_size (3)" in r["error"]
    with pytest.raises(PlannerInputError, match=re.escape("num_attention_heads (8) must be a multiple of tensor_model_parallel_size (3)")):
        parse_megatron_flags(CONTROLS["heads over TP"][0])


def test_fork_flags_are_the_only_ones_removed_before_validation():
    """Only flags a fork's parser knows are dropped for upstream's validator (and the planner
    names them as not modelled)."""
    argv = ["--use-fused-rmsnorm", "--patch-tokenizer-type", "Qwen2Tokenizer", "--lr", "1e-4"]
    kept, dropped = _upstream_only(argv)
    assert kept == ["--lr", "1e-4"] and dropped == ["--use-fused-rmsnorm", "--patch-tokenizer-type"]
    assert set(fork_flags_in(argv)) == {"MindSpeed", "Pai-Megatron-Patch"}


def test_bench_removes_only_what_the_cpu_validator_cannot_judge():
    """tools/bench_published.py validates a pick's flags on the CPU validator: the flags that need Transformer Engine
    (absent there) are removed, TE's cross-entropy fusion is checked as native, everything else is kept."""
    from tools.bench_published import upstream_argv

    argv = ["--moe-permute-fusion", "--delay-wgrad-compute", "--overlap-moe-expert-parallel-comm",
            "--cross-entropy-fusion-impl", "te", "--lr", "1e-4"]
    assert upstream_argv(argv) == ["--overlap-moe-expert-parallel-comm", "--cross-entropy-fusion-impl", "native",
                                   "--lr", "1e-4"]
