"""Per-request timing records and the statistics computed from them.

Definitions (the same for every target, so that targets compare):
- TTFT: request sent -> first response carrying output (text or tokens).
- inter-token latency (ITL) of one request: (last output - first output) / (output tokens - 1).
  A response may carry several tokens (a stage that batches tokens when the client falls behind),
  so per-response gaps would not be per-token gaps; this per-request mean is, and is what vLLM and
  genai-perf call time-per-output-token. Requests with fewer than 2 output tokens have no ITL.
- end-to-end latency: request sent -> stream finished.
- output tokens/s and requests/s: totals of the successful requests divided by the wall time of the
  level (first request sent -> last request finished).
Percentiles interpolate linearly between order statistics (numpy's default "linear" method).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from pydantic import BaseModel, ConfigDict, Field


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of `values`, linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(ordered[low])
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


@dataclass
class RequestRecord:
    """What the runner saw of one request. Times are `time.perf_counter()` seconds."""

    index: int
    input_tokens: int
    requested_output_tokens: int
    sent_at: float
    finished_at: float | None = None
    first_output_at: float | None = None
    last_output_at: float | None = None
    response_count: int = 0
    # Exact count when the target reports it (token ids, usage); None until counted.
    output_tokens: int | None = None
    # Streamed text, kept only for targets whose tokens are counted by re-tokenizing afterwards.
    text_parts: list[str] = field(default_factory=list)
    error: str | None = None
    cached_tokens: int | None = None  # prompt tokens served from the KV cache, where the response says
    replica: str | None = None  # the replica that served it, where the response says

    @property
    def ok(self) -> bool:
        return self.error is None and self.finished_at is not None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_output_at is None else self.first_output_at - self.sent_at

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.sent_at

    @property
    def itl_s(self) -> float | None:
        if self.output_tokens is None or self.output_tokens < 2:
            return None
        if self.first_output_at is None or self.last_output_at is None:
            return None
        return (self.last_output_at - self.first_output_at) / (self.output_tokens - 1)


class LatencySummary(BaseModel):
    """Milliseconds over the successful requests of one level."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(description="requests that contributed a value")
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def from_seconds(cls, seconds: Sequence[float]) -> "LatencySummary":
        if not seconds:
            return cls(count=0)
        ms = [s * 1000.0 for s in seconds]
        return cls(
            count=len(ms),
            mean=sum(ms) / len(ms),
            p50=percentile(ms, 50),
            p90=percentile(ms, 90),
            p99=percentile(ms, 99),
            max=max(ms),
        )


class LevelMetrics(BaseModel):
    """The figures of one target at one load level (one concurrency or one request rate)."""

    model_config = ConfigDict(extra="forbid")

    requests: int = Field(description="requests sent")
    succeeded: int
    failed: int
    first_errors: list[str] = Field(default_factory=list, description="up to 3 distinct error messages")
    duration_s: float = Field(description="first request sent -> last request finished (summed over rounds)")
    input_tokens_mean: float | None = None
    output_tokens_total: int
    output_tokens_mean: float | None = None
    output_tokens_per_s: float
    requests_per_s: float
    responses_per_request_mean: float | None = Field(
        None, description="streamed responses carrying output; below output tokens when responses carry several"
    )
    ttft_ms: LatencySummary
    itl_ms: LatencySummary
    e2e_ms: LatencySummary


def summarize(records: Sequence[RequestRecord], duration_s: float | None = None) -> LevelMetrics:
    """Statistics of one level. Every record must already have its output tokens counted.

    `duration_s` overrides the wall time (first sent -> last finished) for records pooled from
    several rounds, whose wall time is the sum of the rounds' and not their overall span."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    if duration_s is not None:
        duration = duration_s
    elif records:
        start = min(r.sent_at for r in records)
        end = max((r.finished_at for r in records if r.finished_at is not None), default=start)
        duration = max(end - start, 0.0)
    else:
        duration = 0.0
    total_tokens = sum(r.output_tokens or 0 for r in ok)
    errors: list[str] = []
    for r in failed:
        message = r.error or "stream ended without finishing"
        if message not in errors and len(errors) < 3:
            errors.append(message)
    return LevelMetrics(
        requests=len(records),
        succeeded=len(ok),
        failed=len(failed),
        first_errors=errors,
        duration_s=duration,
        input_tokens_mean=(sum(r.input_tokens for r in ok) / len(ok)) if ok else None,
        output_tokens_total=total_tokens,
        output_tokens_mean=(total_tokens / len(ok)) if ok else None,
        output_tokens_per_s=(total_tokens / duration) if duration > 0 else 0.0,
        requests_per_s=(len(ok) / duration) if duration > 0 else 0.0,
        responses_per_request_mean=(sum(r.response_count for r in ok) / len(ok)) if ok else None,
        ttft_ms=LatencySummary.from_seconds([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl_ms=LatencySummary.from_seconds([r.itl_s for r in ok if r.itl_s is not None]),
        e2e_ms=LatencySummary.from_seconds([r.e2e_s for r in ok if r.e2e_s is not None]),
    )
