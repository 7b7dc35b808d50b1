"""The on-disk record of an engine cache entry: layout names, key rules, the manifest format, and
the fsync'd writes and hashing that produce it (used by `EngineCache` and the remote stores).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

CACHE_FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
COMPLETE_MARKER = "COMPLETE"
ENGINE_SUBDIR = "engine"
_KEY_ALPHABET = frozenset("0123456789abcdefghijklmnopqrstuvwxyz-_.")


class EngineCacheError(RuntimeError):
    """A cache operation failed (bad key, build failed, lock timeout)."""


@dataclass(frozen=True)
class ManifestFile:
    path: str  # relative to the engine directory, '/'-separated
    size: int
    sha256: str


@dataclass(frozen=True)
class CacheManifest:
    key: str
    format_version: int
    created_at: float
    source: str  # "built" or "remote"
    files: tuple[ManifestFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        return json.dumps(
            {
                "key": self.key,
                "format_version": self.format_version,
                "created_at": self.created_at,
                "source": self.source,
                "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
            },
            indent=2,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> "CacheManifest":
        raw = json.loads(text)
        return cls(
            key=raw["key"],
            format_version=int(raw["format_version"]),
            created_at=float(raw["created_at"]),
            source=str(raw.get("source", "built")),
            files=tuple(ManifestFile(f["path"], int(f["size"]), f["sha256"]) for f in raw["files"]),
        )


def validate_key(key: str) -> str:
    if not key or len(key) > 128 or not set(key) <= _KEY_ALPHABET or key.startswith("."):
        raise EngineCacheError(
            f"cache key {key!r} is not usable as a directory name: use 1-128 characters from "
            "[0-9a-z-_.], e.g. a sha256 hex digest"
        )
    return key


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree_and_describe(engine_dir: Path) -> tuple[ManifestFile, ...]:
    """fsync every file and directory below `engine_dir`; return the file list for the manifest."""
    files: list[ManifestFile] = []
    for dirpath, dirnames, filenames in os.walk(engine_dir):
        dirnames.sort()
        for name in sorted(filenames):
            file_path = Path(dirpath) / name
            if file_path.is_symlink():
                raise EngineCacheError(f"{file_path}: symlinks are not cached (copy the file instead)")
            _fsync_path(file_path)
            files.append(
                ManifestFile(
                    path=file_path.relative_to(engine_dir).as_posix(),
                    size=file_path.stat().st_size,
                    sha256=_sha256_file(file_path),
                )
            )
        _fsync_path(Path(dirpath))
    return tuple(files)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
