"""The Triton repository for backend `llmapi`: NVIDIA's LLM-API python model, configured by a `model.yaml`.

NVIDIA serves TensorRT-LLM >= 1.0 checkpoints (PyTorch backend, no engine build) through one python
model, `triton_backend/all_models/llmapi/tensorrt_llm` in the TensorRT-LLM repository: `config.pbtxt`,
`1/model.py`, `1/helpers.py` and `1/model.yaml`. Its `model.py` passes every `model.yaml` key except
`triton_config` to `tensorrt_llm.LLM(...)`, and takes Triton's `max_batch_size` / decoupled mode from
`triton_config`. There is no ensemble and no token-id interface: the model takes `text_input` and
answers `text_output` (see tests/data/trtllm_flags/1.0.0/llmapi_model.json for the tensor names).

NVIDIA's files are not part of this package (they must match the TensorRT-LLM version installed, and
their code is NVIDIA's): they are copied at render time from `runtime.llmapi.model_source_dir`,
`$TRTLLM_LLMAPI_MODEL_DIR`, or a known location in the image. Only `model.yaml` is ours, produced from
the typed configuration; the names it uses are recorded with their sources under
tests/data/trtllm_flags/ and contract-tested.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trtllm_truss.planning.llmapi_source import ModelSourceError, find_model_source
from trtllm_truss.planning.speculation import llmapi_speculative_config
from trtllm_truss.repository.models import RepositoryError

if TYPE_CHECKING:
    from trtllm_truss.config.build import BuildConfig
    from trtllm_truss.config.runtime import RuntimeConfig
    from trtllm_truss.config.speculative import SpeculativeConfig
    from trtllm_truss.planning.plan import ServingPlan

MODEL_NAME = "tensorrt_llm"  # NVIDIA's name for the llmapi model
_POLICY = {"guaranteed_no_evict": "GUARANTEED_NO_EVICT", "max_utilization": "MAX_UTILIZATION"}


def llm_args(
    build: BuildConfig,
    runtime: RuntimeConfig,
    model_dir: str | Path,
    speculative: SpeculativeConfig | None = None,
    draft_dir: str | Path | None = None,
) -> dict[str, Any]:
    """The `LLM(...)` keyword arguments (model.yaml minus triton_config) for this configuration."""
    args: dict[str, Any] = {
        "model": str(model_dir),
        "backend": "pytorch",  # older llmapi model.py builds the TensorRT-engine LLM without it
        "dtype": build.dtype.value,
        "tensor_parallel_size": build.tensor_parallel_count,
        "pipeline_parallel_size": build.pipeline_parallel_count,
        "max_batch_size": build.max_batch_size,
        "max_input_len": build.max_input_len,
        "max_seq_len": build.max_seq_len,
        "max_beam_width": build.max_beam_width,
        "enable_chunked_prefill": runtime.enable_chunked_context,
        "stream_interval": runtime.stream_interval,
    }
    if build.expert_parallel_count is not None:
        args["moe_expert_parallel_size"] = build.expert_parallel_count
    if build.max_num_tokens is not None:
        args["max_num_tokens"] = build.max_num_tokens
    kv_cache: dict[str, Any] = {
        "free_gpu_memory_fraction": runtime.kv_cache_free_gpu_mem_fraction,
        # LLM API default is True; ours is False: say it either way so the file shows what runs.
        "enable_block_reuse": runtime.enable_kv_cache_reuse,
    }
    if runtime.max_tokens_in_paged_kv_cache is not None:
        kv_cache["max_tokens"] = runtime.max_tokens_in_paged_kv_cache
    if runtime.kv_cache_host_memory_bytes is not None:
        kv_cache["host_cache_size"] = runtime.kv_cache_host_memory_bytes
    if runtime.kv_cache_onboard_blocks is not None:
        kv_cache["onboard_blocks"] = runtime.kv_cache_onboard_blocks
    if build.quantization_type.value == "fp8_kv":
        kv_cache["dtype"] = "fp8"
    args["kv_cache_config"] = kv_cache
    args["scheduler_config"] = {"capacity_scheduler_policy": _POLICY[runtime.batch_scheduler_policy.value]}
    if speculative is not None:
        args["speculative_config"] = llmapi_speculative_config(speculative, draft_dir)
    return args


def model_yaml_document(
    build: BuildConfig,
    runtime: RuntimeConfig,
    model_dir: str | Path,
    speculative: SpeculativeConfig | None = None,
    draft_dir: str | Path | None = None,
) -> dict[str, Any]:
    """The whole model.yaml: LLM() arguments plus `triton_config` (max_batch_size 0: NVIDIA's model takes
    one prompt per request and batches inside the LLM API)."""
    document = llm_args(build, runtime, model_dir, speculative, draft_dir)
    document["triton_config"] = {"max_batch_size": 0, "decoupled": bool(runtime.llmapi.decoupled)}
    return document


def render_model_yaml(
    build: BuildConfig,
    runtime: RuntimeConfig,
    model_dir: str | Path,
    speculative: SpeculativeConfig | None = None,
    draft_dir: str | Path | None = None,
) -> str:
    header = (
        "# Rendered by trtllm-truss from model_metadata.trt_llm for NVIDIA's llmapi Triton model.\n"
        "# Keys other than triton_config are tensorrt_llm.LLM() arguments.\n"
    )
    document = model_yaml_document(build, runtime, model_dir, speculative, draft_dir)
    return header + yaml.safe_dump(document, sort_keys=False)


def write_llmapi_repository(repo: Path, plan: ServingPlan, environ: Mapping[str, str] | None = None) -> None:
    """Write `<repo>/tensorrt_llm/` NVIDIA's way: their config.pbtxt and model code, our model.yaml."""
    if plan.build is None or plan.model_dir is None:
        raise RepositoryError("plan: backend llmapi needs the build section and the checkpoint folder (model_dir)")
    try:
        source = find_model_source(plan.runtime, environ)
    except ModelSourceError as exc:
        raise RepositoryError(str(exc)) from None
    target = repo / MODEL_NAME
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "model.yaml"))
    (target / "1").mkdir(exist_ok=True)
    (target / "1" / "model.yaml").write_text(
        render_model_yaml(plan.build, plan.runtime, plan.model_dir, plan.speculative, plan.draft_dir), encoding="utf-8"
    )
