"""The fleet's dependency: NVIDIA Dynamo 1.6.1 installed as requirements/fleet.txt says (scripts/bootstrap.sh),
with the names the fleet uses, and the `fleet` extra pinned as that file is."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def test_the_extra_pins_what_the_requirements_file_pins():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    fleet_txt = _pins((ROOT / "requirements" / "fleet.txt").read_text().splitlines())
    lock = _pins((ROOT / "requirements" / "lock.txt").read_text().splitlines())
    extra = _pins(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["fleet"])
    assert fleet_txt["ai-dynamo"] == fleet_txt["ai-dynamo-runtime"] == "1.6.1"
    for name, version in extra.items():
        assert fleet_txt.get(name, lock.get(name)) == version, name


def test_dynamo_is_installed_with_the_names_the_fleet_uses():
    pytest.importorskip("dynamo.llm", reason="requirements/fleet.txt not installed (scripts/bootstrap.sh does)")
    assert metadata.version("ai-dynamo-runtime") == metadata.version("ai-dynamo") == "1.6.1"
    import dynamo.llm as llm
    from dynamo.runtime import DistributedRuntime  # noqa: F401

    for name in ("KvRouter", "KvRouterConfig", "KvEventPublisher", "register_model", "ModelInput", "ModelType",
                 "ModelRuntimeConfig", "WorkerType", "compute_block_hash_for_seq"):
        assert hasattr(llm, name), name
    # The shape we publish: one block of 4 tokens hashes the same whoever computes it.
    assert llm.compute_block_hash_for_seq([1, 2, 3, 4], 4) == llm.compute_block_hash_for_seq([1, 2, 3, 4], 4)
