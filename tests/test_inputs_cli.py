"""The command line around scripts and rules: `-- ARG...`, --megatron-script with --megatron-args,
emit from plan.json alone, estimate's refusal of what Megatron refuses, notes on stderr."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from click.testing import CliRunner

from cli import main

SCRIPT = """#!/bin/bash
CKPT=${1:?usage: train.sh CKPT}
ARGS=(--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048
      --micro-batch-size 1 --global-batch-size 64 --lr 1e-4 --bf16 --tokenizer-type GPT2BPETokenizer
      --vocab-file /v.json --merge-file /m.txt --data-path /d --save "$CKPT" --save-interval 10)
torchrun --nproc_per_node 8 pretrain_gpt.py "${ARGS[@]}" --tensor-model-parallel-size 2
"""


def _solve(tmp_path: Path, *extra: str) -> tuple[int, str, Path]:
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["solve", "--megatron-script", str(script), "--cluster", "H100:8", "--backend",
                                    "hsdp", "--quiet", "--out", str(out), *extra])
    return res.exit_code, res.output, out


def test_script_arguments_after_double_dash_and_megatron_args_overrides(tmp_path):
    """`-- /ckpt` reaches $1; --megatron-args flags override the script's in the run and in the
    emitted flags; the inferred vocabulary is printed as assumed."""
    code, output, out = _solve(tmp_path, "--megatron-args", "--lr 3e-4 --seq-length 1024", "--", "/my/ckpt")
    assert code == 0, output
    # --quiet keeps stderr quiet; the inferred vocabulary is in the result's "assumed" lines
    assert any("vocabulary" in ln and "50257" in ln and "--vocab-size" in ln for ln in output.splitlines())
    argv = shlex.split((out / "launch" / "megatron_args.txt").read_text())
    assert argv[argv.index("--save") + 1] == "/my/ckpt"
    assert argv.count("--lr") == 1 and argv[argv.index("--lr") + 1] == "3e-4"
    assert argv[argv.index("--seq-length") + 1] == "1024"
    run = json.loads((out / "plan.json").read_text())["inputs"]["run"]
    assert run["model"]["seq_length"] == 1024


def test_a_script_that_needs_its_arguments_says_so(tmp_path):
    """Without the argument `${1:?usage}` requires, the script would stop: refused with its line."""
    code, output, _ = _solve(tmp_path)
    assert code == 2 and "train.sh:2" in output and "Traceback" not in output


def test_emit_rebuilds_the_launcher_from_plan_json_alone(tmp_path):
    """plan.json keeps the script and its arguments: emit without --megatron-script writes the
    same launch.sh (no literal ${CHECKPOINT_PATH}, nothing baked in)."""
    code, output, out = _solve(tmp_path, "--", "/my/ckpt")
    assert code == 0, output
    res = CliRunner().invoke(main, ["emit", "--plan", str(out / "plan.json"), "--out", str(tmp_path / "again")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "again" / "launch.sh").read_text() == (out / "launch" / "launch.sh").read_text()
    assert '"$CKPT"' in (out / "launch" / "launch.sh").read_text()  # the script's own variable, live


def test_estimate_refuses_what_megatron_refuses_unless_allowed():
    """PP4 x EP8 on 8 GPUs: exit 2 with Megatron's message; --allow-invalid prices it."""
    args = ["estimate", "--model", "mixtral-s", "--cluster", "H800:8", "--pp", "4", "--ep", "8"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2
    assert "world_size (8) is not divisible by expert_tensor_model_pipeline_parallel size (32)" in res.output
    assert "--allow-invalid" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, [*args, "--allow-invalid", "--json"])
    assert res.exit_code == 0, res.output


def test_unknown_flag_in_a_script_is_refused_with_a_suggestion(tmp_path):
    script = tmp_path / "t.sh"
    script.write_text(SCRIPT.replace("--lr 1e-4", "--lr 1e-4 --num-expert 8"))
    res = CliRunner().invoke(main, ["solve", "--megatron-script", str(script), "--cluster", "H100:8", "--", "/c"])
    assert res.exit_code == 2 and "--num-expert: unknown flag" in res.output and "did you mean --num-experts?" in res.output


