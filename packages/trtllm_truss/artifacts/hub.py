"""Hugging Face hub downloads: token lookup, revision -> commit, snapshot straight into the target directory.

`snapshot_download(local_dir=...)` writes the files into place (no cache copy + symlink farm), fetches
files in parallel (`max_workers`), shows tqdm progress, and keeps per-file metadata under
`<dest>/.cache/huggingface/` so an interrupted download resumes and finished files are not fetched again.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from trtllm_truss.artifacts.sources import ALLOW_PATTERNS, ArtifactKind, FetchError, wanted

logger = logging.getLogger(__name__)

HF_TOKEN_SECRET = "hf_access_token"
HF_TOKEN_ENV_VARS = (f"TRUSS_SECRET_{HF_TOKEN_SECRET}", "HF_TOKEN")


class HubError(FetchError):
    """A hub request failed. The message never contains the token."""


class HubUnreachableError(HubError):
    """The hub could not be reached at all (connection refused, DNS, timeout): not an answer about the repo."""


_UNREACHABLE_NAMES = (
    "ConnectError",
    "ConnectTimeout",
    "ReadTimeout",
    "TimeoutException",
    "NetworkError",
    "ConnectionError",
    "OfflineModeIsEnabled",
)


def _is_unreachable(exc: BaseException | None) -> bool:
    if getattr(exc, "response", None) is not None:
        return False  # the hub answered (401, 404, ...): that answer is about the repo
    seen = 0
    while exc is not None and seen < 10:  # the transport error is usually a cause a few levels down
        if isinstance(exc, OSError) or type(exc).__name__ in _UNREACHABLE_NAMES:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def resolve_hf_token(
    secrets: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The HF token, from (first found) truss secret `hf_access_token`, env TRUSS_SECRET_hf_access_token, HF_TOKEN."""
    environ = os.environ if environ is None else environ
    if secrets is not None:
        try:
            value = secrets.get(HF_TOKEN_SECRET)  # truss's secrets mapping may raise for undeclared names
        except Exception:  # noqa: BLE001 - any lookup failure means "not provided"
            value = None
        if isinstance(value, str) and value.strip():
            return value.strip()
    for name in HF_TOKEN_ENV_VARS:
        value = environ.get(name)
        if value and value.strip():
            return value.strip()
    return None


def redact(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def hub_endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """HF_ENDPOINT from the given environment (huggingface_hub itself reads it only once, at import)."""
    environ = os.environ if environ is None else environ
    value = environ.get("HF_ENDPOINT")
    return value.rstrip("/") if value else None


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _describe_hub_error(exc: Exception, repo_id: str, revision: str | None, token: str | None) -> str:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    rev = revision or "main"
    if isinstance(exc, GatedRepoError):
        hint = "the repo is gated: accept its terms on the hub and give a token with access"
    elif isinstance(exc, RevisionNotFoundError):
        hint = f"revision {rev!r} does not exist: use an existing branch, tag or commit sha"
    elif isinstance(exc, RepositoryNotFoundError):
        # The hub (and mirrors) answer 401/404 alike for "missing" and "private without access".
        hint = f"repo or revision {rev!r} not found, or private: check the name and revision" + (
            "" if token else ", and set the secret hf_access_token (or HF_TOKEN) for private repos"
        )
    elif _status(exc) in (401, 403):
        hint = (
            f"access denied (HTTP {_status(exc)}): the token was rejected or has no access to this repo"
            if token
            else f"access denied (HTTP {_status(exc)}): set the secret hf_access_token (or HF_TOKEN) to a token "
            "with access to this repo"
        )
    else:
        hint = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return redact(f"hub repo {repo_id}@{rev}: {hint}", token)


def resolve_hub_revision(
    repo_id: str, revision: str | None, *, token: str | None, environ: Mapping[str, str] | None = None
) -> tuple[str, list[str]]:
    """Return (commit sha, file names at that commit) for a branch, tag or sha."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_endpoint(environ), token=token or False)
    try:
        # An explicit "main": mirrors such as olah only answer the revision-qualified endpoint.
        info = api.repo_info(repo_id, revision=revision or "main", token=token or False)
    except Exception as exc:  # noqa: BLE001 - re-raised with a clear, token-free message
        if _is_unreachable(exc):
            where = hub_endpoint(environ) or "https://huggingface.co"
            raise HubUnreachableError(
                f"hub repo {repo_id}@{revision or 'main'}: cannot reach the hub at {where} "
                f"({type(exc).__name__}); check the network or HF_ENDPOINT"
            ) from None
        raise HubError(_describe_hub_error(exc, repo_id, revision, token)) from None
    if not info.sha:
        raise HubError(f"hub repo {repo_id}@{revision or 'main'}: the hub did not report a commit sha")
    return info.sha, [s.rfilename for s in (info.siblings or [])]


def download_hub_snapshot(
    repo_id: str,
    commit: str,
    dest: Path,
    *,
    kind: ArtifactKind,
    token: str | None,
    environ: Mapping[str, str] | None = None,
    max_workers: int = 8,
    revision_label: str | None = None,
    files: list[str] | None = None,
) -> None:
    """Download the files `kind` needs at `commit` into `dest` (resumable; finished files are skipped)."""
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(
            repo_id,
            revision=commit,  # the resolved sha: a branch moving mid-download cannot mix two commits
            local_dir=dest,
            # The exact names needed (from the commit's file list) when known, else the kind's patterns.
            allow_patterns=[glob.escape(name) for name in files] if files else list(ALLOW_PATTERNS[kind]),
            token=token or False,
            max_workers=max_workers,
            endpoint=hub_endpoint(environ),
        )
    except Exception as exc:  # noqa: BLE001 - re-raised with a clear, token-free message
        raise HubError(_describe_hub_error(exc, repo_id, revision_label or commit, token)) from None


def needed_hub_files(file_names: list[str], kind: ArtifactKind) -> list[str]:
    return sorted(name for name in file_names if wanted(name, kind))
