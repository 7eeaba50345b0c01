"""Reading real scripts (issue 20 item 5, issue 23 item 5): what bash would run is read, what it would
not run is refused, and every message points at the fault.

Where bash itself can say what a script passes, it is the oracle: the script runs under bash with a
stub `torchrun` that records its arguments, and the reader must read the same flags.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from planner.errors import PlannerInputError, ReadingTimeLimitError
from planner.inputs.resolve import resolve_run
from planner.inputs.script import parse_launcher_script, read_launcher_script
from planner.inputs.shell.builtins import SchedulerValue

from helpers.corpus import CORPUS_DIR
from helpers.launch import cluster_of

MODEL = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 "
         "--micro-batch-size 1 --vocab-size 1000 --bf16")
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def bash_flags(text: str, tmp_path: Path, args: tuple[str, ...] = ()) -> list[str]:
    """The arguments bash passes to pretrain_gpt.py when it runs `text` (torchrun is a stub)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    out = tmp_path / "argv"
    stub = bindir / "torchrun"
    stub.write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$ARGV_OUT"\n')
    stub.chmod(0o755)
    script = tmp_path / "s.sh"
    script.write_text(text)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "ARGV_OUT": str(out), "HOME": str(tmp_path)}
    subprocess.run(["bash", str(script), *args], env=env, cwd=tmp_path, capture_output=True, timeout=30)
    words = out.read_bytes().decode().split("\0")[:-1]
    return words[words.index("pretrain_gpt.py") + 1:]


# ------------------------------------------------------------------ what bash would run is read
BASH_AGREES = {
    "declare -i": "declare -i TP=2*2\nlocal_gbs() { local -i n=$1*8; echo $n; }\n"
                  "torchrun pretrain_gpt.py --tp $TP --gbs $(local_gbs 4)\n",
    "printf -v": "printf -v TP '%d' 4\nprintf -v NAME 'run-%s-%03d' moe 7\ntorchrun pretrain_gpt.py --tp $TP --name $NAME\n",
    "function through $(...)": "gbs() { echo $(( $1 * 4 )); }\nname() { printf '%s_%s' \"$@\"; }\n"
                               "GBS=$(gbs 8)\ntorchrun pretrain_gpt.py --gbs $GBS --name \"$(name a b)\" --n `gbs 2`\n",
    "IFS=, splitting": "LIST=--tp,2,--pp,4\nIFS=,\nset -- $LIST\nunset IFS\nSIZES=\"8 16\"\n"
                       "IFS=, read -r A B <<< \"1,2\"\nread -ra ARR <<< \"x y z\"\n"
                       "torchrun pretrain_gpt.py \"$@\" --a $A --b $B ${ARR[@]} $SIZES\n",
    "arithmetic over a command's output": "GBS=$(( $(echo 4) * 2 ))\ntorchrun pretrain_gpt.py --gbs $GBS\n",
    "here-document read by cat": "ARGS=$(cat <<EOF\n--tp 2\n--pp $((2*2))\nEOF\n)\ntorchrun pretrain_gpt.py $ARGS\n",
    "expr, seq, basename": "N=$(expr 4 \\* 2)\nfor i in $(seq 1 3); do L+=(--x$i); done\n"
                           "torchrun pretrain_gpt.py --n $N \"${L[@]}\" --base $(basename /a/b/run.sh .sh)\n",
    "echo to stderr is not output": "f() { echo computing >&2; echo 64; }\ntorchrun pretrain_gpt.py --gbs $(f)\n",
    "set -e with a guarded failure": "set -euo pipefail\nfalse || true\n[ -n \"\" ] && X=1\n"
                                     "torchrun pretrain_gpt.py --ok 1\n",
    # issue 33: ANSI-C quoting is read as bash decodes it (was `$/ckpt/a\tb`), with the script's variables
    "ANSI-C quoting": "D=/d\nQ=$'it\\'s'\ntorchrun pretrain_gpt.py --save $'/ckpt/a\\tb' --load \"$D\"$'/x\\ny' "
                      "--a $'\\x41\\101\\u0041\\e\\c?\\q\\0gone' --b \"$Q\" --c $\"$D z\" --d \"$'not ansi'\" "
                      "--e $(echo $'p q')\n",
}


