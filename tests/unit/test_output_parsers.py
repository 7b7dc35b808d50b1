"""Reasoning and tool-call parsers (trtllm_truss.parsers) on answers in each family's documented
format: whole and streamed in pieces of every size give the same text, reasoning and calls;
malformed calls come back as the model's text; an answer the token limit cut keeps its complete calls
and drops the one cut short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_truss.parsers import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    OutputParser,
    detect_reasoning_parser,
    detect_tool_parser,
    keep_tokens,
)

WEATHER = {"location": "Paris, France", "unit": "celsius"}


def _parse(answer: str, *, tools: str | None = None, reasoning: str | None = None, arg: str | None = None,
           step: int | None = None, prompt_tail: str = ""):
    """(text, reasoning, [(name, arguments dict)], call ids) of `answer` fed whole or `step` characters at a time."""
    parser = OutputParser.create(reasoning, tools, arg, prompt_tail)
    assert parser is not None
    parts = []
    pieces = [answer] if step is None else [answer[i : i + step] for i in range(0, len(answer), step)]
    for piece in pieces:
        parts += parser.feed(piece)
    parts += parser.finish()
    text = "".join(p[1] for p in parts if p[0] == "text")
    thinking = "".join(p[1] for p in parts if p[0] == "reasoning")
    calls: list[list] = []
    for p in parts:
        if p[0] == "tool":
            _, index, call_id, name, arguments = p
            if name is not None:
                assert index == len(calls) and call_id
                calls.append([name, arguments, call_id])
            else:
                calls[index][1] += arguments
    assert parser.tool_calls == len(calls)
    return text, thinking, [(name, json.loads(args)) for name, args, _ in calls], [c[2] for c in calls]


def _same_streamed(answer: str, **kwargs):
    whole = _parse(answer, **kwargs)
    for step in (1, 2, 3, 7):
        streamed = _parse(answer, step=step, **kwargs)
        assert streamed[:3] == whole[:3], step
    return whole


# Each family's documented format (the models' cards and chat templates), with text around calls.
CASES = [
    (
        "hermes",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris, France", "unit": "celsius"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "Let me check.\n",
        [("get_weather", WEATHER), ("get_time", {})],
    ),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"location": "Paris, France", "unit": "celsius"}}',
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"location": "Paris, France", "unit": "celsius"}}; '
        '{"name": "get_time", "arguments": {"zone": "CET"}}',
        "",
        [("get_weather", WEATHER), ("get_time", {"zone": "CET"})],
    ),
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"location": "Paris, France", "unit": "celsius"}}, '
        '{"name": "get_time", "arguments": {}}]',
        "",
        [("get_weather", WEATHER), ("get_time", {})],
    ),
    (
        "mistral",
        'Sure.[TOOL_CALLS]get_weather[ARGS]{"location": "Paris, France", "unit": "celsius"}[TOOL_CALLS]get_time[ARGS]{}',
        "Sure.",
        [("get_weather", WEATHER), ("get_time", {})],
    ),
    (
        "deepseek_v3",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"location": "Paris, France", "unit": "celsius"}\n```<｜tool▁call▁end｜>\n'
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "",
        [("get_weather", WEATHER), ("get_time", {})],
    ),
    (
        "deepseek_v3",  # DeepSeek V3.1's shape
        'I will look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"location": "Paris, France", '
        '"unit": "celsius"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "I will look.",
        [("get_weather", WEATHER)],
    ),
]


@pytest.mark.parametrize("family, answer, text, calls", CASES)
def test_documented_calls_parse_whole_and_streamed_alike(family, answer, text, calls):
    got_text, _, got_calls, ids = _same_streamed(answer, tools=family)
    assert (got_text, got_calls) == (text, calls)
    assert len(set(ids)) == len(ids)
    if family == "mistral":  # Mistral's templates take 9-character alphanumeric ids only
        assert all(len(i) == 9 and i.isalnum() for i in ids)


@pytest.mark.parametrize(
    "family, answer",
    [
        ("hermes", '<tool_call>{"name": "get_weather", "arguments": [1, 2]}</tool_call>'),  # arguments not an object
        ("hermes", "<tool_call>not json</tool_call>"),
        ("hermes", '<tool_call>{"name": "get_weather", "arguments": {oops}}</tool_call>'),  # `{` that opens no object
        ("llama3_json", '{"answer": 42, "note": "a JSON answer, no call"}'),
        ("mistral", "[TOOL_CALLS]get_weather[ARGS]{oops}"),
        ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\nnope"),
    ],
)
def test_a_malformed_call_comes_back_as_the_models_text(family, answer):
    text, _, calls, _ = _same_streamed(answer, tools=family)
    assert calls == [] and text == answer.lstrip()


def test_a_call_the_model_ended_inside_its_arguments_is_a_call_with_what_it_wrote():
    """Committed (name and `{"`): the answer ending early (EOS, a stop string) leaves the call with the
    arguments written, as a cut by the limit does; a call is never taken back once streamed."""
    answer = '<tool_call>{"name": "get_weather", "arguments": {"location": "Par'
    parser = OutputParser.create(None, "hermes", None, "")
    parts = parser.feed(answer) + parser.finish()
    assert [p for p in parts if p[0] == "text"] == []
    assert "".join(p[4] for p in parts if p[0] == "tool") == '{"location": "Par' and parser.tool_calls == 1


def test_a_good_call_before_a_malformed_one_is_kept_and_the_rest_is_text():
    answer = '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "argu'
    text, _, calls, _ = _same_streamed(answer, tools="hermes")
    assert calls == [("a", {})] and text == '<tool_call>{"name": "b", "argu'


def test_text_without_calls_streams_untouched_and_only_a_marker_prefix_is_held():
    parser = OutputParser.create(None, "hermes", None, "")
    assert parser.feed("Hello <tool") == [("text", "Hello ")]  # "<tool" may open a call: held
    assert parser.feed("s are great") == [("text", "<tools are great")]
    assert parser.finish() == []


@pytest.mark.parametrize(
    "reasoning, answer, prompt_tail, thinking, text",
    [
        ("deepseek_r1", "Let me think.\nOK.</think>\n\nThe answer is 4.", "<｜Assistant｜><think>\n", "Let me think.\nOK.", "The answer is 4."),
        ("deepseek_r1", "<think>Hmm.</think>Four.", "<｜Assistant｜>", "Hmm.", "Four."),
        ("deepseek_r1", "still thinking when max_tokens hit", "", "still thinking when max_tokens hit", ""),
        ("qwen3", "<think>\nTwo plus two.\n</think>\n\n4", "<|im_start|>assistant\n", "Two plus two.", "4"),
        ("qwen3", "4, without thinking", "<|im_start|>assistant\n<think>\n\n</think>\n\n", "", "4, without thinking"),
        ("qwen3", "Reasoning first.</think>4", "<|im_start|>assistant\n<think>\n", "Reasoning first.", "4"),
        (
            "gpt_oss",
            "<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
            "<|start|>assistant",
            "User asks 2+2.",
            "4",
        ),
    ],
)
def test_reasoning_is_split_from_the_answer(reasoning, answer, prompt_tail, thinking, text):
    got_text, got_thinking, calls, _ = _same_streamed(answer, reasoning=reasoning, prompt_tail=prompt_tail)
    assert (got_thinking, got_text, calls) == (thinking, text, [])


def test_tool_calls_are_parsed_in_the_answer_only():
    answer = '<think>Maybe <tool_call>{"name": "x", "arguments": {}}</tool_call>? No: call get_time.</think>' \
             '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    text, thinking, calls, _ = _same_streamed(answer, reasoning="qwen3", tools="hermes")
    assert calls == [("get_time", {})] and "<tool_call>" in thinking and text == ""


def test_gpt_oss_calls_come_from_the_commentary_channel():
    answer = (
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"location": "Paris, France", "unit": "celsius"}<|call|>'
    )
    text, thinking, calls, _ = _same_streamed(answer, reasoning="gpt_oss", tools="gpt_oss")
    assert (thinking, text, calls) == ("Need weather.", "", [("get_weather", WEATHER)])


def test_guided_answers_are_the_calls():
    required = json.dumps([{"name": "get_weather", "parameters": WEATHER}, {"name": "get_time", "parameters": {}}])
    assert _same_streamed(required, tools="guided_required")[2] == [("get_weather", WEATHER), ("get_time", {})]
    assert _same_streamed(json.dumps(WEATHER), tools="guided_named", arg="get_weather")[2] == [("get_weather", WEATHER)]
    text, _, calls, _ = _same_streamed('{"location": "Paris"}', tools="guided_named", arg="get_weather")
    assert calls == [("get_weather", {"location": "Paris"})] and text == ""


@pytest.mark.parametrize(
    "template, tools, reasoning",
    [
        ("{% for m in messages %}<|im_start|>{{ m.role }}{% if tools %}<tools></tools> <tool_call>{% endif %}", "hermes", None),
        ("<|im_start|>assistant\\n<think>\\n\\n</think> <tool_call>", "hermes", "qwen3"),
        ("{% for message in messages %}### {{ message['role'] }}{% endfor %}", None, None),
    ],
)
def test_auto_detects_the_family_from_the_chat_template(template, tools, reasoning):
    """(Every recorded template of every family: tests/unit/test_tool_families.py.)"""
    assert detect_tool_parser(template) == tools
    assert detect_reasoning_parser(template) == reasoning


def test_every_registered_parser_is_documented_and_configurable():
    from trtllm_truss.config.runtime import RuntimeConfig
    from trtllm_truss.parsers import FAMILIES, setting_problems

    documented = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    names = {n for n in TOOL_PARSERS if not n.startswith("guided_")} | set(REASONING_PARSERS)
    assert all(f"`{name}`" in documented for name in names)
    assert all(f"`{family}`" in documented for family in FAMILIES)
    for name in TOOL_PARSERS:
        if not name.startswith("guided_"):
            assert RuntimeConfig(tool_call_parser=name).tool_call_parser == name
            assert setting_problems(name, "auto") == []
    assert setting_problems("nope", "qwen3")[0].startswith("model_metadata.trt_llm.runtime.tool_call_parser: 'nope' is no parser")
    assert setting_problems("auto", "guided_named") != [] and setting_problems("guided_required", "none") != []
    assert keep_tokens("mistral", None) >= {"[TOOL_CALLS]"}


# ------------------------------------------------------------------------- cut by the token limit


# Answers the limit cut inside their second call (the first complete), in each family's format: the
# second call is kept with the arguments generated so far.
CUT_IN_SECOND_CALL = [
    ("guided_required", '[{"name": "get_weather", "parameters": {"city": ""}}, {"name": "get_weather", "parameters": {"ci', None, "", '{"ci'),
    ("hermes", 'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": ""}}</tool_call>\n<tool_call>{"name": "get_weather", "arguments": {"ci', None, "Checking.", '{"ci'),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": ""}}; {"name": "get_weather", "parameters": {"ci', None, "", '{"ci'),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": ""}}, {"name": "get_weather", "arguments": {"ci', None, "", '{"ci'),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": ""}[TOOL_CALLS]get_weather[ARGS]{"ci', None, "", '{"ci'),
    ("deepseek_v3", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": ""}<｜tool▁call▁end｜>'
                    '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"ci', None, "", '{"ci'),
    ("guided_required", '[{"name": "get_weather", "parameters": {"city": ""}}, {"name": "get_weather", "param', None, "", ""),
]


def _cut_calls(answer: str, step: int | None = None, **kwargs):
    """(text, [(name, arguments text)]) of `answer` when the token limit ended it."""
    parser = OutputParser.create(kwargs.pop("reasoning", None), kwargs.pop("tools"), kwargs.pop("arg", None), "")
    assert parser is not None
    pieces = [answer] if step is None else [answer[i : i + step] for i in range(0, len(answer), step)]
    parts = [part for piece in pieces for part in parser.feed(piece)] + parser.finish(cut=True)
    calls: list[list] = []
    for p in parts:
        if p[0] == "tool":
            if p[3] is not None:
                calls.append([p[3], ""])
            calls[p[1]][1] += p[4]
    assert parser.tool_calls == len(calls)
    return "".join(p[1] for p in parts if p[0] == "text"), [(name, args) for name, args in calls]


@pytest.mark.parametrize("family, answer, arg, text, cut_arguments", CUT_IN_SECOND_CALL)
@pytest.mark.parametrize("step", [None, 1, 3])
def test_a_cut_answer_keeps_the_call_it_cut_with_the_arguments_generated_so_far(family, answer, arg, text, cut_arguments, step):
    assert _cut_calls(answer, step, tools=family, arg=arg) == (text, [("get_weather", '{"city": ""}'), ("get_weather", cut_arguments)])


@pytest.mark.parametrize(
    "family, answer, arg",
    [
        ("guided_required", '[{"name": "get_wea', None),
        ("hermes", '<tool_call>{"name": "get_wea', None),
        ("hermes", '<tool_call>\n{"na', None),
        ("hermes", "<tool_", None),
        ("llama3_json", '<|python_tag|>{"na', None),
        ("qwen3_coder", "<tool_call>\n<function=get_wea", None),
    ],
)
def test_a_call_cut_inside_its_name_is_dropped(family, answer, arg):
    assert _cut_calls(answer, tools=family, arg=arg) == ("", [])


def test_a_call_cut_after_its_name_has_the_arguments_generated_so_far():
    assert _cut_calls('<tool_call>{"name": "get_weather", "arguments": ', tools="hermes") == ("", [("get_weather", "")])
    assert _cut_calls('{"city": "Par', tools="guided_named", arg="get_weather") == ("", [("get_weather", '{"city": "Par')])
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"properties": {"city": {"type": "string"}}}}}]
    parser = OutputParser.create(None, "qwen3_coder", None, "", tools)
    parts = parser.feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar") + parser.finish(cut=True)
    assert "".join(p[4] for p in parts) == '{"city": "Par'  # a string parameter streams


def test_text_the_limit_cut_stays_text():
    assert _cut_calls('{"answer": 4', tools="llama3_json") == ('{"answer": 4', [])  # JSON that is no call
    assert _cut_calls("The weather is", tools="hermes") == ("The weather is", [])
    answer = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"ci"
    assert _cut_calls(answer, tools="gpt_oss", reasoning="gpt_oss") == ("", [("get_weather", '{"ci')])


def test_guided_required_calls_stream_name_first_then_arguments_as_generated():
    parser = OutputParser.create(None, "guided_required", None, "")
    first = parser.feed('[{"name": "a", "parameters": {}}, {"name": "b", "parameters": {"x"')
    assert [p[3] for p in first if p[0] == "tool" and p[3]] == ["a", "b"]
    assert "".join(p[4] for p in first if p[0] == "tool" and p[1] == 1) == '{"x"'
    rest = parser.feed(': 1}}]') + parser.finish()
    assert "".join(p[4] for p in rest if p[0] == "tool") == ": 1}" and not [p for p in rest if p[0] == "text"]
