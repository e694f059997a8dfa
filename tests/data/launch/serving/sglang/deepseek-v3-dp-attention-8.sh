#!/usr/bin/env bash
# DeepSeek-V3 on 8xH200 with data-parallel attention: eight attention ranks, the MoE over all 8.
python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --trust-remote-code \
    --enable-dp-attention --tp 8 --dp 8