@needs_bash
@pytest.mark.parametrize("name", BASH_AGREES)
def test_the_reader_passes_what_bash_passes(name, tmp_path):
    """declare -i, printf -v, a function's output through $(...), IFS splitting and read, here-documents,
    set -e: the reader reads the flags bash passes (issue 23: bash would run them, the planner refused)."""
    text = BASH_AGREES[name]
    assert parse_launcher_script(text).megatron_flags == bash_flags(text, tmp_path)


# walk54b: slices of the script's arguments and of arrays were read as slices of one joined string ("${@:2}" one
# word ' --eval-iters=3 --seed 7' or '-' for "${@:2:1}"), and "${A[@]:1}" not at all
SLICES = {
    "quoted $@ from 2": 'torchrun pretrain_gpt.py --x 1 "${@:2}"\n',
    "$@ from 1, and 0 (the script)": 'torchrun pretrain_gpt.py --x 1 "${@:1}" --name "$(basename "${@:0:1}")"\n',
    "$@ offset and length": 'torchrun pretrain_gpt.py --x 1 "${@:2:1}" ${@:3:2}\n',
    "$@ from the end": 'torchrun pretrain_gpt.py --x 1 "${@: -2}" "${@:$#}" "${@: -9}"\n',
    "$* joined": 'torchrun pretrain_gpt.py --x 1 --j "${*:2}"\n',
    "in a function": 'run() { torchrun pretrain_gpt.py --x "$1" "${@:2}"; }\nrun 4 "${@:2}"\n',
    "array slices": 'A=("$@")\nB=(--p 1 --q 2)\ntorchrun pretrain_gpt.py "${A[@]:1}" "${B[@]: -2}" ${B[@]:0:2} "${B[*]:1:2}"\n',
}
SLICE_ARGS = ("size", "--eval-iters=3", "--seed", "7")


@needs_bash
@pytest.mark.parametrize("name", SLICES)
def test_slices_of_the_arguments_and_arrays_are_read_as_bash_slices_them(name, tmp_path):
    """${@:off:len}, ${*:off}, ${A[@]:off:len}: whole elements, negative offsets from the end, as bash passes them."""
    text = "#!/bin/bash\n" + SLICES[name]
    script = tmp_path / "s.sh"  # where bash_flags runs it: $0 is its path
    assert parse_launcher_script(text, args=SLICE_ARGS, path=str(script)).megatron_flags == \
        bash_flags(text, tmp_path, SLICE_ARGS)


# walk54b: util-linux getopt normalises the arguments of an option loop; the reader did not run it, so the loop
# never met `--` and the script was refused after 200000 statements ("a loop that never ends?")
GETOPT_LOOP = """OPTS=$(getopt -o l:t:v --long layers:,tp:,verbose -n train.sh -- "$@")
eval set -- "$OPTS"
L=2; T=1
while true; do
  case "$1" in
    -l|--layers) L=$2; shift 2 ;;
    -t|--tp) T=$2; shift 2 ;;
    -v|--verbose) shift ;;
    --) shift; break ;;
    *) echo "bad $1"; exit 1 ;;
  esac
done
torchrun pretrain_gpt.py --num-layers $L --tp $T "$@"
"""
GETOPT_ARGS = {
    "long and short": ("--layers", "16", "-t2", "-v", "--seed", "--", "7"),
    "abbreviated, attached, permuted": ("--lay=8", "pos", "--tp", "4", "it's"),
    "an unknown option is left out": ("--layers", "4", "--bogus", "-x", "1"),
}


