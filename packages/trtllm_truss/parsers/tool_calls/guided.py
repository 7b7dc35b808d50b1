"""Answers constrained by `tool_choice` (api/tools.py's guides): `required` produces a JSON array of
`{"name", "parameters"}`, a named function its arguments object. The whole answer is the calls:
under `required` each is reported as its array item completes, so an answer cut by max_tokens
keeps the calls before the cut (the cut one is dropped); a named call is reported at the end. An
answer that does not parse and was not cut is returned as text."""

from __future__ import annotations

from typing import Any

from trtllm_truss.api.tools import GUIDED_NAMED_PARSER, GUIDED_REQUIRED_PARSER
from trtllm_truss.parsers.base import ToolCallParser, arguments_json, leading_array_items, register_tool_parser


def _call(item: Any) -> tuple[str, str] | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    args = arguments_json(item.get("parameters", {}))
    return None if args is None else (item["name"], args)


@register_tool_parser(GUIDED_REQUIRED_PARSER)
class GuidedRequiredParser(ToolCallParser):
    at_start = ("",)  # the whole answer is the section
    trailers = ("]",)  # what is left once every item has been reported

    def complete_calls(self, section: str) -> tuple[list[tuple[str, str]], int]:
        # `[` then items separated by `,`: each complete item is consumed with the separator before it.
        calls, consumed = [], 0
        for item, end in leading_array_items(section):
            call = _call(item)
            if call is None:
                break  # no call: left for `parse`, which returns it as text
            calls.append(call)
            consumed = end
        return calls, consumed

    def parse(self, section: str) -> list[tuple[str, str]] | None:
        calls, consumed = self.complete_calls(section)
        return calls if calls and section[consumed:].strip() == "]" else None


@register_tool_parser(GUIDED_NAMED_PARSER)
class GuidedNamedParser(ToolCallParser):
    at_start = ("",)

    def parse(self, section: str) -> list[tuple[str, str]] | None:
        args = arguments_json(section.strip())
        return None if args is None or self.arg is None else [(self.arg, args)]
