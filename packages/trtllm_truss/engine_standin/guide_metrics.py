"""The stand-in's guide cache on Triton's `/metrics` (ours; NVIDIA's backend exports nothing for guides).

Counters per instance (label `instance`), beside `trtllm_standin_active_requests`: hit rate =
hits / (hits + misses); mean compile time = compile_seconds / misses.
"""

from __future__ import annotations

from trtllm_truss.engine_standin.guidance import GuideCacheStats

# (metric name, description, GuideCacheStats field)
GUIDE_COUNTERS = (
    ("trtllm_standin_guide_cache_hits_total", "guided requests served by a compiled (or compiling) guide", "hits"),
    ("trtllm_standin_guide_cache_misses_total", "guides compiled (cache misses)", "misses"),
    ("trtllm_standin_guide_compile_seconds_total", "seconds spent compiling guides", "compile_seconds"),
    ("trtllm_standin_guide_compile_failures_total", "guides refused by the compiler", "failures"),
    ("trtllm_standin_guide_compile_timeouts_total", "guides refused for compiling past the timeout", "timeouts"),
)


class GuideCacheMetrics:
    """`metric_family` is pb_utils.MetricFamily (passed in, so this module imports without Triton)."""

    def __init__(self, metric_family, labels: dict[str, str]) -> None:
        self._families = []  # a family must outlive its metrics
        self._metrics = {}
        self._last = GuideCacheStats()
        for name, description, field in GUIDE_COUNTERS:
            family = metric_family(name=name, description=description, kind=metric_family.COUNTER)
            self._families.append(family)
            self._metrics[field] = family.Metric(labels=labels)

    def update(self, stats: GuideCacheStats) -> None:
        for field, metric in self._metrics.items():
            delta = getattr(stats, field) - getattr(self._last, field)
            if delta > 0:
                metric.increment(delta)
        self._last = stats
