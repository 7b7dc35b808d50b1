"""Where a repository string points: a local folder, a Hugging Face hub repo, or an S3 prefix.

Used for `build.huggingface_ckpt_repository`, `serve.engine_repository` / `tokenizer_repository` and
`runtime.pytorch.model`. The only I/O is checking whether a path exists: a string that names an
existing folder (absolute, or relative to the truss dir) is local even if it also looks like a hub id
(`data/embedded-llama`), so a checked-in checkpoint is never fetched from the hub by accident.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# owner/name as the hub allows them (letters, digits, '-', '_', '.'; at most 96 characters each).
_HUB_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


@dataclass(frozen=True)
class RepositoryLocation:
    kind: Literal["local", "hub", "s3"]
    local_path: Path | None = None  # kind "local": absolute path
    repo_id: str | None = None  # kind "hub": "owner/name"
    bucket: str | None = None  # kind "s3"
    prefix: str = ""  # kind "s3": key prefix without leading/trailing '/'

    def __str__(self) -> str:
        if self.kind == "local":
            return str(self.local_path)
        if self.kind == "hub":
            return f"hf://{self.repo_id}"
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def is_hub_repo_id(value: str) -> bool:
    return bool(_HUB_REPO_ID.match(value)) and ".." not in value and not value.endswith((".", "-"))


def resolve_repository(value: str, truss_dir: Path) -> RepositoryLocation:
    """Classify `value`: `s3://bucket/prefix`, `hf://owner/name` (explicitly hub), an existing or
    path-like local folder (absolute, `./`, `../`, `~`, or relative to `truss_dir`), else a hub id.
    Raises ValueError for a string that is neither a path-like value nor a valid hub id."""
    text = value.strip()
    if text.startswith("s3://"):
        bucket, _, prefix = text[len("s3://") :].partition("/")
        if not bucket:
            raise ValueError(f"{value!r} names no bucket; expected s3://BUCKET/PREFIX")
        return RepositoryLocation(kind="s3", bucket=bucket, prefix=prefix.strip("/"))
    if text.startswith("hf://"):
        repo_id = text[len("hf://") :].strip("/")
        if not is_hub_repo_id(repo_id):
            raise ValueError(f"{value!r} is not a valid hub repo id (expected hf://OWNER/NAME)")
        return RepositoryLocation(kind="hub", repo_id=repo_id)
    path = Path(text).expanduser()
    local = path if path.is_absolute() else (Path(truss_dir) / path)
    path_like = path.is_absolute() or text.startswith(("./", "../", "~")) or text in (".", "..")
    if path_like or local.exists():
        return RepositoryLocation(kind="local", local_path=local.resolve())
    if is_hub_repo_id(text):
        return RepositoryLocation(kind="hub", repo_id=text)
    raise ValueError(
        f"{value!r} is neither an existing folder (relative to {Path(truss_dir)}) nor a hub repo id OWNER/NAME"
    )