CALIBRATE_SCRIPT = """#!/bin/bash
# llama2-7b cut to $1 layers (the fixture log is TP2 PP2 DP2 on 8 H100, 64 x 4096 tokens)
NUM_LAYERS=${1:?usage: run.sh NUM_LAYERS}
torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers $NUM_LAYERS --hidden-size 4096 --ffn-hidden-size 11008 \\
    --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 --swiglu --normalization RMSNorm \\
    --disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope --vocab-size 32000 \\
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 64 \\
    --bf16 --use-distributed-optimizer --tokenizer-type Llama2Tokenizer --tokenizer-model /t.model
"""


def test_calibrate_passes_arguments_after_double_dash_to_the_script(tmp_path):
    """`calibrate ... -- 8`: the script's own arguments reach it ($1 sets the layers), as in estimate and solve
    (they were refused: "Got unexpected extra arguments"); with --trials they are refused by name."""
    script = tmp_path / "run.sh"
    script.write_text(CALIBRATE_SCRIPT)
    log = Path(__file__).parent / "data" / "logs" / "megatron_core018_minmax.log"
    args = ["calibrate", "--megatron-log", str(log), "--megatron-script", str(script), "--cluster", "H100:8"]
    # --allow-memory-excess: the fixture's memory is beyond what calibrate writes unasked (tests/test_calibration.py)
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "cal"), "--json", "--allow-memory-excess", "--", "8"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{"):])
    assert any(p.endswith("corrections.yaml") for p in report["written"])
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "cal2")])  # no $1: the script's own refusal
    assert res.exit_code == 2 and "run.sh:3" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["calibrate", "--trials", str(tmp_path), "--out", str(tmp_path / "t"), "--", "8"])
    assert res.exit_code == 2 and "drop arguments after `--`" in res.output


def test_compare_passes_arguments_after_double_dash_to_the_script(tmp_path):
    """`compare --megatron-script train.sh ... -- /ckpt` reads the script with its argument."""
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT)
    args = ["compare", "--megatron-script", str(script), "--cluster", "H100:8", "--layers", "2", "--no-brute",
            "--time-limit", "20", "--json"]
    res = CliRunner().invoke(main, [*args, "--", "/my/ckpt"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output[res.output.index("{"):])["num_layers"] == 2
    res = CliRunner().invoke(main, args)  # without it the script stops at `${1:?usage}`: refused with its line
    assert res.exit_code == 2 and "train.sh:2" in res.output and "Traceback" not in res.output


def test_estimate_prices_glm45_air_and_olmoe_from_their_config_json():
    """GLM-4.5-Air and OLMoE-1B-7B's published config.json (tests/data/hf_configs/) were refused ("unsupported
    architecture"); `estimate` prices each on a small cluster, with the parameters Megatron builds for them
    (tools/megatron_params.py, megatron-core 0.19.2, whole models: 109,227,304,960 with GLM-4.5-Air's MTP layer, and
    6,919,100,416), and OLMoE's QK-norm note on stderr."""
    from helpers.hf_configs import CONFIG_FILES
    for name, cluster, shape, total in (("GLM-4.5-Air", "H100:16", ["--ep", "8", "--pp", "2"], 109_227_304_960),
                                        ("OLMoE-1B-7B-0924", "H100:8", ["--ep", "8"], 6_919_100_416)):
        res = CliRunner().invoke(main, ["estimate", "--model", str(CONFIG_FILES / f"{name}.json"), "--cluster", cluster,
                                        *shape, "--recompute", "full", "--json"])
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out["model"] == name and out["parameters_total"] == total and out["iteration_time_s"] > 0
        assert out["plan"]["ep"] == 8 and out["world_size"] == int(cluster.split(":")[1])
        assert ("whole Q and K projections" in res.stderr) == (name.startswith("OLMoE"))


# ------------------------------------------------------------------------------------------------
# each command reads the script once

ONE_NODE = """#!/bin/bash
ARGS=(--num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048
      --micro-batch-size 1 --global-batch-size 64 --lr 1e-4 --bf16 --tokenizer-type GPT2BPETokenizer
      --vocab-file /v.json --merge-file /m.txt --data-path /d)
torchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py "${ARGS[@]}" --tensor-model-parallel-size 2
"""


def _reads(monkeypatch) -> list[str]:
    """The scripts the launcher-script interpreter evaluates from here on (planner.inputs.script's entry point)."""
    import planner.inputs.script as script_module

    read, real = [], script_module.parse_launcher_script

    def counted(text, **options):
        read.append(str(options.get("path")))
        return real(text, **options)

    monkeypatch.setattr(script_module, "parse_launcher_script", counted)
    return read


def test_solve_reads_the_script_once_for_the_run_and_the_launcher(tmp_path, monkeypatch):
    """solve --megatron-script --out: the run, the launch check, "your plan"'s note and launch.sh all come from one
    evaluation of the script (it was evaluated twice: load_inputs, then again for the launcher)."""
    read = _reads(monkeypatch)
    code, output, out = _solve(tmp_path, "--megatron-args", "--lr 3e-4", "--seq", "1024", "--", "/my/ckpt")
    assert code == 0, output
    assert read == [str(tmp_path / "train.sh")]
    argv = shlex.split((out / "launch" / "megatron_args.txt").read_text())  # the launcher has the script's flags,
    assert argv[argv.index("--save") + 1] == "/my/ckpt"  # its arguments, and what rides on top of it
    assert argv[argv.index("--lr") + 1] == "3e-4" and argv[argv.index("--seq-length") + 1] == "1024"


def test_emit_reads_the_script_once_on_the_plan_cluster_for_the_model_check_and_the_launcher(tmp_path, monkeypatch):
    """emit --megatron-script: the script is read once, as a job on the plan's cluster, and both the check of its run
    against the plan and launch.sh come from that reading.  A script that computes its batch and its node count from
    SLURM_NNODES gets the plan cluster's 2 nodes in the check too (it was read a second time with no cluster there:
    SLURM_NNODES unset, GBS 0, and emit refused the plan solve had made from the same script)."""
    script = tmp_path / "geo.sh"
    script.write_text(ONE_NODE.replace("--global-batch-size 64", "--global-batch-size $((SLURM_NNODES * 32))")
                      .replace("--nnodes 1", "--nnodes $SLURM_NNODES"))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["solve", "--megatron-script", str(script), "--cluster", "H100:16", "--backend",
                                    "hsdp", "--quiet", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "plan.json").read_text())["plan"]["gbs"] == 2 * 32  # two nodes of 8 GPUs
    read = _reads(monkeypatch)
    res = CliRunner().invoke(main, ["emit", "--plan", str(out / "plan.json"), "--out", str(tmp_path / "emit"),
                                    "--megatron-script", str(script)])
    assert res.exit_code == 0, res.output
    assert read == [str(script)]
    argv = shlex.split((tmp_path / "emit" / "megatron_args.txt").read_text())
    assert argv[argv.index("--global-batch-size") + 1] == "64"
    assert "--nnodes 2" in (tmp_path / "emit" / "launch.sh").read_text()


