#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian/Ubuntu machine, idempotently:
# system packages (Open MPI for TP*PP > 1 launches, git-lfs for the hub test server),
# .venv with the pinned lock (CPU torch) and this package in editable mode,
# .venv-olah (the self-hosted HF hub used by tests; its fastapi pin clashes with truss's),
# .venv-lint (import-linter, which checks the layers; its rich pin clashes with truss's),
# .venv-py3.10/.venv-py3.12/.venv-py3.13 (no torch) for the suite's torch-free tests on those Pythons.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

need_apt=()
command -v mpirun >/dev/null || need_apt+=(openmpi-bin)
command -v git-lfs >/dev/null || need_apt+=(git-lfs)
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

want=$(stamp_of requirements/lock.txt requirements/corpus.txt requirements/no-deps-py3.11.txt pyproject.toml)
if [ "$(cat .venv/.stamp 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing .venv (pinned, CPU torch; first time takes a few minutes)"
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  quiet_pip .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements/lock.txt
  # Test corpora shipped as PyPI packages whose own dependencies (an evaluation harness's model
  # clients) are not needed to read their data files.
  quiet_pip .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements/corpus.txt
  # Pins whose declared dependencies cannot be installed beside lock.txt's: xgrammar without its GPU-only
  # `triton`, instructor (requirements/no-deps-py3.11.txt says why).
  quiet_pip .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements/no-deps-py3.11.txt
  quiet_pip .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
  echo "$want" > .venv/.stamp
fi

want=$(stamp_of requirements/olah.txt)
if [ "$(cat .venv-olah/.stamp 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing .venv-olah (HF hub mirror for tests)"
  [ -x .venv-olah/bin/python ] || "$PYTHON" -m venv .venv-olah
  quiet_pip .venv-olah/bin/python -m pip install -q --disable-pip-version-check -r requirements/olah.txt
  echo "$want" > .venv-olah/.stamp
fi

want=$(stamp_of requirements/lint.txt)
if [ "$(cat .venv-lint/.stamp 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing .venv-lint (import-linter: the layer contracts of pyproject.toml)"
  [ -x .venv-lint/bin/python ] || "$PYTHON" -m venv .venv-lint
  quiet_pip .venv-lint/bin/python -m pip install -q --disable-pip-version-check -r requirements/lint.txt
  echo "$want" > .venv-lint/.stamp
fi

# Interpreter for another Python minor version: pyenv's (the machine image has them), else pythonX.Y on PATH.
python_for() {
  local minor=$1 root=${PYENV_ROOT:-$HOME/.pyenv} candidate
  for candidate in $(ls -d "$root"/versions/"$minor".* 2>/dev/null | sort -V -r); do
    [ -x "$candidate/bin/python$minor" ] && { echo "$candidate/bin/python$minor"; return; }
  done
  command -v "python$minor" || true
}

# One venv per extra Python: its own lock (no torch: the CPU wheel here is for 3.11 only, and an
# unpinned torch would pull GBs of CUDA; so no xgrammar either: there the request path checks a guide's
# type and size only). SKIP_EXTRA_PYTHONS=1 leaves them out.
for minor in ${EXTRA_PYTHONS-3.10 3.12 3.13}; do
  [ "${SKIP_EXTRA_PYTHONS:-0}" = 1 ] && break
  venv=.venv-py$minor
  want=$(stamp_of "requirements/lock-py$minor.txt" requirements/corpus.txt pyproject.toml)
  [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$want" ] && continue
  interpreter=$(python_for "$minor")
  if [ -z "$interpreter" ]; then
    echo "bootstrap: no Python $minor found (pyenv or python$minor on PATH); its test run will be skipped" >&2
    continue
  fi
  echo "bootstrap: installing $venv (Python $minor, no torch)"
  [ -x "$venv/bin/python" ] || "$interpreter" -m venv "$venv"
  quiet_pip "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "requirements/lock-py$minor.txt"
  quiet_pip "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r requirements/corpus.txt
  quiet_pip "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
  echo "$want" > "$venv/.stamp"
done
