"""The CPU/GPU engine stand-in for TensorRT-LLM: continuous batching over a Hugging Face causal LM.

Independent of Triton; the python-backend model `triton_models/tensorrt_llm_pytorch/model.py` wraps it
behind NVIDIA's `tensorrt_llm` tensor interface.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trtllm_truss.engine_standin.settings import (
    SettingsError,
    StandinSettings,
    resolve_device,
)
from trtllm_truss.engine_standin.types import (
    EngineLimits,
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    Guide,
    RequestRejected,
    SamplingParams,
)
from trtllm_truss.engine_standin.words import parse_word_list

if TYPE_CHECKING:
    from trtllm_truss.engine_standin.scheduler import EngineBase, OutputCallback, StandinEngine
    from trtllm_truss.engine_standin.synthetic import SyntheticEngine, ordinary_token_ids

# The engines need torch; the types, settings and world modules do not, and are imported by code and
# tests that run on Pythons without torch. So the engines load on first use.
_NEEDS_TORCH = {
    "EngineBase": "scheduler",
    "OutputCallback": "scheduler",
    "StandinEngine": "scheduler",
    "SyntheticEngine": "synthetic",
    "ordinary_token_ids": "synthetic",
}


def __getattr__(name: str) -> Any:
    if name in _NEEDS_TORCH:
        return getattr(importlib.import_module(f"{__name__}.{_NEEDS_TORCH[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "EngineBase",
    "EngineLimits",
    "FinishReason",
    "GenerationOutput",
    "GenerationRequest",
    "Guide",
    "OutputCallback",
    "RequestRejected",
    "SamplingParams",
    "SettingsError",
    "StandinEngine",
    "StandinSettings",
    "SyntheticEngine",
    "build_engine",
    "build_kv_pool",
    "ordinary_token_ids",
    "parse_word_list",
    "resolve_device",
]


def build_engine(settings: StandinSettings) -> "EngineBase":
    """The engine the settings ask for, started."""
    import torch

    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    kv_pool = build_kv_pool(settings)
    if settings.synthetic:
        from trtllm_truss.engine_standin.synthetic import SyntheticEngine, ordinary_token_ids

        vocab_size = _vocab_size(settings)
        cycle = ordinary_token_ids(settings.tokenizer_dir, vocab_size)
        engine: EngineBase = SyntheticEngine(
            settings.limits, vocab_size, cycle, step_time_ms=settings.synthetic_step_time_ms or 0.0,
            adapters={task: name for task, (name, _) in settings.lora_adapters.items()},
            prefill_time_per_token_ms=settings.synthetic_prefill_time_per_token_ms, kv_pool=kv_pool,
        )
    else:
        from trtllm_truss.engine_standin.guidance import GuideCompiler
        from trtllm_truss.engine_standin.model_runner import CausalLMRunner
        from trtllm_truss.engine_standin.scheduler import StandinEngine

        assert settings.model_dir is not None
        adapters = settings.lora_adapters
        runner = CausalLMRunner(
            settings.model_dir,
            device=resolve_device(settings.device),
            dtype=settings.dtype,
            adapters={name: directory for name, directory in adapters.values()},
        )
        engine = StandinEngine(
            runner,
            settings.limits,
            guides=GuideCompiler(
                settings.tokenizer_dir or settings.model_dir,
                engine=settings.guided_decoding_backend,
                whitespace=settings.guided_whitespace,
                cache_bytes=settings.guide_cache_bytes,
            ),
            adapters={task: name for task, (name, _) in adapters.items()},
            max_loras=settings.max_loras,
            kv_pool=kv_pool,
        )
    return engine.start()


def build_kv_pool(settings: StandinSettings):
    """The engine's paged KV block pool (engine_standin/kv_blocks.py) and its event buffer, as configured."""
    from trtllm_truss.engine_standin.kv_blocks import BlockPool
    from trtllm_truss.engine_standin.kv_events import KVEventBuffer

    limits = settings.limits
    events = KVEventBuffer(settings.event_buffer_max_size, window_size=limits.max_input_len + limits.max_output_len)
    size = settings.tokens_per_block
    return BlockPool(size, max(1, settings.kv_pool_tokens // size), reuse=settings.kv_cache_reuse, events=events)


def _vocab_size(settings: StandinSettings) -> int:
    """From the checkpoint's config.json when there is one (no weights are loaded)."""
    import json

    if settings.model_dir is not None and (settings.model_dir / "config.json").is_file():
        config = json.loads((settings.model_dir / "config.json").read_text())
        if isinstance(config.get("vocab_size"), int):
            return config["vocab_size"]
    return 32_000