@needs_bash
@pytest.mark.skipif(shutil.which("getopt") is None, reason="needs util-linux getopt")
@pytest.mark.parametrize("name", GETOPT_ARGS)
def test_an_option_loop_over_getopt_is_read_as_bash_runs_it(name, tmp_path):
    """`eval set -- "$(getopt ...)"` then a `while true; case $1` loop: the reader runs getopt as util-linux does."""
    text = "#!/bin/bash\n" + GETOPT_LOOP
    args = GETOPT_ARGS[name]
    assert parse_launcher_script(text, args=args).megatron_flags == bash_flags(text, tmp_path, args)


def test_declare_i_and_printf_v_reach_the_plan(tmp_path):
    """The issue's examples: `declare -i TP=2*2`, `printf -v TP '%d' 4` give TP 4."""
    for line in ("declare -i TP=2*2", "printf -v TP '%d' 4"):
        script = tmp_path / "tp.sh"
        script.write_text(f"{line}\ntorchrun pretrain_gpt.py {MODEL} --global-batch-size 16 "
                          "--tensor-model-parallel-size $TP\n")
        assert resolve_run(megatron_script=str(script)).parallel.tp == 4, line


def test_a_command_the_reader_cannot_run_stays_literal():
    """$(hostname) runs a program: its output is unknown, the text stays for bash (as before)."""
    s = parse_launcher_script("H=$(hostname)\nN=$(f() { echo 1; }; f; date)\ntorchrun pretrain_gpt.py --h $H --n $N\n")
    assert s.megatron_flags == ["--h", "$(hostname)", "--n", "$(f() { echo 1; }; f; date)"]


# ------------------------------------------------------------------ what bash would not run is refused
def test_set_e_then_a_failing_command_stops_the_script():
    """`set -e; false; torchrun ...`: bash stops at `false`; the reader says so, naming the line."""
    with pytest.raises(PlannerInputError) as err:
        parse_launcher_script(f"set -e\nfalse\ntorchrun pretrain_gpt.py {MODEL}\n", path="e.sh")
    assert err.value.field == "e.sh:2" and "set -e" in str(err.value) and "`false` returned 1" in str(err.value)
    parse_launcher_script(f"set -e\nset +e\nfalse\ntorchrun pretrain_gpt.py {MODEL}\n")  # set +e: it goes on
    parse_launcher_script(f"set -e\nif false; then X=1; fi\nfalse || true\ntorchrun pretrain_gpt.py {MODEL}\n")


@needs_bash
def test_set_e_agrees_with_bash(tmp_path):
    """bash stops at the failing command too: its stub torchrun is never run."""
    text = f"set -e\nfalse\ntorchrun pretrain_gpt.py {MODEL}\n"
    with pytest.raises(FileNotFoundError):
        bash_flags(text, tmp_path)


COMMENT_BREAKS = {
    "a commented-out flag line": ("torchrun pretrain_gpt.py \\\n    --num-layers 4 \\\n    # --tp 2 \\\n"
                                  "    --hidden-size 256 --bf16\n", 4, "--hidden-size"),
    "a comment after a flag": ("torchrun pretrain_gpt.py \\\n    --num-layers 4  # four \\\n    --hidden-size 256\n",
                               3, "--hidden-size"),
}


@needs_bash
@pytest.mark.parametrize("name", COMMENT_BREAKS)
def test_a_comment_inside_the_launch_command_is_refused_at_its_line(name, tmp_path):
    """A comment line (or a comment after a flag) inside the continued launch command: bash reads the comment to the
    end of its line, backslash included, so training starts without the flags below, which bash then runs as a
    command ('--hidden-size: command not found').  Read as bash reads it, the flags were silently lost (walk54b):
    refused, naming the comment's line and the first lost flag; a comment line after a complete command is not."""
    text, line, lost = COMMENT_BREAKS[name]
    text = "#!/bin/bash\n" + text
    assert lost not in bash_flags(text, tmp_path)  # bash drops them
    with pytest.raises(PlannerInputError) as err:
        parse_launcher_script(text, path="train.sh")
    assert str(err.value).startswith(f"train.sh:{line}: this comment ends the command that launches training")
    assert f"({lost} ...) are not part of it" in str(err.value)
    fine = "#!/bin/bash\ntorchrun pretrain_gpt.py \\\n    --num-layers 4\n# --tp 2 \\\n--hidden-size() { :; }\n"
    assert parse_launcher_script(fine, path="train.sh").megatron_flags == ["--num-layers", "4"]


