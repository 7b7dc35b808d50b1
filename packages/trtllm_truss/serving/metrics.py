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
| `trtllm_prompt_tokens_cached_total` | counter | of the prompt tokens, those whose KV the engine reused from its cache (ours) |
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

Every value is one float64 of one array (`STATE_SIZE`); the direct front's processes each write their
own array in shared memory and read all of them, so `/metrics` of any of them is the replica's sum
(`fronts.replica_state`; what prometheus_client's multiprocess mode does with one file per process).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np

from trtllm_truss.streaming.itl import ITL_BUCKETS, ItlSummary

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
GUIDED_OUTPUTS = "guided_output_schema_checks"  # trtllm_truss extension: not a vLLM / trtllm-serve name
GUIDED_RESULTS = ("valid", "invalid")  # completed guided JSON answers checked against their schema


class _Histogram:
    """Bucket counts (not cumulative) and a sum, with bulk adds: views of `state` from `offset` on
    (len(bounds) + 1 counts, then the sum), so the whole of ServingMetrics is one array."""

    __slots__ = ("bounds", "counts", "_sum")

    def __init__(self, bounds: Sequence[float], state: np.ndarray, offset: int) -> None:
        self.bounds = np.asarray(bounds, dtype=np.float64)
        self.counts = state[offset:offset + len(bounds) + 1]
        self._sum = state[offset + len(bounds) + 1:offset + len(bounds) + 2]

    @staticmethod
    def size(bounds: Sequence[float]) -> int:
        return len(bounds) + 2

    @property
    def total(self) -> float:
        return float(self._sum[0])

    def observe(self, value: float) -> None:
        self.counts[int(np.searchsorted(self.bounds, value, side="left"))] += 1
        self._sum[0] += value

    def observe_many(self, values: Sequence[float]) -> None:
        array = np.asarray(values, dtype=np.float64)
        if array.size == 0:
            return
        index = np.searchsorted(self.bounds, array, side="left")
        self.counts += np.bincount(index, minlength=self.counts.size)
        self._sum[0] += float(array.sum())

    def add_counts(self, counts: Sequence[int], total: float) -> None:
        if len(counts) != self.counts.size:
            raise ValueError(f"expected {self.counts.size} bucket counts (the ITL_BUCKETS and +Inf), got {len(counts)}")
        self.counts += np.asarray(counts, dtype=np.float64)
        self._sum[0] += total


def _float_label(value: float) -> str:
    # prometheus_client's spelling of bucket bounds (`floatToGoString`): 0.5 -> "0.5", 1 -> "1.0".
    from prometheus_client.utils import floatToGoString

    return floatToGoString(value)


# The state array: the four histograms, then these counters and gauges, the finish reasons, and one
# error counter per HTTP status 100..599 (plus one for a status that is not a number).
_HISTOGRAMS = (
    ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    ("time_per_output_token_seconds", "Histogram of time per output token in seconds.", ITL_BUCKETS),
    ("e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", E2E_BUCKETS),
)
_HISTOGRAMS_SIZE = sum(_Histogram.size(bounds) for _, _, bounds in _HISTOGRAMS)
_PROMPT, _GENERATION, _DRAFT, _ACCEPTED, _RUNNING, _WAITING = range(_HISTOGRAMS_SIZE, _HISTOGRAMS_SIZE + 6)
_SUCCESS = _HISTOGRAMS_SIZE + 6
_FIRST_CODE, _LAST_CODE = 100, 599
_ERRORS = _SUCCESS + len(FINISH_REASONS)
_OTHER_ERROR = _ERRORS + _LAST_CODE - _FIRST_CODE + 1
_GUIDED = _OTHER_ERROR + 1
_CACHED = _GUIDED + len(GUIDED_RESULTS)  # prompt tokens the engine found in its KV cache
STATE_SIZE = _CACHED + 1  # float64 values of one ServingMetrics


class ServingMetrics:
    """The proxy's request metrics, registered with a Prometheus registry (default: the one truss
    serves on `/metrics`). All methods are cheap and thread-safe; call them once per request event,
    never per token.

    The values live in one float64 array of STATE_SIZE (`state`, default a private one). Processes that
    serve one replica (the direct front) each write their own array in shared memory and pass all of
    them as `peers`: every process's `/metrics` then shows their sum."""

    def __init__(
        self,
        registry=None,
        *,
        model_name: str = "model",
        state: np.ndarray | None = None,
        peers: Sequence[np.ndarray] = (),
    ) -> None:
        from prometheus_client import REGISTRY

        self.model_name = model_name
        self._lock = threading.Lock()
        self._state = np.zeros(STATE_SIZE, dtype=np.float64) if state is None else state
        if self._state.shape != (STATE_SIZE,) or self._state.dtype != np.float64:
            raise ValueError(f"state: expected {STATE_SIZE} float64 values, got {self._state.shape} {self._state.dtype}")
        self._sources = list(peers) or [self._state]
        offset, self._histograms = 0, []
        for _, _, bounds in _HISTOGRAMS:
            self._histograms.append(_Histogram(bounds, self._state, offset))
            offset += _Histogram.size(bounds)
        self._ttft, self._itl, self._tpot, self._e2e = self._histograms
        self._registry = REGISTRY if registry is None else registry
        self._collector = _Collector(self)
        self._registry.register(self._collector)  # ValueError if these names are registered already

    def unregister(self) -> None:
        self._registry.unregister(self._collector)

    def reset_gauges(self) -> None:
        """Running and waiting back to 0 (a restarted process takes over its predecessor's array: the
        counters go on, the requests it had are gone)."""
        with self._lock:
            self._state[_RUNNING] = self._state[_WAITING] = 0

    # --- request events ----------------------------------------------------------------------

    def request_queued(self) -> None:
        """Admitted, waiting for a stream worker / the engine."""
        with self._lock:
            self._state[_WAITING] += 1

    def request_started(self) -> None:
        """Sent to the engine (was queued)."""
        with self._lock:
            self._state[_WAITING] -= 1
            self._state[_RUNNING] += 1

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
        cached_tokens: int = 0,
    ) -> None:
        """A request ended. `status`: a finish reason (`stop`, `length`, `abort` for a client that
        went away) or the HTTP status code of an error (`"400"`, `"429"`, `"503"`). `was`: the
        gauge it leaves, `running`, `waiting` (ended before it started) or `none` (refused before
        it was queued, e.g. a 429)."""
        gaps_are_summary = isinstance(itl_gaps_s, ItlSummary)
        state = self._state
        with self._lock:
            if was == "running":
                state[_RUNNING] -= 1
            elif was == "waiting":
                state[_WAITING] -= 1
            elif was != "none":
                raise ValueError(f"was: expected running, waiting or none, got {was!r}")
            if status in FINISH_REASONS:
                state[_SUCCESS + FINISH_REASONS.index(status)] += 1
            else:
                state[_error_index(status)] += 1
            state[_PROMPT] += max(prompt_tokens, 0)
            state[_CACHED] += max(cached_tokens, 0)
            state[_GENERATION] += max(completion_tokens, 0)
            state[_DRAFT] += max(draft_tokens, 0)
            state[_ACCEPTED] += max(accepted_draft_tokens, 0)
            if schema_valid is not None:
                state[_GUIDED + GUIDED_RESULTS.index("valid" if schema_valid else "invalid")] += 1
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
            total = self._sources[0].copy()
        for source in self._sources[1:]:  # other processes' arrays: read as they are (each value whole)
            total += source
        offset = 0
        for name, doc, bounds in _HISTOGRAMS:
            counts = np.cumsum(total[offset:offset + len(bounds) + 1])
            buckets = list(zip([_float_label(b) for b in bounds] + ["+Inf"], (float(c) for c in counts)))
            family = HistogramMetricFamily(PREFIX + name, doc, labels=labels)
            family.add_metric(values, buckets, float(total[offset + len(bounds) + 1]))
            offset += _Histogram.size(bounds)
            yield family
        for name, doc, index in (
            ("prompt_tokens", "Number of prompt (input) tokens of finished requests.", _PROMPT),
            ("generation_tokens", "Number of generation (output) tokens of finished requests.", _GENERATION),
            ("prompt_tokens_cached", "Prompt tokens of finished requests whose KV cache the engine reused.", _CACHED),
            ("spec_decode_num_draft_tokens", "Draft tokens proposed by speculative decoding.", _DRAFT),
            ("spec_decode_num_accepted_tokens", "Draft tokens accepted by speculative decoding.", _ACCEPTED),
        ):
            family = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            family.add_metric(values, float(total[index]))
            yield family
        for name, doc, index in (
            ("num_requests_running", "Number of requests streaming from the engine.", _RUNNING),
            ("num_requests_waiting", "Number of admitted requests not yet started.", _WAITING),
        ):
            family = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            family.add_metric(values, float(total[index]))
            yield family
        success = CounterMetricFamily(
            PREFIX + "request_success", "Count of finished requests by finish reason.",
            labels=[*labels, "finished_reason"],
        )
        for i, reason in enumerate(FINISH_REASONS):
            success.add_metric([*values, reason], float(total[_SUCCESS + i]))
        yield success
        errors = CounterMetricFamily(
            PREFIX + "request_error", "Total request errors, labeled by HTTP status code.",
            labels=[*labels, "http_code"],
        )
        for index in np.flatnonzero(total[_ERRORS:_OTHER_ERROR + 1]):
            code = "other" if _ERRORS + index == _OTHER_ERROR else str(_FIRST_CODE + int(index))
            errors.add_metric([*values, code], float(total[_ERRORS + index]))
        yield errors
        guided = CounterMetricFamily(
            PREFIX + GUIDED_OUTPUTS,
            "Completed guided JSON answers validated against the request's JSON Schema (jsonschema), by result.",
            labels=[*labels, "result"],
        )
        for i, result in enumerate(GUIDED_RESULTS):
            guided.add_metric([*values, result], float(total[_GUIDED + i]))
        yield guided


