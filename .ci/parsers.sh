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
    "$VENV/bin/pip" install -q --no-build-isolation megatron-core==0.16.1  # the last release for Python 3.11
    # the serving engines: their argument parsers import on a CPU machine without their GPU
    # dependencies (--no-deps), given the modules their imports touch (versions as measured)
    "$VENV/bin/pip" install -q --no-deps sglang==0.4.10 vllm==0.33.0 \
        && "$VENV/bin/pip" install -q tqdm==4.70.1 pybase64==1.5.1 requests==2.34.2 IPython==9.18.1 \
            aiohttp==3.14.5 huggingface_hub==2.4.0 transformers==5.24.0 pillow==13.0.0 triton==3.9.0 \
            pyzmq==27.3.0 fastapi==0.165.0 sentencepiece==0.2.3 cbor2==6.3.0 openai-harmony==0.0.8 \
            openai==3.57.0 msgspec==0.23.0 cloudpickle==3.1.3 cachetools==8.0.2 uvloop==0.23.0 \
            py-cpuinfo==9.0.0 prometheus-client==0.26.0 partial-json-parser==0.2.1.1.post7 \
            xgrammar==0.2.9 llguidance==1.9.1 \
        || echo "sglang / vllm did not install: their tests skip"
fi
ROOFLINE_PARSERS_REQUIRE="${ROOFLINE_PARSERS_REQUIRE:-deepspeed,nemo,megatron}" \
    "$VENV/bin/python" -m pytest -q -m parsers tests/launch/parsers -p no:cacheprovider \
    -W ignore::DeprecationWarning -W ignore::UserWarning -W ignore::FutureWarning
