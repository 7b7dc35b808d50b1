"""Trace replay: the openai target against a real aiohttp server on loopback speaking OpenAI's streamed
completions (usage with cached tokens, the replica named by header or by Dynamo's nvext), and the replay
loop and its report against an in-process fleet of replicas with prefix caches of their own."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web

from trtllm_truss.bench.replay import ReplayPlan, replay, replay_report, summary_lines, warmup_requests, write_report
from trtllm_truss.bench.reuse_bound import token_blocks
from trtllm_truss.bench.runner import count_output_tokens
from trtllm_truss.bench.targets import make_target
from trtllm_truss.bench.targets.base import StreamChunk
from trtllm_truss.bench.trace import TraceRequest, TraceSynthesis, synthesize
from trtllm_truss.bench.workload import BenchRequest

VOCABULARY = list(range(100, 400))


def _sse(event) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


@pytest.fixture
async def completions_server():
    bodies: list[dict] = []

    async def models(_request):
        return web.json_response({"object": "list", "data": [{"id": "served-name", "object": "model"}]})

    async def completions(request):
        body = await request.json()
        bodies.append(body)
        if body["max_tokens"] == 999:
            return web.Response(status=400, text='{"error": {"message": "max_tokens: too many"}}')
        headers = {"Content-Type": "text/event-stream"}
        if body["max_tokens"] == 2:
            headers["x-replica"] = "replica-b"
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        nvext = {"nvext": {"worker_id": {"prefill_worker_id": 7, "decode_worker_id": 42}}} if "nvext" in body else {}
        for word in ("one", " two"):
            await response.write(_sse({"choices": [{"index": 0, "text": word}], "usage": None} | nvext))
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": 2, "total_tokens": len(body["prompt"]) + 2}
        if body["max_tokens"] != 3:  # max_tokens 3: a server that does not report cached tokens
            usage["prompt_tokens_details"] = {"cached_tokens": 16}
        await response.write(_sse({"choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", bodies
    await runner.cleanup()


async def _chunks(target, request):
    return [c async for c in target.stream(request)]


async def test_openai_target_sends_token_ids_and_reads_usage_and_replica(completions_server):
    url, bodies = completions_server
    target = make_target("openai", url, "end_id")
    await target.open()
    try:
        assert target.model == "served-name"  # the first listed model
        plain = await _chunks(target, BenchRequest(0, "", (5, 6, 7), 4))
        header = await _chunks(target, BenchRequest(1, "", (5,), 2))
        no_details = await _chunks(target, BenchRequest(2, "", (5,), 3))
        with pytest.raises(RuntimeError, match="HTTP 400 .*too many"):
            await _chunks(target, BenchRequest(3, "", (5,), 999))
        target.dynamo_worker_id = True
        dynamo = await _chunks(target, BenchRequest(4, "", (5,), 4))
    finally:
        await target.close()
    assert bodies[0] == {"model": "served-name", "prompt": [5, 6, 7], "max_tokens": 4, "stream": True,
                         "stream_options": {"include_usage": True}, "ignore_eos": True}
    assert "".join(c.text or "" for c in plain) == "one two"
    assert [(c.usage_output_tokens, c.cached_tokens) for c in plain][-1] == (2, 16)
    assert {c.replica for c in plain} == {None}
    assert header[0].replica == "replica-b" and {c.replica for c in header[1:]} == {None}
    assert no_details[-1].cached_tokens is None  # usage without prompt_tokens_details: not said
    assert bodies[-1]["nvext"] == {"extra_fields": ["worker_id"]}
    assert [c.replica for c in dynamo if c.replica] == ["42"]  # told once, the decode worker


async def test_openai_target_refuses_a_server_without_models(completions_server):
    from trtllm_truss.bench.targets import TargetError

    url, _ = completions_server
    target = make_target("openai", url + "/nowhere")
    with pytest.raises(TargetError, match="no model"):
        await target.open()


class PrefixCacheFleet:
    """Replicas with a prefix cache each (16-token blocks), round-robin or all on one, answering with
    the cached tokens and the replica, as a fleet's frontend would."""

    name = "openai"
    url = "fleet://"

    def __init__(self, replicas: int, step_s: float = 0.001):
        self.caches: list[set] = [set() for _ in range(replicas)]
        self.step_s = step_s
        self.sent: list[tuple[int, float]] = []
        self.in_flight = self.max_in_flight = 0

    async def open(self):
        pass

    async def close(self):
        pass

    async def stream(self, request):
        self.sent.append((request.index, time.perf_counter()))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        replica = len(self.sent) % len(self.caches)
        cache, chain, hit = self.caches[replica], (), 0
        for block in token_blocks(request.input_ids, 16):
            chain += (block,)
            if chain not in cache:
                break
            hit += 1
        chain = ()
        for block in token_blocks(request.input_ids, 16):
            chain += (block,)
            cache.add(chain)
        try:
            for _ in range(request.output_len):
                await asyncio.sleep(self.step_s)
                yield StreamChunk(token_count=1)
            yield StreamChunk(token_count=None, cached_tokens=hit * 16, replica=f"r{replica}")
        finally:
            self.in_flight -= 1


