"""Tests for planner.inputs.script: reading bash launchers written like Megatron's examples."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import PlannerInputError
from planner.inputs.script import parse_launcher_script, read_launcher_script

# Written in the style of Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh
# (arrays per concern, ${X:-default}, positional paths, `torchrun ${ARR[@]} pretrain_gpt.py`).
EXAMPLE = r"""#!/bin/bash

# Runs a Mixtral-style model on several nodes

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
MASTER_ADDR=${MASTER_ADDR:-"localhost"}
MASTER_PORT=${MASTER_PORT:-"6000"}
NNODES=${SLURM_NNODES:-"2"}
NODE_RANK=${RANK:-"0"}
WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))

CHECKPOINT_PATH=$1
TOKENIZER_MODEL=$2
DATA_PATH=$3
STAMP="run $(date +%s)"
LAYERS=32
export HEADS=32

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

MODEL_ARGS=(
    --use-mcore-models
    --disable-bias-linear
    --seq-length 4096
    --max-position-embeddings 32768
    --num-layers ${LAYERS}   # decoder layers
    --hidden-size 4096
    --num-attention-heads $HEADS
    --normalization RMSNorm
    --swiglu
)

MOE_ARGS=(
    --num-experts 8
    --moe-router-topk 2
    --moe-aux-loss-coeff 1e-2
)

DATA_ARGS=(
    --tokenizer-type Llama2Tokenizer
    --tokenizer-model ${TOKENIZER_MODEL}
    --data-path $DATA_PATH
    --split 99990,8,2
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 256
    --lr 1e-4
)
TRAINING_ARGS+=(--bf16 --exit-signal-handler)

LOGGING_ARGS=(
    --log-interval 1 \
    --save "$CHECKPOINT_PATH" \
    --wandb-exp-name "mixtral ${STAMP}"
)

if [ -n "${WANDB_API_KEY}" ]; then
    LOGGING_ARGS+=(
        --wandb-project ${WANDB_PROJECT:-"Mixtral"}
    )
fi

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${MOE_ARGS[@]} \
    "${DATA_ARGS[@]}" \
    ${TRAINING_ARGS[@]} \
    ${LOGGING_ARGS[@]} \
    --tensor-model-parallel-size 2 --extra 'a b' --ws=$WORLD_SIZE 2>&1 | tee log.txt
echo finished
"""


def _flag_value(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_example_script_flags_resolve_variables_and_arrays():
    """Arrays, ${X}, $X, ${X:-default}, += and quoting expand to the flags bash would pass."""
    s = parse_launcher_script(EXAMPLE)
    f = s.megatron_flags
    assert s.entry_script == "pretrain_gpt.py"
    assert s.launcher == ["torchrun"]
    assert _flag_value(f, "--num-layers") == "32"
    assert _flag_value(f, "--num-attention-heads") == "32"
    assert _flag_value(f, "--moe-aux-loss-coeff") == "1e-2"
    assert _flag_value(f, "--split") == "99990,8,2"
    assert _flag_value(f, "--tensor-model-parallel-size") == "2"
    assert "--bf16" in f and "--exit-signal-handler" in f  # from TRAINING_ARGS+=(...)
    assert _flag_value(f, "--extra") == "a b"  # single-quoted value stays one word
    assert f[-1] == "--ws=16"  # $(($GPUS_PER_NODE*$NNODES)) evaluated: 8*2
    assert "2>&1" not in f and "tee" not in f  # redirection and pipeline are not flags
    assert "#" not in " ".join(f)  # the trailing comment is dropped


def test_example_script_launcher_args_env_and_preamble():
    """torchrun's own args, the variables, and the lines before the launch command are kept."""
    s = parse_launcher_script(EXAMPLE)
    assert s.launcher_args == [
        "--nproc_per_node", "8", "--nnodes", "2", "--node_rank", "0",
        "--master_addr", "localhost", "--master_port", "6000",
    ]  # fmt: skip
    assert s.world_size == 16
    assert s.env["MASTER_ADDR"] == "localhost"
    assert s.env["WORLD_SIZE"] == "16"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in s.exported and "HEADS" in s.exported
    assert "GPUS_PER_NODE" not in s.exported
    assert s.preamble_lines[0] == ""  # the shebang is dropped, the rest kept as written
    assert "CHECKPOINT_PATH=$1" in s.preamble_lines
    assert s.lines[s.launch_start_line - 1].startswith("torchrun ")
    assert s.launch_arrays[0] == "DISTRIBUTED_ARGS"
    assert s.flag_arrays[s.megatron_flags.index("--num-layers")] == "MODEL_ARGS"
    assert s.flag_arrays[s.megatron_flags.index("--tensor-model-parallel-size")] is None


def test_unresolvable_parts_stay_literal():
    """Positional parameters and $(cmd) stay as text naming the variable, and are reported."""
    s = parse_launcher_script(EXAMPLE)
    f = s.megatron_flags
    assert _flag_value(f, "--data-path") == "${DATA_PATH}"
    assert _flag_value(f, "--tokenizer-model") == "${TOKENIZER_MODEL}"
    assert _flag_value(f, "--save") == "${CHECKPOINT_PATH}"
    # the array element is one word; the launch line's unquoted ${LOGGING_ARGS[@]} splits it, as bash does
    assert "mixtral ${STAMP}" in s.arrays["LOGGING_ARGS"]
    i = f.index("--wandb-exp-name")
    assert f[i + 1 : i + 3] == ["mixtral", "${STAMP}"]
    assert s.env["STAMP"] == "run $(date +%s)"
    assert s.env["CHECKPOINT_PATH"] == "$1"
    assert "$(date +%s)" in s.unresolved and "${DATA_PATH}" in s.unresolved
    assert any("literal" in w for w in s.warnings)


