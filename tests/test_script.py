"""Tests for planner.inputs.script: reading bash launchers written like Megatron's examples."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import PlannerInputError
from planner.inputs.script import parse_launcher_script, read_launcher_script
from planner.inputs.shell.interp import Interp

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
    assert s.site is not None and s.site.via == "direct" and s.site.word == "torchrun"
    assert s.lines[s.site.line - 1].startswith("torchrun ")
    assert s.text[s.site.offset :].startswith("torchrun ${DISTRIBUTED_ARGS[@]}")


def test_unresolvable_parts_stay_literal():
    """Positional parameters and $(cmd) stay as text naming the variable, and are reported."""
    s = parse_launcher_script(EXAMPLE)
    f = s.megatron_flags
    assert _flag_value(f, "--data-path") == "$3"  # DATA_PATH=$3, and no arguments were given
    assert _flag_value(f, "--tokenizer-model") == "$2"
    assert _flag_value(f, "--save") == "$1"
    # the array element is one word; the launch line's unquoted ${LOGGING_ARGS[@]} splits it, as bash does
    assert "mixtral run $(date +%s)" in s.arrays["LOGGING_ARGS"]
    i = f.index("--wandb-exp-name")
    # unquoted: split as bash does, the date it prints one word (not "$(date" and "+%s)")
    assert f[i + 1 : i + 4] == ["mixtral", "run", "$(date +%s)"] and f[i + 4].startswith("--")
    assert s.env["STAMP"] == "run $(date +%s)"
    assert s.env["CHECKPOINT_PATH"] == "$1"
    assert "$(date +%s)" in s.unresolved and "$3" in s.unresolved
    assert any("literal" in w for w in s.warnings)


def test_conditional_block_is_evaluated_and_undecided_reading_reported():
    """The if-block tests a variable the script never sets: read as unset, the block is skipped,
    and the report names the line, the reading and the flags it holds."""
    s = parse_launcher_script(EXAMPLE, path="train.sh")
    assert "--wandb-project" not in s.megatron_flags
    (d,) = s.decisions
    assert d.flags_skipped == ["--wandb-project"] and "WANDB_API_KEY" in d.reason
    assert any(w.startswith("train.sh:") and "--wandb-project" in w and "read as false" in w for w in s.warnings)


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
    flags = s.megatron_flags
    with pytest.raises(PlannerInputError, match="unexpected value 'run'"):  # split as bash splits it
        parse_megatron_flags(flags)
    k = flags.index("--wandb-exp-name")
    tail = flags[flags.index("--tensor-model-parallel-size") :]
    with pytest.raises(PlannerInputError, match="unknown flag"):  # --extra and --ws are no Megatron flags
        parse_megatron_flags(flags[:k] + tail)
    run = parse_megatron_flags(flags[:k] + tail[:2] + ["--vocab-size", "32000"])
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


def test_launch_inside_a_block_is_found_where_it_runs():
    """A torchrun inside an if-block runs when the condition holds; the site is that statement."""
    text = "A=1\nif [ \"$A\" = 1 ]; then\n  torchrun pretrain_gpt.py --a $A\nfi\n"
    s = parse_launcher_script(text)
    assert s.megatron_flags == ["--a", "1"]
    assert s.site.line == 3 and s.decisions == []


# --------------------------------------------------------------------------------------------
# What bash would run: arguments, conditionals, loops, eval, srun strings, source
# --------------------------------------------------------------------------------------------
OPTIONS = r"""#!/bin/bash
TP=1
PP=1
DTYPE=bf16
CKPT=${1:-/ckpt/default}
shift || true
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tp) TP="$2"; shift 2 ;;
    --pp=*) PP="${1#*=}"; shift ;;
    --fp8) DTYPE=fp8; shift ;;
    *) echo "unknown option $1"; exit 1 ;;
  esac
done
PREC=(--bf16)
if [[ "$DTYPE" == fp8 ]]; then
  PREC+=(--fp8-format hybrid --fp8-amax-history-len 1024)
elif [ "$DTYPE" = fp16 ]; then
  PREC=(--fp16)
fi
for extra in --use-flash-attn --no-masked-softmax-fusion; do FLAGS="$FLAGS $extra"; done
torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size $TP \
  --pipeline-model-parallel-size $PP "${PREC[@]}" $FLAGS --save "$CKPT"
