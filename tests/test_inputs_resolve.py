"""resolve_run: one source of truth per run, overrides on top (planner/inputs/resolve.py)."""

from __future__ import annotations

import json

import pytest

from planner.errors import PlannerInputError
from planner.inputs.resolve import parse_recompute, resolve_run
from planner.schemas.plan import Recompute

SMALL_MOE = (
    "--num-layers 8 --hidden-size 256 --num-attention-heads 8 --vocab-size 1000 --seq-length 1024 "
    "--max-position-embeddings 1024 --num-experts 8 --moe-router-topk 2 --disable-bias-linear "
    "--micro-batch-size 1 --lr 3e-4 --data-path '/data/my corpus' --bf16"
)


def test_exactly_one_source():
    """No source, or two sources, is an error that names the three options."""
    with pytest.raises(PlannerInputError) as exc:
        resolve_run()
    assert "--model" in exc.value.field and "--megatron-args" in exc.value.field and "--megatron-script" in exc.value.field
    with pytest.raises(PlannerInputError, match="exactly one"):
        resolve_run(model="mixtral-s", megatron_args="--num-layers 2")


def test_preset_with_parallel_overrides():
    """`--model PRESET --tp 2 --pp 4 ...`: overrides land on the preset; MoE with TP>1 gets SP."""
    run = resolve_run(
        model="mixtral-s",
        overrides={"tp": 2, "pp": 4, "ep": 8, "etp": 1, "vpp": 2, "mbs": 2, "gbs": 256, "seq": 8192,
                   "recompute": "full-block:2", "cp": None},
    )  # fmt: skip
    p, t, m = run.parallel, run.training, run.model
    assert (p.tp, p.pp, p.ep, p.expert_tp, p.vpp, p.cp) == (2, 4, 8, 1, 2, 1)
    assert (t.micro_batch_size, t.global_batch_size) == (2, 256)
    assert m.seq_length == 8192 and m.max_position_embeddings == 32768
    assert p.recompute == Recompute.full("block", 2)
    assert p.sequence_parallel is True
    assert run.passthrough == ()


def test_moe_tp_without_sp_is_refused_when_explicit():
    """Asking for no sequence parallelism on a MoE model with TP>1 is refused (Megatron needs it)."""
    with pytest.raises(PlannerInputError, match="--sequence-parallel"):
        resolve_run(model="mixtral-s", overrides={"tp": 2, "sequence_parallel": False})
    dense = resolve_run(model="llama2-7b", overrides={"tp": 2, "sequence_parallel": False})
    assert dense.parallel.sequence_parallel is False


def test_seq_override_raises_max_positions():
    """A sequence beyond the model's max_position_embeddings raises that too (RoPE table size)."""
    run = resolve_run(model="llama2-7b", overrides={"seq": 8192})
    assert run.model.seq_length == 8192 and run.model.max_position_embeddings == 8192


def test_layout_override_and_pp_change():
    """A layout override sets per-stage layers; changing PP drops a layout written for the old PP."""
    run = resolve_run(model="llama2-7b", overrides={"pp": 4, "layout": "Et*7|t*8|t*8|t*9L"})
    assert run.parallel.layout == ("E" + "t" * 7, "t" * 8, "t" * 8, "t" * 9 + "L")
    assert run.parallel.stage_layers(32) == [7, 8, 8, 9]
    args = SMALL_MOE + " --global-batch-size 16 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Ettt|tttttL'"
    assert resolve_run(megatron_args=args).parallel.layout == ("Ettt", "tttttL")
    moved = resolve_run(megatron_args=args, overrides={"pp": 4})
    assert moved.parallel.layout is None and moved.parallel.stage_layers(8) == [2, 2, 2, 2]
    with pytest.raises(PlannerInputError) as exc:
        resolve_run(model="llama2-7b", overrides={"pp": 4, "layout": "Et*7|t*8|t*8|t*8L"})
    assert exc.value.field == "--pipeline-model-parallel-layout"


