"""S3 downloads with boto3: list a prefix, fetch the needed objects in parallel, straight into place.

Each object is written to `<name>.part-<pid>` next to its final name and renamed when complete, so a
file under its final name is always whole; a retry skips files whose size already matches the object.
`AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`) points the client at S3-compatible stores (MinIO, moto).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from trtllm_truss.artifacts.sources import ArtifactKind, FetchError, S3Source, wanted


class S3Error(FetchError):
    """An S3 request failed; the message names the bucket/prefix and never carries credentials."""


@dataclass(frozen=True)
class S3Object:
    relative_path: str
    key: str
    size: int
    etag: str


def _client(environ: Mapping[str, str] | None):
    import boto3
    from botocore.config import Config

    environ = os.environ if environ is None else environ
    session = boto3.session.Session(
        aws_access_key_id=environ.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=environ.get("AWS_SECRET_ACCESS_KEY"),
        aws_session_token=environ.get("AWS_SESSION_TOKEN"),
        region_name=environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION"),
    )
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    # One connection per download thread; boto3's default pool (10) would serialise more workers.
    return session.client("s3", endpoint_url=endpoint or None, config=Config(max_pool_connections=32))


def _describe(exc: Exception, source: S3Source) -> str:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
    if code in ("NoSuchBucket",):
        return f"{source}: bucket {source.bucket!r} does not exist"
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return f"{source}: access denied ({code}); check the AWS credentials and the bucket policy"
    return f"{source}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def list_s3_objects(
    source: S3Source, kind: ArtifactKind, *, environ: Mapping[str, str] | None = None
) -> list[S3Object]:
    """The objects directly under the prefix that `kind` needs."""
    client = _client(environ)
    prefix = f"{source.prefix}/" if source.prefix else ""
    objects: list[S3Object] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=source.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                rel = item["Key"][len(prefix) :]
                if rel and wanted(rel, kind):
                    objects.append(S3Object(rel, item["Key"], int(item["Size"]), str(item.get("ETag", "")).strip('"')))
    except Exception as exc:  # noqa: BLE001 - re-raised with a clear message
        raise S3Error(_describe(exc, source)) from None
    return sorted(objects, key=lambda o: o.relative_path)


def s3_fingerprint(objects: list[S3Object]) -> str:
    """A content fingerprint standing in for a commit sha: S3 prefixes have no revision ids."""
    digest = hashlib.sha256()
    for obj in objects:
        digest.update(f"{obj.relative_path}\0{obj.size}\0{obj.etag}\n".encode())
    return "s3-" + digest.hexdigest()


def download_s3_objects(
    source: S3Source,
    objects: list[S3Object],
    dest: Path,
    *,
    environ: Mapping[str, str] | None = None,
    max_workers: int = 8,
    show_progress: bool = True,
) -> int:
    """Download objects into `dest` in parallel; return bytes transferred (files already whole are skipped)."""
    from tqdm.auto import tqdm

    client = _client(environ)
    todo = [
        o
        for o in objects
        if not ((dest / o.relative_path).is_file() and (dest / o.relative_path).stat().st_size == o.size)
    ]
    total = sum(o.size for o in todo)
    progress = tqdm(total=total, unit="B", unit_scale=True, desc=f"{source}", disable=not show_progress or not todo)

    def fetch(obj: S3Object) -> int:
        final = dest / obj.relative_path
        part = final.with_name(f"{final.name}.part-{os.getpid()}")
        try:
            client.download_file(source.bucket, obj.key, str(part), Callback=progress.update)
            if part.stat().st_size != obj.size:
                raise S3Error(
                    f"{source}: {obj.relative_path} arrived with {part.stat().st_size} of {obj.size} bytes; retry"
                )
            os.replace(part, final)
        except S3Error:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised with a clear message
            raise S3Error(_describe(exc, source) + f" (while downloading {obj.relative_path})") from None
        finally:
            part.unlink(missing_ok=True)
        return obj.size

    try:
        with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
            return sum(pool.map(fetch, todo))
    finally:
        progress.close()
