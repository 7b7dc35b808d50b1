"""GLM-4.5, GLM-4.6 and GLM-4.7 tool calls (Zhipu): the name after `<tool_call>`, then key and value
pairs, neither JSON:

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

(GLM-4.7 writes no newline after the name.) A value is the template's text: a string as it is,
anything else as JSON (`{{ v | tojson }}`), told apart by the tool's schema (`parsers.arguments`).
A call is committed once its name is read (a newline, its first `<arg_key>` or its end); its
arguments are written as JSON as the pairs arrive."""

from __future__ import annotations

from collections.abc import Generator

from trtllm_truss.guides.tool_syntax import DISABLED, FamilySyntax
from trtllm_truss.parsers.arguments import ArgumentWriter, kind_of
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.scan import (
    NAME_LIMIT,
    Cursor,
    choice,
    space,
    until,
    valid_name,
    value_until,
)
from trtllm_truss.parsers.section import NotACall, ToolCallParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


class KeyValueCalls(ToolCallParser):
    """`<tool_call>NAME` then `<arg_key>`/`<arg_value>` pairs, `</tool_call>` (GLM, Poolside)."""

    markers = (OPEN,)
    keep_tokens = (OPEN, CLOSE, KEY, KEY_END, VALUE, VALUE_END)
    forced = FamilySyntax("glm_4_7")

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        cur.pos += len(opener)
        yield from space(cur)
        name, stop = yield from until(cur, ("\n", KEY, CLOSE), limit=NAME_LIMIT)
        name = name.strip()
        if stop is None or not valid_name(name):
            raise NotACall
        if stop != "\n":
            cur.pos -= len(stop)
        self.begin(name)
        writer = ArgumentWriter(self.args)
        schema = self.parameters(name)
        while True:
            _, tag = yield from until(cur, (KEY, CLOSE))
            if tag == CLOSE:
                break
            key, stop = yield from until(cur, (KEY_END, VALUE, CLOSE), limit=NAME_LIMIT)
            if stop is None or stop == CLOSE:
                break
            if stop == VALUE:
                cur.pos -= len(stop)
            key = key.strip()
            yield from space(cur)
            if (yield from choice(cur, (VALUE,))) is None:
                continue  # a key without its value
            writer.key(key, kind_of(schema.get(key)))
            if (yield from value_until(cur, VALUE_END, (), writer.part)) == CLOSE:
                writer.value_end()
                yield from choice(cur, (CLOSE,))
                break
            writer.value_end()
        writer.close()
        self.end()


# GLM-4.5/4.6 think as `\n<think>...</think>\n` where xgrammar's glm_4_7 format takes no newline around the
# block (GLM-4.7's shape): their forced calls come without thinking rather than with it bent.
NO_THINKING = FamilySyntax(
    "glm_4_7", closed=DISABLED, differs="no thinking before a forced call (xgrammar's format has no newline before `<think>` or after `</think>`)"
)


@register_tool_parser("glm45")
class Glm45ToolParser(KeyValueCalls):
    forced = NO_THINKING


@register_tool_parser("glm47")
class Glm47ToolParser(KeyValueCalls):
    pass


register_family(
    Family("glm45", "GLM-4.5 / 4.6", "glm45", "glm45", template=("[gMASK]", OPEN, KEY, VALUE), thinks=("<think>",))
)
register_family(
    Family("glm47", "GLM-4.7", "glm47", "glm45", template=("[gMASK]", OPEN, KEY, VALUE, "clear_thinking"), thinks=("<think>",))
)
