#!/bin/bash
# Harness for the LLM-API path study on a GPU host (not part of the product): the same venv as 32core-direct-2ms-host.sh
# (carried .carry/site312.tar.xz, built by 32core-direct-2ms-carry.sh, with pyzmq for the LLM-API double's
# executor), then `trtllm-truss bench` per step, results tarred into $OUT after each step.
# The engine: the synthetic stand-in behind the LLM-API double (backend llmapi: our llmapi model, its LLM host,
# the double's executor in its worker process), max_batch_size 512; instance counts at their defaults (one per
# 2 cores, 16 on 32 cores: the llmapi model's and the tensor stand-in's alike); direct-front processes at their
# default (one per 4 cores: 8 on 32 cores, 4 on 16) unless a step names them. Each step samples every process's
# CPU once a second (scripts/process_cpu_sampler.py: <step>-cpu.jsonl) and prints its summary.
# Usage, from the repository root: bash docs/performance/llmapi-path/32core-llmapi-2ms-host.sh STEP... ; BUDGET_S: stop starting steps past this. LOCAL=1: small loads, for a
# dry run on the development machine. The *-nice steps renice bench's client processes to 10 while they run
# (tried in docs/performance.md, "Steady state again"; no gain). STEP+NAME: the step with the files under
# .carry/variants/NAME/ (repository paths) in place of the working tree's while it runs, its results named
# with -NAME: a change and main side by side on one host. trace-i1 also joins the first-token trace's events
# (scripts/first_token_trace.py) when its variant holds docs/performance/llmapi-path/first-token-trace.patch's files.
set -u
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
RES=/tmp/res; mkdir -p $RES
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
pack() { tar -czf $OUT/results.tgz -C $RES . 2>/dev/null; }

