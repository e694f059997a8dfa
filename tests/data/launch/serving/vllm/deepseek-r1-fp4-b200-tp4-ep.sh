#!/usr/bin/env bash
# NVFP4 DeepSeek-R1 on four B200s (FlashInfer MoE kernels on), TP4 with expert parallelism.
export VLLM_USE_FLASHINFER_MOE_FP4=1
CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve nvidia/DeepSeek-R1-FP4 \
    --tensor-parallel-size 4 --enable-expert-parallel --trust-remote-code
