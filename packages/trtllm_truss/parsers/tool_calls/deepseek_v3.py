"""DeepSeek V3 / R1 tool calls: `<｜tool▁calls▁begin｜>`, then per call `<｜tool▁call▁begin｜>function
<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>`, then `<｜tool▁calls▁end｜>`; DeepSeek
V3.1's `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` is read too. Each call is
reported as its end token arrives."""

from __future__ import annotations

import re

from trtllm_truss.parsers.base import ToolCallParser, arguments_json, register_tool_parser

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_CALL = re.compile(
    r"\s*(?:<｜tool▁calls▁begin｜>)?\s*<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>\s*", re.DOTALL
)
_V3_BODY = re.compile(r"(.*?)\n```(?:json)?\n(.*?)\n```\s*$", re.DOTALL)


def _call(head: str, body: str) -> tuple[str, str] | None:
    v3 = _V3_BODY.match(body)
    if head.strip() == "function" and v3 is not None:  # V3: type, then name and a fenced JSON
        name, arguments = v3.group(1).strip(), v3.group(2)
    else:  # V3.1: name, then the JSON
        name, arguments = head.strip(), body
    args = arguments_json(arguments.strip())
    return None if not name or args is None else (name, args)


@register_tool_parser("deepseek_v3")
class DeepSeekV3ToolParser(ToolCallParser):
    markers = (CALLS_BEGIN, CALL_BEGIN)
    keep_tokens = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
    trailers = (CALLS_END,)

    call_pattern = _CALL

    def call_of(self, match: re.Match[str]) -> tuple[str, str] | None:
        return _call(match.group(1), match.group(2))

    def parse(self, section: str) -> list[tuple[str, str]] | None:
        calls, consumed = self.complete_calls(section)
        rest = section[consumed:].strip()
        return calls if calls and rest in ("", CALLS_END) else None
