"""Completeness: the marker a finished download leaves, and the per-kind checks that guard writing it.

A download writes its files first and the marker last (atomically, fsynced). A directory without a
valid marker, or whose files no longer match the sizes the marker recorded, is treated as not
downloaded: an interrupted download is resumed, never mistaken for a complete one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtllm_truss.artifacts.engine_config import EngineVerificationError, read_engine_config, verify_engine_dir
from trtllm_truss.artifacts.sources import ArtifactKind, FetchError

MARKER_FILE = ".trtllm_truss_complete.json"
MARKER_FORMAT = 1
# Bookkeeping that lives in a download directory but is not part of the artifact.
BOOKKEEPING = (MARKER_FILE, ".cache")

_TOKENIZER_CORE = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


class IncompleteArtifactError(FetchError):
    """Downloaded files do not form a usable artifact of the requested kind (one line, says what to do)."""


@dataclass(frozen=True)
class CompletionMarker:
    source: str  # never contains credentials: hub ids, s3:// URLs and paths only
    kind: ArtifactKind
    revision: str | None  # as requested (branch, tag, sha, s3 sub-prefix)
    resolved_revision: str  # commit sha (hub) or content fingerprint (s3)
    files: dict[str, int] = field(default_factory=dict)  # relative path -> size in bytes
    format: int = MARKER_FORMAT


def artifact_files(directory: Path) -> dict[str, int]:
    """Relative path -> size of the artifact's files in a download directory (bookkeeping excluded)."""
    files: dict[str, int] = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if rel.parts[0] in BOOKKEEPING or not path.is_file() or ".part-" in path.name:
            continue
        files[rel.as_posix()] = path.stat().st_size
    return files


def read_marker(directory: Path) -> CompletionMarker | None:
    path = directory / MARKER_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("format") != MARKER_FORMAT:
            return None
        return CompletionMarker(**raw)
    except (OSError, ValueError, TypeError):
        return None  # absent or damaged: not complete


def marker_still_valid(directory: Path, marker: CompletionMarker) -> bool:
    """The files the marker lists are all still there with the recorded sizes."""
    for rel, size in marker.files.items():
        path = directory / rel
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def remove_marker(directory: Path) -> None:
    (directory / MARKER_FILE).unlink(missing_ok=True)


def write_marker(directory: Path, marker: CompletionMarker) -> None:
    """Write the marker atomically and durably: temp file, fsync, rename, fsync the directory."""
    tmp = directory / f"{MARKER_FILE}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(asdict(marker), handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, directory / MARKER_FILE)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _check_json_files(directory: Path, names: list[str], what: str) -> None:
    for name in names:
        path = directory / name
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise IncompleteArtifactError(
                f"{what}: {name} is not valid JSON ({str(exc)[:80]}); the file is truncated or corrupted, "
                "re-upload it or fetch again"
            ) from None


def check_complete(directory: Path, kind: ArtifactKind, *, what: str, ranks: Collection[int] | None = None) -> None:
    """Raise IncompleteArtifactError unless `directory` holds a usable artifact of `kind`.

    `what` names the artifact in messages (source and revision, never a token). `ranks`: an engine
    needs only these ranks' files (one node's share of a multi-node world).
    """
    files = artifact_files(directory)
    if not files:
        raise IncompleteArtifactError(
            f"{what}: no {kind} files found (looked for {kind} files at the top level); check the source and revision"
        )
    json_files = [name for name in files if name.endswith(".json")]
    if kind == "engine":
        try:
            # Structure only (config parses, every rank file present and non-empty); the runtime
            # facts (versions, GPUs) are checked by verify_engine_dir when serving.
            verify_engine_dir(directory, ranks=ranks)
        except EngineVerificationError as exc:
            raise IncompleteArtifactError(f"{what}: {exc}") from None
        return
    _check_json_files(directory, json_files, what)
    if kind == "tokenizer":
        if not any(name in files for name in _TOKENIZER_CORE) and not any(n.endswith(".tiktoken") for n in files):
            raise IncompleteArtifactError(
                f"{what}: no tokenizer found (need one of {', '.join(_TOKENIZER_CORE)}); point "
                "tokenizer_repository at the repo that holds the tokenizer"
            )
        return
    if kind == "adapter":
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            if not files.get(name):
                raise IncompleteArtifactError(
                    f"{what}: a LoRA adapter needs {name} (peft's format: adapter_config.json and"
                    " adapter_model.safetensors); check the repository and revision"
                )
        return
    # checkpoint
    if "config.json" not in files:
        raise IncompleteArtifactError(f"{what}: checkpoint has no config.json; check the repository and revision")
    try:
        read_engine_config(directory)
    except EngineVerificationError:
        pass  # expected: a Hugging Face config.json is not an engine config
    else:
        raise IncompleteArtifactError(
            f"{what}: this is a TensorRT-LLM engine, not a Hugging Face checkpoint; use it as serve.engine_repository"
        )
    shards = [name for name in files if name.endswith(".safetensors")]
    if not shards:
        raise IncompleteArtifactError(f"{what}: checkpoint has no *.safetensors weights; upload safetensors weights")
    empty = [name for name in shards if files[name] == 0]
    if empty:
        raise IncompleteArtifactError(f"{what}: weight file(s) {', '.join(empty)} are empty; re-upload or fetch again")
    for index_name in (n for n in json_files if n.endswith(".safetensors.index.json")):
        weight_map = json.loads((directory / index_name).read_text(encoding="utf-8")).get("weight_map", {})
        missing = sorted(set(weight_map.values()) - set(shards))
        if missing:
            raise IncompleteArtifactError(
                f"{what}: {index_name} lists shard(s) {', '.join(missing[:3])} that are missing; upload every shard"
            )
