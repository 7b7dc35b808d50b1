#!/usr/bin/env bash
# `make test`'s suites beside the main one, run at the same time: the tests that need no torch on each extra
# Python (.venv-py3.X), and the NVIDIA image environments. Each is light on the CPU (its integration tests
# wait on tritonserver, the image environments on pip), so together they take about the longest one's time
# on CI's 2 cores, not their sum. Each writes to its own log, printed whole when all have ended, in order.
# Usage: scripts/side_suites.sh "PYTEST_ARGS" MINOR...
set -u
cd "$(dirname "$0")/.."
args=$1; shift
logs=$(mktemp -d)
pids=() names=()
for minor in "$@"; do
  if [ -x ".venv-py$minor/bin/python" ]; then
    ( echo "== Python $minor: the tests that need no torch"; .venv-py$minor/bin/python -m pytest -m "not image_env" $args ) > "$logs/$minor.log" 2>&1 &
    pids+=($!) names+=("$minor")
  else
    echo "== Python $minor: no .venv-py$minor (bootstrap found no interpreter): skipped"
  fi
done
( echo "== NVIDIA image environments (tests/data/images)"; .venv/bin/python -m pytest -m image_env $args ) > "$logs/images.log" 2>&1 &
pids+=($!) names+=(images)
failed=()
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed+=("${names[$i]}")
done
for name in "${names[@]}"; do cat "$logs/$name.log"; done
rm -rf "$logs"
if [ ${#failed[@]} -gt 0 ]; then echo "== failed: ${failed[*]}"; exit 1; fi
