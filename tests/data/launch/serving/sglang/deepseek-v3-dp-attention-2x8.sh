#!/usr/bin/env bash
# DeepSeek-V3 on two 8xH100 nodes: two attention-DP groups of eight TP GPUs each.
python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --trust-remote-code \
    --enable-dp-attention --tp 16 --dp 2 --nnodes 2 --node-rank 0 --dist-init-addr 10.0.0.1:5000
