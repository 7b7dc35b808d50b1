"""Serving metrics on truss's `/metrics` (Prometheus text format).

truss 0.18.35's server mounts `prometheus_client.make_asgi_app()` at `/metrics`, which serves the
default `REGISTRY` (truss/templates/server/truss_server.py `create_application`; it unregisters the process/platform/gc
collectors and disables `_created` series). A collector registered there is on `/metrics` with no
route of ours.

Names follow trtllm-serve's (`trtllm_` prefix, TensorRT-LLM `tensorrt_llm/metrics/collector.py`),
with vLLM's suffixes where trtllm-serve has no such metric (`inter_token_latency_seconds`, vLLM
`vllm:inter_token_latency_seconds`); buckets are the ones both use. Every series has the
`model_name` label, as both do.

| metric | type | what |
|---|---|---|
| `trtllm_time_to_first_token_seconds` | histogram | request sent to the engine -> first text |
| `trtllm_inter_token_latency_seconds` | histogram | every gap between two consecutive output chunks |
| `trtllm_time_per_output_token_seconds` | histogram | per request: (e2e - ttft) / (completion_tokens - 1) |
| `trtllm_e2e_request_latency_seconds` | histogram | per request, when the caller gives it |
| `trtllm_prompt_tokens_total` | counter | prompt tokens of finished requests |
| `trtllm_generation_tokens_total` | counter | completion tokens of finished requests |
| `trtllm_num_requests_running` | gauge | requests streaming from the engine |
| `trtllm_num_requests_waiting` | gauge | requests admitted, not yet started |
| `trtllm_request_success_total{finished_reason}` | counter | stop, length, abort (client went away) |
| `trtllm_request_error_total{http_code}` | counter | requests answered with an HTTP error |
| `trtllm_spec_decode_num_draft_tokens_total` | counter | draft tokens the engine proposed (speculative decoding) |
| `trtllm_spec_decode_num_accepted_tokens_total` | counter | of those, accepted; acceptance rate = accepted / draft |

Per-token work stays out of the truss process: a stream worker accumulates a request's gaps in an
`ItlAccumulator` (one `bisect` per gap) and sends the `ItlSummary` (bucket counts and sum, a few
dozen ints) with the request's end; `ServingMetrics.request_finished` adds it in one numpy
addition. A list of gaps is accepted as well and bucketed with numpy in one call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np

from trtllm_truss.streaming.itl import ITL_BUCKETS, ItlSummary

GUIDED_OUTPUTS = "guided_output_schema_checks"  # trtllm_truss extension: not a vLLM / trtllm-serve name
PREFIX = "trtllm_"

# vLLM's and trtllm-serve's buckets (identical in both).
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
E2E_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)

FINISH_REASONS = ("stop", "length", "abort")


class _Histogram:
    """Bucket counts (not cumulative) and a sum, with bulk adds."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = np.asarray(bounds, dtype=np.float64)
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[int(np.searchsorted(self.bounds, value, side="left"))] += 1
        self.total += value

    def observe_many(self, values: Sequence[float]) -> None:
        array = np.asarray(values, dtype=np.float64)
        if array.size == 0:
            return
        index = np.searchsorted(self.bounds, array, side="left")
        self.counts += np.bincount(index, minlength=self.counts.size)
        self.total += float(array.sum())

    def add_counts(self, counts: Sequence[int], total: float) -> None:
        if len(counts) != self.counts.size:
            raise ValueError(f"expected {self.counts.size} bucket counts (the ITL_BUCKETS and +Inf), got {len(counts)}")
        self.counts += np.asarray(counts, dtype=np.int64)
        self.total += total

    def buckets(self) -> list[tuple[str, float]]:
        cumulative = np.cumsum(self.counts)
        labels = [_float_label(b) for b in self.bounds] + ["+Inf"]
        return list(zip(labels, (float(c) for c in cumulative)))


def _float_label(value: float) -> str:
    # prometheus_client's spelling of bucket bounds (`floatToGoString`): 0.5 -> "0.5", 1 -> "1.0".
    from prometheus_client.utils import floatToGoString

    return floatToGoString(value)


