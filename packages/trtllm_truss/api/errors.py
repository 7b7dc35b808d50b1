"""Turning request problems into HTTP 4xx answers whose message names the field."""

from __future__ import annotations

import re
from collections.abc import Mapping

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from pydantic import ValidationError

# 422 for a body that does not match the schema (FastAPI's own convention), 400 for a well-formed
# request that this deployment cannot serve (over the engine's limits, unsupported option).
SCHEMA_ERROR_STATUS = 422
LIMIT_ERROR_STATUS = 400
_MAX_VALUE_REPR = 60


def encodable(text: str) -> str:
    """`text` with anything UTF-8 cannot encode (lone surrogates from a hostile body, echoed in a
    message as a key or a value) written as a `\\udXXX` escape: the error answer itself must encode."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def field_error(field: str, message: str, status_code: int = LIMIT_ERROR_STATUS) -> HTTPException:
    return HTTPException(status_code=status_code, detail=encodable(f"invalid request: {field}: {message}"))


# pydantic puts the tried member of a union into the location ("str", "list[TextPart]", "TextPart");
# field names here are lower snake case, so such tags are told apart and left out of the path.
# Annotated members with a validator are tagged "function-after[utf8_text(), str]".
_UNION_TAG = re.compile(
    r"^(str|int|float|bool|none|constrained-str|list\[.*\]|dict\[.*\]|literal\[.*\]|function-\w+\[.*\]|[A-Z]\w*(\[.*\])?)$"
)


def _dotted(loc: tuple[str | int, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, str) and _UNION_TAG.match(part):
            continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "body"


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_VALUE_REPR else text[: _MAX_VALUE_REPR - 3] + "..."


def from_validation_error(exc: ValidationError, prefix: str = "") -> HTTPException:
    """One line per problem: `field.path: what is wrong (got value)`; `prefix` is where the
    validated value sits in the body (`input[2]`), for values validated on their own."""
    problems: list[str] = []
    for error in exc.errors(include_url=False):
        # Errors raised by model validators carry no location; their message names the fields.
        where = _dotted(tuple(error["loc"]))
        if prefix:
            where = prefix if where == "body" else f"{prefix}.{where}"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] in ("missing", "extra_forbidden") or not error["loc"]:
            problems.append(f"{where}: {message}")
        else:
            problems.append(f"{where}: {message} (got {_short_repr(error.get('input'))})")
    problems = list(dict.fromkeys(problems))  # a union reports the same problem once per member
    return HTTPException(status_code=SCHEMA_ERROR_STATUS, detail=encodable("invalid request: " + "; ".join(problems)))


def error_response(
    status: int,
    message: str,
    *,
    openai: bool,
    headers: Mapping[str, str] | None = None,
    param: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    """The body truss itself gives an HTTPException, `{"error": message}`, or on the OpenAI routes
    OpenAI's `{"error": {"message", "type", "param", "code"}}` (which the `openai` client shows; `code`
    defaults to the status). Returned rather than raised: truss logs a traceback for every raised one."""
    detail: object = encodable(message)
    if openai:
        error_type = "invalid_request_error" if status < 500 else "server_error"
        detail = {"message": detail, "type": error_type, "param": param, "code": code or status}
    return JSONResponse(status_code=status, content={"error": detail}, headers=dict(headers or {}))
