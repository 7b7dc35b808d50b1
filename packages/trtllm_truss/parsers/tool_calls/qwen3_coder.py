"""Qwen3-Coder (and Qwen3.5, Qwen3-Next's coder template) tool calls: XML, not JSON:

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

A call is committed once `<function=NAME>` is read; its arguments are written as JSON as the
parameters arrive (`parsers.arguments`: a string parameter streams, one newline after its opening
and before its closing tag being the template's; other values are JSON by the tool's schema)."""

from __future__ import annotations

from collections.abc import Generator

from trtllm_truss.guides.tool_syntax import FamilySyntax
from trtllm_truss.parsers.arguments import ArgumentWriter, kind_of
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.scan import (
    NAME_LIMIT,
    Cursor,
    choice,
    space,
    until,
    valid_name,
    value_until,
)
from trtllm_truss.parsers.section import NotACall, ToolCallParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"


@register_tool_parser("qwen3_coder")
class Qwen3CoderToolParser(ToolCallParser):
    markers = (OPEN, FUNCTION)
    keep_tokens = (OPEN, CLOSE)
    forced = FamilySyntax("qwen_3_coder", differs="parameters in the schema's order; a call without parameters has an empty line")

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        if opener == OPEN:
            cur.pos += len(opener)
        while True:
            yield from space(cur)
            self.anchor()
            if (yield from choice(cur, (FUNCTION,))) is None:
                if self.calls and (yield from choice(cur, (CLOSE,))) is not None:
                    self.unanchor()
                    return
                raise NotACall
            name, stop = yield from until(cur, (">",), limit=NAME_LIMIT)
            name = name.strip()
            if stop is None or not valid_name(name):
                raise NotACall
            self.begin(name)
            yield from self.parameters_of(cur, name)
            self.end()
            yield from space(cur)
            self.anchor()
            if (yield from choice(cur, (CLOSE,))) is not None:
                self.unanchor()
                return
            # several functions in one block: go on; anything else is text

    def parameters_of(self, cur: Cursor, name: str) -> Generator[None, None, None]:
        writer = ArgumentWriter(self.args, trim_newline=True)
        schema = self.parameters(name)
        ends = (FUNCTION_END, CLOSE)
        while True:
            _, tag = yield from until(cur, (PARAMETER, *ends))  # text between parameters is dropped
            if tag != PARAMETER:
                writer.close()
                if tag == CLOSE:
                    cur.pos -= len(tag)
                return
            key, stop = yield from until(cur, (">",), limit=NAME_LIMIT)
            if stop is None:
                writer.close()
                return
            key = key.strip()
            writer.key(key, kind_of(schema.get(key)))
            yield from value_until(cur, PARAMETER_END, (PARAMETER, *ends), writer.part)
            writer.value_end()

register_family(
    Family(
        "qwen3_coder", "Qwen3-Coder / Qwen3.5", "qwen3_coder", "qwen3",
        template=(OPEN, FUNCTION, PARAMETER, "<|im_start|>"), thinks=("<think>",),
    )
)
