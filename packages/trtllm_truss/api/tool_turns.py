"""Checks every dialect makes of the function tools a request declares and of the tool turns it
carries, so that bad tool input is a 4xx naming the field on each route, in that route's terms.

A dialect first turns its own shapes into OpenAI chat ones (messages with `tool_calls`, `tool`
messages with `tool_call_id`, `tools: [{type: function, function: {...}}]`); the `where` of each
problem is the dialect's own field path, passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import HTTPException
from jsonschema import SchemaError
from jsonschema.validators import validator_for

from trtllm_truss.api.errors import field_error

SCHEMA_STATUS = 400


def check_parameters_schema(field: str, schema: Any, *, object_root: bool = True) -> None:
    """`schema` must be a JSON Schema (the draft its `$schema` names, else 2020-12); with
    `object_root`, one describing an object, as a tool's arguments are one."""
    if not isinstance(schema, Mapping):
        raise field_error(field, f"must be a JSON Schema object, got {type(schema).__name__}")
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        raise field_error(f"{field}{where}", f"not a valid JSON Schema: {exc.message}") from None
    kind = schema.get("type")
    if object_root and kind is not None and kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise field_error(f"{field}.type", f"tool arguments are a JSON object, so the schema's type must be 'object' (got {kind!r})")


def check_unique_names(names: list[tuple[str, str]]) -> None:
    """(field, name) per tool: two tools of one name could not be told apart in a call."""
    seen: dict[str, str] = {}
    for field, name in names:
        if name in seen:
            raise field_error(field, f"tool name {name!r} is declared twice (also at {seen[name]})")
        seen[name] = field


def check_choice_name(field: str, name: str, declared: list[str]) -> None:
    if name not in declared:
        listed = ", ".join(repr(n) for n in declared) or "none"
        raise field_error(field, f"names tool {name!r}, which is not among the request's tools ({listed})")


class ToolTurns:
    """Pairs tool results with the calls before them, in the order the conversation gives them."""

    def __init__(self) -> None:
        self._calls: dict[str, str] = {}  # call id -> where it was made

    def call(self, field: str, call_id: str) -> None:
        if call_id in self._calls:
            raise field_error(field, f"call id {call_id!r} is used twice (also at {self._calls[call_id]})")
        self._calls[call_id] = field

    def result(self, field: str, call_id: str, *, call_kind: str) -> None:
        if call_id not in self._calls:
            raise field_error(field, f"{call_id!r} matches no {call_kind} earlier in the conversation")


def unsupported_content(field: str, kind: str) -> HTTPException:
    """Content this deployment's text-only model cannot take (images, audio, files, documents)."""
    return field_error(field, f"{kind!r} content is not served: this deployment's model takes text only")
