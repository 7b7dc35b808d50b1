"""Answers constrained by `tool_choice` (api/tools.py's guides): `required` produces a JSON array of
`{"name", "parameters"}`, a named function its arguments object. The whole answer is the calls;
one that does not parse (cut by max_tokens) is returned as text."""

from __future__ import annotations

import json

from trtllm_truss.api.tools import GUIDED_NAMED_PARSER, GUIDED_REQUIRED_PARSER
from trtllm_truss.parsers.base import ToolCallParser, arguments_json, register_tool_parser


@register_tool_parser(GUIDED_REQUIRED_PARSER)
class GuidedRequiredParser(ToolCallParser):
    at_start = ("",)  # the whole answer is the section

    def parse(self, section: str) -> list[tuple[str, str]] | None:
        try:
            value = json.loads(section)
        except ValueError:
            return None
        if not isinstance(value, list):
            return None
        calls = []
        for item in value:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return None
            args = arguments_json(item.get("parameters", {}))
            if args is None:
                return None
            calls.append((item["name"], args))
        return calls or None


@register_tool_parser(GUIDED_NAMED_PARSER)
class GuidedNamedParser(ToolCallParser):
    at_start = ("",)

    def parse(self, section: str) -> list[tuple[str, str]] | None:
        args = arguments_json(section.strip())
        return None if args is None or self.arg is None else [(self.arg, args)]
