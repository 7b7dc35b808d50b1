"""Output parsers run in a stream worker on a chat answer's text, as it is decoded: a reasoning
parser splits the model's thinking from its answer, a tool-call parser finds the calls in the
answer (`parsers.section.ToolCallParser`). Both are streaming: `feed(text)` returns the parts that
are decided, `finish(cut)` the rest. Parts: ("text", s), ("reasoning", s), ("tool", index, id,
name, arguments fragment): a call's first part carries its index, id and name, the later ones
fragments of its arguments, which concatenate to the call's arguments.

Parsers are registered by name (`register_tool_parser`, `register_reasoning_parser`), one module
per model family; `parsers.detect` tells the families apart.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from trtllm_truss.parsers.scan import held_prefix

# Kinds of the parts of a parsed update (the stream workers send them to the request core as they are).
PART_TEXT = "text"
PART_REASONING = "reasoning"
PART_TOOL = "tool"

Part = tuple
T = TypeVar("T", bound=type)

TOOL_PARSERS: dict[str, type] = {}
REASONING_PARSERS: dict[str, type[ReasoningParser]] = {}


def register_tool_parser(name: str) -> Callable[[T], T]:
    def register(cls: T) -> T:
        TOOL_PARSERS[name] = cls
        cls.name = name
        return cls

    return register


def register_reasoning_parser(name: str) -> Callable[[T], T]:
    def register(cls: T) -> T:
        REASONING_PARSERS[name] = cls
        cls.name = name
        return cls

    return register


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def alphanumeric_id(length: int = 9) -> str:
    """Mistral's tool-call ids: 9 letters and digits (its templates refuse other ids)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))


def arguments_json(value: Any) -> str | None:
    """A call's arguments as JSON text of an object, or None when they are not one (a JSON string
    holding an object is taken too: some models quote their arguments)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)


_AT_START, _LABEL, _INSIDE, _ANSWER_LEAD, _DONE = range(5)


class ReasoningParser:
    """Splits `<think>`-style reasoning from the answer: reasoning streams as reasoning parts until
    the end tag, the rest as text. `starts_in_reasoning(prompt_tail)`: whether the answer begins
    inside the reasoning (the template opened it in the prompt); an answer may also open it itself
    with the start tag as its first characters (then an optional `label` after the tag is dropped).
    `ends_at`: markers that end the reasoning without the end tag (a family whose model may call a
    tool straight from its thinking); they stay in the answer.

    Whitespace around the reasoning is the template's (`<think>\n...\n</think>\n\n`): the
    reasoning is stripped, and the answer after it starts at its first non-space character."""

    name: ClassVar[str] = ""
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    label: ClassVar[str] = ""
    ends_at: ClassVar[tuple[str, ...]] = ()
    stray_end: ClassVar[bool] = False  # an answer without reasoning may open with a bare end tag (no text)
    keep_tokens: ClassVar[tuple[str, ...]] = ()

    def __init__(self, prompt_tail: str = "") -> None:
        self._inside = self.starts_in_reasoning(prompt_tail)
        self._state = _AT_START
        self._lead = True  # no reasoning text yet: leading whitespace is dropped
        self._held = ""

    def starts_in_reasoning(self, prompt_tail: str) -> bool:
        return prompt_tail.rstrip().endswith(self.start)

    def feed(self, text: str) -> list[Part]:
        if self._state == _DONE:
            return [(PART_TEXT, text)] if text else []
        pending = self._held + text
        self._held = ""
        out: list[Part] = []
        if self._state == _AT_START:
            stripped = pending.lstrip()
            stray = self.stray_end and not self._inside
            if not stripped or self.start.startswith(stripped) or (stray and self.end.startswith(stripped)):
                self._held = pending
                return out
            if stripped.startswith(self.start):
                self._inside = True
                self._state = _LABEL if self.label else _INSIDE
                pending = stripped[len(self.start):]
            elif stray and stripped.startswith(self.end):
                self._state = _ANSWER_LEAD
                pending = stripped[len(self.end):]
            elif not self._inside:
                self._state = _DONE
                return [(PART_TEXT, pending)]
            else:
                self._state = _INSIDE
        if self._state == _LABEL:
            bare = self.label.rstrip("\n")
            if not pending or self.label.startswith(pending) or (
                pending.startswith(bare) and self.end.startswith(pending[len(bare):])
            ):
                self._held = pending
                return out
            self._state = _INSIDE
            if pending.startswith(self.label):
                pending = pending[len(self.label):]
            elif pending.startswith(bare + self.end):
                pending = pending[len(bare):]
        if self._state == _INSIDE:
            if self._lead:
                pending = pending.lstrip()
                if not pending:
                    return out
                self._lead = False
            markers = (self.end, *self.ends_at)
            ends = [(i, m) for m in markers if (i := pending.find(m)) >= 0]
            if not ends:
                keep = held_prefix(pending, markers)
                body = pending[: len(pending) - keep].rstrip()
                self._held = pending[len(body):]
                if body:
                    out.append((PART_REASONING, body))
                return out
            cut, marker = min(ends)
            self._inside = False
            if pending[:cut].rstrip():
                out.append((PART_REASONING, pending[:cut].rstrip()))
            if marker == self.end:
                self._state = _ANSWER_LEAD
                pending = pending[cut + len(marker):]
            else:
                self._state = _DONE
                pending = pending[cut:]
        if self._state == _ANSWER_LEAD:
            pending = pending.lstrip()
            if not pending:
                return out
            self._state = _DONE
        if pending:
            out.append((PART_TEXT, pending))
        return out

    def finish(self, cut: bool = False) -> list[Part]:
        raw, self._held = self._held, ""
        held = raw.rstrip()
        if not held or self._state == _ANSWER_LEAD:
            return []
        if cut and any(m.startswith(held.lstrip()) for m in (self.start, self.end, *self.ends_at)):
            return []  # a tag the token limit cut short: neither the answer's text nor reasoning
        if self._state == _AT_START and not self._inside:
            return [(PART_TEXT, raw)]  # the start of an answer that never opened its reasoning
        return [(PART_REASONING, held)]
