"""Batches on `/metrics` (the direct front's): a prometheus_client collector that reads the active batches
from the store when scraped, so every front process reports the same numbers."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from trtllm_truss.api import batches as shapes
from trtllm_truss.serving.batches import BATCH, EVERY
from trtllm_truss.store import Store, StoreError

logger = logging.getLogger(__name__)


class BatchCollector:
    def __init__(self, store: Store, *, model_name: str = "model") -> None:
        self._store = store
        self.model_name = model_name

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            active = self._store.find(BATCH, statuses=shapes.ACTIVE, limit=EVERY)
        except StoreError as exc:  # a scrape while the database is away: no series rather than a failed scrape
            logger.warning("batch metrics: %s", exc)
            return
        batches = GaugeMetricFamily("trtllm_batches_active", "Batches not ended yet (both APIs), by status.",
                                    labels=["model_name", "status"])
        for status in shapes.ACTIVE:
            batches.add_metric([self.model_name, status], float(sum(1 for b in active if b.status == status)))
        yield batches
        pending = GaugeMetricFamily(
            "trtllm_batch_lines_pending", "Lines of the batches not ended yet that have no answer (refreshed every second"
            " by the runner).", labels=["model_name"])
        pending.add_metric([self.model_name], float(sum(
            b.body["lines"] - b.body["counts"]["succeeded"] - b.body["counts"]["errored"] for b in active)))
        yield pending

    def describe(self) -> list[Any]:
        return []  # collected only when scraped (registering must not query the database)
