#!/bin/bash
# The parser tier (issue 17 item 3): every export and every restated launch file is parsed by
# the stack's own configuration code, in a separate venv (the stacks pull torch, which the
# project's own venv does not carry). Stacks whose code does not install on a CPU-only
# Python 3.11 machine from PyPI are skipped by the tests with the reason (docs/launch.md).
#
#   bash .ci/parsers.sh            # builds $PARSERS_VENV (default /tmp/roofline-parsers) once
#
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PARSERS_VENV:-/tmp/roofline-parsers}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    # the CPU build of torch this machine carries (a plain `torch` would pull a CUDA build)
    "$VENV/bin/pip" install -q torch==2.13.0
    "$VENV/bin/pip" install -q -e ".[test]"
    # DeepSpeed builds no ops at install (DS_BUILD_OPS=0) and needs torch at build time
    DS_BUILD_OPS=0 "$VENV/bin/pip" install -q --no-build-isolation deepspeed==0.19.8
    "$VENV/bin/pip" install -q omegaconf==2.3.0
    "$VENV/bin/pip" install -q --no-build-isolation megatron-core==0.19.2 || echo "megatron-core did not install: its tests skip"
    # the serving engines: their argument parsers import on a CPU machine without their GPU
    # dependencies (--no-deps), given the modules their imports touch
    "$VENV/bin/pip" install -q --no-deps sglang==0.4.10 vllm==0.33.0 \
        && "$VENV/bin/pip" install -q tqdm pybase64 requests IPython aiohttp huggingface_hub \
            transformers pillow triton pyzmq fastapi sentencepiece cbor2 openai-harmony openai \
            msgspec cloudpickle cachetools uvloop py-cpuinfo prometheus-client \
            partial-json-parser xgrammar llguidance \
        || echo "sglang / vllm did not install: their tests skip"
fi
ROOFLINE_PARSERS_REQUIRE="${ROOFLINE_PARSERS_REQUIRE:-deepspeed,nemo}" \
    "$VENV/bin/python" -m pytest -q -m parsers tests/launch/parsers -p no:cacheprovider
