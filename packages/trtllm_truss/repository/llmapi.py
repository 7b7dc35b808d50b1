"""The LLM arguments (`model.yaml`) of our llmapi Triton model `tensorrt_llm` (backend `llmapi`).

Backend `llmapi` renders the same repository as the other backends (ensemble, ensemble_ids,
preprocessing, tensorrt_llm, postprocessing: repository/models.py), with our own python model
triton_models/tensorrt_llm_llmapi/model.py as `tensorrt_llm`: NVIDIA's token-id tensor interface in front
of `tensorrt_llm.LLM.generate_async`. This module writes its `1/model.yaml`: the `LLM(...)` keyword
arguments produced from the typed configuration. The names it uses are recorded with their NVIDIA sources
under tests/data/trtllm_flags/<version>/ and contract-tested for every 1.x version the plan allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trtllm_truss.planning.speculation import llmapi_speculative_config

if TYPE_CHECKING:
    from trtllm_truss.config.build import BuildConfig
    from trtllm_truss.config.runtime import RuntimeConfig
    from trtllm_truss.config.speculative import SpeculativeConfig
    from trtllm_truss.planning.lora import PlannedAdapter
    from trtllm_truss.planning.plan import ServingPlan

MODEL_YAML = "model.yaml"  # read by triton_models/tensorrt_llm_llmapi/model.py from its version folder
_POLICY = {"guaranteed_no_evict": "GUARANTEED_NO_EVICT", "max_utilization": "MAX_UTILIZATION"}


def llm_args(
    build: BuildConfig,
    runtime: RuntimeConfig,
    model_dir: str | Path,
    speculative: SpeculativeConfig | None = None,
    draft_dir: str | Path | None = None,
    *,
    adapters: Sequence[PlannedAdapter] = (),
    lora_configuration: Any = None,
    guide_engine: str | None = None,
) -> dict[str, Any]:
    """The `LLM(...)` keyword arguments (the whole model.yaml) for this configuration. `adapters`:
    build.lora_adapters (each request names its own by a LoRARequest); `guide_engine`: the grammar engine
    that enforces guides (runtime.guided_decoding_backend resolved: xgrammar or llguidance, the LLM API's
    `guided_decoding_backend` values; None: guided decoding off, the LLM API's default)."""
    args: dict[str, Any] = {
        "model": str(model_dir),
        "backend": "pytorch",  # the LLM API's PyTorch backend (the TensorRT-engine LLM is another class)
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
    if runtime.event_buffer_max_size:  # KV cache events (LLM.get_kv_cache_events); 0 is TensorRT-LLM's default
        kv_cache["event_buffer_max_size"] = runtime.event_buffer_max_size
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
    if guide_engine is not None:
        args["guided_decoding_backend"] = guide_engine
    if adapters:
        # LoraConfig (the PyTorch backend's): the adapters' folders, and the cache limits they must fit.
        lora: dict[str, Any] = {"lora_dir": [str(a.dir) for a in adapters]}
        if lora_configuration is not None:
            lora["max_lora_rank"] = lora_configuration.max_lora_rank
            if lora_configuration.max_loras is not None:
                lora["max_loras"] = lora_configuration.max_loras
        lora["max_cpu_loras"] = max(len(adapters), lora.get("max_loras", 1))
        args["lora_config"] = lora
    return args


def plan_llm_args(plan: ServingPlan) -> dict[str, Any]:
    """`llm_args` of a plan for backend llmapi."""
    return llm_args(
        plan.build, plan.runtime, plan.model_dir, plan.speculative, plan.draft_dir,
        adapters=plan.lora_adapters, lora_configuration=plan.lora_configuration,
        guide_engine=plan.guide_engine,
    )


def render_model_yaml(plan: ServingPlan) -> str:
    header = (
        "# Rendered by trtllm-truss from model_metadata.trt_llm for its llmapi Triton model (tensorrt_llm).\n"
        "# Every key is a tensorrt_llm.LLM() keyword argument.\n"
    )
    return header + yaml.safe_dump(plan_llm_args(plan), sort_keys=False)


def write_model_yaml(version_dir: Path, plan: ServingPlan) -> Path:
    path = Path(version_dir) / MODEL_YAML
    path.write_text(render_model_yaml(plan), encoding="utf-8")
    return path
