#!/bin/bash
# Pai-Megatron-Patch run_mcore_*.sh style, Pai's own flags: a MoE with Pai's gated shared expert
# (--enable-shared-expert, --shared-moe-ffn-hidden-size), activation offloading (AC=offload:
# --cpu-offloading), HybridAdam's offload policy, --patch-tokenizer-type; positional arguments,
# options chosen in if/elif chains, a torchrun command string that `eval` runs.
#   bash pai_megatron_patch_moe_offload.sh dsw A2B 1 32 2e-5 2e-6 2048 2048 bf16 1 1 4 true true offload static /data/train /data/valid none 500000000 5000000 /out
set -e
ENV=$1
HERE="$( cd "$( dirname "$0" )" && pwd )"
PATCH_ROOT=$( dirname $( dirname ${HERE}))
export PYTHONPATH=${PATCH_ROOT}:${PATCH_ROOT}/backends/megatron/Megatron-LM-250624:$PYTHONPATH
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
    GPUS_PER_NODE=${KUBERNETES_CONTAINER_RESOURCE_GPU:-8}
fi

DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK --master_addr $MASTER_ADDR --master_port $MASTER_PORT"

MODEL_SIZE=$2
MBS=$3
GBS=$4
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
AC=${15}
OFFLOAD_POLICY=${16}
TRAIN_DATA=${17}
VALID_DATA=${18}
LOAD_CKPT=${19}
TRAIN_TOKENS=${20}
WARMUP_TOKENS=${21}
OUT_DIR=${22}

if [ $MODEL_SIZE = A2B ]; then
    NUM_LAYERS=16
    HIDDEN_SIZE=2048
    NUM_ATTN_HEADS=16
    NUM_KV_HEADS=4
    FFN_SIZE=5632
    EXPERT_FFN_SIZE=1408
    SHARED_FFN_SIZE=5632
    NUM_EXPERTS=32
    TOPK=4
    EXTRA_VOCAB_SIZE=293
    MAX_POS=8192
elif [ $MODEL_SIZE = A7B ]; then
    NUM_LAYERS=28
    HIDDEN_SIZE=3584
    NUM_ATTN_HEADS=28
    NUM_KV_HEADS=4
    FFN_SIZE=18944
    EXPERT_FFN_SIZE=2560
    SHARED_FFN_SIZE=20480
    NUM_EXPERTS=64
    TOPK=8
    EXTRA_VOCAB_SIZE=293
    MAX_POS=32768
fi

moe_options=" \
    --num-experts ${NUM_EXPERTS} \
    --moe-router-topk ${TOPK} \
    --expert-model-parallel-size ${EP} \
    --moe-ffn-hidden-size ${EXPERT_FFN_SIZE} \
    --shared-moe-ffn-hidden-size ${SHARED_FFN_SIZE} \
    --enable-shared-expert \
    --moe-token-dispatcher-type alltoall \
    --moe-aux-loss-coeff 0.001"

if [ $PR = bf16 ]; then
    pr_options="--bf16"
elif [ $PR = fp16 ]; then
    pr_options="--fp16"
fi

if [ $AC = full ]; then
    ac_options="--recompute-method uniform --recompute-num-layers 1 --recompute-granularity full"
elif [ $AC = sel ]; then
    ac_options="--recompute-activations"
elif [ $AC = offload ]; then
    ac_options="--cpu-offloading --cpu-offloading-num-layers 1"
else
    ac_options=""
fi

if [ $DO = true ]; then
    do_options="--use-distributed-optimizer"
else
    do_options=""
fi

if [ $OFFLOAD_POLICY != false ]; then
    offload_options="--optimizer hybridadam --optimizer-offload-policy ${OFFLOAD_POLICY} --optimizer-offload-fraction 0.5"
else
    offload_options=""
fi

if [ $SP = true ] && [ $TP -gt 1 ]; then
    sp_options="--sequence-parallel"
else
    sp_options=""
fi

if [ $LOAD_CKPT != none ]; then
    load_options="--load $LOAD_CKPT"
fi

TRAIN_ITERS=$(( ${TRAIN_TOKENS} / ${GBS} / ${SEQ_LEN} ))
WARMUP_ITERS=$(( ${WARMUP_TOKENS} / ${GBS} / ${SEQ_LEN} ))

NAME="pretrain-mcore-moe-${MODEL_SIZE}-lr-${LR}-bs-${MBS}-gbs-${GBS}-tp-${TP}-pp-${PP}-ep-${EP}-ac-${AC}"
SAVE_DIR="${OUT_DIR}/checkpoint/${NAME}"

megatron_options=" \
    --save ${SAVE_DIR} \
    --save-interval 1000 \
    --train-data-path ${TRAIN_DATA} \
    --valid-data-path ${VALID_DATA} \
    --dataset JSON-SFT \
    --dataloader-type cyclic \
    --lr ${LR} \
    --min-lr ${MIN_LR} \
    --lr-decay-style cosine \
    --weight-decay 0.1 \
    --clip-grad 1.0 \
    --lr-warmup-iters ${WARMUP_ITERS} \
    --train-iters ${TRAIN_ITERS} \
    --micro-batch-size ${MBS} \
    --global-batch-size ${GBS} \
    --num-layers ${NUM_LAYERS} \
    --hidden-size ${HIDDEN_SIZE} \
    --num-attention-heads ${NUM_ATTN_HEADS} \
    --group-query-attention \
    --num-query-groups ${NUM_KV_HEADS} \
    --ffn-hidden-size ${FFN_SIZE} \
    --seq-length ${SEQ_LEN} \
    --max-position-embeddings ${MAX_POS} \
    --max-padding-length ${PAD_LEN} \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --extra-vocab-size ${EXTRA_VOCAB_SIZE} \
    --patch-tokenizer-type Qwen2Tokenizer \
    --swiglu \
    --normalization RMSNorm \
    --norm-epsilon 1e-6 \
    --position-embedding-type rope \
    --rotary-base 1000000 \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --add-qkv-bias \
    --transformer-impl transformer_engine \
    --log-interval 1 \
    --eval-interval 10000 \
    --eval-iters 10 \
    --no-load-optim \
    --no-load-rng \
    --num-workers 8 \
    --train-mode pretrain"

run_cmd="torchrun $DISTRIBUTED_ARGS pretrain_qwen.py
 ${megatron_options} ${pr_options} ${load_options} ${ac_options} ${do_options} ${offload_options} ${sp_options} ${moe_options}"

echo ${run_cmd}
eval ${run_cmd}
