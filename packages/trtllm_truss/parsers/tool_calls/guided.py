"""Answers constrained by `tool_choice` (api/tools.py's guides): `required` produces a JSON array of
`{"name", "parameters"}`, a named function its arguments object. The whole answer is the calls, so
a call is committed as soon as its name is read (the named call at once) and its arguments stream
as the model writes them. An answer the token limit cut keeps the call it cut, with the arguments
generated so far; one cut inside a name has no call for it."""

from __future__ import annotations

from collections.abc import Generator

from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.json_calls import json_call_list
from trtllm_truss.parsers.scan import Cursor, json_container
from trtllm_truss.parsers.section import NotACall, ToolCallParser

FORCED = "the guide is the JSON itself"
# The names api/tools.py's tool_guide hands the request core (test_api_tools checks they agree). Written
# here, not imported: the parsers must load without the HTTP layer's schemas (`validate` reads them).
GUIDED_REQUIRED_PARSER, GUIDED_NAMED_PARSER = "guided_required", "guided_named"


@register_tool_parser(GUIDED_REQUIRED_PARSER)
class GuidedRequiredParser(ToolCallParser):
    at_start = ("",)  # the whole answer is the calls
    forced = FORCED

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        if cur.text[cur.pos] != "[":
            raise NotACall
        yield from json_call_list(self, cur, argument_keys=("parameters",), commit_at_name=True)


@register_tool_parser(GUIDED_NAMED_PARSER)
class GuidedNamedParser(ToolCallParser):
    at_start = ("",)
    forced = FORCED

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        if cur.text[cur.pos] != "{" or self.arg is None:
            raise NotACall
        self.begin(self.arg)
        yield from json_container(cur, self.args)
        self.end()
