#!/bin/bash
# KV routing against round robin as the offered load grows (a harness, not part of the product): our 2-replica
# fleet of the synthetic engine on the study's smoke slice (the trace's first 600 requests), at several trace
# rates, the two router modes interleaved at each rate, RUNS times; then summary.json (summarize.py).
# Run from the repository root of a checkout with its .venv and the fleet extra (make bootstrap):
#   bash docs/performance/fleet-kv-routing/2core-load-sweep/sweep.sh
# SCALES (default "0.25 0.1 0.07 0.05": --trace-time-scale, 0.1 = ten times the trace's rate), RUNS (default 2),
# PREFILL_MS (default 0.2: a larger model's prefill than the GPU-host study's 0.05), STEP_MS (default 10).
set -u
HERE=docs/performance/fleet-kv-routing/2core-load-sweep
OUT=${OUT:-$HERE}
for run in $(seq ${RUNS:-2}); do
  for scale in ${SCALES:-0.25 0.1 0.07 0.05}; do
    for mode in kv rr; do
      res=/tmp/load-sweep/$mode-$scale-run$run; rm -rf $res; mkdir -p $res
      LOCAL=1 REPLICAS=2 TRACE_LIMIT=600 MAX_OUTPUT=32 TIME_SCALE=$scale PREFILL_MS=${PREFILL_MS:-0.2} \
        STEP_MS=${STEP_MS:-10} BUDGET_S=900 RES=$res OUT=$res PORT=${PORT:-8472} \
        bash docs/performance/fleet-kv-routing/gpu-host.sh fleet-$mode > $res/log.txt 2>&1
      name=$([ $mode = kv ] && echo kv || echo round-robin)
      cp $res/*core-fleet2-$name.json $OUT/$name-scale-$scale-run$run.json 2>/dev/null \
        || { echo "no report: $mode $scale run $run"; tail -5 $res/log.txt; }
      echo "$(date -u +%H:%M:%S) $mode scale $scale run $run: $(grep -E 'TTFT p50|cached / bound' $res/log.txt | tr '\n' ' ')"
    done
  done
done
.venv/bin/python $HERE/summarize.py $OUT
