#!/bin/bash
# How the Python 3.12 environment for the 32-core GPU host run was assembled on the
# development machine: a harness, not part of the product. The device tool carries at most 64 MiB with
# the working tree (~12 MB), so this is the project's .venv-py3.12 site-packages minus what the run
# never imports, plus the direct front's httptools/uvloop and the OpenTelemetry exporter truss's server
# imports (from the 3.11 venv, pure Python), as one xz archive (52 MB). torch and tokenizers come from
# the host image (added after these by 32core-direct-2ms-host.sh).
# Run from the repository root: bash docs/performance/direct-front-32core/32core-direct-2ms-carry.sh  -> .carry/site312.tar.xz
set -euo pipefail
SRC=$PWD/.venv-py3.12/lib/python3.12/site-packages
S311=$PWD/.venv/lib/python3.11/site-packages
DST=/tmp/site312
rm -rf $DST /tmp/whl312 && mkdir -p $DST /tmp/whl312 .carry

# 1. Everything except what neither the fronts, the bench, truss's server nor the stand-in imports.
EXCL=(bfcl_eval 'bfcl_eval-*' moto 'moto-*' cfnlint 'cfn_lint-*' sympy 'sympy-*' isympy.py matplotlib 'matplotlib-*'
  mpl_toolkits pylab.py fontTools 'fonttools-*' PIL pillow.libs 'pillow-*' networkx 'networkx-*' openai 'openai-*'
  libcst 'libcst-*' pip 'pip-*' ruff 'ruff-*' docker 'docker-*' python_on_whales 'python_on_whales-*'
  py_partiql_parser aws_xray_sdk hf_xet 'hf_xet-*' pytest 'pytest-*' _pytest pytest_asyncio 'pytest_asyncio-*'
  pytest_timeout.py contourpy kiwisolver cycler graphql 'graphql_core-*' antlr4 flask
  flask_cors werkzeug sentencepiece 'sentencepiece-*' openapi_schema_validator openapi_spec_validator
  jsonschema_path pathable responses truss_transfer 'truss_transfer-*' tokenizers 'tokenizers-*'
  '__editable__*' '__pycache__' '*.pyc' 'libpython3-*.13.so*' 'geventhttpclient*' gevent 'gevent-*'
  greenlet 'greenlet-*' zope 'zope*' tests)
# pyzmq stays: the LLM-API double's executor talks to its worker over ZMQ IPC.
args=(); for e in "${EXCL[@]}"; do args+=(--exclude "$e"); done
for v in 3.8 3.9 3.10 3.11 3.13; do args+=(--exclude "./pytriton/tritonserver/python_backend_stubs/$v"); done
tar -C $SRC -cf - "${args[@]}" . | tar -C $DST -xf -
# boto3/botocore are imported by `import truss`; keep only the s3/sts service models.
(cd $DST/botocore/data && for x in */; do case $x in s3/|sts/) ;; *) rm -rf "$x";; esac; done)
# transformers: the stand-in imports transformers.cache_utils; the model folders other than auto/llama are
# never loaded (the synthetic engine builds no model).
(cd $DST/transformers/models && for x in */; do case $x in auto/|llama/) ;; *) rm -rf "$x";; esac; done)

# 2. What .venv-py3.12 lacks: the direct front's parser and loop, truss server's OTLP exporter.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d /tmp/whl312 httptools==0.9.0 uvloop==0.23.0
for w in /tmp/whl312/*.whl; do (cd $DST && python3 -m zipfile -e "$w" .); done
for p in exporter proto sdk semconv; do cp -a $S311/opentelemetry/$p $DST/opentelemetry/; done
cp -a $S311/opentelemetry_exporter_* $S311/opentelemetry_proto-* $S311/opentelemetry_sdk-* \
  $S311/opentelemetry_semantic_conventions-* $DST/
find $DST -name __pycache__ -prune -exec rm -rf {} +

# 3. Size: debug info out of extension modules; tritonserver's symbol tables; and an empty ICU data
#    library (the shape of ICU's own source/stubdata) for the 29 MB one tritonserver loads only
#    through libxml2 -> libicuuc. tritonserver and its python backend ran with all three (below).
for f in $(find $DST -name "*.so*" -type f); do file "$f" | grep -q "not stripped\|with debug_info" && strip --strip-debug "$f"; done
strip --strip-unneeded $DST/nvidia_pytriton.libs/libtritonserver-717102f0.so $DST/pytriton/tritonserver/bin/tritonserver
cat > /tmp/icudata_stub.c <<'EOF'
#include <stdint.h>
struct icu_header {
    uint16_t headerSize; uint8_t magic1, magic2;
    struct { uint16_t size, reservedWord; uint8_t isBigEndian, charsetFamily, sizeofUChar, reservedByte;
             uint8_t dataFormat[4], formatVersion[4], dataVersion[4]; } info;
    char padding[8]; uint32_t count, reserved; struct { uint32_t nameOffset, dataOffset; } toc[1];
};
__attribute__((visibility("default"))) const struct icu_header icudt70_dat = {
    32, 0xda, 0x27, {20, 0, 0, 0, 2, 0, {0x54, 0x6f, 0x43, 0x50}, {1, 0, 0, 0}, {0, 0, 0, 0}},
    {0}, 0, 0, {{0, 0}}};
EOF
gcc -shared -fPIC -O2 -Wl,-soname,libicudata-c1404396.so.70.1 -o $DST/nvidia_pytriton.libs/libicudata-c1404396.so.70.1 /tmp/icudata_stub.c

# 4. BENCH_ONLY=1 (the llmapi runs, 2026-11-29: `trtllm-truss bench` with the direct front, no truss
#    server): the working tree grew to ~17 MB, so also without what only `import truss` and its CLI need
#    (boto3, botocore, s3transfer, cryptography, setuptools, prompt_toolkit, wcwidth): 49 MB.
if [ -n "${BENCH_ONLY:-}" ]; then
  (cd $DST && rm -rf boto3* botocore* s3transfer* cryptography* setuptools* prompt_toolkit* wcwidth*)
fi
tar -C $DST -cf - . | xz -T2 -9 > .carry/site312.tar.xz
ls -la .carry/site312.tar.xz
