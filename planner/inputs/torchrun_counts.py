"""torchrun's node and process counts as torchrun reads them: its --nnodes and --nproc-per-node (also spelt with `_`),
else the PET_NNODES and PET_NPROC_PER_NODE environment variables it runs with, else its defaults (1 and 1).

torch/distributed/run.py (pytorch/pytorch 010929fd3f401c3868310396e6a91ed95aa0305b, `get_args_parser`) declares
both options with `action=env` (torch/distributed/argparse_util.py, 0734fe094422e3ead7590cbf0e22813cc65f099a, class
`env`): the option's default is `os.environ["PET_" + dest.upper()]` where that is set, and the option on the command
line wins over it.  `dest` is argparse's, from the first long name (`--nproc-per-node` -> nproc_per_node), so the
variables are PET_NPROC_PER_NODE and PET_NNODES.  torchrun has one where the script exports it, or sets it in front of
the launch (`PET_NPROC_PER_NODE=8 torchrun ...`, or in front of srun, whose tasks get its environment).

--nnodes is `N` or `MIN:MAX` (run.py `parse_min_max_nnodes`).  --nproc-per-node is read by run.py
`determine_local_world_size`: an integer, or `gpu` (torch.cuda.device_count(); an error where CUDA is not available),
`auto` (the accelerator's device count where there is one, else os.cpu_count()), `cpu`, `xpu`: on a GPU node `gpu`
and `auto` start one process on each GPU the process sees (CUDA_VISIBLE_DEVICES), a count the script does not state
(under srun, planner/inputs/srun_torchrun.py reads it from what Slurm gives each task).

torchrun reads its options with argparse, and run.py's `ArgumentParser(description=...)` leaves `allow_abbrev` at its
default, True: a long option may be given by a prefix of one of its spellings (`--nnod 2` is `--nnodes 2`,
`--nproc-p 8` is `--nproc-per-node 8`).  argparse counts each spelling on its own (CPython Lib/argparse.py,
python/cpython 0006cbca2a82136e978f1c24400230c0d788b0e7, `_get_option_tuples` returns one tuple per option string that
starts with the prefix and `consume_optional` refuses more than one: "ambiguous option: --nproc could match
--nproc-per-node, --nproc_per_node"), so a prefix of both spellings of one option (`--nproc`, `--npr`) is refused like
a prefix of two options (`--n`).  `torchrun_options` reads the options so, and refuses an ambiguous prefix naming it and
its candidates (TorchrunOptionError), as torchrun exits with that error.  The option table is run.py's at the commit
above (`python -m torch.distributed.launch` adds --use-env, --use_env: torch/distributed/launch.py `parse_args`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

Count = Literal["nproc-per-node", "nnodes"]
_DEFAULTS: dict[Count, str] = {"nproc-per-node": "1", "nnodes": "1"}
PER_GPU = ("gpu", "auto")
"""--nproc-per-node values that start one process on each GPU torchrun sees."""


@dataclass(frozen=True)
class TorchrunCount:
    """One of torchrun's counts: its value as torchrun reads it (`8`, `gpu`, `1:4`), and where it is given
    (`--nproc-per-node 8`, `PET_NPROC_PER_NODE=8 in torchrun's environment`, or torchrun's default)."""

    value: str
    given: str

    @property
    def number(self) -> int | None:
        """The count as a plain number (the largest of `MIN:MAX`); None where it is not one."""
        last = self.value.rsplit(":", 1)[-1] if self.value.count(":") == 1 else self.value
        return int(last) if last.isdigit() else None

    @property
    def least(self) -> int | None:
        """The smallest count torchrun accepts (MIN of `MIN:MAX`, else the number); None where not a number."""
        first = self.value.split(":", 1)[0]
        return int(first) if first.isdigit() and self.number is not None else None


# torchrun's long options (run.py `get_args_parser`), each with its spellings, by whether it takes a value
_VALUED = """nnodes nproc-per-node rdzv-backend rdzv-endpoint rdzv-id rdzv-conf max-restarts monitor-interval
start-method event-log-handler role log-dir redirects tee local-ranks-filter node-rank master-addr master-port
local-addr logs-specs numa-binding signals-to-handle""".split()
_FLAGS = "standalone module no-python run-path help".split()  # `action=check_env` (no value), and argparse's -h
_ONE_SPELLING = {"nnodes", "role", "redirects", "tee", "standalone", "module", "help"}  # no `_` alias in run.py
_LAUNCH_ONLY = ["use-env"]  # torch/distributed/launch.py: `--use-env`, `--use_env`, store_true


def _spellings(names: list[str]) -> dict[str, str]:
    """{`--spelling`: option name} of `names`, each also with `_` for `-` where run.py declares it so."""
    out: dict[str, str] = {}
    for name in names:
        out[f"--{name}"] = name
        if name not in _ONE_SPELLING:
            out[f"--{name.replace('-', '_')}"] = name
    return out


class TorchrunOptionError(ValueError):
    """An option torchrun's argparse refuses as ambiguous: the message names the prefix and its candidates."""


def torchrun_option(word: str, *, launch: bool = False) -> tuple[str, str | None] | None:
    """(option name, value given with `=` or None) of a long option word as torchrun's argparse reads it: a
    spelling in full, or a prefix of exactly one spelling (see the module docstring); None for a word that is not
    one of its long options.  `launch`: `python -m torch.distributed.launch`, whose parser adds --use-env.
    TorchrunOptionError for a prefix of several spellings."""
    if not word.startswith("--") or word == "--":
        return None
    spellings = _spellings(_VALUED + _FLAGS + (_LAUNCH_ONLY if launch else []))
    prefix, eq, value = word.partition("=")
    if prefix in spellings:
        return spellings[prefix], value if eq else None
    candidates = [s for s in spellings if s.startswith(prefix)]
    if len(candidates) > 1:
        raise TorchrunOptionError(
            f"torchrun's option {prefix} is ambiguous: it starts {', '.join(candidates)}, and torchrun's argparse "
            f"refuses it (\"ambiguous option: {prefix} could match {', '.join(candidates)}\"; a prefix must start one "
            "spelling only, `-` and `_` spellings counted apart); give the option's full name")
    return (spellings[candidates[0]], value if eq else None) if candidates else None


def torchrun_options(args: list[str], *, launch: bool = False) -> dict[str, str]:
    """{option name: value} of torchrun's own options `args` (before its entry script), as torchrun reads them:
    `--name v` or `--name=v`, a name by a unique prefix (`torchrun_option`); the last one given wins, as argparse's.
    TorchrunOptionError for an ambiguous prefix."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        read = torchrun_option(args[i], launch=launch)
        if read is not None and read[0] in _VALUED:
            name, value = read
            if value is None:
                value, i = (args[i + 1] if i + 1 < len(args) else ""), i + 1
            out[name] = value
        i += 1
    return out


def options(args: list[str], keys: set[str]) -> dict[str, str]:
    """{key: value} of long options given as `--k v` or `--k=v` (`_` and `-` alike)."""
    out: dict[str, str] = {}
    for i, tok in enumerate(args):
        name, eq, val = tok.partition("=")
        key = name.lstrip("-").replace("_", "-")
        if tok.startswith("-") and key in keys:
            out[key] = val if eq else (args[i + 1] if i + 1 < len(args) else "")
    return out


def pet_variable(name: Count) -> str:
    """The variable torchrun reads a count from where its option is not given: PET_NNODES, PET_NPROC_PER_NODE."""
    return "PET_" + name.upper().replace("-", "_")


def torchrun_count(args: list[str], env: Mapping[str, str], name: Count, *, launch: bool = False,
                   hidden: tuple[Mapping[str, str], str] | None = None) -> TorchrunCount:
    """torchrun's `name` count: its option among `args` (torchrun's own words, `torchrun_options`), else PET_<NAME>
    in `env` (the variables the script gives torchrun: exported, or set in front of the launch), else torchrun's
    default.  `hidden`: the variables the script sets for srun, and the --export that keeps those not in `env` from
    torchrun (planner/inputs/srun_export.py), named where the count falls to the default."""
    given = torchrun_options(args, launch=launch).get(name)
    if given is not None:
        return TorchrunCount(given, f"--{name} {given}")
    variable = pet_variable(name)
    if variable in env:
        return TorchrunCount(env[variable], f"no --{name}, {variable}={env[variable]} in torchrun's environment")
    default = _DEFAULTS[name]
    if hidden is not None and variable in hidden[0]:
        return TorchrunCount(default, f"no --{name}, and the script's {variable}={hidden[0][variable]} does not reach "
                             f"torchrun ({hidden[1]} does not pass it): torchrun's default {default}")
    return TorchrunCount(default, f"no --{name} (torchrun's default: {default})")
