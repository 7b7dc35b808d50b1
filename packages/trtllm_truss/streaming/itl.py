"""One request's inter-token latency as a stream worker measures it: the gaps bucketed as they happen
(one `bisect` per gap), sent with the request's end as a few dozen ints; `serving.metrics` adds them up."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

# vLLM's and trtllm-serve's buckets (identical in both).
ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)


@dataclass(frozen=True)
class ItlSummary:
    """One request's inter-token gaps, bucketed by `ITL_BUCKETS` (+Inf last): what a worker sends."""

    counts: tuple[int, ...]  # per bucket, not cumulative; len(ITL_BUCKETS) + 1
    total_s: float

    @property
    def count(self) -> int:
        return sum(self.counts)


class ItlAccumulator:
    """Bucket counts of one request's gaps, built as they happen (in the stream worker)."""

    __slots__ = ("_counts", "_total")

    def __init__(self) -> None:
        self._counts = [0] * (len(ITL_BUCKETS) + 1)
        self._total = 0.0

    def add(self, gap_s: float) -> None:
        # bisect_left: a gap equal to a bound falls in that bucket (Prometheus `le`).
        self._counts[bisect_left(ITL_BUCKETS, gap_s)] += 1
        self._total += gap_s

    def summary(self) -> ItlSummary:
        return ItlSummary(tuple(self._counts), self._total)
