"""Local artifact directories: used in place (never copied), identified by a cheap content fingerprint."""

from __future__ import annotations

import hashlib
from pathlib import Path

from trtllm_truss.artifacts.sources import ArtifactKind, wanted

# Files up to this size are hashed whole; larger ones by size + head + tail (a 16 GB checkpoint
# must not be read end to end on every start just to name its revision).
_FULL_HASH_LIMIT = 4 * 1024 * 1024
_EDGE_BYTES = 1024 * 1024


def _file_digest(path: Path) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        if size <= _FULL_HASH_LIMIT:
            digest.update(handle.read())
        else:
            digest.update(handle.read(_EDGE_BYTES))
            handle.seek(size - _EDGE_BYTES)
            digest.update(handle.read(_EDGE_BYTES))
    return digest.hexdigest()


def local_fingerprint(directory: Path, kind: ArtifactKind) -> str:
    """A revision id for a local directory: changes when any needed file's name, size or edges change."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.is_file() and wanted(p.name, kind)):
        digest.update(f"{path.name}\0{path.stat().st_size}\0{_file_digest(path)}\n".encode())
    return "local-" + digest.hexdigest()
