"""DeepSeek's DSML tool calls (V3.2, V4, V4.1), one family of formats:

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="KEY" string="true">VALUE</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

V4 names the section `tool_calls`, V4.1 puts a space after `｜DSML｜` in every tag (` calls`,
` invoke`, ` parameter`). An invoke's body may instead be one JSON object. `string="true"` marks a
string value (as written), `"false"` a JSON one. A call is committed once its invoke tag is read;
its arguments are written as JSON as the parameters arrive (a JSON body streams as written)."""

from __future__ import annotations

from collections.abc import Generator

from trtllm_truss.parsers.arguments import (
    JSON,
    STRING,
    ArgumentWriter,
    tagged_parameters,
)
from trtllm_truss.parsers.scan import Cursor, json_container, space, until
from trtllm_truss.parsers.section import ToolCallParser


class DsmlToolParser(ToolCallParser):
    """`tag` is what opens every DSML tag (`<｜DSML｜`, V4.1 `<｜DSML｜ `), `section_name` the section's."""

    tag = "<｜DSML｜"
    section_name = "function_calls"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.markers = (f"{cls.tag}{cls.section_name}>",)

    def _close(self, name: str) -> str:
        return "</" + self.tag[1:] + name + ">"

    def section(self, cur: Cursor, opener: str) -> Generator[None, None, None]:
        cur.pos += len(opener)
        invoke, invoke_end = self.tag + "invoke", self._close("invoke")
        section_end = self._close(self.section_name)
        while (yield from self.next_call(cur, invoke, section_end)):
            self.begin((yield from self.header_name(cur, ">", "name")))
            yield from space(cur)
            if cur.text[cur.pos] == "{":  # the body is the arguments' JSON
                yield from json_container(cur, self.args, (invoke_end, section_end))
                _, stop = yield from until(cur, (invoke_end, section_end))
                if stop == section_end:
                    cur.pos -= len(stop)
            else:
                yield from tagged_parameters(
                    cur, ArgumentWriter(self.args), tag=self.tag + "parameter", closing=self._close("parameter"),
                    call_end=invoke_end, section_end=section_end,
                    key_of=lambda marks: (marks.get("name"), STRING if marks.get("string", "true") == "true" else JSON),
                )
            self.end()
