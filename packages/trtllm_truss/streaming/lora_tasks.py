"""NVIDIA's LoRA request protocol, as a stream worker speaks it to the C++ backend's `tensorrt_llm`.

The backend keeps adapters in its LoRA cache by `lora_task_id` (tensorrtllm_backend docs/lora.md): the
first request of a task id carries the adapter itself (`lora_weights` + `lora_config`, NVIDIA's layout:
`trtllm_truss.artifacts.lora_weights`), later ones the id alone. An adapter evicted from the cache (or never seen,
e.g. after a tritonserver restart) makes the engine answer NVIDIA's "LoRA task <id> not found in cache.
Please send LoRA weights with request" (PeftCacheManager::addRequestPeft); the worker then sends the
request again with the weights, once. Each worker process keeps its own record of what it sent, so a
task's first request from every worker carries the weights.

The request with the adapter is built by `trtllm_truss.artifacts.lora_weights.add_request_inputs`.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from pathlib import Path

import numpy as np

from trtllm_truss.engine.client import EngineRefusedError

# NVIDIA's message (cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp, addRequestPeft).
CACHE_MISS = re.compile(r"LoRA task (\d+) not found in cache\. Please send LoRA weights with request")


class LoraTasks:
    """The adapters a worker may send (task id -> folder of NVIDIA's `model.lora_*.npy`), loaded once,
    and which task ids this worker has already sent."""

    def __init__(self, dirs: Mapping[int, str | Path]) -> None:
        self._dirs = {int(task): Path(path) for task, path in dirs.items()}
        self._arrays: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._sent: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self._dirs)

    def adapter(self, task_id: int) -> tuple[np.ndarray, np.ndarray]:
        """(weights [1, rows, size] float16, config [1, rows, 3] int32) of a task."""
        if task_id not in self._arrays:
            from trtllm_truss.artifacts.lora_weights import NvidiaLora

            converted = NvidiaLora.load(self._dirs[task_id])
            self._arrays[task_id] = (converted.weights.astype(np.float16), converted.config.astype(np.int32))
        return self._arrays[task_id]

    def first_inputs(self, task_id: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The adapter when this worker has not sent the task yet, else None (the id alone)."""
        if task_id in self._sent or task_id not in self._dirs:
            return None
        self._sent.add(task_id)
        return self.adapter(task_id)


def is_cache_miss(exc: Exception) -> bool:
    return isinstance(exc, EngineRefusedError) and CACHE_MISS.search(str(exc)) is not None


async def generate_with_lora(
    generate: Callable[..., AsyncIterator], tasks: LoraTasks | None, task_id: int | None, *args, **kwargs
) -> AsyncIterator:
    """`generate(*args, lora=..., **kwargs)`'s responses with NVIDIA's protocol: the adapter with a task's
    first request, and once more when the engine answers that it is not cached (before any output)."""
    if task_id is None or not tasks:
        async with aclosing(generate(*args, **kwargs)) as responses:
            async for response in responses:
                yield response
        return
    lora = tasks.first_inputs(task_id)
    produced = False
    try:
        async with aclosing(generate(*args, lora=lora, **kwargs)) as responses:
            async for response in responses:
                produced = True
                yield response
        return
    except EngineRefusedError as exc:
        if produced or lora is not None or not is_cache_miss(exc):
            raise
    async with aclosing(generate(*args, lora=tasks.adapter(task_id), **kwargs)) as responses:
        async for response in responses:
            yield response
