#!/bin/bash
# Harness for the LLM-API path's CPU goal on a GPU host (not part of the product): the LLM-API path (our llmapi model
# on the LLM-API double) against the tensor stand-in, both on the synthetic engine at 2 ms a step, with
# `trtllm-truss bench --compare-backends pytorch,llmapi` (one stack per backend, alternating rounds).
# Needs .carry/site312.tar.xz (docs/performance/direct-front-32core/32core-direct-2ms-carry.sh
# builds it) and, where the device tool sends another checkout than this branch's, .carry/wt-packages.tgz
# (this branch's packages/, unpacked over the checkout's).
# Usage, from the repository root: bash docs/performance/llmapi-vs-tensor-16core/16core-llmapi-2ms-host.sh STEP...   BUDGET_S: stop starting steps past this.
set -u
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
RES=$OUT; LOGS=/tmp/logs; mkdir -p $RES $LOGS
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

if ! grep -q compare-backends packages/trtllm_truss/commands/bench.py 2>/dev/null && [ -f .carry/wt-packages.tgz ]; then
  log "checkout lacks --compare-backends: unpacking .carry/wt-packages.tgz over packages/"; tar -xzf .carry/wt-packages.tgz
fi
grep -q compare-backends packages/trtllm_truss/commands/bench.py || { log "no --compare-backends in packages/"; exit 1; }
log "host: $(nproc) cores, $(python3 -V 2>&1); $(nvidia-smi -L 2>/dev/null | head -1)"
PY=$(command -v python3)
$PY -m venv --without-pip /tmp/v || { log "venv failed"; exit 1; }
SP=$(/tmp/v/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
IMG=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
tar -xJf .carry/site312.tar.xz -C "$SP" 2>/dev/null || { log "extract failed"; exit 1; }
echo "import site; site.addsitedir('$IMG')" > "$SP/zz_image_site.pth"   # the image's torch, after ours
echo "$PWD/packages" > "$SP/trtllm_truss_src.pth"
export PATH=/tmp/v/bin:$PATH PYTHONUNBUFFERED=1
python -c "import numpy, torch, tokenizers, tritonclient.grpc, uvicorn, trtllm_truss.cli; print('torch', torch.__version__)" || exit 1
log "setup done"

export TRTLLM_BUILD__MAX_BATCH_SIZE=512 TRTLLM_RUNTIME__MAX_QUEUED_REQUESTS=512
export TRTLLM_RUNTIME__PYTORCH__SYNTHETIC='{"step_time_ms": 2}'
C=$(nproc)
LOAD="--concurrency 64 --num-requests 1024 --output-stddev 32 --client-processes 4 --rounds 3"

# step NAME ESTIMATE_S ENV... -- BENCH_ARGS...
step() {
  local name=$1 est=$2; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local left=$(( BUDGET_S - ($(date +%s) - T0) ))
  if [ $left -lt $est ]; then log "SKIP $name (needs ~${est}s, ${left}s left)"; return; fi
  local s=$(date +%s)
  log "START $name: ${envs[*]} bench $*"
  env "${envs[@]}" timeout $(( left - 5 )) python -m trtllm_truss.cli bench . --compare-backends pytorch,llmapi \
    --no-progress $LOAD --json $RES/${C}core-llmapi-2ms-$name.json --plot $LOGS/$name.png "$@" > $LOGS/$name.log 2>&1
  log "END $name rc=$? in $(( $(date +%s) - s ))s"
  tar -czf $RES/logs.tgz -C $LOGS .
  grep -v "^  I1[0-9]" $LOGS/$name.log | grep -A3 "CPU per token\|Error\|error" | tail -${TAILN:-12}
}

for s in "$@"; do case $s in
  http-i1)   step http-direct-interval1 120 TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- --target http --front direct ;;
  http-i4)   step http-direct-interval4 120 TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- --target http --front direct ;;
  engine-i1) step engine-interval1 90 TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- --target engine ;;
  engine-i4) step engine-interval4 90 TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- --target engine ;;
  *) log "unknown step $s" ;;
esac; done
log "all done"