def _error_index(status: str) -> int:
    if status.isdigit() and _FIRST_CODE <= int(status) <= _LAST_CODE:
        return _ERRORS + int(status) - _FIRST_CODE
    return _OTHER_ERROR


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
        for name in ("prompt_tokens", "generation_tokens", "prompt_tokens_cached", "spec_decode_num_draft_tokens",
                     "spec_decode_num_accepted_tokens", "request_success", "request_error", GUIDED_OUTPUTS):
            names.append(CounterMetricFamily(PREFIX + name, ""))
        for name in ("num_requests_running", "num_requests_waiting"):
            names.append(GaugeMetricFamily(PREFIX + name, ""))
        return names


# The front's guide compile service (guides.compile_service) on /metrics: one per replica, read from its stats
# file by every process that serves /metrics (the same values whichever answers; never summed).
# (name, type, help, stats field)
GUIDE_SERIES = (
    ("guide_cache_bytes", "gauge", "Bytes of checked guides the front keeps (verdicts, refusals included).", "bytes"),
    ("guide_cache_limit_bytes", "gauge", "The bound of the front's guide cache in bytes (runtime.guides.cache_bytes).", "limit_bytes"),
    ("guide_cache_entries", "gauge", "Checked guides the front keeps.", "entries"),
    ("guide_cache_hits", "counter", "Guides answered from the front's cache or by a compile already running.", "hits"),
    ("guide_cache_misses", "counter", "Guides the front had to check and compile.", "misses"),
    ("guide_cache_evictions", "counter", "Checked guides dropped to keep the front's cache within its bytes.", "evictions"),
    ("guide_compiles", "counter", "Guides checked and compiled by the front's compile processes.", "compiles"),
    ("guide_compile_seconds", "counter", "Seconds the front's compile processes spent on guides.", "compile_seconds"),
    ("guide_compile_processes", "gauge", "The front's compile processes up.", "workers"),
    ("guide_compile_budget_seconds", "gauge", "What one guide may cost (runtime.guides.compile_budget_s).", "budget_s"),
)
GUIDE_REFUSALS = (("engine", "refused"), ("budget", "over_budget"), ("busy", "busy"))  # (reason label, stats field)


class GuideCacheCollector:
    """A prometheus_client custom collector over `stats()` (`guides.compile_client.GuideServiceClient.stats`)."""

    def __init__(self, stats, *, model_name: str = "model") -> None:
        self._stats = stats
        self.model_name = model_name

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self._stats()
        labels, values = ["model_name"], [self.model_name]
        for name, kind, doc, field in GUIDE_SERIES:
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(PREFIX + name, doc, labels=labels)
            family.add_metric(values, float(stats.get(field, 0.0)))
            yield family
        refusals = CounterMetricFamily(
            PREFIX + "guide_refusals", "Guides the front refused, by reason: engine (the engine or the schema),"
            " budget (over runtime.guides.compile_budget_s), busy (no compile process in time: 429).",
            labels=[*labels, "reason"],
        )
        for reason, field in GUIDE_REFUSALS:
            refusals.add_metric([*values, reason], float(stats.get(field, 0.0)))
        yield refusals

    def describe(self) -> list:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        names = [(CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(PREFIX + name, "") for name, kind, _, _ in GUIDE_SERIES]
        return [*names, CounterMetricFamily(PREFIX + "guide_refusals", "")]
