"""Settings given explicitly that the chosen backend (at its TensorRT-LLM version) would silently ignore:
each is a `validate` problem naming its key (a setting that does nothing is a bug)."""

from __future__ import annotations

from typing import Any

from trtllm_truss.planning.probe import version_tuple

# --- settings that would do nothing on the backend that runs --------------------------------------

# Releases after which an engine build flag stopped existing (trtllm-build of each tag).
_MULTI_BLOCK_RUNTIME_SINCE = (0, 13)
_CUSTOM_ALL_REDUCE_FLAG_UNTIL = (0, 14)
# Set explicitly, these do nothing on backend llmapi: the LLM API schedules its own batch (its limit is
# build.max_batch_size), where the stand-in reads max_num_sequences.
_LLMAPI_IGNORED_RUNTIME = ("max_num_sequences",)


def _explicit(model: Any, name: str) -> bool:
    return name in getattr(model, "model_fields_set", ())


def backend_setting_problems(
    trt: Any, backend: str, trtllm_version: str | None, *, llm_api_double: bool = False
) -> list[str]:
    """Settings given explicitly that the chosen backend (at this TensorRT-LLM version) would silently ignore,
    each as one line naming the key. Empty when everything given reaches the backend. `llm_api_double`:
    backend llmapi runs the LLM-API double (no TensorRT-LLM here), whose stand-in engine also reads
    runtime.pytorch.synthetic (to bench the llmapi path: docs/performance.md)."""
    problems: list[str] = []
    runtime, build = trt.runtime, trt.build
    plugins = build.plugin_configuration if build is not None else None
    version = version_tuple(trtllm_version)
    if backend == "llmapi":
        for name in _LLMAPI_IGNORED_RUNTIME:
            if _explicit(runtime, name):
                problems.append(
                    f"model_metadata.trt_llm.runtime.{name}: not used by backend llmapi (the LLM API schedules its"
                    " own batch, of build.max_batch_size); remove it"
                )
        # runtime.pytorch configures the CPU stand-in; on llmapi only the LLM-API double's stand-in engine reads
        # some of it (its guide whitespace, and the synthetic engine).
        read_by_double = {"guided_whitespace", "synthetic"} if llm_api_double else {"guided_whitespace"}
        for name in sorted(getattr(runtime.pytorch, "model_fields_set", set()) - read_by_double):
            problems.append(
                f"model_metadata.trt_llm.runtime.pytorch.{name}: a setting of the CPU stand-in (backend pytorch);"
                " backend llmapi does not use it; remove it"
            )
        if plugins is not None and build is not None and _explicit(build, "plugin_configuration"):
            for name in sorted(plugins.model_fields_set):
                problems.append(
                    f"model_metadata.trt_llm.build.plugin_configuration.{name}: a TensorRT engine build option;"
                    " backend llmapi builds no engine; remove it (or set runtime.backend: tensorrtllm)"
                )
    if backend != "llmapi":
        for name in sorted(getattr(runtime.llmapi, "model_fields_set", set())):
            problems.append(
                f"model_metadata.trt_llm.runtime.llmapi.{name}: a setting of our llmapi Triton model (backend llmapi);"
                f" backend {backend} does not use it; remove it"
            )
    if backend == "tensorrtllm":
        if build is not None and build.expert_parallel_count is not None:
            problems.append(
                "model_metadata.trt_llm.build.expert_parallel_count: only reaches backend llmapi"
                " (LLM(moe_expert_parallel_size=...)); the engine build path does not take it; remove it"
            )
        if runtime.stream_interval != 1:
            problems.append(
                "model_metadata.trt_llm.runtime.stream_interval: NVIDIA's C++ backend (tensorrtllm) sends a response"
                " every decode step and has no such setting (it is TensorRT-LLM's LLM API option: runtime.backend"
                " llmapi); remove it"
            )
        if runtime.event_buffer_max_size:
            problems.append(
                "model_metadata.trt_llm.runtime.event_buffer_max_size: NVIDIA's C++ backend (tensorrtllm) takes no"
                " KV event buffer setting and sends no KV cache events through Triton (a KV-aware router runs it in"
                " its approximate, event-free mode); set runtime.backend: llmapi for events, or remove it"
            )
        if _explicit(runtime, "max_num_sequences"):
            problems.append(
                "model_metadata.trt_llm.runtime.max_num_sequences: NVIDIA's tensorrtllm backend has no such setting"
                " (the batch manager takes its limit from the engine); set build.max_batch_size instead"
            )
        if plugins is not None and version >= _MULTI_BLOCK_RUNTIME_SINCE and _explicit(plugins, "multi_block_mode"):
            problems.append(
                f"model_metadata.trt_llm.build.plugin_configuration.multi_block_mode: not a build option on TensorRT-LLM"
                f" {trtllm_version} (a runtime option since 0.13, on by default); remove it"
            )
        if (
            plugins is not None
            and version >= _CUSTOM_ALL_REDUCE_FLAG_UNTIL
            and _explicit(plugins, "use_custom_all_reduce")
        ):
            problems.append(
                f"model_metadata.trt_llm.build.plugin_configuration.use_custom_all_reduce: not a build option on"
                f" TensorRT-LLM {trtllm_version} (the all-reduce strategy is chosen at runtime since 0.14); remove it"
            )
    return problems
