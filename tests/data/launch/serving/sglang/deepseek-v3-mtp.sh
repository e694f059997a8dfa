#!/usr/bin/env bash
# DeepSeek-V3-0324 with its MTP head as an EAGLE draft (the minimum setting: one step, top-1).
python3 -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-V3-0324 \
  --speculative-algorithm EAGLE --speculative-num-steps 1 \
  --speculative-eagle-topk 1 --speculative-num-draft-tokens 2 \
  --trust-remote-code --tp 8
