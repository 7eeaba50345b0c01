#!/bin/bash
# Model-zoo style: the first argument picks a model size, a case statement sets its shape, and the
# remaining arguments are fixed positions (as many model-zoo benchmark scripts do).
#   bash modelzoo_model_size_case.sh 7B 8 /data/prefix /models/tokenizer

MODEL_SIZE=${1:-7B}
GPUS=${2:-8}
DATA_PREFIX=${3:-/data/wiki_text_document}
TOKENIZER_PATH=${4:-/models/llama2/tokenizer.model}

case $MODEL_SIZE in
    7B)
        NUM_LAYERS=32; HIDDEN=4096; FFN=11008; HEADS=32; KV_HEADS=32
        ;;
    13B)
        NUM_LAYERS=40; HIDDEN=5120; FFN=13824; HEADS=40; KV_HEADS=40
        ;;
    70B)
        NUM_LAYERS=80; HIDDEN=8192; FFN=28672; HEADS=64; KV_HEADS=8
        ;;
    *)
        echo "unknown model size $MODEL_SIZE (7B, 13B or 70B)"
        exit 1
        ;;
esac

GQA_ARGS=""
if [ $KV_HEADS -ne $HEADS ]; then
    GQA_ARGS="--group-query-attention --num-query-groups $KV_HEADS"
fi

NNODES=$(( (GPUS + 7) / 8 ))
NPROC=$(( GPUS < 8 ? GPUS : 8 ))

torchrun --nproc_per_node $NPROC --nnodes $NNODES pretrain_gpt.py \
    --num-layers $NUM_LAYERS --hidden-size $HIDDEN --ffn-hidden-size $FFN --num-attention-heads $HEADS $GQA_ARGS \
    --seq-length 4096 --max-position-embeddings 4096 --swiglu --normalization RMSNorm --disable-bias-linear \
    --untie-embeddings-and-output-weights --position-embedding-type rope \
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 \
    --micro-batch-size 2 --global-batch-size 256 --bf16 --use-distributed-optimizer \
    --tokenizer-type Llama2Tokenizer --tokenizer-model $TOKENIZER_PATH --data-path $DATA_PREFIX \
    --lr 3e-4 --train-iters 200 --log-interval 1
