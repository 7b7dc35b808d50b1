"""Content-addressed engine cache: build once per key, publish atomically, evict least recently used.

Layout under `root` (one filesystem, so renames are atomic):

    entries/<key>/engine/...        the published engine directory (what callers get)
    entries/<key>/manifest.json     key, files with sizes + sha256, created time, format version
    entries/<key>/COMPLETE          written last, before the rename; its absence means "not an entry"
    scratch/<key>.<pid>.<nonce>/    builds in progress; a crashed build leaves one behind, cleaned later
    trash/                          entries being deleted (renamed here first so readers never see half)
    locks/<key>.lock                single-flight build lock (filelock); eviction never deletes locks/
    locks/<key>.lease               shared fcntl lock held by every process using the entry

Why this shape: a finished entry only ever appears through `rename(scratch, entries/<key>)` after
its files, manifest and marker are fsynced, so a reader that sees `entries/<key>/COMPLETE` sees a
whole engine. Locks live outside every directory that eviction removes. Leases are fcntl locks, so a
process that dies releases them and its entry becomes evictable again.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Protocol

from filelock import FileLock, Timeout

from trtllm_truss.artifacts.cache_manifest import (
    CACHE_FORMAT_VERSION,
    COMPLETE_MARKER,
    ENGINE_SUBDIR,
    MANIFEST_NAME,
    CacheManifest,
    EngineCacheError,
    _fsync_path,
    _fsync_tree_and_describe,
    _sha256_file,
    _write_synced,
    validate_key,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheResult:
    """What `get` handed back, with enough facts for `trtllm-truss build` to report."""

    key: str
    path: Path  # the engine directory
    source: Literal["local", "built", "remote"]  # local = cache hit, no work done
    seconds: float
    manifest: CacheManifest

    @property
    def total_bytes(self) -> int:
        return self.manifest.total_bytes


class RemoteEngineStore(Protocol):
    """Where a fleet shares finished builds (e.g. a hub repo); see `HubEngineStore`."""

    def has(self, key: str) -> bool: ...

    def download(self, key: str, dest: Path) -> None: ...

    def publish(self, key: str, engine_dir: Path) -> None: ...

    # Optional (see S3EngineStore): `try_claim(key) -> bool` makes one replica of the fleet the builder
    # of `key`; the others wait for its publish and download. `release_claim(key)` after publishing.


@dataclass
class _Lease:
    fd: int


def _scratch_key(scratch: Path) -> str:
    return scratch.name.rsplit(".", 2)[0]  # scratch dirs are named <key>.<pid>.<nonce>


class EngineCache:
    """`get_or_create(key, create_fn)` returns a complete engine directory, building at most once.

    `create_fn(dest)` must fill the (empty, existing) directory `dest`. Concurrent callers for the
    same key (threads or processes, same `root`) wait for the one builder and then reuse its output.
    """

    def __init__(
        self,
        root: Path | str,
        max_bytes: int | None = None,
        *,
        lock_timeout_s: float = 6 * 3600.0,
        verify_sizes_on_hit: bool = True,
        remote_wait_s: float = 6 * 3600.0,
        remote_poll_s: float = 2.0,
    ) -> None:
        self.root = Path(root).resolve()
        # How long a replica waits for another replica's claimed build to be published, polling.
        self.remote_wait_s = remote_wait_s
        self.remote_poll_s = remote_poll_s
        self.max_bytes = max_bytes
        self.lock_timeout_s = lock_timeout_s
        self.verify_sizes_on_hit = verify_sizes_on_hit
        self.entries_dir = self.root / "entries"
        self.scratch_dir = self.root / "scratch"
        self.trash_dir = self.root / "trash"
        self.locks_dir = self.root / "locks"
        for directory in (self.entries_dir, self.scratch_dir, self.trash_dir, self.locks_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._leases: dict[str, _Lease] = {}

    # ---- paths -----------------------------------------------------------------------------
    def entry_dir(self, key: str) -> Path:
        return self.entries_dir / validate_key(key)

    def engine_dir(self, key: str) -> Path:
        return self.entry_dir(key) / ENGINE_SUBDIR

    def _lock_path(self, key: str) -> Path:
        return self.locks_dir / f"{key}.lock"

    def _lease_path(self, key: str) -> Path:
        return self.locks_dir / f"{key}.lease"

    # ---- lookups ---------------------------------------------------------------------------
    def read_manifest(self, key: str) -> CacheManifest | None:
        """The manifest of a finished, intact entry; None for a missing or unfinished one."""
        entry = self.entry_dir(key)
        if not (entry / COMPLETE_MARKER).is_file():
            return None
        try:
            manifest = CacheManifest.from_json((entry / MANIFEST_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if manifest.key != key or manifest.format_version != CACHE_FORMAT_VERSION:
            return None
        if self.verify_sizes_on_hit:
            engine = entry / ENGINE_SUBDIR
            for item in manifest.files:
                try:
                    if (engine / item.path).stat().st_size != item.size:
                        return None
                except OSError:
                    return None
        return manifest

    def lookup(self, key: str) -> Path | None:
        return self.engine_dir(key) if self.read_manifest(key) is not None else None

    def verify(self, key: str) -> list[str]:
        """Full check (sha256 of every file); returns problems, empty when intact."""
        manifest = self.read_manifest(key)
        if manifest is None:
            return [f"{self.entry_dir(key)}: no complete entry"]
        engine = self.engine_dir(key)
        problems = []
        for item in manifest.files:
            target = engine / item.path
            if not target.is_file():
                problems.append(f"{item.path}: missing")
            elif _sha256_file(target) != item.sha256:
                problems.append(f"{item.path}: sha256 differs from the manifest")
        return problems

    # ---- the main operation ----------------------------------------------------------------
    def get_or_create(self, key: str, create_fn: Callable[[Path], None]) -> Path:
        return self.get(key, create_fn).path

    def get(
        self,
        key: str,
        create_fn: Callable[[Path], None],
        *,
        remote: RemoteEngineStore | None = None,
    ) -> CacheResult:
        validate_key(key)
        started = time.monotonic()
        if self.read_manifest(key) is not None:  # fast path: no lock needed to read a published entry
            self._acquire_lease(key)
            # Re-read under the lease: an eviction that won the race has removed the entry by now,
            # and one that comes later cannot take it while we hold the lease.
            manifest = self.read_manifest(key)
            if manifest is not None:
                return CacheResult(key, self.engine_dir(key), "local", time.monotonic() - started, manifest)
            self.release(key)

        lock = FileLock(str(self._lock_path(key)), timeout=self.lock_timeout_s)
        try:
            lock.acquire()
        except Timeout as exc:
            raise EngineCacheError(
                f"waited {self.lock_timeout_s:.0f}s for another process building cache key {key} "
                f"(lock {self._lock_path(key)}); raise lock_timeout_s or remove a wedged builder"
            ) from exc
        try:
            manifest = self.read_manifest(key)
            if manifest is not None:  # another process built it while we waited
                self._acquire_lease(key)
                return CacheResult(key, self.engine_dir(key), "local", time.monotonic() - started, manifest)
            self._discard_broken_entry(key)
            self._clean_scratch(key)  # we hold the key's lock: any scratch of this key is stale
            source, manifest, claimed = self._build_and_publish(key, create_fn, remote)
            self._acquire_lease(key)
        finally:
            lock.release()
        if source == "built" and remote is not None:
            try:
                self._publish_remote(remote, key)
            finally:
                if claimed:
                    self._release_claim(remote, key)
        self.clean_stale_scratch()  # leftovers of builders that died on other keys
        if self.max_bytes is not None:
            self.evict(keep=key)
        return CacheResult(key, self.engine_dir(key), source, time.monotonic() - started, manifest)

    def _build_and_publish(
        self, key: str, create_fn: Callable[[Path], None], remote: RemoteEngineStore | None
    ) -> tuple[Literal["built", "remote"], CacheManifest, bool]:
        scratch = self.scratch_dir / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        engine = scratch / ENGINE_SUBDIR
        engine.mkdir(parents=True)
        source: Literal["built", "remote"] = "built"
        claimed = False
        try:
            if remote is not None:
                source, claimed = self._download_or_claim(remote, key, engine)
            if source == "built":
                create_fn(engine)
            files = _fsync_tree_and_describe(engine)
            if not files:
                raise EngineCacheError(f"building cache key {key} produced an empty directory")
            manifest = CacheManifest(key, CACHE_FORMAT_VERSION, time.time(), source, files)
            _write_synced(scratch / MANIFEST_NAME, manifest.to_json())
            _write_synced(scratch / COMPLETE_MARKER, f"{key}\n")
            _fsync_path(scratch)
            os.rename(scratch, self.entry_dir(key))  # the atomic publish
            _fsync_path(self.entries_dir)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            if claimed and remote is not None:
                self._release_claim(remote, key)  # let another replica build instead
            raise
        return source, manifest, claimed

    def _download_or_claim(
        self, remote: RemoteEngineStore, key: str, engine: Path
    ) -> tuple[Literal["built", "remote"], bool]:
        """Download `key` when the fleet has it; else become its one builder ("built", claimed) or wait for
        the replica that is. Stores without claims: build when absent (each replica may then build)."""
        try_claim = getattr(remote, "try_claim", None)
        deadline = time.monotonic() + self.remote_wait_s
        while True:
            if self._remote_has(remote, key):
                remote.download(key, engine)
                return "remote", False
            if try_claim is None:
                return "built", False
            try:
                won = try_claim(key)
            except Exception as exc:  # an outage of the store must not stop a local build
                logger.warning("engine cache: claiming %s in the remote store failed (%s); building locally", key, exc)
                return "built", False
            if won:
                if self._remote_has(remote, key):  # published between our look and our claim
                    self._release_claim(remote, key)
                    remote.download(key, engine)
                    return "remote", False
                return "built", True
            if time.monotonic() > deadline:
                raise EngineCacheError(
                    f"waited {self.remote_wait_s:.0f}s for another replica to publish cache key {key}; "
                    "its build claim is still held (raise remote_wait_s, or delete the claim if its builder died)"
                )
            time.sleep(self.remote_poll_s)  # another replica holds the claim: poll for its publish

    @staticmethod
    def _release_claim(remote: RemoteEngineStore, key: str) -> None:
        release = getattr(remote, "release_claim", None)
        if release is not None:
            try:
                release(key)
            except Exception as exc:  # noqa: BLE001 - the claim expires anyway
                logger.warning("engine cache: releasing the claim on %s failed: %s", key, exc)

    @staticmethod
    def _remote_has(remote: RemoteEngineStore, key: str) -> bool:
        try:
            return remote.has(key)
        except Exception as exc:  # a remote outage must not stop a local build
            logger.warning("engine cache: remote lookup for %s failed (%s); building locally", key, exc)
            return False

    def _publish_remote(self, remote: RemoteEngineStore, key: str) -> None:
        try:
            remote.publish(key, self.engine_dir(key))
        except Exception as exc:  # the local entry is already good; publishing is best effort
            logger.warning("engine cache: publishing %s to the remote store failed: %s", key, exc)

    # ---- cleanup ---------------------------------------------------------------------------
    def _move_to_trash_and_delete(self, path: Path) -> None:
        doomed = self.trash_dir / f"{path.name}.{uuid.uuid4().hex[:8]}"
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            return
        shutil.rmtree(doomed, ignore_errors=True)

    def _discard_broken_entry(self, key: str) -> None:
        """Called under the key's lock when no intact entry exists: remove whatever is there."""
        entry = self.entry_dir(key)
        if entry.exists():
            logger.warning("engine cache: %s is incomplete or corrupt; rebuilding", entry)
            self._move_to_trash_and_delete(entry)

    def _clean_scratch(self, key: str) -> None:
        for stale in self.scratch_dir.iterdir():
            if _scratch_key(stale) != key:
                continue
            logger.info("engine cache: removing stale scratch dir %s", stale)
            shutil.rmtree(stale, ignore_errors=True)

    def clean_stale_scratch(self) -> list[Path]:
        """Remove scratch dirs of any key whose build lock is free (their builder is gone)."""
        removed = []
        for scratch in self.scratch_dir.iterdir():
            key = _scratch_key(scratch)
            lock = FileLock(str(self._lock_path(key)), timeout=0)
            try:
                lock.acquire()
            except Timeout:
                continue  # its builder is alive
            try:
                shutil.rmtree(scratch, ignore_errors=True)
                removed.append(scratch)
            finally:
                lock.release()
        for leftover in self.trash_dir.iterdir():
            shutil.rmtree(leftover, ignore_errors=True)
        return removed

    # ---- leases and eviction ---------------------------------------------------------------
    def _acquire_lease(self, key: str) -> None:
        """Mark the entry in use by this process (until `release`/`close` or process exit)."""
        lease_path = self._lease_path(key)
        if key not in self._leases:
            fd = os.open(lease_path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_SH)
            self._leases[key] = _Lease(fd)
        os.utime(lease_path)  # the lease file's mtime is the entry's last use, for LRU

    def release(self, key: str) -> None:
        lease = self._leases.pop(key, None)
        if lease is not None:
            fcntl.flock(lease.fd, fcntl.LOCK_UN)
            os.close(lease.fd)

    def close(self) -> None:
        for key in list(self._leases):
            self.release(key)

    def __enter__(self) -> "EngineCache":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:  # a dropped cache object must not pin its entries forever
        try:
            self.close()
        except Exception:
            pass

    def _last_used(self, key: str) -> float:
        try:
            return self._lease_path(key).stat().st_mtime
        except FileNotFoundError:
            return 0.0

    def entries(self) -> dict[str, CacheManifest]:
        found = {}
        for entry in self.entries_dir.iterdir():
            try:
                manifest = self.read_manifest(entry.name)
            except EngineCacheError:
                continue
            if manifest is not None:
                found[entry.name] = manifest
        return found

    def total_bytes(self) -> int:
        return sum(m.total_bytes for m in self.entries().values())

    def evict(self, keep: str | None = None) -> list[str]:
        """Delete least recently used entries until the total fits `max_bytes`.

        An entry is skipped while any process holds its lease or its build lock, so an engine that
        a server is running from is never removed underneath it.
        """
        if self.max_bytes is None:
            return []
        entries = self.entries()
        total = sum(m.total_bytes for m in entries.values())
        evicted: list[str] = []
        for key in sorted(entries, key=self._last_used):
            if total <= self.max_bytes:
                break
            if key == keep:
                continue
            if self._try_evict(key):
                total -= entries[key].total_bytes
                evicted.append(key)
        if total > self.max_bytes:
            logger.warning(
                "engine cache: %d bytes in use exceed max_bytes=%d (entries in use are kept)",
                total,
                self.max_bytes,
            )
        return evicted

    def _try_evict(self, key: str) -> bool:
        lock = FileLock(str(self._lock_path(key)), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            return False  # being built or checked right now
        try:
            lease_fd = os.open(self._lease_path(key), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                # Our own lease is a different open file description, so it blocks this too.
                try:
                    fcntl.flock(lease_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
                logger.info("engine cache: evicting %s", key)
                self._move_to_trash_and_delete(self.entry_dir(key))
                return True
            finally:
                os.close(lease_fd)
        finally:
            lock.release()
