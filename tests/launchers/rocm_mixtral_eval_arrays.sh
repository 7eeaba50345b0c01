#!/bin/bash
# A Mixtral launcher for AMD Instinct GPUs, in the style of ROCm/Megatron-LM's examples/mixtral/train_mixtral_moe.sh:
# every setting an environment default, the node's GPU count asked of torch, flag arrays per concern joined into one
# command string that eval runs, and the examples' `if [$ENABLE_PROFILING = true]` (no blank after `[`: bash
# runs a command `[0`, which is not found, so the profiling flags are never added).
export GPU_MAX_HW_QUEUES=${GPU_MAX_HW_QUEUES:-2}
export TORCH_NCCL_HIGH_PRIORITY=${TORCH_NCCL_HIGH_PRIORITY:-1}
export NCCL_IB_GID_INDEX=${NCCL_IB_GID_INDEX:-3}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}

GPUS_PER_NODE=`python3 -c "import torch; print(torch.cuda.device_count())"`
EXPERIMENT="mixtral"

MASTER_ADDR="${MASTER_ADDR:-localhost}"
MASTER_PORT="${MASTER_PORT:-27777}"
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"

TP_SIZE=${TP_SIZE:-1}
PP_SIZE=${PP_SIZE:-1}
EP_SIZE=${EP_SIZE:-8}
GBS=${GBS:-64}
MBS=${MBS:-2}
SEQLEN=${SEQLEN:-4096}
PR=${PR:-bf16}
TRAIN_ITERS=${TRAIN_ITERS:-20}
AC="${AC:-full}"
TOKENIZER_MODEL=${TOKENIZER_MODEL:-"/models/mixtral/tokenizer.model"}
DATA_CACHE_PATH="${DATA_CACHE_PATH:-../.cache}"

NAME="mcore-gbs-${GBS}-mbs-${MBS}-tp-${TP_SIZE}-pp-${PP_SIZE}-ep-${EP_SIZE}-ac-${AC}"
TRAIN_LOG=output/${EXPERIMENT}-${NAME}.log

EXTRA_ARGS=(
    --use-flash-attn
    --moe-layer-freq 1
)

ENABLE_PROFILING="${ENABLE_PROFILING:-0}"
if [$ENABLE_PROFILING = true]; then
    EXTRA_ARGS+=(
        --profile
        --profile-ranks 0
        --moe-router-force-load-balancing
    )
fi

if [ $PR = bf16 ]; then
    pr_options=(--bf16)
else
    pr_options=(--fp16)
fi

if [ $AC = full ]; then
    activation_checkpoint_options=(
            --recompute-method uniform
            --recompute-granularity full
            --recompute-num-layers 1)
else
    activation_checkpoint_options=()
fi

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

MODEL_ARGS=(
    --use-mcore-models
    --disable-bias-linear
    --seq-length ${SEQLEN}
    --max-position-embeddings 32768
    --num-layers 16
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --normalization RMSNorm
    --position-embedding-type rope
    --swiglu
    --untie-embeddings-and-output-weights
    --group-query-attention
    --num-query-groups 8
    --rotary-base 1000000
)

MOE_ARGS=(
    --num-experts 8
    --moe-router-topk 2
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-2
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --overlap-grad-reduce
)

DATA_ARGS=(
    --tokenizer-type Llama2Tokenizer
    --tokenizer-model ${TOKENIZER_MODEL}
    --mock-data
    --data-cache-path $DATA_CACHE_PATH
)

TRAINING_ARGS=(
    --micro-batch-size ${MBS}
    --global-batch-size ${GBS}
    --lr 1e-4
    --train-iters ${TRAIN_ITERS}
    --lr-decay-style cosine
    --min-lr 1.0e-5
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size ${TP_SIZE}
    --pipeline-model-parallel-size ${PP_SIZE}
    --expert-model-parallel-size ${EP_SIZE}
    --use-distributed-optimizer
)

command="torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${pr_options[@]} \
    ${activation_checkpoint_options[@]} \
    ${MOE_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${EXTRA_ARGS[@]}"

command="$command  2>&1 | tee $TRAIN_LOG"
echo "launch_command=${command}"
eval ${command}