"""


def test_arguments_case_loop_and_if_blocks_follow_bash():
    """`-- ARG...` reaches $1 / "$@"; the case loop over options and the if/elif read them."""
    s = parse_launcher_script(OPTIONS, args=["/my/ckpt", "--tp", "4", "--pp=2", "--fp8"])
    assert s.megatron_flags == [
        "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "2",
        "--bf16", "--fp8-format", "hybrid", "--fp8-amax-history-len", "1024",
        "--use-flash-attn", "--no-masked-softmax-fusion", "--save", "/my/ckpt",
    ]  # fmt: skip
    default = parse_launcher_script(OPTIONS)
    assert default.megatron_flags[:4] == ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1"]
    assert "--fp8-format" not in default.megatron_flags and default.megatron_flags[-1] == "/ckpt/default"


def test_exit_before_launch_names_the_line():
    """An option the script refuses makes it exit: the error names the file and line."""
    with pytest.raises(PlannerInputError) as err:
        parse_launcher_script(OPTIONS, args=["/c", "--bogus"], path="opts.sh")
    assert err.value.field == "opts.sh:12" and "exits here" in str(err.value)


def test_eval_of_a_command_string():
    """Pai-Megatron-Patch style: the command is built as a string and run by eval."""
    text = 'A=2\nrun_cmd="torchrun --nnodes $A --nproc_per_node 8 pretrain_gpt.py --x 1 ${EXTRA}"\necho ${run_cmd}\neval ${run_cmd}\n'
    s = parse_launcher_script(text)
    assert s.megatron_flags == ["--x", "1", "${EXTRA}"]
    assert s.site.via == "eval" and s.site.word == "eval" and s.site.line == 4
    assert s.world_size == 16


def test_srun_bash_c_string_and_world_size():
    """srun runs a string through bash -c: the flags inside are read; srun's task counts give
    the world size."""
    text = (
        'CMD="python pretrain_gpt.py --x 1 --y \\"a b\\""\n'
        'srun -N 2 --ntasks-per-node 8 bash -c "cd /work; $CMD"\n'
    )
    s = parse_launcher_script(text)
    assert s.megatron_flags == ["--x", "1", "--y", "a b"]
    assert s.wrapper[:1] == ["srun"] and s.world_size == 16
    assert s.site.via == "string" and s.site.line == 2


def test_source_of_a_file_next_to_the_script(tmp_path):
    """`source common.sh` reads the file next to the script (also through $(dirname $0))."""
    (tmp_path / "common.sh").write_text("MODEL=(--num-layers 4 --hidden-size 64)\nexport NCCL_DEBUG=WARN\n")
    script = tmp_path / "train.sh"
    script.write_text('DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)\nsource "$DIR/common.sh"\n'
                      'torchrun pretrain_gpt.py "${MODEL[@]}"\n')
    s = read_launcher_script(script)
    assert s.megatron_flags == ["--num-layers", "4", "--hidden-size", "64"]
    assert "NCCL_DEBUG" in s.exported


@pytest.mark.parametrize("here", ['"$(dirname "$(readlink -f "$0")")"', '$(dirname $(realpath ${BASH_SOURCE[0]}))',
                                  '$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)'])
def test_the_scripts_directory_through_readlink_or_realpath(tmp_path, here):
    """`SCRIPT_DIR="$(dirname "$(readlink -f "$0")")"` (Megatron-LM examples/post_training/modelopt, NVIDIA's MoE
    model zoo) is the script's directory, as `$(dirname "$0")` is: the file it sources from there is read, its launch
    and flags with it (unread, the script launched nothing the reader could see)."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "arguments.sh").write_text('LAUNCH_SCRIPT="torchrun --nproc_per_node=8"\n'
                                                    'MODEL_ARGS="--num-layers 4 --hidden-size 64"\n')
    script = tmp_path / "finetune.sh"
    script.write_text(f'#!/bin/bash\nSCRIPT_DIR={here}\nsource "${{SCRIPT_DIR}}/conf/arguments.sh"\n'
                      '${LAUNCH_SCRIPT} ${SCRIPT_DIR}/finetune.py ${MODEL_ARGS} --save "${SCRIPT_DIR}/ckpt"\n')
    s = read_launcher_script(script)
    assert s.megatron_flags == ["--num-layers", "4", "--hidden-size", "64", "--save", f"{tmp_path.resolve()}/ckpt"]
    assert s.entry_script == f"{tmp_path.resolve()}/finetune.py" and s.world_size == 8 and not s.unresolved


