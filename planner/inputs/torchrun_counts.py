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


def options(args: list[str], keys: set[str]) -> dict[str, str]:
    """{key: value} of long options given as `--k v` or `--k=v` (`_` and `-` alike)."""
    out: dict[str, str] = {}
    for i, tok in enumerate(args):
        name, eq, val = tok.partition("=")
        key = name.lstrip("-").replace("_", "-")
        if tok.startswith("-") and key in keys:
            out[key] = val if eq else (args[i + 1] if i + 1 < len(args) else "")
    return out


def torchrun_count(args: list[str], env: Mapping[str, str], name: Count) -> TorchrunCount:
    """torchrun's `name` count: its option among `args` (torchrun's own words), else PET_<NAME> in `env` (the
    variables the script gives torchrun: exported, or set in front of the launch), else torchrun's default."""
    given = options(args, {name}).get(name)
    if given is not None:
        return TorchrunCount(given, f"--{name} {given}")
    variable = "PET_" + name.upper().replace("-", "_")
    if variable in env:
        return TorchrunCount(env[variable], f"no --{name}, {variable}={env[variable]} in torchrun's environment")
    return TorchrunCount(_DEFAULTS[name], f"no --{name} (torchrun's default: {_DEFAULTS[name]})")
