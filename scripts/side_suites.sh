#!/usr/bin/env bash
# `make test`'s suites beside the main one: the tests that need no torch on each extra Python (.venv-py3.X),
# and the NVIDIA image environments. They run in two lanes at a time (SIDE_LANES), each suite after the one
# before it in its lane: each uses about half a core (its integration tests wait on tritonserver, the image
# environments on pip), so two lanes take about half the time of one on CI's 2 cores, and the timing bounds
# some tests hold (a compile refused within its budget) keep a core's worth of room. Each suite writes its
# own log, printed whole, in order, when all have ended.
# Usage: scripts/side_suites.sh "PYTEST_ARGS" MINOR...
set -u
cd "$(dirname "$0")/.."
args=$1; shift
lanes=${SIDE_LANES:-2}
logs=$(mktemp -d)
jobs=()
for minor in "$@"; do
  if [ -x ".venv-py$minor/bin/python" ]; then
    jobs+=("$minor")
  else
    echo "== Python $minor: no .venv-py$minor (bootstrap found no interpreter): skipped"
  fi
done
jobs+=(images)

run_job() {
  if [ "$1" = images ]; then
    echo "== NVIDIA image environments (tests/data/images)"
    .venv/bin/python -m pytest -m image_env $args
  else
    echo "== Python $1: the tests that need no torch"
    ".venv-py$1/bin/python" -m pytest -m "not image_env" $args
  fi
}

pids=()
for ((lane = 0; lane < lanes; lane++)); do
  (
    status=0
    for ((i = lane; i < ${#jobs[@]}; i += lanes)); do
      run_job "${jobs[$i]}" > "$logs/$i.log" 2>&1 || { status=1; echo "${jobs[$i]}" >> "$logs/failed"; }
    done
    exit $status
  ) &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
for ((i = 0; i < ${#jobs[@]}; i++)); do cat "$logs/$i.log"; done
failed=$(cat "$logs/failed" 2>/dev/null | tr '\n' ' ')
rm -rf "$logs"
if [ -n "$failed" ]; then echo "== failed: $failed"; exit 1; fi
