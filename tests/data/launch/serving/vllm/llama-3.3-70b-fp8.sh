#!/usr/bin/env bash
# Llama-3.3-70B from NVIDIA's ModelOpt checkpoints on one GPU, FP8 KV cache, throughput settings.
# The recipe picks the checkpoint by the GPU generation; this restatement keeps both branches.
CC=$(nvidia-smi -i 0 --query-gpu=compute_cap --format=csv,noheader)
if [ "$CC" = "10.0" ]; then
    ASYNC="--async-scheduling"
    FUSION='{"cudagraph_mode":"FULL_DECODE_ONLY"}'
    DTYPE="FP4"
else
    ASYNC=""
    FUSION="{}"
    DTYPE="FP8"
fi
vllm serve nvidia/Llama-3.3-70B-Instruct-$DTYPE \
  --host 0.0.0.0 --port 8000 \
  --kv-cache-dtype fp8 --trust-remote-code --gpu-memory-utilization 0.9 \
  --compilation-config ${FUSION} ${ASYNC} \
  --enable-chunked-prefill --no-enable-prefix-caching \
  --pipeline-parallel-size 1 --tensor-parallel-size 1 \
  --max-num-seqs 512 --max-num-batched-tokens 8192 --max-model-len 9216 &
