"""EngineCache: publish, manifest, corruption, stale scratch, LRU eviction, remote-store policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for the fakes package

from fakes.fake_trtllm_build import write_fake_engine  # noqa: E402

from trtllm_truss.artifacts.cache import EngineCache  # noqa: E402
from trtllm_truss.artifacts.cache_manifest import COMPLETE_MARKER, EngineCacheError  # noqa: E402
from trtllm_truss.artifacts.hub_engine_store import decide_remote_use  # noqa: E402


def builder(calls: list[Path], **engine_kwargs):
    def create(dest: Path) -> None:
        calls.append(dest)
        write_fake_engine(dest, **engine_kwargs)

    return create


def test_builds_once_then_hits(tmp_path: Path) -> None:
    cache, calls = EngineCache(tmp_path / "c"), []
    first = cache.get("k1", builder(calls, tp=2, pp=2))
    second = cache.get("k1", builder(calls))
    assert len(calls) == 1 and first.source == "built" and second.source == "local"
    assert first.path == second.path == cache.engine_dir("k1")
    assert sorted(p.name for p in first.path.iterdir()) == ["config.json", *(f"rank{r}.engine" for r in range(4))]
    manifest = json.loads((cache.entry_dir("k1") / "manifest.json").read_text())
    assert manifest["key"] == "k1" and manifest["format_version"] == 1
    assert {f["path"]: f["size"] for f in manifest["files"]}["rank3.engine"] == 4096
    assert all(len(f["sha256"]) == 64 for f in manifest["files"])
    assert cache.verify("k1") == []
    assert not any((tmp_path / "c" / "scratch").iterdir())


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path / "c")

    def broken(dest: Path) -> None:
        write_fake_engine(dest)
        raise RuntimeError("trtllm-build died")

    with pytest.raises(RuntimeError, match="trtllm-build died"):
        cache.get_or_create("k", broken)
    assert cache.lookup("k") is None
    assert not cache.entry_dir("k").exists() and not any((tmp_path / "c" / "scratch").iterdir())
    with pytest.raises(EngineCacheError, match="empty directory"):
        cache.get_or_create("k", lambda dest: None)


def test_truncated_entry_is_rebuilt(tmp_path: Path) -> None:
    cache, calls = EngineCache(tmp_path / "c"), []
    path = cache.get_or_create("k", builder(calls))
    (path / "rank0.engine").write_bytes(b"short")  # size no longer matches the manifest
    assert cache.lookup("k") is None
    assert cache.get("k", builder(calls)).source == "built" and len(calls) == 2
    assert cache.verify("k") == []


def test_entry_without_marker_is_not_an_entry(tmp_path: Path) -> None:
    cache, calls = EngineCache(tmp_path / "c"), []
    cache.get_or_create("k", builder(calls))
    (cache.entry_dir("k") / COMPLETE_MARKER).unlink()
    assert cache.lookup("k") is None
    cache.get_or_create("k", builder(calls))
    assert len(calls) == 2 and cache.lookup("k") is not None


def test_stale_scratch_of_dead_builder_is_cleaned(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path / "c")
    stale = tmp_path / "c" / "scratch" / "k.99999.deadbeef" / "engine"
    write_fake_engine(stale)
    assert cache.clean_stale_scratch() == [stale.parent]
    assert cache.lookup("k") is None


def test_bad_keys_are_rejected(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path / "c")
    for key in ("", "../x", "A/B", ".hidden"):
        with pytest.raises(EngineCacheError, match="not usable as a directory name"):
            cache.get_or_create(key, lambda dest: None)


def test_lru_eviction_spares_entries_in_use(tmp_path: Path) -> None:
    size = 4096 + 1000  # one rank file + config.json, roughly
    root = tmp_path / "c"
    user = EngineCache(root)
    calls: list[Path] = []
    user.get_or_create("a", builder(calls))  # `user` keeps a lease on "a"
    other = EngineCache(root)
    other.get_or_create("b", builder(calls))
    other.release("b")
    os.utime(root / "locks" / "a.lease", (1, 1))  # "a" is the least recently used
    os.utime(root / "locks" / "b.lease", (2, 2))
    bounded = EngineCache(root, max_bytes=2 * size)
    bounded.get_or_create("c", builder(calls))  # over budget: must evict "b", not the leased "a"
    assert bounded.lookup("a") is not None and bounded.lookup("b") is None and bounded.lookup("c") is not None
    # Once nobody holds "a", it is the next to go.
    user.close()
    bounded.release("c")
    os.utime(root / "locks" / "a.lease", (1, 1))
    small = EngineCache(root, max_bytes=size + 2000)
    small.get_or_create("d", builder(calls))
    assert small.lookup("a") is None and small.lookup("d") is not None


def test_lease_of_another_process_blocks_eviction(tmp_path: Path) -> None:
    root = tmp_path / "c"
    with EngineCache(root) as setup:
        setup.get_or_create("a", builder([]))
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys,time; from trtllm_truss.artifacts.cache import EngineCache;"
         f"c=EngineCache({str(root)!r}); c.get_or_create('a', lambda d: None); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        cache = EngineCache(root, max_bytes=1)
        assert cache.evict() == []
        assert cache.lookup("a") is not None
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert EngineCache(root, max_bytes=1).evict() == ["a"]  # the holder exited: its lease is gone


def test_remote_store_policy_and_flow(tmp_path: Path) -> None:
    assert not decide_remote_use(None, local_hit=False).look_up_remote
    assert not decide_remote_use("org/engines", local_hit=True).look_up_remote
    decision = decide_remote_use("org/engines", local_hit=False)
    assert decision.look_up_remote and decision.publish_after_build

    class RecordingStore:  # the hub store's interface; olah cannot accept uploads
        def __init__(self, has: bool):
            self.present, self.published, self.downloaded = has, [], []

        def has(self, key):
            return self.present

        def download(self, key, dest):
            self.downloaded.append(key)
            write_fake_engine(dest, tp=2)

        def publish(self, key, engine_dir):
            self.published.append((key, sorted(p.name for p in engine_dir.iterdir())))

    calls: list[Path] = []
    remote = RecordingStore(has=True)
    result = EngineCache(tmp_path / "c1").get("k", builder(calls), remote=remote)
    assert result.source == "remote" and remote.downloaded == ["k"] and calls == [] and remote.published == []
    remote = RecordingStore(has=False)
    result = EngineCache(tmp_path / "c2").get("k", builder(calls), remote=remote)
    assert result.source == "built" and remote.published == [("k", ["config.json", "rank0.engine"])]
