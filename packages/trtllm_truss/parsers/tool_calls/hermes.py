"""Hermes-style tool calls (Qwen 2.5, Qwen 3, NousResearch Hermes; the embedded model's template):
each call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, several in a row for
parallel calls. A call is reported as soon as its closing tag arrives."""

from __future__ import annotations

import json
import re

from trtllm_truss.parsers.base import ToolCallParser, arguments_json, register_tool_parser

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"\s*<tool_call>(.*?)</tool_call>\s*", re.DOTALL)


def _call(body: str) -> tuple[str, str] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = arguments_json(value.get("arguments", {}))
    return None if arguments is None else (value["name"], arguments)


@register_tool_parser("hermes")
class HermesToolParser(ToolCallParser):
    markers = (OPEN,)

    call_pattern = _BLOCK

    def call_of(self, match: re.Match[str]) -> tuple[str, str] | None:
        return _call(match.group(1))

    def parse(self, section: str) -> list[tuple[str, str]] | None:
        calls, consumed = self.complete_calls(section)
        rest = section[consumed:].strip()
        if rest.startswith(OPEN) and CLOSE not in rest:  # the answer ended before the closing tag
            call = _call(rest[len(OPEN):])
            if call is not None:
                return calls + [call]
        return calls if calls and not rest else None