def test_megatron_args_string_keeps_passthrough_and_derives_gbs():
    """A flag string is split like bash (quotes kept together); missing GBS becomes mbs*DP from the world size."""
    run = resolve_run(megatron_args=SMALL_MOE + " --tensor-model-parallel-size 2", world_size=16)
    assert run.passthrough == ("--lr", "3e-4", "--data-path", "/data/my corpus")
    assert run.training.global_batch_size == 1 * (16 // 2)
    assert run.parallel.sequence_parallel is True  # MoE + TP 2
    with pytest.raises(PlannerInputError, match="--global-batch-size"):
        resolve_run(megatron_args=SMALL_MOE)
    with pytest.raises(PlannerInputError, match="--megatron-args"):
        resolve_run(megatron_args=SMALL_MOE + " --data-path 'unterminated")


def test_quoted_bash_layout_from_measured_runs():
    """The CSV's layout strings survive shell quoting in a flag string."""
    args = (
        "--num-layers 94 --hidden-size 4096 --num-attention-heads 64 --vocab-size 151936 --global-batch-size 256 "
        "--pipeline-model-parallel-size 8 --pipeline-model-parallel-layout \"Et*2|(t*3|)*30t*2L\""
    )
    run = resolve_run(megatron_args=args)
    assert run.parallel.stage_layers(94) == [11, 12, 12, 12, 12, 12, 12, 11]


def test_hf_config_path_and_directory(tmp_path):
    """`model` may be a HuggingFace config.json or the directory holding it; GBS comes from overrides."""
    cfg = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 1024,
        "intermediate_size": 3584, "num_hidden_layers": 4, "num_attention_heads": 16,
        "num_key_value_heads": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
        "vocab_size": 32000, "max_position_embeddings": 2048,
    }  # fmt: skip
    d = tmp_path / "tiny-mixtral"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    run = resolve_run(model=str(d / "config.json"), overrides={"gbs": 32})
    assert run.model.name == "tiny-mixtral" and run.model.num_experts == 4 and run.model.seq_length == 2048
    assert run.training.global_batch_size == 32 and run.training.micro_batch_size == 1
    run = resolve_run(model=str(d), world_size=8)
    assert run.training.global_batch_size == 1024
    # a HF config states no batch: the default, printed as assumed with the flag that sets it
    assert any(a.name == "global batch size" and a.value == 1024 and a.flag == "--gbs" for a in run.assumed)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PlannerInputError, match="not valid JSON"):
        resolve_run(model=str(tmp_path / "bad.json"))


def test_override_validation():
    """Unknown override keys and bad values are named."""
    with pytest.raises(PlannerInputError, match="allowed"):
        resolve_run(model="llama2-7b", overrides={"dp": 2})
    with pytest.raises(PlannerInputError) as exc:
        resolve_run(model="llama2-7b", overrides={"tp": 0})
    assert exc.value.field == "--tp"
    with pytest.raises(PlannerInputError) as exc:
        resolve_run(model="llama2-7b", overrides={"tp": 3})
    assert exc.value.field == "--tensor-model-parallel-size"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("none", Recompute()),
        ("selective", Recompute.selective()),
        ("selective:layernorm+moe_act", Recompute.selective(("layernorm", "moe_act"))),
        ("full", Recompute.full("uniform", 1)),
        ("full-block:3", Recompute.full("block", 3)),
        ("full-block:0", Recompute.full("block", 0)),
        ("full-uniform:2", Recompute.full("uniform", 2)),
        ("full:block:4", Recompute.full("block", 4)),
    ],
)
def test_recompute_strings(text, expected):
    """Every documented recompute spelling maps to the matching Recompute."""
    assert parse_recompute(text) == expected


@pytest.mark.parametrize("text", ["full-block", "full-uniform:0", "partial", "selective:everything", "full-block:x"])
def test_bad_recompute_strings(text):
    """Bad recompute spellings raise PlannerInputError naming --recompute."""
    with pytest.raises(PlannerInputError) as exc:
        parse_recompute(text)
    assert exc.value.field == "--recompute"


