#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian/Ubuntu machine, idempotently:
# system packages (Open MPI for TP*PP > 1 launches, git-lfs for the hub test server, PostgreSQL for the
# store's server backend, etcd for the fleet's tests),
# .venv with the pinned lock (CPU torch), NVIDIA Dynamo (requirements/fleet.txt) and this package in editable mode,
# .venv-olah (the self-hosted HF hub used by tests; its fastapi pin clashes with truss's),
# .venv-lint (import-linter, which checks the layers; its rich pin clashes with truss's),
# .venv-py3.10/.venv-py3.12/.venv-py3.13 (no torch) for the suite's torch-free tests on those Pythons.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

need_apt=()
command -v mpirun >/dev/null || need_apt+=(openmpi-bin)
command -v git-lfs >/dev/null || need_apt+=(git-lfs)
# PostgreSQL for the store's server backend (its tests start one with initdb/pg_ctl on a temporary folder);
# Debian keeps its binaries in /usr/lib/postgresql/<version>/bin, off PATH.
command -v initdb >/dev/null || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need_apt+=(postgresql)
command -v etcd >/dev/null || need_apt+=(etcd-server)  # the fleet's discovery across hosts (tests/unit/test_fleet_routing.py)
if ((${#need_apt[@]})); then
  if [ "$(id -u)" = 0 ]; then
    echo "bootstrap: apt-get install ${need_apt[*]}"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "bootstrap: optional system packages missing (${need_apt[*]}); tests that need them will be skipped" >&2
  fi
fi

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }
# pip's one-line notes about index folders this machine's pip.conf names but lacks are noise here.
quiet_pip() { "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }; }
pip_in() { local venv=$1; shift; quiet_pip "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@"; }

# Interpreter for another Python minor version: pyenv's (the machine image has them), else pythonX.Y on PATH.
python_for() {
  local minor=$1 root=${PYENV_ROOT:-$HOME/.pyenv} candidate
  for candidate in $(ls -d "$root"/versions/"$minor".* 2>/dev/null | sort -V -r); do
    [ -x "$candidate/bin/python$minor" ] && { echo "$candidate/bin/python$minor"; return; }
  done
  command -v "python$minor" || true
}

# Each venv's dependencies (its `&&`s: a lane calls these where `set -e` does not apply).
deps_main() {
  # Test corpora shipped as PyPI packages whose own dependencies (an evaluation harness's model
  # clients) are not needed to read their data files; pins whose declared dependencies cannot be installed
  # beside lock.txt's: xgrammar without its GPU-only `triton`, instructor (requirements/no-deps-py3.11.txt).
  pip_in .venv -r requirements/lock.txt &&
    pip_in .venv --no-deps -r requirements/corpus.txt &&
    pip_in .venv --no-deps -r requirements/no-deps-py3.11.txt &&
    pip_in .venv --no-deps -r requirements/fleet.txt  # NVIDIA Dynamo (the fleet's tests): see the file for why --no-deps
}
# One venv per extra Python: its own lock (no torch: the CPU wheel here is for 3.11 only, and an
# unpinned torch would pull GBs of CUDA; so no xgrammar either: there the request path checks a guide's
# type and size only).
deps_extra() {
  pip_in "$1" -r "requirements/lock-py$2.txt" && pip_in "$1" --no-deps -r requirements/corpus.txt
}
deps_of() {
  case $1 in
    .venv) deps_main ;;
    .venv-olah) pip_in .venv-olah -r requirements/olah.txt ;;
    .venv-lint) pip_in .venv-lint -r requirements/lint.txt ;;
    .venv-py*) deps_extra "$1" "${1#.venv-py}" ;;
  esac
}

todo=()  # "venv interpreter stamp", in the order their lines are printed
add() {
  local venv=$1 interpreter=$2; shift 2
  local want; want=$(stamp_of "$@")
  [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$want" ] || todo+=("$venv $interpreter $want")
}
add .venv "$PYTHON" requirements/lock.txt requirements/corpus.txt requirements/no-deps-py3.11.txt requirements/fleet.txt pyproject.toml
add .venv-olah "$PYTHON" requirements/olah.txt         # the HF hub mirror the tests talk to
add .venv-lint "$PYTHON" requirements/lint.txt         # import-linter: the layer contracts of pyproject.toml
for minor in ${EXTRA_PYTHONS-3.10 3.12 3.13}; do       # SKIP_EXTRA_PYTHONS=1 leaves them out
  [ "${SKIP_EXTRA_PYTHONS:-0}" = 1 ] && break
  interpreter=$(python_for "$minor")
  if [ -z "$interpreter" ]; then
    echo "bootstrap: no Python $minor found (pyenv or python$minor on PATH); its test run will be skipped" >&2
    continue
  fi
  add ".venv-py$minor" "$interpreter" "requirements/lock-py$minor.txt" requirements/corpus.txt pyproject.toml
done
((${#todo[@]})) || exit 0

# The dependencies in two lanes, side by side: .venv, the big one (torch), in the first; every other venv, one
# after another, in the second (on 2 cores with pip's cache warm, 8.9 min against 13.0 one venv at a time, in
# the same hour). This package's editable install, which writes into the source tree, then goes into each venv
# one at a time.
lane() {
  local entry venv interpreter
  for entry in "$@"; do
    read -r venv interpreter _ <<< "$entry"
    echo "bootstrap: installing $venv ($("$interpreter" -V 2>&1)$([ "$venv" = .venv ] && echo ", pinned, CPU torch; first time takes a few minutes"))"
    { [ -x "$venv/bin/python" ] || "$interpreter" -m venv "$venv"; } && deps_of "$venv" ||
      { echo "bootstrap: installing $venv failed" >&2; return 1; }
  done
}
first=() rest=()
for entry in "${todo[@]}"; do
  if [ "${entry%% *}" = .venv ]; then first+=("$entry"); else rest+=("$entry"); fi
done
pids=()
((${#first[@]})) && { lane "${first[@]}" & pids+=($!); }
((${#rest[@]})) && { lane "${rest[@]}" & pids+=($!); }
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
[ $status = 0 ] || exit 1
for entry in "${todo[@]}"; do
  read -r venv interpreter want <<< "$entry"
  case $venv in .venv | .venv-py*) pip_in "$venv" --no-deps --no-build-isolation -e . ;; esac
  echo "$want" > "$venv/.stamp"
done
