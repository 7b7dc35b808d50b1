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

from trtllm_truss.parsers.arguments import ArgumentWriter, kind_of
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.json_calls import valid_name
from trtllm_truss.parsers.scan import NAME_LIMIT, Cursor, attributes, choice, space, until, value_until
from trtllm_truss.parsers.section import NotACall, ToolCallParser
from trtllm_truss.parsers.detect import Family, register_family

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE, INVOKE_END = "<invoke", "</invoke>"
PARAMETER, PARAMETER_END = "<parameter", "</parameter>"


@register_tool_parser("minimax_m2")
class MiniMaxM2ToolParser(ToolCallParser):
    markers = (OPEN,)
    forced = "its arguments are XML parameters, not a JSON object"

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        cur.pos += len(opener)
        while True:
            yield from space(cur)
            self.anchor()
            got = yield from choice(cur, (INVOKE, CLOSE))
            if got is None:
                if self.calls:
                    return
                raise NotACall
            if got == CLOSE:
                self.unanchor()
                return
            header, stop = yield from until(cur, (">",), limit=NAME_LIMIT)
            name = attributes(header).get("name", "").strip()
            if stop is None or not valid_name(name):
                raise NotACall
            self.begin(name)
            writer = ArgumentWriter(self.args)
            schema = self.parameters(name)
            while True:
                _, tag = yield from until(cur, (PARAMETER, INVOKE_END, CLOSE))
                if tag != PARAMETER:
                    if tag == CLOSE:
                        cur.pos -= len(tag)
                    break
                header, stop = yield from until(cur, (">",), limit=NAME_LIMIT)
                key = attributes(header).get("name")
                if stop is None or key is None:
                    continue
                writer.key(key, kind_of(schema.get(key)))
                yield from value_until(cur, PARAMETER_END, (PARAMETER, INVOKE_END, CLOSE), writer.part)
                writer.value_end()
            writer.close()
            self.end()

register_family(Family("minimax_m2", "MiniMax-M2", "minimax_m2", "qwen3", template=(OPEN,), thinks=("<think>",)))
