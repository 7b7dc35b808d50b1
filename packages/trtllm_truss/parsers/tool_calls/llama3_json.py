"""Llama 3.1 / 3.2 / 3.3 (and Llama 4's JSON template) tool calls: the answer is a JSON object
`{"name": ..., "parameters": {...}}` (or `"arguments"`; a leading `"type": "function"` is allowed),
optionally after `<|python_tag|>`; several are separated by `;` (Llama 3.2) or whitespace, and
may follow some text (`{"name":` opens a call anywhere). An answer that starts with `{` but is no
call is returned as text; that is known once its first key is read (a call's first key is `name`,
`parameters`, `arguments` or `type`)."""

from __future__ import annotations

from collections.abc import Generator

from trtllm_truss.guides.tool_syntax import FamilySyntax
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.json_calls import json_call
from trtllm_truss.parsers.scan import Cursor, space
from trtllm_truss.parsers.section import ToolCallParser

PYTHON_TAG = "<|python_tag|>"
_CALL_STARTS = ('{"name":', '{"type":')


@register_tool_parser("llama3_json")
class Llama3JsonToolParser(ToolCallParser):
    markers = (PYTHON_TAG, '{"name":', '{"type": "function"')
    at_start = ("{", PYTHON_TAG)
    keep_tokens = (PYTHON_TAG,)
    forced = FamilySyntax(
        "llama", differs="a bare JSON object per call (no `<|python_tag|>`)", between=r"[ \t\n]{0,8}(;[ \t\n]{0,8})?"
    )

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        while True:
            while True:  # separators: whitespace, `;`, the tag
                yield from space(cur)
                if cur.text.startswith(PYTHON_TAG, cur.pos):
                    cur.pos += len(PYTHON_TAG)
                elif cur.text[cur.pos] == ";":
                    cur.pos += 1
                elif PYTHON_TAG.startswith(cur.text[cur.pos:]):
                    yield  # perhaps the tag
                else:
                    break
            self.anchor()
            if cur.text[cur.pos] != "{":
                return
            yield from json_call(self, cur, other_keys=("type",), arguments_required=True)
            self.end()

    def opens_call(self, text: str) -> bool:
        """A cut answer's unfinished object is a call when the tag opened it or it begins like one."""
        stripped = text.lstrip(" \t\n;")
        if stripped.startswith(PYTHON_TAG) or PYTHON_TAG.startswith(stripped):
            return True
        compact = "".join(stripped[:40].split())
        return any(compact.startswith(s) or s.startswith(compact) for s in _CALL_STARTS)

register_family(Family("llama3_json", "Llama 3.1 / 3.2 / 3.3", "llama3_json", template=("ipython", '"parameters": ')))
register_family(Family("llama4_json", "Llama 4 (JSON template)", "llama3_json", template=("<|header_start|>", "ipython", '"parameters": ')))
