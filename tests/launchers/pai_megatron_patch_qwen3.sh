#!/bin/bash
# The structure of Pai-Megatron-Patch's examples/qwen3/run_mcore_qwen3.sh (alibaba/Pai-Megatron-Patch,
# commit 0f5c122f6ddf417bd848e7deadf687d6dfdc9340), written anew for the launcher corpus: the GPU count asked
# of torch (`python -c "...device_count()"`), torchrun's options in one unquoted string, output directories
# made and the checkpoint's JSON files copied (`find ... | xargs -0 cp -t DIR`) before the launch, the command
# built as a string that `eval` runs.
#   bash pai_megatron_patch_qwen3.sh dsw A3B 1 64 1e-5 1e-6 4096 4096 bf16 1 2 1 1 8 true true true false sel false 100 /data /data /ckpt/qwen3 1000000000 10000000 /out
set -e
ENV=$1
CURRENT_DIR="$( cd "$( dirname "$0" )" && pwd )"
PATCH_ROOT=$( dirname $( dirname ${CURRENT_DIR}))
export PYTHONPATH=${PATCH_ROOT}:${PATCH_ROOT}/backends/megatron/Megatron-LM:$PYTHONPATH
export CUDA_DEVICE_MAX_CONNECTIONS=1

if [ $ENV = dsw ]; then
    MASTER_ADDR=localhost
    MASTER_PORT=$(shuf -n 1 -i 10000-65535)
    NNODES=1
    NODE_RANK=0
    GPUS_PER_NODE=`python -c "import torch; print(torch.cuda.device_count())"`
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
CP=${12}
ETP=${13}
EP=${14}
SP=${15}
DO=${16}
FL=${17}
SFT=${18}
AC=${19}
OPTIMIZER_OFFLOAD=${20}
SAVE_INTERVAL=${21}
DATASET_PATH=${22}
VALID_DATASET_PATH=${23}
PRETRAIN_CHECKPOINT_PATH=${24}
TRAIN_TOKENS=${25}
WARMUP_TOKENS=${26}
OUTPUT_BASEPATH=${27}

if [ $FL = true ]; then
    attn_backend_option=" --attention-backend flash"
else
    attn_backend_option=" --attention-backend fused"
fi

if [ $MODEL_SIZE = 0.6B ]; then
    NUM_LAYERS=28
    HIDDEN_SIZE=1024
    NUM_ATTENTION_HEADS=16
    INTERMEDIATE_SIZE=3072
    NUM_KEY_VALUE_HEADS=8
    MAX_POSITION_EMBEDDINGS=40960
    EXTRA_VOCAB_SIZE=293
    moe_options=""
    tie_option=""
elif [ $MODEL_SIZE = A3B ]; then
    NUM_LAYERS=48
    HIDDEN_SIZE=2048
    NUM_ATTENTION_HEADS=32
    INTERMEDIATE_SIZE=6144
    MOE_INTERMEDIATE_SIZE=768
    NUM_KEY_VALUE_HEADS=4
    MAX_POSITION_EMBEDDINGS=40960
    EXTRA_VOCAB_SIZE=293
    NUM_EXPERTS=128
    ROUTER_TOPK=8
    moe_options=" \
        --moe-grouped-gemm \
        --moe-token-dispatcher-type alltoall \
        --moe-router-topk ${ROUTER_TOPK} \
        --num-experts ${NUM_EXPERTS} \
        --expert-tensor-parallel-size ${ETP} \
        --expert-model-parallel-size ${EP} \
        --moe-ffn-hidden-size ${MOE_INTERMEDIATE_SIZE} \
        --moe-router-load-balancing-type aux_loss \
        --moe-aux-loss-coeff 0.001 \
        --moe-layer-freq '([1]*48)'"
    tie_option=" --untie-embeddings-and-output-weights"
fi
gqa_options=" --group-query-attention --num-query-groups ${NUM_KEY_VALUE_HEADS}"

if [ $AC = full ]; then
    activation_checkpoint_options=" --recompute-method uniform --recompute-num-layers 1 --recompute-granularity full"
elif [ $AC = sel ]; then
    activation_checkpoint_options=" --recompute-activations"
else
    activation_checkpoint_options=" "
fi

