"""Mistral tool calls after the `[TOOL_CALLS]` control token: a JSON array of `{"name",
"arguments"}` (tokenizer v3, Mistral 7B v0.3, Nemo, Small), or `name[ARGS]{...}` per call
(tokenizer v11+, Mistral Small 3.2, Magistral), each after its own `[TOOL_CALLS]`. Call ids are 9
letters and digits, as Mistral's templates require."""

from __future__ import annotations

import json

from trtllm_truss.parsers.base import (
    ToolCallParser,
    alphanumeric_id,
    arguments_json,
    leading_array_items,
    register_tool_parser,
)

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


@register_tool_parser("mistral")
class MistralToolParser(ToolCallParser):
    markers = (TOOL_CALLS,)
    keep_tokens = (TOOL_CALLS, ARGS, CALL_ID)

    def new_id(self) -> str:
        return alphanumeric_id()

    def parse(self, section: str) -> list[tuple[str, str]] | None:
        calls, rest = self._calls(section)
        return calls if calls and not rest else None

    def calls_before_cut(self, section: str) -> tuple[list[tuple[str, str]], str]:
        return self._calls(section, cut=True)

    def _calls(self, section: str, cut: bool = False) -> tuple[list[tuple[str, str]], str]:
        """The calls of the section's chunks up to the first that does not parse, and the rest from
        that chunk on; `cut`: a JSON array cut short still gives the items complete before the cut."""
        calls: list[tuple[str, str]] = []
        chunks = section.split(TOOL_CALLS)[1:]
        for done, chunk in enumerate(chunks):
            rest = TOOL_CALLS + TOOL_CALLS.join(chunks[done:])
            chunk = chunk.strip()
            if ARGS in chunk:  # v11: name[ARGS]{...} (a [CALL_ID] between them is dropped)
                name, _, arguments = chunk.partition(ARGS)
                name = name.split(CALL_ID)[0].strip()
                args = arguments_json(arguments.strip())
                if not name or args is None:
                    return calls, rest
                calls.append((name, args))
                continue
            try:
                value = json.loads(chunk)
            except ValueError:
                if cut:  # the items of the array complete before the cut
                    for item, _ in leading_array_items(chunk):
                        if (call := _call(item)) is None:
                            break
                        calls.append(call)
                return calls, rest
            items = [_call(item) for item in (value if isinstance(value, list) else [value])]
            if None in items:
                return calls, rest
            calls += items
        return calls, ""


def _call(item: object) -> tuple[str, str] | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    args = arguments_json(item.get("arguments", {}))
    return None if args is None else (item["name"], args)
