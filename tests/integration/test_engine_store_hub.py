"""The Hugging Face engine store's read side against a real HF-protocol server (olah on loopback).

A replica whose cache misses asks the hub repo named by `build.publish_repository` for the key's entry
(`engines/<key>/manifest.json`), downloads `engines/<key>/engine/*` and verifies it against the manifest.
The entry is laid out in the repo exactly as `HubEngineStore.publish` uploads it (engine files, then the
manifest), but committed with git: olah accepts no uploads (create_repo/commit answer 405), and no
upload-capable HF server installs here, so `publish` itself is not tested against a server (see
docs/configuration.md, build.publish_repository). The engine is the TensorRT-LLM TEST DOUBLE's.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for the fakes package

from fakes.fake_trtllm_build import write_fake_engine  # noqa: E402
from fixtures_hubs import PRIVATE_ORG, HubServer, hub_fixture  # noqa: E402,F401 - session fixture

from trtllm_truss.artifacts.cache import EngineCache  # noqa: E402
from trtllm_truss.artifacts.cache_manifest import ENGINE_SUBDIR, MANIFEST_NAME  # noqa: E402
from trtllm_truss.artifacts.hub_engine_store import HubEngineStore  # noqa: E402

KEY = "3" * 64


def _digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def _published_entry(tmp_path: Path) -> tuple[dict[str, bytes], dict[str, str]]:
    """The files a publisher leaves in the repo for KEY, from a real local build into a cache."""
    built = EngineCache(tmp_path / "publisher").get(KEY, lambda dest: write_fake_engine(dest, tp=2))
    files = {f"engines/{KEY}/{ENGINE_SUBDIR}/{p.name}": p.read_bytes() for p in built.path.iterdir()}
    files[f"engines/{KEY}/{MANIFEST_NAME}"] = (built.path.parent / MANIFEST_NAME).read_bytes()
    return files, _digest(built.path)


def _never_build(dest: Path) -> None:
    raise AssertionError("the replica built although the store has the engine")


@pytest.mark.parametrize("org", ["fleet", PRIVATE_ORG])
def test_replica_downloads_the_published_engine_instead_of_building(hub: HubServer, tmp_path: Path, org: str) -> None:
    files, digest = _published_entry(tmp_path)
    repo = f"{org}/engine-store"
    hub.mirror.create(repo, files)
    token = hub.token if org == PRIVATE_ORG else None
    store = HubEngineStore(repo, token=token, endpoint=hub.endpoint)
    assert store.has(KEY) and not store.has("4" * 64)
    result = EngineCache(tmp_path / "replica").get(KEY, _never_build, remote=store)
    assert result.source == "remote" and _digest(result.path) == digest
    # a second start finds it locally, with no hub request
    before = len(hub.requests_seen())
    again = EngineCache(tmp_path / "replica").get(KEY, _never_build, remote=store)
    assert again.source == "local" and len(hub.requests_seen()) == before


def test_private_store_without_the_token_is_not_served(hub: HubServer, tmp_path: Path) -> None:
    files, _ = _published_entry(tmp_path)
    hub.mirror.create(f"{PRIVATE_ORG}/engine-store-2", files)
    store = HubEngineStore(f"{PRIVATE_ORG}/engine-store-2", token=None, endpoint=hub.endpoint)
    with pytest.raises(Exception) as failure:
        store.has(KEY)
    assert hub.token not in str(failure.value)
