"""Hostile HTTP bodies against truss's own model server (truss 0.18.35) serving this repository.

A generated table (seeded, so every run sends the same bodies) of well over 1,000 bodies across
the five routes: valid requests (max_tokens <= 2), hostile field values (out-of-range numbers,
FP32 underflow, lone surrogates, wrong types), and raw bodies truss's own parser failed on (deep
nesting, invalid UTF-8, 5,000-digit integers, msgpack extension types). Asserted: no 5xx, every
4xx a JSON error, every 200 stream complete or ended by an error event, and afterwards the server
ready and tritonserver the same process. Also: a 10 MB prompt is refused within 1 s while another
request completes normally.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgpack
import pytest

from trtllm_truss.fronts.truss_server import TrussServer, build_server_root, start_truss_server

pytestmark = [pytest.mark.truss_server, pytest.mark.triton, pytest.mark.slow, pytest.mark.torch, pytest.mark.alone]

REPO_ROOT = Path(__file__).resolve().parents[2]
PREDICT = "/v1/models/model:predict"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
# How the last event of a complete SSE stream of each route begins (an error event may end it early).
LAST_EVENTS = {
    CHAT: (b"data: [DONE]",),
    COMPLETIONS: (b"data: [DONE]",),
    RESPONSES: (b"event: response.completed", b"event: response.incomplete"),
    MESSAGES: (b"event: message_stop",),
}
READY = "/v1/models/model"
STARTUP_TIMEOUT_S = 240
SEED = 20261122
BODY_COUNT = 1200
CONCURRENCY = 8
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Case:
    route: str
    content: bytes
    content_type: str = "application/json"
    label: str = ""

    @property
    def streams(self) -> bool:
        """Whether a 200 answer is a stream (by the body's own `stream`, per route default)."""
        try:
            body = json.loads(self.content) if self.content_type == "application/json" else {}
        except (ValueError, RecursionError):
            return False
        if not isinstance(body, dict):
            return False
        return body.get("stream", self.route == PREDICT) is True


# --- the table ------------------------------------------------------------------------------------

LONE = "\ud800"
HOSTILE_VALUES: list[object] = [
    2**31,
    2**31 - 1,
    -(2**31) - 1,
    2**63,
    2**64,
    -1,
    0,
    10**40,
    1e-320,
    1e-50,
    -1e-45,
    1e39,
    1.5,
    -0.0,
    "5",
    "",
    LONE,
    "x" + LONE + "y",
    "\udfff",
    "\x00",
    True,
    None,
    [],
    [LONE],
    ["a"] * 40,
    {"a": 1},
    [[[[[]]]]],
    "é" * 300,
]
INT_FIELDS = ["top_k", "seed", "min_tokens", "end_id", "beam_width", "n", "best_of"]
FLOAT_FIELDS = ["temperature", "top_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "length_penalty"]
STRING_FIELDS = ["prompt", "model", "user", "stop", "stop_words_list", "bad_words_list", "messages", "stream"]
MAX_TOKEN_FIELDS = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
# Only invalid values for the length of a generation, so no mutation asks for a long one.
INVALID_MAX_TOKENS: list[object] = [0, -1, 2**31, 2**64, 10**40, 1e-320, "2", None, [2], 1.5]


def _base(route: str, rng: random.Random) -> dict:
    words = rng.choice(["Hello", "Once upon a time", "é ü 中文 \U0001f600", "a\nb\tc", " "])
    stream = rng.random() < 0.5
    if route == PREDICT:
        if rng.random() < 0.3:
            return {"messages": [{"role": "user", "content": words}], "max_tokens": 2, "stream": stream}
        return {"prompt": words, "max_tokens": rng.choice([1, 2]), "stream": stream}
    if route in (CHAT, MESSAGES):
        return {"messages": [{"role": "user", "content": words}], "max_tokens": 2, "stream": stream}
    if route == RESPONSES:
        return {"input": [{"role": "user", "content": words}], "max_output_tokens": 2, "stream": stream}
    return {"prompt": words, "max_tokens": 2, "stream": stream}


def _mutated(route: str, rng: random.Random) -> dict:
    body = _base(route, rng)
    for _ in range(rng.choice([1, 1, 2, 3])):
        kind = rng.random()
        if kind < 0.15:
            body[rng.choice(MAX_TOKEN_FIELDS)] = rng.choice(INVALID_MAX_TOKENS)
        elif kind < 0.45:
            body[rng.choice(INT_FIELDS + FLOAT_FIELDS)] = rng.choice(HOSTILE_VALUES)
        elif kind < 0.75:
            body[rng.choice(STRING_FIELDS)] = rng.choice(HOSTILE_VALUES)
        elif kind < 0.85:
            turn = {"role": rng.choice(["user", "wizard", LONE]), "content": rng.choice(HOSTILE_VALUES)}
            if route == RESPONSES:
                body["input"] = [turn, rng.choice([{}, {"type": "function_call_output", "call_id": LONE, "output": "x"}])]
            else:
                body["messages"] = [turn]
                body.pop("prompt", None)
        else:
            body[rng.choice(["x" + LONE, "tools", "tool_choice", "logit_bias", "echo", "suffix"])] = rng.choice(HOSTILE_VALUES)
    length_field = "max_output_tokens" if route == RESPONSES else "max_tokens"
    if body.get(length_field) is None and "max_completion_tokens" not in body:
        body[length_field] = 2  # `null` means the default, which may be long
    if body.get("max_completion_tokens") is None:
        body.pop("max_completion_tokens", None)
    return body


def _json(body: object) -> bytes:
    # ensure_ascii: lone surrogates travel as `\ud800` escapes, as a hostile client would send them.
    return json.dumps(body).encode()


def _raw_bodies(rng: random.Random) -> list[tuple[bytes, str, str]]:
    """Bodies truss's own parser answered with 500s, and other garbage."""
    octets = "application/octet-stream"
    return [
        (b"[" * 100_000 + b"]" * 100_000, "application/json", "deep-json"),
        (b'{"prompt":' * 3000 + b'"x"' + b"}" * 3000, "application/json", "deep-object"),
        (b'{"prompt": "\xff\xfe\xfd"}', "application/json", "invalid-utf8"),
        (b'{"prompt": "hi", "max_tokens": ' + b"7" * 5000 + b"}", "application/json", "5000-digits"),
        (b'{"prompt": "hi", "top_p": NaN}', "application/json", "nan"),
        (b'{"prompt": "hi", "temperature": Infinity}', "application/json", "infinity"),
        (b"{not json", "application/json", "syntax"),
        (b"", "application/json", "empty"),
        (b"null", "application/json", "null"),
        (b'"just a string"', "application/json", "string"),
        (b"\xef\xbb\xbf" + _json({"prompt": "bom", "max_tokens": 1, "stream": False}), "application/json", "bom"),
        (rng.randbytes(rng.randint(1, 200)), "application/json", "random-bytes"),
        (msgpack.packb({"prompt": msgpack.ExtType(5, b"\x00" * 8), "max_tokens": 1}), octets, "msgpack-ext"),
        (msgpack.packb({"prompt": b"\xff"}), octets, "msgpack-bin"),
        (msgpack.packb({"prompt": "hi", "max_tokens": 1, "stream": False}), octets, "msgpack-valid"),
        (b"\x91" * 5000 + b"\xc0", octets, "msgpack-deep"),
        (b"\x81\xa6prompt\xa2\xff\xfe", octets, "msgpack-utf8"),
        (rng.randbytes(rng.randint(1, 200)), octets, "msgpack-random"),
    ]


def fuzz_table(count: int = BODY_COUNT, seed: int = SEED) -> list[Case]:
    rng = random.Random(seed)
    routes = [PREDICT, CHAT, COMPLETIONS, RESPONSES, MESSAGES]
    cases: list[Case] = []
    # The issue's own examples first, on every route.
    for route in routes:
        base = _base(route, rng)
        for extra in (
            {"top_k": 2147483648},
            {"repetition_penalty": 1e-320},
            {"top_p": 1e-50},
            {"model": LONE, "stream": True},
            {"stop": [LONE]},
        ):
            cases.append(Case(route, _json({**base, **extra}), label=f"issue-{next(iter(extra))}"))
        if route == COMPLETIONS:
            cases.append(Case(route, _json({"prompt": [LONE + "x"], "max_tokens": 1}), label="issue-prompt-list"))
        else:
            cases.append(
                Case(route, _json({"messages": [{"role": "user", "content": LONE + "x"}], "max_tokens": 1}), label="issue-content")
            )
        for content, content_type, label in _raw_bodies(rng):
            cases.append(Case(route, content, content_type, label))
    while len(cases) < count:
        route = rng.choice(routes)
        if rng.random() < 0.08:
            cases.append(Case(route, _json(_base(route, rng)), label="valid"))
        else:
            cases.append(Case(route, _json(_mutated(route, rng)), label="mutated"))
    return cases


def test_the_table_is_large_and_mostly_refused_cheaply():
    table = fuzz_table()
    assert len(table) >= 1000
    assert {case.route for case in table} == {PREDICT, CHAT, COMPLETIONS, RESPONSES, MESSAGES}
    assert sum(case.label == "valid" for case in table) < len(table) // 5


# --- the server -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[TrussServer]:
    work = tmp_path_factory.mktemp("truss_fuzz")
    proc = start_truss_server(
        build_server_root(REPO_ROOT, work), work / "server.log", env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    )
    try:
        proc.wait_ready(STARTUP_TIMEOUT_S)
        yield proc
    finally:
        proc.stop()


def tritonserver_pid(server: TrussServer) -> int:
    processes = server.descendants("tritonserver")
    assert len(processes) == 1, processes
    return processes[0].pid


def _problem(case: Case, status: int, headers: httpx.Headers, body: bytes, streams: bool) -> str | None:
    """What is wrong with this answer, or None."""
    if status >= 500:
        return f"{status}: {body[:300]!r}"
    if 400 <= status < 500:
        try:
            answer = json.loads(body)
            error = answer["error"]
        except (ValueError, KeyError, TypeError):
            return f"{status} without a JSON error: {body[:300]!r}"
        if case.route == MESSAGES and (answer.get("type") != "error" or not error.get("message")):
            return f"{status} not in the Messages API's error shape: {body[:300]!r}"
        return None if error else f"{status} with an empty error"
    if status != 200:
        return f"unexpected status {status}"
    if streams and case.route != PREDICT:
        last = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        if not (last.startswith(LAST_EVENTS[case.route]) or b"event: error" in body):
            return f"SSE stream ended without its last event or an error event: {body[-300:]!r}"
    elif not streams and headers.get("content-type", "").startswith("application/json"):
        json.loads(body)
    return None


async def _send(client: httpx.AsyncClient, case: Case) -> str | None:
    streams = case.streams
    try:
        async with client.stream(
            "POST", case.route, content=case.content, headers={"content-type": case.content_type}
        ) as response:
            # A chunked body cut off without its terminator raises here (RemoteProtocolError).
            body = await response.aread()
            return _problem(case, response.status_code, response.headers, body, streams)
    except httpx.HTTPError as exc:
        return f"transport error {type(exc).__name__}: {exc}"


def test_fuzzed_bodies_get_no_5xx_and_no_cut_off_streams(server: TrussServer):
    triton_before = tritonserver_pid(server)
    table = fuzz_table()

    async def run_all() -> list[tuple[Case, str]]:
        semaphore = asyncio.Semaphore(CONCURRENCY)
        limits = httpx.Limits(max_connections=CONCURRENCY)
        async with httpx.AsyncClient(base_url=server.url, timeout=REQUEST_TIMEOUT_S, limits=limits) as client:

            async def one(case: Case) -> tuple[Case, str | None]:
                async with semaphore:
                    return case, await _send(client, case)

            results = await asyncio.gather(*(one(case) for case in table))
        return [(case, problem) for case, problem in results if problem is not None]

    started = time.monotonic()
    problems = asyncio.run(run_all())
    elapsed = time.monotonic() - started
    report = "\n".join(f"{case.route} [{case.label}] {case.content[:120]!r}: {problem}" for case, problem in problems[:20])
    assert not problems, f"{len(problems)} of {len(table)} bodies answered badly:\n{report}\n{server.log_tail(40)}"
    print(f"{len(table)} fuzzed bodies in {elapsed:.1f} s")

    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get(READY).status_code == 200
        answer = client.post(PREDICT, json={"prompt": "still serving", "max_tokens": 2, "stream": False})
        assert answer.status_code == 200, answer.text
    assert tritonserver_pid(server) == triton_before, "tritonserver was restarted during the fuzzing"


@pytest.mark.parametrize(
    "content, content_type, words",
    [
        (b"[" * 100_000 + b"]" * 100_000, "application/json", "nested deeper"),
        (b'{"prompt": "\xff"}', "application/json", "not valid UTF-8"),
        (b'{"prompt": "hi", "top_k": ' + b"9" * 5000 + b"}", "application/json", "digits"),
        (msgpack.packb({"prompt": msgpack.ExtType(1, b"x")}), "application/octet-stream", "extension type"),
    ],
    ids=["deep", "invalid-utf8", "5000-digits", "msgpack-ext"],
)
@pytest.mark.parametrize("route", [PREDICT, CHAT, COMPLETIONS, RESPONSES, MESSAGES])
def test_bodies_truss_failed_on_are_our_400s(server: TrussServer, route, content, content_type, words):
    answer = httpx.post(server.url + route, content=content, headers={"content-type": content_type}, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    message = error["message"] if route != PREDICT else error  # OpenAI's and Anthropic's error shapes
    assert words in message, answer.text


def test_msgpack_request_gets_a_msgpack_answer(server: TrussServer):
    answer = httpx.post(
        server.url + PREDICT,
        content=msgpack.packb({"prompt": "Hello", "max_tokens": 2, "stream": False}),
        headers={"content-type": "application/octet-stream"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert msgpack.unpackb(answer.content)["usage"]["completion_tokens"] >= 1


def test_ten_megabyte_prompt_is_refused_within_a_second_while_another_request_completes(server: TrussServer):
    huge = json.dumps({"prompt": "word " * 2_000_000, "max_tokens": 4}).encode()
    assert len(huge) >= 10_000_000

    async def scenario() -> tuple[httpx.Response, float, httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            normal = asyncio.ensure_future(
                client.post(PREDICT, json={"prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": True, "stream": False})
            )
            started = time.monotonic()
            refused = await client.post(PREDICT, content=huge, headers={"content-type": "application/json"})
            refused_after = time.monotonic() - started
            return refused, refused_after, await normal

    refused, refused_after, normal = asyncio.run(scenario())
    assert refused.status_code == 413, refused.text
    assert "bytes" in refused.json()["error"]
    assert refused_after < 1.0, f"the 10 MB prompt took {refused_after:.2f} s to refuse"
    assert normal.status_code == 200, normal.text
    assert normal.json()["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize("route", [PREDICT, CHAT, COMPLETIONS])
def test_prompt_over_the_byte_bound_but_within_the_body_cap_is_400_naming_the_field(server: TrussServer, route):
    # max_input_len 1536 (the embedded default) x 256 bytes: 384 KiB; the body cap is ~3.4 MB.
    text = "word " * 100_000
    body = {"messages": [{"role": "user", "content": text}]} if route == CHAT else {"prompt": text}
    answer = httpx.post(server.url + route, json={**body, "max_tokens": 2, "stream": False}, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    message = error["message"] if route != PREDICT else error
    assert message.startswith("invalid request: " + ("messages" if route == CHAT else "prompt") + ": the prompt is"), message
