#!/bin/bash
# How the two archives for the GPU-host run were assembled on the development machine (a harness, not part
# of the product). The device tool carries at most 64 MiB with the working tree (~18 MB) per call, so:
#   .carry/dyn312.tar.xz  NVIDIA Dynamo 1.6.1 (abi3 wheels, taken from the 3.11 .venv: the same files serve
#                         3.12), its _core stripped, without the subpackages the frontend, the mocker and our
#                         fleet never import (engines' workers, planner, profiler, tests), plus msgspec/redis
#                         for Python 3.12 where needed; carried and unpacked by the first call.
#   .carry/site312.tar.xz the .venv-py3.12 site-packages minus what bench, the direct front and the stand-in
#                         never import (docs/performance/direct-front-32core/32core-direct-2ms-carry.sh with
#                         BENCH_ONLY=1); carried by the second call, which runs gpu-host.sh.
# Run from the repository root (/work/main, whose .carry/ the device tool carries).
set -euo pipefail
S311=$PWD/.venv/lib/python3.11/site-packages
DST=/tmp/dyn312
rm -rf $DST && mkdir -p $DST .carry
tar -C $S311 -cf - --exclude __pycache__ --exclude tests --exclude '*.pyc' \
  --exclude dynamo/vllm --exclude dynamo/sglang --exclude dynamo/trtllm --exclude dynamo/tokenspeed \
  --exclude dynamo/planner --exclude dynamo/profiler --exclude dynamo/global_planner \
  --exclude dynamo/squeeze_evolve --exclude dynamo/thunderagent_router \
  dynamo ai_dynamo-1.6.1.dist-info ai_dynamo_runtime-1.6.1.dist-info redis redis-8.2.0.dist-info | tar -C $DST -xf -
strip --strip-unneeded $DST/dynamo/_core.abi3.so
rm -rf /tmp/whl312d && mkdir -p /tmp/whl312d
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d /tmp/whl312d msgspec==0.23.0
for w in /tmp/whl312d/*.whl; do (cd $DST && python3 -m zipfile -e "$w" .); done
tar -C $DST -cf - . | xz -T2 -9 > .carry/dyn312.tar.xz
ls -la .carry/dyn312.tar.xz
