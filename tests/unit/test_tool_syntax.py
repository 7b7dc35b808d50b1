"""Forced tool calls in the model family's own syntax (guides.tool_syntax): where the engine path takes
xgrammar's structural tags (the recorded TensorRT-LLM facts, tests/data/trtllm_flags/<version>/structural_tag.json),
that every family forced in its syntax has a tag that compiles over the embedded tokenizer for one and
several tools, required and named, in every reasoning mode, and accepts the family's recorded outputs
(tests/data/tool_families), which the family's own parsers read back as the recorded calls; that the
families kept on the JSON guide are refused by xgrammar's format for them; and what the request core
sends, including its fall back to the JSON guide."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.openai import ChatCompletionRequest
from trtllm_truss.guides import tool_syntax
from trtllm_truss.guides.tool_syntax import FamilySyntax, forced_syntax_off
from trtllm_truss.parsers import TOOL_PARSERS
from trtllm_truss.serving.chat import generation_request
from trtllm_truss.serving.core import RequestCore

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from tool_families import OURS, PROMPT_TAIL, parsers_of, records, run, text_of  # noqa: E402

EMBEDDED = ROOT / "data" / "embedded-llama"
FLAGS = ROOT / "tests" / "data" / "trtllm_flags"
HAS_BUILDER = importlib.util.find_spec("xgrammar") is not None and importlib.util.find_spec("torch") is not None

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}

# Recorded outputs of each family forced in its own syntax that xgrammar's format for it accepts as
# recorded (real ones, or rendered through the family's own template: README of tool_families).
ACCEPTED = {
    "hermes": ["qwen3_hermes_single_newlines", "qwen3_lcpp_qwen25_single_call", "qwen3_rendered_reasoning_two_calls", "qwen3_rendered_nothink_call"],
    "qwen3_coder": ["qwen3_coder_single_call", "qwen3_coder_two_calls", "qwen3_coder_vllm_single", "qwen3_coder_vllm_parallel", "qwen35_reasoning_then_call", "qwen35_empty_reasoning_then_call"],
    "deepseek_v3": ["deepseek_v3_single", "deepseek_v3_various_types", "deepseek_v3_empty_args"],
    "deepseek_v31": ["deepseek_v31_call_non_thinking", "deepseek_v31_reasoning_then_call"],
    "deepseek_v32": ["deepseek_v32_reasoning_then_call", "deepseek_v32_two_invokes", "deepseek_v32_object_param"],
    "kimi_k2": ["kimi_k2_single_call", "kimi_k2_thinking_reasoning_then_call", "kimi_k2_two_calls", "kimi_k2_doc_get_weather"],
    "kimi_k3": ["kimi_k3_two_calls_empty_response"],
    "glm45": ["glm45_lcpp_single_call", "glm45_vllm_single_indented", "glm45_vllm_two_calls_indented"],
    "glm47": ["glm47_single_call_thinking_off", "glm47_reasoning_then_call", "glm47_two_calls"],
    "poolside_v1": ["poolside_newline_after_name", "poolside_no_newline_after_name"],
    "minimax_m3": ["minimax_m3_two_invokes_one_block"],
    "llama3_json": ["llama3_json_with_arguments", "llama3_json_three_calls_semicolon"],
}
# Families kept on the JSON guide for what xgrammar's format for them refuses (JSON_GUIDE says why).
REFUSED = {
    "gpt_oss": ("harmony", ["gpt_oss_harmony_doc_call", "gpt_oss_commentary_call"]),
    "minimax_m2": ("minimax", ["minimax_m2_call_typed_param", "minimax_m2_vllm_two_invokes"]),
    "deepseek_v4": ("deepseek_v4", ["deepseek_v4_single_call"]),
}
# What each family's parser module declares (`ToolCallParser.forced`).
FORMATS = {name: cls.forced for name, cls in TOOL_PARSERS.items() if isinstance(cls.forced, FamilySyntax)}
JSON_GUIDE = {name: cls.forced for name, cls in TOOL_PARSERS.items() if isinstance(cls.forced, str)}
RECORDS = {record["id"]: (folder, record) for folder, record in records()}


# --------------------------------------------------------------------------- where, on every Python


def test_every_tool_parser_is_forced_in_its_syntax_or_says_why_not():
    assert "not declared" not in JSON_GUIDE.values() and set(FORMATS) | set(JSON_GUIDE) == set(TOOL_PARSERS)
    assert set(ACCEPTED) == set(FORMATS)  # each family forced in its syntax has recorded outputs its tag accepts


@pytest.mark.parametrize(
    "where, off",
    [
        ({"backend": "pytorch", "engine": "xgrammar", "xgrammar_version": "0.2.8"}, None),
        ({"backend": "llmapi", "engine": "xgrammar", "xgrammar_version": "0.2.8", "llm_api_double": True}, None),
        ({"backend": "pytorch", "engine": "llguidance", "xgrammar_version": "0.2.8"}, "llguidance has no structural_tag"),
        ({"backend": "tensorrtllm", "engine": "xgrammar", "xgrammar_version": "0.2.8", "trtllm_version": "1.2.1"}, "tensorrtllm backend maps no structural_tag"),
        ({"backend": "pytorch", "engine": "xgrammar", "xgrammar_version": None}, "xgrammar is not installed"),
        ({"backend": "pytorch", "engine": "xgrammar", "xgrammar_version": "0.1.32"}, "0.1.32 has no get_model_structural_tag"),
        ({"backend": "pytorch", "engine": None, "xgrammar_version": "0.2.8"}, "guided decoding is off"),
    ],
)
def test_where_forced_calls_are_guided_in_the_familys_syntax(where: dict, off: str | None):
    kwargs = {"trtllm_version": None, "llm_api_double": False, **where}
    reason = forced_syntax_off(**kwargs)
    assert reason is None if off is None else off in reason


@pytest.mark.parametrize("version", ["1.0.0", "1.1.0", "1.2.0", "1.2.1"])
def test_llmapi_on_tensorrt_llm_follows_the_recorded_structural_tag_facts(version: str):
    """Each release with its own xgrammar keeps the JSON guide (none has get_model_structural_tag); with a
    newer xgrammar in its environment, a release takes the tags where its matcher compiles the new form."""
    facts = json.loads((FLAGS / version / "structural_tag.json").read_text())
    assert facts["trtllm_version"] == version and facts["get_model_structural_tag"] is False
    pinned = forced_syntax_off(backend="llmapi", engine="xgrammar", trtllm_version=version, llm_api_double=False, xgrammar_version=facts["xgrammar"])
    assert pinned is not None and "has no get_model_structural_tag" in pinned
    newer = forced_syntax_off(backend="llmapi", engine="xgrammar", trtllm_version=version, llm_api_double=False, xgrammar_version="0.2.8")
    assert (newer is None) is ("format" in facts["structural_tag_forms"])


# --------------------------------------------------------------------------- the tags (xgrammar 0.2.8)


@pytest.fixture(scope="module")
def guides():
    from trtllm_truss.guides.xgrammar_guide import guides_for

    return guides_for(str(EMBEDDED))


def _tag(parser: str, tools: list, choice: str, parallel: bool, mode: str, whitespace: str = "flexible") -> str:
    return tool_syntax.build(tool_syntax.request_text(FORMATS[parser], tools, choice, parallel, mode, whitespace), "xgrammar")[0]


@pytest.mark.torch
@pytest.mark.skipif(not HAS_BUILDER, reason="xgrammar (with torch) is installed for Python 3.11 only")
@pytest.mark.parametrize("parser", sorted(FORMATS))
@pytest.mark.parametrize("tools", [[WEATHER], [WEATHER, TIME]], ids=["one_tool", "two_tools"])
@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_the_familys_tags_compile_over_the_embedded_tokenizer(guides, parser: str, tools: list, choice: str):
    for mode in sorted({tool_syntax.DISABLED, FORMATS[parser].closed, tool_syntax.ENABLED}):
        for parallel in (True, False):
            tag = _tag(parser, tools, choice, parallel, mode)
            assert json.loads(tag)["type"] == "structural_tag"
            guides.compile("structural_tag", tag)
    guides.compile("structural_tag", _tag(parser, tools, choice, False, tool_syntax.DISABLED, "compact"))


def _schema(arguments: dict) -> dict:
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object", type(None): "null"}
    properties = {key: {"type": kinds[type(value)]} for key, value in arguments.items()}
    return {"type": "object", "properties": properties, "required": list(arguments), "additionalProperties": False}


def _recorded_case(parser: str, record_id: str, xgrammar_format: str | None = None):
    """(text, tools, choice, parallel, reasoning mode, tail, parsers) of a recorded output: its calls'
    functions as tools whose schemas its arguments fit, a named choice for one call, required for more."""
    folder, record = RECORDS[record_id]
    calls = record["expected"]["tool_calls"]
    tools, seen = [], set()
    for call in calls:
        if call["name"] not in seen:
            seen.add(call["name"])
            tools.append({"type": "function", "function": {"name": call["name"], "parameters": _schema(call["arguments"])}})
    tool, reasoning = parsers_of(folder, record)
    tail = (record.get("context") or {}).get("generation_prompt_tail") or PROMPT_TAIL.get(record_id, "")
    syntax = FORMATS.get(parser) or tool_syntax.FamilySyntax(xgrammar_format or "")
    if reasoning is None:
        mode = tool_syntax.DISABLED
    else:
        mode = tool_syntax.ENABLED if tail.rstrip().endswith(syntax.think_opener) else syntax.closed
    choice = calls[0]["name"] if len(calls) == 1 else "required"
    return text_of(record), tools, choice, len(calls) > 1, mode, tail, (tool, reasoning), syntax


def _accepts(guides, tag: str, text: str) -> bool:
    matcher = guides.compile("structural_tag", tag).matcher
    return bool(matcher.accept_string(text)) and (matcher.is_completed() or matcher.is_terminated())


@pytest.mark.torch
@pytest.mark.skipif(not HAS_BUILDER, reason="xgrammar (with torch) is installed for Python 3.11 only")
@pytest.mark.parametrize("parser, record_id", [(p, r) for p, ids in sorted(ACCEPTED.items()) for r in ids])
def test_recorded_outputs_are_accepted_and_read_back_as_their_calls(guides, parser: str, record_id: str):
    text, tools, choice, parallel, mode, tail, (tool, reasoning), syntax = _recorded_case(parser, record_id)
    assert tool == parser and record_id not in OURS
    body = tool_syntax.request_text(syntax, tools, choice, parallel, mode)
    tag = tool_syntax.build(body, "xgrammar")[0]
    assert _accepts(guides, tag, text), (mode, text)
    if choice == "required":  # several tools: another one in the list changes nothing
        other = [*tools, TIME] if all(t["function"]["name"] != "get_time" for t in tools) else tools
        assert _accepts(guides, tool_syntax.build(tool_syntax.request_text(syntax, other, choice, parallel, mode), "xgrammar")[0], text)
    content, _, calls = run(tool, reasoning, tail, tools, [text])
    assert content == ""
    assert [(name, json.loads(arguments)) for name, arguments, _ in calls] == [
        (call["name"], call["arguments"]) for call in RECORDS[record_id][1]["expected"]["tool_calls"]
    ]


def _completes(guides, tag: str, text: str) -> bool:
    """`text` is a whole answer of the tag: accepted, and the end of the answer may follow it."""
    matcher = guides.compile("structural_tag", tag).matcher
    return bool(matcher.accept_string(text)) and (matcher.is_completed() or matcher.is_terminated() or matcher.accept_token(2))


@pytest.mark.torch
@pytest.mark.skipif(not HAS_BUILDER, reason="xgrammar (with torch) is installed for Python 3.11 only")
@pytest.mark.parametrize("parser, record_id, parallel", [
    (p, r, parallel) for p, ids in sorted(ACCEPTED.items()) for r in ids
    for parallel in ((True, False) if len(RECORDS[r][1]["expected"]["tool_calls"]) == 1 else (True,))  # several need parallel
])
def test_a_required_answer_is_calls_only_and_may_end_after_any_call(guides, parser: str, record_id: str, parallel: bool):
    """`required` (Anthropic's `any`), parallel calls allowed or not: the recorded calls are a whole
    answer (the answer may end after them, 2 being the embedded tokenizer's end of text), and no text
    may follow them; with parallel calls allowed, a second copy of them may follow, with nothing but
    the family's separator between (where xgrammar's builder let text in and `calls_only` made the run)."""
    text, tools, _, _, mode, _, _, syntax = _recorded_case(parser, record_id)
    tag = tool_syntax.build(tool_syntax.request_text(syntax, tools, "required", parallel, mode), "xgrammar")[0]
    assert _completes(guides, tag, text), (mode, text)
    for tail in (" Done.", "\nThe weather is fine.", "\n\nok"):
        assert not _completes(guides, tag, text + tail), tail
    thinking_end = text.rfind("</think>") + len("</think>") if "</think>" in text else 0
    calls = text[thinking_end:].strip()
    if parallel and '"star"' in tag and calls.count(calls[:8]) == 1:
        assert _completes(guides, tag, text + "\n" + calls)


@pytest.mark.torch
@pytest.mark.skipif(not HAS_BUILDER, reason="xgrammar (with torch) is installed for Python 3.11 only")
def test_where_the_json_guide_stays_a_required_answer_is_calls_only_too(guides):
    """The JSON guide of `required` (api.tools.tool_guide) is one array of calls: nothing may follow it."""
    from trtllm_truss.api.tools import tool_guide

    guide = tool_guide([WEATHER, TIME], "required", True)[0]
    calls = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {"zone": "CET"}}]'
    matcher = guides.compile(guide.type, guide.guide).matcher
    assert matcher.accept_string(calls) and (matcher.is_completed() or matcher.accept_token(2))
    assert not guides.compile(guide.type, guide.guide).matcher.accept_string(calls + " Done.")


@pytest.mark.torch
@pytest.mark.skipif(not HAS_BUILDER, reason="xgrammar (with torch) is installed for Python 3.11 only")
@pytest.mark.parametrize("parser, xgrammar_format, record_id", [(p, f, r) for p, (f, ids) in sorted(REFUSED.items()) for r in ids])
def test_families_on_the_json_guide_are_refused_by_xgrammars_format_for_them(guides, parser: str, xgrammar_format: str, record_id: str):
    """Why JSON_GUIDE keeps them: were xgrammar to accept these one day, they could move to FORMATS."""
    assert parser in JSON_GUIDE
    text, tools, choice, parallel, mode, _, _, _ = _recorded_case(parser, record_id, xgrammar_format)
    syntax = tool_syntax.FamilySyntax(xgrammar_format)
    assert not _accepts(guides, tool_syntax.build(tool_syntax.request_text(syntax, tools, choice, parallel, mode), "xgrammar")[0], text)


@pytest.mark.torch
@pytest.mark.skipif(not HAS_BUILDER, reason="xgrammar (with torch) is installed for Python 3.11 only")
def test_glm45_forces_its_calls_without_thinking_where_xgrammars_format_would_bend_it(guides):
    """GLM-4.5/4.6 think as `\\n<think>...</think>\\n`; xgrammar's glm_4_7 format, with thinking allowed
    ("auto"), refuses that and takes only GLM-4.7's shape: so GLM-4.5 (and Poolside, no thinking
    recorded) force with reasoning "disabled", where GLM-4.7 keeps "auto"."""
    assert FORMATS["glm45"].closed == FORMATS["poolside_v1"].closed == tool_syntax.DISABLED != FORMATS["glm47"].closed
    text, tools, choice, parallel, _, _, _, _ = _recorded_case("glm45", "glm45_rendered_two_calls_typed_value_dotted_name")
    thinking = tool_syntax.build(tool_syntax.request_text(FORMATS["glm47"], tools, choice, parallel, tool_syntax.AUTO), "xgrammar")[0]
    assert text.startswith("\n<think>") and not _accepts(guides, thinking, text)
    assert _accepts(guides, thinking, text.removeprefix("\n").replace("</think>\n", "</think>", 1))  # GLM-4.7's shape


def test_a_named_choice_builds_its_tag_of_that_tool_alone():
    body = json.loads(tool_syntax.request_text(FORMATS["hermes"], [WEATHER, TIME], "get_time", False, tool_syntax.DISABLED))
    assert [t["function"]["name"] for t in body["tools"]] == ["get_time"]


# --------------------------------------------------------------------------- what the request core sends


class _Pool:
    def __init__(self, tool_call_parser: str | None, reasoning_parser: str | None = None) -> None:
        self.info = SimpleNamespace(tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser)


def _prepared(parser: str, reasoning: str | None = None, off: str | None = None, tools: list | None = None, **body):
    core = RequestCore()
    limits = RequestLimits(max_input_len=512, max_output_len=64, forced_syntax_off=off, guided_whitespace="compact")
    core.attach(_Pool(parser, reasoning), limits)  # type: ignore[arg-type]
    request = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Weather?"}], "tools": tools or [WEATHER, TIME], **body})
    return asyncio.run(core.prepare(generation_request(request)))


@pytest.mark.torch
@pytest.mark.skipif(not HAS_BUILDER, reason="xgrammar (with torch) is installed for Python 3.11 only")
def test_the_core_sends_the_familys_tag_and_parses_with_the_familys_parser():
    spec = _prepared("hermes", tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert (spec.tool_parser, spec.tool_parser_arg, spec.thinking_guide) == ("hermes", None, None)
    assert spec.params.guided_decoding_guide_type == "structural_tag"
    tag = json.loads(spec.params.guided_decoding_guide)
    assert tag["format"]["begin"] == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert tag["format"]["content"]["max_whitespace_cnt"] == 1  # the stand-in's compact JSON
    reasoning = _prepared("hermes", "qwen3", tool_choice="required", parallel_tool_calls=False)
    opener, thinking = reasoning.thinking_guide
    assert opener == "<think>" and thinking != reasoning.params.guided_decoding_guide
    assert json.loads(reasoning.params.guided_decoding_guide)["format"]["elements"][0]["type"] == "optional"  # "auto": it may think first
    assert json.loads(thinking)["format"]["elements"][0]["elements"][0]["begin"] == ""  # "enabled": it is thinking already


@pytest.mark.parametrize(
    "parser, off, tools",
    [
        ("hermes", "xgrammar is not installed here", None),  # where the engine path takes no tag (Python 3.10...)
        ("mistral", None, None),  # a family xgrammar has no format for
        # MiniMax-M3's fixed-name XML cannot write an object of any keys: xgrammar refuses that tag
        ("minimax_m3", None, [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"meta": {"type": "object", "additionalProperties": {"type": "string"}}}}}}]),
    ],
)
def test_elsewhere_the_json_guide_stays(parser: str, off: str | None, tools: list | None):
    if off is None and not HAS_BUILDER:
        pytest.skip("needs xgrammar")
    spec = _prepared(parser, off=off, tools=tools, tool_choice="required")
    assert spec.tool_parser == "guided_required" and spec.params.guided_decoding_guide_type == "json_schema"
    assert spec.thinking_guide is None


@pytest.mark.torch
@pytest.mark.skipif(not HAS_BUILDER, reason="xgrammar (with torch) is installed for Python 3.11 only")
def test_the_compile_service_builds_and_compiles_the_tag_within_its_budget_and_cache():
    """The verdict of a forced call's request: the structural tag as its text, compiled over the tokenizer
    (a size for the byte-bounded caches); what xgrammar does not enforce of a tool's schema is reported."""
    from trtllm_truss.guides.verdict import Accepted, EngineCompiler, Refused, check

    nullable = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "nullable": True}}}}}
    body = tool_syntax.request_text(FORMATS["hermes"], [WEATHER, nullable], "required", True, tool_syntax.DISABLED)
    verdict = check(tool_syntax.TOOL_SYNTAX, body, "xgrammar", False, EngineCompiler("xgrammar", EMBEDDED))
    assert isinstance(verdict, Accepted) and verdict.compiled_bytes > 0
    calls = json.loads(verdict.text)["format"]  # one call, then any number of (separator, call): nothing else
    assert calls["type"] == "sequence" and calls["elements"][0]["elements"][0]["begin"].startswith("<tool_call>")
    assert verdict.unenforced == ("tools[1].function.parameters.properties.a: nullable",)
    refused = check(tool_syntax.TOOL_SYNTAX, body, "llguidance", False)
    assert isinstance(refused, Refused) and "Unsupported guide type: structural_tag" in refused.message
