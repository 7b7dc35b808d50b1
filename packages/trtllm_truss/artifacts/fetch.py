"""`fetch_repository`: one entry point for hub repos, S3 prefixes and local paths.

Per download directory: a file lock (next to it, so replicas sharing a volume download once), the
completion marker removed before any write and written last, files not needed by this revision
pruned, and a per-kind completeness check before the marker is written. A retry after any failure
resumes from what is already whole.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from trtllm_truss.artifacts import hub, s3
from trtllm_truss.artifacts.completeness import (
    BOOKKEEPING,
    CompletionMarker,
    IncompleteArtifactError,
    artifact_files,
    check_complete,
    marker_still_valid,
    read_marker,
    remove_marker,
    write_marker,
)
from trtllm_truss.artifacts.local import local_fingerprint
from trtllm_truss.artifacts.sources import (
    ARTIFACT_KINDS,
    ArtifactKind,
    FetchError,
    HubSource,
    LocalSource,
    S3Source,
    Source,
    parse_source,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_WORKERS = 8
LOCK_TIMEOUT_S = 6 * 3600  # another replica may be downloading a 100+ GB checkpoint into the same place


@dataclass(frozen=True)
class FetchResult:
    path: Path  # where the artifact is (dest for downloads, the directory itself for local sources)
    source: str
    kind: ArtifactKind
    revision: str | None  # as requested
    resolved_revision: str  # commit sha (hub), content fingerprint (s3, local)
    files: dict[str, int] = field(default_factory=dict)  # relative path -> size
    downloaded: bool = False  # False when an earlier complete download (or a local dir) was reused

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())


def _label(source: Source, revision: str | None) -> str:
    return f"{source}@{revision}" if revision else str(source)


def _lock_for(dest: Path) -> FileLock:
    # Outside dest so that pruning or deleting dest never removes a held lock.
    dest.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(dest.parent / f".{dest.name}.lock"), timeout=LOCK_TIMEOUT_S)


def _prune(dest: Path, keep: set[str]) -> None:
    """Remove files a previous revision left that this revision does not have (e.g. rank1.engine of a TP=2 build)."""
    for rel in artifact_files(dest):
        if rel not in keep:
            (dest / rel).unlink()
    for path in dest.iterdir():  # clean stale temp files of killed downloads
        if ".part-" in path.name and path.is_file():
            path.unlink()


def _drop_mismatched(dest: Path, marker: CompletionMarker) -> None:
    """Files whose size no longer matches the marker are damaged: delete them so they are fetched again."""
    for rel, size in marker.files.items():
        path = dest / rel
        if path.is_file() and path.stat().st_size != size:
            path.unlink()


# An engine's per-rank file, either layout (`rank3.engine`, `llama_float16_tp4_rank3.engine`).
_RANK_FILE = re.compile(r"(?:^|_)rank(\d+)\.engine$")


def _for_ranks(names: Collection[str], ranks: Collection[int] | None) -> set[str]:
    """`names` minus the rank files of ranks not in `ranks` (None: all of them)."""
    if ranks is None:
        return set(names)
    wanted = set(ranks)
    kept = set()
    for name in names:
        match = _RANK_FILE.search(name)
        if match is None or int(match.group(1)) in wanted:
            kept.add(name)
    return kept


def _holds_ranks(files: Collection[str], ranks: Collection[int] | None) -> bool:
    """A download with a file for every rank in `ranks` (None: no requirement beyond the marker)."""
    if ranks is None:
        return True
    present = {int(m.group(1)) for m in map(_RANK_FILE.search, files) if m is not None}
    return set(ranks) <= present


def _reusable(
    dest: Path,
    source: Source,
    kind: ArtifactKind,
    resolved: str | None,
    revision: str | None,
    needed: Collection[str] | None = None,
    ranks: Collection[int] | None = None,
) -> CompletionMarker | None:
    marker = read_marker(dest)
    if marker is None or marker.source != str(source) or marker.kind != kind:
        return None
    # Another node sharing the directory may have completed it with only its own ranks' files.
    if needed is not None and not set(needed) <= set(marker.files):
        return None
    if not _holds_ranks(marker.files, ranks):
        return None
    if resolved is not None and marker.resolved_revision != resolved:
        return None
    if resolved is None and marker.revision != revision:
        return None
    if not marker_still_valid(dest, marker):
        logger.warning("%s: files changed since the download completed; fetching again", dest)
        _drop_mismatched(dest, marker)
        return None
    return marker


def _finish(
    dest: Path,
    source: Source,
    kind: ArtifactKind,
    revision: str | None,
    resolved: str,
    keep: set[str],
    *,
    known: set[str] | None = None,
    ranks: Collection[int] | None = None,
) -> FetchResult:
    """`keep`: what this fetch needs; `known`: every file of the artifact at this revision, which pruning
    spares (other ranks' files that another node sharing the directory fetched)."""
    _prune(dest, keep | ((known or set()) & set(artifact_files(dest))))
    what = _label(source, revision)
    missing = sorted(keep - set(artifact_files(dest)))
    if missing:
        raise IncompleteArtifactError(f"{what}: download incomplete, missing {', '.join(missing[:5])}; retry")
    check_complete(dest, kind, what=what, ranks=ranks)
    files = artifact_files(dest)
    write_marker(dest, CompletionMarker(str(source), kind, revision, resolved, files))
    return FetchResult(dest, str(source), kind, revision, resolved, files, downloaded=True)


def _fetch_hub(
    src: HubSource,
    dest: Path,
    revision: str | None,
    kind: ArtifactKind,
    token: str | None,
    environ: Mapping[str, str] | None,
    max_workers: int,
    ranks: Collection[int] | None = None,
) -> FetchResult:
    try:
        commit, repo_files = hub.resolve_hub_revision(src.repo_id, revision, token=token, environ=environ)
    except hub.HubUnreachableError:
        # Hub unreachable on restart: a complete download of the same requested revision is still good.
        # (Only then: a hub that answers "no such revision" must not be papered over with an old copy.)
        marker = _reusable(dest, src, kind, None, revision, ranks=ranks)
        if marker is None:
            raise
        logger.warning("%s: hub unreachable, using the complete download at %s", _label(src, revision), dest)
        return FetchResult(dest, str(src), kind, revision, marker.resolved_revision, dict(marker.files))
    known = set(hub.needed_hub_files(repo_files, kind))
    needed = _for_ranks(known, ranks)
    if not needed:
        raise IncompleteArtifactError(
            f"{_label(src, revision)}: the repo has no {kind} files at commit {commit[:12]} "
            f"(looked for top-level files matching what a {kind} needs); check the repository and revision"
        )
    with _lock_for(dest):
        marker = _reusable(dest, src, kind, commit, revision, needed, ranks)
        if marker is not None:
            logger.info("%s: already complete at %s (commit %s)", _label(src, revision), dest, commit[:12])
            return FetchResult(dest, str(src), kind, revision, commit, dict(marker.files))
        dest.mkdir(parents=True, exist_ok=True)
        remove_marker(dest)
        logger.info("%s: downloading %d %s file(s) into %s", _label(src, revision), len(needed), kind, dest)
        hub.download_hub_snapshot(
            src.repo_id,
            commit,
            dest,
            kind=kind,
            token=token,
            environ=environ,
            max_workers=max_workers,
            revision_label=revision,
            files=sorted(needed),
        )
        return _finish(dest, src, kind, revision, commit, needed, known=known, ranks=ranks)


def _fetch_s3(
    src: S3Source,
    dest: Path,
    revision: str | None,
    kind: ArtifactKind,
    environ: Mapping[str, str] | None,
    max_workers: int,
    ranks: Collection[int] | None = None,
) -> FetchResult:
    if revision:
        raise FetchError(
            f"{src}: S3 sources have no revisions (got {revision!r}); put the version in the prefix, "
            f"e.g. {src}/{revision}, and remove the revision setting"
        )
    objects = s3.list_s3_objects(src, kind, environ=environ)
    if not objects:
        raise IncompleteArtifactError(f"{src}: no {kind} files directly under this prefix; check the bucket and prefix")
    fingerprint = s3.s3_fingerprint(objects)  # of the whole artifact: the same on every node
    known = {o.relative_path for o in objects}
    needed = _for_ranks(known, ranks)
    with _lock_for(dest):
        marker = _reusable(dest, src, kind, fingerprint, revision, needed, ranks)
        if marker is not None:
            return FetchResult(dest, str(src), kind, revision, fingerprint, dict(marker.files))
        dest.mkdir(parents=True, exist_ok=True)
        remove_marker(dest)
        wanted = [o for o in objects if o.relative_path in needed]
        s3.download_s3_objects(src, wanted, dest, environ=environ, max_workers=max_workers)
        return _finish(dest, src, kind, revision, fingerprint, needed, known=known, ranks=ranks)


def _use_local(
    src: LocalSource, revision: str | None, kind: ArtifactKind, ranks: Collection[int] | None = None
) -> FetchResult:
    if revision:
        raise FetchError(f"{src}: a local path has no revisions (got {revision!r}); remove the revision setting")
    if not src.path.is_dir():
        raise FetchError(f"{src}: local {kind} directory does not exist")
    check_complete(src.path, kind, what=str(src), ranks=ranks)
    files = {p.name: p.stat().st_size for p in src.path.iterdir() if p.is_file() and p.name not in BOOKKEEPING}
    return FetchResult(src.path, str(src), kind, None, local_fingerprint(src.path, kind), files)


def fetch_repository(
    source: str,
    dest: Path,
    *,
    revision: str | None = None,
    kind: ArtifactKind = "engine",
    token: str | None = None,
    environ: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
    max_workers: int = DEFAULT_MAX_WORKERS,
    ranks: Collection[int] | None = None,
) -> FetchResult:
    """Make the `kind` files of `source` (at `revision`) available; return where they are.

    Hub repos and S3 prefixes are downloaded into `dest`; local directories are checked and used in
    place (`dest` is not touched). `token` defaults to TRUSS_SECRET_hf_access_token / HF_TOKEN.
    `ranks` (engines): only these ranks' `rank*.engine` files are needed, e.g. one node's share of a
    multi-node world; files of other ranks already in `dest` (a directory shared by nodes) are kept.
    Raises FetchError (or a subclass) with a one-line message that never contains the token.
    """
    if kind not in ARTIFACT_KINDS:
        raise ValueError(f"kind must be one of {', '.join(ARTIFACT_KINDS)}, got {kind!r}")
    environ = os.environ if environ is None else environ
    src = parse_source(source, base_dir=base_dir)
    if kind != "engine":
        ranks = None
    if isinstance(src, LocalSource):
        return _use_local(src, revision, kind, ranks)
    dest = Path(dest)
    if isinstance(src, S3Source):
        return _fetch_s3(src, dest, revision, kind, environ, max_workers, ranks)
    token = token or hub.resolve_hf_token(None, environ)
    try:
        return _fetch_hub(src, dest, revision, kind, token, environ, max_workers, ranks)
    except FetchError as exc:
        # Belt and braces: no message leaves this function carrying the token.
        if token and token in str(exc):
            raise type(exc)(hub.redact(str(exc), token)) from None
        raise


def resolve_revision(
    source: str,
    *,
    revision: str | None = None,
    kind: ArtifactKind = "checkpoint",
    token: str | None = None,
    environ: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> str:
    """The immutable id of `source@revision` without downloading: commit sha (hub) or content fingerprint.

    The engine cache key uses this so that a moving branch (`main`) never reuses a stale engine.
    """
    environ = os.environ if environ is None else environ
    src = parse_source(source, base_dir=base_dir)
    if isinstance(src, HubSource):
        token = token or hub.resolve_hf_token(None, environ)
        return hub.resolve_hub_revision(src.repo_id, revision, token=token, environ=environ)[0]
    if isinstance(src, S3Source):
        if revision:
            raise FetchError(f"{src}: S3 sources have no revisions (got {revision!r}); put the version in the prefix")
        return s3.s3_fingerprint(s3.list_s3_objects(src, kind, environ=environ))
    if not src.path.is_dir():
        raise FetchError(f"{src}: local {kind} directory does not exist")
    return local_fingerprint(src.path, kind)


def discard_download(dest: Path) -> None:
    """Delete a download directory (under its lock), e.g. to force a clean re-download."""
    with _lock_for(dest):
        shutil.rmtree(dest, ignore_errors=True)
