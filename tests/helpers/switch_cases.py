"""Switches the planner passes through unread but Megatron refuses without what they need (planner/megatron/rules.py
`passthrough_violations`, and `degree_flag_violations` for --defer-embedding-wgrad-compute and the p2p warm-up
overlap): each as the extra flags Megatron refuses and, where a small flag set satisfies it, the extra flags it
accepts.  The planner's side is checked in tests/test_inputs_flags.py, Megatron's own validator on both lists in
tests/test_megatron_validator.py, whose other controls start from the same small GPT (BASE)."""

from __future__ import annotations

BASE = ("--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
        "--micro-batch-size 1 --global-batch-size 16 --vocab-size 1000 --tokenizer-type NullTokenizer --mock-data "
        "--bf16").split()
MOE = "--num-experts 8 --disable-bias-linear"
WORLD = 8

# (switch, extra flags Megatron refuses, extra flags it accepts or None, words of the planner's message)
SWITCH_CASES: list[tuple[str, str, str | None, str]] = [
    ("--squared-relu", "--squared-relu", "--squared-relu --disable-bias-linear", "bias_activation_fusion"),
    ("--use-te-activation-func", "--use-te-activation-func", "--use-te-activation-func --no-bias-gelu-fusion",
     "use_te_activation_func"),
    ("--ep-overlap-early-attn-memory-release", f"{MOE} --ep-overlap-early-attn-memory-release", None,
     "overlap_moe_expert_parallel_comm must be enabled"),
    ("--fp8-output-proj", "--fp8-output-proj --fp8-format e4m3",
     "--fp8-output-proj --fp8-format e4m3 --fp8-recipe mxfp8", "fp8_recipe='mxfp8'"),
    ("--moe-router-padding-for-fp8", f"{MOE} --moe-router-padding-for-fp8",
     f"{MOE} --moe-router-padding-for-fp8 --fp8-format e4m3 --moe-token-dispatcher-type alltoall", "fp8/fp4"),
    ("--moe-router-padding-for-quantization",
     f"{MOE} --moe-router-padding-for-quantization --fp8-format e4m3", None, "allgather and alltoall_seq"),
    ("--fp16-lm-cross-entropy", "--fp16-lm-cross-entropy", None, "only support in fp16 mode"),
    ("--fp4-param-gather", "--fp4-param-gather", "--fp4-param-gather --fp4-format e2m1", "--fp4-format"),
    ("--fused-residual-rmsnorm", "--fused-residual-rmsnorm", "--fused-residual-rmsnorm --normalization RMSNorm",
     "RMSNorm"),
    ("--mla-down-proj-fusion", "--mla-down-proj-fusion", "--mla-down-proj-fusion --multi-latent-attention",
     "--multi-latent-attention"),
    ("--moe-single-grouped-weight", f"{MOE} --moe-single-grouped-weight --moe-grouped-gemm",
     f"{MOE} --moe-single-grouped-weight --moe-grouped-gemm --use-transformer-engine-op-fuser",
     "use_transformer_engine_op_fuser"),
    ("--optimizer-cpu-offload", "--optimizer-cpu-offload",
     "--optimizer-cpu-offload --use-precision-aware-optimizer --use-distributed-optimizer", "precision-aware"),
    ("--hybrid-context-parallel", "--hybrid-context-parallel", "--hybrid-context-parallel --calculate-per-token-loss",
     "--calculate-per-token-loss"),
    ("--load-main-params-from-ckpt", "--load-main-params-from-ckpt", "--load-main-params-from-ckpt --no-load-optim",
     "--no-load-optim"),
    ("--moe-paged-stash", f"{MOE} --moe-paged-stash",
     f"{MOE} --moe-paged-stash --moe-expert-rank-capacity-factor 1.5 --moe-token-dispatcher-type flex "
     "--moe-flex-dispatcher-backend hybridep --use-transformer-engine-op-fuser", "moe_expert_rank_capacity_factor"),
    ("--moe-expert-rank-capacity-factor", f"{MOE} --moe-expert-rank-capacity-factor 1.5", None, "'hybridep' or"),
    ("--use-torch-fsdp2", "--use-torch-fsdp2", None, "gradient accumulation fusion"),
    ("--batch-invariant-mode", "--batch-invariant-mode --attention-backend flash", None, "--flash-attention-version"),
    ("--fim-data", "--fim-data", None, "FIM"),
    ("--moe-single-grouped-bias", f"{MOE} --moe-grouped-gemm --moe-single-grouped-bias",
     "--num-experts 8 --moe-grouped-gemm --moe-single-grouped-bias", "add_bias_linear=True"),
    ("--fsdp-manual-registration", "--fsdp-manual-registration", None, "Megatron FSDP"),
    ("--replication", "--replication", None, "--replication-jump"),
    ("--overlap-p2p-communication-warmup-flush",
     "--overlap-p2p-communication-warmup-flush --pipeline-model-parallel-size 2",
     "--overlap-p2p-communication-warmup-flush --pipeline-model-parallel-size 2 "
     "--num-layers-per-virtual-pipeline-stage 2", "overlap_p2p_comm but not batch_p2p_comm"),
    ("--defer-embedding-wgrad-compute", "--defer-embedding-wgrad-compute",
     "--defer-embedding-wgrad-compute --pipeline-model-parallel-size 2", "pipeline model parallel is not used"),
]
