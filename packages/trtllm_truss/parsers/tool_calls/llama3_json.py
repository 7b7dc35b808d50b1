"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the answer is a JSON object `{"name": ..., "parameters":
{...}}` (or `"arguments"`), optionally after `<|python_tag|>`; several are separated by `;`
(Llama 3.2) or whitespace. An answer that starts with `{` but is no call is returned as text."""

from __future__ import annotations

import json

from trtllm_truss.parsers.base import ToolCallParser, arguments_json, register_tool_parser

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()
_CALL_START = '{"name":'


@register_tool_parser("llama3_json")
class Llama3JsonToolParser(ToolCallParser):
    markers = (PYTHON_TAG,)
    at_start = ("{", PYTHON_TAG)
    keep_tokens = (PYTHON_TAG,)

    def _calls(self, section: str) -> tuple[list[tuple[str, str]], str, bool]:
        """The calls at the start of `section`, the rest from the first that does not parse, and
        whether that rest is only separators."""
        calls: list[tuple[str, str]] = []
        at = 0
        while True:
            start = at
            while True:  # separators: whitespace, `;`, the tag
                if at < len(section) and (section[at].isspace() or section[at] == ";"):
                    at += 1
                elif section.startswith(PYTHON_TAG, at):
                    at += len(PYTHON_TAG)
                else:
                    break
            if at == len(section):
                return calls, "", True
            try:
                value, end = _DECODER.raw_decode(section, at)
            except ValueError:
                return calls, section[start:], False
            if not isinstance(value, dict) or not isinstance(value.get("name"), str):
                return calls, section[start:], False
            arguments = arguments_json(value.get("parameters", value.get("arguments", {})))
            if arguments is None:
                return calls, section[start:], False
            calls.append((value["name"], arguments))
            at = end

    def parse(self, section: str) -> list[tuple[str, str]] | None:
        calls, _, whole = self._calls(section)
        return calls if whole and calls else None

    def calls_before_cut(self, section: str) -> tuple[list[tuple[str, str]], str]:
        calls, rest, _ = self._calls(section)
        return calls, rest

    def opens_call(self, rest: str) -> bool:
        """A cut answer's rest is a call when the tag opened it or it begins `{"name":`: other JSON
        the model wrote is its text."""
        stripped = rest.lstrip(" \t\n;")
        if stripped.startswith(PYTHON_TAG) or PYTHON_TAG.startswith(stripped):
            return True
        compact = "".join(stripped[:40].split())
        return compact.startswith(_CALL_START) or _CALL_START.startswith(compact)
