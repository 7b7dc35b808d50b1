"""The official `openai` client against this repository served by truss's own model server (truss
0.18.35, no docker) on the embedded default: log probs, n choices, batches of prompts, token-id
prompts, a schema guided decoding cannot enforce, `/v1/models`, the fan-out's admission and cancellation, and tools
(rendered by the template, refusals naming the field, tool_choice required / named under guided
decoding).

One server for the module, admitting 32 requests at once (max_batch_size 32, no queue beyond it),
so the all-or-nothing admission of a fan-out is seen with few requests.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterator

import httpx
import openai
import pytest
from trtllm_truss.fronts.truss_server import TrussServer
from truss_serving import FRONTS, REPO_ROOT, poll, serve_front, serve_truss

pytestmark = [pytest.mark.truss_server, pytest.mark.triton, pytest.mark.slow, pytest.mark.torch]

MAX_IN_FLIGHT = 32  # config.yaml's max_batch_size, runtime.max_queued_requests 0 below
CHAT = [{"role": "user", "content": "Tell me about the sea"}]
# Sampling needs top_p or top_k: with neither, TensorRT-LLM (and the stand-in) decode greedily.
PROMPTS = ["Once upon a time", "The capital of France", "def fibonacci(n):", "Dear diary,"]


ENV = {"TRTLLM_RUNTIME__MAX_QUEUED_REQUESTS": "0"}


@pytest.fixture(scope="module")
def truss_server(tmp_path_factory) -> Iterator[TrussServer]:
    yield from serve_front("truss", tmp_path_factory.mktemp("truss_server_openai"), ENV)


@pytest.fixture(scope="module")
def direct_server(tmp_path_factory) -> Iterator[TrussServer]:
    yield from serve_front("direct", tmp_path_factory.mktemp("truss_server_openai_direct"), ENV)


@pytest.fixture(scope="module")
def llmapi_server(tmp_path_factory) -> Iterator[TrussServer]:
    """Backend llmapi (our LLM-API model, on the LLM-API double here) under truss's server: started only for
    the tests marked ON_BOTH_BACKENDS, those exercising what differs there (sampling params, n, log probs, guides)."""
    yield from serve_truss(tmp_path_factory.mktemp("truss_server_openai_llmapi"), {**ENV, "TRTLLM_RUNTIME__BACKEND": "llmapi"})


# A client's parameter names the server it talks to: a front (both on the tensor stand-in), or a backend
# (both under truss's server). Each server starts on first use and serves the whole module.
SERVER_FIXTURE = {"truss": "truss_server", "direct": "direct_server", "pytorch": "truss_server", "llmapi": "llmapi_server"}


@pytest.fixture(scope="module", params=FRONTS)
def server(request) -> TrussServer:
    return request.getfixturevalue(SERVER_FIXTURE[request.param])


def client_of(server: TrussServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-checked", max_retries=0, timeout=120.0)


@pytest.fixture(scope="module", params=FRONTS)
def oai(request) -> openai.OpenAI:
    return client_of(request.getfixturevalue(SERVER_FIXTURE[request.param]))


ON_BOTH_BACKENDS = pytest.mark.parametrize("oai", ["pytorch", "llmapi"], indirect=True)


def standin_metric(server: TrussServer, name: str) -> float:
    """A sample of the stand-in engine on Triton's own /metrics (port from tritonserver's command line)."""
    (triton,) = server.descendants("tritonserver")
    port = re.search(r"--metrics-port[= ](\d+)", " ".join(triton.cmdline()))
    assert port
    text = httpx.get(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=5).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    assert values, f"{name} not exported by Triton"
    return sum(values)


def greedy(**extra) -> dict:
    return {"model": "embedded", "temperature": 0, "extra_body": {"ignore_eos": True}, **extra}


# --------------------------------------------------------------------------------- log probs


def _check_completion_logprobs(text: str, logprobs, completion_tokens: int) -> None:
    assert "".join(logprobs.tokens) == text  # each token's piece of the text, in order
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset) == completion_tokens
    assert all(isinstance(lp, float) and lp <= 0.0 for lp in logprobs.token_logprobs)
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    # greedy decoding: the sampled token, which OpenAI always includes, is the most likely one
    assert logprobs.top_logprobs == [{t: lp} for t, lp in zip(logprobs.tokens, logprobs.token_logprobs)]


@pytest.mark.parametrize("logprobs", [0, 1])
@ON_BOTH_BACKENDS
def test_completion_logprobs_streamed_and_not(oai: openai.OpenAI, logprobs: int):
    body = greedy(prompt="The history of the", max_tokens=12, logprobs=logprobs)
    whole = oai.completions.create(**body)
    choice = whole.choices[0]
    _check_completion_logprobs(choice.text, choice.logprobs, whole.usage.completion_tokens)
    assert whole.usage.completion_tokens == 12

    chunks = [c for c in oai.completions.create(**body, stream=True) if c.choices]
    text = "".join(c.choices[0].text for c in chunks)
    tokens, values, offsets = [], [], []
    for c in chunks:
        if c.choices[0].logprobs is not None:
            lp = c.choices[0].logprobs
            assert "".join(lp.tokens) == c.choices[0].text  # each chunk's tokens are its text
            tokens += lp.tokens
            values += lp.token_logprobs
            offsets += lp.text_offset
    assert text == choice.text and tokens == choice.logprobs.tokens  # greedy: the same tokens either way
    assert offsets == choice.logprobs.text_offset
    assert values == pytest.approx(choice.logprobs.token_logprobs, abs=1e-4)


@ON_BOTH_BACKENDS
def test_chat_logprobs_with_the_top_token_streamed_and_not(oai: openai.OpenAI):
    body = greedy(messages=CHAT, max_tokens=10, logprobs=True, top_logprobs=1)
    whole = oai.chat.completions.create(**body)
    content = whole.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == whole.choices[0].message.content
    assert len(content) == whole.usage.completion_tokens == 10
    for entry in content:
        assert entry.logprob <= 0.0 and entry.bytes is not None
        # greedy decoding: the sampled token is the most likely one
        assert [(t.token, t.logprob) for t in entry.top_logprobs] == [(entry.token, entry.logprob)]
    assert b"".join(bytes(entry.bytes) for entry in content).decode() == whole.choices[0].message.content

    streamed = [c for c in oai.chat.completions.create(**body, stream=True) if c.choices]
    entries = [e for c in streamed if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == whole.choices[0].message.content
    assert [e.token for e in entries] == [e.token for e in content]


def _check_most_likely(token_bytes: bytes, logprob: float, top: list) -> None:
    """A position's most likely tokens: largest first, a distribution's (summing to at most 1), and the
    sampled token among them unless it is less likely than all of them."""
    values = [t.logprob for t in top]
    assert values == sorted(values, reverse=True) and all(v <= 0.0 for v in values)
    assert sum(math.exp(v) for v in values) <= 1.0 + 1e-4
    if logprob >= values[-1] + 1e-4:
        assert token_bytes in [bytes(t.bytes) for t in top]
    else:
        assert logprob <= values[-1] + 1e-4


@ON_BOTH_BACKENDS
def test_top_logprobs_5_are_the_engines_most_likely_tokens_streamed_and_not(oai: openai.OpenAI):
    """Our num_top_log_probs output (not NVIDIA's C++ backend, which keeps the cap of 1 with greedy decoding):
    sampling, each position lists its 5 most likely tokens, the same whole and streamed with a seed."""
    body = {"model": "embedded", "messages": CHAT, "max_tokens": 8, "temperature": 0.9, "top_p": 1.0, "seed": 7,
            "logprobs": True, "top_logprobs": 5, "extra_body": {"ignore_eos": True}}
    whole = oai.chat.completions.create(**body)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 8
    for entry in content:
        assert len(entry.top_logprobs) == 5
        _check_most_likely(bytes(entry.bytes), entry.logprob, entry.top_logprobs)
    streamed = [e for c in oai.chat.completions.create(**body, stream=True) if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [[t.token for t in e.top_logprobs] for e in streamed] == [[t.token for t in e.top_logprobs] for e in content]

    completion = oai.completions.create(**greedy(prompt="The history of the", max_tokens=6, logprobs=5))
    logprobs = completion.choices[0].logprobs
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert 5 <= len(top) <= 6 and top[token] == value == max(top.values())  # greedy: the sampled one first


def test_chat_logprobs_without_top_logprobs_list_none(oai: openai.OpenAI):
    completion = oai.chat.completions.create(
        model="embedded", messages=CHAT, max_tokens=6, temperature=0.8, seed=5, logprobs=True
    )
    content = completion.choices[0].logprobs.content
    assert content and all(entry.top_logprobs == [] for entry in content)


@pytest.mark.parametrize(
    "route, extra, field",
    [
        # strict: a keyword the engine cannot enforce is refused (without strict it is left out, issue 32)
        ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}, "strict": True}}},
         "response_format.json_schema.schema"),
        ("completions", {"n": 2, "best_of": 3}, "best_of"),
        ("completions", {"n": MAX_IN_FLIGHT + 1}, "n"),
    ],
)
def test_what_the_engine_cannot_answer_is_refused_naming_the_field(oai: openai.OpenAI, route, extra, field):
    with pytest.raises(openai.BadRequestError if field != "best_of" else openai.UnprocessableEntityError) as caught:
        if route == "chat":
            oai.chat.completions.create(model="embedded", messages=CHAT, max_tokens=2, **extra)
        else:
            oai.completions.create(model="embedded", prompt="x", max_tokens=2, **extra)
    assert f"{field}:" in caught.value.message, caught.value.message


def test_response_format_text_is_served(oai: openai.OpenAI):
    completion = oai.chat.completions.create(
        **greedy(messages=CHAT, max_tokens=3, response_format={"type": "text"})
    )
    assert completion.usage.completion_tokens == 3


# --------------------------------------------------------------------------------- n choices


@ON_BOTH_BACKENDS
def test_chat_n3_choices_have_their_own_seeds_and_one_prompt_count(oai: openai.OpenAI):
    body = {"model": "embedded", "messages": CHAT, "max_tokens": 12, "temperature": 1.0, "top_p": 1.0, "seed": 1234,
            "extra_body": {"ignore_eos": True}}
    three = oai.chat.completions.create(**body, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    texts = [c.message.content for c in three.choices]
    assert len(set(texts)) > 1, texts  # distinct seeds: the choices differ
    one = oai.chat.completions.create(**body)
    assert one.choices[0].message.content == texts[0]  # choice 0 is what n=1 gives with that seed
    assert oai.chat.completions.create(**body, n=3).choices[2].message.content == texts[2]  # reproducible
    assert three.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counted once
    assert three.usage.completion_tokens == 3 * 12
    assert three.usage.total_tokens == three.usage.prompt_tokens + 36


@ON_BOTH_BACKENDS
def test_chat_n3_stream_carries_each_choices_index(oai: openai.OpenAI):
    body = {"model": "embedded", "messages": CHAT, "max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "seed": 99,
            "extra_body": {"ignore_eos": True}}
    whole = oai.chat.completions.create(**body, n=3)
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, list] = defaultdict(list)
    roles: dict[int, str] = {}
    chunks = list(oai.chat.completions.create(**body, n=3, stream=True, stream_options={"include_usage": True}))
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.delta.role:
                roles[choice.index] = choice.delta.role
            if choice.finish_reason:
                finishes[choice.index].append(choice.finish_reason)
    assert dict(texts) == {c.index: c.message.content for c in whole.choices}
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"}
    assert dict(finishes) == {0: ["length"], 1: ["length"], 2: ["length"]}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_unseeded_choices_differ(oai: openai.OpenAI):
    completion = oai.completions.create(
        model="embedded", prompt="Once upon a time", max_tokens=12, temperature=1.0, top_p=1.0, n=3, extra_body={"ignore_eos": True}
    )
    assert len({c.text for c in completion.choices}) > 1


# --------------------------------------------------------------------------------- batches of prompts


@ON_BOTH_BACKENDS
def test_a_batch_of_4_prompts_with_n2_is_indexed_prompt_major(oai: openai.OpenAI):
    singles = [oai.completions.create(**greedy(prompt=p, max_tokens=6)) for p in PROMPTS]
    batch = oai.completions.create(**greedy(prompt=PROMPTS, max_tokens=6, n=2))
    assert [c.index for c in batch.choices] == list(range(8))
    for i, single in enumerate(singles):
        for j in range(2):  # greedy: both choices of prompt i are its single answer
            assert batch.choices[i * 2 + j].text == single.choices[0].text, (i, j)
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)  # each prompt once
    assert batch.usage.completion_tokens == 8 * 6

    streamed: dict[int, str] = defaultdict(str)
    finished = []
    for chunk in oai.completions.create(**greedy(prompt=PROMPTS, max_tokens=6, n=2), stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
            if choice.finish_reason:
                finished.append(choice.index)
    assert dict(streamed) == {c.index: c.text for c in batch.choices}
    assert sorted(finished) == list(range(8))


def test_token_id_prompts_reach_the_engine_as_sent(oai: openai.OpenAI):
    from trtllm_truss.engine.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(REPO_ROOT / "data" / "embedded-llama")
    ids = [tokenizer.encode(p, add_special_tokens=True) for p in PROMPTS[:2]]
    by_text = oai.completions.create(**greedy(prompt=PROMPTS[:2], max_tokens=5))
    one = oai.completions.create(**greedy(prompt=ids[0], max_tokens=5))
    assert one.choices[0].text == by_text.choices[0].text and one.usage.prompt_tokens == len(ids[0])
    batch = oai.completions.create(**greedy(prompt=ids, max_tokens=5))
    assert [c.text for c in batch.choices] == [c.text for c in by_text.choices]
    with pytest.raises(openai.BadRequestError) as caught:
        oai.completions.create(model="embedded", prompt=[[1, 2], [3, 10**7]], max_tokens=2)
    assert "prompt[1][1]:" in caught.value.message


def test_a_bad_prompt_in_a_batch_refuses_the_request_naming_it(oai: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.completions.create(model="embedded", prompt=["fine", "word " * 1600], max_tokens=2)
    assert "prompt[1]:" in caught.value.message and "max_input_len (1536)" in caught.value.message


# --------------------------------------------------------------------------------- /v1/models


def test_models_list_is_served_by_the_direct_front_only(server: TrussServer):
    oai = client_of(server)
    """truss 0.18.35 routes no `GET /v1/models` to a model (docs/api.md): the client gets a 404. The
    direct front lists the served name and the LoRA adapters."""
    if server.front == "truss":
        with pytest.raises(openai.NotFoundError):
            oai.models.list()
    else:
        assert [model.id for model in oai.models.list()] == ["embedded", "pirate"]
    assert httpx.get(server.url + "/v1/models/model", timeout=10).json() == {}  # truss's readiness route


# --------------------------------------------------------------------------------- admission, cancellation


def test_a_fan_out_is_admitted_whole_or_refused_with_429(server: TrussServer):
    oai = client_of(server)
    holding = MAX_IN_FLIGHT - 2
    with httpx.Client(base_url=server.url, timeout=120.0) as client:
        body = {"prompt": "Hold on", "max_tokens": 256, "ignore_eos": True, "n": holding, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as held:
            assert held.status_code == 200
            lines = held.iter_lines()
            next(lines)  # admitted and under way; the slots stay taken until this answer is closed
            with pytest.raises(openai.RateLimitError):
                oai.completions.create(model="embedded", prompt="three more", max_tokens=2, n=3)
            fits = oai.completions.create(model="embedded", prompt="two more", max_tokens=2, n=2)
            assert len(fits.choices) == 2
    poll(lambda: standin_metric(server, "trtllm_standin_active_requests") == 0, timeout_s=20, what="all choices ended")


def test_a_client_leaving_cancels_every_choice(server: TrussServer):
    cancelled_before = standin_metric(server, "trtllm_standin_cancelled_requests_total")
    with httpx.Client(base_url=server.url, timeout=120.0) as client:
        body = {"model": "embedded", "messages": CHAT, "max_tokens": 256, "n": 3, "stream": True,
                "ignore_eos": True, "temperature": 1.0, "top_p": 1.0}
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            next(lines)
            poll(lambda: standin_metric(server, "trtllm_standin_active_requests") == 3, timeout_s=10, what="3 running")
    poll(lambda: standin_metric(server, "trtllm_standin_active_requests") == 0, timeout_s=20, what="every choice freed")
    assert standin_metric(server, "trtllm_standin_cancelled_requests_total") == cancelled_before + 3


@pytest.mark.parametrize("stream", [True, False])
def test_failing_choices_end_the_request_visibly_and_free_every_slot(server: TrussServer, stream: bool):
    """Last: it kills the stream workers, or under the direct front (no workers) its HTTP processes: the
    request fails visibly (an error event or 500 from the core; the connection, when the process that
    held it died), they are restarted, and every slot is free again."""
    import os
    import signal
    import threading

    oai = client_of(server)
    poll(lambda: len(server.stream_processes()) > 0, timeout_s=60, what="stream processes running")
    workers = server.stream_processes()
    has_workers = bool(server.stream_workers())
    body = {"model": "embedded", "messages": CHAT, "max_tokens": 256, "n": 3, "temperature": 1.0, "top_p": 1.0,
            "extra_body": {"ignore_eos": True}}
    failure = (openai.APIError, {"match": "stream worker"}) if has_workers else ((openai.APIConnectionError, httpx.TransportError), {})
    if stream:
        with pytest.raises(failure[0], **failure[1]):
            for i, _ in enumerate(oai.chat.completions.create(**body, stream=True)):
                if i == 4:  # role chunks, then text: under way
                    for worker in workers:
                        os.kill(worker.pid, signal.SIGKILL)
    else:
        # killed once all three are running in the engine
        def kill_when_running() -> None:
            poll(lambda: standin_metric(server, "trtllm_standin_active_requests") == 3, timeout_s=30, what="3 running")
            for worker in workers:
                os.kill(worker.pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_when_running)
        killer.start()
        with pytest.raises(openai.InternalServerError if has_workers else openai.APIConnectionError,
                           **failure[1]):
            oai.chat.completions.create(**body)
        killer.join()
    old = {w.pid for w in workers}
    poll(lambda: server.stream_processes() and not old & {w.pid for w in server.stream_processes()},
         timeout_s=60, what="stream processes restarted")
    # every slot of the failed request is free again: a request taking all of them is admitted
    answer = poll(
        lambda: (r := httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1, "n": MAX_IN_FLIGHT}, timeout=60))
        .status_code == 200 and r,
        timeout_s=30,
        what="all slots free",
    )
    assert len(answer.json()["choices"]) == MAX_IN_FLIGHT


# --------------------------------------------------------------------------------- tools

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Berlin", "Tokyo"]}, "celsius": {"type": "boolean"}},
    "required": ["city", "celsius"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                                                     "required": ["city"], "additionalProperties": False}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _streamed(oai: openai.OpenAI, **body) -> tuple[str, list[tuple[str, str]], str, str | None]:
    """(content, [(name, arguments)], finish_reason, first call id) of a streamed chat answer,
    rebuilt from its chunks as OpenAI's clients do (by the call's index)."""
    content, calls, finish, first_id = [], {}, None, None
    for chunk in oai.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            for call in delta.tool_calls or []:
                if call.id is not None:  # a call's first delta: its id and name
                    assert call.index not in calls and call.function.name
                    calls[call.index] = [call.function.name, ""]
                    first_id = first_id or call.id
                calls[call.index][1] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return "".join(content), [tuple(calls[i]) for i in sorted(calls)], finish, first_id


def test_tools_are_rendered_and_streamed_and_whole_answers_agree(oai: openai.OpenAI):
    """tool_choice auto on the embedded model (Hermes template): the tools reach the prompt, the
    model (too small to call them) answers with text, the same streamed and not."""
    plain = oai.chat.completions.create(**greedy(messages=ASK, max_tokens=8))
    body = greedy(messages=ASK, max_tokens=8, tools=TOOLS)
    whole = oai.chat.completions.create(**body)
    assert whole.usage.prompt_tokens > plain.usage.prompt_tokens + 50  # the tools are in the prompt
    message = whole.choices[0].message
    content, calls, finish, _ = _streamed(oai, **body)
    assert (content, calls, finish) == (message.content or "", [(c.function.name, c.function.arguments) for c in message.tool_calls or []], whole.choices[0].finish_reason)


def test_a_conversation_with_a_call_and_its_result_is_served(oai: openai.OpenAI):
    messages = ASK + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "celsius": true}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    short = oai.chat.completions.create(**greedy(messages=messages[:1], max_tokens=2, tools=TOOLS))
    answer = oai.chat.completions.create(**greedy(messages=messages, max_tokens=2, tools=TOOLS))
    assert answer.usage.prompt_tokens > short.usage.prompt_tokens + 10


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_stock"}}}, "tool_choice.function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]}, "tools[0].function.parameters"),
        ({"messages": ASK + [{"role": "tool", "tool_call_id": "call_404", "content": "x"}]}, "messages[1].tool_call_id"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}, "messages[0].content[0].type"),
    ],
)
def test_bad_tools_and_content_are_400_naming_the_field(oai: openai.OpenAI, extra, field):
    body = {"model": "embedded", "messages": ASK, "max_tokens": 2, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(**body)
    assert f"{field}:" in caught.value.message, caught.value.message


def _check_calls(calls: list[tuple[str, str]], names: set[str]) -> None:
    import jsonschema

    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    assert calls and all(name in names for name, _ in calls)
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), schemas[name])


@ON_BOTH_BACKENDS
def test_tool_choice_required_returns_schema_valid_calls_streamed_and_not(oai: openai.OpenAI):
    """Enforced by guided decoding in the model's own syntax (xgrammar's structural tag for Hermes'
    `<tool_call>` blocks): even the embedded model answers with calls whose arguments validate against
    their tool's schema. One call (parallel_tool_calls: false): with parallel calls allowed the greedy
    embedded model keeps writing after its call until max_tokens (finish_reason "length"), which the
    guide allows."""
    body = greedy(messages=ASK, max_tokens=128, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    body["extra_body"] = {}  # stop at the end of the call, not at max_tokens
    whole = oai.chat.completions.create(**body, logprobs=True)
    choice = whole.choices[0]
    # The model's own (Hermes) syntax, guided by xgrammar's structural tag (guides.tool_syntax).
    raw = "".join(token.token for token in choice.logprobs.content)
    assert raw.startswith('<tool_call>\n{"name": "') and raw.endswith("}\n</tool_call>"), raw
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    assert choice.finish_reason == "tool_calls", choice
    _check_calls(calls, {"get_weather", "get_time"})
    assert all(c.id.startswith("call_") and c.type == "function" for c in choice.message.tool_calls)
    content, streamed, finish, first_id = _streamed(oai, **body)
    assert (streamed, finish) == (calls, "tool_calls") and first_id


def test_a_named_tool_choice_returns_that_call_streamed_and_not(oai: openai.OpenAI):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    body = greedy(messages=ASK, max_tokens=128, tools=TOOLS, tool_choice=choice)
    body["extra_body"] = {}
    whole = oai.chat.completions.create(**body, logprobs=True)
    # The model's own (Hermes) syntax, guided by xgrammar's structural tag (guides.tool_syntax).
    raw = "".join(token.token for token in whole.choices[0].logprobs.content)
    assert raw.startswith('<tool_call>\n{"name": "get_weather", "arguments": ') and raw.endswith("}\n</tool_call>"), raw
    calls = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []]
    assert whole.choices[0].finish_reason == "tool_calls", whole.choices[0]
    _check_calls(calls, {"get_weather"})
    assert len(calls) == 1
    assert _streamed(oai, **body)[1:3] == (calls, "tool_calls")
