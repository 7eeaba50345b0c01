#!/usr/bin/env bash
# NeMo-style launcher: every knob is an environment variable with a `: ${X:=default}` line, the
# flags are joined into one string, and python -m torch.distributed.run starts the job.

: ${NUM_NODES:=2}
: ${GPUS_PER_NODE:=8}
: ${TP:=2}
: ${PP:=2}
: ${CP:=1}
: ${SEQ_LEN:=4096}
: ${GBS:=512}
: ${MBS:=1}
: ${RECOMPUTE:=selective}
: ${RESULTS:=/results/llama2-13b}

export NCCL_IB_SL=1
export TORCH_NCCL_AVOID_RECORD_STREAMS=1

ARGS="--num-layers 40 --hidden-size 5120 --ffn-hidden-size 13824 --num-attention-heads 40"
ARGS="$ARGS --seq-length ${SEQ_LEN} --max-position-embeddings ${SEQ_LEN} --swiglu --normalization RMSNorm"
ARGS="$ARGS --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights"
ARGS="$ARGS --tensor-model-parallel-size ${TP} --pipeline-model-parallel-size ${PP} --context-parallel-size ${CP}"
ARGS="$ARGS --micro-batch-size ${MBS} --global-batch-size ${GBS} --bf16 --use-distributed-optimizer"
if [ "${TP}" -gt 1 ]; then
  ARGS="$ARGS --sequence-parallel"
fi
case "${RECOMPUTE}" in
  selective) ARGS="$ARGS --recompute-activations" ;;
  full) ARGS="$ARGS --recompute-granularity full --recompute-method uniform --recompute-num-layers 1" ;;
  none) ;;
esac
ARGS="$ARGS --tokenizer-type Llama2Tokenizer --tokenizer-model /models/llama-2-13b/tokenizer.model"
ARGS="$ARGS --mock-data --lr 3e-4 --train-iters 100 --log-interval 1 --save ${RESULTS}/ckpt --save-interval 50"

python -m torch.distributed.run --nnodes=${NUM_NODES} --nproc-per-node=${GPUS_PER_NODE} \
    --rdzv-backend=c10d --rdzv-endpoint=${MASTER_ADDR:-localhost}:29500 \
    /opt/megatron-lm/pretrain_gpt.py ${ARGS} 2>&1 | tee ${RESULTS}/log.txt
