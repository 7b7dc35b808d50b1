"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the answer is a JSON object `{"name": ..., "parameters":
{...}}` (or `"arguments"`), optionally after `<|python_tag|>`; several are separated by `;`
(Llama 3.2) or whitespace. An answer that starts with `{` but is no call is returned as text."""

from __future__ import annotations

import json

from trtllm_truss.parsers.base import ToolCallParser, arguments_json, register_tool_parser

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


@register_tool_parser("llama3_json")
class Llama3JsonToolParser(ToolCallParser):
    markers = (PYTHON_TAG,)
    at_start = ("{", PYTHON_TAG)
    keep_tokens = (PYTHON_TAG,)

    def parse(self, section: str) -> list[tuple[str, str]] | None:
        text = section.replace(PYTHON_TAG, " ")
        calls, at = [], 0
        while True:
            while at < len(text) and (text[at].isspace() or text[at] == ";"):
                at += 1
            if at == len(text):
                return calls or None
            try:
                value, at = _DECODER.raw_decode(text, at)
            except ValueError:
                return None
            if not isinstance(value, dict) or not isinstance(value.get("name"), str):
                return None
            arguments = arguments_json(value.get("parameters", value.get("arguments", {})))
            if arguments is None:
                return None
            calls.append((value["name"], arguments))
