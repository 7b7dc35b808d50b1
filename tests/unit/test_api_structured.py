"""Structured output before anything reaches a worker: each dialect's fields become one guide in
NVIDIA's terms (api.structured), and every guide the deployment's grammar engine (xgrammar or
llguidance) cannot enforce is a 400 naming its field with that engine's reason (strict), or goes with
what it cannot enforce left out (best effort), compiled off the event loop and cached. The real
engines run here; nothing is mocked."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from types import SimpleNamespace

import pytest
from fastapi import HTTPException
from trtllm_truss.api import structured
from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.messages import MessagesRequest
from trtllm_truss.api.messages import chat_response_format as messages_format
from trtllm_truss.api.native import PredictRequest
from trtllm_truss.api.openai import ChatCompletionRequest, CompletionRequest
from trtllm_truss.api.responses import ResponsesRequest
from trtllm_truss.api.responses import chat_response_format as responses_format
from trtllm_truss.api.structured import MAX_GUIDE_BYTES, MAX_GUIDE_DEPTH, Guide
from trtllm_truss.guides.guide import check_guide
from trtllm_truss.serving import chat, messages, native, responses
from trtllm_truss.serving.core import RequestCore, parse_request
from trtllm_truss.serving.openai_shared import request_guide

CHAT = [{"role": "user", "content": "x"}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _chat(**body) -> Guide | None:
    return request_guide(ChatCompletionRequest.model_validate({"messages": CHAT, **body}))


def _refused(make, status: int = 400) -> str:
    with pytest.raises(HTTPException) as caught:
        make()
    assert caught.value.status_code == status, caught.value.detail
    return caught.value.detail


def _check(guide: Guide, **kwargs) -> None:
    asyncio.run(structured.check(guide, **kwargs))


# --- fields -> guide ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, ("json_schema", '{"type":"object"}', "response_format")),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}},
            ("json_schema", json.dumps(PERSON, separators=(",", ":")), "response_format.json_schema.schema"),
        ),
        ({"response_format": {"type": "json", "schema": {"type": "string"}}}, ("json_schema", '{"type":"string"}', "response_format.schema")),
        ({"response_format": {"type": "regex", "regex": "[0-9]{3}"}}, ("regex", "[0-9]{3}", "response_format.regex")),
        ({"response_format": {"type": "ebnf", "ebnf": 'root ::= "yes" | "no"'}}, ("ebnf_grammar", 'root ::= "yes" | "no"', "response_format.ebnf")),
        ({"structured_outputs": {"regex": "a+"}}, ("regex", "a+", "structured_outputs.regex")),
        ({"structured_outputs": {"json": PERSON}}, ("json_schema", json.dumps(PERSON, separators=(",", ":")), "structured_outputs.json")),
        ({"structured_outputs": {"json_object": True}}, ("json_schema", '{"type":"object"}', "structured_outputs.json_object")),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, ("ebnf_grammar", 'root ::= "a"', "structured_outputs.grammar")),
        ({"guided_json": '{"type": "integer"}'}, ("json_schema", '{"type":"integer"}', "guided_json")),
        ({"guided_regex": "b+"}, ("regex", "b+", "guided_regex")),
        ({"guided_grammar": 'root ::= "b"'}, ("ebnf_grammar", 'root ::= "b"', "guided_grammar")),
        ({"guided_choice": ["yes", "no"]}, ("regex", "(yes|no)", "guided_choice")),
    ],
)
def test_each_dialect_field_becomes_nvidias_guide(body, expected):
    guide = _chat(**body)
    assert (guide if guide is None else (guide.type, guide.guide, guide.field)) == expected
    if guide is not None:
        _check(guide)  # and it compiles


def test_completions_take_the_same_fields():
    req = CompletionRequest.model_validate({"prompt": "x", "response_format": {"type": "json_object"}})
    assert request_guide(req) == Guide("json_schema", '{"type":"object"}', "response_format")
    req = CompletionRequest.model_validate({"prompt": "x", "guided_regex": "[ab]"})
    assert request_guide(req) == Guide("regex", "[ab]", "guided_regex")


def test_choice_alternatives_are_literal_text():
    """Punctuation in a choice is matched literally (escaped), never read as regex syntax."""
    import llguidance

    choices = ["a.b", "(x)", "1+1", "c|d", "e f", "ü?"]
    guide = _chat(guided_choice=choices)
    matcher_regex = llguidance.LLMatcher.grammar_from_regex(guide.guide)
    assert not llguidance.LLMatcher.validate_grammar(matcher_regex)
    import re  # Python's re agrees on these escapes: each choice and nothing else matches

    pattern = re.compile(guide.guide)
    assert all(pattern.fullmatch(c) for c in choices)
    assert not any(pattern.fullmatch(c) for c in ["aXb", "x", "11", "c", "e  f"])


def test_responses_and_messages_name_their_own_fields():
    req = ResponsesRequest.model_validate({"input": "x", "text": {"format": {"type": "json_schema", "name": "p", "schema": PERSON}}})
    guide = responses.generation_request(req).guide
    assert (guide.type, guide.field) == ("json_schema", "text.format.schema")
    req = ResponsesRequest.model_validate({"input": "x", "text": {"format": {"type": "json_object"}}})
    assert responses.generation_request(req).guide == Guide("json_schema", '{"type":"object"}', "text.format")
    body = {"model": "m", "max_tokens": 5, "messages": CHAT, "output_config": {"format": {"type": "json_schema", "schema": PERSON}}}
    guide = messages.generation_request(MessagesRequest.model_validate(body)).guide
    assert (guide.type, guide.field) == ("json_schema", "output_config.format.schema")
    assert responses_format(req) is not None and messages_format(MessagesRequest.model_validate(body)) is not None


def test_native_route_takes_nvidias_names():
    req = PredictRequest.model_validate({"prompt": "x", "guided_decoding_guide_type": "regex", "guided_decoding_guide": "[0-9]+"})
    assert native.generation_request(req).guide == Guide("regex", "[0-9]+", "guided_decoding_guide")
    req = PredictRequest.model_validate({"prompt": "x", "guided_decoding_guide_type": "json"})
    assert native.generation_request(req).guide == Guide("json", None, "guided_decoding_guide")
    schema = json.dumps(PERSON)
    req = PredictRequest.model_validate({"prompt": "x", "guided_decoding_guide_type": "json_schema", "guided_decoding_guide": schema})
    assert json.loads(native.generation_request(req).guide.guide) == PERSON


# --- bad input: 400 (or 422 for the schema) naming the field ---------------------------------------

DEEP: dict = {"type": "string"}
for _ in range(MAX_GUIDE_DEPTH):
    DEEP = {"type": "array", "items": DEEP}


@pytest.mark.parametrize(
    "body, where",
    [
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema: is required"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}}, "response_format.json_schema.schema: is required"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": DEEP}}}, "response_format.json_schema.schema: nests"),
        ({"response_format": {"type": "regex"}}, "response_format.regex: a regex guide needs its text"),
        ({"response_format": {"type": "json"}}, "response_format.schema: is required"),
        ({"guided_json": "{nope"}, "guided_json: is not JSON"),
        ({"guided_choice": []}, "guided_choice: give at least one"),
        ({"structured_outputs": {}}, "structured_outputs: give one of"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex: only one output constraint per request (also given: response_format)"),
        ({"response_format": {"type": "regex", "regex": "a" * (MAX_GUIDE_BYTES + 1)}}, f"response_format.regex: is {MAX_GUIDE_BYTES + 1} bytes"),
    ],
)
def test_bad_fields_are_400_naming_the_field(body, where):
    assert where in _refused(lambda: _chat(**body))


ENGINES = ("xgrammar", "llguidance")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "schema, where",
    [
        ({"type": "object", "properties": {"a": {"type": "string", "nullable": True}}}, ".properties.a: keyword 'nullable'"),
        (
            {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "items": [{"type": "string"}], "additionalItems": False},
            ": keyword 'additionalItems'",
        ),
        ({"type": "array", "uniqueItems": True}, ": keyword 'uniqueItems'"),
        ({"type": "string", "format": "zip-code"}, ": keyword 'format'"),
    ],
)
def test_strict_refuses_what_the_engine_does_not_enforce_naming_its_place(engine, schema, where):
    """The engine the deployment uses judges strict schemas: the 400 names the keyword's place and the engine."""
    guide = _chat(response_format={"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": schema}})
    detail = _refused(lambda: _check(guide, engine=engine))
    assert f"response_format.json_schema.schema{where} cannot be enforced by {engine}" in detail
    assert "strict: true refuses it" in detail


