#!/usr/bin/env bash
# `make test`'s suites, scheduled for CI's 2 cores. Most suites mostly wait (on tritonserver, on the embedded
# model, on servers starting, on pip): the 3.11 integration tests keep 0.85 of a core busy on average, the extra
# Pythons' suites about 0.6. So three lanes side by side (about 2.3 cores asked of 2), each suite's tests in order:
#   lane 1: the 3.11 integration tests but those of lane 2 (.venv, with CPU torch);
#   lane 2: the 3.11 unit tests, the NVIDIA image environments (-m image_env), then the integration modules of
#           SECOND_LANE_MODULES (a third of the integration tests' time, its own pytest session);
#   lane 3: the tests that need no torch on each extra Python (.venv-py3.X; not those marked one_python);
# then, with the machine to themselves, the tests marked `alone` on 3.11 (timing bounds that must hold on a
# quiet machine: a compile refused within its budget, a bad body within a second, 64 streams open at a kill;
# timing bounds are checked on 3.11 only, the extra Pythons deselect them). Each suite writes its own log,
# printed whole, in order, once all have ended.
# Usage: scripts/test_suites.sh "PYTEST_ARGS" MINOR...
set -u
cd "$(dirname "$0")/.."
args=$1; shift
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# The integration modules lane 2 runs after its own suites (chosen by their time in a local CI run: lane 1 912 s,
# lane 2 1,074 s with test_forced_calls_only here too, which went back to lane 1).
SECOND_LANE_MODULES=(
  tests/integration/test_stack_shutdown.py
  tests/integration/test_truss_server_agent_apis.py
  tests/integration/test_truss_server_lora.py
  tests/integration/test_stored_responses.py
)
not_second=()
for module in "${SECOND_LANE_MODULES[@]}"; do not_second+=(--ignore "$module"); done

lane1=("3.11 integration")
lane2=("3.11 unit" images "3.11 integration, second part")
lane3=()
for minor in "$@"; do
  if [ -x ".venv-py$minor/bin/python" ]; then
    lane3+=("$minor")
  else
    echo "== Python $minor: no .venv-py$minor (bootstrap found no interpreter): skipped"
  fi
done
# Every suite in the order its log is printed.
order=("${lane1[@]}" "${lane2[@]}" "${lane3[@]}" alone)

run_suite() {
  case $1 in
    "3.11 integration")
      echo "== Python 3.11: the integration tests (but lane 2's modules)"
      .venv/bin/python -m pytest tests/integration "${not_second[@]}" -m "not image_env and not alone" $args ;;
    "3.11 integration, second part")
      echo "== Python 3.11: the integration tests of lane 2 (${SECOND_LANE_MODULES[*]##*/})"
      .venv/bin/python -m pytest "${SECOND_LANE_MODULES[@]}" -m "not image_env and not alone" $args ;;
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
      echo "== Python $1: the tests that need no torch (but those marked one_python)"
      ".venv-py$1/bin/python" -m pytest -m "not image_env and not alone and not one_python" $args ;;
  esac
}

# Runs the suites named in its arguments, one after another, each into the log of its index in `order`.
lane() {
  local suite i started status=0
  for suite in "$@"; do
    for i in "${!order[@]}"; do [ "${order[$i]}" = "$suite" ] && break; done
    started=$SECONDS
    run_suite "$suite" > "$logs/$i.log" 2>&1 || { status=1; echo "$suite" >> "$logs/failed"; }
    echo "== ($suite: $((SECONDS - started)) s)" >> "$logs/$i.log"
  done
  return $status
}

pids=()
lane "${lane1[@]}" & pids+=($!)
lane "${lane2[@]}" & pids+=($!)
((${#lane3[@]})) && { lane "${lane3[@]}" & pids+=($!); }
for pid in "${pids[@]}"; do wait "$pid"; done
lane alone
for i in "${!order[@]}"; do cat "$logs/$i.log"; done
if [ -s "$logs/failed" ]; then
  # Again at the end, where a reader of the output's tail (CI's summary) finds them: each failed suite's
  # failures, from pytest's FAILURES section (its first 200 lines) and its short summary.
  while read -r suite; do
    for i in "${!order[@]}"; do [ "${order[$i]}" = "$suite" ] && break; done
    echo "== the failures of $suite, again"
    sed -n '/^=* FAILURES =*$/,/^=* slowest/p' "$logs/$i.log" | head -200
    grep -E '^(FAILED|ERROR) ' "$logs/$i.log"
  done < "$logs/failed"
  echo "== failed: $(tr '\n' ' ' < "$logs/failed")"
  exit 1
fi
