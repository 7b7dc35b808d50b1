"""The checkpoint's (or engine's) config.json, read before planning: a local folder's file, or one GET of a hub
repository's config.json (a few KB, with the hf_access_token secret where the repository is gated). No weights.

`validate` and `init` read it to check the checkpoint's architecture against the deployment's TensorRT-LLM
(`trtllm_truss.planning.architectures`) and to estimate the KV cache. A hub that cannot be reached is not an
error here: the answer says why the file was not read, and the checks that need it say they were skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtllm_truss.planning.architectures import CheckpointArchitecture

# One short GET: hf_hub_download retries an unreachable hub for ~20 s.
_TIMEOUT_S = 5.0


def read_model_config(resolved: Any) -> tuple[dict | None, int | None, str]:
    """(config.json, weights size, "") of the checkpoint (build) or engine (serve), or (None, None, why not)."""
    from trtllm_truss.artifacts.hub import hub_endpoint, resolve_hf_token
    from trtllm_truss.planning.kv_capacity import read_model_config as read_local

    trt = resolved.trt_llm
    source, revision = (
        (trt.build.huggingface_ckpt_repository, trt.build.huggingface_ckpt_revision)
        if trt.build is not None
        else (trt.serve.engine_repository, trt.serve.engine_revision)
    )
    try:
        location = resolved.resolve_repository(source)
        if location.kind == "local":
            config, weights = read_local(Path(location.local_path))
            return config, weights, ""
        if location.kind != "hub":
            return None, None, f"{source} is not read by validate (only local folders and hub repositories are)"
        import httpx
        from huggingface_hub import hf_hub_url

        token = resolve_hf_token(None)
        url = hf_hub_url(location.repo_id, "config.json", revision=revision, endpoint=hub_endpoint())
        response = httpx.get(
            url, headers={"authorization": f"Bearer {token}"} if token else {}, timeout=_TIMEOUT_S, follow_redirects=True
        )
        if response.status_code in (401, 403):
            return None, None, (
                f"config.json of {source} could not be read (HTTP {response.status_code}: a gated or private repository"
                " needs the hf_access_token secret, or HF_TOKEN where validate runs)"
            )
        response.raise_for_status()
        return response.json(), None, ""
    except Exception as exc:  # noqa: BLE001 - reading is best effort; say why it is missing
        return None, None, f"config.json of {source} could not be read ({type(exc).__name__})"


def checkpoint_architecture(resolved: Any) -> CheckpointArchitecture | None:
    """The build checkpoint's `architectures` (None in serve mode: an engine has no checkpoint to read)."""
    build = resolved.trt_llm.build
    if build is None:
        return None
    config, _, why = read_model_config(resolved)
    source = build.huggingface_ckpt_repository
    if config is None:
        return CheckpointArchitecture(source, unread=why)
    names = config.get("architectures")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not names:
        return CheckpointArchitecture(source, unread=f"config.json of {source} names no architectures")
    return CheckpointArchitecture(source, tuple(names))
