#!/bin/bash
# gpt-oss-style MoE training (in the style of Megatron-LM's examples/gptoss/02_train.sh): settings
# from environment variables with defaults, paths optional.

set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NUM_NODES=${NUM_NODES:-1}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
NODE_RANK=${NODE_RANK:-0}

CHECKPOINT_PATH=${CHECKPOINT_PATH:-"./checkpoints/gpt_oss"}
TENSORBOARD_DIR=${TENSORBOARD_DIR:-"./tensorboard/gpt_oss"}
DATA_PATH=${DATA_PATH:-""}
TOKENIZER=${TOKENIZER:-"openai/gpt-oss-20b"}

TP=${TP:-1}
PP=${PP:-1}
EP=${EP:-8}
MBS=${MBS:-1}
GBS=${GBS:-64}

if [[ -z "$DATA_PATH" ]]; then
    DATA_ARGS="--mock-data --tokenizer-type HuggingFaceTokenizer --tokenizer-model $TOKENIZER"
else
    DATA_ARGS="--data-path $DATA_PATH --tokenizer-type HuggingFaceTokenizer --tokenizer-model $TOKENIZER --split 99,1,0"
fi

MODEL_ARGS="--num-layers 24 --hidden-size 2880 --ffn-hidden-size 2880 --num-attention-heads 64 \
    --group-query-attention --num-query-groups 8 --kv-channels 64 --seq-length 4096 \
    --max-position-embeddings 131072 --position-embedding-type rope --rotary-base 150000 \
    --normalization RMSNorm --swiglu --disable-bias-linear --untie-embeddings-and-output-weights"

MOE_ARGS="--num-experts 32 --moe-router-topk 4 --moe-ffn-hidden-size 2880 --moe-grouped-gemm \
    --moe-token-dispatcher-type alltoall --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-3"

TRAIN_ARGS="--micro-batch-size $MBS --global-batch-size $GBS --train-iters 1000 --lr 3e-4 --min-lr 3e-5 \
    --lr-decay-style cosine --lr-warmup-iters 100 --bf16 --use-distributed-optimizer"

PARALLEL_ARGS="--tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP --expert-model-parallel-size $EP"

OUTPUT_ARGS="--save $CHECKPOINT_PATH --load $CHECKPOINT_PATH --tensorboard-dir $TENSORBOARD_DIR --log-interval 10 --save-interval 500"

torchrun --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NUM_NODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    pretrain_gpt.py $MODEL_ARGS $MOE_ARGS $TRAIN_ARGS $PARALLEL_ARGS $DATA_ARGS $OUTPUT_ARGS
