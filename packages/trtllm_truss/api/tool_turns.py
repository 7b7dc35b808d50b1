"""What the dialects that convert their conversations to chat turns (Responses, Messages) check
on the way, in their own field names: tool results paired with earlier calls, tool choices naming a
declared tool, and content the text-only model cannot take. (Tool names and parameter schemas are
`api.tools.check_functions`.)"""

from __future__ import annotations

from fastapi import HTTPException

from trtllm_truss.api.errors import field_error


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
