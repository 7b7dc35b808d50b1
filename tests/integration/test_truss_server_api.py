"""This repository served by truss's own model server (truss 0.18.35, no docker) on the embedded default.

One server for the module (startup is the expensive part): native predict streamed and as JSON,
malformed requests, the official `openai` client on both OpenAI routes, client disconnect freeing the
engine slot, and - last, because it disturbs the server - tritonserver killed and recovered.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import yaml

from trtllm_truss.fronts.truss_server import TrussServer
from truss_serving import FRONTS, REPO_ROOT, poll, serve_front

pytestmark = [pytest.mark.truss_server, pytest.mark.triton, pytest.mark.slow, pytest.mark.torch]

PREDICT = "/v1/models/model:predict"
READY = "/v1/models/model"
# Limits of the embedded default, read from config.yaml (model_metadata.trt_llm.build)
_BUILD = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())["model_metadata"]["trt_llm"]["build"]
MAX_INPUT_LEN, MAX_OUTPUT_LEN, MAX_BATCH_SIZE = _BUILD["max_input_len"], _BUILD["max_output_len"], _BUILD["max_batch_size"]
QUEUED_BEYOND_BATCH = 4
# The stand-in engine's gauge of requests it holds (running or waiting), on Triton's /metrics.
ACTIVE_REQUESTS_METRIC = "trtllm_standin_active_requests"
CANCELLED_REQUESTS_METRIC = "trtllm_standin_cancelled_requests_total"


@pytest.fixture(scope="module", params=FRONTS)
def server(request, tmp_path_factory) -> Iterator[TrussServer]:
    yield from serve_front(request.param, tmp_path_factory.mktemp("truss_server"), {})


@pytest.fixture(scope="module", params=FRONTS)
def slow_server(request, tmp_path_factory) -> Iterator[TrussServer]:
    """The synthetic engine at 20 ms a step: a full-length generation lasts seconds, so a request seen
    running after the client left can only be freed by cancellation."""
    env = {
        "TRTLLM_RUNTIME__PYTORCH__SYNTHETIC": '{"step_time_ms": 20}',
        # batch 32 + 4 queued: the 37th request in flight is refused with 429
        "TRTLLM_RUNTIME__MAX_QUEUED_REQUESTS": str(QUEUED_BEYOND_BATCH),
    }
    yield from serve_front(request.param, tmp_path_factory.mktemp("truss_server_slow"), env)


@pytest.fixture(scope="module")
def http(server: TrussServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        yield client


@pytest.fixture(scope="module")
def oai(server: TrussServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-checked", max_retries=0, timeout=60.0)


def ready_in_every_process(server: TrussServer, connections: int = 8) -> bool:
    """Ready and answering on several fresh connections in a row: under the direct front each may reach
    another of its processes (the kernel spreads new connections over them). Readiness alone can lead a
    process's stream workers by a moment after a tritonserver restart, so a tiny request
    is answered too."""
    for _ in range(connections):
        with httpx.Client(base_url=server.url, timeout=30) as fresh:
            if fresh.get(READY).status_code != 200:
                return False
            if fresh.post(PREDICT, json={"prompt": "hi", "max_tokens": 1, "stream": False}).status_code != 200:
                return False
    return True


def tritonserver_of(server: TrussServer):
    processes = server.descendants("tritonserver")
    assert len(processes) == 1, f"expected one tritonserver under the truss server, found {processes}"
    return processes[0]


def metrics_url(server: TrussServer) -> str:
    cmdline = " ".join(tritonserver_of(server).cmdline())
    port = re.search(r"--metrics-port[= ](\d+)", cmdline)
    assert port, cmdline
    return f"http://127.0.0.1:{port.group(1)}/metrics"


def standin_metric(server: TrussServer, name: str) -> float:
    text = httpx.get(metrics_url(server), timeout=5).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    assert values, f"{name} not exported by Triton"
    return sum(values)


def active_requests(server: TrussServer) -> float:
    return standin_metric(server, ACTIVE_REQUESTS_METRIC)


# --------------------------------------------------------------------------------- native predict


def test_predict_streams_text_chunks(http: httpx.Client):
    chunks = []
    with http.stream(
        "POST", PREDICT, json={"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True}
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/plain")
        for chunk in response.iter_text():
            chunks.append(chunk)
    assert len(chunks) > 1, "expected the answer in several chunks"
    assert "".join(chunks).strip()


def test_predict_json_matches_stream_and_reports_usage(http: httpx.Client):
    body = {"prompt": "The history of the", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    streamed = http.post(PREDICT, json=body).text
    answer = http.post(PREDICT, json={**body, "stream": False})
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["text"] == streamed  # greedy: same tokens either way
    assert result["finish_reason"] == "length"
    usage = result["usage"]
    assert usage["completion_tokens"] == 16
    assert usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + 16


def test_predict_chat_messages_use_the_chat_template(http: httpx.Client):
    answer = http.post(
        PREDICT,
        json={
            "messages": [{"role": "user", "content": "Say something"}],
            "max_tokens": 8,
            "stream": False,
            "ignore_eos": True,
        },
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 8


LONG_PROMPT = "word " * (MAX_INPUT_LEN + 10)

MALFORMED = [
    ({"prompt": "hi", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": MAX_OUTPUT_LEN + 1}, "max_tokens"),
    ({"prompt": LONG_PROMPT, "max_tokens": 4}, "prompt"),
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "temperature": "warm"}, "temperature"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "top_k": -1}, "top_k"),
    ({"prompt": "hi", "seed": -1}, "seed"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "hi", "presence_penalty": 5}, "presence_penalty"),
    ({"prompt": "hi", "frequency_penalty": -5}, "frequency_penalty"),
    ({"prompt": "hi", "min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ({"prompt": "hi", "beam_width": 0}, "beam_width"),
    ({"prompt": "hi", "beam_width": 4, "stream": False}, "beam_width"),
    ({"prompt": "hi", "stop_words_list": "."}, "stop_words_list"),
    ({"prompt": "hi", "bad_words_list": [1]}, "bad_words_list[0]"),
    ({"prompt": "hi", "end_id": -7}, "end_id"),
    ({"prompt": "hi", "end_id": 10**7}, "end_id"),
    ({"prompt": "hi", "stream": "yes"}, "stream"),
    ({"prompt": "hi", "max_new_tokens": 5}, "max_new_tokens"),
    ({"prompt": ["a"]}, "prompt"),
    ({"max_tokens": 5}, "prompt, messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
]


@pytest.mark.parametrize("body, field", MALFORMED, ids=[f for _, f in MALFORMED])
def test_malformed_predict_is_4xx_naming_the_field(http: httpx.Client, body, field):
    answer = http.post(PREDICT, json=body)
    assert 400 <= answer.status_code < 500, answer.text
    assert f"{field}:" in answer.json()["error"], answer.text


def test_malformed_predict_leaves_the_server_serving(http: httpx.Client):
    assert http.post(PREDICT, content=b"{not json").status_code == 400
    assert http.post(PREDICT, json={"prompt": "still there", "max_tokens": 2, "stream": False}).status_code == 200


# --------------------------------------------------------------------------------- OpenAI routes


def test_openai_chat_completion(oai: openai.OpenAI):
    completion = oai.chat.completions.create(
        model="embedded", messages=[{"role": "user", "content": "Hello"}], max_tokens=12, temperature=0
    )
    choice = completion.choices[0]
    assert completion.object == "chat.completion" and completion.model == "embedded"
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage.completion_tokens <= 12 and completion.usage.prompt_tokens > 0


def test_openai_chat_stream_with_usage(oai: openai.OpenAI):
    chunks = list(
        oai.chat.completions.create(
            model="embedded",
            messages=[{"role": "user", "content": "Tell me a story"}],
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text and finish == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10


def greedy_completion(max_tokens: int) -> dict:
    return {
        "model": "embedded",
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }


def test_openai_completions_stream_and_not(oai: openai.OpenAI):
    body = greedy_completion(10)
    whole = oai.completions.create(**body)
    streamed = "".join(c.choices[0].text for c in oai.completions.create(**body, stream=True) if c.choices)
    assert whole.choices[0].text == streamed
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 10


def test_openai_stop_sequence_is_removed(oai: openai.OpenAI):
    body = greedy_completion(30)
    full = oai.completions.create(**body).choices[0].text
    # a 3-character stop string from the middle of the greedy continuation, not all whitespace
    start = next(i for i in range(len(full) // 2, len(full) - 3) if full[i : i + 3].strip())
    stop = full[start : start + 3]
    stopped = oai.completions.create(**body, stop=[stop]).choices[0]
    assert stopped.text == full[: full.index(stop)] and stopped.finish_reason == "stop"


@pytest.mark.parametrize(
    "extra, field",
    [({"n": 0}, "n"), ({"logit_bias": {"1": 2}}, "logit_bias"), ({"max_tokens": MAX_OUTPUT_LEN + 1}, "max_tokens")],
)
def test_openai_rejections_name_the_field(oai: openai.OpenAI, extra, field):
    with pytest.raises(openai.APIStatusError) as caught:
        oai.chat.completions.create(model="embedded", messages=[{"role": "user", "content": "x"}], **extra)
    assert 400 <= caught.value.status_code < 500 and f"{field}:" in str(caught.value)


async def test_concurrent_requests_all_complete(server: TrussServer):
    """16 requests at once (half streamed): none lost, none serialised behind predict_concurrency."""

    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {"prompt": f"Story number {i}", "max_tokens": 12, "ignore_eos": True, "stream": i % 2 == 0}
        if body["stream"]:
            async with client.stream("POST", PREDICT, json=body) as response:
                assert response.status_code == 200
                return len([chunk async for chunk in response.aiter_text() if chunk])
        answer = await client.post(PREDICT, json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(base_url=server.url, timeout=120.0) as client:
        results = await asyncio.gather(*(one(client, i) for i in range(16)))
    assert all(r == 12 for r in results[1::2]), results  # exact usage on every JSON answer
    assert all(r > 0 for r in results[0::2]), results


# --------------------------------------------------------------------------------- disconnect, kill


def test_client_disconnect_cancels_the_request_and_frees_the_slot(slow_server: TrussServer):
    server = slow_server
    assert active_requests(server) == 0
    cancelled_before = standin_metric(server, CANCELLED_REQUESTS_METRIC)
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        body = {"prompt": "A very long story", "max_tokens": MAX_OUTPUT_LEN, "ignore_eos": True}
        with client.stream("POST", PREDICT, json=body) as response:
            assert response.status_code == 200
            chunks = response.iter_bytes()  # kept referenced: a dropped iterator closes the response
            next(chunks)  # generation is under way
            poll(lambda: active_requests(server) == 1, timeout_s=5, what="the request running in the engine")
        # leaving the block closed the connection mid-stream
    poll(lambda: active_requests(server) == 0, timeout_s=10, what="engine slot freed after disconnect")
    # Freed because it was cancelled, not because the generation ran to its end meanwhile.
    assert standin_metric(server, CANCELLED_REQUESTS_METRIC) == cancelled_before + 1


def test_killed_tritonserver_fails_streams_visibly_then_recovers(server: TrussServer, http: httpx.Client):
    triton = tritonserver_of(server)
    body = {"prompt": "Tell it slowly", "max_tokens": MAX_OUTPUT_LEN, "ignore_eos": True}
    started = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):  # the chunked body never completes
        with http.stream("POST", PREDICT, json=body) as response:
            assert response.status_code == 200
            for i, _ in enumerate(response.iter_bytes()):
                if i == 0:
                    os.kill(triton.pid, signal.SIGKILL)
    assert time.monotonic() - started < 30, "in-flight stream did not fail fast"

    # Meanwhile the deployment reports itself unhealthy, and new requests get a clear 503.
    poll(lambda: http.get(READY).status_code == 503, timeout_s=10, what="readiness 503 while tritonserver is down")
    refused = http.post(PREDICT, json={"prompt": "anyone?", "max_tokens": 2, "stream": False})
    assert refused.status_code == 503 and "unavailable" in refused.json()["error"], refused.text

    # The supervisor restarts tritonserver; requests succeed again.
    poll(lambda: ready_in_every_process(server), timeout_s=120, interval_s=0.5,
         what="recovery after tritonserver was killed")
    assert tritonserver_of(server).pid != triton.pid
    answer = http.post(PREDICT, json={"prompt": "Back again", "max_tokens": 4, "stream": False, "ignore_eos": True})
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4


def test_killed_tritonserver_ends_an_openai_stream_with_an_error_event(server: TrussServer, oai: openai.OpenAI):
    poll(lambda: ready_in_every_process(server), timeout_s=120, what="server ready")
    triton = tritonserver_of(server)
    stream = oai.chat.completions.create(
        model="embedded",
        messages=[{"role": "user", "content": "Go on"}],
        max_tokens=MAX_OUTPUT_LEN,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    with pytest.raises(openai.APIError, match="unavailable"):
        for i, _ in enumerate(stream):
            if i == 1:
                os.kill(triton.pid, signal.SIGKILL)
    poll(
        lambda: ready_in_every_process(server),
        timeout_s=120,
        interval_s=0.5,
        what="recovery",
    )


@pytest.mark.parametrize("stream", [True, False])
def test_over_long_prompt_is_400_naming_the_field(http: httpx.Client, stream: bool):
    # The proxy does not count prompts itself: preprocessing refuses this one, the proxy answers 400.
    answer = http.post(PREDICT, json={"prompt": "hello " * 1600, "max_tokens": 4, "stream": stream})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert "prompt:" in error and "max_input_len (1536)" in error, error
    assert http.post(PREDICT, json={"prompt": "hi", "max_tokens": 2, "stream": False}).status_code == 200


# --------------------------------------------------------------------------------- stream workers


def test_a_single_stream_gets_every_token_as_its_own_chunk(slow_server: TrussServer):
    """At low load nothing is merged: 20 ms engine steps, one HTTP chunk per token."""
    with httpx.Client(base_url=slow_server.url, timeout=60.0) as client:
        body = {"prompt": "One token at a time", "max_tokens": 12, "ignore_eos": True}
        with client.stream("POST", PREDICT, json=body) as response:
            assert response.status_code == 200
            chunks = [chunk for chunk in response.iter_raw() if chunk]
    assert len(chunks) == 12, chunks


def test_requests_beyond_the_admission_limit_get_429_with_retry_after(slow_server: TrussServer):
    limit = MAX_BATCH_SIZE + QUEUED_BEYOND_BATCH

    async def one(client: httpx.AsyncClient) -> tuple[int, str | None]:
        # 200 tokens at 20 ms a step: each request holds its slot ~4 s, so all of them overlap
        body = {"prompt": "Wait your turn", "max_tokens": 200, "ignore_eos": True, "stream": False}
        answer = await client.post(PREDICT, json=body)
        return answer.status_code, answer.headers.get("retry-after")

    async def flood() -> list[tuple[int, str | None]]:
        async with httpx.AsyncClient(base_url=slow_server.url, timeout=120.0, limits=httpx.Limits(max_connections=100)) as client:
            return await asyncio.gather(*(one(client) for _ in range(limit + 8)))

    results = asyncio.run(flood())
    refused = [r for r in results if r[0] == 429]
    assert all(status in (200, 429) for status, _ in results), results
    assert len(refused) >= 8 - 2 and all(retry == "1" for _, retry in refused), results  # ~8 over the limit
    assert len(results) - len(refused) >= limit - 2, results
    with httpx.Client(base_url=slow_server.url, timeout=60.0) as client:  # and it serves again afterwards
        assert client.post(PREDICT, json={"prompt": "after", "max_tokens": 2, "stream": False}).status_code == 200


def test_killed_stream_processes_fail_their_streams_and_are_replaced(slow_server: TrussServer):
    """The stream workers, or under the direct front (no workers) its HTTP processes: restarted either way."""
    workers = slow_server.stream_processes()
    assert workers, "no stream worker (nor direct front process) under the server"
    with httpx.Client(base_url=slow_server.url, timeout=60.0) as client:
        body = {"prompt": "A story cut short", "max_tokens": MAX_OUTPUT_LEN, "ignore_eos": True}
        with pytest.raises(httpx.RemoteProtocolError):  # the chunked body never completes
            with client.stream("POST", PREDICT, json=body) as response:
                assert response.status_code == 200
                for i, _ in enumerate(response.iter_bytes()):
                    if i == 0:
                        for worker in workers:
                            os.kill(worker.pid, signal.SIGKILL)
        old = {w.pid for w in workers}
        poll(
            lambda: len(slow_server.stream_processes()) == len(workers)
            and not old & {w.pid for w in slow_server.stream_processes()},
            timeout_s=60,
            what="stream processes restarted",
        )
        answer = poll(
            lambda: (r := client.post(PREDICT, json={"prompt": "again", "max_tokens": 3, "stream": False, "ignore_eos": True}))
            .status_code == 200 and r,
            timeout_s=30,
            what="a request served by the new worker",
        )
        assert answer.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("api", ["native", "openai"])
def test_stop_strings_match_the_text_and_end_the_generation(http: httpx.Client, api: str):
    """Stop on text, wherever the token boundaries fall; usage counts what was returned."""
    prompt = "Hello, my name is"
    free = http.post(PREDICT, json={"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": False})
    text = free.json()["text"]
    stop = text[5:12]  # a slice of the greedy text that starts and ends wherever it falls
    assert stop.strip() and text.index(stop) == 5, text
    if api == "native":
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": False,
                "stop_words_list": [stop]}
        answer = http.post(PREDICT, json=body).json()
        assert answer["text"] == text[:12] and answer["finish_reason"] == "stop", (answer, stop)
        completion = answer["usage"]["completion_tokens"]
    else:
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stop": stop}
        answer = http.post("/v1/completions", json=body).json()
        choice = answer["choices"][0]
        assert choice["text"] == text[:5] and choice["finish_reason"] == "stop", (answer, stop)
        completion = answer["usage"]["completion_tokens"]
    assert completion < 24, answer  # the engine stopped: the hidden rest was neither generated nor counted


def _serving_metrics(server: TrussServer) -> dict[str, float]:
    """The trtllm_* samples on truss's own /metrics, by name (labels summed)."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    # truss mounts prometheus_client's app at /metrics (it redirects to /metrics/)
    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics", timeout=10, follow_redirects=True).text):
        for sample in family.samples:
            if sample.name.startswith("trtllm_"):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def test_metrics_count_every_request_and_match_usage(http: httpx.Client, server: TrussServer):
    before = _serving_metrics(server)
    usages = []
    for i in range(10):
        body = {"prompt": f"Count me {i}", "max_tokens": 3 + i % 3, "ignore_eos": True, "stream": i % 2 == 0}
        if body["stream"]:
            with http.stream("POST", PREDICT, json=body) as response:
                assert response.status_code == 200
                "".join(response.iter_text())
            usages.append(None)
        else:
            answer = http.post(PREDICT, json=body)
            assert answer.status_code == 200, answer.text
            usages.append(answer.json()["usage"])
    refused = http.post(PREDICT, json={"prompt": "x", "max_tokens": MAX_OUTPUT_LEN + 1})
    assert refused.status_code == 400
    after = poll(
        lambda: (m := _serving_metrics(server)).get("trtllm_time_to_first_token_seconds_count", 0)
        - before.get("trtllm_time_to_first_token_seconds_count", 0) >= 10 and m,
        timeout_s=10,
        what="10 requests in the TTFT histogram",
    )

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert grew("trtllm_time_to_first_token_seconds_count") == 10
    assert grew("trtllm_request_success_total") == 10
    assert grew("trtllm_request_error_total") == 1  # the 400
    counted = [u for u in usages if u is not None]
    streamed_tokens = sum(3 + i % 3 for i in range(0, 10, 2))  # ignore_eos: exactly max_tokens each
    assert grew("trtllm_generation_tokens_total") == sum(u["completion_tokens"] for u in counted) + streamed_tokens
    assert grew("trtllm_prompt_tokens_total") >= sum(u["prompt_tokens"] for u in counted)
    assert after.get("trtllm_num_requests_running", 0) == 0 and after.get("trtllm_num_requests_waiting", 0) == 0
