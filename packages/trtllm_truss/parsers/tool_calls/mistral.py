"""Mistral tool calls after the `[TOOL_CALLS]` control token: a JSON array of `{"name",
"arguments"}` (tokenizer v3, Mistral 7B v0.3, Nemo, Small), or `name[ARGS]{...}` per call
(tokenizer v11+, Mistral Small 3.2, Magistral), each after its own `[TOOL_CALLS]`. Call ids are 9
letters and digits, as Mistral's templates require."""

from __future__ import annotations

import json

from trtllm_truss.parsers.base import ToolCallParser, alphanumeric_id, arguments_json, register_tool_parser

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


@register_tool_parser("mistral")
class MistralToolParser(ToolCallParser):
    markers = (TOOL_CALLS,)
    keep_tokens = (TOOL_CALLS, ARGS, CALL_ID)

    def new_id(self) -> str:
        return alphanumeric_id()

    def parse(self, section: str) -> list[tuple[str, str]] | None:
        calls = []
        for chunk in section.split(TOOL_CALLS)[1:]:
            chunk = chunk.strip()
            if ARGS in chunk:  # v11: name[ARGS]{...} (a [CALL_ID] between them is dropped)
                name, _, arguments = chunk.partition(ARGS)
                name = name.split(CALL_ID)[0].strip()
                args = arguments_json(arguments.strip())
                if not name or args is None:
                    return None
                calls.append((name, args))
                continue
            try:
                value = json.loads(chunk)
            except ValueError:
                return None
            for item in value if isinstance(value, list) else [value]:
                if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                    return None
                args = arguments_json(item.get("arguments", {}))
                if args is None:
                    return None
                calls.append((item["name"], args))
        return calls or None
