"""Function tools of a request: their schema, checks that name the field, and the guided-decoding
constraint that enforces `tool_choice: "required"` or a named function.

Tools are OpenAI chat's `{"type": "function", "function": {"name", "description", "parameters"}}`
(the shape Hugging Face chat templates take as `tools=`); other dialects convert theirs to it.
`required` is enforced, as vLLM does, by a JSON schema for a non-empty array of `{"name": <one of
the tools>, "parameters": <that tool's schema>}` objects (one item unless parallel calls are
allowed); a named function by its parameters schema. The output is then parsed straight into tool
calls (`trtllm_truss.parsers.tool_calls.guided`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from trtllm_truss.api.errors import field_error
from trtllm_truss.api.sampling import StrictModel, Text
from trtllm_truss.api.structured import Guide, check_schema
from trtllm_truss.guides.best_effort import cannot_enforce, unenforced


# OpenAI's rule for function names.
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128  # OpenAI's bound on `tools`
GUIDED_REQUIRED_PARSER = "guided_required"
GUIDED_NAMED_PARSER = "guided_named"


class FunctionDefinition(StrictModel):
    name: Text
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(StrictModel):
    name: Text


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: FunctionName


ToolChoiceField = Literal["none", "auto", "required"] | NamedToolChoice
ToolsField = Field(None, max_length=MAX_TOOLS, description="function tools the model may call")


def check_tools(tools: Sequence[FunctionTool], field: str = "tools") -> None:
    """400 naming the field: a bad function name, a duplicate, parameters that are not a JSON
    Schema (checked against its metaschema)."""
    check_functions(
        (tool.function.name, tool.function.parameters, f"{field}[{i}].function.name", f"{field}[{i}].function.parameters")
        for i, tool in enumerate(tools)
    )


def check_functions(functions: Iterable[tuple[str, Any, str, str]]) -> None:
    """`check_tools` for any dialect's tools: (name, parameters schema or None, the dialect's field
    of the name, of the schema) per tool."""
    seen: set[str] = set()
    for name, parameters, name_field, parameters_field in functions:
        if not FUNCTION_NAME.match(name):
            raise field_error(name_field, f"{name!r} is not a function name (letters, digits, '_' and '-', at most 64)")
        if name in seen:
            raise field_error(name_field, f"{name!r} is defined twice")
        seen.add(name)
        if parameters is not None:
            check_schema(parameters_field, parameters)


def check_tool_choice(tools: Sequence[FunctionTool], choice: Any, field: str = "tool_choice") -> str:
    """The choice as a string ("none", "auto", "required" or a function name), 400 naming the
    field when it names no tool or asks for a call without tools."""
    if isinstance(choice, NamedToolChoice):
        names = [tool.function.name for tool in tools]
        if choice.function.name not in names:
            raise field_error(
                f"{field}.function.name",
                f"{choice.function.name!r} is not one of the request's tools ({', '.join(names) or 'none given'})",
            )
        return choice.function.name
    if choice == "required" and not tools:
        raise field_error(field, "'required' needs at least one tool in `tools`")
    return choice or "auto"


def strict_guided_tools(tools: Sequence[FunctionTool], choice: str) -> tuple[int, ...]:
    """Positions of the tools with `function.strict: true` whose calls are guided (`required`, or the
    named one); under `auto` calls are parsed from the model's text, never guided (docs/api.md)."""
    return tuple(
        i
        for i, tool in enumerate(tools)
        if tool.function.strict and tool.function.parameters and (choice == "required" or choice == tool.function.name)
    )


def check_strict_tools(tools: Sequence[Mapping[str, Any]], strict: Sequence[int], engine: str, field: str = "tools") -> None:
    """400 naming the place of the first keyword of a strict tool's parameters that the grammar engine
    `engine` does not enforce (as `response_format`'s strict)."""
    for i in strict:
        for where, key in unenforced(_parameters(tools[i]), engine):
            raise field_error(f"{field}[{i}].function.parameters{where}", f"{cannot_enforce(key, engine)}; strict: true refuses it")


def tool_dicts(tools: Sequence[FunctionTool]) -> tuple[dict[str, Any], ...]:
    """The tools as the chat template takes them (parameters default to an empty object schema)."""
    out = []
    for tool in tools:
        function = tool.function.model_dump(exclude_none=True)
        function.setdefault("parameters", {"type": "object", "properties": {}})
        function.pop("strict", None)
        out.append({"type": "function", "function": function})
    return tuple(out)


def _parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def tool_guide(tools: Sequence[Mapping[str, Any]], choice: str, parallel: bool) -> tuple[Guide, str, str | None]:
    """(constraint, output parser, parser argument) for `required` or a named function."""
    if choice == "required":
        items = [
            {
                "type": "object",
                "properties": {"name": {"type": "string", "const": tool["function"]["name"]}, "parameters": _parameters(tool)},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for tool in tools
        ]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": items[0] if len(items) == 1 else {"anyOf": items}}
        if not parallel:
            schema["maxItems"] = 1
        return Guide("json_schema", json.dumps(schema)), GUIDED_REQUIRED_PARSER, None
    tool = next(t for t in tools if t["function"]["name"] == choice)
    return Guide("json_schema", json.dumps(_parameters(tool))), GUIDED_NAMED_PARSER, choice
