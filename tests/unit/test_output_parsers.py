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
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Par'),  # ended early (EOS, a stop string): text
        ("hermes", '<tool_call>{"name": "get_weather", "arguments": [1, 2]}</tool_call>'),  # arguments not an object
        ("hermes", "<tool_call>not json</tool_call>"),
        ("llama3_json", '{"answer": 42, "note": "a JSON answer, no call"}'),
        ("llama3_json", '{"name": "get_weather", "parameters": {"location": '),
        ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"loc'),
        ("mistral", "[TOOL_CALLS]get_weather[ARGS]{oops}"),
        ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"a\":"),
    ],
)
def test_a_malformed_call_comes_back_as_the_models_text(family, answer):
    text, _, calls, _ = _same_streamed(answer, tools=family)
    assert calls == [] and text == answer.lstrip()


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
        ("deepseek_r1", "Let me think.\nOK.</think>\n\nThe answer is 4.", "<｜Assistant｜><think>\n", "Let me think.\nOK.", "\n\nThe answer is 4."),
        ("deepseek_r1", "<think>Hmm.</think>Four.", "<｜Assistant｜>", "Hmm.", "Four."),
        ("deepseek_r1", "still thinking when max_tokens hit", "", "still thinking when max_tokens hit", ""),
        ("qwen3", "<think>\nTwo plus two.\n</think>\n\n4", "<|im_start|>assistant\n", "\nTwo plus two.\n", "\n\n4"),
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
    text, _, calls, _ = _same_streamed('{"location": "Par', tools="guided_named", arg="get_weather")
    assert calls == [] and text == '{"location": "Par'


@pytest.mark.parametrize(
    "template, tools, reasoning",
    [
        ("{% for m in messages %}<|im_start|>{{ m.role }}{% if tools %}<tools></tools> <tool_call>{% endif %}", "hermes", None),
        ("[AVAILABLE_TOOLS]...[TOOL_CALLS]", "mistral", None),
        ("<｜Assistant｜><｜tool▁calls▁begin｜><think>\\n", "deepseek_v3", "deepseek_r1"),
        ("<|start_header_id|>ipython<|end_header_id|> <|python_tag|>", "llama3_json", None),
        ("<|im_start|>assistant\\n<think>\\n\\n</think> <tool_call>", "hermes", "qwen3"),
        ("<|start|>assistant<|channel|>final<|message|>", "gpt_oss", "gpt_oss"),
        ("{% for message in messages %}### {{ message['role'] }}{% endfor %}", None, None),
    ],
)
def test_auto_detects_the_family_from_the_chat_template(template, tools, reasoning):
    assert detect_tool_parser(template) == tools
    assert detect_reasoning_parser(template) == reasoning


def test_every_registered_parser_is_documented_and_configurable():
    from trtllm_truss.config.runtime import RuntimeConfig

    documented = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    tool_names = set(RuntimeConfig.model_fields["tool_call_parser"].annotation.__args__) - {"auto", "none"}
    reasoning_names = set(RuntimeConfig.model_fields["reasoning_parser"].annotation.__args__) - {"auto", "none"}
    assert tool_names == set(TOOL_PARSERS) - {"guided_required", "guided_named"}
    assert reasoning_names == set(REASONING_PARSERS)
    assert all(f"`{name}`" in documented for name in tool_names | reasoning_names)
    assert keep_tokens("mistral", None) >= {"[TOOL_CALLS]"}


# ------------------------------------------------------------------------- cut by the token limit


def _cut(answer: str, step: int | None = None, **kwargs):
    """(text, [(name, arguments)]) of `answer` when the token limit ended it."""
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
    return "".join(p[1] for p in parts if p[0] == "text"), [(name, json.loads(args)) for name, args in calls]


# Answers the limit cut inside their second call (the first complete), in each family's format.
CUT_IN_SECOND_CALL = [
    ("guided_required", '[{"name": "get_weather", "parameters": {"city": ""}}, {"name": "get_wea', None, ""),
    ("guided_required", '[{"name": "get_weather", "parameters": {"city": ""}},', None, ""),
    ("hermes", 'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": ""}}</tool_call>\n<tool_call>{"name": "ge', None, "Checking."),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": ""}}</tool_call>\n<tool_', None, ""),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": ""}}; {"name": "get_w', None, ""),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": ""}}, {"name": "get', None, ""),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": ""}[TOOL_CALLS]get_weather[ARGS]{"ci', None, ""),
    ("deepseek_v3", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": ""}<｜tool▁call▁end｜>'
                    '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"ci', None, ""),
]


@pytest.mark.parametrize("family, answer, arg, text", CUT_IN_SECOND_CALL)
@pytest.mark.parametrize("step", [None, 1, 3])
def test_a_cut_answer_keeps_its_complete_calls_and_drops_the_cut_one(family, answer, arg, text, step):
    assert _cut(answer, step, tools=family, arg=arg) == (text, [("get_weather", {"city": ""})])


@pytest.mark.parametrize(
    "family, answer, arg",
    [
        ("guided_named", '{"city": "Par', "get_weather"),
        ("guided_required", '[{"name": "get_weather", "param', None),
        ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"ci', None),
        ("llama3_json", '{"name": "get_weather", "parameters": {"city": ', None),
        ("llama3_json", '<|python_tag|>{"na', None),
    ],
)
def test_a_call_the_limit_cut_short_is_never_text(family, answer, arg):
    assert _cut(answer, tools=family, arg=arg) == ("", [])


def test_text_the_limit_cut_stays_text():
    assert _cut('{"answer": 4', tools="llama3_json") == ('{"answer": 4', [])  # JSON that is no call
    assert _cut("The weather is", tools="hermes") == ("The weather is", [])
    answer = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"ci"
    assert _cut(answer, tools="gpt_oss", reasoning="gpt_oss") == ("", [])


def test_guided_required_calls_stream_as_each_item_completes():
    parser = OutputParser.create(None, "guided_required", None, "")
    first = parser.feed('[{"name": "a", "parameters": {}}, {"name": "b", "par')
    assert [p[3] for p in first if p[0] == "tool" and p[3]] == ["a"]
    rest = parser.feed('ameters": {"x": 1}}]') + parser.finish()
    assert [p[3] for p in rest if p[0] == "tool" and p[3]] == ["b"] and not [p for p in rest if p[0] == "text"]