def test_a_stray_backslash_space_is_refused_at_its_line(tmp_path):
    """`\\ ` at the end of a line (a space after the continuation backslash): bash passes a lone
    space and ends the command; the reader refuses it naming that line."""
    text = f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} \\ \n  --global-batch-size 16\n"
    with pytest.raises(PlannerInputError) as err:
        parse_launcher_script(text, path="stray.sh")
    assert err.value.field == "stray.sh:1" and "backslash followed by a space" in str(err.value)
    arr = f"ARGS=(\n  {MODEL} \\ \n  --global-batch-size 16\n)\ntorchrun pretrain_gpt.py \"${{ARGS[@]}}\"\n"
    with pytest.raises(PlannerInputError) as err:  # quoted, the lone-space element reaches Megatron
        parse_launcher_script(arr, path="arr.sh")
    assert err.value.field == "arr.sh:2"
    unquoted = parse_launcher_script(arr.replace('"${ARGS[@]}"', "${ARGS[@]}"))  # bash's splitting drops it
    assert " " not in unquoted.megatron_flags
    assert parse_launcher_script("torchrun pretrain_gpt.py --data-path /my\\ dir/x\n").megatron_flags == [
        "--data-path", "/my dir/x"]  # an escaped space inside a word is a path, not a fault


def test_pretrain_bert_is_not_planned_as_gpt():
    with pytest.raises(PlannerInputError) as err:
        parse_launcher_script(f"torchrun pretrain_bert.py {MODEL}\n", path="bert.sh")
    assert "pretrain_bert.py builds BERT" in str(err.value) and "bert.sh:1" in str(err.value)


def test_an_unknown_entry_script_is_named():
    s = parse_launcher_script(f"torchrun my_train.py {MODEL}\n", path="t.sh")
    assert any("my_train.py is not pretrain_gpt.py" in w for w in s.warnings)
    assert not any("is not pretrain_gpt.py" in w for w in parse_launcher_script(
        f"torchrun pretrain_gpt.py {MODEL}\n").warnings)


def test_a_second_launch_is_named():
    """Issue 23: a script with two launches; the first is planned and the second named."""
    text = f"torchrun pretrain_gpt.py {MODEL} --global-batch-size 16\necho done\n" \
           f"torchrun pretrain_gpt.py {MODEL} --global-batch-size 32\n"
    s = parse_launcher_script(text, path="two.sh")
    assert s.megatron_flags[-1] == "16"
    (note,) = [w for w in s.warnings if "again" in w]
    assert note.startswith("two.sh:3:") and "only the first launch (two.sh:1)" in note
    loop = parse_launcher_script(f"for i in 1 2; do torchrun pretrain_gpt.py {MODEL}; done\n", path="l.sh")
    assert any("runs 2 times" in w for w in loop.warnings)
    # what runs after the first launch is read for other launches only: the script is what it was at the launch
    after = parse_launcher_script(f'A=(--global-batch-size 16)\nX=1\ntorchrun pretrain_gpt.py {MODEL} "${{A[@]}}"\n'
                                  'A+=(--x)\nX=2\nsource missing.sh\nY=$(hostname)\nwhile true; do Z=1; done\n',
                                  path="after.sh")
    assert after.arrays["A"] == ["--global-batch-size", "16"] and after.env["X"] == "1" and "Y" not in after.env
    assert not after.missing_sources and not after.unresolved and not any("missing.sh" in w for w in after.warnings)
    assert any(w.startswith("after.sh:8: the script goes on past the launch") for w in after.warnings), after.warnings


