"""Forced tool calls in the model family's own syntax: `tool_choice: "required"` or a named function
guided by xgrammar's structural tag for the family (`xgrammar.get_model_structural_tag`, xgrammar's own
builtin formats), where the engine path enforces structural tags in that form; elsewhere the JSON
guide of `api.tools.tool_guide` stays (docs/api.md, "Tool calls (chat)").

Each family declares its own (`parsers.section.ToolCallParser.forced` in its parser module): a
`FamilySyntax`, the xgrammar format that writes its calls, or why the JSON guide stays. A family has a
`FamilySyntax` only where xgrammar's format accepts the family's recorded outputs (tests/data/tool_families,
real or rendered through the family's own template; tests/unit/test_tool_syntax.py names them);
`FamilySyntax.differs` says where it is narrower than what the records show.

Reasoning (xgrammar's `reasoning`): a deployment without a reasoning parser gets "disabled" (no thinking
block). With one, the request gets two guides: `closed` for a prompt whose template did not open the
thinking (xgrammar's "auto": the answer may open and close a thinking block first; Kimi K3's prompt then
opened its response channel: "disabled"), and "enabled" for a prompt that ends with the family's
`think_opener` (the answer starts inside the thinking and closes it first). The stream worker, which
renders the prompt, sends the one that fits (`streaming.protocol.GenerationSpec.thinking_guide`).

The tag is built in the guide compile service (`guides.verdict.judge`, guide type `TOOL_SYNTAX`, whose
text is `request_text`): off the front's event loop, by the processes that have xgrammar loaded, under the
same budget and verdict cache as every guide; each tool's parameters go through `guides.best_effort`
first (what xgrammar does not enforce is left out and reported, as for a JSON guide). The verdict's text
is the structural tag, sent as NVIDIA's `guided_decoding_guide_type: "structural_tag"`.

Calls only (`calls_only`): for `required` several of xgrammar's builders write the calls as
`triggered_tags` with `at_least_one`, which accepts any text after a complete call (xgrammar's own
docs: "when the end tag is encountered, the grammar will allow any following output"), so a model
forced to call could write a call and then text up to its token limit. A forced answer is calls
only: each such node becomes one of the same tags followed by any number of (`between`, a tag), in
xgrammar's `sequence` / `or` / `star` / `regex` formats, and nothing else; the answer may end after
any complete call (with `stop_after_first`, after the first). `between` is the family's separator:
a little whitespace (which every family's parser reads as no text between calls), and Llama's `;`.
xgrammar's `tags_with_separator` would take one fixed separator only, narrower than the recorded
outputs (GLM writes none or an indented newline). A named choice's builder already writes one call
and nothing else.

Where the engine takes it (`forced_syntax_off`): xgrammar's new `{"type": "structural_tag", "format"}`
form, built by the same xgrammar that compiles it. TensorRT-LLM 1.0's PyTorch path takes only the older
`{"structures", "triggers"}` form (its xgrammar 0.1.21 `compile_structural_tag(items, triggers)`); 1.1 to
1.2.1 call `compile_structural_tag(guide)` with xgrammar 0.1.25 / 0.1.32, which have no
`get_model_structural_tag` and refuse, or read otherwise, what 0.2.8's builders write
(tests/data/trtllm_flags/<version>/structural_tag.json). llguidance (TensorRT-LLM's LLGuidanceMatcherFactory)
has no structural tag, nor has NVIDIA's tensorrtllm backend (its guide types: json, json_schema, regex,
ebnf_grammar).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The guide type of a forced call's request to the compile service (never sent to an engine: the
# verdict's text is the structural tag).
TOOL_SYNTAX = "tool_syntax"
STRUCTURAL_TAG = "structural_tag"
# The xgrammar release whose builders are verified here (tests/unit/test_tool_syntax.py); older ones
# have no get_model_structural_tag (0.1.32 has only get_builtin_structural_tag, without tool_choice).
BUILDER_SINCE = (0, 2, 8)
# TensorRT-LLM from which the PyTorch path compiles the new form (PR #7893, in 1.1: compile_structural_tag(guide)).
NEW_FORM_SINCE = (1, 1)
DISABLED, AUTO, ENABLED = "disabled", "auto", "enabled"
COMPACT = "compact"  # runtime.pytorch.guided_whitespace's value (guides.guide.WHITESPACE_COMPACT)


@dataclass(frozen=True)
class FamilySyntax:
    """How a family's forced calls are guided: `xgrammar` the builtin format, `think_opener` what its
    prompt ends with when the template opened the thinking, `closed` the reasoning mode otherwise, and
    `differs` where xgrammar's format is narrower than the family's recorded outputs, `between` what
    separates two forced calls where xgrammar's format would let text in (`calls_only`)."""

    xgrammar: str
    think_opener: str = "<think>"
    closed: str = AUTO
    differs: str = ""
    between: str = r"[ \t\n]{0,8}"


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text or "")[:3])


