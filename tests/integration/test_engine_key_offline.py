"""A replica whose engine is cached starts with the hub unreachable: the checkpoint's revision, resolved
once against a real HF-protocol server (olah), is recorded and reused for the cache key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_hubs import HubServer, hub_fixture  # noqa: F401 - session fixture
from trtllm_truss.artifacts.engine_builder import EngineBuilder
from trtllm_truss.artifacts.hub import HubUnreachableError
from trtllm_truss.config.build import BuildConfig
from trtllm_truss.planning.probe import GpuInfo, RuntimeFacts

FACTS = RuntimeFacts(gpus=(GpuInfo("NVIDIA H100 80GB HBM3", "9.0"),), trtllm_version="0.16.0", trtllm_unavailable_reason=None)
UNREACHABLE = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def key(builder: EngineBuilder, build: BuildConfig, record_dir: Path) -> str:
    return builder.key_for(
        build, source="acme/key-ckpt", revision=None, location="hub", facts=FACTS, truss_dir=None, record_dir=record_dir
    )[0]


def test_recorded_revision_keeps_the_key_while_the_hub_is_unreachable(hub: HubServer, tmp_path: Path):
    commit = hub.mirror.create("acme/key-ckpt", {"config.json": json.dumps({"model_type": "llama"})})
    build = BuildConfig(base_model_architecture="llama", huggingface_ckpt_repository="acme/key-ckpt")
    records = tmp_path / "revisions"
    online = key(EngineBuilder(environ=hub.env), build, records)
    assert any(commit in p.read_text() for p in records.iterdir())  # the resolved commit was recorded

    offline = EngineBuilder(environ=UNREACHABLE)
    assert key(offline, build, records) == online
    with pytest.raises(HubUnreachableError):  # nothing recorded: the outage is reported, not guessed around
        key(offline, build, tmp_path / "empty")
