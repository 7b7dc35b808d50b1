"""Incremental text primitives for the tool-call parsers: each is a generator over a `Cursor` that
yields when it needs more text and returns its result, so a family's format reads as the sequence
of steps it is (`name = yield from until(cur, ("<｜tool▁sep｜>",), limit=NAME_LIMIT)`) while the
parser runs per token.

Cost: every primitive resumes where it stopped (its offsets are relative to `cur.pos`, which the
driver keeps valid when it drops consumed text), so a feed costs what it adds plus the few
characters held back as the possible start of a marker.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator
from typing import Any

Step = Generator[None, None, Any]
Emit = Callable[[str], None]

_SPACE = re.compile(r"\s*")
_STRING_BODY = re.compile(r'[^"\\]*')
_SCALAR = re.compile(r"[-+0-9.eEtrufalsn]*")
NAME_LIMIT = 256  # a function name longer than this is no call
_NAME = re.compile(r"[^\s<>{}\[\]()\"'`,;=]+")


def valid_name(name: str | None) -> bool:
    """A function name a call can have: one word (letters, digits, `_.:/-`...; no space, bracket,
    quote or `=`), not absurdly long."""
    return name is not None and len(name) <= NAME_LIMIT and _NAME.fullmatch(name) is not None


class Cursor:
    """The text of a section not yet consumed by the parser: `text[pos:]`. `anchor` is where the
    call being read began (its text, if it turns out no call, is the model's text)."""

    __slots__ = ("text", "pos", "anchor")

    def __init__(self, text: str = "", pos: int = 0) -> None:
        self.text = text
        self.pos = pos
        self.anchor: int | None = None

    def add(self, text: str) -> None:
        self.text += text

    def compact(self) -> None:
        """Forget what no one can come back to (before the anchor, or before `pos`)."""
        keep = self.pos if self.anchor is None else min(self.pos, self.anchor)
        if keep > 0:
            self.text = self.text[keep:]
            self.pos -= keep
            if self.anchor is not None:
                self.anchor -= keep

    def rest(self) -> str:
        return self.text[self.pos:]


def held_prefix(text: str, markers: tuple[str, ...], start: int = 0) -> int:
    """How many characters at the end of `text[start:]` could begin one of `markers` (held back
    while streaming, until the next text decides)."""
    best = 0
    available = len(text) - start
    for marker in markers:
        for length in range(min(len(marker) - 1, available), best, -1):
            if text.endswith(marker[:length]):
                best = length
                break
    return best


def space(cur: Cursor) -> Step:
    """Skip whitespace; waits until a non-space character is there."""
    while True:
        cur.pos = _SPACE.match(cur.text, cur.pos).end()
        if cur.pos < len(cur.text):
            return
        yield


def choice(cur: Cursor, options: tuple[str, ...]) -> Step:
    """Which of `options` starts at `pos` (consumed; the longest where one begins another), or
    None (nothing consumed) once none can."""
    longest = max(len(option) for option in options)
    while True:
        rest = cur.text[cur.pos:cur.pos + longest]
        if not any(len(option) > len(rest) and option.startswith(rest) for option in options):
            found = [option for option in options if rest.startswith(option)]
            if not found:
                return None
            option = max(found, key=len)
            cur.pos += len(option)
            return option
        yield


def until(cur: Cursor, stops: tuple[str, ...], *, emit: Emit | None = None, limit: int | None = None) -> Step:
    """The text up to the first of `stops`, consumed with it: (text, stop). With `emit` the text is
    handed over as it becomes safe (no longer the possible start of a stop) and `text` is "";
    with `limit`, more than `limit` characters and no stop give (text so far, None), nothing consumed."""
    longest = max(len(s) for s in stops)
    scanned = 0  # characters after pos already searched (a stop may still begin in the last ones)
    while True:
        text, pos = cur.text, cur.pos
        start = pos + max(0, scanned - longest + 1)
        found, stop = -1, None
        for s in stops:
            i = text.find(s, start)
            if i >= 0 and (found < 0 or i < found):
                found, stop = i, s
        if stop is not None:
            piece = text[pos:found]
            cur.pos = found + len(stop)
            if emit is not None:
                if piece:
                    emit(piece)
                return "", stop
            return piece, stop
        if limit is not None and len(text) - pos > limit:
            return text[pos:], None
        if emit is not None:
            hold = held_prefix(text, stops, pos)
            safe = len(text) - hold
            if safe > pos:
                emit(text[pos:safe])
                cur.pos = safe
            scanned = hold
        else:
            scanned = len(text) - pos
        yield


_VALUE, _VALUE_OR_END, _KEY, _KEY_OR_END, _COLON, _AFTER = range(6)
_CONTROL = re.compile(r"[\x00-\x1f]")
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_NUMBER_CHARS = re.compile(r"[-+0-9.eE]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LITERALS = {"t": "true", "f": "false", "n": "null"}


class JsonState:
    """Where a scan of a JSON value stands (kept across feeds): the open containers, what may come
    next, whether inside a string (a key's or a value's)."""

    __slots__ = ("stack", "expect", "in_string", "key")

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.expect = _VALUE
        self.in_string = False
        self.key = False


def _escape_control(match: re.Match[str]) -> str:
    return json.dumps(match.group(0))[1:-1]


def _scan_json(text: str, p: int, end: int, st: JsonState, out: list[str]) -> tuple[int, bool, bool]:
    """Validate JSON text from `p` (not beyond `end`), appending what was read to `out` (control
    characters inside strings escaped, as JSON wants them): (where it stopped, whether the value
    closed there, whether the text stopped being JSON there). Stops early before a token cut at `end`."""
    mark = p  # start of the text read but not yet appended
    broken = closed = False
    while p < end:
        if st.in_string:
            q = _STRING_BODY.match(text, p, end).end()
            if _CONTROL.search(text, p, q):
                out.append(text[mark:p])
                out.append(_CONTROL.sub(_escape_control, text[p:q]))
                mark = q
            p = q
            if p >= end:
                break
            if text[p] == "\\":
                if p + 1 >= end:
                    break
                escape = text[p + 1]
                if escape == "u":
                    if p + 6 > end:
                        break
                    if _HEX4.fullmatch(text, p + 2, p + 6) is None:
                        broken = True
                        break
                    p += 6
                elif escape in '"\\/bfnrt':
                    p += 2
                else:
                    broken = True
                    break
                continue
            p += 1  # the closing quote
            st.in_string = False
            st.expect = _COLON if st.key else _AFTER
            continue
        c = text[p]
        if c in " \t\r\n":
            p += 1
            continue
        expect = st.expect
        if expect in (_VALUE, _VALUE_OR_END):
            if c == "{" or c == "[":
                st.stack.append(c)
                st.expect = _KEY_OR_END if c == "{" else _VALUE_OR_END
                p += 1
            elif c == '"':
                st.in_string, st.key = True, False
                p += 1
            elif c == "]" and expect == _VALUE_OR_END:
                p += 1
                closed = _close(st)
                if closed:
                    break
            elif c in _LITERALS:
                word = _LITERALS[c]
                piece = text[p:min(end, p + len(word))]
                if not word.startswith(piece):
                    broken = True
                    break
                if len(piece) < len(word):
                    break  # the rest of the word is still to come
                p += len(word)
                st.expect = _AFTER
            elif c == "-" or c.isdigit():
                q = _NUMBER_CHARS.match(text, p, end).end()
                if q >= end:
                    break  # the number may go on
                if _NUMBER.fullmatch(text, p, q) is None:
                    broken = True
                    break
                p = q
                st.expect = _AFTER
            else:
                broken = True
                break
        elif expect in (_KEY, _KEY_OR_END):
            if c == '"':
                st.in_string, st.key = True, True
                p += 1
            elif c == "}" and expect == _KEY_OR_END:
                p += 1
                closed = _close(st)
                if closed:
                    break
            else:
                broken = True
                break
        elif expect == _COLON:
            if c != ":":
                broken = True
                break
            st.expect = _VALUE
            p += 1
        else:  # _AFTER a value
            top = st.stack[-1] if st.stack else ""
            if c == ",":
                st.expect = _KEY if top == "{" else _VALUE
                p += 1
            elif (c == "}" and top == "{") or (c == "]" and top == "["):
                p += 1
                closed = _close(st)
                if closed:
                    break
            else:
                broken = True
                break
    out.append(text[mark:p])
    return p, closed, broken


def _close(st: JsonState) -> bool:
    st.stack.pop()
    st.expect = _AFTER
    return not st.stack


def json_container(cur: Cursor, emit: Emit, stops: tuple[str, ...] = ()) -> Step:
    """A JSON object or array at `pos` handed to `emit` as it arrives: True once it closed
    (consumed), False when it ended before that: a stop marker came first (not consumed), or the
    text stopped being JSON (left unconsumed from there). What was emitted is therefore always
    valid JSON or the start of it (control characters inside strings are escaped on the way)."""
    state = JsonState()
    scanned = 0
    longest = max((len(s) for s in stops), default=0)
    while True:
        text, pos = cur.text, cur.pos
        end = len(text)
        stopped = False
        if stops:
            start = pos + max(0, scanned - longest + 1)
            found = [i for s in stops if (i := text.find(s, start)) >= 0]
            if found:
                end, stopped = min(found), True
            else:
                end -= held_prefix(text, stops, pos)
        out: list[str] = []
        p, closed, broken = _scan_json(text, pos, end, state, out)
        piece = "".join(out)
        if piece:
            emit(piece)
        cur.pos = p
        if closed:
            return True
        if broken or stopped:
            return False
        scanned = len(text) - cur.pos
        yield


_OPENING = re.compile(r"\{\s*")


def json_object_opens(cur: Cursor) -> Step:
    """Whether the text at `pos` opens a JSON object (`{`, then a key's quote or `}`), waiting until it
    can tell: where a call's arguments must be an object, what the model wrote is a call only from there."""
    while True:
        match = _OPENING.match(cur.text, cur.pos)
        if match is None:
            return False
        if match.end() < len(cur.text):
            return cur.text[match.end()] in '"}'
        yield


def json_scalar(cur: Cursor) -> Step:
    """A JSON number / true / false / null at `pos` (consumed), as text; waits for what follows it."""
    while True:
        end = _SCALAR.match(cur.text, cur.pos).end()
        if end < len(cur.text):
            value = cur.text[cur.pos:end]
            cur.pos = end
            return value
        yield


def json_string(cur: Cursor, emit: Emit | None = None) -> Step:
    """A JSON string at `pos` (which must be `"`): its raw text with the quotes, consumed. With
    `emit` the raw text is handed over as it arrives and "" is returned."""
    out: list[str] = []
    sink = emit or out.append
    cur.pos += 1
    sink('"')
    while True:
        text, p = cur.text, cur.pos
        end = len(text)
        while p < end:
            p = _STRING_BODY.match(text, p).end()
            if p >= end:
                break
            if text[p] == "\\":
                if p + 1 >= end:
                    break
                p += 2
                continue
            sink(text[cur.pos:p + 1])  # through the closing quote
            cur.pos = p + 1
            return "".join(out)
        if p > cur.pos:
            sink(text[cur.pos:p])
            cur.pos = p
        yield


def json_value(cur: Cursor, emit: Emit | None = None, stops: tuple[str, ...] = ()) -> Step:
    """Any JSON value at `pos`: (raw text or "" when emitted, closed). A container or string is
    read to its end; a scalar to the next character that cannot continue it."""
    out: list[str] = []
    sink = emit or out.append
    c = cur.text[cur.pos] if cur.pos < len(cur.text) else ""
    if c in "{[":
        closed = yield from json_container(cur, sink, stops)
    elif c == '"':
        yield from json_string(cur, sink)
        closed = True
    else:
        value = yield from json_scalar(cur)
        sink(value)
        closed = bool(value)
    return "".join(out), closed


def decoded_string(raw: str) -> str | None:
    """A JSON string's raw text (with quotes) as its value, or None when it is not one."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def value_until(cur: Cursor, close: str, others: tuple[str, ...], emit: Emit) -> Step:
    """A tagged value up to its closing tag `close` (consumed), streamed to `emit`; a tag of
    `others` (an opening tag of the next value, the call's end) ends a value whose closing tag the
    model left out, and stays unconsumed. Returns the tag that ended it."""
    _, stop = yield from until(cur, (close, *others), emit=emit)
    if stop != close:
        cur.pos -= len(stop)
    return stop


_ATTRIBUTE = re.compile(r"""([\w:-]+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""")


def attributes(header: str) -> dict[str, str]:
    """`name="get_weather" string="true"` as a dict (XML's `&quot;`, `&lt;`, `&gt;`, `&amp;` unescaped)."""
    out = {}
    for match in _ATTRIBUTE.finditer(header):
        value = next(v for v in match.groups()[1:] if v is not None)
        out[match.group(1)] = value.replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return out