if [ -z "${LOCAL:-}" ]; then
  log "host: $(nproc) cores, $(python3 -V 2>&1) at $(command -v python3); $(nvidia-smi -L 2>/dev/null | head -2 | tr '\n' ' ')"
  log "cpu: $(lscpu 2>/dev/null | grep -E '^(Model name|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\))' | tr -s ' ' | tr '\n' ';')"
  PY=$(command -v python3)
  $PY -m venv --without-pip /tmp/v || { log "venv failed"; exit 1; }
  SP=$(/tmp/v/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  IMG=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  tar -xJf .carry/site312.tar.xz -C "$SP" 2>/dev/null || { log "extract failed"; exit 1; }
  echo "import site; site.addsitedir('$IMG')" > "$SP/zz_image_site.pth"   # the image's torch, after ours
  echo "$PWD/packages" > "$SP/trtllm_truss_src.pth"
  export PATH=/tmp/v/bin:$PATH
  PYRUN=python
else
  PYRUN=.venv/bin/python
fi
export PYTHONUNBUFFERED=1
$PYRUN - <<'EOF' || { log "imports failed"; exit 1; }
import numpy, torch, zmq, tritonclient.grpc, uvicorn, uvloop, trtllm_truss.cli
from trtllm_truss.engine_standin import SyntheticEngine
print("imports:", "torch", torch.__version__, "zmq", zmq.__version__, "uvloop", uvloop.__version__)
EOF
log "setup done"

export TRTLLM_BUILD__MAX_BATCH_SIZE=512 TRTLLM_RUNTIME__MAX_QUEUED_REQUESTS=512
C=$(nproc)
if [ -z "${LOCAL:-}" ]; then
  HIGH2="--concurrency 64,256,512 --num-requests 1024 --output-stddev 32 --client-processes 8"
  LONG2="--concurrency 256,512 --num-requests 4096 --output-stddev 32 --client-processes 8"   # 8-16 waves: steady state
  HIGH10="--concurrency 64,256 --num-requests 256 --output-stddev 32 --client-processes 8"
  ONE2="--concurrency 1 --num-requests 64 --output-mean 32 --output-stddev 0"
  ONE10="--concurrency 1 --num-requests 16 --output-mean 32 --output-stddev 0"
  WIDE10="--concurrency 512 --num-requests 2048 --output-stddev 32 --client-processes 8"   # 4 waves
  TRACE2="--concurrency 256 --num-requests 2048 --output-stddev 32 --client-processes 8"
else
  HIGH2="--concurrency 16 --num-requests 64 --output-mean 32"; HIGH10=$HIGH2; LONG2=$HIGH2; WIDE10=$HIGH2; TRACE2=$HIGH2
  ONE2="--concurrency 1 --num-requests 8 --output-mean 16"; ONE10=$ONE2
fi

# step NAME ESTIMATE_S ENV... -- BENCH_ARGS...
step() {
  local name=$1 est=$2; shift 2; LAST=$name
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local left=$(( BUDGET_S - ($(date +%s) - T0) ))
  if [ $left -lt $est ]; then log "SKIP $name (needs ~${est}s, ${left}s left)"; echo "$name skipped" >> $RES/steps.txt; return; fi
  local s=$(date +%s)
  name=$name${VARIANT:+-$VARIANT}
  local n=$name k=2; while [ -e $RES/$n.log ]; do n=$name-run$k; k=$((k + 1)); done; name=$n; LAST=$n   # a step run again
  log "START $name: ${envs[*]} bench $*"
  $PYRUN scripts/process_cpu_sampler.py $RES/$name-cpu.jsonl & local sampler=$!   # per-process CPU, each second
  local renicer=
  if [ -n "${NICE_CLIENTS:-}" ]; then   # bench's client processes (stand-ins for remote users) yield to the stack
    ( while true; do for p in $(pgrep -f multiprocessing.spawn); do renice -n $NICE_CLIENTS -p $p >/dev/null 2>&1; done; sleep 0.5; done ) &
    renicer=$!
  fi
  env "${envs[@]}" timeout $(( left - 5 )) $PYRUN -m trtllm_truss.cli bench . --no-progress --rounds 3 \
    --json $RES/${C}core-llmapi-$name.json "$@" > $RES/$name.log 2>&1
  local rc=$?
  kill $sampler; wait $sampler 2>/dev/null
  [ -n "$renicer" ] && { kill $renicer; wait $renicer 2>/dev/null; }
  $PYRUN scripts/process_cpu_sampler.py summarize $RES/$name-cpu.jsonl | cut -c1-600
  log "END $name rc=$rc in $(( $(date +%s) - s ))s"
  echo "$name rc=$rc $(( $(date +%s) - s ))s" >> $RES/steps.txt
  grep -E "^(ratio|engine|http|llm|pytorch)|x[0-9]|Error|error" $RES/$name.log | grep -v "^  I1[0-9]" | tail -${TAILN:-12}
  pack
}

L="TRTLLM_RUNTIME__BACKEND=llmapi"
S2='TRTLLM_RUNTIME__PYTORCH__SYNTHETIC={"step_time_ms": 2}'
S10='TRTLLM_RUNTIME__PYTORCH__SYNTHETIC={"step_time_ms": 10}'
WITH="--compare --with-llm --front direct"
BACK="--compare-backends pytorch,llmapi --target http --front direct"
# variant NAME: its files over the working tree's, the originals kept; unvariant: put them back
# (a file the tree lacks is removed again)
variant() {
  local d=.carry/variants/$1 f; [ -d "$d" ] || return 1
  rm -rf /tmp/orig && mkdir -p /tmp/orig && (cd "$d" && find . -type f) > /tmp/orig.list
  while read -r f; do
    if [ -e "$f" ]; then mkdir -p "/tmp/orig/$(dirname "$f")" && cp -p "$f" "/tmp/orig/$f" || return 1; fi
    cp "$d/$f" "$f" || return 1
  done < /tmp/orig.list
}
unvariant() { local f; while read -r f; do if [ -e "/tmp/orig/$f" ]; then cp -p "/tmp/orig/$f" "$f"; else rm -f "$f"; fi; done < /tmp/orig.list; }
for s in "$@"; do
VARIANT=; case $s in *+*) VARIANT=${s#*+}; s=${s%%+*}
  variant "$VARIANT" || { log "SKIP $s+$VARIANT: .carry/variants/$VARIANT is missing or does not fit"; unvariant; continue; } ;; esac
case $s in
  2ms-i1)     step 2ms-interval1 200 "$L" "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- $WITH $HIGH2 ;;
  2ms-i4)     step 2ms-interval4 200 "$L" "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- $WITH $HIGH2 ;;
  2ms-i1-long) step 2ms-interval1-long 150 "$L" "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- $WITH $LONG2 ;;
  2ms-i4-long) step 2ms-interval4-long 150 "$L" "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- $WITH $LONG2 ;;
  2ms-i1-long-nice) NICE_CLIENTS=10 step 2ms-interval1-long-nice-clients 260 "$L" "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- $WITH $LONG2 ;;
  2ms-i4-long-nice) NICE_CLIENTS=10 step 2ms-interval4-long-nice-clients 260 "$L" "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- $WITH $LONG2 ;;
  2ms-i1-long-f8) step 2ms-interval1-long-8frontends 260 "$L" "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=1 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- $WITH $LONG2 ;;
  2ms-i4-long-f8) step 2ms-interval4-long-8frontends 260 "$L" "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=4 TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES=8 -- $WITH $LONG2 ;;
  2ms-i1-c1)  step 2ms-interval1-c1 70 "$L" "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- $WITH $ONE2 ;;
  2ms-i4-c1)  step 2ms-interval4-c1 70 "$L" "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- $WITH $ONE2 ;;
  10ms-i1)    step 10ms-interval1 110 "$L" "$S10" TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- $WITH $HIGH10 ;;
  10ms-i4)    step 10ms-interval4 110 "$L" "$S10" TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- $WITH $HIGH10 ;;
  10ms-i1-512) step 10ms-interval1-c512 90 "$L" "$S10" TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- $WITH $WIDE10 ;;
  10ms-i4-512) step 10ms-interval4-c512 90 "$L" "$S10" TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- $WITH $WIDE10 ;;
  10ms-i1-c1) step 10ms-interval1-c1 70 "$L" "$S10" TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- $WITH $ONE10 ;;
  10ms-i4-c1) step 10ms-interval4-c1 70 "$L" "$S10" TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- $WITH $ONE10 ;;
  tensor-2ms-i1) step tensor-vs-llmapi-2ms-interval1 150 "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- $BACK $HIGH2 ;;
  tensor-2ms-i4) step tensor-vs-llmapi-2ms-interval4 150 "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- $BACK $HIGH2 ;;
  tensor-10ms-i1) step tensor-vs-llmapi-10ms-interval1 120 "$S10" TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- $BACK $HIGH10 ;;
  tensor-10ms-i4) step tensor-vs-llmapi-10ms-interval4 120 "$S10" TRTLLM_RUNTIME__STREAM_INTERVAL=4 -- $BACK $HIGH10 ;;
  tensor-2ms-i1-c1) step tensor-vs-llmapi-2ms-interval1-c1 80 "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- $BACK $ONE2 ;;
  trace-i1)   # with a variant holding docs/performance/llmapi-path/first-token-trace.patch's files: each leg of a first token
    rm -rf /tmp/trtllm-trace && mkdir /tmp/trtllm-trace
    step 2ms-interval1-first-token-trace 90 "$L" "$S2" TRTLLM_RUNTIME__STREAM_INTERVAL=1 -- $WITH $TRACE2
    $PYRUN scripts/first_token_trace.py /tmp/trtllm-trace --json $RES/${C}core-llmapi-$LAST-legs.json | tail -25
    rm -rf /tmp/trtllm-trace; pack ;;
  *) log "unknown step $s" ;;
esac
[ -n "$VARIANT" ] && unvariant
done
log "all done"
