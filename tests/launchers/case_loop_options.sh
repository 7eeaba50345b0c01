#!/bin/bash
# Options parsed with a while/case loop over "$@", defaults first; the precision block adds FP8
# flags only when --fp8 is given.
#   bash case_loop_options.sh --tp 2 --pp 4 --fp8 --data /data/prefix -- --lr 1e-4

TP=1; PP=1; EP=1; MBS=1; GBS=256; DATA=""; PRECISION=bf16; EXTRA=()

usage() { echo "usage: $0 [--tp N] [--pp N] [--ep N] [--mbs N] [--gbs N] [--fp8] [--data PREFIX] [-- EXTRA...]"; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --tp) TP="$2"; shift 2 ;;
        --pp) PP="$2"; shift 2 ;;
        --ep) EP="$2"; shift 2 ;;
        --mbs) MBS="$2"; shift 2 ;;
        --gbs=*) GBS="${1#*=}"; shift ;;
        --gbs) GBS="$2"; shift 2 ;;
        --fp8) PRECISION=fp8; shift ;;
        --data) DATA="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) echo "unknown option: $1" >&2; usage; exit 1 ;;
    esac
done

PREC_ARGS=(--bf16)
if [[ "$PRECISION" == fp8 ]]; then
    PREC_ARGS+=(--fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 1024 --fp8-amax-compute-algo max)
fi
if [[ -n "$DATA" ]]; then
    DATA_ARGS=(--data-path "$DATA" --split 98,1,1)
else
    DATA_ARGS=(--mock-data)
fi

torchrun --nproc-per-node=8 --nnodes=${NNODES:-2} pretrain_gpt.py \
    --num-layers 16 --hidden-size 2048 --ffn-hidden-size 5632 --num-attention-heads 16 \
    --seq-length 4096 --max-position-embeddings 4096 --swiglu --normalization RMSNorm \
    --num-experts 16 --moe-router-topk 2 --moe-grouped-gemm --moe-token-dispatcher-type alltoall \
    --disable-bias-linear --tokenizer-type NullTokenizer --vocab-size 50304 \
    --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP" --expert-model-parallel-size "$EP" \
    --micro-batch-size "$MBS" --global-batch-size "$GBS" "${PREC_ARGS[@]}" "${DATA_ARGS[@]}" \
    --lr 2e-4 --train-iters 500 --log-interval 5 "${EXTRA[@]}"
