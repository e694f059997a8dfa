#!/usr/bin/env bash
# DeepSeek-V3 (FP8) on one 8xH200 node in the SGLang container, plain TP8.
docker run --gpus all --shm-size 32g -p 30000:30000 --ipc=host --network=host \
    -v ~/.cache/huggingface:/root/.cache/huggingface lmsysorg/sglang:latest \
    python3 -m sglang.launch_server --model deepseek-ai/DeepSeek-V3 --tp 8 --trust-remote-code \
    --port 30000
