#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
# Slurm without torchrun: srun starts one task per GPU, each runs python pretrain_gpt.py and takes its
# rank from Slurm's variables.

export MASTER_ADDR=${MASTER_ADDR:-$(hostname)}
export MASTER_PORT=${MASTER_PORT:-6000}
export CUDA_DEVICE_MAX_CONNECTIONS=1

OPTIONS="--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \
  --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 512 --lr 2e-4 --train-iters 1000 \
  --bf16 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --tokenizer-type GPT2BPETokenizer \
  --vocab-file /data/gpt2-vocab.json --merge-file /data/gpt2-merges.txt --data-path /data/pile_text_document \
  --split 969,30,1 --log-interval 10 --save /ckpt/gpt-1.3b --save-interval 500 --distributed-backend nccl"

srun -N 2 --ntasks-per-node 8 --cpu-bind=none --export=ALL \
    python -u /workspace/megatron/pretrain_gpt.py ${OPTIONS}
