"""Hermes-style tool calls (Qwen 2.5, Qwen3, Qwen3-2507, NousResearch Hermes; the embedded model's
template): each call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, several in
a row for parallel calls. A call is committed once its name and the `{` of its arguments are read;
its arguments stream as the model writes them (`parsers.json_calls`)."""

from __future__ import annotations

from collections.abc import Generator

from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.json_calls import json_call
from trtllm_truss.parsers.scan import Cursor, space, until
from trtllm_truss.guides.tool_syntax import FamilySyntax
from trtllm_truss.parsers.section import NotACall, ToolCallParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@register_tool_parser("hermes")
class HermesToolParser(ToolCallParser):
    markers = (OPEN,)
    keep_tokens = (OPEN, CLOSE)  # added tokens; kept should a tokenizer mark them special
    forced = FamilySyntax(
        "qwen_3", differs='`<tool_call>\\n` and `\\n</tool_call>` around each call, keys as `{"name": ..., "arguments": ...}`'
    )

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        cur.pos += len(opener)
        yield from space(cur)
        if cur.text[cur.pos] != "{":
            raise NotACall
        yield from json_call(self, cur, stops=(CLOSE,))
        self.end()
        yield from until(cur, (CLOSE,))  # the block's end (anything the model wrote after the object is dropped)

register_family(Family("hermes", "Hermes / Qwen 2.5", "hermes", "qwen3", template=(OPEN,), thinks=("<think>",)))
register_family(Family("qwen3", "Qwen3", "hermes", "qwen3", template=(OPEN, "<think>", "<|im_start|>")))