@pytest.mark.parametrize(
    "body, field",
    [
        ({"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
        ({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ],
)
def test_other_vllm_knobs_are_refused_by_name(body, field):
    with pytest.raises(HTTPException) as caught:
        parse_request(ChatCompletionRequest, {"messages": CHAT, **body})
    assert caught.value.status_code == 422 and field in caught.value.detail


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "schema, left_out",
    [
        ({"type": "object", "properties": {"a": {"type": "string", "nullable": True}}}, ".properties.a: nullable"),
        ({"not": {"type": "string"}}, ".: not"),
        ({"type": "array", "uniqueItems": True}, ".: uniqueItems"),
        ({"type": "string", "format": "zip-code"}, ".: format 'zip-code'"),
    ],
)
def test_without_strict_what_the_engine_does_not_enforce_is_left_out_and_reported(engine, schema, left_out):
    """Changed on purpose (issue 32): OpenAI's non-strict mode is best effort, so these are no longer 400s."""
    loose = _chat(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    checked = asyncio.run(structured.check(loose, engine=engine))
    assert checked.unenforced == (left_out,)
    assert left_out.split(": ")[1].split(" ")[0] not in checked.text  # the guide sent goes without it


@pytest.mark.parametrize("strict", [False, True])
def test_a_schema_that_is_not_one_is_400_from_the_check_off_the_event_loop(strict):
    """The meta-schema check runs with the engine's compile in its thread (a large schema's takes
    seconds): building the guide on the event loop does not run it."""
    schema = {"type": "object", "properties": {"a": {"type": "objekt"}}}
    guide = _chat(response_format={"type": "json_schema", "json_schema": {"name": "p", "strict": strict, "schema": schema}})
    detail = _refused(lambda: _check(guide))
    assert "response_format.json_schema.schema: not a valid JSON Schema: " in detail and "(at properties/a/type)" in detail


def _oversized_schema(definitions: int = 600) -> dict:
    """Over the 1 MiB guide bound like AWS CloudFormation's schema: a root whose `kind` refers to one
    small definition and whose `resources` may be any of many large ones."""
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 40} for i in range(40)}}
    return {
        "type": "object",
        "properties": {
            "kind": {"$ref": "#/definitions/Kind"},
            "resources": {"type": "array", "items": {"anyOf": [{"$ref": f"#/definitions/R{i}"} for i in range(definitions)]}},
        },
        "required": ["kind"],
        "definitions": {"Kind": {"enum": ["a", "b"]}, **{f"R{i}": big for i in range(definitions)}},
    }


@pytest.mark.parametrize("engine", ENGINES)
def test_without_strict_a_schema_over_the_guide_bound_is_reduced_to_the_part_near_its_root(engine):
    from trtllm_truss.guides.oversized import REDUCED_GUIDE_BYTES

    schema = _oversized_schema()
    assert len(json.dumps(schema)) > MAX_GUIDE_BYTES
    guide = _chat(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    checked = asyncio.run(structured.check(guide, engine=engine))
    sent = json.loads(checked.text)
    assert len(checked.text.encode()) <= REDUCED_GUIDE_BYTES
    assert sent["definitions"] == {"Kind": {"enum": ["a", "b"]}}  # the anyOf's 600 could not all fit: none kept
    assert sent["properties"]["resources"] == {"type": "array", "items": {}}
    assert checked.unenforced[:2] == (
        ".: $ref (to 600 of 601 definitions, left out: the schema is over the guide bound, a reference to one allows any value)",
        ".properties.resources.items: anyOf (a branch refers to a definition left out)",
    )
    strict = dataclasses.replace(guide, strict=True)
    assert "strict: true sends it as it is" in _refused(lambda: _check(strict, engine=engine))


def test_a_schema_over_the_request_bound_is_400_before_anything_compiles():
    from trtllm_truss.guides.oversized import MAX_SCHEMA_BYTES

    schema = _oversized_schema(definitions=2000)
    size = len(structured.schema_text(schema).encode())
    assert size > MAX_SCHEMA_BYTES
    detail = _refused(lambda: _chat(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}))
    assert f"response_format.json_schema.schema: is {size} bytes; at most {MAX_SCHEMA_BYTES} are accepted" in detail


# What each engine itself refuses (with TensorRT-LLM's options), in its own words.
REFUSED = {
    "xgrammar": [
        (Guide("regex", "(a", "response_format.regex"), "The parenthesis is not closed"),
        (Guide("ebnf_grammar", "root ::= undefined_rule", "guided_grammar"), 'Rule "undefined_rule" is not defined'),
        (Guide("structural_tag", '{"type": "structural_tag"}', "response_format"), "Structural tag must have a format field"),
        (Guide("json_schema", '{"type": "object", "properties": {"a": {"$ref": "#/nope"}}}', "guided_json", True), "Cannot find field nope"),
    ],
    "llguidance": [
        (Guide("regex", "(a", "response_format.regex"), "unclosed group"),
        (Guide("ebnf_grammar", "start: undefined_rule", "guided_grammar"), 'unknown name: "undefined_rule"'),
        # TensorRT-LLM's llguidance matcher has no structural tags ("Unsupported guide type").
        (Guide("structural_tag", '{"type": "structural_tag"}', "response_format"), "Unsupported guide type: structural_tag"),
        (Guide("json_schema", '{"type": "object", "properties": {"a": {"$ref": "#/nope"}}}', "guided_json", True), "'/nope' does not exist"),
    ],
}


# xgrammar imports torch: where there is none (Python 3.10, 3.12, 3.13 here) the request path checks only a
# guide's type and size for it, and the engine judges the rest.
NEEDS_XGRAMMAR = pytest.mark.torch


@pytest.mark.parametrize(
    "engine, guide, reason",
    [pytest.param(e, g, r, marks=[NEEDS_XGRAMMAR] if e == "xgrammar" else []) for e, cases in REFUSED.items() for g, r in cases],
)
def test_what_the_engine_refuses_is_400_naming_the_field_and_its_reason(engine, guide, reason):
    started = time.monotonic()
    detail = _refused(lambda: _check(guide, engine=engine))
    assert detail.startswith(f"invalid request: {guide.field}: cannot be enforced") and reason in detail
    assert time.monotonic() - started < 1.0


def test_strict_schemas_of_pydantic_models_pass():
    from pydantic import BaseModel

    class Item(BaseModel):
        name: str
        tags: list[str]
        price: float | None = None

    class Order(BaseModel):
        items: list[Item]
        note: str

    import openai.lib._pydantic as to_strict  # what client.chat.completions.parse sends

    schema = to_strict.to_strict_json_schema(Order)
    guide = _chat(response_format={"type": "json_schema", "json_schema": {"name": "Order", "schema": schema, "strict": True}})
    _check(guide)


# --- compiling off the loop: timeout, cache ------------------------------------------------------


def _big_schema(tag: str, properties: int = 200) -> Guide:
    """A schema whose check takes a noticeable time (200 properties: ~0.3 s with xgrammar, whose regex
    conversion grows fast with repetition counts: 1,500 take it minutes; 1,500: ~0.1 s with llguidance)."""
    props = {f"{tag}{i}": {"type": "string", "pattern": f"[a-z]{{1,{i + 2}}}[0-9]{{2,9}}"} for i in range(properties)}
    return Guide("json_schema", json.dumps({"type": "object", "properties": props}), "guided_json")


def test_a_compile_slower_than_the_timeout_is_400_and_the_loop_keeps_running():
    guide = _big_schema(f"t{time.monotonic_ns()}", 1500)  # llguidance: present on every Python here

    async def run() -> tuple[str, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.ensure_future(ticker())
        try:
            with pytest.raises(HTTPException) as caught:
                await structured.check(guide, timeout_s=1e-4, engine="llguidance")
        finally:
            task.cancel()
        return caught.value.detail, ticks

    detail, ticks = asyncio.run(run())
    assert "guided_json: took longer than" in detail and ticks > 0


def test_a_repeated_guide_is_compiled_once():
    guide = _big_schema(f"c{time.monotonic_ns()}")
    first = structured._checking(guide, "xgrammar")
    _check(guide)
    assert structured._checking(Guide(guide.type, guide.guide, "another.field"), "xgrammar") is first
    assert structured._checking(guide, "llguidance") is not first  # per engine
    bad = Guide("regex", f"(unclosed{time.monotonic_ns()}", "guided_regex")
    _refused(lambda: _check(bad, engine="llguidance"))
    assert isinstance(structured._checking(bad, "llguidance").result(), structured.Refused)  # the refusal is cached too


# --- tool_choice guides go through the same checks -------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": PERSON}},
    {"type": "function", "function": {"name": "get_time"}},
]


def _core() -> RequestCore:
    core = RequestCore()
    pool = SimpleNamespace(info=SimpleNamespace(tool_call_parser="hermes", reasoning_parser=None), max_in_flight=8, open_streams=0)
    core.attach(pool, RequestLimits(max_input_len=1024, max_output_len=64))
    return core


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_choice_guides_compile(choice):
    req = chat.generation_request(ChatCompletionRequest.model_validate({"messages": CHAT, "tools": TOOLS, "tool_choice": choice}))
    spec = asyncio.run(_core().prepare(req))
    check_guide(spec.params.guided_decoding_guide_type, spec.params.guided_decoding_guide)


@NEEDS_XGRAMMAR
def test_tool_parameters_the_engine_cannot_enforce_are_left_out_unless_strict():
    """Changed on purpose (issue 32): a non-strict tool's parameters are best effort, like response_format's."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "string", "pattern": "(a)\\1"}}}]
    req = chat.generation_request(ChatCompletionRequest.model_validate({"messages": CHAT, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "f"}}}))
    spec = asyncio.run(_core().prepare(req))  # the backreference xgrammar cannot compile is left out
    assert spec.unenforced == (".: pattern",) and "pattern" not in spec.params.guided_decoding_guide
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {"required": ["a"]}}}}]
    req = chat.generation_request(ChatCompletionRequest.model_validate({"messages": CHAT, "tools": tools, "tool_choice": "required"}))
    spec = asyncio.run(_core().prepare(req))
    assert spec.unenforced == (".items.properties.parameters: not",)


def test_prepare_puts_the_guide_into_nvidias_engine_inputs():
    req = chat.generation_request(ChatCompletionRequest.model_validate({"messages": CHAT, "guided_regex": "[0-9]+"}))
    params = asyncio.run(_core().prepare(req)).params
    assert (params.guided_decoding_guide_type, params.guided_decoding_guide) == ("regex", "[0-9]+")


@pytest.mark.parametrize("engine", ENGINES)
def test_strict_tools_whose_calls_are_guided_refuse_unenforced_keywords(engine):
    nullable = {"type": "object", "properties": {"a": {"type": "string", "nullable": True}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": nullable, "strict": True}}]
    body = {"messages": CHAT, "tools": tools}
    core = _core()
    core._limits = dataclasses.replace(core._limits, guide_engine=engine)
    req = chat.generation_request(ChatCompletionRequest.model_validate({**body, "tool_choice": "required"}))
    detail = _refused(lambda: asyncio.run(core.prepare(req)))
    assert detail.startswith(f"invalid request: tools[0].function.parameters.properties.a: keyword 'nullable' cannot be enforced by {engine}")
    asyncio.run(core.prepare(chat.generation_request(ChatCompletionRequest.model_validate({**body, "tool_choice": "auto"}))))  # parsed, not guided
    loose = [{"type": "function", "function": {"name": "f", "parameters": nullable}}]
    spec = asyncio.run(core.prepare(chat.generation_request(ChatCompletionRequest.model_validate({**body, "tools": loose, "tool_choice": "required"}))))
    assert spec.unenforced == (".items.properties.parameters.properties.a: nullable",)

# --- the replica's guide compile service, as the request core sees it ----------------------------------


class _FakeChecker:
    """A guide compile service that answers what it is told to (guides.compile_service's verdicts)."""

    def __init__(self, verdict: dict | None = None, error: Exception | None = None) -> None:
        self.verdict, self.error, self.asked = verdict, error, []

    async def check(self, guide_type: str, guide: str | None, strict: bool) -> dict:
        self.asked.append((guide_type, guide, strict))
        if self.error is not None:
            raise self.error
        return self.verdict


def _prepare_with(checker: _FakeChecker, body: dict):
    core = _core()
    core.guide_checker = checker
    return asyncio.run(core.prepare(chat.generation_request(ChatCompletionRequest.model_validate({"messages": CHAT, **body}))))


FORMAT = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}}


