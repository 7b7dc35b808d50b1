"""Pythonic tool calls (Llama 3.2 1B/3B, Llama 4's pythonic template, and models trained on it): the
answer is a Python list of calls, `[get_weather(city="Paris", days=3), get_time()]`, optionally
between Llama 4's `<|python_start|>` and `<|python_end|>`. A call is committed once the list opens
the answer and `NAME(` is read; its keyword arguments are rewritten as JSON as they arrive (a
string streams; other literals, `True`/`None`/lists/dicts, once complete, by Python's rules)."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Generator

from trtllm_truss.parsers.arguments import JSON, STRING, ArgumentWriter
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.scan import (
    NAME_LIMIT,
    Cursor,
    Emit,
    Step,
    choice,
    space,
    until,
)
from trtllm_truss.parsers.section import NotACall, ToolCallParser

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
_NAME = re.compile(r"(?:[A-Za-z_][\w.]*)?")
_ESCAPE_LENGTH = {"x": 4, "u": 6, "U": 10}
_SPACE = re.compile(r"\s*")


def python_string(cur: Cursor, emit: Emit) -> Step:
    """A Python string literal at `pos` streamed as its value (escapes decoded), for `ArgumentWriter.part`."""
    quote = cur.text[cur.pos]
    cur.pos += 1
    while True:
        text, p = cur.text, cur.pos
        while p < len(text):
            q = p
            while q < len(text) and text[q] != quote and text[q] != "\\":
                q += 1
            if q > p:
                emit(text[p:q])
                p = q
            if q >= len(text):
                break
            if text[q] == quote:
                cur.pos = q + 1
                return
            size = _ESCAPE_LENGTH.get(text[q + 1], 2) if q + 1 < len(text) else 2
            if q + size > len(text):
                break
            try:
                emit(ast.literal_eval('"' + text[q:q + size] + '"'))
            except (ValueError, SyntaxError):
                emit(text[q:q + size])
            p = q + size
        cur.pos = p
        yield


def python_literal(cur: Cursor) -> Step:
    """Any other Python literal at `pos` up to the `,` or `)` that ends it: its JSON text (a value
    JSON cannot hold, or no literal at all, is its text as a string)."""
    depth, seen, quote = 0, 0, ""  # `seen`: characters after pos already read
    while True:
        text = cur.text
        p = cur.pos + seen
        while p < len(text):
            c = text[p]
            if quote:
                if c == "\\":
                    if p + 1 >= len(text):
                        break
                    p += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                break
            p += 1
        if p < len(text) and not (quote and text[p] == "\\"):
            raw = text[cur.pos:p].strip()
            cur.pos = p
            try:
                return json.dumps(ast.literal_eval(raw), ensure_ascii=False, allow_nan=False)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                return json.dumps(raw, ensure_ascii=False)
        seen = min(p, len(text)) - cur.pos
        yield


def call_name(cur: Cursor) -> Step:
    """`NAME(` at `pos` (consumed): the name; no call as soon as the text cannot be one."""
    while True:
        end = _NAME.match(cur.text, cur.pos).end()
        if end - cur.pos > NAME_LIMIT:
            raise NotACall
        if end < len(cur.text):
            if end == cur.pos or cur.text[end] != "(":
                raise NotACall
            name = cur.text[cur.pos:end]
            cur.pos = end + 1
            return name
        yield


@register_tool_parser("pythonic")
class PythonicToolParser(ToolCallParser):
    markers = (PYTHON_START,)
    at_start = ("[",)
    keep_tokens = (PYTHON_START, PYTHON_END)
    forced = "xgrammar has no format for Python-call syntax"

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        if opener == PYTHON_START:
            cur.pos += len(opener)
            yield from space(cur)
        if cur.text[cur.pos] != "[":
            raise NotACall
        cur.pos += 1
        while True:
            yield from space(cur)
            self.anchor()
            name = yield from call_name(cur)
            self.begin(name)
            writer = ArgumentWriter(self.args)
            while True:
                yield from space(cur)
                if cur.text[cur.pos] == ")":
                    cur.pos += 1
                    break
                if cur.text[cur.pos] == ",":
                    cur.pos += 1
                    continue
                key, stop = yield from until(cur, ("=", ")"), limit=NAME_LIMIT)
                if stop != "=":
                    break
                yield from space(cur)
                if cur.text[cur.pos] in "'\"":
                    writer.key(key.strip(), STRING)
                    yield from python_string(cur, writer.part)
                    writer.value_end()
                else:
                    writer.value(key.strip(), (yield from python_literal(cur)), JSON)
            writer.close()
            self.end()
            yield from space(cur)
            if cur.text[cur.pos] == ",":
                cur.pos += 1
                continue
            if cur.text[cur.pos] == "]":
                cur.pos += 1
                self.unanchor()
                if opener == PYTHON_START:
                    yield from space(cur)
                    yield from choice(cur, (PYTHON_END,))
            return

register_family(Family("pythonic", "pythonic calls (vLLM's pythonic templates)", "pythonic", template=("[func_name1(",)))
register_family(Family("llama4_pythonic", "Llama 4", "pythonic", template=("<|header_start|>", "[func_name1(")))
