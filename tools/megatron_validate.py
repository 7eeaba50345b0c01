"""Check flag lists with Megatron-LM's own validator, on a CPU-only machine.

Runs with the Python of the validator environment (`.ci/megatron_env.sh` builds it and prints its
path); the tests (tests/test_megatron_validator.py) call it as a subprocess.  Reads a JSON list of
cases on stdin, each {"name", "argv", "world_size", "env"} (env: what the launcher exports; optional "arch": the GPUs'
compute capability major, 9 by default, 10 for Blackwell), and prints a JSON list of {"name", "ok", "error"} on stdout.

For each case, as reference/megatron.md section 5 describes: WORLD_SIZE/RANK set, then
`parse_args()`, `validate_args()`, `core_transformer_config_from_args()` (the TransformerConfig
and ModelParallelConfig checks), the micro-batch calculator, and `initialize_model_parallel()` on
a fake process group (the expert-folding rules that only process-group setup checks).  Two CUDA
queries are patched for CPU (compute capability 9.0, or the case's "arch"); `--no-rope-fusion` and
`--transformer-impl local` are appended because Transformer Engine is not installed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Callable

DEFAULT_ENV = Path.home() / ".cache" / "hapmoe" / "megatron-venv"


def megatron_python() -> str | None:
    """The validator environment's python: $HAPMOE_MEGATRON_PYTHON, or the default environment when
    .ci/megatron_env.sh finished building it (None: not built).  For the callers on the host's python."""
    explicit = os.environ.get("HAPMOE_MEGATRON_PYTHON")
    if explicit:
        return explicit if Path(explicit).exists() else None
    if (DEFAULT_ENV / ".hapmoe-ready").exists() and (DEFAULT_ENV / "bin" / "python").exists():
        return str(DEFAULT_ENV / "bin" / "python")
    return None


def read_help_texts_once() -> None:
    """Megatron's parse_args() builds part of its parser from config dataclasses (argument_utils'
    ArgumentGroupFactory), reading each class's source with inspect and ast for the help texts, at every call: 85% of
    a case's 0.23 s.  A class's source does not change within one process, so each is read once here (a copy
    returned each time); the parser, its defaults and its checks are Megatron's, unchanged."""
    try:
        from megatron.training.argument_utils import ArgumentGroupFactory
    except ImportError:  # megatron-core < 0.16: no arguments built from dataclasses
        return
    read = ArgumentGroupFactory._get_field_docstrings
    texts: dict[type, dict[str, str]] = {}

    def read_once(self: object, src_cfg_class: type) -> dict[str, str]:
        if src_cfg_class not in texts:
            texts[src_cfg_class] = read(self, src_cfg_class)
        return dict(texts[src_cfg_class])

    ArgumentGroupFactory._get_field_docstrings = read_once


def run_cases(cases: list[dict], run: Callable[[dict, dict], None]) -> list[dict]:
    """Each case through `run(case, out)` with Megatron's prints captured.  `out` starts as {"name", "ok": True,
    "error": None} and `run` adds what it measures; argparse's exit (an unknown flag, a bad value) and anything
    Megatron raises make it ok=False with Megatron's reason (`read_help_texts_once` first).  Shared by the tools that run Megatron's code
    (megatron_params.py, megatron_memory.py import it from this directory)."""
    read_help_texts_once()
    results = []
    for case in cases:
        out = {"name": case.get("name", ""), "ok": True, "error": None}
        sink = io.StringIO()
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                run(case, out)
        except SystemExit as exc:  # argparse: unknown flag, bad value
            lines = [ln for ln in sink.getvalue().splitlines() if "error" in ln.lower()]
            out.update(ok=False, error=(lines[-1] if lines else f"argparse exited with {exc.code}").strip())
        except BaseException as exc:  # noqa: BLE001 - report whatever Megatron raised
            last = traceback.extract_tb(exc.__traceback__)[-1]
            out.update(ok=False, error=f"{type(exc).__name__}: {exc} ({os.path.basename(last.filename)}:{last.lineno})")
        results.append(out)
    return results


def main() -> None:
    warnings.filterwarnings("ignore")
    cases = json.load(sys.stdin)
    with contextlib.redirect_stdout(io.StringIO()):
        import torch
        from megatron.core import parallel_state
        from megatron.core.num_microbatches_calculator import (
            destroy_num_microbatches_calculator,
            init_num_microbatches_calculator,
        )
        from megatron.training import arguments

        try:
            from megatron.training.argument_utils import core_transformer_config_from_args
        except ImportError:  # megatron-core < 0.16
            core_transformer_config_from_args = arguments.core_transformer_config_from_args
        from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    arguments.get_device_arch_version = lambda: 9
    # Transformer Engine is not installed: its version checks answer as a recent TE would
    # (reference/megatron.md section 5, item 4), so FP8 MoE and friends are judged by Megatron's rules.
    from megatron.core.transformer import transformer_config

    for module in (transformer_config, arguments):
        if hasattr(module, "is_te_min_version"):
            module.is_te_min_version = lambda *a, **k: True
    # TE's fused MoE kernels (--moe-permute-fusion, --moe-router-fusion) are present in a TE install
    from megatron.core.transformer.moe import moe_utils

    for name in dir(moe_utils):
        if name.startswith("fused_") and getattr(moe_utils, name) is None:
            setattr(moe_utils, name, lambda *a, **k: None)
    def check(case: dict, out: dict) -> None:
        world = int(case["world_size"])
        arch = int(case.get("arch", 9))  # validate_args asks some things of GPUs before Blackwell (arch < 10) only
        torch.cuda.get_device_capability = lambda *a, **k: (arch, 0)
        arguments.get_device_arch_version = lambda: arch
        os.environ.update({"WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0"})
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        os.environ.update(case.get("env", {}))  # what the launcher exports
        sys.argv = ["pretrain_gpt.py", *case["argv"], "--no-rope-fusion", "--transformer-impl", "local"]
        args = arguments.parse_args()
        arguments.validate_args(args)
        core_transformer_config_from_args(args)
        destroy_num_microbatches_calculator()
        init_num_microbatches_calculator(
            0, None, args.global_batch_size, args.micro_batch_size, args.data_parallel_size, False
        )
        destroy_num_microbatches_calculator()
        torch.distributed.init_process_group(backend="fake", rank=0, world_size=world, store=FakeStore())
        try:
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=args.tensor_model_parallel_size,
                pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
                context_parallel_size=args.context_parallel_size,
                expert_model_parallel_size=args.expert_model_parallel_size,
                expert_tensor_parallel_size=args.expert_tensor_parallel_size,
                create_gloo_process_groups=False,
            )
        finally:
            parallel_state.destroy_model_parallel()
            torch.distributed.destroy_process_group()

    results = run_cases(cases, check)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
