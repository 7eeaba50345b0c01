#!/bin/bash
# Pai-Megatron-Patch style: many positional arguments, option strings chosen in if/elif chains,
# and the command built as a string that `eval` runs.
#   bash pai_megatron_patch_eval.sh dsw A14B 1 16 1e-5 1e-6 4096 4096 bf16 2 1 4 true true true sel false 100 /data /data /ckpt 100000 10000 /out
set -e
ENV=$1
CURRENT_DIR="$( cd "$( dirname "$0" )" && pwd )"
MEGATRON_PATH=$( dirname $( dirname ${CURRENT_DIR}))
export PYTHONPATH=${MEGATRON_PATH}:${MEGATRON_PATH}/Megatron-LM-250328:$PYTHONPATH
export CUDA_DEVICE_MAX_CONNECTIONS=1

if [ $ENV = dsw ]; then
    export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
    MASTER_ADDR=localhost
    MASTER_PORT=$(shuf -n 1 -i 10000-65535)
    NNODES=1
    NODE_RANK=0
    GPUS_PER_NODE=8
elif [ $ENV = dlc ]; then
    NNODES=${WORLD_SIZE}
    NODE_RANK=${RANK}
    GPUS_PER_NODE=${KUBERNETES_CONTAINER_RESOURCE_GPU}
fi

DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK --master_addr $MASTER_ADDR --master_port $MASTER_PORT"

MODEL_SIZE=$2
BATCH_SIZE=$3
GLOBAL_BATCH_SIZE=$4
LR=$5
MIN_LR=$6
SEQ_LEN=$7
PAD_LEN=$8
PR=$9
TP=${10}
PP=${11}
EP=${12}
SP=${13}
DO=${14}
FL=${15}
AC=${16}
OPTIMIZER_OFFLOAD=${17}
SAVE_INTERVAL=${18}
DATASET_PATH=${19}
VALID_DATASET_PATH=${20}
PRETRAIN_CHECKPOINT_PATH=${21}
TRAIN_TOKENS=${22}
WARMUP_TOKENS=${23}
OUTPUT_BASEPATH=${24}

if [ $MODEL_SIZE = A14B ]; then
    HIDDEN_SIZE=3584
    NUM_ATTN_HEADS=28
    NUM_LAYERS=28
    INTERMEDIATE_SIZE=18944
    MOE_INTERMEDIATE_SIZE=2560
    SHARED_EXPERT_INTERMEDIATE_SIZE=20480
    MAX_POSITION_EMBEDDINGS=131072
    EXTRA_VOCAB_SIZE=293
    NUM_KEY_VALUE_HEADS=4
    NUM_EXPERTS=64
    ROUTER_TOPK=8
fi

if [ $AC = full ]; then
    activation_checkpoint_options=" \
        --recompute-method uniform \
        --recompute-num-layers 1 \
        --recompute-granularity full"
elif [ $AC = sel ]; then
    activation_checkpoint_options=" \
        --recompute-activations"
elif [ $AC = none ]; then
    activation_checkpoint_options=" "
fi

if [ $PR = fp16 ]; then
    pr_options=" --fp16 --apply-query-key-layer-scaling"
elif [ $PR = bf16 ]; then
    pr_options=" --bf16"
fi

if [ $DO = true ]; then
    do_options=" --use-distributed-optimizer"
elif [ $DO = false ]; then
    do_options=" "
fi

if [ $SP = true ] && [ $TP -gt 1 ]; then
    sp_options=" --sequence-parallel"
elif [ $SP = false ]; then
    sp_options=" "
fi

if [ $PRETRAIN_CHECKPOINT_PATH != none ]; then
    load_options=" --load $PRETRAIN_CHECKPOINT_PATH"
fi

moe_options=" \
    --moe-router-topk ${ROUTER_TOPK} \
    --num-experts ${NUM_EXPERTS} \
    --moe-aux-loss-coeff 1e-2 \
    --expert-model-parallel-size ${EP} \
    --moe-ffn-hidden-size ${MOE_INTERMEDIATE_SIZE} \
    --moe-shared-expert-intermediate-size ${SHARED_EXPERT_INTERMEDIATE_SIZE} \
    --moe-router-load-balancing-type aux_loss \
    --moe-grouped-gemm \
    --moe-token-dispatcher-type alltoall"

TRAIN_ITERS=$(( ${TRAIN_TOKENS} / ${GLOBAL_BATCH_SIZE} / ${SEQ_LEN} ))
LR_WARMUP_ITERS=$(( ${WARMUP_TOKENS} / ${GLOBAL_BATCH_SIZE} / ${SEQ_LEN} ))
NAME="${ENV}-pretrain-mcore-qwen2-moe-${MODEL_SIZE}-lr-${LR}-bs-${BATCH_SIZE}-gbs-${GLOBAL_BATCH_SIZE}-tp-${TP}-pp-${PP}-ep-${EP}"

megatron_options="  \
        --save ${OUTPUT_BASEPATH}/checkpoint/${NAME} \
        --lr ${LR} \
        --min-lr ${MIN_LR} \
        --lr-decay-style cosine \
        --weight-decay 0.1 \
        --adam-beta1 0.9 \
        --adam-beta2 0.95 \
        --clip-grad 1.0 \
        --init-method-std 0.008 \
        --attention-dropout 0.0 \
        --hidden-dropout 0.0 \
        --lr-warmup-iters ${LR_WARMUP_ITERS} \
        --train-iters ${TRAIN_ITERS} \
        --micro-batch-size ${BATCH_SIZE} \
        --global-batch-size ${GLOBAL_BATCH_SIZE} \
        --num-layers ${NUM_LAYERS} \
        --hidden-size ${HIDDEN_SIZE} \
        --num-attention-heads ${NUM_ATTN_HEADS} \
        --ffn-hidden-size ${INTERMEDIATE_SIZE} \
        --seq-length ${SEQ_LEN} \
        --max-position-embeddings ${MAX_POSITION_EMBEDDINGS} \
        --log-interval 1 \
        --eval-interval 10000 \
        --eval-iters 10 \
        --save-interval ${SAVE_INTERVAL} \
        --tensorboard-dir ${OUTPUT_BASEPATH}/tensorboard/${NAME} \
        --tensor-model-parallel-size ${TP} \
        --pipeline-model-parallel-size ${PP} \
        --dataset LLama-Pretrain-Idxmap \
        --train-data-path ${DATASET_PATH} \
        --valid-data-path ${VALID_DATASET_PATH} \
        --split 99,1,0 \
        --extra-vocab-size ${EXTRA_VOCAB_SIZE} \
        --patch-tokenizer-type Qwen2Tokenizer \
        --swiglu \
        --normalization RMSNorm \
        --use-rotary-position-embeddings \
        --position-embedding-type rope \
        --untie-embeddings-and-output-weights \
        --disable-bias-linear \
        --add-qkv-bias \
        --group-query-attention \
        --num-query-groups ${NUM_KEY_VALUE_HEADS} \
        --rotary-base 1000000 \
        --eod-mask-loss \
        --no-save-optim \
        --transformer-impl transformer_engine"

run_cmd="torchrun $DISTRIBUTED_ARGS pretrain_qwen.py
 ${megatron_options} ${pr_options} ${load_options} ${activation_checkpoint_options} \
 ${do_options} ${sp_options} ${moe_options}"

echo ${run_cmd}
eval ${run_cmd}
set +x