def test_the_compile_service_verdicts_become_the_guide_a_400_a_429_or_a_503():
    from trtllm_truss.guides.compile_client import GuideServiceUnavailable
    from trtllm_truss.serving.core import Refused

    accepted = _FakeChecker({"accepted": {"text": '{"type":"object"}', "unenforced": [".: x"]}})
    spec = _prepare_with(accepted, FORMAT)
    assert accepted.asked == [("json_schema", structured.schema_text(PERSON), False)]
    assert spec.params.guided_decoding_guide == '{"type":"object"}' and spec.unenforced == (".: x",)
    assert spec.output_schema == structured.schema_text(PERSON)  # answers are validated against the original
    as_sent = _prepare_with(_FakeChecker({"accepted": {"text": None, "unenforced": []}}), FORMAT)
    assert as_sent.params.guided_decoding_guide == structured.schema_text(PERSON)

    message = "checking and compiling it takes longer than 1 s, this deployment's budget for one guide"
    detail = _refused(lambda: _prepare_with(_FakeChecker({"refused": {"message": message, "place": ""}}), FORMAT))
    assert detail == f"invalid request: response_format.json_schema.schema: {message}"
    keyword = _refused(lambda: _prepare_with(_FakeChecker({"refused": {"message": "keyword 'not'", "place": ".properties.a"}}), FORMAT))
    assert keyword == "invalid request: response_format.json_schema.schema.properties.a: keyword 'not'"

    with pytest.raises(Refused) as busy:
        _prepare_with(_FakeChecker({"busy": {"message": "every guide compile process is taken", "retry_after": 2}}), FORMAT)
    assert busy.value.status == 429 and busy.value.headers == {"Retry-After": "2"}
    assert busy.value.message == "response_format.json_schema.schema: every guide compile process is taken"
    with pytest.raises(Refused) as gone:
        _prepare_with(_FakeChecker(error=GuideServiceUnavailable("not reachable")), FORMAT)
    assert gone.value.status == 503 and "Retry-After" in gone.value.headers


