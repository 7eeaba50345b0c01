"""srun's and sbatch's options as Slurm reads them (planner/inputs/slurm_options.py): long options by an
unambiguous prefix of their names (glibc getopt_long), and the GPU count of a --gres list
(planner/inputs/shell/builtins.py `gres_gpus`, Slurm's grammar `name[[:type]:count]`)."""

from __future__ import annotations

import pytest

from planner.inputs.shell.builtins import gres_gpus, sbatch_options, tres_gpus
from planner.inputs.slurm_options import (
    _SAME_OPTION, LONG_NAMES, VALUED, SlurmOptionError, long_option, options_end,
)


@pytest.mark.parametrize("value, gpus", [
    ("gpu:8", "8"), ("gpu:h100:8", "8"), ("gpu", "1"), ("gpu:h100", "1"),  # the count defaults to 1
    ("nvme:1", None), ("shard:2", None), ("mps:100", None),  # no gpu entry: no GPU count (these were 1, 2, 100)
    ("nvme:1,gpu:8", "8"), ("gpu:8,nvme:1", "8"), ("gpu:a100:2,gpu:v100:2", "4"),  # the gpu entries of the list
    ("gres/gpu:4", "4"), ("gpu:1k", "1024"), ("gpu:0", "0"),  # `gres/` in front; Slurm's count suffixes
    ("gpu:8(S:0-1)", ""), ("gpu:", ""), ("gpu:a:b:8", ""), ("none", ""),  # Slurm refuses them: no count
    ("gpu:$NGPU", ""), ("$GRES", ""),  # text left unexpanded: not known here
])
def test_gres_counts_only_its_gpu_entries(value, gpus):
    """--gres=nvme:1 (shard:2, mps:100) was read as that many GPUs on each node, and --gres=nvme:1,gpu:8 as 1:
    only the `gpu` gres (with or without a type) is GPUs; a list Slurm refuses gives no count."""
    assert gres_gpus(value) == gpus


@pytest.mark.parametrize("word, full", [
    ("--ntasks-per-n", "--ntasks-per-node"), ("--ntasks-per-n=8", "--ntasks-per-node=8"),
    ("--gpus-per-t", "--gpus-per-task"), ("--tasks", "--tasks-per-node"), ("--container-ima", "--container-image"),
    ("--nodes", "--nodes"), ("--gres", "--gres"),  # a full name, also where it starts others (--gres-flags)
    ("--my-spank-option", "--my-spank-option"), ("-N", "-N"), ("--", "--"),  # not in the table: unchanged
])
def test_a_long_option_is_read_by_an_unambiguous_prefix(word, full):
    assert long_option(word, "srun") == full


@pytest.mark.parametrize("word, scheduler, candidates", [
    ("--nod", "srun", "--nodefile, --nodelist, --nodes"),  # glibc: "option '--nod' is ambiguous"
    ("--gre", "sbatch", "--gres, --gres-flags"),
    ("--w", "sbatch", "--wait, --wait-all-nodes, --wckey, --wrap"),
])
def test_an_ambiguous_prefix_is_refused_naming_the_candidates(word, scheduler, candidates):
    with pytest.raises(SlurmOptionError, match=f"{scheduler}'s option {word} is ambiguous: it starts {candidates},"):
        long_option(word, scheduler)


def test_the_ambiguity_error_says_the_table_is_slurms_and_pyxiss_and_site_plugins_add_options():
    """The table is Slurm's own options and pyxis's: a site's SPANK plugins add options that make more prefixes
    ambiguous there (and a site without pyxis reads `--container-i` as --container-id), so the error says whose
    options it names, and the fix, the full name, holds on every site."""
    with pytest.raises(SlurmOptionError) as err:
        long_option("--container-i", "srun")
    assert "--container-id, --container-image" in str(err.value)
    assert "options of Slurm and of NVIDIA's pyxis plugin" in str(err.value)
    assert "a site's own SPANK plugins add options" in str(err.value)


def test_options_end_skips_the_value_of_an_option_given_by_a_prefix():
    """`srun --ntasks-per-n 8 python ...`: 8 was taken for srun's command."""
    assert options_end(["--ntasks-per-n", "8", "--container-ima", "img", "python", "x.py"], "srun") == 4
    assert sbatch_options(["--ntasks-per-n", "8", "--job-name", "-N", "--nodes=2"], "srun") == {
        "ntasks-per-node": "8", "nodes": "2"}  # --job-name's value -N is not an option


@pytest.mark.parametrize("scheduler", ["srun", "sbatch"])
def test_the_table_holds_every_valued_long_option_and_no_prefix_names_only_one_options_two_names(scheduler):
    """Every valued long option is in the table; and no prefix starts the two names of one option (--cpu-bind,
    --cpu_bind) and nothing else, so launch.sh's `hapmoe_slurm_valued`, which does not know them, reads the
    prefixes as getopt_long does."""
    assert {w[2:] for w in VALUED[scheduler] if w.startswith("--")} <= LONG_NAMES[scheduler]
    names = LONG_NAMES[scheduler]
    for name in names:
        for k in range(1, len(name)):
            starts = {n for n in names if n.startswith(name[:k])}
            assert len(starts) == 1 or len({_SAME_OPTION.get(n, n) for n in starts}) > 1, (name[:k], starts)


@pytest.mark.parametrize("value, gpus", [
    ("gres/gpu=2", "2"), ("gres/gpu:a100=2", "2"), ("cpu=4,gres/gpu=2", "2"), ("gres:gpu=2", "2"),
    ("gres/gpu:a100=1,gres/gpu:h100=2", "3"),  # srun(1): the sum of the types is bound to each task
    ("gres/gpu=1k", "1024"), ("gres/gpu", "1"), ("gres/gpu:a100:2", "2"), ("gres/gpu:a100", "1"),
    ("cpu=4", None), ("cpu=8,license/ansys=1", None), ("gres/nvme=1", None),
    ("gres/gpu=x", ""), ("gres/gpu=$N", ""),
])
def test_tres_per_task_gpus(value, gpus):
    """--tres-per-task's GPUs for each task, as Slurm reads the list (slurm_opt.c `_validate_tres_per_task`)."""
    assert tres_gpus(value) == gpus