if [ $PR = bf16 ]; then
    pr_options=" --bf16"
fi
if [ $DO = true ]; then
    do_option=" --use-distributed-optimizer"
fi
if [ $SP = true ] && [ $TP -gt 1 ]; then
    sp_option=" --sequence-parallel"
fi
if [ $PRETRAIN_CHECKPOINT_PATH != none ]; then
    load_option=" --load $PRETRAIN_CHECKPOINT_PATH"
fi

TRAIN_ITERS=$(( ${TRAIN_TOKENS} / ${GLOBAL_BATCH_SIZE} / ${SEQ_LEN} ))
LR_WARMUP_ITERS=$(( ${WARMUP_TOKENS} / ${GLOBAL_BATCH_SIZE} / ${SEQ_LEN} ))
PREFIX="pretrain-mcore-qwen3-${MODEL_SIZE}-lr-${LR}-bs-${BATCH_SIZE}-gbs-${GLOBAL_BATCH_SIZE}-seqlen-${SEQ_LEN}"
NAME="${PREFIX}-pr-${PR}-tp-${TP}-pp-${PP}-cp-${CP}-ac-${AC}"

# output directories, and the checkpoint's configuration files copied next to the new checkpoints
mkdir -p "${OUTPUT_BASEPATH}/tensorboard/"
mkdir -p "${OUTPUT_BASEPATH}/checkpoint/"
current_time=$(date "+%Y.%m.%d-%H.%M.%S")
TENSORBOARD_DIR="${OUTPUT_BASEPATH}/tensorboard/${NAME}_${current_time}"
mkdir -p ${TENSORBOARD_DIR}
SAVED_CHECKPOINT_PATH="${OUTPUT_BASEPATH}/checkpoint/${NAME}"
mkdir -p ${SAVED_CHECKPOINT_PATH}
find -L ${PRETRAIN_CHECKPOINT_PATH} -maxdepth 1 -type f -name "*.json" -print0 | xargs -0 cp -t ${SAVED_CHECKPOINT_PATH}

megatron_options="  \
        --save ${SAVED_CHECKPOINT_PATH} \
        --lr ${LR} \
        --min-lr ${MIN_LR} \
        --lr-decay-style cosine \
        --weight-decay 0.01 \
        --clip-grad 1.0 \
        --lr-warmup-iters ${LR_WARMUP_ITERS} \
        --train-iters ${TRAIN_ITERS} \
        --micro-batch-size ${BATCH_SIZE} \
        --global-batch-size ${GLOBAL_BATCH_SIZE} \
        --num-layers ${NUM_LAYERS} \
        --hidden-size ${HIDDEN_SIZE} \
        --num-attention-heads ${NUM_ATTENTION_HEADS} \
        --ffn-hidden-size ${INTERMEDIATE_SIZE} \
        --seq-length ${SEQ_LEN} \
        --max-position-embeddings ${MAX_POSITION_EMBEDDINGS} \
        --max-padding-length ${PAD_LEN} \
        --log-interval 1 \
        --save-interval ${SAVE_INTERVAL} \
        --tensorboard-dir ${TENSORBOARD_DIR} \
        --tensor-model-parallel-size ${TP} \
        --pipeline-model-parallel-size ${PP} \
        --context-parallel-size ${CP} \
        --dataset MMAP \
        --data-path ${DATASET_PATH} \
        --split 99,1,0 \
        --extra-vocab-size ${EXTRA_VOCAB_SIZE} \
        --patch-tokenizer-type Qwen3Tokenizer \
        --swiglu \
        --normalization RMSNorm \
        --norm-epsilon 1e-6 \
        --position-embedding-type rope \
        --rotary-base 1000000 \
        --disable-bias-linear \
        --qk-layernorm \
        --kv-channels 128 \
        --no-save-optim \
        --transformer-impl transformer_engine \
        --train-mode pretrain"

run_cmd="torchrun $DISTRIBUTED_ARGS pretrain_qwen.py
 ${megatron_options} ${pr_options} ${load_option} ${activation_checkpoint_options} \
 ${do_option} ${sp_option} ${moe_options} ${attn_backend_option} ${tie_option} ${gqa_options}"

echo ${run_cmd}
eval ${run_cmd}
set +x
