"""Arguments of the formats that do not write JSON (Qwen3-Coder's `<parameter=...>`, GLM's
`<arg_key>`/`<arg_value>`, MiniMax's and DeepSeek's DSML parameters, Kimi K3's XTML, Gemma 4's and
Python's literals) written as the JSON object OpenAI's `arguments` is, as the parameters arrive:
`{` at once, `"key": ` as a key is read, a string value streamed as it is generated (escaped), any
other value once it is complete, `}` at the call's end. So a call's argument fragments concatenate
to its arguments (`json.dumps` spacing: `{"a": 1, "b": "x"}`), and a call cut short has the JSON
written so far.

A value is a string or JSON by the format's own mark where it has one (DSML's `string="true"`, K3's
`type=`), else by the tool's schema (`kind_of`): a string parameter's text is the string; any other
value is JSON when it parses as JSON (or as a Python literal: `True`, `['a']`), else a string.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Generator, Mapping
from typing import Any

from trtllm_truss.parsers.scan import NAME_LIMIT, Cursor, attributes, until, value_until

STRING, JSON, UNKNOWN = "string", "json", "unknown"
_PYTHON_WORDS = {"True": "true", "False": "false", "None": "null"}


def kind_of(schema: Any) -> str:
    """How a parameter's value is written, from its JSON schema: STRING, JSON, or UNKNOWN (no schema)."""
    if not isinstance(schema, Mapping):
        return UNKNOWN
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and [k for k in kind if k != "null"] == ["string"]):
        return STRING
    if kind is None and isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
        return STRING
    return JSON if kind is not None or "properties" in schema or "items" in schema else UNKNOWN


def _loads(text: str) -> Any:
    """JSON, else a Python literal (Qwen3-Coder's template writes lists and booleans with Python's
    `str`: `['a', 'b']`, `True`); ValueError when it is neither (or not JSON-representable)."""
    try:
        return json.loads(_PYTHON_WORDS.get(text, text))
    except ValueError:
        pass
    try:
        value = ast.literal_eval(text)
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(text) from exc
    return value


def json_text(raw: str, kind: str) -> str:
    """A complete value's JSON: the string for STRING, else its JSON when it parses, else the string."""
    if kind != STRING:
        try:
            return json.dumps(_loads(raw.strip()), ensure_ascii=False, allow_nan=False)
        except ValueError:
            pass
    return json.dumps(raw, ensure_ascii=False)


def typed_value(raw: str, schema: Any) -> Any:
    """A complete value as its parameter's schema types it: a string parameter's text; else its
    JSON, or a number / boolean written loosely (`018956`, `True`), else the text."""
    kind = kind_of(schema)
    if kind == STRING:
        return raw
    value = raw.strip()
    try:
        return _loads(value)
    except ValueError:
        pass
    declared = schema.get("type") if isinstance(schema, Mapping) else None
    declared = declared if isinstance(declared, list) else [declared]
    for kind_name, convert in (("integer", int), ("number", float)):
        if kind_name in declared:
            try:
                return convert(value)
            except ValueError:
                pass
    if "boolean" in declared and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return raw


def escaped(text: str) -> str:
    """`text` as inside a JSON string (no quotes): escapes are per character, so fragments concatenate."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class ArgumentWriter:
    """Writes one call's arguments as JSON through `emit`; `trim_newline`: a streamed string drops one
    newline right after its opening tag and one right before its closing tag (the template's own)."""

    __slots__ = ("_emit", "_keys", "_trim", "_first", "_newline", "_buffer", "_kind", "closed")

    def __init__(self, emit: Callable[[str], None], trim_newline: bool = False) -> None:
        self._emit = emit
        self._keys = 0
        self._trim = trim_newline
        self._first = False
        self._newline = False
        self._buffer: list[str] | None = None
        self._kind = STRING
        self.closed = False
        emit("{")

    def key(self, name: str, kind: str) -> None:
        """A parameter begins; its value follows as `part`s and one `value_end`."""
        self._emit((", " if self._keys else "") + json.dumps(name, ensure_ascii=False) + ": ")
        self._keys += 1
        self._kind = kind
        self._first = True
        self._newline = False
        if kind == STRING:
            self._emit('"')
            self._buffer = None
        else:
            self._buffer = []

    def part(self, text: str) -> None:
        if self._first and text:
            self._first = False
            if self._trim and text.startswith("\n"):
                text = text[1:]
        if self._buffer is not None:
            self._buffer.append(text)
            return
        if not text:
            return
        if self._newline:
            text = "\n" + text
            self._newline = False
        if self._trim and text.endswith("\n"):
            text, self._newline = text[:-1], True
        if text:
            self._emit(escaped(text))

    def value_end(self) -> None:
        if self._buffer is None:
            self._emit('"')
            return
        raw = "".join(self._buffer)
        self._buffer = None
        if self._trim:
            raw = raw.removeprefix("\n").removesuffix("\n")
        self._emit(json_text(raw, self._kind))

    def value(self, name: str, raw: str, kind: str) -> None:
        """A whole parameter at once."""
        self.key(name, JSON if kind != STRING else STRING)
        if kind == STRING:
            self.part(raw)
            self.value_end()
        else:
            self._buffer = None
            self._emit(json_text(raw, kind))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._emit("}")


def tagged_parameters(
    cur: Cursor,
    writer: ArgumentWriter,
    *,
    tag: str,
    closing: str,
    call_end: str,
    section_end: str,
    key_of: Callable[[dict[str, str]], tuple[str | None, str]],
) -> Generator[None, None, None]:
    """A call's parameters written `TAG ATTRIBUTES>VALUE CLOSING` (MiniMax-M2's `<parameter name=..>`,
    DSML's), until the call's end (consumed) or the section's (left for the section): each key and
    how its value is written from the tag's attributes (`key_of`), the value streamed; text between
    parameters is dropped. The arguments are closed at the end."""
    ends = (tag, call_end, section_end)
    while True:
        _, found = yield from until(cur, ends)
        if found != tag:
            if found == section_end:
                cur.pos -= len(found)
            break
        header, stop = yield from until(cur, (">",), limit=NAME_LIMIT)
        key, kind = key_of(attributes(header))
        if stop is None or key is None:
            continue
        writer.key(key, kind)
        yield from value_until(cur, closing, ends, writer.part)
        writer.value_end()
    writer.close()
