"""Statistics of the benchmark: percentiles, inter-token latency, level summaries."""

from __future__ import annotations

import numpy as np
import pytest

from trtllm_truss.bench.stats import LatencySummary, RequestRecord, percentile, summarize


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 100])
def test_percentile_matches_numpy_linear(q):
    values = list(np.random.default_rng(3).exponential(5.0, size=101)) + [0.5, 7.25]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q, method="linear")))


def test_percentile_interpolates_between_ranks():
    assert percentile([10, 20, 30, 40], 50) == 25.0
    assert percentile([10, 20, 30, 40], 90) == pytest.approx(37.0)
    assert percentile([5.0], 99) == 5.0


@pytest.mark.parametrize("bad", [-1, 100.5])
def test_percentile_rejects_out_of_range_q(bad):
    with pytest.raises(ValueError, match="within"):
        percentile([1, 2], bad)


def test_percentile_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)


def _record(i, sent, first, last, finished, tokens, error=None):
    return RequestRecord(
        index=i, input_tokens=10, requested_output_tokens=tokens, sent_at=sent, first_output_at=first,
        last_output_at=last, finished_at=finished, output_tokens=tokens, error=error,
    )


def test_itl_is_time_between_first_and_last_token_per_gap():
    r = _record(0, sent=1.0, first=1.2, last=2.2, finished=2.3, tokens=11)
    assert r.ttft_s == pytest.approx(0.2)
    assert r.itl_s == pytest.approx(0.1)  # 10 gaps over 1.0 s
    assert r.e2e_s == pytest.approx(1.3)


def test_itl_undefined_below_two_tokens():
    assert _record(0, 0.0, 0.1, 0.1, 0.2, tokens=1).itl_s is None


def test_itl_counts_tokens_not_responses():
    # Two responses of 5 tokens each: 9 token gaps between the first and the last token.
    r = _record(0, 0.0, 0.1, 1.0, 1.0, tokens=10)
    r.response_count = 2
    assert r.itl_s == pytest.approx(0.1)


def test_summarize_level():
    records = [
        _record(0, sent=0.0, first=0.1, last=1.0, finished=1.0, tokens=10),
        _record(1, sent=0.5, first=0.7, last=1.6, finished=2.0, tokens=10),
        _record(2, sent=1.0, first=None, last=None, finished=None, tokens=0, error="RuntimeError: boom"),
    ]
    m = summarize(records)
    assert (m.requests, m.succeeded, m.failed) == (3, 2, 1)
    assert m.first_errors == ["RuntimeError: boom"]
    assert m.duration_s == pytest.approx(2.0)
    assert m.output_tokens_total == 20
    assert m.output_tokens_per_s == pytest.approx(10.0)
    assert m.requests_per_s == pytest.approx(1.0)
    assert m.ttft_ms.p50 == pytest.approx(150.0)
    assert m.ttft_ms.count == 2
    assert m.itl_ms.p50 == pytest.approx(100.0)
    assert m.e2e_ms.max == pytest.approx(1500.0)


def test_summarize_excludes_failed_requests_from_tokens():
    failed = _record(0, 0.0, 0.1, 0.2, None, tokens=50, error="TimeoutError")
    m = summarize([failed, _record(1, 0.0, 0.1, 0.5, 1.0, tokens=5)])
    assert m.output_tokens_total == 5


def test_latency_summary_of_nothing_has_no_values():
    s = LatencySummary.from_seconds([])
    assert s.count == 0 and s.p50 is None
