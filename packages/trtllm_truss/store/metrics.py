"""The store's size on `/metrics` (truss's and the direct front's): a prometheus_client collector that reads
the totals the database keeps, so every process and replica reports the same numbers."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from trtllm_truss.store.base import Store, StoreError

logger = logging.getLogger(__name__)

PREFIX = "trtllm_store_"
SERIES = (
    ("bytes", "gauge", "Bytes of stored objects (their JSON) now.", "bytes"),
    ("max_bytes", "gauge", "The bound on them (runtime.store.max_bytes); past it the oldest objects go first.", "max_bytes"),
    ("objects", "gauge", "Stored objects now.", "objects"),
    ("evictions", "counter", "Objects dropped, oldest first, to stay within max_bytes.", "evictions"),
    ("expirations", "counter", "Objects dropped at the end of their time to live (runtime.store.ttl_s).", "expirations"),
)


class StoreCollector:
    def __init__(self, store: Store, *, model_name: str = "model") -> None:
        self._store = store
        self.model_name = model_name

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            stats = self._store.stats()
        except StoreError as exc:  # a scrape while the database is away: no series rather than a failed scrape
            logger.warning("store metrics: %s", exc)
            return
        for name, kind, doc, field in SERIES:
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(PREFIX + name, doc, labels=["model_name"])
            family.add_metric([self.model_name], float(getattr(stats, field)))
            yield family

    def describe(self) -> list[Any]:
        return []  # collected only when scraped (registering must not query the database)


_REGISTERED: StoreCollector | None = None


def register_store_metrics(store: Store, model_name: str = "model", registry: Any = None) -> StoreCollector:
    """`store`'s series on prometheus_client's default registry (a store opened again replaces the last one's)."""
    from prometheus_client import REGISTRY

    global _REGISTERED
    registry = REGISTRY if registry is None else registry
    if _REGISTERED is not None:
        with contextlib.suppress(KeyError):
            registry.unregister(_REGISTERED)
    _REGISTERED = StoreCollector(store, model_name=model_name)
    registry.register(_REGISTERED)
    return _REGISTERED
