"""`cli.py emit`: write the launcher files (megatron_args.txt, launch.sh, hostfile, FlagScale YAML)
for a solved plan."""

from __future__ import annotations

import click

from planner.api import emit
from planner.cli_common import handle_errors
from planner.commands.options import input_files, launcher_inputs, note_printer
from planner.output.run_dir import LAUNCHER_OUTPUT, check_out_dir, write_files


@click.command("emit")
@click.option("--plan", "plan_path", required=True, type=click.Path(dir_okay=False), metavar="PLAN.JSON",
              help="plan.json as `solve --out` writes it (or a bare Plan with --model/--cluster)")
@click.option("--out", "out_dir", required=True, metavar="DIR",
              help="directory for the launcher files: a new or empty directory, or one with earlier launcher files "
                   "(replaced; a manifest there or above says so: `solve --out DIR`'s DIR/launch included); files the "
                   "planner did not write or that were edited since, and the input script, are never overwritten or "
                   "deleted")
@click.option("--force", is_flag=True, help="write into a non-empty --out directory that holds no earlier launcher "
                                            "files, beside its files; the planner's own unchanged files of the same "
                                            "name are replaced, and files it did not write or that were edited since "
                                            "are never overwritten or deleted (the command is refused)")
@click.option("--megatron-script", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="the user's launcher (default: the one plan.json saved); launch.sh is it with the plan applied; "
                   "it must describe the model the plan was made for")
@click.option("--model", default=None, metavar="PRESET|FILE", help="model, when the plan file has no inputs.run")
@click.option("--megatron-args", default=None, metavar='"FLAGS"', help="Megatron flags, when the plan file has no inputs.run")
@click.option("--cluster", default=None, metavar="SPEC", help="cluster, when the plan file has no inputs.cluster")
@click.option("--profiles", "profile_dirs", multiple=True, type=click.Path(file_okay=False),
              help="directory of measured profiles (devices the plan runs on that are not shipped; repeatable)")
@click.option("--hosts", "hosts_path", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="the real nodes, one line each: NAME TYPE [GPUS] (or NAME slots=N type=T); the host file, "
                   "launch.sh and SLURM's placement use them (without it the host file is a template)")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT_ARG...]")
@handle_errors
def command(plan_path, out_dir, force, megatron_script, model, megatron_args, cluster, profile_dirs, hosts_path,
            script_args):
    """Write megatron_args.txt, launch.sh and hostfile (plus FlagScale's YAML for the flagscale
    runtime) for a plan, after checking it as `solve` does (layers, GPUs, memory, Megatron's rules) for
    the model and cluster it was made for.  The input script is never modified.

    \b
    python cli.py emit --plan out/plan.json --out launch/ --megatron-script train.sh
    """
    given = input_files(plan_path, megatron_script, model, cluster, hosts_path)
    check_out_dir(out_dir, "--out", LAUNCHER_OUTPUT, force=force, inputs=given)
    files, script = emit(plan_path, model=model, megatron_args=megatron_args, megatron_script=megatron_script,
                         cluster=cluster, script_args=script_args, profile_dirs=profile_dirs, on_note=note_printer(),
                         hosts_path=hosts_path)
    paths = write_files(out_dir, files, "--out", LAUNCHER_OUTPUT, force=force,
                        inputs=given + launcher_inputs(script))
    for p in paths:
        click.echo(str(p))
