#!/usr/bin/env bash
# `make test`'s suites, scheduled for CI's 2 cores. The integration tests mostly wait (on tritonserver, on the
# embedded model, on servers starting), so one suite alone leaves a core idle (the whole 3.11 suite: 0.85 of a
# core on average). So, first, two lanes side by side:
#   lane 1: the integration tests on Python 3.11 (.venv, with CPU torch);
#   lane 2: the unit tests on 3.11, then the tests that need no torch on each extra Python (.venv-py3.X), then
#           the NVIDIA image environments (-m image_env);
# then, with the machine to themselves, the tests marked `alone` on 3.11 (timing bounds that must hold on a
# quiet machine: a compile refused within its budget, a bad body within a second, 64 streams open at a kill;
# timing bounds are checked on 3.11 only, the extra Pythons deselect them). Each suite writes its own log, printed whole, in
# order, once all have ended.
# Usage: scripts/test_suites.sh "PYTEST_ARGS" MINOR...
set -u
cd "$(dirname "$0")/.."
args=$1; shift
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# Every suite in the order its log is printed; lane 1 is the first, lane 2 all but the first and the last.
order=("3.11 integration" "3.11 unit")
for minor in "$@"; do
  if [ -x ".venv-py$minor/bin/python" ]; then
    order+=("$minor")
  else
    echo "== Python $minor: no .venv-py$minor (bootstrap found no interpreter): skipped"
  fi
done
order+=(images alone)
last=$((${#order[@]} - 1))

run_suite() {
  case $1 in
    "3.11 integration")
      echo "== Python 3.11: the integration tests"
      .venv/bin/python -m pytest tests/integration -m "not image_env and not alone" $args ;;
    "3.11 unit")
      echo "== Python 3.11: the unit tests"
      .venv/bin/python -m pytest tests/unit -m "not image_env and not alone" $args ;;
    images)
      echo "== NVIDIA image environments (tests/data/images)"
      .venv/bin/python -m pytest -m image_env $args ;;
    alone)
      echo "== Python 3.11: the tests that need the machine to themselves (marked alone)"
      .venv/bin/python -m pytest -m "alone and not image_env" $args ;;
    *)
      echo "== Python $1: the tests that need no torch"
      ".venv-py$1/bin/python" -m pytest -m "not image_env and not alone" $args ;;
  esac
}

# Runs the suites of `order` from index $1 to index $2, one after another, each into its log.
lane() {
  local i started status=0
  for ((i = $1; i <= $2; i++)); do
    started=$SECONDS
    run_suite "${order[$i]}" > "$logs/$i.log" 2>&1 || { status=1; echo "${order[$i]}" >> "$logs/failed"; }
    echo "== (${order[$i]}: $((SECONDS - started)) s)" >> "$logs/$i.log"
  done
  return $status
}

lane 0 0 & first=$!
lane 1 $((last - 1)) & second=$!
wait "$first"; wait "$second"
lane "$last" "$last"
for i in "${!order[@]}"; do cat "$logs/$i.log"; done
if [ -s "$logs/failed" ]; then echo "== failed: $(tr '\n' ' ' < "$logs/failed")"; exit 1; fi
