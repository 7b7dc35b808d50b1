"""The request body read by our code (truss's parsing skipped): every malformed body is a 4xx with
a message, never an exception that becomes a 500. Uses starlette's real `Request` over an ASGI
receive channel."""

from __future__ import annotations

import json
import time

import msgpack
import pytest
from fastapi import HTTPException
from starlette.requests import Request

from trtllm_truss.api.body import MAX_INTEGER_DIGITS, MAX_NESTING_DEPTH, check_structure, read_json_body

MAX = 1 << 20


def _request(body: bytes, content_type: str = "application/json", chunk: int = 65536, declare: bool = True) -> Request:
    headers = [(b"content-type", content_type.encode())]
    if declare:
        headers.append((b"content-length", str(len(body)).encode()))
    parts = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages = [
        {"type": "http.request", "body": part, "more_body": index < len(parts) - 1} for index, part in enumerate(parts)
    ]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers, "query_string": b""}
    return Request(scope, receive)


async def _refusal(body: bytes, **kwargs) -> HTTPException:
    max_bytes = kwargs.pop("max_bytes", MAX)
    with pytest.raises(HTTPException) as caught:
        await read_json_body(_request(body, **kwargs), max_bytes=max_bytes)
    error = caught.value
    json.dumps({"error": error.detail}, ensure_ascii=False).encode("utf-8")  # the answer must encode
    return error


async def test_plain_json_object():
    assert await read_json_body(_request(b'{"prompt": "hi", "top_p": 0.5}'), max_bytes=MAX) == {
        "prompt": "hi",
        "top_p": 0.5,
    }


async def test_utf8_bom_is_tolerated():
    assert await read_json_body(_request(b'\xef\xbb\xbf{"a": 1}'), max_bytes=MAX) == {"a": 1}


@pytest.mark.parametrize(
    "body, words",
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b'{"prompt": "\xff\xfe"}', "not valid UTF-8"),
        (b'{"prompt": "caf\xc3"}', "not valid UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
        (b'{"a":' * 40 + b"1" + b"}" * 40, "nested deeper"),
        (b'{"prompt": "hi", "top_k": ' + b"9" * 5000 + b"}", "digits"),
        (b'{"prompt": "hi", "seed": -' + b"1" * (MAX_INTEGER_DIGITS + 1) + b"}", "digits"),
        (b'{"prompt": "hi", "top_p": NaN}', "NaN"),
        (b'{"prompt": "hi", "temperature": -Infinity}', "Infinity"),
        (b'{"prompt": "\\ud800x"}', "prompt: not valid Unicode text"),
        (b'{"messages": [{"role": "user", "content": "\\udc00"}]}', "messages[0].content: not valid Unicode"),
        (b'{"prompt": "hi", "\\ud800": 1}', "not valid Unicode"),
    ],
    ids=[
        "syntax",
        "empty",
        "invalid-utf8",
        "truncated-utf8",
        "deep-100k",
        "deep-40",
        "5000-digits",
        "33-digits",
        "nan",
        "infinity",
        "surrogate-prompt",
        "surrogate-content",
        "surrogate-key",
    ],
)
async def test_malformed_json_is_a_400_saying_what(body, words):
    error = await _refusal(body)
    assert error.status_code == 400 and words in error.detail, error.detail


async def test_surrogate_pairs_escaped_by_ascii_clients_are_text():
    body = json.dumps({"prompt": "smile \U0001f600 " + "[" * 40}).encode()  # ensure_ascii: \ud83d\ude00
    assert (await read_json_body(_request(body), max_bytes=MAX))["prompt"].startswith("smile \U0001f600")


async def test_nesting_at_the_limit_passes():
    body = b"[" * MAX_NESTING_DEPTH + b"]" * MAX_NESTING_DEPTH
    await read_json_body(_request(body), max_bytes=MAX)


async def test_over_size_is_413_from_the_declared_length_before_reading():
    received = []
    request = _request(b"x" * (MAX + 1))
    original = request._receive

    async def counting_receive():
        received.append(1)
        return await original()

    request._receive = counting_receive
    with pytest.raises(HTTPException) as caught:
        await read_json_body(request, max_bytes=MAX)
    assert caught.value.status_code == 413 and str(MAX) in caught.value.detail
    assert not received


async def test_over_size_without_a_declared_length_is_413_while_reading():
    error = await _refusal(b'{"prompt": "' + b"a" * (4 * MAX) + b'"}', declare=False, chunk=4096)
    assert error.status_code == 413


async def test_a_huge_declared_length_is_413_not_an_int_error():
    request = _request(b"{}")
    request.scope["headers"] = [(b"content-length", b"9" * 5000)]
    with pytest.raises(HTTPException) as caught:
        await read_json_body(request, max_bytes=MAX)
    assert caught.value.status_code == 413


async def test_ten_megabytes_refused_fast():
    body = json.dumps({"prompt": "word " * 2_000_000}).encode()
    started = time.monotonic()
    error = await _refusal(body)
    assert error.status_code == 413 and time.monotonic() - started < 0.5


# --- msgpack (truss's convention for application/octet-stream) ----------------------------------

OCTETS = "application/octet-stream"


async def test_msgpack_body_is_read_like_json():
    body = msgpack.packb({"prompt": "hi", "max_tokens": 3})
    assert await read_json_body(_request(body, content_type=OCTETS + "; x=y"), max_bytes=MAX) == {
        "prompt": "hi",
        "max_tokens": 3,
    }


@pytest.mark.parametrize(
    "body, words",
    [
        (msgpack.packb({"prompt": msgpack.ExtType(42, b"xx")}), "extension type 42"),
        (b"\x81\xa6prompt\xa2\xff\xfe", "not valid msgpack"),  # invalid UTF-8 in a str
        (b"\x81\xa6prompt", "not valid msgpack"),  # truncated
        (msgpack.packb({"prompt": b"bytes"}), "bytes is not a JSON value"),
        (msgpack.packb({1: "x"}, strict_types=False), "not valid msgpack"),
        (b"\x91" * 2000 + b"\xc0", "msgpack"),  # nested beyond msgpack's own stack
        (b"\x91" * 40 + b"\xc0", "nested deeper"),
        (msgpack.packb({"when": msgpack.Timestamp(1)}), "Timestamp is not a JSON value"),
    ],
    ids=["ext", "invalid-utf8", "truncated", "bin", "int-key", "deep-2000", "deep-40", "timestamp"],
)
async def test_malformed_msgpack_is_a_400(body, words):
    error = await _refusal(body, content_type=OCTETS)
    assert error.status_code == 400 and words in error.detail, error.detail


def test_structure_walk_is_iterative():
    value: list = []
    node = value
    for _ in range(50_000):
        node.append([])
        node = node[0]
    with pytest.raises(HTTPException) as caught:
        check_structure(value)
    assert "nested deeper" in caught.value.detail