def test_estimate_and_calibrate_read_the_script_once_where_it_reads_alike_on_the_gpus_priced(tmp_path, monkeypatch):
    """estimate / calibrate --megatron-script on a cluster larger than the launch: the script is read once, as a
    job on the whole cluster, and its 8 GPUs priced (it was read a second time, as a job on those 8 GPUs, which
    reads the same where it uses no SLURM_* value of the cluster's).  A script that computes its batch from
    SLURM_NNODES is still read as a job on the node priced (SLURM_NNODES=1: GBS 32, the note says so), a second
    reading there."""
    script = tmp_path / "one_node.sh"
    script.write_text(ONE_NODE)
    read = _reads(monkeypatch)
    res = CliRunner().invoke(main, ["estimate", "--megatron-script", str(script), "--cluster", "H100:16", "--json"])
    assert res.exit_code == 0, res.output
    assert read == [str(script)]
    assert any("priced on those, the first node" in n for n in json.loads(res.stdout)["notes"])
    log = Path(__file__).parent / "data" / "logs" / "megatron_core018_minmax.log"
    read.clear()
    CliRunner().invoke(main, ["calibrate", "--megatron-log", str(log), "--megatron-script", str(script),
                              "--cluster", "H100:16", "--out", str(tmp_path / "cal"), "--json"])
    assert read == [str(script)]  # (the log is another run: refused after the reading)
    geo = tmp_path / "geo.sh"
    geo.write_text(ONE_NODE.replace("--global-batch-size 64", "--global-batch-size $((SLURM_NNODES * 32))"))
    read.clear()
    res = CliRunner().invoke(main, ["estimate", "--megatron-script", str(geo), "--cluster", "H100:16", "--json"])
    assert res.exit_code == 0, res.output
    assert read == [str(geo)] * 2
    priced = json.loads(res.stdout)
    assert priced["world_size"] == 8 and priced["num_microbatches"] == 32 // 4  # GBS 32 over DP 4 (TP 2), not 64
    assert "SLURM_NNODES=1 (set by the scheduler when the job runs), from --cluster (1 nodes)" in res.stderr
