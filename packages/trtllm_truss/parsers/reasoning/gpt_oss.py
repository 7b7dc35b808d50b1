"""gpt-oss (OpenAI's harmony format): the answer is messages on channels, each
`<|channel|>NAME[ to=functions.TOOL][ <|constrain|>json]<|message|>BODY` ended by `<|end|>`,
`<|return|>` or `<|call|>`, the next one opened with `<|start|>assistant`. `analysis` is the
reasoning, `final` (and `commentary` without a recipient) the answer, and a message to
`functions.TOOL` a tool call whose body is its JSON arguments. The tool-call parser `gpt_oss`
leaves the text as it is: the calls come from the channels here."""

from __future__ import annotations

import re

from trtllm_truss.parsers.base import (
    Part,
    ReasoningParser,
    ToolCallParser,
    arguments_json,
    call_id,
    held_prefix,
    register_reasoning_parser,
    register_tool_parser,
)
from trtllm_truss.parsers.base import PART_REASONING, PART_TEXT, PART_TOOL

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|return|>", "<|call|>")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


def _harmony_start(head: str) -> bool:
    """Whether an answer's first characters can be a harmony message header."""
    return head.startswith(("<|", "to=")) or "<|".startswith(head) or "to=".startswith(head)


@register_reasoning_parser("gpt_oss")
class GptOssParser(ReasoningParser):
    keep_tokens = (START, CHANNEL, MESSAGE, CONSTRAIN, *ENDS)

    def __init__(self, prompt_tail: str = "") -> None:
        super().__init__(prompt_tail)
        self.calls = 0
        self._header = ""  # the current message's header, until <|message|>
        self._body: str | None = None  # None: reading a header
        self._kind = PART_TEXT  # the current body's part kind, or PART_TOOL
        self._tool: str | None = None
        self._plain = False  # the answer is not in harmony's format: all text

    def feed(self, text: str) -> list[Part]:
        if self._plain:
            return [(PART_TEXT, text)] if text else []
        parts: list[Part] = []
        while text:
            if self._body is None:
                self._header += text
                text = ""
                head = self._header.lstrip()
                if head and not _harmony_start(head):
                    self._plain = True
                    parts.append((PART_TEXT, self._header))
                    self._header = ""
                    break
                if MESSAGE in self._header:
                    header, _, text = self._header.partition(MESSAGE)
                    self._header = ""
                    self._open(header)
            else:
                pending = self._body + text
                text = ""
                found = [(i, e) for e in ENDS if (i := pending.find(e)) >= 0]
                if found:
                    cut, end = min(found)
                    parts += self._close(pending[:cut])
                    text = pending[cut + len(end):]
                    self._body = None
                    continue
                keep = held_prefix(pending, ENDS) if self._kind != PART_TOOL else 0
                if self._kind == PART_TOOL:
                    self._body = pending  # a call is reported whole
                else:
                    self._body = pending[len(pending) - keep:] if keep else ""
                    out = pending[: len(pending) - keep]
                    if out:
                        parts.append((self._kind, out))
        return parts

    def _open(self, header: str) -> None:
        header = header.replace(START, " ")
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        self._tool = recipient.group(1) if recipient else None
        if self._tool is not None:
            self._kind = PART_TOOL
        else:
            self._kind = PART_REASONING if channel is not None and channel.group(1) == "analysis" else PART_TEXT
        self._body = ""

    def _close(self, body: str) -> list[Part]:
        if self._kind != PART_TOOL:
            return [(self._kind, body)] if body else []
        arguments = arguments_json(body.strip())
        if arguments is None or self._tool is None:
            return [(PART_TEXT, body)]
        index, self.calls = self.calls, self.calls + 1
        return [(PART_TOOL, index, call_id(), self._tool, ""), (PART_TOOL, index, None, None, arguments)]

    def finish(self, cut: bool = False) -> list[Part]:
        if self._body is None:
            self._header = ""
            return []  # an unfinished header is no text of the answer
        body, self._body = self._body, None
        if cut and self._kind == PART_TOOL and arguments_json(body.strip()) is None:
            return []  # a call the token limit cut short: dropped, not text
        return self._close(body)


@register_tool_parser("gpt_oss")
class GptOssToolParser(ToolCallParser):
    """Text passes through: gpt-oss's calls are messages on a channel (`GptOssParser`)."""

    def feed(self, text: str) -> list[Part]:
        return [(PART_TEXT, text)] if text else []

    def finish(self, cut: bool = False) -> list[Part]:
        return []
