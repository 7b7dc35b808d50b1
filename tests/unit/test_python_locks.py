"""Each Python's lock holds pyproject's exact pins as they apply to that Python, and never torch
outside 3.11 (its CPU wheel is 3.11-only here; any other torch would pull GBs of CUDA)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
LOCKS = {"3.10": "lock-py3.10.txt", "3.11": "lock.txt", "3.12": "lock-py3.12.txt", "3.13": "lock-py3.13.txt"}
# Pinned for the torch environment (3.11) only: torch, and peft (the stand-in's LoRA) with accelerate, which need it.
TORCH_ONLY = {"torch", "peft", "accelerate"}


def _lock(name: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line.strip())
        if match:
            pins[match.group(1).lower().replace("_", "-").replace(".", "-")] = match.group(2)
    return pins


def _pyproject_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for group in ("dev", "bench") for r in project["optional-dependencies"][group]]
    return [Requirement(r) for r in project["dependencies"] + extras]


@pytest.mark.parametrize("python", sorted(LOCKS))
def test_lock_holds_the_pyproject_pins_for_its_python(python: str):
    lock = _lock(LOCKS[python])
    environment = {"python_version": python, "python_full_version": f"{python}.0"}
    for requirement in _pyproject_requirements():
        name = requirement.name.lower().replace("_", "-").replace(".", "-")
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        if name in TORCH_ONLY and python != "3.11":
            continue
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"{requirement} is not an exact pin"
        assert lock.get(name) == spec.version, f"{LOCKS[python]}: {name} {lock.get(name)} != pyproject {spec.version}"


@pytest.mark.parametrize("python", ["3.10", "3.12", "3.13"])
def test_no_torch_outside_3_11(python: str):
    assert not TORCH_ONLY & set(_lock(LOCKS[python]))