@pytest.mark.parametrize("run", ["sbatch -n 16 job2.sh", "bash job2.sh", "source job2.sh"])
def test_a_launch_in_a_file_the_script_runs_is_placed_in_that_file(tmp_path, run):
    """The launch in a job script the script submits (or runs, or sources) is at that file's line: its line was
    placed in the script itself (submit.sh:2 for job2.sh's line 2), so the scan for other launches, which placed
    it right, named it as a second launch ("launches pretrain_gpt.py again") and an unknown entry script pointed at
    the script's line."""
    (tmp_path / "job2.sh").write_text(f"#!/bin/bash\nsrun -N 2 --ntasks-per-node 8 python pretrain_gpt.py {MODEL}\n"
                                      f"srun -N 2 --ntasks-per-node 8 python my_train.py {MODEL}\n")
    script = tmp_path / "submit.sh"
    script.write_text(f'#!/bin/bash\ncd "$(dirname "$0")"\n\n{run}\n')
    s = read_launcher_script(script)
    (note,) = [w for w in s.warnings if "again" in w]  # the second launch only, placed against the first's line
    assert note.startswith(f"{tmp_path / 'job2.sh'}:3:") and f"first launch ({tmp_path / 'job2.sh'}:2)" in note, note
    (tmp_path / "job2.sh").write_text(f"#!/bin/bash\n\nsrun -N 2 --ntasks-per-node 8 python my_train.py {MODEL}\n")
    s = read_launcher_script(script)
    assert not any("again" in w for w in s.warnings), s.warnings
    assert any(w.startswith(f"{tmp_path / 'job2.sh'}:3: the entry script my_train.py") for w in s.warnings)


def test_a_scheduler_variable_read_in_a_file_the_script_runs_is_placed_in_that_file(tmp_path):
    """SLURM_NNODES read unset on line 3 of the job script: the note was placed at the submitting script's line 3."""
    (tmp_path / "job.sh").write_text(f"#!/bin/bash\n\nNN=$SLURM_NNODES\ntorchrun --nnodes 2 pretrain_gpt.py {MODEL}\n")
    script = tmp_path / "submit.sh"
    script.write_text('#!/bin/bash\ncd "$(dirname "$0")"\nbash job.sh\n')
    s = read_launcher_script(script)
    assert any(w.startswith(f"{tmp_path / 'job.sh'}:3: SLURM_NNODES is set by the scheduler") for w in s.warnings), \
        s.warnings


# ------------------------------------------------------------------ messages that point at the fault
def test_a_variable_from_a_missing_sourced_file_is_explained(tmp_path):
    script = tmp_path / "m.sh"
    script.write_text(f"source ./cluster_env.sh\ntorchrun pretrain_gpt.py {MODEL} --global-batch-size $GLOBAL_BATCH\n")
    with pytest.raises(PlannerInputError) as err:
        resolve_run(megatron_script=str(script))
    text = str(err.value)
    assert err.value.field == "--global-batch-size" and "${GLOBAL_BATCH}" in text
    assert "source ./cluster_env.sh" in text and "m.sh:1" in text and "not here" in text


def test_gbs_from_an_unset_slurm_variable_names_it_and_can_be_overridden(tmp_path):
    """`$((SLURM_NNODES*8))` with SLURM_NNODES unset gave GBS 0: the message names the variable and
    the fix; #SBATCH --nodes, --cluster, --gbs and --megatron-args give the value."""
    body = f"GBS=$((SLURM_NTASKS*2))\ntorchrun pretrain_gpt.py {MODEL} --global-batch-size $GBS\n"
    script = tmp_path / "s.sh"
    script.write_text("#!/bin/bash\n" + body)
    with pytest.raises(PlannerInputError) as err:
        resolve_run(megatron_script=str(script))
    assert "SLURM_NTASKS (" in str(err.value) and "#SBATCH --nodes=N" in str(err.value)
    assert resolve_run(megatron_script=str(script), overrides={"gbs": 64}).training.global_batch_size == 64
    assert resolve_run(megatron_script=str(script),
                       megatron_args="--global-batch-size 32").training.global_batch_size == 32
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\n" + body)
    notes: list[str] = []
    assert resolve_run(megatron_script=str(script), notes=notes).training.global_batch_size == 32
    assert any("SLURM_NTASKS=16" in n and "#SBATCH --nodes=2" in n for n in notes)


