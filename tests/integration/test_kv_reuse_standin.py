"""Prefix reuse through the real stack on the embedded model: with runtime.enable_kv_cache_reuse, the same
long prompt sent again reports most of itself as cached in every route's usage and on /metrics, on the
stand-in (`pytorch`, NVIDIA's tensor interface) and on the LLM-API path (`llmapi` on its double: the LLM API's
request_perf_metrics through our llmapi Triton model)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from trtllm_truss.fronts.truss_server import TrussServer
from truss_serving import serve_front

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(600)]

# Long enough for several 64-token blocks (build.plugin_configuration.tokens_per_block's default).
DOCUMENT = " ".join(
    f"Record {i}: the shipment of {i * 7} crates left the northern depot on day {i % 28 + 1} and arrived intact."
    for i in range(24)
)


@pytest.fixture(scope="module", params=["pytorch", "llmapi"])
def server(request, tmp_path_factory) -> Iterator[TrussServer]:
    env = {
        "TRTLLM_RUNTIME__BACKEND": request.param,
        "TRTLLM_RUNTIME__ENABLE_KV_CACHE_REUSE": "true",
        "TRTLLM_RUNTIME__EVENT_BUFFER_MAX_SIZE": "1000",
        "TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES": "1",
    }
    yield from serve_front("direct", tmp_path_factory.mktemp("kv_reuse"), env)


def twice(server: TrussServer, path: str, body: dict) -> tuple[dict, dict]:
    first, second = (httpx.post(server.url + path, json=body, timeout=120) for _ in range(2))
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    return first.json()["usage"], second.json()["usage"]


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": DOCUMENT + " Which day?"}]}),
        ("/v1/completions", {"prompt": DOCUMENT + " The first record says"}),
    ],
)
def test_openai_routes_report_the_repeated_prompt_as_cached(server, path, body):
    first, second = twice(server, path, {"model": "embedded", "max_tokens": 4, **body})
    prompt = second["prompt_tokens"]
    assert prompt >= 256 and first["prompt_tokens"] == prompt
    assert first["prompt_tokens_details"]["cached_tokens"] < prompt * 0.75  # nothing of this prompt was cached
    assert second["prompt_tokens_details"]["cached_tokens"] >= prompt * 0.75


def test_responses_messages_and_native_report_cached_tokens(server):
    _, responses = twice(server, "/v1/responses", {"model": "embedded", "input": DOCUMENT + " Which depot?", "max_output_tokens": 4})
    assert responses["input_tokens_details"]["cached_tokens"] >= responses["input_tokens"] * 0.75
    _, messages = twice(server, "/v1/messages", {
        "model": "embedded", "max_tokens": 4, "messages": [{"role": "user", "content": DOCUMENT + " How many crates?"}],
    })
    prompt = messages["input_tokens"] + messages["cache_read_input_tokens"]  # Anthropic: reads are not input tokens
    assert messages["cache_read_input_tokens"] >= prompt * 0.75
    _, native = twice(server, "/v1/models/model:predict", {"prompt": DOCUMENT + " Summary:", "max_tokens": 4, "stream": False})
    assert native["prompt_tokens_details"]["cached_tokens"] >= native["prompt_tokens"] * 0.75


def test_metrics_count_cached_prompt_tokens(server):
    twice(server, "/v1/completions", {"model": "embedded", "prompt": DOCUMENT + " In short,", "max_tokens": 2})
    text = httpx.get(server.url + "/metrics", timeout=10).text
    cached = next(line for line in text.splitlines() if line.startswith("trtllm_prompt_tokens_cached_total{"))
    assert float(cached.rsplit(" ", 1)[1]) >= 256
