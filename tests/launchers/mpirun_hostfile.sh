#!/bin/bash
# mpirun starts one process per GPU from a host file; Megatron reads the rank from Open MPI's
# variables through a small wrapper environment.
NP=${NP:-16}
HOSTFILE=${HOSTFILE:-/etc/mpi/hostfile}

export MASTER_ADDR=${MASTER_ADDR:-node0}
export MASTER_PORT=29500

MODEL="--num-layers 28 --hidden-size 3584 --ffn-hidden-size 18944 --num-attention-heads 28 \
--group-query-attention --num-query-groups 4 --seq-length 4096 --max-position-embeddings 32768 \
--swiglu --normalization RMSNorm --disable-bias-linear --add-qkv-bias --untie-embeddings-and-output-weights \
--position-embedding-type rope --rotary-base 1000000"
TRAIN="--micro-batch-size 1 --global-batch-size 256 --lr 1e-5 --train-iters 100 --bf16 \
--tensor-model-parallel-size 4 --sequence-parallel --use-distributed-optimizer"
DATA="--tokenizer-type HuggingFaceTokenizer --tokenizer-model Qwen/Qwen2-7B --mock-data"

mpirun -np ${NP} --hostfile ${HOSTFILE} --bind-to none -map-by slot \
    -x MASTER_ADDR -x MASTER_PORT -x NCCL_DEBUG=WARN -x CUDA_DEVICE_MAX_CONNECTIONS=1 \
    python pretrain_gpt.py ${MODEL} ${TRAIN} ${DATA} --log-interval 1
