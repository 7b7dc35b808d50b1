"""Serving metrics: the exposition text truss serves on /metrics, parsed with prometheus_client's
own parser, and bucket counts checked against prometheus_client's own Histogram."""

from __future__ import annotations

import random
import time

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trtllm_truss.serving.metrics import TTFT_BUCKETS, ServingMetrics
from trtllm_truss.streaming.itl import ITL_BUCKETS, ItlAccumulator, ItlSummary


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"model_name": "m", **labels}.items())))]


@pytest.fixture()
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def test_ten_requests_give_ten_ttft_observations_and_token_counts(registry: CollectorRegistry) -> None:
    metrics = ServingMetrics(registry, model_name="m")
    rng = random.Random(7)
    reference = CollectorRegistry()
    ref_ttft = Histogram("ref_ttft", "", buckets=TTFT_BUCKETS, registry=reference)
    ref_itl = Histogram("ref_itl", "", buckets=ITL_BUCKETS, registry=reference)
    prompt_total = completion_total = 0
    for i in range(10):
        metrics.request_queued()
        metrics.request_started()
        ttft = rng.choice([0.0005, 0.01, 0.25, 3.0, 5000.0])
        gaps = [rng.choice([0.001, 0.01, 0.0100001, 0.5, 100.0]) for _ in range(rng.randint(0, 40))]
        prompt_tokens, completion_tokens = 10 + i, len(gaps) + 1
        prompt_total += prompt_tokens
        completion_total += completion_tokens
        ref_ttft.observe(ttft)
        for gap in gaps:
            ref_itl.observe(gap)
        # Half as a list of gaps, half pre-bucketed in the worker.
        if i % 2:
            accumulator = ItlAccumulator()
            for gap in gaps:
                accumulator.add(gap)
            gaps = accumulator.summary()
        metrics.request_finished("stop" if i < 7 else "length", prompt_tokens, completion_tokens, ttft, gaps)
    samples = _samples(registry)
    ref = _samples(reference)
    assert _value(samples, "trtllm_time_to_first_token_seconds_count") == 10
    assert _value(samples, "trtllm_prompt_tokens_total") == prompt_total
    assert _value(samples, "trtllm_generation_tokens_total") == completion_total
    assert _value(samples, "trtllm_request_success_total", finished_reason="stop") == 7
    assert _value(samples, "trtllm_request_success_total", finished_reason="length") == 3
    assert _value(samples, "trtllm_request_success_total", finished_reason="abort") == 0
    assert _value(samples, "trtllm_num_requests_running") == 0
    assert _value(samples, "trtllm_num_requests_waiting") == 0
    for ours, theirs in (("trtllm_time_to_first_token_seconds", "ref_ttft"), ("trtllm_inter_token_latency_seconds", "ref_itl")):
        for (name, labels), value in ref.items():
            if not name.startswith(theirs + "_") or name.endswith("_created"):
                continue
            suffix = name[len(theirs):]
            our_labels = dict(labels)
            assert _value(samples, ours + suffix, **our_labels) == pytest.approx(value), (name, labels)


def test_gauges_follow_requests_and_errors_are_counted_by_http_code(registry: CollectorRegistry) -> None:
    metrics = ServingMetrics(registry, model_name="m")
    for _ in range(3):
        metrics.request_queued()
    metrics.request_started()
    samples = _samples(registry)
    assert _value(samples, "trtllm_num_requests_waiting") == 2
    assert _value(samples, "trtllm_num_requests_running") == 1
    metrics.request_finished("400", was="waiting")
    metrics.request_finished("429", was="none")
    metrics.request_finished("abort", 5, 2, 0.1, [0.02], e2e_s=0.2)
    samples = _samples(registry)
    assert _value(samples, "trtllm_num_requests_waiting") == 1
    assert _value(samples, "trtllm_num_requests_running") == 0
    assert _value(samples, "trtllm_request_error_total", http_code="400") == 1
    assert _value(samples, "trtllm_request_error_total", http_code="429") == 1
    assert _value(samples, "trtllm_request_success_total", finished_reason="abort") == 1
    assert _value(samples, "trtllm_e2e_request_latency_seconds_count") == 1
    assert _value(samples, "trtllm_time_per_output_token_seconds_sum") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="was"):
        metrics.request_finished("stop", was="gone")


def test_registering_twice_in_one_registry_is_refused(registry: CollectorRegistry) -> None:
    metrics = ServingMetrics(registry)
    with pytest.raises(ValueError):
        ServingMetrics(registry)
    metrics.unregister()
    ServingMetrics(registry)


def test_a_summary_of_the_wrong_shape_is_refused(registry: CollectorRegistry) -> None:
    metrics = ServingMetrics(registry)
    metrics.request_queued()
    metrics.request_started()
    with pytest.raises(ValueError, match="bucket counts"):
        metrics.request_finished("stop", 1, 1, 0.1, ItlSummary((1, 2), 0.3))


def test_the_default_registry_is_the_one_truss_serves() -> None:
    from prometheus_client import REGISTRY
    from trtllm_truss.serving.core import serving_metrics

    # The request core's one ServingMetrics (made on first use, by any earlier test too) is on the
    # default registry; a second one there would be a duplicate.
    serving_metrics()
    assert "trtllm_time_to_first_token_seconds" in generate_latest(REGISTRY).decode()


def test_a_finished_request_costs_microseconds_in_the_truss_process(registry: CollectorRegistry) -> None:
    metrics = ServingMetrics(registry)
    accumulator = ItlAccumulator()
    for _ in range(500):
        accumulator.add(0.02)
    summary = accumulator.summary()
    rounds = 2000
    start = time.perf_counter()
    for _ in range(rounds):
        metrics.request_queued()
        metrics.request_started()
        metrics.request_finished("stop", 100, 500, 0.1, summary, e2e_s=10.0)
    per_request = (time.perf_counter() - start) / rounds
    assert per_request < 200e-6, per_request  # ~10-20 µs measured; generous for a loaded CI machine
    assert _value(_samples(registry), "trtllm_inter_token_latency_seconds_count", model_name="model") == rounds * 500


def test_speculative_decoding_totals_are_counted() -> None:
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry, model_name="m")
    metrics.request_queued()
    metrics.request_started()
    metrics.request_finished("stop", 5, 10, draft_tokens=21, accepted_draft_tokens=7)
    text = generate_latest(registry).decode()
    assert 'trtllm_spec_decode_num_draft_tokens_total{model_name="m"} 21.0' in text
    assert 'trtllm_spec_decode_num_accepted_tokens_total{model_name="m"} 7.0' in text