def _prompts(time_scale=1.0):
    rows = [((0, 1), 20), ((0, 1, 2), 40), ((0, 1, 2, 3), 60), ((5,), 80), ((0, 1, 2, 3, 4), 100)]
    trace = [TraceRequest(timestamp=t, input_length=len(ids) * 512, output_length=3, hash_ids=ids) for ids, t in rows]
    return synthesize(trace, TraceSynthesis(block_tokens=16), VOCABULARY, time_scale=time_scale)


async def test_replay_at_timestamps_with_one_cache_reaches_the_bound():
    prompts = _prompts()
    fleet = PrefixCacheFleet(replicas=1)
    plan = ReplayPlan(prompts=prompts, kv_block_tokens=16, lru_pool_blocks=4)
    start = time.perf_counter()
    records = await replay(fleet, plan)
    assert [i for i, _ in fleet.sent] == [0, 1, 2, 3, 4]
    # 20 ms apart in the trace: none leaves before its arrival time (the event loop's clock resolution aside)
    assert all(sent - start >= p.arrival_s - 0.002 for (_, sent), p in zip(fleet.sent, prompts))
    assert [p.arrival_s for p in prompts] == [0.0, 0.02, 0.04, 0.06, 0.08]
    count_output_tokens(records, "auto", None)
    report = replay_report(plan, records, trace={"requests": 5}, settings={})
    reuse = report["reuse"]
    # Bound: 0 + 32 + 48 + 0 + 64 tokens; one cache sees every earlier prefix.
    assert reuse["bound"]["cached_tokens_of_succeeded"] == 144 == reuse["cached_tokens"]
    assert reuse["cached_over_bound"] == 1.0 and reuse["cached_reported"] == 5
    assert reuse["lru"]["cached_tokens"] == 0 + 32 + 48 + 0 + 48  # 4 blocks: [5] pushed the chain's tail (block 3) out
    assert report["per_replica"] == {
        "r0": {"requests": 5, "input_tokens": 240, "cached_tokens": 144, "output_tokens": 15, "bound_tokens": 144}}
    assert reuse["bound_given_routing"] == 144
    assert report["metrics"]["ttft_ms"]["p50"] is not None and report["warnings"] == []


async def test_replay_back_to_back_round_robin_misses_reuse_and_reports_per_replica(tmp_path):
    prompts = _prompts(time_scale=1000.0)  # arrivals ignored with a concurrency
    fleet = PrefixCacheFleet(replicas=2)
    plan = ReplayPlan(prompts=prompts, concurrency=1, kv_block_tokens=16)
    start = time.perf_counter()
    records = await replay(fleet, plan)
    assert time.perf_counter() - start < 5 and fleet.max_in_flight == 1
    count_output_tokens(records, "auto", None)
    report = replay_report(plan, records, trace={"requests": 5, "truncated": 0}, settings={"pace": "concurrency"})
    # Replicas alternate r1, r0, r1, r0, r1: r1 serves requests 0, 2, 4 (it reuses 32, then 64 tokens);
    # request 1 on r0 misses the prefix request 0 left on r1.
    assert [r.replica for r in records] == ["r1", "r0", "r1", "r0", "r1"]
    assert report["reuse"]["cached_tokens"] == 32 + 64
    assert report["reuse"]["cached_over_bound"] == pytest.approx(96 / 144)
    assert set(report["per_replica"]) == {"r0", "r1"} and report["per_replica"]["r0"]["requests"] == 2
    # Unbounded pools would have kept no more: the split, not eviction, lost the rest.
    assert report["reuse"]["bound_given_routing"] == 96
    assert [report["per_replica"][r]["bound_tokens"] for r in ("r0", "r1")] == [0, 96]
    path = tmp_path / "replay.json"
    write_report(report, path)
    assert json.loads(path.read_text())["records"][0][:2] == [0, report["records"][0][1]]
    assert any("cached / bound: 0.667" in line for line in summary_lines(report))


