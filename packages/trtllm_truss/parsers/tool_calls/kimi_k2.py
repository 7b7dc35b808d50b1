"""Kimi K2 (Instruct, 0905, Thinking) tool calls: `<|tool_calls_section_begin|>`, then per call
`<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>{...}<|tool_call_end|>`, then
`<|tool_calls_section_end|>`. The call's id is the model's own `functions.NAME:INDEX` (Kimi's
template writes the id back into the conversation, so the model sees its own). A call is committed
at the `{` of its arguments, which stream as written."""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from typing import Any

from trtllm_truss.guides.tool_syntax import FamilySyntax
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.scan import (
    NAME_LIMIT,
    Cursor,
    json_container,
    json_object_opens,
    space,
    until,
    valid_name,
)
from trtllm_truss.parsers.section import (
    NotACall,
    ToolCallParser,
    renamed_ids,
)

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGUMENT_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_ID = re.compile(r"(?:functions\.)?(.+?)(?::\d+)?")
_KIMI_ID = re.compile(r"functions\.[^\s:]+:\d+")


def name_of(call_id: str) -> str | None:
    """`functions.get_weather:0` -> `get_weather`."""
    match = _ID.fullmatch(call_id.strip())
    return match.group(1) if match else None


@register_tool_parser("kimi_k2")
class KimiK2ToolParser(ToolCallParser):
    markers = (SECTION_BEGIN, CALL_BEGIN)
    keep_tokens = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END)
    forced = FamilySyntax("kimi")

    def new_id(self, name: str) -> str:
        return f"functions.{name}:{self.calls}"

    @classmethod
    def template_turns(cls, turns: Sequence[Any]) -> Sequence[Any]:
        """Kimi's template writes each call's id back (`<|tool_call_begin|>ID`, `## Return of ID`) and the
        model reads the function from it: ids of another form (`call_...`, a client's own) become
        `functions.NAME:INDEX`, the index counting the conversation's calls, their results' ids with them."""
        return renamed_ids(turns, lambda given, name, index: given if _KIMI_ID.fullmatch(given) else f"functions.{name}:{index}")

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        if opener == SECTION_BEGIN:
            cur.pos += len(opener)
        while (yield from self.next_call(cur, CALL_BEGIN, SECTION_END)):
            head, stop = yield from until(cur, (ARGUMENT_BEGIN, CALL_END), limit=NAME_LIMIT)
            name = name_of(head)
            if stop != ARGUMENT_BEGIN or not valid_name(name):
                raise NotACall
            self.named(name)
            yield from space(cur)
            if not (yield from json_object_opens(cur)):
                raise NotACall
            self.begin(name, head.strip())
            yield from json_container(cur, self.args, (CALL_END, CALL_BEGIN, SECTION_END))
            self.end()
            _, stop = yield from until(cur, (CALL_END, CALL_BEGIN, SECTION_END))
            if stop != CALL_END:  # the model left the call's end out
                cur.pos -= len(stop)

register_family(Family("kimi_k2", "Kimi K2", "kimi_k2", "kimi_k2", template=("<|im_middle|>", "tool_declare"), thinks=("<think>",)))
