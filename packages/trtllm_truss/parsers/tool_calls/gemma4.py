"""Gemma 4 tool calls: `<|tool_call>call:NAME{key:VALUE,...}<tool_call|>` per call, where the
arguments are JSON with bare keys and strings between `<|"|>` delimiters (special tokens) instead
of quotes: `{location:<|"|>Paris<|"|>,days:3}`. A call is committed once `call:NAME{` is read; its
arguments are rewritten as JSON as they arrive (keys quoted, strings escaped and streamed)."""

from __future__ import annotations

import json
import re
from collections.abc import Generator

from trtllm_truss.parsers.arguments import escaped
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.scan import (
    NAME_LIMIT,
    Cursor,
    Emit,
    Step,
    choice,
    held_prefix,
    space,
    until,
    valid_name,
)
from trtllm_truss.parsers.section import NotACall, ToolCallParser

OPEN, CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_WORD = re.compile(r"[A-Za-z0-9_.+\-]*")
_SPACE = re.compile(r"\s*")


def gemma_value(cur: Cursor, emit: Emit, stops: tuple[str, ...]) -> Step:
    """Gemma's object at `pos` (`{`) rewritten as JSON through `emit`: True once it closed, False
    when a stop came first."""
    stack: list[str] = []
    expect_key = False
    in_string = False
    markers = (QUOTE, *stops)
    while True:
        text, p = cur.text, cur.pos
        found = [i for s in stops if (i := text.find(s, p)) >= 0]
        end = min(found) if found else len(text) - held_prefix(text, markers, p)
        while p < end:
            if in_string:
                q = text.find(QUOTE, p, end)
                stop = end if q < 0 else q
                if stop > p:
                    emit(escaped(text[p:stop]))
                p = stop
                if q < 0:
                    break
                emit('"')
                p += len(QUOTE)
                in_string = False
                continue
            p = _SPACE.match(text, p, end).end()
            if p >= end:
                break
            c = text[p]
            if text.startswith(QUOTE, p):
                if p + len(QUOTE) > end:
                    break
                emit('"')
                in_string = True
                p += len(QUOTE)
            elif c in "{[":
                stack.append(c)
                emit(c)
                expect_key = c == "{"
                p += 1
            elif c in "}]":
                if stack:
                    stack.pop()
                emit(c)
                p += 1
                expect_key = False
                if not stack:
                    cur.pos = p
                    return True
            elif c == ",":
                emit(", ")
                expect_key = bool(stack) and stack[-1] == "{"
                p += 1
            elif c == ":":
                emit(": ")
                expect_key = False
                p += 1
            elif c == '"':  # a plain JSON string
                q = p + 1
                while True:
                    q = text.find('"', q, end)
                    if q < 0 or text[q - 1] != "\\":
                        break
                    q += 1
                if q < 0:
                    break
                emit(json.dumps(json.loads(text[p:q + 1]), ensure_ascii=False) if _valid_string(text[p:q + 1]) else text[p:q + 1])
                p = q + 1
                expect_key = False
            else:
                word_end = _WORD.match(text, p, end).end()
                if word_end >= end or word_end == p:
                    if word_end == p:  # not a character of this format: kept as it is
                        emit(escaped(c) if expect_key else c)
                        p += 1
                        continue
                    break  # the word may go on
                word = text[p:word_end]
                emit(json.dumps(word) if expect_key else word)
                expect_key = False
                p = word_end
        cur.pos = p
        if found and p >= end:
            return False
        yield


def _valid_string(raw: str) -> bool:
    try:
        return isinstance(json.loads(raw), str)
    except ValueError:
        return False


@register_tool_parser("gemma4")
class Gemma4ToolParser(ToolCallParser):
    markers = (OPEN,)
    keep_tokens = (OPEN, CLOSE, QUOTE)
    forced = "xgrammar 0.2.8 does not register its Gemma 4 format"

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        cur.pos += len(opener)
        yield from space(cur)
        if (yield from choice(cur, ("call:",))) is None:
            raise NotACall
        name, stop = yield from until(cur, ("{", CLOSE), limit=NAME_LIMIT)
        name = name.strip()
        if stop != "{" or not valid_name(name):
            raise NotACall
        cur.pos -= 1
        self.begin(name)
        yield from gemma_value(cur, self.args, (CLOSE,))
        self.end()
        yield from until(cur, (CLOSE,))

register_family(Family("gemma4", "Gemma 4", "gemma4", "gemma4", tokens=(OPEN, QUOTE), thinks=("<|channel>",)))
