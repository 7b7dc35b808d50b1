"""KV cache events in TensorRT-LLM's own JSON shape, in a bounded buffer that a consumer drains.

The shape is what `LLM.get_kv_cache_events(timeout)` returns (TensorRT-LLM's KVCacheEventSerializer,
recorded in tests/data/trtllm_kv_reuse/kv_cache_events.json): each event is

    {"event_id": int, "data": {...}, "window_size": int}

with `data` one of
    {"type": "created", "num_blocks_per_cache_level": [gpu blocks, host blocks]}
    {"type": "stored", "parent_hash": int | None, "blocks": [
        {"type": "stored_block", "block_hash": int, "tokens": [
            {"type": "unique_token", "token_id": int, "token_extra_id": 0}, ...],
         "cache_level": 0, "priority": 35}, ...]}
    {"type": "removed", "block_hashes": [int, ...]}

Hashes are unsigned 64-bit integers (consumers such as Dynamo convert them to signed). The LoRA task id
enters the hash of a block, not the JSON (TensorRT-LLM's serializer leaves `lora_id` out).

The buffer holds at most `max_size` events (TensorRT-LLM's `kv_cache_config.event_buffer_max_size`);
when full the oldest is dropped, which a consumer sees as a gap in `event_id`. Size 0: no events are
kept (TensorRT-LLM's default: events off). The first event is always "created": Dynamo's publisher learns
the window size from it and drops later events of another window size.

API for consumers in the same process (the Triton python models, the LLM-API double's executor):
`engine.kv_events.drain(timeout_s) -> list[dict]` waits up to `timeout_s` for at least one event and
returns (and removes) every buffered event, oldest first; an empty list when none came.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence

# TensorRT-LLM's defaults for what the stand-in does not model: one cache level (GPU) and the
# default retention priority (KvCacheRetentionConfig's kDefaultRetentionPriority).
CACHE_LEVEL = 0
DEFAULT_PRIORITY = 35


class KVEventBuffer:
    """A bounded, thread-safe queue of KV cache events (see module docstring)."""

    def __init__(self, max_size: int, window_size: int) -> None:
        if max_size < 0:
            raise ValueError(f"event_buffer_max_size: must be >= 0, got {max_size}")
        self.max_size = max_size
        self.window_size = window_size
        self._events: deque[dict] = deque(maxlen=max_size or None)
        self._next_id = 0
        self._dropped = 0
        self._ready = threading.Condition()
        # Called (outside the lock) after each event is added: a consumer that forwards events elsewhere.
        self.on_event: Callable[[], None] | None = None

    @property
    def enabled(self) -> bool:
        return self.max_size > 0

    @property
    def dropped(self) -> int:
        """Events dropped because the buffer was full (the consumer fell behind)."""
        return self._dropped

    def _add(self, data: dict) -> None:
        if not self.max_size:
            return
        with self._ready:
            if len(self._events) == self.max_size:
                self._dropped += 1
            self._events.append({"event_id": self._next_id, "data": data, "window_size": self.window_size})
            self._next_id += 1
            self._ready.notify_all()
        if self.on_event is not None:
            self.on_event()

    def extend(self, events: Sequence[dict]) -> None:
        """Keep events made elsewhere (already numbered, e.g. by another process's buffer), oldest dropped when full."""
        if not self.max_size or not events:
            return
        with self._ready:
            overflow = len(self._events) + len(events) - self.max_size
            if overflow > 0:
                self._dropped += overflow
            self._events.extend(events)
            self._ready.notify_all()

    def created(self, gpu_blocks: int, host_blocks: int = 0) -> None:
        self._add({"type": "created", "num_blocks_per_cache_level": [gpu_blocks, host_blocks]})

    def stored(self, parent_hash: int | None, blocks: Sequence[tuple[int, Sequence[int]]]) -> None:
        """`blocks`: (block hash, its token ids) in prefix order, the first one a child of `parent_hash`."""
        if not blocks:
            return
        self._add({
            "type": "stored",
            "parent_hash": parent_hash,
            "blocks": [
                {
                    "type": "stored_block",
                    "block_hash": block_hash,
                    "tokens": [{"type": "unique_token", "token_id": int(t), "token_extra_id": 0} for t in tokens],
                    "cache_level": CACHE_LEVEL,
                    "priority": DEFAULT_PRIORITY,
                }
                for block_hash, tokens in blocks
            ],
        })

    def removed(self, block_hashes: Sequence[int]) -> None:
        if block_hashes:
            self._add({"type": "removed", "block_hashes": list(block_hashes)})

    def drain(self, timeout_s: float = 0.0) -> list[dict]:
        """Every buffered event, oldest first, after waiting up to `timeout_s` for the first one."""
        with self._ready:
            if not self._events and timeout_s > 0:
                self._ready.wait_for(lambda: bool(self._events), timeout=timeout_s)
            events = list(self._events)
            self._events.clear()
        return events