def test_megatron_script(tmp_path):
    """A bash launcher's pretrain_gpt.py flags are parsed like --megatron-args."""
    pytest.importorskip("planner.inputs.script")
    script = tmp_path / "train_moe.sh"
    script.write_text(
        "#!/bin/bash\n"
        "GPUS_PER_NODE=8\n"
        "MODEL_ARGS=(\n  --num-layers 8\n  --hidden-size 256\n  --num-attention-heads 8\n"
        "  --num-experts 8 --disable-bias-linear\n)\n"
        "TRAIN_ARGS=\"--micro-batch-size 1 --global-batch-size 64 --seq-length 1024 --vocab-size 1000\"\n"
        "torchrun --nproc_per_node $GPUS_PER_NODE pretrain_gpt.py \\\n"
        "  \"${MODEL_ARGS[@]}\" $TRAIN_ARGS --lr 1e-4 \\\n"
        "  --tensor-model-parallel-size 2\n"
    )
    run = resolve_run(megatron_script=str(script), overrides={"ep": 4})
    assert run.model.name == "train_moe" and run.model.num_experts == 8
    assert (run.parallel.tp, run.parallel.ep, run.training.global_batch_size) == (2, 4, 64)
    assert run.parallel.sequence_parallel is True
    assert run.passthrough == ("--lr", "1e-4")
    with pytest.raises(PlannerInputError, match="not found"):
        resolve_run(megatron_script=str(tmp_path / "missing.sh"))


