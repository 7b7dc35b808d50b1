"""Mistral tool calls after the `[TOOL_CALLS]` control token: a JSON array of `{"name",
"arguments"}` (tokenizer v3: Mistral 7B v0.3, Nemo, Small 3.1), or `NAME[ARGS]{...}` per call, each
after its own `[TOOL_CALLS]` (2025 templates, tokenizer v11+: Mistral Small 3.2, Magistral,
Devstral, Ministral 3, Mistral Large 3), with `[CALL_ID]ID` before `[ARGS]` in some. Call ids are
9 letters and digits, as Mistral's templates require (the model's own `[CALL_ID]` when it writes
one). A call is committed at the `{` of its arguments, which stream as written."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Generator, Sequence
from typing import Any

from trtllm_truss.parsers.base import alphanumeric_id, register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.json_calls import json_call_list
from trtllm_truss.parsers.scan import (
    NAME_LIMIT,
    Cursor,
    choice,
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

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")


def _short(call_id: str) -> str:
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


@register_tool_parser("mistral")
class MistralToolParser(ToolCallParser):
    markers = (TOOL_CALLS,)
    keep_tokens = (TOOL_CALLS, ARGS, CALL_ID)
    forced = "xgrammar has no Mistral format"

    def new_id(self, name: str) -> str:
        return alphanumeric_id()

    @classmethod
    def template_turns(cls, turns: Sequence[Any]) -> Sequence[Any]:
        """Mistral's templates refuse ids other than 9 letters and digits: another id (`call_...`, a
        client's own) becomes 9 hex digits of its hash, the same each time (the prompt stays a prefix of
        the next one), its result's id with it."""
        return renamed_ids(turns, lambda given, name, index: given if _MISTRAL_ID.fullmatch(given) else _short(given))

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        cur.pos += len(opener)
        yield from space(cur)
        if cur.text[cur.pos] == "[":  # v3: one JSON array of calls
            yield from json_call_list(self, cur)
            return
        while True:  # v11: NAME[ARGS]{...} after each [TOOL_CALLS]
            head, stop = yield from until(cur, (ARGS, CALL_ID, TOOL_CALLS, "{"), limit=NAME_LIMIT)
            name, id_ = head.strip(), None
            if stop == "{":  # [ARGS] left out of the text (decoded without it): the name runs into the JSON
                cur.pos -= 1
                stop = ARGS
            if stop == CALL_ID:
                given, stop = yield from until(cur, (ARGS, TOOL_CALLS), limit=NAME_LIMIT)
                id_ = given.strip() if len(given.strip()) == 9 and given.strip().isalnum() else None
            if stop != ARGS or not valid_name(name):
                raise NotACall
            self.named(name)
            yield from space(cur)
            if not (yield from json_object_opens(cur)):
                raise NotACall
            self.begin(name, id_)
            yield from json_container(cur, self.args)
            self.end()
            yield from space(cur)
            self.anchor()
            if (yield from choice(cur, (TOOL_CALLS,))) is None:
                return

register_family(Family("mistral", "Mistral (JSON list)", "mistral", "mistral", tokens=(TOOL_CALLS,), thinks=("[THINK]",)))
register_family(Family("devstral", "Mistral 2025 / Devstral / Magistral", "mistral", "mistral", tokens=(TOOL_CALLS, ARGS), thinks=("[THINK]",)))
