"""NVIDIA's nv_trt_llm_* series from the stand-in: names and labels as tensorrtllm_backend v0.19.0's
custom_metrics_reporter.cc declares them, and sums across instances (stub processes)."""

from __future__ import annotations

from trtllm_truss.engine_standin.nvidia_metrics import NvidiaMetrics, engine_values


class _Family:
    """A stand-in for pb_utils.MetricFamily: Triton's core keeps one series per (name, labels)."""

    GAUGE = "gauge"
    series: dict = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: dict):  # noqa: N802 -- pb_utils' spelling
        key = (self.name, tuple(sorted(labels.items())))
        return _Family.series.setdefault(key, _Series())


class _Series:
    value = 0.0

    def set(self, value: float) -> None:
        self.value = value

    def increment(self, value: float) -> None:
        self.value += value


def _value(name: str, category: str, label: str) -> float:
    key = (name, tuple(sorted({"model": "tensorrt_llm", "version": "1", category: label}.items())))
    return _Family.series[key].value


def test_names_labels_and_sums_over_two_instances() -> None:
    _Family.series = {}
    first = NvidiaMetrics(_Family, "tensorrt_llm", "1", reports_constants=True)
    second = NvidiaMetrics(_Family, "tensorrt_llm", "1", reports_constants=False)
    first.update(engine_values(running=3, waiting=1, slots=4, all_slots=8, tokens_per_slot=100, iterations=10, now=lambda: 2.0))
    second.update(engine_values(running=1, waiting=0, slots=4, all_slots=8, tokens_per_slot=100, iterations=5, now=lambda: 2.0))
    assert _value("nv_trt_llm_request_metrics", "request_type", "active") == 5
    assert _value("nv_trt_llm_request_metrics", "request_type", "max") == 8
    assert _value("nv_trt_llm_request_metrics", "request_type", "waiting") == 1
    assert _value("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "used") == 4
    assert _value("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "fraction") == 0.5
    assert _value("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "tokens_per") == 100  # not summed
    assert _value("nv_trt_llm_general_metrics", "general_type", "iteration_counter") == 15
    assert _value("nv_trt_llm_general_metrics", "general_type", "timestamp") == 2_000_000
    # later values replace earlier ones (the change is applied), and an unloaded instance withdraws
    first.update(engine_values(running=0, waiting=0, slots=4, all_slots=8, tokens_per_slot=100, iterations=12, now=lambda: 3.0))
    assert _value("nv_trt_llm_request_metrics", "request_type", "active") == 1
    second.withdraw()
    assert _value("nv_trt_llm_request_metrics", "request_type", "active") == 0
    assert _value("nv_trt_llm_general_metrics", "general_type", "iteration_counter") == 12
