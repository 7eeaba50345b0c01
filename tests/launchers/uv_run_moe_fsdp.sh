#!/bin/bash

# A 24-layer MoE (64 experts, top-8) trained with Megatron-FSDP on one H100 node.  Written for the
# planner's corpus in the structure of Megatron-LM's examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh:
# optional positional paths, a `uv run` prefix held in a variable (on unless USE_UV=0), a profiler
# prefix held in an array that is empty unless NSYS_PROFILE=1, and one `python -m torch.distributed.run`
# behind both, with the flag arrays expanded unquoted.

CHECKPOINT_PATH=${1:-"checkpoints/moe_fsdp"}
DATA_ARG=${2:-"MOCK"}          # a data prefix, or MOCK for synthetic data
TENSORBOARD_LOGS_PATH=${3:-"tensorboard_logs/moe_fsdp"}

mkdir -p "$(dirname "$CHECKPOINT_PATH")" "$(dirname "$TENSORBOARD_LOGS_PATH")"

GPUS_PER_NODE=8
NUM_NODES=1
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
NODE_RANK=${NODE_RANK:-0}

PRETRAIN_SCRIPT_PATH="pretrain_gpt.py"   # run from the root of a Megatron-LM checkout

NSYS_PROFILE=${NSYS_PROFILE:-0}

# the project's virtual environment through uv, or the python on PATH
USE_UV=${USE_UV:-1}
if [ "${USE_UV}" = 1 ]; then
    VENV_PREFIX="uv run"
else
    VENV_PREFIX=""
fi

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

MODEL_ARGS=(
    --use-mcore-models
    --num-layers 24
    --hidden-size 2048
    --ffn-hidden-size 6144
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 4
    --kv-channels 128
    --qk-layernorm
    --seq-length 4096
    --max-position-embeddings 4096
    --position-embedding-type rope
    --rotary-base 1000000
    --normalization RMSNorm
    --swiglu
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    --num-experts 64
    --moe-router-topk 8
    --moe-ffn-hidden-size 768
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-3
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128
    --train-iters 100
    --lr 3e-4
    --min-lr 3e-5
    --lr-decay-style cosine
    --lr-warmup-iters 10
    --clip-grad 1.0
    --bf16
    --use-megatron-fsdp
    --data-parallel-sharding-strategy optim_grads_params
    --no-gradient-accumulation-fusion
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --ckpt-format fsdp_dtensor
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --expert-model-parallel-size 8
    --context-parallel-size 1
)

if [[ "$DATA_ARG" == "MOCK" ]]; then
    DATA_ARGS_LIST=(--mock-data --tokenizer-type NullTokenizer --vocab-size 151936)
else
    DATA_ARGS_LIST=(--data-path "$DATA_ARG" --tokenizer-type HuggingFaceTokenizer --tokenizer-model Qwen/Qwen3-30B-A3B
                    --split 99,1,0)
fi

EVAL_AND_LOGGING_ARGS=(
    --log-interval 1
    --eval-iters 10
    --eval-interval 100
    --save-interval 1000
    --save "$CHECKPOINT_PATH"
    --load "$CHECKPOINT_PATH"
    --tensorboard-dir "$TENSORBOARD_LOGS_PATH"
)

if [ "${NSYS_PROFILE}" = 1 ]; then
    TRAINING_ARGS+=(--profile --profile-step-start 8 --profile-step-end 12 --profile-ranks 0)
    PROFILE_CMD=(nsys profile --sample=none --trace=cuda,nvtx -o nsys_profiles/moe_fsdp)
else
    PROFILE_CMD=()
fi

if [ ! -f "$PRETRAIN_SCRIPT_PATH" ]; then
    echo "Error: $PRETRAIN_SCRIPT_PATH not found; run this script from the root of Megatron-LM"
    exit 1
fi

$VENV_PREFIX "${PROFILE_CMD[@]}" python -m torch.distributed.run ${DISTRIBUTED_ARGS[@]} \
    "$PRETRAIN_SCRIPT_PATH" \
    ${MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS_LIST[@]} \
    ${EVAL_AND_LOGGING_ARGS[@]}
