#!/usr/bin/env bash
# DeepSeek-R1 on 8xH200, high-load layout: eight data-parallel attention ranks, experts over all
# eight GPUs. Restates the recipe's "DP8+EP" launch.
vllm serve deepseek-ai/DeepSeek-R1-0528 --data-parallel-size 8 --enable-expert-parallel \
    --trust-remote-code
