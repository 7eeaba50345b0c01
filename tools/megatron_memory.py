"""Megatron-LM's own theoretical memory report for flag lists, on a CPU-only machine.

Runs with the Python of the validator environment (`.ci/megatron_env.sh`; tests/test_memory_model.py calls it as
a subprocess, as tests/test_megatron_validator.py calls tools/megatron_validate.py).  Reads a JSON list of cases on
stdin, each {"name", "argv", "world_size", "num_microbatches"}, and prints a JSON list of {"name", "ok", "error",
"weight_and_optimizer_bytes", "activation_bytes"} on stdout: Megatron's `parse_args()` and `validate_args()`,
then `compute_weight_and_optimizer_memory(args)` and `compute_activation_memory(args, num_microbatches)` of
megatron/training/theoretical_memory_usage.py (the formula Megatron prints with --log-memory... at start-up:
the most loaded shard's weights, FP32 gradients and Adam state; Korthikanti et al.'s activations of the first
pipeline stage with sequence parallelism and selective recompute).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings

from megatron_validate import run_cases  # this directory is on sys.path when run as a script


def main() -> None:
    warnings.filterwarnings("ignore")
    cases = json.load(sys.stdin)
    with contextlib.redirect_stdout(io.StringIO()):
        import torch
        from megatron.training import arguments
        from megatron.training.vocab_utils import calculate_padded_vocab_size
        from megatron.training.theoretical_memory_usage import (
            compute_activation_memory,
            compute_weight_and_optimizer_memory,
        )

    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    arguments.get_device_arch_version = lambda: 9
    def measure(case: dict, out: dict) -> None:
        os.environ.update({"WORLD_SIZE": str(int(case["world_size"])), "RANK": "0", "LOCAL_RANK": "0",
                           "CUDA_DEVICE_MAX_CONNECTIONS": "1"})
        sys.argv = ["pretrain_gpt.py", *case["argv"], "--no-rope-fusion", "--transformer-impl", "local"]
        args = arguments.parse_args()
        arguments.validate_args(args)
        # what building the tokenizer sets at start-up (NullTokenizer / --vocab-size runs)
        args.padded_vocab_size = calculate_padded_vocab_size(
            args.vocab_size, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size, False)
        out["weight_and_optimizer_bytes"] = compute_weight_and_optimizer_memory(args)
        out["activation_bytes"] = compute_activation_memory(args, case.get("num_microbatches"))

    results = run_cases(cases, measure)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
