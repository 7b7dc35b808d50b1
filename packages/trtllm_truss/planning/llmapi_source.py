"""Where NVIDIA's llmapi Triton model directory is, for backend `llmapi` (its files are copied into the
repository at render time; the plan checks they are there before anything is fetched)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtllm_truss.config.runtime import RuntimeConfig

MODEL_SOURCE_ENV = "TRTLLM_LLMAPI_MODEL_DIR"
# Where NVIDIA's llmapi model directory may be inside an image: tensorrtllm_backend's checkout under /app
# (older trtllm-python-py3 images) and TensorRT-LLM's own triton_backend/ (after the move, #745).
# Not every image ships either (tensorrtllm_backend issue 739), hence the setting.
IMAGE_MODEL_SOURCE_DIRS = (
    Path("/app/all_models/llmapi/tensorrt_llm"),
    Path("/app/tensorrt_llm/triton_backend/all_models/llmapi/tensorrt_llm"),
    Path("/opt/tritonserver/tensorrtllm_backend/all_models/llmapi/tensorrt_llm"),
)
# The files of NVIDIA's model directory that must be there; model.yaml is replaced by ours.
REQUIRED_SOURCE_FILES = ("config.pbtxt", "1/model.py")


class ModelSourceError(ValueError):
    """NVIDIA's llmapi model directory is missing or incomplete; the message names the setting to give."""


def find_model_source(
    runtime: RuntimeConfig, environ: Mapping[str, str] | None = None, candidates: tuple[Path, ...] = IMAGE_MODEL_SOURCE_DIRS
) -> Path:
    """NVIDIA's llmapi model directory to copy, or a ModelSourceError naming the setting to give."""
    env = os.environ if environ is None else environ
    configured = runtime.llmapi.model_source_dir or env.get(MODEL_SOURCE_ENV) or None
    if configured:
        where = (
            "model_metadata.trt_llm.runtime.llmapi.model_source_dir"
            if runtime.llmapi.model_source_dir
            else f"${MODEL_SOURCE_ENV}"
        )
        source = Path(configured).expanduser()
        missing = [name for name in REQUIRED_SOURCE_FILES if not (source / name).is_file()]
        if missing:
            raise ModelSourceError(
                f"{where}: {source} is not NVIDIA's llmapi model directory (missing {', '.join(missing)}); point it at"
                " triton_backend/all_models/llmapi/tensorrt_llm of the installed TensorRT-LLM version"
            )
        return source
    for candidate in candidates:
        if all((candidate / name).is_file() for name in REQUIRED_SOURCE_FILES):
            return candidate
    raise ModelSourceError(
        "backend llmapi needs NVIDIA's llmapi Triton model (triton_backend/all_models/llmapi/tensorrt_llm of the"
        " installed TensorRT-LLM, e.g. from a checkout of NVIDIA/TensorRT-LLM at the matching v1.x tag); none was found"
        f" at {', '.join(str(c) for c in candidates)}: set model_metadata.trt_llm.runtime.llmapi.model_source_dir"
        f" or ${MODEL_SOURCE_ENV}"
    )
