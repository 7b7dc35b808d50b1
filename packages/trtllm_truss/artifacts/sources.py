"""Where an artifact comes from (hub repo, S3 prefix, local path) and which of its files are needed.

Source strings, as written in config.yaml:
- `org/name` (or `name`): a Hugging Face hub repo; `revision` is a branch, tag or commit sha.
- `hf://org/name`: explicitly a hub repo (even if a local folder of that name exists).
- `s3://bucket/prefix`: the objects directly under the prefix. S3 has no refs, so S3 sources take no
  `revision` (the config rejects one too): put the version in the prefix (`s3://bucket/llama/v3`) and
  treat published prefixes as immutable. The revision recorded for them is a fingerprint of the
  listed objects' names, sizes and ETags, so a changed upload is never mistaken for the old one.
- `/abs/path`, `./rel/path`, `~/path`, `file:///path`, or any existing directory (relative paths
  resolve against the truss directory): used in place, never copied; `revision` must not be set.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ArtifactKind = Literal["engine", "tokenizer", "checkpoint", "adapter"]
ARTIFACT_KINDS: tuple[ArtifactKind, ...] = ("engine", "tokenizer", "checkpoint", "adapter")

TOKENIZER_PATTERNS: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.tiktoken",
    "chat_template.jinja",
    "generation_config.json",
)
# Only what each kind needs: engine repos often also carry checkpoints, READMEs and benchmark dumps.
# Tokenizer fetches leave out config.json on purpose: in an engine repo it is the engine's, not a model config.
ALLOW_PATTERNS: dict[ArtifactKind, tuple[str, ...]] = {
    "engine": ("config.json", "*.engine", "trtllm_truss_build.json"),
    "tokenizer": TOKENIZER_PATTERNS,
    "checkpoint": ("config.json", "*.safetensors", "*.safetensors.index.json", *TOKENIZER_PATTERNS),
    # A peft LoRA adapter (what NVIDIA's hf_lora_convert.py and the LLM API read too).
    "adapter": ("adapter_config.json", "adapter_model.safetensors"),
}


class FetchError(RuntimeError):
    """Fetching an artifact failed. One line that says what to change; never contains a token."""


class SourceError(FetchError, ValueError):
    """A source string that is neither a hub repo id, an s3:// URL nor a local path."""


@dataclass(frozen=True)
class HubSource:
    repo_id: str

    def __str__(self) -> str:
        return self.repo_id


@dataclass(frozen=True)
class S3Source:
    bucket: str
    prefix: str  # without leading/trailing slash; "" for the bucket root

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


@dataclass(frozen=True)
class LocalSource:
    path: Path

    def __str__(self) -> str:
        return str(self.path)


Source = HubSource | S3Source | LocalSource


def parse_source(source: str, *, base_dir: Path | None = None) -> Source:
    """Classify a source string the way the config does (`config.locations.resolve_repository`).

    Only checks path existence; never touches the network.
    """
    from trtllm_truss.config.locations import resolve_repository

    text = source.strip()
    text = text.removeprefix("file://")
    try:
        location = resolve_repository(text, Path(base_dir) if base_dir is not None else Path.cwd())
    except ValueError as exc:
        raise SourceError(
            f"{exc}; expected a hub repo id (org/name), an s3://bucket/prefix URL or a local path"
        ) from None
    if location.kind == "s3":
        assert location.bucket is not None
        return S3Source(bucket=location.bucket, prefix=location.prefix)
    if location.kind == "hub":
        assert location.repo_id is not None
        return HubSource(repo_id=location.repo_id)
    assert location.local_path is not None
    return LocalSource(location.local_path)


def wanted(relative_path: str, kind: ArtifactKind) -> bool:
    """Whether a file (path relative to the repo root) is needed for this kind of artifact."""
    name = relative_path.rsplit("/", 1)[-1]
    # Files in sub-folders are never needed: engines, tokenizers and checkpoints are flat.
    if "/" in relative_path:
        return False
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in ALLOW_PATTERNS[kind])
