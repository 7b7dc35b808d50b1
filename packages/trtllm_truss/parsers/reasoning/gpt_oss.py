"""gpt-oss (OpenAI's harmony format): the answer is messages on channels, each
`<|channel|>NAME[ to=functions.TOOL][ <|constrain|>json]<|message|>BODY` ended by `<|end|>`,
`<|return|>` or `<|call|>`, the next one opened with `<|start|>assistant` (the recipient may also
stand before the channel). `analysis` is the reasoning, `final` (and `commentary` without a
recipient) the answer, and a message to `functions.TOOL` a tool call whose body is its JSON
arguments: committed at the body's `{`, streamed as written (a body that is no object is text).
The tool-call parser `gpt_oss` leaves the text as it is: the calls come from the channels here."""

from __future__ import annotations

import re
from collections.abc import Generator

from trtllm_truss.parsers.base import (
    PART_REASONING,
    PART_TEXT,
    PART_TOOL,
    Part,
    ReasoningParser,
    call_id,
    register_reasoning_parser,
    register_tool_parser,
)
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.scan import (
    Cursor,
    held_prefix,
    json_container,
    json_object_opens,
    space,
    until,
)
from trtllm_truss.parsers.section import ToolCallParser

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|return|>", "<|call|>")
HEADER_LIMIT = 512
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
FUNCTIONS = "functions."


def _harmony_start(head: str) -> bool:
    """Whether an answer's first characters can be a harmony message header."""
    return head.startswith(("<|", "to=")) or "<|".startswith(head) or "to=".startswith(head)


@register_reasoning_parser("gpt_oss")
class GptOssParser(ReasoningParser):
    keep_tokens = (START, CHANNEL, MESSAGE, CONSTRAIN, *ENDS)

    def __init__(self, prompt_tail: str = "") -> None:
        super().__init__(prompt_tail)
        self.calls = 0
        self._cur = Cursor()
        self._out: list[Part] = []
        self._gen = self._messages(self._cur)
        self._plain = False  # the answer is not in harmony's format: all text
        self._tool: str | None = None  # a call's name, read but not committed
        self._kind: str | None = None  # the open body's kind (None: in a header)

    def feed(self, text: str) -> list[Part]:
        if self._plain:
            return [(PART_TEXT, text)] if text else []
        cur = self._cur
        cur.add(text)
        next(self._gen)
        cur.compact()
        out, self._out = self._out, []
        return out

    def finish(self, cut: bool = False) -> list[Part]:
        self._gen.close()
        rest = self._cur.rest()
        if cut and not self._plain:  # a harmony token the limit cut short is no text
            rest = rest[: len(rest) - held_prefix(rest, self.keep_tokens)]
        if self._plain or self._kind in (PART_TEXT, PART_REASONING):
            self._emit(self._kind or PART_TEXT, rest)
        elif self._kind is None and self._tool is not None and cut:
            self._begin(self._tool)  # cut before its body: the call with no arguments yet
        out, self._out = self._out, []
        return out

    def _emit(self, kind: str, text: str) -> None:
        if text:
            self._out.append((kind, text))

    def _begin(self, name: str) -> None:
        self._out.append((PART_TOOL, self.calls, call_id(), name, ""))
        self.calls += 1

    def _args(self, text: str) -> None:
        if text:
            self._out.append((PART_TOOL, self.calls - 1, None, None, text))

    def _messages(self, cur: Cursor) -> Generator[None, None, None]:
        while True:
            self._kind, self._tool = None, None
            while not cur.rest().lstrip():
                yield
            if not self.calls and not _harmony_start(cur.rest().lstrip()[:3]):
                self._plain = True
                self._emit(PART_TEXT, cur.rest())
                cur.pos = len(cur.text)
                while True:
                    yield
            header, stop = yield from until(cur, (MESSAGE,), limit=HEADER_LIMIT)
            if stop is None:  # no harmony header: the rest is text
                self._plain = True
                self._emit(PART_TEXT, cur.rest())
                cur.pos = len(cur.text)
                while True:
                    yield
            header = header.replace(START, " ")
            recipients = [r for r in _RECIPIENT.findall(header) if r != "assistant"]
            channels = _CHANNEL.findall(header)
            if recipients and not recipients[-1].startswith(FUNCTIONS):
                # a call of a built-in tool (`python`, `browser.*`, `container.*`), which this server
                # does not offer: neither a call of the request's tools nor text for the user
                self._kind = PART_TOOL
                yield from until(cur, ENDS)
                continue
            if not recipients:
                self._kind = PART_REASONING if channels and channels[-1] == "analysis" else PART_TEXT
                kind = self._kind
                yield from until(cur, ENDS, emit=lambda text: self._emit(kind, text))
                continue
            self._tool = recipients[-1][len(FUNCTIONS):]
            yield from space(cur)
            if not (yield from json_object_opens(cur)):  # no JSON object: the body is text
                self._kind = PART_TEXT
                yield from until(cur, ENDS, emit=lambda text: self._emit(PART_TEXT, text))
                continue
            self._begin(self._tool)
            self._kind = PART_TOOL
            yield from json_container(cur, self._args, ENDS)
            yield from until(cur, ENDS)


@register_tool_parser("gpt_oss")
class GptOssToolParser(ToolCallParser):
    """Text passes through: gpt-oss's calls are messages on a channel (`GptOssParser`)."""

    forced = (
        "xgrammar's harmony format (`<|channel|>commentary to=functions.NAME<|constrain|>json<|message|>` and"
        " two header orders) refuses every recorded gpt-oss call: OpenAI's harmony docs write a space before"
        " `<|constrain|>`, llama.cpp's tests no `<|constrain|>`"
    )

    def feed(self, text: str) -> list[Part]:
        return [(PART_TEXT, text)] if text else []

    def finish(self, cut: bool = False) -> list[Part]:
        return []


register_family(Family("gpt_oss", "gpt-oss (harmony)", "gpt_oss", "gpt_oss", tokens=(CHANNEL, MESSAGE)))
