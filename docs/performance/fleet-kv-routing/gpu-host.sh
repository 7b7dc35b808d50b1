#!/bin/bash
# The fleet study on the GPU host (a harness, not part of the product). The synthetic engine needs no GPU:
# the host's 16 cores are what the 4 replicas, Dynamo and the client use.
#   setup          unpack the carried Dynamo archive, keep a carried part of the site archive under /tmp (a call each)
#   fleet-kv fleet-rr   serve --replicas R of the embedded default (synthetic engine, block reuse, finite pool,
#                  KV events) with router_mode kv / round_robin, each replayed by `bench --trace`
#   mocker         Dynamo's mocker fleet (harness.py) on the same slice, replicas, block size and pools
#   direct1-cN / fleet1-cN   one replica served directly vs a 1-replica fleet, N streams back to back
# Usage, from the repository root: bash gpu-host.sh STEP...  LOCAL=1: the development machine's .venv, small loads.
# RES (default /tmp/res), PORT (default 8000): where results go and where the fleet listens. Dynamo's router
# weights come from the environment as any fleet setting (e.g. TRTLLM_FLEET__OVERLAP_SCORE_CREDIT=4).
# STEP_MS, PREFILL_MS (default 10, 0.05): the synthetic engine's costs; MOCKER_SPEEDUP (default 1): the mocker's
# --speedup-ratio (0: no simulated delays, the timing-free comparison with STEP_MS=0 PREFILL_MS=0).
set -u
T0=$(date +%s); BUDGET_S=${BUDGET_S:-560}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; RES=${RES:-/tmp/res}; mkdir -p $RES; PORT=${PORT:-8000}
STUDY=docs/performance/fleet-kv-routing
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
pack() { tar -czf $OUT/results.tgz -C $RES . 2>/dev/null; }
R=${REPLICAS:-4}; LIMIT=${TRACE_LIMIT:-1750}; SCALE=${TIME_SCALE:-0.1}; MAXOUT=${MAX_OUTPUT:-64}
POOL_BLOCKS=4096; BLOCK=16
if [ -z "${LOCAL:-}" ]; then
  if [ "${1:-}" = setup ]; then
    # Whatever this call carries: the Dynamo archive is unpacked, a part of the site archive kept under /tmp (the
    # tracked tree, 23 MB, leaves about 43 MB a call: Dynamo alone, then each half of the site archive).
    if [ -f .carry/dyn312.tar.xz ]; then mkdir -p /tmp/dyn && tar -xJf .carry/dyn312.tar.xz -C /tmp/dyn && log "setup: dynamo, $(du -sh /tmp/dyn | cut -f1)"; fi
    for part in .carry/site312.part-a?; do [ -f "$part" ] && cp "$part" /tmp/ && log "setup: $(basename "$part") kept under /tmp"; done
    exit
  fi
  log "host: $(nproc) cores, $(python3 -V 2>&1); $(nvidia-smi -L 2>/dev/null | head -1)"
  log "cpu: $(lscpu 2>/dev/null | grep -E '^Model name' | tr -s ' ')"
  PY=$(command -v python3)
  if [ ! -x /tmp/v/bin/python ]; then
    $PY -m venv --without-pip /tmp/v || { log "venv failed"; exit 1; }
    SP=$(/tmp/v/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    IMG=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # Part ab is carried by this call, or was kept under /tmp by an earlier call to the warm machine.
    AA=.carry/site312.part-aa; [ -f $AA ] || AA=/tmp/site312.part-aa
    AB=.carry/site312.part-ab; [ -f $AB ] || AB=/tmp/site312.part-ab
    cat $AA $AB | tar -xJ -C "$SP" || { log "site extract failed"; exit 1; }
    cp -a /tmp/dyn/. "$SP/"
    echo "import site; site.addsitedir('$IMG')" > "$SP/zz_image_site.pth"
    # The package as committed on the study's branch (carried: the device gets /work/main's working tree,
    # which may hold someone's edits in progress), else the tree's own.
    if [ -d .carry/packages ]; then echo "$PWD/.carry/packages" > "$SP/trtllm_truss_src.pth"; else echo "$PWD/packages" > "$SP/trtllm_truss_src.pth"; fi
  fi
  export PATH=/tmp/v/bin:$PATH; PYRUN=python
  # One GPU here: the fleet's plan would give each replica a GPU and refuse 4 on 1. The synthetic engine
  # uses none, so the replicas run as CPU stacks (as on a machine without GPUs): nvidia-smi hidden.
  mkdir -p /tmp/nogpu && printf '#!/bin/sh\nexit 1\n' > /tmp/nogpu/nvidia-smi && chmod +x /tmp/nogpu/nvidia-smi
  export PATH=/tmp/nogpu:$PATH
else
  PYRUN=$PWD/.venv/bin/python; export PATH=$PWD/.venv/bin:$PATH
fi
export PYTHONUNBUFFERED=1
$PYRUN -c "import dynamo._core, dynamo.llm, tritonclient.grpc, uvloop, torch, trtllm_truss.runtime.fleet; print('imports ok, torch', torch.__version__)" || { log "imports failed"; exit 1; }
C=$(nproc)
# The engine: synthetic, 10 ms steps, 0.05 ms per uncached prompt token, blocks of 16, 4,096 blocks a replica.
ENGINE=(TRTLLM_BUILD__PLUGIN_CONFIGURATION__TOKENS_PER_BLOCK=$BLOCK TRTLLM_RUNTIME__ENABLE_KV_CACHE_REUSE=true
  TRTLLM_RUNTIME__MAX_TOKENS_IN_PAGED_KV_CACHE=$((POOL_BLOCKS * BLOCK)) TRTLLM_RUNTIME__EVENT_BUFFER_MAX_SIZE=4096
  "TRTLLM_RUNTIME__PYTORCH__SYNTHETIC={\"step_time_ms\": ${STEP_MS:-10}, \"prefill_time_per_token_ms\": ${PREFILL_MS:-0.05}}")
TRACE=(--trace $STUDY/conversation_trace_first600s.jsonl --tokenizer data/embedded-llama --trace-block-tokens $BLOCK
  --kv-block-tokens $BLOCK --trace-max-input 1536 --trace-max-output $MAXOUT --trace-limit $LIMIT --ignore-eos end_id --no-progress)
wait_up() {  # url pid timeout log (serve prints "ready:" once every replica is in)
  local i=0; while [ $i -lt $3 ]; do
    kill -0 $2 2>/dev/null || return 1
    grep -q '^ready:' $4 && curl -sf -m 2 $1/v1/models >/dev/null 2>&1 && return 0; sleep 1; i=$((i + 1)); done; return 1; }
stop() { kill -TERM -- -$1 2>/dev/null; for i in $(seq 40); do kill -0 $1 2>/dev/null || return 0; sleep 0.5; done; kill -KILL -- -$1 2>/dev/null; }
# serve NAME ENV... -- SERVE_ARGS... ;; then bench BENCH_ARGS (global BENCH)
served_bench() {
  local name=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local left=$(( BUDGET_S - ($(date +%s) - T0) )); [ $left -lt 90 ] && { log "SKIP $name (${left}s left)"; return; }
  local s=$(date +%s); log "START $name: ${envs[*]} serve $*"
  setsid env "${ENGINE[@]}" "${envs[@]}" $PYRUN -m trtllm_truss.cli serve . --port $PORT "$@" > $RES/$name-serve.log 2>&1 &
  local pid=$!
  if ! wait_up http://127.0.0.1:$PORT $pid 240 $RES/$name-serve.log; then log "$name: not up"; tail -30 $RES/$name-serve.log; stop $pid; pack; return; fi
  log "$name: up in $(( $(date +%s) - s ))s"
  timeout $(( left - 30 )) $PYRUN -m trtllm_truss.cli bench . --url http://127.0.0.1:$PORT "${BENCH[@]}" --json $RES/${C}core-$name.json > $RES/$name.log 2>&1
  log "$name bench rc=$? in $(( $(date +%s) - s ))s"; tail -${TAILN:-14} $RES/$name.log
  stop $pid; pack
}
for s in "$@"; do case $s in
  fleet-kv) BENCH=("${TRACE[@]}" --trace-time-scale $SCALE --lru-pool-blocks $((R * POOL_BLOCKS)))
            served_bench fleet$R-kv TRTLLM_FLEET__ROUTER_MODE=kv -- --replicas $R ;;
  fleet-rr) BENCH=("${TRACE[@]}" --trace-time-scale $SCALE --lru-pool-blocks $((R * POOL_BLOCKS)))
            served_bench fleet$R-round-robin TRTLLM_FLEET__ROUTER_MODE=round_robin -- --replicas $R ;;
  # The mocker fleet's router gets the fleet's overlap credit where the environment sets one (the frontend's flag).
  mocker) CREDIT=${TRTLLM_FLEET__OVERLAP_SCORE_CREDIT:+--frontend-arg=--router-kv-overlap-score-credit=$TRTLLM_FLEET__OVERLAP_SCORE_CREDIT}
          log "START mocker $CREDIT"; timeout $(( BUDGET_S - ($(date +%s) - T0) - 10 )) $PYRUN $STUDY/harness.py --replicas $R --block-size $BLOCK --pool-blocks $POOL_BLOCKS $CREDIT --speedup-ratio ${MOCKER_SPEEDUP:-1} \
            --trace-block-tokens $BLOCK --trace-max-input 1536 --trace-max-output $MAXOUT --trace-time-scale $SCALE \
            --trace-limit $LIMIT --engine-type trtllm --out /tmp/mocker > $RES/mocker-harness.log 2>&1
          log "mocker rc=$?"; tail -5 $RES/mocker-harness.log
          for f in /tmp/mocker/*.json; do cp $f $RES/${C}core-mocker$R-$(basename $f); done
          grep -h -A12 '"reuse"' /tmp/mocker/mocker-*.json | grep -E 'cached_tokens"|cached_over' | head; pack ;;
  direct1-c*|fleet1-c*) n=${s#*-c}; BENCH=(--concurrency $n --num-requests $(( n == 1 ? 32 : 512 )) --input-mean 256 --output-mean 32 --output-stddev 0 --ignore-eos end_id --no-progress --target http --rounds 3)
          if [ ${s%%-*} = direct1 ]; then served_bench $s -- --front direct; else served_bench $s TRTLLM_FLEET__ROUTER_MODE=kv -- --replicas 1; fi ;;
  *) log "unknown step $s";;
esac; done
pack; log "all done"
