#!/bin/bash
# Harness for the direct-front study on a GPU host (not part of the product): a venv whose own site-packages
# (carried: numpy 1.26.4, nvidia-pytriton's tritonserver 2.51, truss 0.18.35, tritonclient, uvicorn,
# httptools, uvloop, transformers 5.23 trimmed to auto/llama, ...) come before the image's (torch),
# then `trtllm-truss bench --compare` runs, one per step, results tarred into $OUT after each step.
# Needs .carry/site312.tar.xz (docs/performance/direct-front-32core/32core-direct-2ms-carry.sh builds it).
# Usage, from the repository root: bash docs/performance/direct-front-32core/32core-direct-2ms-host.sh STEP... (steps below); BUDGET_S: stop starting steps past this.
set -u
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
RES=/tmp/res; mkdir -p $RES
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
pack() { tar -czf $OUT/results.tgz -C $RES . 2>/dev/null; }

log "host: $(nproc) cores, $(python3 -V 2>&1) at $(command -v python3); $(nvidia-smi -L 2>/dev/null | head -2 | tr '\n' ' ')"
PY=$(command -v python3)
$PY -m venv --without-pip /tmp/v || { log "venv failed"; exit 1; }
SP=$(/tmp/v/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
IMG=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
tar -xJf .carry/site312.tar.xz -C "$SP" 2>/dev/null || $PY -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .carry/site312.tar.xz "$SP" || { log "extract failed"; exit 1; }
echo "import site; site.addsitedir('$IMG')" > "$SP/zz_image_site.pth"   # the image's torch, after ours
echo "$PWD/packages" > "$SP/trtllm_truss_src.pth"
export PATH=/tmp/v/bin:$PATH PYTHONUNBUFFERED=1
python - <<'EOF' || { log "imports failed"; exit 1; }
import numpy, torch, transformers, tokenizers, tritonclient.grpc, truss, uvicorn, uvloop, httptools, trtllm_truss.cli
print("imports:", "numpy", numpy.__version__, "torch", torch.__version__, "transformers", transformers.__version__,
      "truss", truss.__version__ if hasattr(truss, "__version__") else "?", "uvicorn", uvicorn.__version__, "uvloop", uvloop.__version__)
from trtllm_truss.engine_standin import SyntheticEngine, EngineBase  # the stand-in's torch path
EOF
log "setup done"

# The engine: the faithful synthetic stand-in at 2 ms a step, as the study's table (16 instances,
# max_batch_size 512, max_queued_requests 512).
export TRTLLM_BUILD__MAX_BATCH_SIZE=512 TRTLLM_RUNTIME__MAX_QUEUED_REQUESTS=512 TRTLLM_RUNTIME__PYTORCH__INSTANCE_COUNT=16
export TRTLLM_RUNTIME__PYTORCH__SYNTHETIC='{"step_time_ms": 2}'
C=$(nproc)
HIGH="--concurrency 64,128,256,512 --num-requests 1024 --output-stddev 32 --client-processes 8"
ONE="--concurrency 1 --num-requests 64 --output-mean 32 --output-stddev 0"

# step NAME ESTIMATE_S ENV... -- BENCH_ARGS...
step() {
  local name=$1 est=$2; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local left=$(( BUDGET_S - ($(date +%s) - T0) ))
  if [ $left -lt $est ]; then log "SKIP $name (needs ~${est}s, ${left}s left)"; echo "$name skipped" >> $RES/steps.txt; return; fi
  local s=$(date +%s)
  log "START $name: ${envs[*]} bench $*"
  env "${envs[@]}" timeout $(( left - 5 )) python -m trtllm_truss.cli bench . --compare --no-progress --rounds 3 \
    --json $RES/${C}core-direct-2ms-$name.json "$@" > $RES/$name.log 2>&1
  local rc=$?
  log "END $name rc=$rc in $(( $(date +%s) - s ))s"
  echo "$name rc=$rc $(( $(date +%s) - s ))s" >> $RES/steps.txt
  grep -v "^  I1[0-9]" $RES/$name.log | tail -${TAILN:-14}
  pack
  [ $rc -eq 0 ] || [ -n "${KEEP_GOING:-}" ] || { log "stopping after a failed step"; exit 1; }
}

AB=0  # numbers the alternating A/B steps
for s in "$@"; do case $s in
  direct8-i4)  step direct8-interval4 200 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct $HIGH ;;
  truss-i4)    step truss-interval4 200 TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- --front truss $HIGH ;;
  direct8-i4-c1) step direct8-interval4-c1 70 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct $ONE ;;
  truss-i4-c1) step truss-interval4-c1 70 TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- --front truss $ONE ;;
  direct8-i1)  step direct8-interval1 200 TRTLLM_RUNTIME__STREAM_INTERVAL=1 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct $HIGH ;;
  truss-i1)    step truss-interval1 200 TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- --front truss $HIGH ;;
  direct4-i4)  step direct4-interval4 200 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=4 -- --front direct $HIGH ;;
  direct8-i1-c1) step direct8-interval1-c1 70 TRTLLM_RUNTIME__STREAM_INTERVAL=1 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct $ONE ;;
  truss-i1-c1) step truss-interval1-c1 70 TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- --front truss $ONE ;;
  direct8-i4-hi) step direct8-interval4-c256-512-n2048 120 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct --concurrency 256,512 --num-requests 2048 --output-stddev 32 --client-processes 8 ;;
  inproc8-i4)  step inproc8-interval4 130 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct --concurrency 64,256,512 --num-requests 1024 --output-stddev 32 --client-processes 8 --rounds 2 ;;
  inproc8-i4-ee) step inproc8-interval4-eventengine 130 GRPC_EXPERIMENTS= TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct --concurrency 64,256,512 --num-requests 1024 --output-stddev 32 --client-processes 8 --rounds 2 ;;
  workers8-i4) step workers8-interval4 130 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 TRTLLM_RUNTIME__DIRECT_FRONT__STREAM_WORKER_PROCESSES=true -- --front direct --concurrency 64,256,512 --num-requests 1024 --output-stddev 32 --client-processes 8 --rounds 2 ;;
  p8-lo)       step procs8-interval4-lo 150 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct --concurrency 64,128,256 --num-requests 1024 --output-stddev 32 --client-processes 8 --rounds 2 ;;
  p4-lo)       step procs4-interval4-lo 150 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=4 -- --front direct --concurrency 64,128,256 --num-requests 1024 --output-stddev 32 --client-processes 8 --rounds 2 ;;
  spread8-lo)  step spread8-interval4-lo 150 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 TRTLLM_RUNTIME__DIRECT_FRONT__FILL_CONNECTIONS=0 -- --front direct --concurrency 64,128,256 --num-requests 1024 --output-stddev 32 --client-processes 8 --rounds 2 ;;
  fill8-lo)    step fill8-interval4-lo 150 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct --concurrency 64,128,256 --num-requests 1024 --output-stddev 32 --client-processes 8 --rounds 2 ;;
  spread8-hi)  step spread8-interval4-hi 110 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 TRTLLM_RUNTIME__DIRECT_FRONT__FILL_CONNECTIONS=0 -- --front direct --concurrency 512 --num-requests 2048 --output-stddev 32 --client-processes 8 --rounds 2 ;;
  fill8-hi)    step fill8-interval4-hi 110 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct --concurrency 512 --num-requests 2048 --output-stddev 32 --client-processes 8 --rounds 2 ;;
  fill8-c1)    step fill8-interval4-c1 60 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct $ONE ;;
  spread8-i1)  step spread8-interval1 150 TRTLLM_RUNTIME__STREAM_INTERVAL=1 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 TRTLLM_RUNTIME__DIRECT_FRONT__FILL_CONNECTIONS=0 -- --front direct --concurrency 64,128,256 --num-requests 1024 --output-stddev 32 --client-processes 8 --rounds 2 ;;
  fill8-i1)    step fill8-interval1 150 TRTLLM_RUNTIME__STREAM_INTERVAL=1 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct --concurrency 64,128,256 --num-requests 1024 --output-stddev 32 --client-processes 8 --rounds 2 ;;
  fill8-256)   step fill8-interval4-c256-$((++AB)) 60 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- --front direct --concurrency 256 --num-requests 1024 --output-stddev 32 --client-processes 8 ;;
  spread8-256) step spread8-interval4-c256-$((++AB)) 60 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 TRTLLM_RUNTIME__DIRECT_FRONT__FILL_CONNECTIONS=0 -- --front direct --concurrency 256 --num-requests 1024 --output-stddev 32 --client-processes 8 ;;
  smoke)       step smoke 60 TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=2 -- --front direct --concurrency 4 --num-requests 16 --output-mean 16 --output-stddev 0 --rounds 1 ;;
  *) log "unknown step $s" ;;
esac; done
pack
log "all done"
