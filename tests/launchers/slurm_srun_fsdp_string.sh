#!/bin/bash
#SBATCH --job-name=megatron-fsdp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
# Slurm batch script in the style of Megatron-LM's Megatron-FSDP example: the command is built as
# a string and srun runs it with bash -c on every node, where torchrun starts 8 ranks.

MEGATRON_PATH=${MEGATRON_PATH:-/opt/megatron-lm}
CONTAINER_IMAGE=${CONTAINER_IMAGE:-nvcr.io/nvidia/pytorch:25.04-py3}
OUTPUT=${OUTPUT:-/lustre/runs/fsdp}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)

DISTRIBUTED_ARGS="--nproc_per_node 8 --nnodes ${SLURM_NNODES:-2} --rdzv_id ${SLURM_JOB_ID:-1} \
    --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:29500"

MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
    --group-query-attention --num-query-groups 8 --kv-channels 128
    --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope
    --swiglu --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B
)
TRAIN_ARGS=(
    --micro-batch-size 1 --global-batch-size 128 --lr 3e-4 --train-iters 200 --bf16
    --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params
    --use-distributed-optimizer --ckpt-format fsdp_dtensor
    --mock-data --log-interval 1 --save ${OUTPUT}/ckpt --save-interval 100
)

CMD="cd ${MEGATRON_PATH} && torchrun ${DISTRIBUTED_ARGS} pretrain_gpt.py ${MODEL_ARGS[*]} ${TRAIN_ARGS[*]}"

srun --container-image=${CONTAINER_IMAGE} --container-mounts=/lustre:/lustre \
    --output=${OUTPUT}/%x_%j_%t.log bash -c "${CMD}"
