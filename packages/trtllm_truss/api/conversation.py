"""What the dialects that convert their conversations to chat turns (Responses, Messages) share:
their items and blocks validated where they sit, and the checks made on the way, in their own field
names: tool results paired with earlier calls, tool choices naming a declared tool, and content the
text-only model cannot take. (Tool names and parameter schemas are `api.tools.check_functions`.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, ValidationError

from trtllm_truss.api.errors import field_error, from_validation_error

M = TypeVar("M", bound=BaseModel)


class EchoedModel(BaseModel):
    """A part of a conversation that clients echo from an earlier answer (output items, content
    blocks), with fields that do not matter here (ids, status, annotations, signatures,
    cache_control): those are ignored, the ones used are checked without coercion."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


def validate_at(model: type[M], value: Any, where: str = "") -> M:
    """`value` as `model`; problems are 422s naming their fields under `where` (the body if empty)."""
    if not isinstance(value, Mapping):
        raise field_error(where or "body", f"expected a JSON object, got {type(value).__name__}", 422)
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=where) from None


def check_choice_name(field: str, name: str, declared: list[str]) -> None:
    if name not in declared:
        listed = ", ".join(repr(n) for n in declared) or "none given"
        raise field_error(field, f"{name!r} is not one of the request's tools ({listed})")


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
            raise field_error(field, f"{call_id!r} answers no {call_kind} earlier in the conversation")


def unsupported_content(field: str, kind: str) -> HTTPException:
    """Content this deployment's text-only model cannot take (images, audio, files, documents)."""
    return field_error(field, f"{kind!r} content is not accepted: this deployment serves a text-only model")
