"""Kimi K3 reasoning: its answer is XTML channels, `<|open|>think<|sep|>REASONING<|close|>think<|sep|>`,
`<|open|>response<|sep|>TEXT<|close|>response<|sep|>`, then its calls section
(`<|open|>tools<|sep|>...<|close|>tools<|sep|>`, handed on as text to the `kimi_k3` tool-call
parser) and `<|close|>message<|sep|>`. The prompt ends inside the think channel (thinking, the
default) or the response channel (`thinking: false`), so the answer begins inside one of them."""

from __future__ import annotations

from collections.abc import Generator

from trtllm_truss.parsers.base import (
    PART_REASONING,
    PART_TEXT,
    Part,
    ReasoningParser,
    register_reasoning_parser,
)
from trtllm_truss.parsers.scan import Cursor, choice, until

OPEN, CLOSE, SEP, END_OF_MESSAGE = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
THINK, THINK_END = f"{OPEN}think{SEP}", f"{CLOSE}think{SEP}"
RESPONSE, RESPONSE_END = f"{OPEN}response{SEP}", f"{CLOSE}response{SEP}"
TOOLS, TOOLS_END = f"{OPEN}tools{SEP}", f"{CLOSE}tools{SEP}"
MESSAGE_END = f"{CLOSE}message{SEP}"


@register_reasoning_parser("kimi_k3")
class KimiK3ReasoningParser(ReasoningParser):
    keep_tokens = (OPEN, CLOSE, SEP, END_OF_MESSAGE)

    def __init__(self, prompt_tail: str = "") -> None:
        super().__init__(prompt_tail)
        tail = prompt_tail.rstrip()
        channel = PART_REASONING if tail.endswith(THINK) else PART_TEXT if tail.endswith(RESPONSE) else None
        self._cur = Cursor()
        self._out: list[Part] = []
        self._kind: str | None = channel
        self._gen = self._channels(self._cur, channel)

    def _emit(self, kind: str, text: str) -> None:
        if text:
            if self._out and self._out[-1][0] == kind:
                self._out[-1] = (kind, self._out[-1][1] + text)
            else:
                self._out.append((kind, text))

    def feed(self, text: str) -> list[Part]:
        self._cur.add(text)
        next(self._gen)
        self._cur.compact()
        out, self._out = self._out, []
        return out

    def finish(self, cut: bool = False) -> list[Part]:
        self._gen.close()
        rest = self._cur.rest()
        # not a closing tag, nor (the token limit ended it) a tag it cut short
        tags = (MESSAGE_END, END_OF_MESSAGE, *((THINK, RESPONSE, TOOLS, THINK_END, RESPONSE_END) if cut else ()))
        if rest and not any(m.startswith(rest) for m in tags):
            self._emit(self._kind or PART_TEXT, rest)
        out, self._out = self._out, []
        return out

    def _channels(self, cur: Cursor, channel: str | None) -> Generator[None, None, None]:
        if channel is not None:
            end = THINK_END if channel == PART_REASONING else RESPONSE_END
            yield from until(cur, (end,), emit=lambda text: self._emit(channel, text))
        while True:  # between channels
            self._kind = None
            got = yield from choice(cur, (THINK, RESPONSE, TOOLS, MESSAGE_END, END_OF_MESSAGE))
            if got == THINK:
                self._kind = PART_REASONING
                yield from until(cur, (THINK_END,), emit=lambda text: self._emit(PART_REASONING, text))
            elif got == RESPONSE:
                self._kind = PART_TEXT
                yield from until(cur, (RESPONSE_END,), emit=lambda text: self._emit(PART_TEXT, text))
            elif got == TOOLS:  # the calls section, as text for the tool-call parser
                self._emit(PART_TEXT, TOOLS)
                self._kind = PART_TEXT
                yield from until(cur, (TOOLS_END,), emit=lambda text: self._emit(PART_TEXT, text))
                self._emit(PART_TEXT, TOOLS_END)
            elif got is None:  # text outside any channel is the answer's (an unknown tag too)
                self._kind = PART_TEXT
                tag = next((t for t in (OPEN, CLOSE) if cur.text.startswith(t, cur.pos)), None)
                if tag is not None:
                    self._emit(PART_TEXT, tag)
                    cur.pos += len(tag)
                    continue
                _, stop = yield from until(cur, (OPEN, CLOSE, END_OF_MESSAGE), emit=lambda text: self._emit(PART_TEXT, text))
                cur.pos -= len(stop)
