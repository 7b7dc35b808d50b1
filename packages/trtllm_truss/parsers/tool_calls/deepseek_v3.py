"""DeepSeek V3, V3-0324 and R1 tool calls: `<｜tool▁calls▁begin｜>`, then per call
`<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>`, then
`<｜tool▁calls▁end｜>` (the V3.1 shape, `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}`, is read too). A
call is committed at the `{` of its arguments, which stream as written."""

from __future__ import annotations

from collections.abc import Generator

from trtllm_truss.guides.tool_syntax import FamilySyntax
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.scan import (
    NAME_LIMIT,
    Cursor,
    choice,
    json_container,
    json_object_opens,
    space,
    until,
    valid_name,
)
from trtllm_truss.parsers.section import NotACall, ToolCallParser

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
TOKENS = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)


class DeepSeekCalls(ToolCallParser):
    """The calls section both V3 and V3.1 write; `typed`: V3's `function<｜tool▁sep｜>NAME\\n```json`."""

    markers = (CALLS_BEGIN, CALL_BEGIN)
    keep_tokens = TOKENS

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        if opener == CALLS_BEGIN:
            cur.pos += len(opener)
        while (yield from self.next_call(cur, CALL_BEGIN, CALLS_END)):
            head, stop = yield from until(cur, (SEP, CALL_END), limit=NAME_LIMIT)
            if stop != SEP:
                raise NotACall
            name = head.strip()
            if name == "function":  # V3: the type, then the name on its own line and a fenced block
                line, stop = yield from until(cur, ("\n",), limit=NAME_LIMIT)
                if stop is None:
                    raise NotACall
                name = line.strip()
                yield from space(cur)
                if (yield from choice(cur, ("```json", "```"))) is not None:
                    yield from space(cur)
            if not valid_name(name):
                raise NotACall
            self.named(name)
            yield from space(cur)
            if not (yield from json_object_opens(cur)):
                raise NotACall
            self.begin(name)
            yield from json_container(cur, self.args, (CALL_END, CALL_BEGIN, CALLS_END))
            self.end()
            _, stop = yield from until(cur, (CALL_END, CALL_BEGIN, CALLS_END))  # past the closing fence
            if stop != CALL_END:  # the model left the call's end out
                cur.pos -= len(stop)


@register_tool_parser("deepseek_v3")
class DeepSeekV3ToolParser(DeepSeekCalls):
    forced = FamilySyntax("deepseek_r1", differs="nothing between `</think>` and the calls; a newline between two calls")

register_family(Family("deepseek_v3", "DeepSeek V3", "deepseek_v3", template=(CALLS_BEGIN, "```json")))
register_family(Family("deepseek_r1", "DeepSeek-R1", "deepseek_v3", "deepseek_r1", template=(CALLS_BEGIN, "```json", "</think>")))
