"""Megatron-LM's own parameter count for flag lists: the model Megatron builds, counted, on a CPU-only machine.

Runs with the Python of the validator environment (`.ci/megatron_env.sh`; tests/test_megatron_params.py calls it as a
subprocess, as tests/test_megatron_validator.py calls tools/megatron_validate.py).  Reads a JSON list of cases on
stdin, each {"name", "argv"} (a single-GPU run: no parallel flags), and prints a JSON list of {"name", "ok", "error",
"parameters", "by_module"} on stdout.

For each case: Megatron's `parse_args()`, `validate_args()` and `core_transformer_config_from_args()`, then the GPT
model `pretrain_gpt.py` builds (megatron-core's `GPTModel` with the decoder block spec of
`get_gpt_decoder_block_spec`, and the MTP block when the flags ask for one), built on PyTorch's meta device (no
memory is allocated, so a 671B model is counted in seconds), and `sum(p.numel() for p in model.parameters())`.  That
is the count of the module tree Megatron trains, which is not always what Megatron's own theoretical formula
(`megatron/training/theoretical_memory_usage.py`) says: the formula gives the gated 3/2 factor to `--swiglu` only,
so a `--quick-geglu` model (gpt-oss) is counted there with two MLP matrices although Megatron builds three.

Transformer Engine is not installed in that environment, so the local (`--transformer-impl local`) layer specs are
built: the same weights, biases and norms as Transformer Engine's fused modules (the local core attention, which has
no parameters, is given multi-latent attention's head sizes and ignores them).  CUDA streams, events and the current
device, which some modules ask for when they are built, answer for the meta device.
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
        from megatron.core import parallel_state
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.training import arguments
        from megatron.training.argument_utils import core_transformer_config_from_args
        from megatron.training.vocab_utils import calculate_padded_vocab_size
        from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.current_device = lambda: torch.device("meta")
    torch.cuda.Stream = lambda *a, **k: None
    torch.cuda.Event = lambda *a, **k: None
    arguments.get_device_arch_version = lambda: 9
    from megatron.core.transformer import transformer_config
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    build_attention = DotProductAttention.__init__

    def local_attention(self, *a, k_channels=None, v_channels=None, **k):  # MLA passes head sizes the local
        build_attention(self, *a, **k)  # attention does not take (it has no parameters of its own either)

    DotProductAttention.__init__ = local_attention
    for module in (transformer_config, arguments):
        if hasattr(module, "is_te_min_version"):
            module.is_te_min_version = lambda *a, **k: True
    os.environ.update({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"})
    torch.distributed.init_process_group(backend="fake", rank=0, world_size=1, store=FakeStore())
    parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    def count(case: dict, out: dict) -> None:
        sys.argv = ["pretrain_gpt.py", *case["argv"], "--no-rope-fusion", "--transformer-impl", "local",
                    "--use-cpu-initialization"]
        args = arguments.parse_args()
        arguments.validate_args(args)
        config = core_transformer_config_from_args(args)
        config.perform_initialization = False
        config.persist_layer_norm = False  # a Transformer Engine option; the local norm refuses it
        config.gradient_accumulation_fusion = False
        vocab = calculate_padded_vocab_size(args.vocab_size, args.make_vocab_size_divisible_by, 1, False)
        with torch.device("meta"):
            spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=args.normalization)
            mtp = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False) if args.mtp_num_layers else None
            model = GPTModel(
                config, spec, vocab_size=vocab, max_sequence_length=args.max_position_embeddings,
                pre_process=True, post_process=True,
                share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
                rotary_base=args.rotary_base, mtp_block_spec=mtp)
        by_module: dict[str, int] = {}
        for name, p in model.named_parameters():
            key = ".".join(part for part in name.split(".") if not part.isdigit())
            by_module[key] = by_module.get(key, 0) + p.numel()
        out["parameters"] = sum(by_module.values())
        out["by_module"] = by_module

    results = run_cases(cases, count)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