def test_warmup_prompts_share_no_block_with_a_trace():
    warm = warmup_requests(VOCABULARY, 16, 3)
    trace_blocks = {b for p in _prompts() for b in token_blocks(p.request.input_ids, 16)}
    assert len(warm) == 3 and all(len(r.input_ids) == 16 for r in warm)
    assert not trace_blocks & {tuple(r.input_ids) for r in warm}


EMBEDDED = __import__("pathlib").Path(__file__).resolve().parents[2] / "data" / "embedded-llama"


@pytest.mark.parametrize("argv, message", [
    ([], "give --url"),
    (["--url", "http://127.0.0.1:9", "--request-rate", "2"], "not --request-rate"),
    (["--url", "http://127.0.0.1:9", "--concurrency", "1,2"], "one --concurrency"),
    (["--url", "http://127.0.0.1:9", "--compare"], "leave out --compare"),
])
def test_bench_trace_options_exit_2_naming_the_option(argv, message, tmp_path, capsys):
    from trtllm_truss.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1]}\n')
    assert main(["bench", ".", "--trace", str(trace), *argv]) == 2
    assert message in capsys.readouterr().err.replace("\n", "")


def test_bench_trace_replays_through_the_cli_and_writes_the_report(tmp_path, capsys):
    """The whole command against a stdlib HTTP server in a thread (the command runs its own event loop)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from trtllm_truss.cli import main

    if not (EMBEDDED / "tokenizer.json").is_file():
        pytest.skip("the embedded model is not generated in this checkout")
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self._send(b'{"data": [{"id": "m"}]}', "application/json")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            cached = 16 if body["prompt"][:16] in [b["prompt"][:16] for b in seen[:-1]] else 0
            usage = {"completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": cached}}
            self._send(_sse({"choices": [{"text": "x"}]}) + _sse({"choices": [], "usage": usage}) + b"data: [DONE]\n\n",
                       "text/event-stream")

        def _send(self, payload: bytes, kind: str):
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2 + i]}) + "\n"
                             for i in range(3)))
    out = tmp_path / "r.json"
    try:
        code = main(["bench", ".", "--trace", str(trace), "--url", f"http://127.0.0.1:{server.server_address[1]}",
                     "--tokenizer", str(EMBEDDED), "--trace-block-tokens", "16", "--warmup", "1", "--json", str(out)])
    finally:
        server.shutdown()
    assert code == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert len(seen) == 4 and len(seen[1]["prompt"]) == 32 and seen[1]["model"] == "m"  # 1 warm-up + 3
    assert report["reuse"]["cached_tokens"] == 32 == report["reuse"]["bound"]["cached_tokens_of_succeeded"]
    assert report["trace"]["synthesis"]["block_tokens"] == 16 and report["settings"]["pace"] == "timestamps"
    assert "cached / bound: 1.000" in capsys.readouterr().out


def test_a_server_that_never_says_cached_tokens_is_warned_about():
    from trtllm_truss.bench.stats import RequestRecord

    prompts = _prompts()
    records = [RequestRecord(index=p.request.index, input_tokens=p.request.input_len, requested_output_tokens=3,
                             sent_at=0.0, first_output_at=0.01, finished_at=0.02, output_tokens=3) for p in prompts]
    report = replay_report(ReplayPlan(prompts=prompts, kv_block_tokens=16), records, trace={}, settings={})
    assert report["reuse"]["cached_tokens"] == 0 and report["reuse"]["cached_reported"] == 0
    assert report["reuse"]["cached_over_bound"] == 0.0 and "bound_given_routing" not in report["reuse"]
    assert any("cached_tokens" in w for w in report["warnings"])
