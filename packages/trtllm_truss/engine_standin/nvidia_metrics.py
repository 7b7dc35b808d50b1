"""NVIDIA's `nv_trt_llm_*` metric series (tensorrtllm_backend v0.19.0, custom_metrics_reporter.cc),
with NVIDIA's family names and labels (`model`, `version`, and the category label), filled from the
stand-in engine so dashboards built on NVIDIA's series show the stand-in too.

What the stand-in has no equivalent for is reported as it maps: the stand-in has no paged KV cache,
so a "block" is one sequence slot (`max` = slots, `used` = running sequences, `tokens_per` =
max_input_len + max_output_len, `reused` = 0); `context` requests are 0 (prefill happens inside a
step). With several instances (stub processes) every instance adds its own share to the same series:
values are applied as increments of the change since the last update, so the series hold the sum.
"""

from __future__ import annotations

import time
from collections.abc import Callable

REQUEST_FAMILY = ("nv_trt_llm_request_metrics", "TRT LLM request metrics", "request_type")
KV_CACHE_FAMILY = ("nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics", "kv_cache_block_type")
GENERAL_FAMILY = ("nv_trt_llm_general_metrics", "General TRT LLM metrics", "general_type")
REQUEST_LABELS = ("active", "max", "scheduled", "context", "waiting")
KV_CACHE_LABELS = ("max", "free", "used", "tokens_per", "reused", "fraction")
GENERAL_LABELS = ("timestamp", "iteration_counter")
# Set by one instance only (they are not sums): the same value everywhere.
NOT_SUMMED = {("kv_cache_block_type", "tokens_per"), ("general_type", "timestamp")}


class NvidiaMetrics:
    """`metric_family` is pb_utils.MetricFamily (passed in, so this module imports without Triton)."""

    def __init__(self, metric_family, model_name: str, version: str, *, reports_constants: bool) -> None:
        self._families = []
        self._metrics: dict[tuple[str, str], object] = {}
        self._last: dict[tuple[str, str], float] = {}
        self._reports_constants = reports_constants
        for (name, description, category), labels in (
            (REQUEST_FAMILY, REQUEST_LABELS),
            (KV_CACHE_FAMILY, KV_CACHE_LABELS),
            (GENERAL_FAMILY, GENERAL_LABELS),
        ):
            family = metric_family(name=name, description=description, kind=metric_family.GAUGE)
            self._families.append(family)  # a family must outlive its metrics
            for label in labels:
                self._metrics[(category, label)] = family.Metric(
                    labels={"model": model_name, "version": version, category: label}
                )

    def update(self, values: dict[tuple[str, str], float]) -> None:
        for key, value in values.items():
            metric = self._metrics[key]
            if key in NOT_SUMMED:
                if self._reports_constants:
                    metric.set(value)
                continue
            delta = value - self._last.get(key, 0.0)
            if delta:
                metric.increment(delta)
                self._last[key] = value

    def withdraw(self) -> None:
        """Take this instance's share back out (on unload), so the sums stay right."""
        self.update({key: 0.0 for key in self._last})


def engine_values(
    *,
    running: int,
    waiting: int,
    slots: int,
    all_slots: int,
    tokens_per_slot: int,
    iterations: int,
    now: Callable[[], float] = time.time,
) -> dict[tuple[str, str], float]:
    """This instance's values; `slots` its own share of max_batch_size, `all_slots` the total."""
    return {
        ("request_type", "active"): running + waiting,
        ("request_type", "max"): slots,
        ("request_type", "scheduled"): running,
        ("request_type", "context"): 0,
        ("request_type", "waiting"): waiting,
        ("kv_cache_block_type", "max"): slots,
        ("kv_cache_block_type", "free"): slots - running,
        ("kv_cache_block_type", "used"): running,
        ("kv_cache_block_type", "tokens_per"): tokens_per_slot,
        ("kv_cache_block_type", "reused"): 0,
        # Each instance adds its share of the total, so the sum is the fraction of all slots.
        ("kv_cache_block_type", "fraction"): running / all_slots if all_slots else 0.0,
        ("general_type", "timestamp"): int(now() * 1e6),  # microseconds, as NVIDIA converts it
        ("general_type", "iteration_counter"): iterations,
    }
