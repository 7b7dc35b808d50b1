"""The tool-call parser every family builds on: text streams as text until a marker opens a call
section, whose calls the family's `section` generator reads (`parsers.scan` primitives), reporting
each call as it is read: its name first (`begin`), then its arguments as they are generated (`args`).

**Committing.** A call's name is sent only once the parser knows the text is a call: each family
says when (`begin`; as a rule, the name complete and, for JSON arguments, an object opened: `{"` or
`{}`, `scan.json_object_opens`). Until
then the call's text is held from its `anchor`; if it turns out no call (`NotACall`), that text is
returned as the model's text, unchanged, and parsing goes on after it. After commitment the call
stays a call: what follows is its arguments as generated, whatever they are.

**The end of the answer** (`finish`): a call the answer ended inside is a call with the arguments
generated so far, whether the token limit (`cut`) or the model ended it. A call not yet committed
is the model's text, unless the limit cut it: then, with its name complete, it is a call whose
arguments are what was generated ("" when none), and without its name it is dropped (no call can
be made of half a name, and it is not the model's text either).

Whitespace is no text where it only separates calls: right after a call, and before a call with
nothing but whitespace before it since the answer's start or the last call.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, ClassVar

from trtllm_truss.guides.tool_syntax import FamilySyntax
from trtllm_truss.parsers.base import PART_TEXT, PART_TOOL, Part, call_id
from trtllm_truss.parsers.scan import (
    NAME_LIMIT,
    Cursor,
    attributes,
    choice,
    held_prefix,
    space,
    until,
    valid_name,
)


class NotACall(Exception):
    """Raised by a section generator: the text since the anchor is no call after all."""


class ToolCallParser:
    """A family's tool-call parser (registered by name: `base.register_tool_parser`).

    A family sets `markers` (text that opens its call section anywhere in the answer), `at_start`
    (text that opens it only as the answer's first non-space characters, e.g. Llama's bare JSON
    object; "" for an answer that is all calls), `keep_tokens` (special tokens the decoder must keep
    as text for its markers to be seen), `forced` (the `guides.tool_syntax.FamilySyntax` a forced
    call is guided by, in the family's own syntax, or why the JSON guide stays) and implements `section(cur, opener)`.
    """

    name: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()
    at_start: ClassVar[tuple[str, ...]] = ()
    keep_tokens: ClassVar[tuple[str, ...]] = ()
    forced: ClassVar[FamilySyntax | str] = "not declared"

    def __init__(self, arg: str | None = None, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.arg = arg  # the named function of a guided tool_choice
        self.tools = {t["function"]["name"]: t["function"] for t in tools or () if "function" in t}
        self.calls = 0
        self._cur = Cursor()
        self._gen: Generator[None, None, None] | None = None
        self._out: list[Part] = []
        self._started = False  # any non-space text seen (at_start openers only before that)
        self._after_call = False  # right after a call: whitespace is no text
        self._open = False  # a committed call not yet ended
        self._pending: str | None = None  # the name of the call being read, before commitment
        self._scanned = 0  # text-mode characters after pos already searched for markers
        self._gap = ""  # whitespace before a call section with no text before it: no text if the call commits
        self._said = False  # text other than whitespace since the answer's start or the last call

    # --- what a family's section generator calls ---------------------------------------------------

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        """Read the calls from `opener` (at `cur.pos`, not consumed: an `at_start` opener such as `{`
        is part of the call); return at the section's end (what follows is text again), raise
        `NotACall` for text that is no call."""
        raise NotImplementedError

    def anchor(self) -> None:
        """A call begins at `pos`: its text is the model's text if it turns out no call (from the
        section's start while no call of the section is committed)."""
        if self._cur.anchor is None:
            self._cur.anchor = self._cur.pos
        self._pending = None

    def unanchor(self) -> None:
        """What was read since the anchor is no call's and no text (a section's closing marker)."""
        self._cur.anchor = None

    def named(self, name: str) -> None:
        """The call's name is known (not yet committed): a cut answer keeps it as a call."""
        self._pending = name

    def begin(self, name: str, id_: str | None = None) -> None:
        """Commit: the call is a call; its first part carries its index, id and name."""
        self._gap = ""
        self._out.append((PART_TOOL, self.calls, id_ or self.new_id(name), name, ""))
        self.calls += 1
        self._open = True
        self._pending = None
        self._cur.anchor = None

    def args(self, fragment: str) -> None:
        if fragment:
            self._out.append((PART_TOOL, self.calls - 1, None, None, fragment))

    def end(self) -> None:
        self._open = False
        self._after_call = True
        self._said = False

    def new_id(self, name: str) -> str:
        return call_id()

    def next_call(self, cur: Cursor, opener: str, closer: str) -> Generator[None, None, bool]:
        """Between a section's calls: True when `opener` (consumed) begins another call, False when the
        section ends there: at `closer` (consumed), or at text that is neither (text again; with no call
        of the section made, the section's text from its start is the model's text)."""
        yield from space(cur)
        self.anchor()
        got = yield from choice(cur, (opener, closer))
        if got == closer:
            self.unanchor()
        return got == opener

    def header_name(self, cur: Cursor, end: str, attribute: str) -> Generator[None, None, str]:
        """The function name a call's header gives as `attribute="..."`, read up to `end` (consumed); a
        header without a name is no call."""
        header, stop = yield from until(cur, (end,), limit=NAME_LIMIT)
        name = attributes(header).get(attribute, "").strip()
        if stop is None or not valid_name(name):
            raise NotACall
        return name

    def parameters(self, function: str) -> Mapping[str, Any]:
        """The JSON-schema `properties` of a requested tool (empty when unknown)."""
        schema = (self.tools.get(function) or {}).get("parameters") or {}
        properties = schema.get("properties") if isinstance(schema, Mapping) else None
        return properties if isinstance(properties, Mapping) else {}

    @classmethod
    def template_turns(cls, turns: Sequence[Any]) -> Sequence[Any]:
        """The conversation as the family's template should see it (its calls' ids in the family's
        own form, where the template writes them back to the model). By default as it is."""
        return turns


    def opens_call(self, text: str) -> bool:
        """A cut answer ended inside `text`, a call without its name yet: whether it may be a call
        (dropped) rather than the model's text. By default it may."""
        return True

    # --- streaming ---------------------------------------------------------------------------------

    def feed(self, text: str) -> list[Part]:
        cur = self._cur
        cur.add(text)
        self._run()
        cur.compact()
        out, self._out = self._out, []
        return out

    def finish(self, cut: bool = False) -> list[Part]:
        """The rest of the answer (see the module's doc); `cut`: the token limit ended it."""
        cur = self._cur
        in_section = self._gen is not None
        if in_section:
            self._gen.close()
            self._gen = None
            if cur.anchor is not None:  # a call not committed
                held = cur.text[cur.anchor:]
                cur.anchor = None
                cur.pos = len(cur.text)
                if cut and self._pending is not None:
                    self.begin(self._pending)
                elif not cut or not self.opens_call(held):
                    self._text(self._gap + held)
            elif self._open:
                self._open = False  # its arguments are what was generated
                cur.pos = len(cur.text)
        rest = cur.text[cur.pos:]
        cur.text, cur.pos = "", 0
        stripped = rest.lstrip()
        if cut and stripped and (in_section or any(m.startswith(stripped) for m in (*self.markers, *self.at_start) if m)):
            # The start of a marker the limit cut (no text, maybe a call's), or what is left of a call
            # section it cut after a call: its closing tags cut short, say `</tool_cal`.
            return self._flush()
        self._text(rest)
        return self._flush()

    def _flush(self) -> list[Part]:
        out, self._out = self._out, []
        return out

    def _text(self, text: str) -> None:
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        if text:
            self._said = self._said or not text.isspace()
            if self._out and self._out[-1][0] == PART_TEXT:
                self._out[-1] = (PART_TEXT, self._out[-1][1] + text)
            else:
                self._out.append((PART_TEXT, text))

    def _run(self) -> None:
        cur = self._cur
        while True:
            if self._gen is not None:
                try:
                    next(self._gen)
                    return  # it needs more text
                except StopIteration:
                    self._gen = None
                    if self._open:
                        self.end()
                    if cur.anchor is not None:  # what it read of a next call is text
                        self._text(self._gap + cur.text[cur.anchor:cur.pos])
                        cur.anchor = None
                    self._gap = ""
                except NotACall:
                    self._gen = None
                    start = cur.anchor if cur.anchor is not None else cur.pos
                    cur.anchor = None
                    self._pending = None
                    self._text(self._gap + cur.text[start:cur.pos])
                    self._gap = ""
                    if cur.pos == start:  # nothing consumed: the opener goes out as text
                        cur.pos += 1
                        self._text(cur.text[start:cur.pos])
                continue
            if not self._open_section():
                return

    def _open_section(self) -> bool:
        """Text mode: emit text up to the next opener and start its section; False: wait for more."""
        cur = self._cur
        text, pos = cur.text, cur.pos
        if not self._started:
            stripped = text[pos:].lstrip()
            if not stripped:
                return False
            lead = len(text) - pos - len(stripped)
            for prefix in self.at_start:
                if stripped.startswith(prefix):
                    cur.pos = pos + lead
                    self._start(prefix, at=cur.pos)
                    return True
                if prefix.startswith(stripped):
                    return False  # not yet decided
            self._started = True
        markers = self.markers
        if not markers:
            self._text(text[pos:])
            cur.pos = len(text)
            return False
        start = pos + max(0, self._scanned - max(len(m) for m in markers) + 1)
        found, opener = -1, ""
        for marker in markers:
            i = text.find(marker, start)
            if i >= 0 and (found < 0 or i < found):
                found, opener = i, marker
        if found >= 0:
            before = text[pos:found]
            if self._said or not before.isspace():
                self._text(before)
            else:
                self._gap = before  # (right after a call, `_text` drops it too should no call follow)
            self._scanned = 0
            self._start(opener, at=found)
            return True
        safe = len(text) - held_prefix(text, markers, pos)
        if self._said or not text[pos:safe].isspace():  # whitespace alone waits: no text if a call follows
            self._text(text[pos:safe])
            cur.pos = safe
        self._scanned = len(text) - cur.pos
        return False

    def _start(self, opener: str, at: int) -> None:
        cur = self._cur
        self._started = True
        cur.anchor = cur.pos = at
        self._pending = None
        self._gen = self.section(cur, opener)


def renamed_ids(turns: Sequence[Any], rename: Callable[[str, str, int], str]) -> tuple[Any, ...]:
    """`turns` with each call's id `rename(id, function name, index of the call in the
    conversation)`, and each tool result's `tool_call_id` renamed with it."""
    names: dict[str, str] = {}
    out = []
    index = 0
    for turn in turns:
        calls = turn.get("tool_calls") if isinstance(turn, Mapping) else None
        if calls:
            renamed = []
            for call in calls:
                given = str(call.get("id") or "")
                wanted = names[given] = rename(given, str((call.get("function") or {}).get("name", "")), index)
                renamed.append({**call, "id": wanted})
                index += 1
            turn = {**turn, "tool_calls": renamed}
        elif isinstance(turn, Mapping) and turn.get("tool_call_id") in names:
            turn = {**turn, "tool_call_id": names[turn["tool_call_id"]]}
        out.append(turn)
    return tuple(out)
