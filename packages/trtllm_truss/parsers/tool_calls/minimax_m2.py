"""MiniMax-M2 (M2, M2.1, M2.5) tool calls: XML inside `<minimax:tool_call>`:

    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="KEY">VALUE</parameter>
    </invoke>
    </minimax:tool_call>

A call is committed once its `<invoke name="...">` is read; its arguments are written as JSON as
the parameters arrive (a string as it is, other values as JSON by the tool's schema)."""

from __future__ import annotations

from collections.abc import Generator

from trtllm_truss.parsers.arguments import ArgumentWriter, kind_of, tagged_parameters
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.scan import Cursor
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.section import ToolCallParser

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE, INVOKE_END = "<invoke", "</invoke>"
PARAMETER, PARAMETER_END = "<parameter", "</parameter>"


@register_tool_parser("minimax_m2")
class MiniMaxM2ToolParser(ToolCallParser):
    markers = (OPEN,)
    keep_tokens = (OPEN, CLOSE)
    forced = (
        "xgrammar's minimax format writes a newline before `<minimax:tool_call>` (three after `</think>`),"
        " which no recorded MiniMax-M2 output (MiniMax's guide, llama.cpp, vLLM) has"
    )

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        cur.pos += len(opener)
        while (yield from self.next_call(cur, INVOKE, CLOSE)):
            name = yield from self.header_name(cur, ">", "name")
            self.begin(name)
            schema = self.parameters(name)
            yield from tagged_parameters(
                cur, ArgumentWriter(self.args), tag=PARAMETER, closing=PARAMETER_END, call_end=INVOKE_END, section_end=CLOSE,
                key_of=lambda marks: (marks.get("name"), kind_of(schema.get(marks.get("name")))),
            )
            self.end()


register_family(Family("minimax_m2", "MiniMax-M2", "minimax_m2", "qwen3", template=(OPEN,), thinks=("<think>",)))