def test_conditional_block_not_evaluated_but_recorded():
    """Flags appended inside an if-block are not in the flag list; the block is recorded."""
    s = parse_launcher_script(EXAMPLE)
    assert "--wandb-project" not in s.megatron_flags
    (blk,) = s.conditional_blocks
    assert blk.arrays == ["LOGGING_ARGS"]
    assert s.lines[blk.start_line - 1].startswith("if [")
    assert s.lines[blk.end_line - 1].strip() == "fi"


def test_array_statements_are_located():
    """Top-level assignments of the arrays the launch command uses are found with line spans."""
    s = parse_launcher_script(EXAMPLE)
    spans = {name: (a, b) for a, b, name in s.array_statements if name == "MODEL_ARGS"}
    a, b = spans["MODEL_ARGS"]
    assert s.lines[a - 1] == "MODEL_ARGS=(" and s.lines[b - 1] == ")"


def test_python_m_torch_distributed_run_and_inline_flags():
    """`python -m torch.distributed.run` is a launcher; --flag=value and escapes are kept."""
    text = (
        "N=4\n"
        "python3 -m torch.distributed.run --nproc-per-node=$N --nnodes 1 \\\n"
        "  /opt/Megatron-LM/pretrain_gpt.py --num-layers=\"$N\" --name \"a\\\"b\" --p '$HOME' -x\n"
    )
    s = parse_launcher_script(text)
    assert s.launcher == ["python3", "-m", "torch.distributed.run"]
    assert s.launcher_args == ["--nproc-per-node=4", "--nnodes", "1"]
    assert s.entry_script == "/opt/Megatron-LM/pretrain_gpt.py"
    assert s.megatron_flags == ["--num-layers=4", "--name", 'a"b', "--p", "$HOME", "-x"]
    assert s.world_size == 4
    assert s.unresolved == []  # '$HOME' was single-quoted: literal, not a reference


def test_plain_python_entry_and_array_element_forms():
    """`python train.py`, ${ARR[*]}, ${#X}, ${X:+word} and `declare -a` are understood."""
    text = (
        "declare -a A=(--a 1 \"--b\" 'x y')\n"
        "W=abcd\n"
        "python train.py ${A[*]} --len ${#W} --plus ${W:+yes} --none ${UNSET:+no}x --first ${A[0]}\n"
    )
    s = parse_launcher_script(text)
    assert s.entry_script == "train.py"
    assert s.world_size == 1
    assert s.megatron_flags == ["--a", "1", "--b", "x", "y", "--len", "4", "--plus", "yes", "--none", "x", "--first", "--a"]


def test_default_assignment_and_empty_quotes():
    """${X:=v} assigns, "" is an empty argument, unquoted empty expansions vanish."""
    text = 'E=""\ntorchrun pretrain_gpt.py --x ${Y:=7} --y $Y --z "" $E --w "$E"\n'
    s = parse_launcher_script(text)
    assert s.megatron_flags == ["--x", "7", "--y", "7", "--z", "", "--w", ""]


def test_no_entry_script_is_an_error_naming_the_option():
    """A script without a python entry is refused with a message naming --megatron-script."""
    with pytest.raises(PlannerInputError) as err:
        parse_launcher_script("#!/bin/bash\necho hello\nsrun hostname\n")
    assert err.value.field == "--megatron-script"
    assert "pretrain_gpt.py" in str(err.value)


def test_missing_file_names_the_option(tmp_path):
    """A missing script file is a PlannerInputError naming --megatron-script."""
    with pytest.raises(PlannerInputError) as err:
        read_launcher_script(tmp_path / "nope.sh")
    assert err.value.field == "--megatron-script"


def test_script_flags_feed_the_flag_parser():
    """The flags read from the example parse into a MegatronRun with the script's model shape."""
    from planner.inputs.megatron_flags import parse_megatron_flags

    s = parse_launcher_script(EXAMPLE)
    run = parse_megatron_flags(s.megatron_flags + ["--vocab-size", "32000"])
    assert run.model.num_layers == 32 and run.model.num_experts == 8
    assert run.model.add_bias_linear is False
    assert run.parallel.tp == 2
    assert "--data-path" in run.passthrough


_ALPHABET = st.sampled_from(list("abcXY_=$(){}[]@*#:-+\"'\\ \n;|&<>0123456789") + ["torchrun ", "python ", ".py ", "--a "])


@settings(max_examples=150, deadline=None)
@given(st.lists(_ALPHABET, max_size=60).map("".join))
def test_arbitrary_text_never_crashes(text):
    """Any text either parses or raises PlannerInputError: never another exception."""
    try:
        s = parse_launcher_script(text)
    except PlannerInputError:
        return
    assert isinstance(s.megatron_flags, list)


def test_launch_inside_a_block_cuts_the_preamble_before_the_block():
    """A torchrun inside an if-block is found; the preamble ends before the block (no dangling `if`)."""
    text = "A=1\nif [ -n \"$X\" ]; then\n  torchrun pretrain_gpt.py --a $A\nfi\n"
    s = parse_launcher_script(text)
    assert s.megatron_flags == ["--a", "1"]
    assert s.preamble_lines == ["A=1"]
    assert s.launch_start_line == 2
    assert any("block" in w for w in s.warnings)
