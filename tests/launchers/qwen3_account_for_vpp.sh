#!/bin/bash
# Qwen3-30B-A3B-style MoE with interleaving: the embedding and the loss are counted as layers in the
# pipeline split (48 + 2 layers over PP 5 ranks, VPP 2).
GPUS_PER_NODE=8
NNODES=5

PARALLEL=(
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 5 --num-virtual-stages-per-pipeline-rank 2
    --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split
    --expert-model-parallel-size 8
)

torchrun --nproc_per_node ${GPUS_PER_NODE} --nnodes ${NNODES} pretrain_gpt.py \
    --num-layers 48 --hidden-size 2048 --ffn-hidden-size 6144 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 4 --kv-channels 128 --qk-layernorm \
    --seq-length 4096 --max-position-embeddings 40960 --swiglu --normalization RMSNorm \
    --disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope \
    --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768 --moe-grouped-gemm \
    --moe-token-dispatcher-type alltoall --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-3 \
    "${PARALLEL[@]}" --micro-batch-size 1 --global-batch-size 400 --bf16 --use-distributed-optimizer \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model Qwen/Qwen3-30B-A3B --mock-data \
    --lr 1e-4 --train-iters 100 --log-interval 1
