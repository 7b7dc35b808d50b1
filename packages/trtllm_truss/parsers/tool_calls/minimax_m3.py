"""MiniMax-M3 tool calls: M2's XML with every tag behind the namespace `]<]minimax[>[` and each
parameter its own tag:

    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="NAME">
    ]<]minimax[>[<KEY>VALUE]<]minimax[>[</KEY>
    ]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

A call is committed once its `<invoke name="...">` is read; its arguments are written as JSON as
the parameters arrive (a string as it is, other values as JSON by the tool's schema)."""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Mapping
from typing import Any

from trtllm_truss.guides.tool_syntax import FamilySyntax
from trtllm_truss.parsers.arguments import (
    JSON,
    STRING,
    ArgumentWriter,
    kind_of,
    typed_value,
)
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.scan import (
    NAME_LIMIT,
    Cursor,
    until,
)
from trtllm_truss.parsers.section import ToolCallParser

NS = "]<]minimax[>["
OPEN, CLOSE = NS + "<tool_call>", NS + "</tool_call>"
INVOKE, INVOKE_END = NS + "<invoke", NS + "</invoke>"


_ELEMENT = re.compile(re.escape(NS) + r"<([^/>\s]+)>")


def nested(raw: str, schema: Any) -> Any:
    """A value written as elements (`NS<city>Paris NS</city>`): an object, repeated keys an array,
    `item` elements an array; with no element, the text typed by its schema."""
    elements: list[tuple[str, str]] = []
    at = 0
    while (match := _ELEMENT.search(raw, at)) is not None:
        key = match.group(1)
        opening, closing = f"{NS}<{key}>", f"{NS}</{key}>"
        depth, i, end = 1, match.end(), len(raw)
        while depth:
            j, k = raw.find(closing, i), raw.find(opening, i)
            if j < 0:
                end = i = len(raw)
                break
            if 0 <= k < j:
                depth, i = depth + 1, k + len(opening)
            else:
                depth, end, i = depth - 1, j, j + len(closing)
        elements.append((key, raw[match.end():end]))
        at = i
    if not elements:
        return typed_value(raw, schema)
    schema = schema if isinstance(schema, Mapping) else {}
    if all(key == "item" for key, _ in elements):
        return [nested(value, schema.get("items")) for _, value in elements]
    properties = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
    out: dict[str, Any] = {}
    for key, value in elements:
        item = nested(value, properties.get(key))
        if key in out:
            out[key] = (out[key] if isinstance(out[key], list) else [out[key]]) + [item]
        else:
            out[key] = item
    return out


@register_tool_parser("minimax_m3")
class MiniMaxM3ToolParser(ToolCallParser):
    markers = (OPEN,)
    forced = FamilySyntax(
        "minimax_m3", think_opener="<mm:think>", differs="not for an object with `additionalProperties` true or a schema (the JSON guide then)"
    )

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        cur.pos += len(opener)
        while (yield from self.next_call(cur, INVOKE, CLOSE)):
            name = yield from self.header_name(cur, ">", "name")
            self.begin(name)
            writer = ArgumentWriter(self.args)
            schema = self.parameters(name)
            while True:
                _, tag = yield from until(cur, (CLOSE, NS + "<"))
                if tag == CLOSE:
                    cur.pos -= len(tag)
                    break
                key, stop = yield from until(cur, (">",), limit=NAME_LIMIT)
                if stop is None:
                    break
                if key.startswith("/"):  # </invoke>: the call's end
                    break
                key = key.strip()
                close = f"{NS}</{key}>"
                if kind_of(schema.get(key)) == STRING:
                    writer.key(key, STRING)
                    _, stop = yield from until(cur, (close, INVOKE_END, CLOSE), emit=writer.part)
                    writer.value_end()
                else:  # whole: it may be elements of its own (an object, an array of <item>s)
                    raw, stop = yield from until(cur, (close, INVOKE_END, CLOSE))
                    writer.key(key, JSON)
                    writer.part(json.dumps(nested(raw, schema.get(key)), ensure_ascii=False))
                    writer.value_end()
                if stop is not None and stop != close:
                    cur.pos -= len(stop)
            writer.close()
            self.end()

# No M3 template is public: found by its namespace, which a template must spell out.
register_family(Family("minimax_m3", "MiniMax-M3", "minimax_m3", "minimax_m3", template=(NS, "<invoke")))
