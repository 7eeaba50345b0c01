# Shared settings sourced by deepseek_v2_lite_source.sh: the model's shape and a launch function.
MODEL_ARGS=(
    --num-layers 27 --hidden-size 2048 --ffn-hidden-size 10944 --num-attention-heads 16
    --multi-latent-attention --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128
    --kv-channels 128
    --seq-length 4096 --max-position-embeddings 163840 --position-embedding-type rope
    --swiglu --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights
)
MOE_ARGS=(
    --num-experts 64 --moe-router-topk 6 --moe-ffn-hidden-size 1408
    --moe-shared-expert-intermediate-size 2816 --moe-layer-freq "([0]*1+[1]*26)"
    --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-3
    --moe-grouped-gemm --moe-token-dispatcher-type alltoall
)

launch() {
    torchrun --nproc_per_node "${GPUS_PER_NODE}" --nnodes "${NNODES}" pretrain_gpt.py \
        "${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" "$@"
}
