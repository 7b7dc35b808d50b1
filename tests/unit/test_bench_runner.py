"""The runner and the session against an in-process scripted target (a stand-in for a network
endpoint, so that concurrency, timing and error handling can be asserted exactly)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from trtllm_truss.bench.load import ClosedLoop, OpenLoop, poisson_arrival_offsets
from trtllm_truss.bench.report import BenchReport, render_table
from trtllm_truss.bench.runner import count_output_tokens, run_level
from trtllm_truss.bench.session import BenchPlan, run_bench
from trtllm_truss.bench.targets.base import StreamChunk
from trtllm_truss.bench.workload import BenchRequest


class ScriptedTarget:
    """Emits `output_len` tokens per request, `tokens_per_response` at a time, `step_s` apart."""

    def __init__(self, name="engine", step_s=0.002, tokens_per_response=1, text=False, fail_index=None):
        self.name = name
        self.url = f"scripted://{name}"
        self.step_s = step_s
        self.tokens_per_response = tokens_per_response
        self.text = text
        self.fail_index = fail_index
        self.in_flight = 0
        self.max_in_flight = 0
        self.sent_at: list[float] = []
        self.opened = self.closed = False

    async def open(self):
        self.opened = True

    async def close(self):
        self.closed = True

    async def stream(self, request: BenchRequest):
        self.sent_at.append(time.perf_counter())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if request.index == self.fail_index:
                raise RuntimeError("Triton error: injected")
            remaining = request.output_len
            while remaining > 0:
                await asyncio.sleep(self.step_s)
                n = min(self.tokens_per_response, remaining)
                remaining -= n
                if self.text:
                    yield StreamChunk(token_count=None, text=" w" * n)
                else:
                    yield StreamChunk(token_count=n)
            yield StreamChunk(token_count=0)  # an empty final response carries no output
        finally:
            self.in_flight -= 1


class WordTokenizer:
    """Counts words: enough to check that text targets are re-tokenized after the run."""

    def encode(self, text, add_special_tokens=True):
        return list(range(len(text.split())))


def _requests(n, output_len=8):
    return [BenchRequest(i, f"prompt {i}", (1, 2, 3), output_len) for i in range(n)]


async def test_closed_loop_keeps_exactly_concurrency_streams_in_flight():
    target = ScriptedTarget(step_s=0.001)
    records = await run_level(target, _requests(24), ClosedLoop(concurrency=6))
    assert target.max_in_flight == 6
    assert [r.index for r in records] == list(range(24))
    assert all(r.ok and r.output_tokens == 8 for r in records)
    assert all(r.response_count == 8 for r in records)  # the empty final response is not an output


async def test_multi_token_responses_count_tokens_and_itl_per_token():
    target = ScriptedTarget(step_s=0.004, tokens_per_response=4)
    (record,) = await run_level(target, _requests(1, output_len=16), ClosedLoop(concurrency=1))
    assert record.output_tokens == 16 and record.response_count == 4
    # 3 response gaps of ~4 ms spread over 15 token gaps
    assert record.itl_s == pytest.approx((record.last_output_at - record.first_output_at) / 15)


async def test_open_loop_sends_on_the_poisson_schedule():
    target = ScriptedTarget(step_s=0.001)
    level = OpenLoop(request_rate=200.0)
    before = time.perf_counter()  # the runner's own start is a little later
    records = await run_level(target, _requests(20, output_len=2), level, seed=3)
    offsets = poisson_arrival_offsets(200.0, 20, seed=3)
    sent = [t - before for t in target.sent_at]
    assert len(records) == 20
    for actual, planned in zip(sent, offsets):
        assert actual >= planned  # never early
        assert actual - planned < 0.25  # and not much late, even on a busy machine


async def test_open_loop_cap_limits_requests_in_flight():
    target = ScriptedTarget(step_s=0.005)
    await run_level(target, _requests(12), OpenLoop(request_rate=1000.0, max_concurrency=3), seed=0)
    assert target.max_in_flight == 3


async def test_a_failed_request_is_recorded_and_the_level_goes_on():
    target = ScriptedTarget(fail_index=2)
    records = await run_level(target, _requests(5), ClosedLoop(concurrency=2))
    assert [r.ok for r in records] == [True, True, False, True, True]
    assert records[2].error == "RuntimeError: Triton error: injected"


async def test_a_request_past_its_timeout_fails():
    target = ScriptedTarget(step_s=0.05)
    (record,) = await run_level(target, _requests(1, output_len=100), ClosedLoop(concurrency=1), timeout_s=0.1)
    assert not record.ok and "timed out" in record.error


async def test_text_targets_are_counted_by_retokenizing_afterwards():
    target = ScriptedTarget(text=True, tokens_per_response=3)
    records = await run_level(target, _requests(3, output_len=9), ClosedLoop(concurrency=3))
    assert all(r.output_tokens is None for r in records)
    assert count_output_tokens(records, "auto", WordTokenizer()) == ("retokenized", [])
    assert [r.output_tokens for r in records] == [9, 9, 9]
    assert records[0].text_parts == []  # freed once counted


async def test_fixed_length_text_requests_count_their_requested_length():
    records = await run_level(ScriptedTarget(text=True), _requests(2, output_len=5), ClosedLoop(concurrency=2))
    records[0].text_parts = [" merged"]  # what re-tokenizing would undercount
    assert count_output_tokens(records, "auto", None, fixed_length=True) == ("requested", [])
    assert [r.output_tokens for r in records] == [5, 5]


async def test_an_engine_that_ignores_ignore_eos_is_reported():
    records = await run_level(ScriptedTarget(), _requests(3, output_len=6), ClosedLoop(concurrency=3))
    records[1].output_tokens = 4  # stopped at its end token despite the fixed-length request
    method, warnings = count_output_tokens(records, "auto", None, fixed_length=True)
    assert method == "exact"
    assert len(warnings) == 1 and warnings[0].startswith("1 fixed-length request(s) produced a different number")


async def test_requested_counting_trusts_the_requested_length():
    records = await run_level(ScriptedTarget(text=True), _requests(2, output_len=5), ClosedLoop(concurrency=1))
    assert count_output_tokens(records, "requested", None) == ("requested", [])
    assert [r.output_tokens for r in records] == [5, 5]


async def test_text_counting_without_a_tokenizer_is_an_error():
    records = await run_level(ScriptedTarget(text=True), _requests(1), ClosedLoop(concurrency=1))
    with pytest.raises(ValueError, match="tokenizer"):
        count_output_tokens(records, "auto", None)


async def test_compare_session_report_json_schema(tmp_path):
    direct = ScriptedTarget("engine", step_s=0.001)
    full = ScriptedTarget("http", step_s=0.006, text=True)
    plan = BenchPlan(
        targets=[direct, full],
        levels=[ClosedLoop(concurrency=2), ClosedLoop(concurrency=4)],
        requests=_requests(8, output_len=6),
        workload={"num_requests": 8, "seed": 0},
        compare=("engine", "http"),
        warmup_requests=2,
        fixed_length=False,
        settings={"ignore_eos": "min_length"},
    )
    report = await run_bench(plan, WordTokenizer())
    assert direct.opened and direct.closed and full.closed
    path = tmp_path / "bench.json"
    report.write_json(path)
    data = json.loads(path.read_text())

    assert data["schema_version"] == 1
    assert set(data) >= {"created_at", "machine", "workload", "settings", "runs", "comparisons", "ratio",
                         "added_ttft_p50_ms", "warnings"}
    assert [(r["target"], r["level"]["concurrency"]) for r in data["runs"]] == [
        ("engine", 2), ("http", 2), ("engine", 4), ("http", 4)
    ]
    run = data["runs"][0]
    assert run["level"]["kind"] == "closed" and run["token_counting"] == "exact"
    assert data["runs"][1]["token_counting"] == "retokenized"
    metrics = run["metrics"]
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        assert set(metrics[key]) == {"count", "mean", "p50", "p90", "p99", "max"}
    assert metrics["output_tokens_total"] == 48 and metrics["succeeded"] == 8
    assert metrics["output_tokens_per_s"] > 0 and metrics["requests_per_s"] > 0
    assert run["client_cpu_s"] >= 0

    # top-level ratio: full over direct output tokens/s at the highest concurrency compared
    engine4, http4 = data["runs"][2]["metrics"], data["runs"][3]["metrics"]
    assert data["ratio"] == pytest.approx(http4["output_tokens_per_s"] / engine4["output_tokens_per_s"])
    assert data["added_ttft_p50_ms"] == pytest.approx(http4["ttft_ms"]["p50"] - engine4["ttft_ms"]["p50"])
    # (full over direct, pinned above; not "< 1" from the scripted steps' lengths: a busy machine's sleeps of 1 ms
    # and 6 ms both overrun to its scheduling tick, and CI saw 1.11)
    assert data["ratio"] > 0
    assert [c["level"]["concurrency"] for c in data["comparisons"]] == [2, 4]

    # the file reads back into the typed report
    assert BenchReport.read_json(path).ratio == data["ratio"]


async def test_table_and_plot_render(tmp_path):
    from rich.console import Console

    from trtllm_truss.bench.plot import write_plot

    plan = BenchPlan(
        targets=[ScriptedTarget("engine"), ScriptedTarget("ensemble", text=True)],
        levels=[OpenLoop(request_rate=500.0), OpenLoop(request_rate=1000.0)],
        requests=_requests(6, output_len=4),
        workload={},
        compare=("engine", "ensemble"),
        warmup_requests=0,
    )
    report = await run_bench(plan, WordTokenizer())
    assert [r.token_counting for r in report.runs] == ["exact", "requested"] * 2  # fixed-length by default
    console = Console(record=True, width=200)
    console.print(render_table(report))
    text = console.export_text()
    assert "engine" in text and "ensemble" in text and "1000 req/s" in text and "ratio" in text
    png = write_plot(report, tmp_path / "plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_rounds_alternate_targets_and_pool_their_figures():
    order: list[str] = []

    class Recording(ScriptedTarget):
        async def stream(self, request):
            if request.index == 0:
                order.append(self.name)
            async for chunk in super().stream(request):
                yield chunk

    plan = BenchPlan(
        targets=[Recording("engine", step_s=0.001), Recording("ensemble", step_s=0.001, text=True)],
        levels=[ClosedLoop(concurrency=2)],
        requests=_requests(4, output_len=3),
        workload={},
        compare=("engine", "ensemble"),
        warmup_requests=0,
        rounds=3,
    )
    started = time.perf_counter()
    report = await run_bench(plan, None)
    wall_s = time.perf_counter() - started
    assert order == ["engine", "ensemble"] * 3  # alternating, not all rounds of one target first
    assert [r.target for r in report.runs] == ["engine", "ensemble"]
    engine = report.runs[0].metrics
    assert engine.requests == 12 and engine.output_tokens_total == 36
    # throughput uses the sum of the rounds' wall times, not the span that includes the other target
    assert engine.output_tokens_per_s == pytest.approx(36 / engine.duration_s)
    assert engine.duration_s < 0.8 * wall_s  # the ensemble's rounds took about the other half


class Asking(ScriptedTarget):
    """Records the length each request asks for (`asked`: request index -> output_len)."""

    def __init__(self, name: str, **kwargs):
        super().__init__(name, **kwargs)
        self.asked: dict[int, int] = {}

    async def stream(self, request):
        self.asked[request.index] = request.output_len
        async for chunk in super().stream(request):
            yield chunk


async def test_matched_lengths_make_the_unguided_requests_ask_what_the_guided_ones_produced():
    class EndsEarly(ScriptedTarget):
        """Request i stops after i + 1 tokens, as a guide completing before the asked length."""

        async def stream(self, request):
            async for chunk in super().stream(BenchRequest(request.index, request.prompt, request.input_ids,
                                                           min(request.output_len, request.index + 1))):
                yield chunk

    unguided = Asking("engine", step_s=0.0005)
    plan = BenchPlan(
        targets=[unguided, EndsEarly("engine_guided", step_s=0.0005)],
        levels=[ClosedLoop(concurrency=2)],
        requests=_requests(4, output_len=8),
        workload={},
        compare=("engine", "engine_guided"),
        warmup_requests=0,
        lengths_from="engine_guided",
    )
    report = await run_bench(plan, None)
    assert unguided.asked == {0: 1, 1: 2, 2: 3, 3: 4}
    assert report.matched_lengths == {"concurrency 2": {"mean": 2.5, "min": 1, "max": 4, "unmatched": 0}}
    engine, guided = (r.metrics for r in report.runs)
    assert engine.output_tokens_total == guided.output_tokens_total == 10
    assert report.warnings == []  # the guided target's early ends are the point, not an ignored ignore-EOS


async def test_a_request_failing_in_the_lengths_pass_keeps_its_length_and_is_reported():
    unguided = Asking("engine", step_s=0.0005)
    plan = BenchPlan(
        targets=[unguided, ScriptedTarget("engine_guided", step_s=0.0005, fail_index=1)],
        levels=[ClosedLoop(concurrency=2)],
        requests=_requests(3, output_len=5),
        workload={},
        warmup_requests=0,
        lengths_from="engine_guided",
    )
    report = await run_bench(plan, None)
    assert unguided.asked == {0: 5, 1: 5, 2: 5}
    assert report.matched_lengths["concurrency 2"]["unmatched"] == 1
    assert any("1 request(s) failed in the engine_guided pass" in w for w in report.warnings), report.warnings
