"""Finished engines shared by a fleet through S3: one builder per cache key, the others download.

Layout under `s3://BUCKET/PREFIX/<key>/`:

    engine/...        the engine files
    manifest.json     written last: its presence means "published" (what `has` checks)
    claim.json        the build claim: {"owner", "expires_at"}; created with If-None-Match: *

One publisher per key across replicas: before building, a replica creates `claim.json` with S3's
conditional put (`If-None-Match: *`), which exactly one writer wins. The winner builds, publishes and
deletes the claim; the others poll for the manifest and download. A claim whose owner died expires
(`claim_ttl_s`): a waiter deletes it (`If-Match` on its ETag, so two waiters cannot both take it
over) and claims the key itself.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_truss.artifacts.cache_manifest import ENGINE_SUBDIR, MANIFEST_NAME, validate_key
from trtllm_truss.artifacts.s3 import S3Error, _client

logger = logging.getLogger(__name__)

CLAIM_NAME = "claim.json"


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/prefix` -> (bucket, prefix without slashes at the ends); ValueError when malformed."""
    if not url.startswith("s3://"):
        raise ValueError(f"{url!r} is not an s3:// URL")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket; expected s3://BUCKET/PREFIX")
    return bucket, prefix.strip("/")


def _error_code(exc: Exception) -> str | None:
    response = getattr(exc, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


@dataclass
class S3EngineStore:
    """A `RemoteEngineStore` (see artifacts.cache) in an S3 bucket, with build claims."""

    url: str
    environ: Mapping[str, str] | None = field(default=None, repr=False)  # credentials come from here; never printed
    claim_ttl_s: float = 3 * 3600.0  # longer than any build: an expired claim means its builder died
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")

    def __post_init__(self) -> None:
        self.bucket, self.prefix = parse_s3_url(self.url)
        self._s3 = None

    @property
    def s3(self):
        if self._s3 is None:
            self._s3 = _client(self.environ)
        return self._s3

    def _key(self, key: str, name: str) -> str:
        folder = validate_key(key)
        return f"{self.prefix}/{folder}/{name}" if self.prefix else f"{folder}/{name}"

    # ---- RemoteEngineStore ---------------------------------------------------------------------
    def has(self, key: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.bucket, Key=self._key(key, MANIFEST_NAME))
            return True
        except Exception as exc:  # noqa: BLE001 - a 404 means "not published"; the rest is an outage
            if _error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise S3Error(f"s3://{self.bucket}/{self._key(key, MANIFEST_NAME)}: {_error_code(exc) or exc}") from None

    def download(self, key: str, dest: Path) -> None:
        prefix = self._key(key, ENGINE_SUBDIR) + "/"
        paginator = self.s3.get_paginator("list_objects_v2")
        count = 0
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                relative = item["Key"][len(prefix) :]
                if not relative or relative.endswith("/") or ".." in relative.split("/"):
                    continue
                target = dest / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(self.bucket, item["Key"], str(target))
                count += 1
        if count == 0:
            raise S3Error(f"s3://{self.bucket}/{prefix}: the published engine has no files")

    def publish(self, key: str, engine_dir: Path) -> None:
        engine_dir = Path(engine_dir)
        for path in sorted(p for p in engine_dir.rglob("*") if p.is_file()):
            relative = path.relative_to(engine_dir).as_posix()
            self.s3.upload_file(str(path), self.bucket, self._key(key, f"{ENGINE_SUBDIR}/{relative}"))
        # The manifest goes last: its presence is what `has` treats as "published".
        manifest = engine_dir.parent / MANIFEST_NAME
        self.s3.upload_file(str(manifest), self.bucket, self._key(key, MANIFEST_NAME))

    # ---- claims: one builder per key across the fleet ----------------------------------------------
    def try_claim(self, key: str) -> bool:
        """True when this replica now owns the build of `key` (a conditional create of claim.json)."""
        body = json.dumps({"owner": self.owner, "expires_at": time.time() + self.claim_ttl_s}).encode()
        claim = self._key(key, CLAIM_NAME)
        for _ in range(2):  # second round: after taking over an expired claim
            try:
                self.s3.put_object(Bucket=self.bucket, Key=claim, Body=body, IfNoneMatch="*")
                return True
            except Exception as exc:  # noqa: BLE001
                if _error_code(exc) not in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                    raise S3Error(f"s3://{self.bucket}/{claim}: cannot create the build claim ({_error_code(exc) or exc})") from None
            if not self._remove_expired_claim(claim):
                return False
        return False

    def _remove_expired_claim(self, claim: str) -> bool:
        try:
            current = self.s3.get_object(Bucket=self.bucket, Key=claim)
            etag = current["ETag"]
            holder = json.loads(current["Body"].read())
        except Exception as exc:  # noqa: BLE001 - gone meanwhile (released): try to claim again
            return _error_code(exc) in ("404", "NoSuchKey", "NotFound")
        if float(holder.get("expires_at", 0)) > time.time():
            return False
        logger.warning("engine store: claim on %s by %s expired; taking it over", claim, holder.get("owner"))
        try:
            self.s3.delete_object(Bucket=self.bucket, Key=claim, IfMatch=etag)
        except Exception as exc:  # noqa: BLE001 - another waiter took it over first
            if _error_code(exc) in ("PreconditionFailed", "412"):
                return False
            raise
        return True

    def release_claim(self, key: str) -> None:
        claim = self._key(key, CLAIM_NAME)
        try:
            current = self.s3.get_object(Bucket=self.bucket, Key=claim)
            holder = json.loads(current["Body"].read())
            if holder.get("owner") == self.owner:
                self.s3.delete_object(Bucket=self.bucket, Key=claim, IfMatch=current["ETag"])
        except Exception as exc:  # noqa: BLE001 - releasing is best effort: the claim expires anyway
            logger.warning("engine store: releasing %s failed: %s", claim, _error_code(exc) or exc)
