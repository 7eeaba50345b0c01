#!/bin/bash
# Train a Mixtral-8x7B-shaped MoE model with Megatron-LM: the kind of launcher the planner reads.
#
#   bash examples/train_mixtral.sh CHECKPOINT_DIR TOKENIZER_MODEL DATA_PREFIX
#
# Each node runs this script once; torchrun starts one process per GPU.  The planner reads it the way
# bash would (nothing here is run while planning), and `solve --out` writes launch/launch.sh: this
# script with the plan's parallel flags in place of the ones below.

CHECKPOINT_DIR=$1
TOKENIZER_MODEL=$2
DATA_PREFIX=$3

GPUS_PER_NODE=8
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}

export CUDA_DEVICE_MAX_CONNECTIONS=1

MODEL=(
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336
    --num-attention-heads 32 --group-query-attention --num-query-groups 8
    --seq-length 4096 --max-position-embeddings 32768
    --position-embedding-type rope --rotary-base 1000000
    --normalization RMSNorm --swiglu --disable-bias-linear
    --untie-embeddings-and-output-weights
    --attention-dropout 0.0 --hidden-dropout 0.0
)

EXPERTS=(
    --num-experts 8 --moe-router-topk 2
    --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 0.01
    --moe-grouped-gemm --moe-token-dispatcher-type alltoall
)

TRAINING=(
    --micro-batch-size 1 --global-batch-size 256
    --train-iters 100000 --lr 1e-4 --min-lr 1e-5 --lr-decay-style cosine --lr-warmup-iters 500
    --weight-decay 0.1 --clip-grad 1.0 --bf16
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
)

# what the planner replaces: the parallel layout (and the flags that go with it)
PARALLEL=(
    --tensor-model-parallel-size 2 --sequence-parallel
    --pipeline-model-parallel-size 4
    --expert-model-parallel-size 4 --expert-tensor-parallel-size 1
)

DATA=(
    --tokenizer-type Llama2Tokenizer --tokenizer-model "$TOKENIZER_MODEL"
    --data-path "$DATA_PREFIX" --split 99990,8,2
)

OUTPUT=(
    --save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR" --save-interval 1000
    --log-interval 1 --eval-interval 1000 --eval-iters 10
)

torchrun --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    pretrain_gpt.py "${MODEL[@]}" "${EXPERTS[@]}" "${TRAINING[@]}" "${PARALLEL[@]}" "${DATA[@]}" "${OUTPUT[@]}"