@pytest.mark.parametrize("cwd", ["`pwd`", "$(pwd)", "$PWD", "${PWD}", '"$PWD"'])
def test_a_file_sourced_from_the_directory_the_script_runs_in(tmp_path, cwd):
    """`. $(pwd)/CONFIG.sh`, backquoted too (Megatron-LM's SC21 scripts, run from their own directory): the file next to
    the script is read, with a note saying so; it was "a file that is not here; put it next to the script" while it
    was there."""
    (tmp_path / "CONFIG.sh").write_text("NUM_LAYERS=24\n")
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/bash\n. {cwd}/CONFIG.sh\ntorchrun pretrain_gpt.py --num-layers $NUM_LAYERS\n")
    s = read_launcher_script(script)
    assert s.megatron_flags == ["--num-layers", "24"]
    assert any("read as the script's directory" in w and "CONFIG.sh read" in w for w in s.warnings), s.warnings


def test_a_branch_read_in_a_sourced_file_names_that_file_and_its_line(tmp_path):
    """A condition the reader cannot decide in a file the script sources (Megatron-LM's modelopt conf/arguments.sh:
    `if [ -z ${LAUNCH_SCRIPT} ]`) is reported at that file's line, with its text, not at the same line number of the
    script (which named a blank line of the wrong file); an `if`, a `case` and a `&&` guard alike."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "arguments.sh").write_text(
        'LAUNCH_SCRIPT="torchrun --nproc_per_node=8"\nif [ -n ${NPROC} ]; then\n    LAUNCH_SCRIPT="torchrun --nproc_per_node=$NPROC"\nfi\n'
        'case "$(cat /etc/size)" in\n    8B) MODEL="--num-layers 32" ;;\nesac\n'
        '[ -f /data/extra ] && EXTRA="--use-flash-attn"\n')
    script = tmp_path / "train.sh"
    script.write_text('#!/bin/bash\n\n\nsource conf/arguments.sh\n'
                      '${LAUNCH_SCRIPT} pretrain_gpt.py --num-layers 4 --hidden-size 64 $MODEL $EXTRA\n')
    s = read_launcher_script(script)
    conf = str((tmp_path / "conf" / "arguments.sh").resolve())
    assert [d.message(s.path) for d in s.decisions] == [
        f"{conf}:2: `if [ -n ${{NPROC}} ]; then` depends on NPROC, which the script does not set (read as unset); "
        "read as true: its branch was taken (kept flags --nproc_per_node)",
        f'{conf}:5: `case "$(cat /etc/size)" in` the word "$(cat /etc/size)" is not known; read as no pattern matched '
        "(skipped flags --num-layers)",
        f"{conf}:8: `[ -f /data/extra ] && EXTRA=\"--use-flash-attn\"` tests a file on the machine that runs the "
        "script (-f /data/extra); read as skipping the command after && (skipped flags --use-flash-attn)"]


def test_text_left_for_bash_inside_a_split_string_stays_one_word(tmp_path):
    """A command's output the reader leaves for bash (`$(date "+%Y.%m.%d-%H.%M.%S")`, which prints one word) inside a
    flag string that is split later (Pai-Megatron-Patch examples/llama3: `mpirun ... bash entry.sh ENTRY "$options"`,
    entry.sh runs `python $*`) stays in its flag's value, not split at its own blank into a stray word that Megatron
    refuses (`unexpected value '"+%Y.%m.%d-%H.%M.%S")' after --tensorboard-dir`)."""
    (tmp_path / "entry.sh").write_text('export RANK=$OMPI_COMM_WORLD_RANK\npython $*\n')
    script = tmp_path / "run.sh"
    script.write_text('#!/bin/bash\nOUT=/out\ncurrent_time=$(date "+%Y.%m.%d-%H.%M.%S")\n'
                      'TB="${OUT}/tensorboard/run_${current_time}"\n'
                      'options=" --num-layers 4 --tensorboard-dir ${TB} --hidden-size 64"\n'
                      'ARR=(--save "$OUT/ckpt_$(hostname -s)")\n'
                      'mpirun -np 8 bash entry.sh pretrain_llama.py "${options}" ${ARR[@]}\n')
    s = read_launcher_script(script)
    assert s.megatron_flags == ["--num-layers", "4", "--tensorboard-dir",
                                '/out/tensorboard/run_$(date "+%Y.%m.%d-%H.%M.%S")', "--hidden-size", "64",
                                "--save", "/out/ckpt_$(hostname -s)"]


@pytest.mark.parametrize("runs", ["source job.sh", "bash job.sh"])
def test_a_name_a_sourced_or_run_file_sets_is_not_the_environments(tmp_path, runs):
    """A variable that a file the script sources or runs sets only in a branch not taken (Pai-Megatron-Patch:
    `if [ $PRETRAIN_CHECKPOINT_PATH != none ]; then load_options="--load ..."; fi`, the file run by a wrapper that sets
    its environment) is empty where it is used, as in bash, not left as text for the environment to fill (which
    reported `${load_options}` as flags the reader could not see)."""
    (tmp_path / "job.sh").write_text('if [ "$CKPT" != none ]; then\n    load_options="--load $CKPT"\nfi\n'
                                     'torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 ${load_options}\n')
    script = tmp_path / "wrap.sh"
    script.write_text(f'#!/bin/bash\nexport CKPT=none\n{runs}\n')
    s = read_launcher_script(script)
    assert s.megatron_flags == ["--num-layers", "4"] and not s.unresolved


def test_the_files_copied_next_to_launch_sh_are_the_files_read(tmp_path):
    """The files the script sources or submits from its directory are copied next to launch.sh as they were read:
    the copy of a file with a command substitution or an eval in it was the last of these (`hostname`), so the job
    that launch.sh's `sbatch job.sh` submitted ran hostname, not training."""
    common = "RUN_ID=$(date +%s)\neval 'MODEL=(--num-layers 4 --hidden-size 64)'\n"
    job = ('#!/bin/bash\nsource common.sh\nexport MASTER_ADDR=$(hostname)\n'
           'srun -N 1 --ntasks-per-node 8 python pretrain_gpt.py "${MODEL[@]}"\n')
    (tmp_path / "common.sh").write_text(common)
    (tmp_path / "job.sh").write_text(job)
    script = tmp_path / "submit.sh"
    script.write_text('#!/bin/bash\ncd "$(dirname "$0")"\nsbatch -N 1 job.sh\n')
    s = read_launcher_script(script)
    assert s.megatron_flags == ["--num-layers", "4", "--hidden-size", "64"]
    assert s.sourced == {"job.sh": job, "common.sh": common}