# Pai-Megatron-Patch's mpi_run_pretrain_*.sh style: the rank from Open MPI's environment, mpirun runs the trainer
_MPI_RANKS = ("#!/bin/bash\nNODE_RANK=$OMPI_COMM_WORLD_RANK\nGPUS_PER_NODE=8\n"
              "GBS=$((OMPI_COMM_WORLD_SIZE*2))\n")
_MPI_RUN = f"mpirun -np 16 --allow-run-as-root -x PATH python pretrain_gpt.py {MODEL}"


def test_a_flag_error_names_no_unset_scheduler_variable_it_does_not_come_from(tmp_path):
    """An unknown flag under an mpirun rank setup: the error said OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE were
    unset, though neither makes the flag; only the variable a failing value comes from is named."""
    script = tmp_path / "mpi_run_pretrain.sh"
    script.write_text(_MPI_RANKS + _MPI_RUN + " --global-batch-size 32 --no-such-flag 1\n")
    with pytest.raises(PlannerInputError) as err:
        resolve_run(megatron_script=str(script))
    assert err.value.field == "--no-such-flag" and "unknown flag" in str(err.value)
    assert "OMPI_COMM_WORLD" not in str(err.value), str(err.value)
    script.write_text(_MPI_RANKS + _MPI_RUN + " --global-batch-size $GBS\n")
    with pytest.raises(PlannerInputError) as err:
        resolve_run(megatron_script=str(script))
    text = str(err.value)
    assert err.value.field == "--global-batch-size" and "got 0" in text
    assert "the script reads OMPI_COMM_WORLD_SIZE (" in text and "OMPI_COMM_WORLD_RANK" not in text, text


def test_the_issue_example_slurm_nnodes_times_8(tmp_path):
    """`$((SLURM_NNODES*8))` outside a job: named with the fix; then #SBATCH --nodes gives it."""
    body = f"torchrun pretrain_gpt.py {MODEL} --global-batch-size $((SLURM_NNODES*8))\n"
    script = tmp_path / "s.sh"
    script.write_text(body)
    with pytest.raises(PlannerInputError) as err:
        resolve_run(megatron_script=str(script))
    assert "got 0" in str(err.value) and "SLURM_NNODES (" in str(err.value) and "#SBATCH --nodes=N" in str(err.value)
    script.write_text("#SBATCH --nodes=3\n" + body)
    assert resolve_run(megatron_script=str(script)).training.global_batch_size == 24


def test_bash_reads_a_here_document_as_its_script_only_without_a_file():
    s = parse_launcher_script("bash -s <<EOF\ntorchrun pretrain_gpt.py --a 1\nEOF\n")
    assert s.megatron_flags == ["--a", "1"] and s.site.via == "heredoc"


def test_slurm_node_count_comes_from_the_cluster(tmp_path):
    script = tmp_path / "s.sh"
    script.write_text(f"torchrun pretrain_gpt.py {MODEL} --global-batch-size $((SLURM_NNODES*8))\n")
    run = resolve_run(megatron_script=str(script), cluster=cluster_of(("H100", 4)))
    assert run.training.global_batch_size == 32


def test_the_gpt3_example_is_refused_because_bash_splits_the_array(tmp_path):
    """Megatron-LM's examples/gpt3 passes `${TRAINING_ARGS[@]}` unquoted, so bash splits its
    `--step-batch-size-schedule "0:16 2.4B:320 ..."` element into six words; Megatron's parser refuses
    them.  The corpus's gpt3 launcher with the example's schedule in place of its ramp-up:"""
    text = (CORPUS_DIR / "gpt3_175b_distributed.sh").read_text()
    assert "--rampup-batch-size 16 16 5859375" in text
    script = tmp_path / "gpt3_step_schedule.sh"
    script.write_text(text.replace("--rampup-batch-size 16 16 5859375",
                                   '--step-batch-size-schedule "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536"'))
    with pytest.raises(PlannerInputError) as err:
        resolve_run(megatron_script=str(script), script_args=["/c", "/tb", "/v", "/m", "/d"])
    text = str(err.value)
    assert err.value.field == "--step-batch-size-schedule"
    assert "bash splits the unquoted ${TRAINING_ARGS[@]}" in text and "6 separate words" in text
    assert '"${TRAINING_ARGS[@]}"' in text


