"""Sharing finished engine builds through a Hugging Face hub repo: the remote-use policy and `HubEngineStore`."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_truss.artifacts.cache_manifest import ENGINE_SUBDIR, MANIFEST_NAME, validate_key


@dataclass(frozen=True)
class RemoteDecision:
    look_up_remote: bool
    publish_after_build: bool
    reason: str


def decide_remote_use(publish_repository: str | None, *, local_hit: bool) -> RemoteDecision:
    """Whether to consult / feed the fleet's shared store; pure so the policy is testable."""
    if not publish_repository:
        return RemoteDecision(False, False, "no publish_repository configured")
    if local_hit:
        return RemoteDecision(False, False, "engine already in the local cache")
    return RemoteDecision(True, True, f"look in {publish_repository} before building, publish after")


@dataclass
class HubEngineStore:
    """Finished engines kept in a hub repo under `<prefix>/<key>/` (one folder per cache key)."""

    repository: str
    token: str | None = field(default=None, repr=False)  # never printed
    revision: str = "main"
    prefix: str = "engines"
    repo_type: str = "model"
    endpoint: str | None = None  # HF_ENDPOINT (a mirror); None: huggingface.co

    def _folder(self, key: str) -> str:
        return f"{self.prefix}/{validate_key(key)}"

    def has(self, key: str) -> bool:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.endpoint, token=self.token)
        marker = f"{self._folder(key)}/{MANIFEST_NAME}"
        return api.file_exists(self.repository, marker, repo_type=self.repo_type, revision=self.revision)

    def download(self, key: str, dest: Path) -> None:
        from huggingface_hub import snapshot_download

        folder = self._folder(key)
        staging = dest.parent / "remote-download"
        snapshot_download(
            self.repository,
            repo_type=self.repo_type,
            revision=self.revision,
            allow_patterns=[f"{folder}/*", f"{folder}/**"],
            local_dir=staging,
            token=self.token,
            endpoint=self.endpoint,
        )
        source = staging / folder / ENGINE_SUBDIR
        for item in source.iterdir():
            os.replace(item, dest / item.name)
        shutil.rmtree(staging, ignore_errors=True)

    def publish(self, key: str, engine_dir: Path) -> None:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.endpoint, token=self.token)
        folder = self._folder(key)
        api.upload_folder(
            repo_id=self.repository,
            folder_path=str(engine_dir),
            path_in_repo=f"{folder}/{ENGINE_SUBDIR}",
            repo_type=self.repo_type,
            revision=self.revision,
            commit_message=f"engine cache entry {key}",
        )
        # The manifest goes last: its presence is what `has` treats as "published".
        manifest = engine_dir.parent / MANIFEST_NAME
        api.upload_file(
            path_or_fileobj=str(manifest),
            path_in_repo=f"{folder}/{MANIFEST_NAME}",
            repo_id=self.repository,
            repo_type=self.repo_type,
            revision=self.revision,
            commit_message=f"engine cache entry {key} (manifest)",
        )
