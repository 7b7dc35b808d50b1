"""Output parsers run in a stream worker on a chat answer's text, as it is decoded: a reasoning
parser splits the model's thinking from its answer, a tool-call parser finds the calls in the
answer. Both are streaming: `feed(text)` returns the parts that are decided (the kinds below:
("text", s), ("reasoning", s), ("tool", index, id, name, arguments)), `finish()` the rest.

A call is reported only once it is complete and parses (arguments a JSON object); text that
starts like a call but does not parse is returned as text, unchanged, unless the token limit cut
the answer (`finish(cut=True)`): then the calls complete before the cut are reported and the call
the limit cut short is dropped, never returned as text. Parsers are registered by name
(`register_tool_parser`, `register_reasoning_parser`), one module per model family.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from typing import Any, ClassVar

# Kinds of the parts of a parsed update (the stream workers send them to the request core as they are).
PART_TEXT = "text"
PART_REASONING = "reasoning"
PART_TOOL = "tool"

TOOL_PARSERS: dict[str, type[ToolCallParser]] = {}
REASONING_PARSERS: dict[str, type[ReasoningParser]] = {}

Part = tuple


def register_tool_parser(name: str) -> Callable[[type[ToolCallParser]], type[ToolCallParser]]:
    def register(cls: type[ToolCallParser]) -> type[ToolCallParser]:
        TOOL_PARSERS[name] = cls
        cls.name = name
        return cls

    return register


def register_reasoning_parser(name: str) -> Callable[[type[ReasoningParser]], type[ReasoningParser]]:
    def register(cls: type[ReasoningParser]) -> type[ReasoningParser]:
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


_DECODER = json.JSONDecoder()
_ARRAY_STEP = re.compile(r"\s*[\[,]\s*")


def leading_array_items(text: str, at: int = 0) -> list[tuple[Any, int]]:
    """The objects complete at the start of a JSON array that may be cut short (`[{...}, {...}, {..`
    gives the first two), each with where it ends; `text[at:]` may also continue after items
    already read (`, {...}`)."""
    items: list[tuple[Any, int]] = []
    while (step := _ARRAY_STEP.match(text, at)) is not None and text.startswith("{", step.end()):
        try:
            value, at = _DECODER.raw_decode(text, step.end())
        except ValueError:
            break
        items.append((value, at))
    return items


def held_prefix(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could begin one of `markers` (held back while
    streaming, until the next text decides)."""
    best = 0
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:length]):
                best = length
                break
    return best


