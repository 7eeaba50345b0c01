#!/bin/bash
# A Slurm submitter in the style of Megatron-LM's examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh:
# the flags in one array, a command string, and `sbatch <<EOF` whose job script runs the string under
# srun with `bash -c`.  The #SBATCH lines of the job script are placeholders to fill in.
export NCCL_IB_TIMEOUT=19
export TRITON_CACHE_DIR=/tmp/triton_cache_$SLURM_NODEID

MEGATRON_PATH=${MEGATRON_PATH:-"your_megatron_path"}
OUTPUT_PATH=${OUTPUT_PATH:-"./mfsdp-out"}
USE_MEGATRON_FSDP=${USE_MEGATRON_FSDP:-1}

TP=${TP:-1}
EP=${EP:-8}
MBS=${MBS:-1}
GBS=${GBS:-256}

PRETRAIN_ARGS=(
    --tensor-model-parallel-size ${TP}
    --expert-model-parallel-size ${EP}
    --expert-tensor-parallel-size 1
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --sequence-parallel
    --disable-bias-linear
    --micro-batch-size ${MBS}
    --global-batch-size ${GBS}
    --train-samples 100000
    --manual-gc
    --recompute-granularity selective
    --recompute-modules mlp moe layernorm
    --seq-length 4096
    --tokenizer-type NullTokenizer
    --vocab-size 32000
    --mock-data
    --num-layers 16
    --hidden-size 2048
    --ffn-hidden-size 8192
    --num-attention-heads 16
    --max-position-embeddings 4096
    --position-embedding-type rope
    --normalization RMSNorm
    --swiglu
    --untie-embeddings-and-output-weights
    --multi-latent-attention
    --qk-layernorm
    --kv-lora-rank 512
    --qk-head-dim 128
    --qk-pos-emb-head-dim 64
    --v-head-dim 128
    --num-experts 64
    --moe-layer-freq [0]*1+[1]*15
    --moe-ffn-hidden-size 1024
    --moe-shared-expert-intermediate-size 1024
    --moe-router-topk 6
    --moe-router-score-function sigmoid
    --moe-router-enable-expert-bias
    --moe-router-pre-softmax
    --moe-token-dispatcher-type alltoall
    --moe-grouped-gemm
    --moe-aux-loss-coeff 1e-4
    --mtp-num-layers 1
    --log-interval 1
    --save ${OUTPUT_PATH}/checkpoints
    --save-interval 100
    --bf16
)

if [ "${USE_MEGATRON_FSDP}" = 1 ]; then
    unset CUDA_DEVICE_MAX_CONNECTIONS
    PRETRAIN_ARGS=(
        "${PRETRAIN_ARGS[@]}"
        --use-megatron-fsdp
        --data-parallel-sharding-strategy optim_grads_params
        --no-gradient-accumulation-fusion
        --ckpt-format fsdp_dtensor
    )
fi

TRAINING_CMD="
cd ${MEGATRON_PATH};
export PYTHONPATH=${MEGATRON_PATH}:${PYTHONPATH};
python ${MEGATRON_PATH}/pretrain_gpt.py ${PRETRAIN_ARGS[@]}"

SLURM_LOGS="${OUTPUT_PATH}/slurm_logs"
mkdir -p ${SLURM_LOGS} || {
    echo "cannot create ${SLURM_LOGS}"
    exit 1
}

set +e
sbatch <<EOF
#!/bin/bash

#SBATCH --job-name=mfsdp-moe
#SBATCH --nodes=your_num_nodes
#SBATCH --ntasks-per-node=your_tasks_per_node
#SBATCH --exclusive

srun \
    --mpi=pmix -l \
    --container-workdir=${MEGATRON_PATH} \
    bash -x -c "${TRAINING_CMD}" 2>&1 | tee ${SLURM_LOGS}/\${SLURM_JOB_ID}.log

EOF
set -e
