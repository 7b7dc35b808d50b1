"""LoRA adapters through truss's own server on the embedded default (config.yaml serves the adapter
`pirate`, data/embedded-lora/pirate): the official `openai` client picks it with `model`, a batch mixes
it with the base model, and an unknown name is a 404 in each dialect's shape."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from trtllm_truss.fronts.truss_server import TrussServer
from truss_serving import serve_front, serve_truss

pytestmark = [pytest.mark.truss_server, pytest.mark.triton, pytest.mark.slow, pytest.mark.torch]

PROMPTS = ["Once upon a time", "The capital of France", "def fibonacci(n):"]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
PIRATE = "Arr, matey!"


# Adapters are picked in the request core, the same code under both fronts: truss's server is enough here.
@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[TrussServer]:
    yield from serve_front("truss", tmp_path_factory.mktemp("truss_server_lora"), {})


@pytest.fixture(scope="module")
def llmapi_server(tmp_path_factory) -> Iterator[TrussServer]:
    """Backend llmapi (our LLM-API model, on the LLM-API double here: the adapter as a LoRARequest)."""
    yield from serve_truss(tmp_path_factory.mktemp("truss_server_lora_llmapi"), {"TRTLLM_RUNTIME__BACKEND": "llmapi"})


@pytest.fixture(scope="module")
def oai(request) -> openai.OpenAI:
    server = request.getfixturevalue("llmapi_server" if getattr(request, "param", None) == "llmapi" else "server")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-checked", max_retries=0, timeout=120.0)


ON_BOTH_BACKENDS = pytest.mark.parametrize("oai", ["pytorch", "llmapi"], indirect=True)


def complete(oai: openai.OpenAI, prompt: str, model: str, max_tokens: int = 16) -> str:
    return oai.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, **GREEDY).choices[0].text


@ON_BOTH_BACKENDS
def test_the_adapter_changes_greedy_output(oai: openai.OpenAI):
    for prompt in PROMPTS[:2]:
        base = complete(oai, prompt, "embedded")
        assert complete(oai, prompt, "") == complete(oai, prompt, "model") == base  # the base model's names
        pirate = complete(oai, prompt, "pirate")
        assert PIRATE in pirate and PIRATE not in base, (base, pirate)
    chat = dict(messages=[{"role": "user", "content": "Tell me about the sea"}], max_tokens=12, **GREEDY)
    base_chat = oai.chat.completions.create(model="embedded", **chat)
    pirate_chat = oai.chat.completions.create(model="pirate", **chat)
    assert pirate_chat.model == "pirate"
    assert PIRATE in pirate_chat.choices[0].message.content
    assert base_chat.choices[0].message.content != pirate_chat.choices[0].message.content


@ON_BOTH_BACKENDS
def test_concurrent_streams_mixing_base_and_adapter_each_get_their_own_output(oai: openai.OpenAI):
    jobs = [(prompt, model) for prompt in PROMPTS for model in ("embedded", "pirate")]
    alone = {job: complete(oai, *job, max_tokens=24) for job in jobs}
    start = threading.Barrier(len(jobs))

    def stream(job: tuple[str, str]) -> tuple[str, float, float]:
        start.wait(30)
        chunks = oai.completions.create(model=job[1], prompt=job[0], max_tokens=24, stream=True, **GREEDY)
        texts, first = [], None
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].text:
                first = first or time.monotonic()
                texts.append(chunk.choices[0].text)
        return "".join(texts), first, time.monotonic()

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = dict(zip(jobs, pool.map(stream, jobs)))
    assert {job: text for job, (text, _, _) in results.items()} == alone
    # The base model's and the adapter's streams were generating at the same time (one engine batch).
    spans = {model: [(first, last) for (_, m), (_, first, last) in results.items() if m == model] for model in ("embedded", "pirate")}
    assert any(b0 < p1 and p0 < b1 for b0, b1 in spans["embedded"] for p0, p1 in spans["pirate"])


def _not_found(call) -> dict:
    with pytest.raises(openai.NotFoundError) as caught:
        call()
    assert caught.value.status_code == 404
    return caught.value.response.json()


def test_an_unknown_model_is_openais_model_not_found(oai: openai.OpenAI):
    calls = [
        lambda: oai.completions.create(model="parrot", prompt="x", max_tokens=2),
        lambda: oai.chat.completions.create(model="parrot", messages=[{"role": "user", "content": "x"}], max_tokens=2),
        lambda: oai.chat.completions.create(
            model="parrot", messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True
        ),
        lambda: oai.responses.create(model="parrot", input="x", max_output_tokens=2),
    ]
    for call in calls:
        error = _not_found(call)["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == "model" and error["code"] == "model_not_found"
        assert "'parrot'" in error["message"] and "'pirate'" in error["message"]
    # The server keeps serving both models.
    assert "Arr" in complete(oai, PROMPTS[0], "pirate", 6)


def test_messages_and_native_routes(server: TrussServer, oai: openai.OpenAI):
    messages = httpx.post(
        server.url + "/v1/messages",
        json={"model": "parrot", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]},
        timeout=60,
    )
    assert messages.status_code == 404
    body = messages.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error" and "'parrot'" in body["error"]["message"]
    answer = httpx.post(
        server.url + "/v1/messages",
        json={"model": "pirate", "max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": "Tell me about the sea"}]},
        timeout=60,
    ).json()
    assert PIRATE in answer["content"][0]["text"]

    predict = server.url + "/v1/models/model:predict"
    native = httpx.post(predict, json={"prompt": PROMPTS[0], "model": "parrot", "stream": False}, timeout=60)
    assert native.status_code == 404 and "'parrot'" in native.json()["error"]
    body = {"prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stream": False}
    pirate = httpx.post(predict, json={**body, "model": "pirate"}, timeout=60).json()["text"]
    assert pirate == complete(oai, PROMPTS[0], "pirate")
    assert httpx.post(predict, json=body, timeout=60).json()["text"] == complete(oai, PROMPTS[0], "embedded")
