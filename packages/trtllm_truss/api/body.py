"""Reading a request body ourselves, so that every malformed body is a 4xx answer from us.

truss's server parses bodies with `json.loads` (or msgpack) before a model method runs, and its
failures on hostile bodies are 500s: nesting deeper than Python's recursion limit, invalid UTF-8,
integers of more than 4,300 digits, msgpack extension types. A model method whose only argument is
the request (`def predict(self, request: fastapi.Request)`) makes truss skip that parsing
(`ModelDescriptor.skip_input_parsing` in truss's `model_wrapper.py`) and hand over the raw request.

truss 0.18.35 still reads the whole body into memory (its `parse_body` dependency) before the model
method runs, so the size cap here bounds what is parsed, not what is received.

Bodies are JSON, or msgpack where the content type is `application/octet-stream`: truss's own
convention (its `TrussHandle` sends msgpack that way, and truss answers such requests in msgpack).
Only plain msgpack types are accepted (no extension types, no binary strings).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Mapping
from typing import Any

from fastapi import HTTPException
from starlette.requests import ClientDisconnect, Request

from trtllm_truss.api.errors import encodable

MAX_NESTING_DEPTH = 32  # the schemas need 4 (messages[].content[].text); room for clients' extras
MAX_INTEGER_DIGITS = 32  # the largest field, `seed`, is a 64-bit integer: 20 digits
MSGPACK_MEDIA_TYPE = "application/octet-stream"

BAD_BODY_STATUS = 400
BODY_TOO_LARGE_STATUS = 413
UNSUPPORTED_MEDIA_STATUS = 415

# The only JSON escapes that can decode to a surrogate; a body without one needs no string walk.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_JSON_VALUE = (str, int, float, bool, type(None))


class BodyError(Exception):
    """A body refused while it is parsed; becomes a 400 naming where the problem is."""


def body_error(message: str, status_code: int = BAD_BODY_STATUS) -> HTTPException:
    return HTTPException(status_code=status_code, detail=encodable(f"invalid request: body: {message}"))


async def read_body_bytes(request: Request, *, max_bytes: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `max_bytes`."""
    declared = request.headers.get("content-length", "")
    # A declared length with more digits than any cap is over it (and int() of a 5,000-digit header
    # would raise on its own).
    if declared.isdigit() and (len(declared) > 18 or int(declared) > max_bytes):
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(max_bytes)
            chunks.append(chunk)
    except ClientDisconnect:
        raise HTTPException(status_code=499, detail="client disconnected while sending the request") from None
    return b"".join(chunks)


def _too_large(max_bytes: int) -> HTTPException:
    return body_error(f"larger than this deployment accepts ({max_bytes} bytes)", BODY_TOO_LARGE_STATUS)


def is_msgpack(request: Request) -> bool:
    """truss's own test (`TrussServer.is_binary`): the media type, parameters ignored."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    return media_type == MSGPACK_MEDIA_TYPE


async def read_json_body(request: Request, *, max_bytes: int) -> Any:
    """The parsed body (JSON, or msgpack under `application/octet-stream`), or an HTTPException:
    413 over `max_bytes`, 400 for anything malformed, with a message saying what and where."""
    raw = await read_body_bytes(request, max_bytes=max_bytes)
    if is_msgpack(request):
        return parse_msgpack(raw)
    return parse_json(raw)


def parse_json(raw: bytes) -> Any:
    raw = raw.removeprefix(codecs.BOM_UTF8)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise body_error(f"not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
    try:
        value = json.loads(text, parse_int=_bounded_int, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise body_error(f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise body_error(f"nested deeper than {MAX_NESTING_DEPTH} levels") from None
    except BodyError as exc:
        raise body_error(str(exc)) from None
    # Walked only when needed: nesting can be deep only with more brackets than the limit, and a
    # surrogate only comes from a `\uD8xx`-`\uDFxx` escape.
    # json.loads makes only JSON values with string keys; the walk (which names the place) is needed for
    # a surrogate, or for depth past the bound, which text_depth finds without walking.
    deep = text.count("[") + text.count("{") > MAX_NESTING_DEPTH and text_depth(text) > MAX_NESTING_DEPTH
    if deep or _SURROGATE_ESCAPE.search(text):
        check_structure(value)
    return value


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise BodyError(f"an integer of {len(digits.lstrip('-'))} digits (at most {MAX_INTEGER_DIGITS})")
    return int(digits)


def _no_constant(name: str) -> Any:
    raise BodyError(f"{name} is not a JSON number")


def parse_msgpack(raw: bytes) -> Any:
    try:
        import msgpack  # truss's server depends on it; only msgpack bodies need it
    except ImportError:
        raise body_error("msgpack bodies are not supported here; send JSON", UNSUPPORTED_MEDIA_STATUS) from None
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=True, ext_hook=_refuse_extension)
    except BodyError as exc:
        raise body_error(str(exc)) from None
    except (ValueError, TypeError, RecursionError) as exc:
        # msgpack's own messages can quote the body; the exception's kind says enough.
        raise body_error(f"not valid msgpack ({type(exc).__name__})") from None
    check_structure(value)
    return value


def _refuse_extension(code: int, _data: bytes) -> Any:
    raise BodyError(f"msgpack extension type {code} is not accepted")


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


def text_depth(text: str) -> int:
    """Nesting depth of valid JSON text (a scalar is 0, `{}` is 1), at C speed, so a large document costs
    a millisecond, not a Python walk: brackets outside strings (a quote opens or closes one unless text
    has escapes, then strings are cut out by a regex), their running count with numpy."""
    import numpy as np

    if "\\" in text:
        text = _JSON_STRING.sub("", text)
    codes = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    outside = np.cumsum(codes == ord('"')) % 2 == 0  # a quote itself counts as inside; it is no bracket
    steps = ((codes == ord("{")) | (codes == ord("["))).astype(np.int32) - ((codes == ord("}")) | (codes == ord("]")))
    return int(np.cumsum(steps * outside).max(initial=0))


def check_structure(value: Any) -> None:
    """JSON's shapes only, nested at most MAX_NESTING_DEPTH deep, every string (keys included)
    encodable as UTF-8. Iterative: a hostile nesting must not exhaust the stack here either."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, (Mapping, list)):
            if depth > MAX_NESTING_DEPTH:
                raise body_error(f"nested deeper than {MAX_NESTING_DEPTH} levels (at {path or 'the top'})")
            if isinstance(item, Mapping):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise body_error(f"{path or 'the top'}: keys must be strings, got {type(key).__name__}")
                    child_path = f"{path}.{key}" if path else key
                    _check_text(key, child_path)
                    stack.append((child, child_path, depth + 1))
            else:
                stack.extend((child, f"{path}[{index}]", depth + 1) for index, child in enumerate(item))
        elif not isinstance(item, _JSON_VALUE):
            raise body_error(f"{path or 'the top'}: {type(item).__name__} is not a JSON value")


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # `encodable` turns the path (which may hold the surrogate) into escapes.
        raise body_error(
            f"{path or 'the top'}: not valid Unicode text: lone surrogate {text[exc.start]!r} at character {exc.start}"
        ) from None
