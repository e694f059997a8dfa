#!/usr/bin/env bash
# DeepSeek-V3 over two 8-GPU H20 nodes: one TP16 server. Each node runs the same line with its
# own --node-rank; the reader reads the first.
# node 0
python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 16 \
    --dist-init-addr 10.0.0.1:5000 --nnodes 2 --node-rank 0 --trust-remote-code
# node 1
python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 16 \
    --dist-init-addr 10.0.0.1:5000 --nnodes 2 --node-rank 1 --trust-remote-code
