"""A least-recently-used map bounded in bytes: what each entry holds is given when it is put, and the
oldest entries go until the total is within the bound. An entry larger than the bound is not kept.

Used for the front's verdicts (`guides.compile_service`: a verdict's text and notes) and the stand-in's
compiled guides (`engine_standin.guidance`: `guides.verdict.compiled_bytes` of each). Not thread-safe:
its owners hold their own lock (or run on one event loop).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class CacheStats:
    """What a cache holds and how it served: hit rate = hits / (hits + misses)."""

    entries: int = 0
    bytes: int = 0
    limit_bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class BytesLRU(Generic[K, V]):
    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, key: K) -> V | None:
        """The value (now the most recently used), counted as a hit; None, counted as a miss."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[0]

    def put(self, key: K, value: V, size: int) -> bool:
        """Keep `value` as `size` bytes, evicting the least recently used; False when it alone is over the
        bound (then it is not kept)."""
        self.pop(key)
        if size > self.limit_bytes:
            return False
        self._entries[key] = (value, size)
        self._bytes += size
        while self._bytes > self.limit_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted
            self.evictions += 1
        return True

    def pop(self, key: K) -> V | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._bytes -= entry[1]
        return entry[0]

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def stats(self) -> CacheStats:
        return CacheStats(len(self._entries), self._bytes, self.limit_bytes, self.hits, self.misses, self.evictions)