# ------------------------------------------------------------------ MindSpeed-LLM
def test_a_mindspeed_launcher_is_read_and_its_moe_flags_modelled():
    notes: list[str] = []
    run = resolve_run(megatron_script=str(CORPUS_DIR / "mindspeed_moe_mla.sh"), notes=notes)
    m = run.model
    assert m.moe_shared_expert_intermediate_size == 2 * 1408  # --n-shared-experts 2
    assert m.layer_is_moe[:2] == (False, True) and m.layer_is_moe.count(False) == 1  # --first-k-dense-replace 1
    assert m.multi_latent_attention and (m.qk_head_dim, m.qk_pos_emb_head_dim) == (128, 64)
    joined = "\n".join(notes)
    assert "alltoall_seq" in joined and "priced as alltoall" in joined
    assert "pai_megatron_aux_loss" in joined and "priced as aux_loss" in joined
    assert "not modelled" in joined and "--topk-group" in joined
    assert "--n-shared-experts" in run.passthrough  # passed through as given


# ------------------------------------------------------------------ the step budget and the deadline
def test_an_endless_loop_stops_at_the_deadline():
    """Reading stops at the command's deadline with a message naming the line it reached; a time-limit error
    (exit status 3 from the CLI, as when the command's own timer fires first), not an input error."""
    t0 = time.monotonic()
    with pytest.raises(ReadingTimeLimitError) as err:
        parse_launcher_script("i=0\nwhile true; do i=$((i+1)); X=$(( (i*7+3) % 11 )); done\n", path="loop.sh",
                              deadline=time.monotonic() + 0.5)
    assert time.monotonic() - t0 < 3 and err.value.field.startswith("loop.sh:") and "reading the inputs took" in str(err.value)


def test_a_long_loop_stops_at_the_step_budget():
    with pytest.raises(PlannerInputError, match="more than 5000 statements"):
        parse_launcher_script("while true; do X=1; done\n", path="loop.sh", max_steps=5000)


def test_sbatch_values_are_read_from_a_heredoc_job_script():
    text = ("sbatch --nodes=2 <<EOF\n#!/bin/bash\n#SBATCH --ntasks-per-node=4\n"
            f"srun python pretrain_gpt.py {MODEL} --global-batch-size \\$((SLURM_NTASKS*2))\nEOF\n")
    s = parse_launcher_script(text)
    assert s.megatron_flags[-1] == "16" and s.site.via == "heredoc" and s.wrapper == ["srun"]


def test_a_job_submitted_in_the_script_is_known_and_its_export_read():
    """A launch in a job the script submits (here-document, job file) is marked so, and the job's --export (its
    #SBATCH line, sbatch's option) is what launch.sh's note and its stop at sbatch rest on; a launch in the
    script itself, even with its own #SBATCH --export=NONE, is in no such job (its srun's --export is srun's)."""
    job = f"#!/bin/bash\n#SBATCH --export=NONE\nsrun python pretrain_gpt.py {MODEL}\nEOF\n"
    s = parse_launcher_script("sbatch --nodes=2 <<EOF\n" + job)
    assert s.in_sbatch_job and s.sbatch_export is not None and s.sbatch_export.value == "NONE"
    assert "#SBATCH --export=NONE" in s.sbatch_export.where
    s = parse_launcher_script("sbatch --export=ALL <<EOF\n" + job)
    assert s.in_sbatch_job and s.sbatch_export is None
    s = parse_launcher_script(f"#!/bin/bash\n#SBATCH --export=NONE\nsrun python pretrain_gpt.py {MODEL}\n")
    assert not s.in_sbatch_job and s.sbatch_export is None and s.srun_export is not None