def _srun_job(tmp_path, prelude: str, srun: str):
    """A job of one node running a torchrun of 8 under `srun SRUN`, the script setting `prelude` above it."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=8\n"
                      f"{prelude}\nsrun {srun} torchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py {SMALL_MOE} "
                      "--global-batch-size 8\n")
    notes: list[str] = []
    return resolve_run(megatron_script=str(script), notes=notes), notes


EXPORTED = "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False NCCL_ALGO=Ring"


@pytest.mark.parametrize("prelude, srun, where", [
    (EXPORTED, "--export=NONE", "`srun --export=NONE`"),
    (EXPORTED, "--export=HOME,PATH", "`srun --export=HOME,PATH`"),  # a list without ALL
    (EXPORTED + "\nexport SLURM_EXPORT_ENV=NONE", "", "SLURM_EXPORT_ENV=NONE in srun's environment"),
    (EXPORTED + "\nexport SRUN_EXPORT_ENV=HOME", "", "SRUN_EXPORT_ENV=HOME in srun's environment"),
    ("#SBATCH --export=NONE\n" + EXPORTED, "", "`#SBATCH --export=NONE`"),  # the job's, srun's by SLURM_EXPORT_ENV
])
def test_settings_srun_export_keeps_from_the_trainer_are_read_as_not_set(tmp_path, prelude, srun, where):
    """srun's --export (NONE, or a list without ALL; its own, SRUN_/SLURM_EXPORT_ENV, the job's #SBATCH --export)
    keeps the script's exported variables from the task (srun(1) --export; planner/inputs/srun_export.py): the
    allocator setting and NCCL_ALGO never reach the trainer, so they are not priced or recorded as set (they were:
    expandable segments off, NCCL_ALGO unpriced), and a note says which --export hides them.  The trainer then runs
    torch's default allocator (expandable segments off), which the launch.sh's export around srun cannot change
    either: priced so, not as the unstated default (expandable segments on, which reserves less), with a note."""
    pytest.importorskip("planner.inputs.script")
    run, notes = _srun_job(tmp_path, prelude, srun)
    assert run.training.expandable_segments is False and "NCCL_ALGO" not in run.training.unpriced_flags
    assert not any(a.name == "allocator" for a in run.assumed)
    allocator = [n for n in notes if "gives the trainer no allocator setting" in n]
    assert len(allocator) == 1 and where in allocator[0] and "torch's default" in allocator[0], notes
    hidden = [n for n in notes if "keeps from the trainer" in n]
    assert len(hidden) == 1 and "PYTORCH_CUDA_ALLOC_CONF, NCCL_ALGO" in hidden[0], notes
    assert where in hidden[0], hidden
    assert not any(n.startswith("NCCL_ALGO=") for n in notes), notes


@pytest.mark.parametrize("srun", ["", "--export=ALL", "--export=ALL,NCCL_DEBUG=INFO"])
def test_srun_passing_the_environment_keeps_the_allocator_assumption(tmp_path, srun):
    """srun passing its whole environment (no --export, ALL): the planner's launch.sh exports the allocator setting
    the estimate assumes around srun and it reaches the trainer, so the unstated assumption stands, with no note."""
    pytest.importorskip("planner.inputs.script")
    run, notes = _srun_job(tmp_path, "", srun)
    assert run.training.expandable_segments is None
    assert any(a.name == "allocator" and a.value == "expandable_segments:True" for a in run.assumed)
    assert not any("no allocator setting" in n for n in notes), notes


@pytest.mark.parametrize("prelude, srun, expandable, recorded", [
    # srun's own list sets them for the task (the script exports neither)
    ("", "--export=ALL,PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False,NCCL_ALGO=Ring", False, True),
    ("", "--export=PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", True, False),
    # with ALL, srun's environment takes precedence over the list's value (srun(1) --export)
    (EXPORTED, "--export=ALL,PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", False, True),
    # a variable the list names is passed from srun's environment
    (EXPORTED, "--export=PYTORCH_CUDA_ALLOC_CONF,NCCL_ALGO", False, True),
])
def test_settings_srun_export_gives_the_trainer_are_read_as_set(tmp_path, prelude, srun, expandable, recorded):
    """A variable srun's --export list sets (`NAME=value`) or names reaches the task: priced as set (the list's
    values were not read: no allocator setting, no NCCL_ALGO), and no note says it is hidden."""
    pytest.importorskip("planner.inputs.script")
    run, notes = _srun_job(tmp_path, prelude, srun)
    assert run.training.expandable_segments is expandable
    assert ("NCCL_ALGO" in run.training.unpriced_flags) is recorded
    assert not any(a.name == "allocator" for a in run.assumed)
    assert not any("keeps from the trainer" in n for n in notes), notes


@pytest.mark.parametrize("env, recorded", [
    ("export NVTE_ALLOW_NONDETERMINISTIC_ALGO=0", ("NVTE_ALLOW_NONDETERMINISTIC_ALGO=0",)),
    ("export NVTE_ALLOW_NONDETERMINISTIC_ALGO=1", ()),
    ("export NCCL_ALGO=Ring", ("NCCL_ALGO",)),
    ("NCCL_ALGO=Ring  # set, never exported: torchrun does not see it", ()),
])
def test_a_script_environment_that_changes_time_unpriced_is_recorded(tmp_path, env, recorded):
    """Environment settings Megatron's deterministic mode makes (megatron/training/determinism.py: TE's
    deterministic attention backward, NCCL's algorithm pinned) change time the cost model does not price: the run
    records them beside its unpriced flags, so the evidence compares them with the calibration runs', and a note
    names them."""
    pytest.importorskip("planner.inputs.script")
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\n{env}\ntorchrun --nproc_per_node 8 pretrain_gpt.py {SMALL_MOE} "
                      "--global-batch-size 8 --deterministic-mode\n")
    notes: list[str] = []
    run = resolve_run(megatron_script=str(script), notes=notes)
    assert run.training.unpriced_flags == tuple(sorted(("--deterministic-mode",) + recorded))
    named = env.removeprefix("export ").split("=")[0]  # the variable's own note (other notes may come too)
    assert any(n.startswith(f"{named}=") and "not modelled" in n for n in notes) == bool(recorded)
