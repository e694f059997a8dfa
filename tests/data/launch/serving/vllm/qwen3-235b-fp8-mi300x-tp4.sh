#!/usr/bin/env bash
# Qwen3-235B-A22B FP8 on four MI300X (ROCm, AITER kernels), TP4, 32k context.
HIP_VISIBLE_DEVICES="4,5,6,7" VLLM_USE_V1=1 VLLM_ROCM_USE_AITER=1 SAFETENSORS_FAST_GPU=1 \
vllm serve Qwen/Qwen3-235B-A22B-FP8 --trust-remote-code -tp 4 \
  --disable-log-requests --swap-space 16 --distributed-executor-backend mp \
  --max-num-batched-tokens 32768 --max-model-len 32768 \
  --no-enable-prefix-caching --gpu-memory-utilization 0.8
