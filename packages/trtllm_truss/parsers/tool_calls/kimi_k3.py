"""Kimi K3 tool calls: XTML, tags of the special tokens `<|open|>`, `<|close|>`, `<|sep|>` with
plain-text headers, after the answer (the `kimi_k3` reasoning parser hands this section on):

    <|open|>tools<|sep|>
    <|open|>call tool="NAME" index="1"<|sep|>
    <|open|>argument key="KEY" type="string"<|sep|>VALUE<|close|>argument<|sep|>
    <|close|>call<|sep|>
    <|close|>tools<|sep|>

An argument's body is its text for `type="string"`, JSON for any other type; a call's body may
instead be one `<|open|>json type="object"<|sep|>{...}<|close|>json<|sep|>`. Header values escape
`&` and `"`. A call is committed once its header is read; its arguments are written as JSON as they
arrive (a JSON body streams as written)."""

from __future__ import annotations

from collections.abc import Generator

from trtllm_truss.guides.tool_syntax import DISABLED, FamilySyntax
from trtllm_truss.parsers.arguments import JSON, STRING, ArgumentWriter
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.scan import (
    NAME_LIMIT,
    Cursor,
    attributes,
    json_container,
    space,
    until,
    value_until,
)
from trtllm_truss.parsers.section import ToolCallParser

OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"
TOOLS, TOOLS_END = f"{OPEN}tools{SEP}", f"{CLOSE}tools{SEP}"
CALL, CALL_END = f"{OPEN}call", f"{CLOSE}call{SEP}"
ARGUMENT, ARGUMENT_END = f"{OPEN}argument", f"{CLOSE}argument{SEP}"
JSON_BODY, JSON_END = f"{OPEN}json", f"{CLOSE}json{SEP}"


@register_tool_parser("kimi_k3")
class KimiK3ToolParser(ToolCallParser):
    markers = (TOOLS,)
    keep_tokens = (OPEN, CLOSE, SEP)
    forced = FamilySyntax(
        "kimi_k3", think_opener="<|open|>think<|sep|>", closed=DISABLED, differs="arguments as `argument` elements (not a `json` block)"
    )

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        cur.pos += len(opener)
        while (yield from self.next_call(cur, CALL, TOOLS_END)):
            self.begin((yield from self.header_name(cur, SEP, "tool")))
            writer: ArgumentWriter | None = None
            body = False
            while True:
                _, tag = yield from until(cur, (ARGUMENT, JSON_BODY, CALL_END, TOOLS_END))
                if tag == JSON_BODY and writer is None and not body:
                    body = True
                    yield from until(cur, (SEP,), limit=NAME_LIMIT)
                    yield from space(cur)
                    if cur.text[cur.pos] in "{[":
                        yield from json_container(cur, self.args, (JSON_END, CALL_END))
                    yield from until(cur, (JSON_END, CALL_END))
                    continue
                if tag != ARGUMENT:
                    if tag == TOOLS_END:
                        cur.pos -= len(tag)
                    break
                header, stop = yield from until(cur, (SEP,), limit=NAME_LIMIT)
                marks = attributes(header)
                key = marks.get("key")
                if stop is None or key is None:
                    continue
                writer = writer or ArgumentWriter(self.args)
                writer.key(key, STRING if marks.get("type", "string") == "string" else JSON)
                yield from value_until(cur, ARGUMENT_END, (ARGUMENT, CALL_END, TOOLS_END), writer.part)
                writer.value_end()
            if writer is not None:
                writer.close()
            elif not body:
                self.args("{}")
            self.end()

register_family(Family("kimi_k3", "Kimi K3", "kimi_k3", "kimi_k3", tokens=(OPEN, CLOSE, SEP, "<|end_of_msg|>")))
