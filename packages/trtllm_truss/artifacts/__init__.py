"""Artifacts: fetch engines / tokenizers / checkpoints (hub, S3, local), verify engines, build and cache them.

Import cost matters (the `validate` command must stay light), so heavy clients (huggingface_hub,
boto3) are imported inside the functions that use them.
"""

from trtllm_truss.artifacts.completeness import IncompleteArtifactError
from trtllm_truss.artifacts.engine_config import (
    EngineInfo,
    EngineVerificationError,
    parse_engine_config,
    read_engine_config,
    verify_engine_dir,
)
from trtllm_truss.artifacts.fetch import FetchResult, fetch_repository, resolve_revision
from trtllm_truss.artifacts.hub import HubError, resolve_hf_token
from trtllm_truss.artifacts.prepare import prepare_artifacts
from trtllm_truss.artifacts.s3 import S3Error
from trtllm_truss.artifacts.sources import ALLOW_PATTERNS, FetchError, SourceError

__all__ = [
    "ALLOW_PATTERNS",
    "EngineInfo",
    "EngineVerificationError",
    "FetchError",
    "FetchResult",
    "HubError",
    "IncompleteArtifactError",
    "S3Error",
    "SourceError",
    "fetch_repository",
    "parse_engine_config",
    "prepare_artifacts",
    "read_engine_config",
    "resolve_hf_token",
    "resolve_revision",
    "verify_engine_dir",
]
