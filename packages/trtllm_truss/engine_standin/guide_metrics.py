"""The stand-in's guide cache on Triton's `/metrics` (ours; NVIDIA's backend exports nothing for guides).

Per instance (label `instance`), beside `trtllm_standin_active_requests`: counters (hit rate =
hits / (hits + misses); mean compile time = compile_seconds / misses) and gauges of what the cache holds
now (`bytes` within `limit_bytes`, runtime.pytorch.guide_cache_bytes; `engine_standin.guidance` says how a
compiled guide's bytes are counted).
"""

from __future__ import annotations

from trtllm_truss.engine_standin.guidance import GuideCacheStats

# (metric name, description, GuideCacheStats field)
GUIDE_COUNTERS = (
    ("trtllm_standin_guide_cache_hits_total", "guided requests served by a compiled (or compiling) guide", "hits"),
    ("trtllm_standin_guide_cache_misses_total", "guides compiled (cache misses)", "misses"),
    ("trtllm_standin_guide_cache_evictions_total", "compiled guides dropped to keep the cache within its bytes", "evictions"),
    ("trtllm_standin_guide_compile_seconds_total", "seconds spent compiling guides", "compile_seconds"),
    ("trtllm_standin_guide_compile_failures_total", "guides refused by the compiler", "failures"),
    ("trtllm_standin_guide_compile_timeouts_total", "guides refused for compiling past the timeout", "timeouts"),
)
GUIDE_GAUGES = (
    ("trtllm_standin_guide_cache_bytes", "bytes held by the compiled guides in the cache", "cached_bytes"),
    ("trtllm_standin_guide_cache_limit_bytes", "the cache's bound in bytes (runtime.pytorch.guide_cache_bytes)", "limit_bytes"),
    ("trtllm_standin_guide_cache_entries", "compiled guides in the cache", "cached"),
)


class GuideCacheMetrics:
    """`metric_family` is pb_utils.MetricFamily (passed in, so this module imports without Triton)."""

    def __init__(self, metric_family, labels: dict[str, str]) -> None:
        self._families = []  # a family must outlive its metrics
        self._counters = {}
        self._gauges = {}
        self._last = GuideCacheStats()
        for metrics, specs, kind in ((self._counters, GUIDE_COUNTERS, metric_family.COUNTER),
                                     (self._gauges, GUIDE_GAUGES, metric_family.GAUGE)):
            for name, description, field in specs:
                family = metric_family(name=name, description=description, kind=kind)
                self._families.append(family)
                metrics[field] = family.Metric(labels=labels)

    def update(self, stats: GuideCacheStats) -> None:
        for field, metric in self._counters.items():
            delta = getattr(stats, field) - getattr(self._last, field)
            if delta > 0:
                metric.increment(delta)
        for field, metric in self._gauges.items():
            if getattr(stats, field) != getattr(self._last, field) or not self._last.limit_bytes:
                metric.set(getattr(stats, field))
        self._last = stats