def forced_syntax_off(
    *, backend: str, engine: str | None, trtllm_version: str | None, llm_api_double: bool, xgrammar_version: str | None
) -> str | None:
    """None when this deployment's engine path enforces xgrammar's structural tags as built here, else
    why forced calls keep the JSON guide (module docstring)."""
    if engine is None:
        return "guided decoding is off"
    if engine != "xgrammar":
        return f"{engine} has no structural_tag guide (TensorRT-LLM's LLGuidanceMatcherFactory takes json, json_schema, regex, ebnf_grammar)"
    if backend == "tensorrtllm":
        return "NVIDIA's tensorrtllm backend maps no structural_tag guide (json, json_schema, regex, ebnf_grammar)"
    if xgrammar_version is None:
        return "xgrammar is not installed here (NVIDIA's TensorRT-LLM 1.x images pin xgrammar 0.1.x: no get_model_structural_tag)"
    if _version(xgrammar_version) < BUILDER_SINCE:
        return f"xgrammar {xgrammar_version} has no get_model_structural_tag (from {'.'.join(map(str, BUILDER_SINCE))})"
    if backend == "llmapi" and not llm_api_double and _version(trtllm_version)[:2] < NEW_FORM_SINCE:
        return f"TensorRT-LLM {trtllm_version}'s PyTorch path takes only xgrammar's older structures/triggers form"
    return None


def request_text(
    syntax: FamilySyntax, tools: Sequence[Mapping[str, Any]], choice: str, parallel: bool, reasoning: str,
    whitespace: str = "flexible",
) -> str:
    """The compile service's guide text of one forced call's structural tag (`build` reads it): the
    family's format, the tools (name and parameters: descriptions do not change the grammar, so they
    stay out of the cache key), the choice, parallel calls, the reasoning mode, and the JSON arguments'
    whitespace: "flexible" as TensorRT-LLM compiles JSON, "compact" the stand-in's option
    (runtime.pytorch.guided_whitespace; xgrammar's `max_whitespace_cnt` 1, the least it takes)."""
    slim = [
        {"type": "function", "function": {"name": t["function"]["name"], "parameters": t["function"].get("parameters") or {"type": "object", "properties": {}}}}
        for t in tools
        if choice == "required" or t["function"]["name"] == choice  # a named choice guides that tool alone
    ]
    tool_choice: Any = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    body = {
        "format": syntax.xgrammar, "tools": slim, "tool_choice": tool_choice, "parallel_tool_calls": parallel,
        "reasoning": reasoning, "between": syntax.between,
    }
    if whitespace == COMPACT:
        body["max_whitespace"] = 1
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def build(text: str, engine: str) -> tuple[str, tuple[str, ...]]:
    """The structural tag of a `request_text` and what of the tools' schemas it does not enforce
    ("tools[i].function.parameters<place>: <keyword>"); raises ValueError with the reason it cannot be
    built (xgrammar missing or too old, a format or choice xgrammar refuses)."""
    from trtllm_truss.guides import best_effort

    try:
        import xgrammar
    except ImportError:
        raise ValueError("forced calls in the model's own syntax need xgrammar, which this environment lacks") from None
    builder = getattr(xgrammar, "get_model_structural_tag", None)
    if builder is None:
        raise ValueError("this xgrammar has no get_model_structural_tag")
    body = json.loads(text)
    tools, notes = [], []
    for i, tool in enumerate(body["tools"]):
        prepared = best_effort.prepare(tool["function"]["parameters"], engine, strict=False)
        notes += [f"tools[{i}].function.parameters{note.removeprefix('.') if note.startswith('.:') else note}" for note in prepared.unenforced]
        tools.append({"type": "function", "function": {"name": tool["function"]["name"], "parameters": json.loads(prepared.text)}})
    tag = builder(
        body["format"], tools=tools, tool_choice=body["tool_choice"], reasoning=body["reasoning"],
        parallel_tool_calls=bool(body["parallel_tool_calls"]), max_whitespace_cnt=body.get("max_whitespace"),
    )
    tag_json = calls_only(json.loads(tag.model_dump_json()), body.get("between", "\n"))
    return json.dumps(tag_json, separators=(",", ":"), ensure_ascii=False), tuple(notes)


def calls_only(node: Any, between: str) -> Any:
    """The structural tag `node` (xgrammar's JSON form) with each `triggered_tags` that must match at
    least one tag (a forced choice's calls) made a run of those tags separated by what matches the
    regex `between`: calls and nothing else, ending after any complete call (module docstring)."""
    if isinstance(node, list):
        return [calls_only(item, between) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "triggered_tags" and node.get("at_least_one"):
        call = {"type": "or", "elements": calls_only(node["tags"], between)}
        if node.get("stop_after_first"):
            return call
        more = {"type": "star", "content": {"type": "sequence", "elements": [{"type": "regex", "pattern": between}, call]}}
        return {"type": "sequence", "elements": [call, more]}
    return {key: calls_only(value, between) for key, value in node.items()}