class ToolCallParser:
    """Finds the tool-call section of an answer: text before it streams as text; the section is
    held and its calls reported as each completes (`complete_calls`) or at the end (`parse`).

    A family sets `markers` (strings that open the section anywhere), `at_start` (that open it only
    as the answer's first characters, e.g. Llama's bare JSON object), `keep_tokens` (special
    tokens the decoder must keep as text for the markers to be seen), and implements `parse`."""

    name: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()
    at_start: ClassVar[tuple[str, ...]] = ()
    keep_tokens: ClassVar[tuple[str, ...]] = ()
    trailers: ClassVar[tuple[str, ...]] = ()  # what may close the section after its calls

    def __init__(self, arg: str | None = None) -> None:
        self.arg = arg
        self.calls = 0
        self._held = ""
        self._section: str | None = None
        self._started = False

    def new_id(self) -> str:
        return call_id()

    # --- family hooks -------------------------------------------------------------------------

    def parse(self, section: str) -> list[tuple[str, str]] | None:
        """The section's calls as (name, arguments JSON), or None when it does not parse."""
        raise NotImplementedError

    # A format whose calls are delimited (a closing tag per call) sets `call_pattern`, matching
    # one whole call (and the whitespace around it), and `call_of(match)`: calls are then reported
    # as each completes. Otherwise every call is reported at the end.
    call_pattern: ClassVar[re.Pattern[str] | None] = None

    def call_of(self, match: re.Match[str]) -> tuple[str, str] | None:
        raise NotImplementedError

    def calls_before_cut(self, section: str) -> tuple[list[tuple[str, str]], str]:
        """An answer cut by the token limit: the calls complete at the start of `section`, and the rest."""
        calls, consumed = self.complete_calls(section)
        return calls, section[consumed:]

    def opens_call(self, rest: str) -> bool:
        """Whether `rest` (what follows the complete calls of a cut answer) is the beginning of a
        call, dropped rather than returned as text: by default, a marker or the start of one."""
        stripped = rest.lstrip()
        return any(stripped.startswith(m) or m.startswith(stripped) for m in (*self.markers, *self.at_start))

    def complete_calls(self, section: str) -> tuple[list[tuple[str, str]], int]:
        """Calls complete at the start of `section` while it streams, and how many characters they take."""
        calls: list[tuple[str, str]] = []
        consumed = 0
        if self.call_pattern is None:
            return calls, consumed
        while (match := self.call_pattern.match(section, consumed)) is not None:
            call = self.call_of(match)
            if call is None:
                break  # left for `parse` at the end, which returns it as text
            calls.append(call)
            consumed = match.end()
        return calls, consumed

    # --- streaming ----------------------------------------------------------------------------

    def feed(self, text: str) -> list[Part]:
        if self._section is not None:
            self._section += text
            return self._stream_section()
        pending = self._held + text
        self._held = ""
        if not self._started:
            stripped = pending.lstrip()
            if not stripped:
                self._held = pending
                return []
            for prefix in self.at_start:
                if stripped.startswith(prefix):
                    self._section = stripped
                    return self._stream_section()
                if prefix.startswith(stripped):
                    self._held = pending
                    return []
            self._started = True
        found = [(i, m) for m in self.markers if (i := pending.find(m)) >= 0]
        if found:
            cut = min(found)[0]
            self._section = pending[cut:]
            parts = [(PART_TEXT, pending[:cut])] if cut else []
            return parts + self._stream_section()
        keep = held_prefix(pending, self.markers)
        if keep:
            self._held = pending[-keep:]
            pending = pending[:-keep]
        return [(PART_TEXT, pending)] if pending else []

    def _stream_section(self) -> list[Part]:
        assert self._section is not None
        calls, consumed = self.complete_calls(self._section)
        if not consumed:
            return []
        self._section = self._section[consumed:]
        return self._call_parts(calls)

    def finish(self, cut: bool = False) -> list[Part]:
        """The rest of the answer; `cut`: the token limit ended it (see the module's doc)."""
        if self._section is None:
            held, self._held = self._held, ""
            return [(PART_TEXT, held)] if held else []
        section, self._section = self._section, None
        if section.strip() in ("", *self.trailers):
            return []
        calls = self.parse(section)
        if not calls and cut:
            calls, rest = self.calls_before_cut(section)
            parts = self._call_parts(calls)
            if rest.strip() and not self.opens_call(rest):
                parts.append((PART_TEXT, rest))
            return parts
        if not calls:
            # Malformed: the model's text as it wrote it (after calls already reported, without
            # the whitespace between them, which streaming may or may not have consumed).
            return [(PART_TEXT, section.lstrip() if self.calls else section)]
        return self._call_parts(calls)

    def _call_parts(self, calls: list[tuple[str, str]]) -> list[Part]:
        parts: list[Part] = []
        for name, arguments in calls:
            parts.append((PART_TOOL, self.calls, self.new_id(), name, ""))
            parts.append((PART_TOOL, self.calls, None, None, arguments))
            self.calls += 1
        return parts


class ReasoningParser:
    """Splits `<think>`-style reasoning from the answer: reasoning streams as reasoning parts until
    the end tag, the rest as text. `starts_in_reasoning(prompt_tail)`: whether the answer begins
    inside the reasoning (the template opened it in the prompt); an answer may also open it itself
    with the start tag as its first characters."""

    name: ClassVar[str] = ""
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    keep_tokens: ClassVar[tuple[str, ...]] = ()

    def __init__(self, prompt_tail: str = "") -> None:
        self._inside = self.starts_in_reasoning(prompt_tail)
        self._at_start = True
        self._done = False
        self._held = ""

    def starts_in_reasoning(self, prompt_tail: str) -> bool:
        return prompt_tail.rstrip().endswith(self.start)

    def feed(self, text: str) -> list[Part]:
        if self._done:
            return [(PART_TEXT, text)] if text else []
        pending = self._held + text
        self._held = ""
        if self._at_start:
            stripped = pending.lstrip()
            if not stripped:
                self._held = pending
                return []
            if stripped.startswith(self.start):
                self._inside, self._at_start = True, False
                pending = stripped[len(self.start):]
            elif self.start.startswith(stripped):
                self._held = pending
                return []
            else:
                self._at_start = False
                if not self._inside:
                    self._done = True
                    return [(PART_TEXT, pending)]
        cut = pending.find(self.end)
        if cut >= 0:
            self._done, self._inside = True, False
            parts = [(PART_REASONING, pending[:cut])] if cut else []
            rest = pending[cut + len(self.end):]
            return parts + ([(PART_TEXT, rest)] if rest else [])
        keep = held_prefix(pending, (self.end,))
        if keep:
            self._held = pending[-keep:]
            pending = pending[:-keep]
        return [(PART_REASONING, pending)] if pending else []

    def finish(self, cut: bool = False) -> list[Part]:
        held, self._held = self._held, ""
        if not held:
            return []
        return [(PART_REASONING if self._inside else PART_TEXT, held)]
