"""What the runner needs from a target: open once, stream one request, close."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Literal, Protocol

from trtllm_truss.bench.workload import BenchRequest

# engine_guided: the engine model with a JSON-Schema guide per request (bench --guide-schema).
# llm: the LLM API driven directly in one process (bench --with-llm), no Triton.
# openai: POST /v1/completions with token-id prompts (trace replay; any OpenAI-compatible server).
TargetName = Literal["engine", "engine_guided", "ensemble", "http", "llm", "openai"]

# How the generation is kept going to the requested length, so that targets emit equal token counts.
#  min_length: the request asks for min_length = output length (the engine may not stop earlier);
#  end_id:     end_id = -1, an id no token has (what NVIDIA's benchmark_core_model.py sends);
#  none:       the model may stop at its end token (lengths then differ per target).
IgnoreEos = Literal["min_length", "end_id", "none"]


class TargetError(RuntimeError):
    """A target that cannot be used (unreachable, a model missing, an interface mismatch)."""


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One streamed response. `token_count` is exact where the target reports it (token ids or
    usage); text targets without it leave it None and their text is re-tokenized after the run."""

    token_count: int | None
    text: str | None = None
    # From a response's usage or headers, where the target reads them (any chunk may carry them):
    usage_output_tokens: int | None = None  # exact output tokens, overriding the chunks' counts
    cached_tokens: int | None = None  # prompt tokens the engine found in its KV cache
    replica: str | None = None  # which replica served the request


class BenchTarget(Protocol):
    name: TargetName
    url: str

    async def open(self) -> None:
        """Connect and check the interface (raises TargetError naming what is missing)."""

    async def close(self) -> None: ...

    def stream(self, request: BenchRequest) -> AsyncIterator[StreamChunk]:
        """Send one request and yield its responses as they arrive; raises on a failed request."""