class ServingMetrics:
    """The proxy's request metrics, registered with a Prometheus registry (default: the one truss
    serves on `/metrics`). All methods are cheap and thread-safe; call them once per request event,
    never per token."""

    def __init__(self, registry=None, *, model_name: str = "model") -> None:
        from prometheus_client import REGISTRY

        self.model_name = model_name
        self._lock = threading.Lock()
        self._ttft = _Histogram(TTFT_BUCKETS)
        self._itl = _Histogram(ITL_BUCKETS)
        self._tpot = _Histogram(ITL_BUCKETS)
        self._e2e = _Histogram(E2E_BUCKETS)
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._draft_tokens = 0
        self._accepted_draft_tokens = 0
        self._running = 0
        self._waiting = 0
        self._success = dict.fromkeys(FINISH_REASONS, 0)
        self._errors: dict[str, int] = {}
        self._guided_outputs = {"valid": 0, "invalid": 0}  # completed guided JSON answers vs their schema
        self._registry = REGISTRY if registry is None else registry
        self._collector = _Collector(self)
        self._registry.register(self._collector)  # ValueError if these names are registered already

    def unregister(self) -> None:
        self._registry.unregister(self._collector)

    # --- request events ----------------------------------------------------------------------

    def request_queued(self) -> None:
        """Admitted, waiting for a stream worker / the engine."""
        with self._lock:
            self._waiting += 1

    def request_started(self) -> None:
        """Sent to the engine (was queued)."""
        with self._lock:
            self._waiting -= 1
            self._running += 1

    def request_finished(
        self,
        status: str,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        ttft_s: float | None = None,
        itl_gaps_s: Sequence[float] | ItlSummary = (),
        *,
        e2e_s: float | None = None,
        was: str = "running",
        draft_tokens: int = 0,
        accepted_draft_tokens: int = 0,
        schema_valid: bool | None = None,
    ) -> None:
        """A request ended. `status`: a finish reason (`stop`, `length`, `abort` for a client that
        went away) or the HTTP status code of an error (`"400"`, `"429"`, `"503"`). `was`: the
        gauge it leaves, `running`, `waiting` (ended before it started) or `none` (refused before
        it was queued, e.g. a 429)."""
        gaps_are_summary = isinstance(itl_gaps_s, ItlSummary)
        with self._lock:
            if was == "running":
                self._running -= 1
            elif was == "waiting":
                self._waiting -= 1
            elif was != "none":
                raise ValueError(f"was: expected running, waiting or none, got {was!r}")
            if status in self._success:
                self._success[status] += 1
            else:
                self._errors[status] = self._errors.get(status, 0) + 1
            self._prompt_tokens += max(prompt_tokens, 0)
            self._generation_tokens += max(completion_tokens, 0)
            self._draft_tokens += max(draft_tokens, 0)
            self._accepted_draft_tokens += max(accepted_draft_tokens, 0)
            if schema_valid is not None:
                self._guided_outputs["valid" if schema_valid else "invalid"] += 1
            if ttft_s is not None:
                self._ttft.observe(ttft_s)
            if gaps_are_summary:
                self._itl.add_counts(itl_gaps_s.counts, itl_gaps_s.total_s)
            elif len(itl_gaps_s):
                self._itl.observe_many(itl_gaps_s)
            if e2e_s is not None:
                self._e2e.observe(e2e_s)
                if ttft_s is not None and completion_tokens > 1:
                    self._tpot.observe((e2e_s - ttft_s) / (completion_tokens - 1))

    # --- exposition ----------------------------------------------------------------------------

    def _families(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        labels = ["model_name"]
        values = [self.model_name]
        with self._lock:
            histograms = [
                ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", self._ttft),
                ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self._itl),
                ("time_per_output_token_seconds", "Histogram of time per output token in seconds.", self._tpot),
                ("e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", self._e2e),
            ]
            for name, doc, histogram in histograms:
                family = HistogramMetricFamily(PREFIX + name, doc, labels=labels)
                family.add_metric(values, histogram.buckets(), histogram.total)
                yield family
            for name, doc, value in (
                ("prompt_tokens", "Number of prompt (input) tokens of finished requests.", self._prompt_tokens),
                ("generation_tokens", "Number of generation (output) tokens of finished requests.", self._generation_tokens),
                ("spec_decode_num_draft_tokens", "Draft tokens proposed by speculative decoding.", self._draft_tokens),
                ("spec_decode_num_accepted_tokens", "Draft tokens accepted by speculative decoding.",
                 self._accepted_draft_tokens),
            ):
                family = CounterMetricFamily(PREFIX + name, doc, labels=labels)
                family.add_metric(values, value)
                yield family
            for name, doc, value in (
                ("num_requests_running", "Number of requests streaming from the engine.", self._running),
                ("num_requests_waiting", "Number of admitted requests not yet started.", self._waiting),
            ):
                family = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
                family.add_metric(values, value)
                yield family
            success = CounterMetricFamily(
                PREFIX + "request_success", "Count of finished requests by finish reason.",
                labels=[*labels, "finished_reason"],
            )
            for reason, count in self._success.items():
                success.add_metric([*values, reason], count)
            yield success
            errors = CounterMetricFamily(
                PREFIX + "request_error", "Total request errors, labeled by HTTP status code.",
                labels=[*labels, "http_code"],
            )
            for code, count in sorted(self._errors.items()):
                errors.add_metric([*values, code], count)
            yield errors
            guided = CounterMetricFamily(
                PREFIX + GUIDED_OUTPUTS,
                "Completed guided JSON answers validated against the request's JSON Schema (jsonschema), by result.",
                labels=[*labels, "result"],
            )
            for result, count in self._guided_outputs.items():
                guided.add_metric([*values, result], count)
            yield guided


class _Collector:
    """A prometheus_client custom collector over one `ServingMetrics`."""

    def __init__(self, metrics: ServingMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator:
        return self._metrics._families()

    def describe(self) -> list:
        # Names for the registry's duplicate check, without taking the lock at registration.
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        names = []
        for name in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                     "time_per_output_token_seconds", "e2e_request_latency_seconds"):
            names.append(HistogramMetricFamily(PREFIX + name, ""))
        for name in ("prompt_tokens", "generation_tokens", "spec_decode_num_draft_tokens",
                     "spec_decode_num_accepted_tokens", "request_success", "request_error", GUIDED_OUTPUTS):
            names.append(CounterMetricFamily(PREFIX + name, ""))
        for name in ("num_requests_running", "num_requests_waiting"):
            names.append(GaugeMetricFamily(PREFIX + name, ""))
        return names