def test_sbatch_wrap_is_named_where_no_launch_is_found():
    """`sbatch --wrap="srun torchrun ..."` is not read (its command runs under /bin/sh): the error says so, where,
    and what to write instead."""
    with pytest.raises(PlannerInputError) as err:
        parse_launcher_script(f'sbatch -N 2 --wrap="srun torchrun pretrain_gpt.py {MODEL}"\n', path="job.sh")
    assert "`sbatch --wrap` (job.sh:1) is not read" in str(err.value) and "here-document" in str(err.value)


@pytest.mark.parametrize("launch", ['ssh "$h" "torchrun pretrain_gpt.py {m}" &', 'pdsh -w "$h" torchrun pretrain_gpt.py {m}'])
def test_a_launch_through_a_remote_shell_is_named_where_no_launch_is_found(launch):
    """A loop of `ssh HOST "torchrun ... pretrain_gpt.py ..."` (or pdsh) is not followed: the error names the remote
    shell and its line once, and what to give instead."""
    text = "for h in n0 n1; do\n  " + launch.format(m=MODEL) + "\ndone\n"
    with pytest.raises(PlannerInputError) as err:
        parse_launcher_script(text, path="run.sh")
    msg = str(err.value)
    assert f"a remote shell runs the training on other hosts (run.sh:2: {launch.split()[0]})" in msg
    assert "run the launch.sh written for it on every node" in msg


@pytest.mark.parametrize("launch", ['deepspeed ${DIR}/../../pretrain_gpt.py {m} --deepspeed',
                                    'ray job submit --address="http://127.0.0.1:8265" -- python3 train.py {m}'])
def test_an_entry_started_by_a_launcher_the_reader_does_not_know_is_named(launch):
    """Megatron-DeepSpeed's `deepspeed pretrain_gpt.py` and slime's `ray job submit -- python3 train.py` run an entry
    script, through a program the reader does not read as a launcher: the error names the program, its line and the
    entry (not only "no command runs a Python training entry script"), and says what to give; an echo of the command
    line first is not such a launch."""
    text = 'DIR=`pwd`\ncmd="' + launch.replace("{m}", MODEL).replace('"', "'") + '"\necho ${cmd}\n' + launch.replace("{m}", MODEL) + "\n"
    with pytest.raises(PlannerInputError) as err:
        parse_launcher_script(text, path="run.sh")
    msg = str(err.value)
    entry = "pretrain_gpt.py" if "pretrain" in launch else "train.py"
    assert f"run.sh:4: `{launch.split()[0]}` starts {entry}, a launcher the reader does not read" in msg
    assert "run.sh:3" not in msg and "give a script that starts the entry script with one of these" in msg


@pytest.mark.parametrize("form", ["qsub heredoc", "bsub file"])
def test_a_job_of_another_scheduler_is_named_where_no_launch_is_found(tmp_path, form):
    """`qsub <<EOF ... mpirun python pretrain_gpt.py ...` or `bsub < job.lsf` (sbatch's jobs are read, qsub's and
    bsub's are not): the error names the submission and says to give the job script itself."""
    job = f"#!/bin/bash\nmpirun -np 16 python pretrain_gpt.py {MODEL}\n"
    if form == "qsub heredoc":
        text = f"qsub <<EOF\n{job}EOF\n"
    else:
        (tmp_path / "job.lsf").write_text(job)
        text = "bsub job.lsf\n"
    (tmp_path / "run.sh").write_text(text)
    with pytest.raises(PlannerInputError) as err:
        read_launcher_script(tmp_path / "run.sh")
    assert f"submitted with another scheduler ({tmp_path / 'run.sh'}:1: {form.split()[0]})" in str(err.value)
    assert "give the job script itself" in str(err.value)


def test_scheduler_values_given_to_the_reader_are_used():
    s = parse_launcher_script(f"torchrun --nnodes $SLURM_NNODES pretrain_gpt.py {MODEL}\n",
                              scheduler=[SchedulerValue("SLURM_NNODES", "3", "--cluster")])
    assert s.launcher_args == ["--nnodes", "3"]
