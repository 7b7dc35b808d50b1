"""The checkpoint revision behind an engine cache key, recorded when first resolved.

The cache key needs the checkpoint's immutable revision (a hub commit), which asks the hub. Recording
the answer per (repository, requested revision) lets a replica whose engine is already cached start
while the hub is unreachable; an outage with nothing recorded is still reported, never guessed around.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)

REVISIONS_SUBDIR = "revisions"


def _revision_record_path(record_dir: Path, source: str, revision: str | None) -> Path:
    digest = hashlib.sha256(f"{source}@{revision or ''}".encode()).hexdigest()[:32]
    return record_dir / f"{digest}.json"


def read_revision_record(record_dir: Path | None, source: str, revision: str | None) -> str | None:
    if record_dir is None:
        return None
    try:
        record = json.loads(_revision_record_path(record_dir, source, revision).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if record.get("source") != source or record.get("revision") != revision:
        return None
    resolved = record.get("resolved")
    return resolved if isinstance(resolved, str) and resolved else None


def write_revision_record(record_dir: Path | None, source: str, revision: str | None, resolved: str) -> None:
    if record_dir is None:
        return
    path = _revision_record_path(record_dir, source, revision)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f".{path.name}.{os.getpid()}")
        scratch.write_text(
            json.dumps({"source": source, "revision": revision, "resolved": resolved, "recorded_at": time.time()}),
            encoding="utf-8",
        )
        os.replace(scratch, path)  # readers see the old or the new record, never half of one
    except OSError as exc:  # recording is an optimisation for outages; never fail a start on it
        logger.warning("cannot record the resolved revision of %s: %s", source, exc)
