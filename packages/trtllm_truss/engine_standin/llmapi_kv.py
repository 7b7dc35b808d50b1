"""KV cache reuse in the LLM-API double, as TensorRT-LLM 1.x's LLM API shows it
(tests/data/trtllm_kv_reuse/kv_cache_events.json):

- `LLM(kv_cache_config={...})`: `enable_block_reuse` (TensorRT-LLM's default: true), `tokens_per_block`
  (default 32), `max_tokens` and `event_buffer_max_size` (default 0: no events) size the stand-in engine's
  block pool (engine_standin/kv_blocks.py) in the executor worker;
- `SamplingParams(return_perf_metrics=True)`: each `CompletionOutput.request_perf_metrics.kv_cache_metrics`
  has `num_total_allocated_blocks`, `num_new_allocated_blocks`, `num_reused_blocks`, `num_missed_blocks`
  and `kv_cache_hit_rate` of the request's prompt;
- `LLM.get_kv_cache_events(timeout)` / `get_kv_cache_events_async(timeout)`: the events the worker's engine
  made, in TensorRT-LLM's JSON shape (engine_standin/kv_events.py), sent to the proxy as they come and kept
  there in a buffer of `event_buffer_max_size`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# KvCacheConfig's defaults (llm_args.py, 1.x): reuse on, 32 tokens per block, no event buffer.
DEFAULT_BLOCK_REUSE = True
DEFAULT_TOKENS_PER_BLOCK = 32


def kv_pool_parameters(kv_cache_config: Mapping[str, Any] | None) -> dict[str, str]:
    """The stand-in settings (engine_standin/settings.py parameters) of an LLM()'s kv_cache_config."""
    config = dict(kv_cache_config or {})
    reuse = config.get("enable_block_reuse")
    parameters = {
        "enable_kv_cache_reuse": str(DEFAULT_BLOCK_REUSE if reuse is None else bool(reuse)).lower(),
        "tokens_per_block": str(int(config.get("tokens_per_block") or DEFAULT_TOKENS_PER_BLOCK)),
        "event_buffer_max_size": str(int(config.get("event_buffer_max_size") or 0)),
    }
    if config.get("max_tokens"):
        parameters["max_tokens_in_paged_kv_cache"] = str(int(config["max_tokens"]))
    return parameters


@dataclass
class KvCacheMetrics:
    num_total_allocated_blocks: int = 0
    num_new_allocated_blocks: int = 0
    num_reused_blocks: int = 0
    num_missed_blocks: int = 0
    kv_cache_hit_rate: float = 0.0


@dataclass
class RequestPerfMetrics:
    kv_cache_metrics: KvCacheMetrics = field(default_factory=KvCacheMetrics)


def request_perf_metrics(total_blocks: int, reused_blocks: int) -> RequestPerfMetrics:
    """A request's perf metrics from its prompt's block counts (the engine's GenerationRequest.kv_*)."""
    missed = total_blocks - reused_blocks
    return RequestPerfMetrics(KvCacheMetrics(
        num_total_allocated_blocks=total_blocks,
        num_new_allocated_blocks=missed,
        num_reused_blocks=reused_blocks,
        num_missed_blocks=missed,
        kv_cache_hit_rate=reused_blocks / total_blocks if total_blocks else 0.0,
    ))