def test_functions_and_python_m_torch_distributed_run():
    """A function that launches, called with arguments; python -m torch.distributed.run."""
    text = 'go() {\n  python -m torch.distributed.run --nproc_per_node 4 train.py --lr "$1" "${@:2}"\n}\ngo 0.1 --a b\n'
    s = parse_launcher_script(text)
    assert s.launcher == ["python", "-m", "torch.distributed.run"] and s.entry_script == "train.py"
    assert s.megatron_flags[:2] == ["--lr", "0.1"]


def test_undecidable_file_test_is_skipped_and_reported():
    """`[ -f ... ] && X=...` cannot be decided here: the guarded assignment is skipped, said so."""
    text = 'CK=/c\nLOAD=""\n[ -f "$CK/latest" ] && LOAD="--load $CK"\ntorchrun pretrain_gpt.py $LOAD --x 1\n'
    s = parse_launcher_script(text)
    assert s.megatron_flags == ["--x", "1"]
    assert s.decisions[0].flags_skipped == ["--load"] and "file" in s.decisions[0].reason


def test_preprocessing_before_training_is_not_the_launch():
    """A data-preparation python call before torchrun is not mistaken for the training launch."""
    text = "python tools/preprocess_data.py --input x\ntorchrun --nproc_per_node 2 pretrain_gpt.py --y 2\n"
    s = parse_launcher_script(text)
    assert s.megatron_flags == ["--y", "2"]


@pytest.mark.parametrize(
    "text, words",
    [
        ("X=${X:-" * 200 + "}" * 200 + "\ntorchrun train.py", "nested more than"),
        ("x=((\ntorchrun train.py", "syntax error"),
        ("(( 1 + \ntorchrun train.py", "unbalanced"),
        ("( echo\ntorchrun train.py", "not closed"),
        ("while true; do X=1; done\ntorchrun train.py", "never ends"),
        ('A="abc\ntorchrun train.py', 'unterminated "'),
        ("echo $(( 1 + \ntorchrun train.py", "unbalanced $("),
        ('A=' + '$("' * 500 + 'x' + '")' * 500 + "\ntorchrun train.py", "nested more than"),
        ("{ " * 500 + "x; " + "} " * 500 + "\ntorchrun train.py", "nested more than"),
        ("if true; then " * 500 + "x; " + "fi; " * 500 + "\ntorchrun train.py", "nested more than"),
        ("if [ " + "! " * 500 + "a ]; then x; fi\ntorchrun train.py", "nested more than"),
        ("f() { f; }; f\ntorchrun train.py", "nested more than"),
        ('A="eval \\"\\$A\\""; eval "$A"\ntorchrun train.py', "nested more than"),
    ],
)
def test_hostile_scripts_are_refused_with_file_and_line(text, words):
    """Deep nesting, unbalanced brackets and endless loops: one error naming file:line, no hang."""
    with pytest.raises(PlannerInputError) as err:
        parse_launcher_script(text, path="bad.sh")
    assert err.value.field.startswith("bad.sh:") and words in str(err.value)


