#!/bin/bash
# DeepSeek-V2-Lite: the model's flags and a launch function live in common/deepseek_common.sh,
# which this script sources from its own directory.
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${SCRIPT_DIR}/common/deepseek_common.sh"

GPUS_PER_NODE=8
NNODES=${NNODES:-2}
CKPT=${1:-/ckpt/dsv2-lite}

launch --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --expert-model-parallel-size 8 \
    --micro-batch-size 1 --global-batch-size 256 --bf16 --use-distributed-optimizer \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model deepseek-ai/DeepSeek-V2-Lite --mock-data \
    --lr 1e-4 --train-iters 100 --log-interval 1 --save "$CKPT" --save-interval 50
