"""A call written as one JSON object, `{"name": NAME, "arguments": {...}}` (Hermes / Qwen3, Llama's
JSON, Mistral's list, the guided `required` array): read key by key as it streams, the arguments
object handed on as the model writes it once the name is known.

Committed (the name sent) when the name is a string and the arguments begin as an object (`{`; or
at the name, with `commit_at_name`, where a guide makes the object a call whatever follows).
Arguments written before the name are held and sent whole once the object closes; arguments given
as a JSON string holding an object are that object; no arguments at all are `{}`. Anything else
(not an object, a name that is not a string, arguments that are not an object) is no call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtllm_truss.parsers.base import arguments_json
from trtllm_truss.parsers.scan import (
    Cursor,
    Step,
    decoded_string,
    json_container,
    json_object_opens,
    json_string,
    json_value,
    space,
    valid_name,
)
from trtllm_truss.parsers.section import NotACall

if TYPE_CHECKING:
    from trtllm_truss.parsers.section import ToolCallParser

NAME_KEYS = ("name",)
ARGUMENT_KEYS = ("arguments", "parameters")


def json_call(
    parser: ToolCallParser,
    cur: Cursor,
    *,
    name_keys: tuple[str, ...] = NAME_KEYS,
    argument_keys: tuple[str, ...] = ARGUMENT_KEYS,
    other_keys: tuple[str, ...] | None = None,
    commit_at_name: bool = False,
    arguments_required: bool = False,
    stops: tuple[str, ...] = (),
) -> Step:
    """One call object at `pos` (which holds `{`). Returns once the object closed, or, committed,
    at the first text that does not continue it (a stop marker, a missing `}`: left unconsumed).
    `other_keys`: keys allowed before the name and arguments (None: any key; the first key must
    otherwise be one of them, else the object is no call as soon as that key is read);
    `arguments_required`: an object without arguments is no call (else its arguments are `{}`)."""
    cur.pos += 1
    name: str | None = None
    held: str | None = None  # arguments written before the name
    committed = False
    first = True
    while True:
        yield from space(cur)
        c = cur.text[cur.pos]
        if c == "}":
            cur.pos += 1
            break
        if not first:
            if c != ",":
                if committed:
                    return
                raise NotACall
            cur.pos += 1
            yield from space(cur)
            c = cur.text[cur.pos]
        if c != '"':
            if committed:
                return
            raise NotACall
        key = decoded_string((yield from json_string(cur)))
        yield from space(cur)
        if cur.text[cur.pos] != ":":
            if committed:
                return
            raise NotACall
        cur.pos += 1
        yield from space(cur)
        c = cur.text[cur.pos]
        if key in name_keys and name is None:
            name = decoded_string((yield from json_string(cur))) if c == '"' else None
            if not valid_name(name):
                raise NotACall
            parser.named(name)
            if commit_at_name or held is not None:
                parser.begin(name)
                committed = True
                if held is not None:
                    parser.args(held)
        elif key in argument_keys and held is None:
            if c == "{" and name is not None:
                if not committed:
                    if not (yield from json_object_opens(cur)):
                        raise NotACall
                    parser.begin(name)
                    committed = True
                held = ""
                if not (yield from json_container(cur, parser.args, stops)):
                    return  # cut by a stop marker: the call ends there
            elif c == "{":
                held, closed = yield from json_value(cur, None, stops)
                if not closed:
                    raise NotACall
            elif c == '"':
                inner = decoded_string((yield from json_string(cur)))
                if inner is None or arguments_json(inner) is None:
                    if not committed:
                        raise NotACall
                    held = ""
                else:
                    held = inner.strip()
                    if name is not None:
                        if not committed:
                            parser.begin(name)
                            committed = True
                        parser.args(held)
            elif committed:
                held = ""
                yield from json_value(cur, None, stops)
            else:
                raise NotACall
        else:
            if first and other_keys is not None and key not in other_keys and not committed:
                raise NotACall
            _, closed = yield from json_value(cur, None, stops)
            if not closed:
                if committed:
                    return
                raise NotACall
        first = False
    if not committed:
        if name is None or (arguments_required and held is None):
            raise NotACall
        parser.begin(name)
        parser.args(held if held is not None else "{}")
    elif held is None:
        parser.args("{}")  # committed at its name, no arguments written


def json_call_list(parser: ToolCallParser, cur: Cursor, **call: Any) -> Step:
    """A JSON array of call objects at `pos` (`[`, consumed): each read by `json_call(**call)` and
    ended as it closes, then the array's `]` (consumed). An array that holds no call object is no call."""
    cur.pos += 1
    while True:
        yield from space(cur)
        parser.anchor()
        if cur.text[cur.pos] != "{":
            break
        yield from json_call(parser, cur, **call)
        parser.end()
        yield from space(cur)
        if cur.text[cur.pos] != ",":
            break
        cur.pos += 1
    if cur.text[cur.pos] == "]":
        cur.pos += 1
        parser.unanchor()
    elif parser.calls == 0:
        raise NotACall