def test_huge_arithmetic_wraps_like_bash():
    """$((9**9**9)) is 64-bit arithmetic in bash: evaluated at once, wrapped, not a hang."""
    s = parse_launcher_script("torchrun train.py --a $((9**9**9)) --b $(( (1<<62) * 4 )) --c $((7/-2)) --d $((-7%3))\n")
    assert s.megatron_flags == ["--a", "-2123029214124047543", "--b", "0", "--c", "-3", "--d", "-1"]


def test_long_lines_and_long_arrays_are_read():
    """A 2 MB line and an array built over 20,000 lines are read (linear-time lexing/evaluation)."""
    s = parse_launcher_script('A="' + "a" * 2_000_000 + '"\ntorchrun train.py --x "$A"\n')
    assert len(s.megatron_flags[1]) == 2_000_000
    text = "\n".join(f"A+=(--x{i})" for i in range(20_000)) + '\ntorchrun train.py "${A[@]}"\n'
    assert len(parse_launcher_script(text).megatron_flags) == 20_000


@pytest.mark.parametrize("text", [
    "A=(" + " ".join(f"x{i}" for i in range(1000)) + ')\ntorchrun pretrain_gpt.py "${A[@]}"\n',
    "DATA=()\n" + "".join(f"DATA+=(1.0 /data/file_{i})\n" for i in range(500))
    + 'torchrun pretrain_gpt.py --data-path "${DATA[@]}"\n',
], ids=["literal-array", "appended-lines"])
def test_each_array_element_is_expanded_once(text, monkeypatch):
    """A 1,000-element array (a long --data-path list) is expanded once per element: the reader went over the
    script twice (the second time for the launches after the first), and `solve` reads it twice, so a
    200,000-element array took seconds.  Counted, not timed: every word of the script is expanded once."""
    words: list[tuple[int, int]] = []  # (line, offset) of each word expanded
    expand = Interp.expand_fields
    monkeypatch.setattr(Interp, "expand_fields",
                        lambda self, word: words.append((word.line, word.pos)) or expand(self, word))
    s = parse_launcher_script(text)
    assert len(s.megatron_flags) >= 1000
    assert len(words) == len(set(words)) <= 1005, f"{len(words)} expansions of {len(set(words))} words"


def test_break_and_continue_in_loops():
    """`continue` skips the rest of an iteration, `break` ends the loop (also from a nested if)."""
    text = "A=()\nfor i in 1 2 3 4; do\n  if [ $i = 2 ]; then continue; fi\n  A+=(--x$i)\n  if [ $i = 3 ]; then break; fi\ndone\ntorchrun train.py \"${A[@]}\"\n"
    assert parse_launcher_script(text).megatron_flags == ["--x1", "--x3"]


def test_getopts_option_loop():
    """`while getopts "t:p:f" opt; do case $opt in ...` reads the options like bash."""
    text = ('TP=1; PP=1; F=\nwhile getopts "t:p:f" opt; do\n  case $opt in\n    t) TP=$OPTARG ;;\n    p) PP=$OPTARG ;;\n'
            '    f) F=--fp16 ;;\n  esac\ndone\nshift $((OPTIND-1))\ntorchrun train.py --tp $TP --pp $PP $F "$@"\n')
    s = parse_launcher_script(text, args=["-t", "4", "-p2", "-f", "--", "--extra", "1"])
    assert s.megatron_flags == ["--tp", "4", "--pp", "2", "--fp16", "--extra", "1"]


UNREAD_SCRIPT = """#!/bin/bash
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mapfile -t EXTRA < <(echo --lr; echo 1e-4)
torchrun --nproc_per_node 8 pretrain_gpt.py $(cat $HERE/args.txt) "${EXTRA[@]}" --train-iters 10 --mock-data \\
    --tokenizer-type NullTokenizer --vocab-size 32000 --save ${CKPT}
"""


