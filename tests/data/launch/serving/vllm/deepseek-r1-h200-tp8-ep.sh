#!/usr/bin/env bash
# DeepSeek-R1 (native FP8) on one 8xH200 node: tensor parallel over the 8 GPUs, experts split
# over them too. Restates the "TP8+EP" launch of the vLLM recipe (see MANIFEST.toml).
vllm serve deepseek-ai/DeepSeek-R1-0528 --tensor-parallel-size 8 --enable-expert-parallel \
    --trust-remote-code