def test_text_depth_is_json_depth_at_c_speed():
    import random

    from trtllm_truss.api.body import text_depth

    rng = random.Random(40)

    def value(depth: int):
        if depth == 0 or rng.random() < 0.3:
            return rng.choice([1, "a{[", 'q"[', None, "\\\\", True, "]}"])
        if rng.random() < 0.5:
            return [value(depth - 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["k", "{", '"[', "\\\\"]) + str(i): value(depth - 1) for i in range(rng.randint(0, 3))}

    for sample in [value(9) for _ in range(500)] + [{}, [], 0, "{{{", {"a": [[[]]]}]:
        for text in (json.dumps(sample), structured.schema_text(sample)):
            assert text_depth(text) == structured.json_depth(sample), text


def test_guide_refusals_reach_each_dialect_in_its_own_error_shape():
    """Over the budget: 400 in OpenAI's shape on chat, Anthropic's on messages; busy: 429 with Retry-After."""
    message = "checking and compiling it takes longer than 1 s, this deployment's budget for one guide"
    chat_body = {"messages": CHAT, **FORMAT}
    anthropic_body = {"messages": CHAT, "max_tokens": 4, "output_config": {"format": {"type": "json_schema", "schema": PERSON}}}
    for verdict, status in (({"refused": {"message": message, "place": ""}}, 400),
                            ({"busy": {"message": "every guide compile process is taken", "retry_after": 1}}, 429)):
        core = _core()
        core.guide_checker = _FakeChecker(verdict)
        openai_answer = asyncio.run(chat.chat_completions(core, chat_body, None))
        anthropic_answer = asyncio.run(messages.messages(core, anthropic_body, None))
        assert openai_answer.status_code == anthropic_answer.status_code == status
        openai_error, anthropic_error = json.loads(openai_answer.body), json.loads(anthropic_answer.body)
        assert openai_error["error"]["type"] == "invalid_request_error"
        assert openai_error["error"]["message"].split(": ", 1)[-1].endswith(verdict[next(iter(verdict))]["message"])
        assert anthropic_error["type"] == "error" and anthropic_error["error"]["message"].endswith(verdict[next(iter(verdict))]["message"])
        assert "output_config.format.schema" in anthropic_error["error"]["message"]
        if status == 429:
            assert openai_answer.headers["retry-after"] == anthropic_answer.headers["retry-after"] == "1"