def test_text_only_bash_expands_where_flags_go_is_named(tmp_path):
    """`$(cat args.txt)` and an array the reader cannot fill stand where flags go: the missing-model-flags error names
    them as what may hold the flags (it named only the flags), and a run planned with the flags given says they are
    not read nor priced; a value (${CKPT} after --save) is not among them."""
    from planner.inputs.resolve import resolve_run

    script = tmp_path / "train.sh"
    script.write_text(UNREAD_SCRIPT)
    with pytest.raises(PlannerInputError) as err:
        resolve_run(megatron_script=str(script))
    said = str(err.value)
    assert "(required model shape flags); the command passes $(cat $HERE/args.txt), ${EXTRA[@]} where flags go" in said
    assert "give the flags they hold with --megatron-args" in said and "${CKPT}" not in said
    notes: list[str] = []
    resolve_run(megatron_script=str(script), notes=notes, megatron_args="--num-layers 2 --hidden-size 256 "
                "--num-attention-heads 8 --seq-length 512 --max-position-embeddings 512")
    unread = [n for n in notes if "where flags go" in n]
    assert len(unread) == 1 and "$(cat $HERE/args.txt), ${EXTRA[@]} where" in unread[0], notes
    assert "not read nor priced" in unread[0] and "${CKPT}" not in unread[0]


# ------------------------------------------------------------------------------------------------
# which of the --cluster SLURM_* values a reading may have seen (one read serves every cluster that gives the same)

GEOMETRY_LAUNCH = "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --global-batch-size $GBS\n"


@pytest.mark.parametrize("text, seen", [
    ("GBS=64\n", []),  # nothing of the cluster's
    ("GBS=$((SLURM_NNODES * 32))\n", ["SLURM_NNODES"]),
    ('N=SLURM_NN; M="${N}ODES"; GBS=$((M * 32))\n', ["SLURM_NNODES"]),  # a name computed, then read
    ('N=("${SLURM_NNODES[@]}"); GBS=$((N * 32))\n', ["SLURM_NNODES"]),  # read as an array
    ('N=SLURM_GPUS_; V="${N}ON_NODE"; if [[ -v $V ]]; then GBS=64; else GBS=32; fi\n', ["SLURM_GPUS_ON_NODE"]),
    ('P=SLURM; eval "GBS=\\$((\\${${P}_JOB_NUM_NODES:-1} * 32))"\n', ["SLURM_JOB_NUM_NODES"]),  # in an eval string
    ("#SBATCH --nodes=2\nGBS=$((SLURM_NNODES * 32))\n", []),  # the script's own count, whatever the cluster
])
def test_cluster_reads_names_the_cluster_values_a_reading_may_have_seen(text, seen):
    """`cluster_reads`: the SLURM_* values --cluster gives that the reading may have seen, named in its text or
    looked up by a computed name, not those its own #SBATCH lines state; a reading that saw none of them is the
    same on every cluster (reads_alike), so estimate reuses it on the GPUs the launch uses."""
    from planner.inputs.cluster import parse_cluster
    from planner.inputs.script import cluster_geometry, reads_alike
    from planner.profile_tables import ProfileSet

    profiles = ProfileSet.load()
    whole, part, narrow = (parse_cluster(c, profiles) for c in ("H100:16", "H100:8", "H100:1x4"))
    script = parse_launcher_script("#!/bin/bash\n" + text + GEOMETRY_LAUNCH, scheduler=cluster_geometry(whole))
    assert script.cluster_reads == seen
    assert reads_alike(script, whole, whole)
    nodes_seen = bool({"SLURM_NNODES", "SLURM_JOB_NUM_NODES"} & set(seen))
    assert reads_alike(script, whole, part) == (not nodes_seen)  # 2 nodes against 1 (8 GPUs each)
    assert reads_alike(script, part, narrow) == (seen != ["SLURM_GPUS_ON_NODE"])  # 1 node of 8 GPUs against 4


def test_cluster_reads_covers_every_variable_the_cluster_gives():
    """CLUSTER_GEOMETRY_VARS, which the reader watches, are the names cluster_geometry gives."""
    from planner.inputs.cluster import parse_cluster
    from planner.inputs.script import cluster_geometry
    from planner.inputs.shell.builtins import CLUSTER_GEOMETRY_VARS
    from planner.profile_tables import ProfileSet

    given = {v.name for v in cluster_geometry(parse_cluster("H100:16", ProfileSet.load()))}
    assert given == set(CLUSTER_GEOMETRY_VARS)
