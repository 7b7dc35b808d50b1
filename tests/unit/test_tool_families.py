"""Every model family's parsers over its own recorded outputs and real chat templates
(tests/data/tool_families, see its README.md): the calls, reasoning and text of each recorded
answer, fed whole, one character at a time and in random pieces (the same parts whatever the
pieces); answers cut anywhere (the calls cut keep the arguments generated so far, always JSON or
the start of it); detection over every recorded template (no family taken for another); each
family's template rendering our conversation (its calls parse back); the forced-call syntax each
family declares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic_core import from_json
from tool_families import (
    CONVERSATION,
    DATA,
    OURS,
    PROMPT_TAIL,
    TEMPLATE_FAMILY,
    WEATHER_TOOL,
    arguments_of,
    chunkings,
    parsers_of,
    records,
    run,
    text_of,
)
from trtllm_truss.parsers import FAMILIES, TOOL_PARSERS, OutputParser, detect

@pytest.mark.parametrize("folder, record", records(), ids=lambda v: v["id"] if isinstance(v, dict) else v)
def test_recorded_outputs_parse_alike_whole_and_streamed(folder, record):
    tool, reasoning = parsers_of(folder, record)
    tail = PROMPT_TAIL.get(record["id"], (record.get("context") or {}).get("generation_prompt_tail", ""))
    text = text_of(record)
    runs = [run(tool, reasoning, tail, record["tools"], pieces) for pieces in chunkings(text, record["id"])]
    results = {json.dumps([c, t, [call[:2] for call in calls]]) for c, t, calls in runs}
    assert len(results) == 1, results  # the same text, reasoning, calls and arguments, however it streamed
    content, thinking, calls = runs[0]
    got = ((content or "").strip() or None, (thinking or "").strip() or None, [(name, arguments_of(args)) for name, args, _ in calls])
    if record["id"] in OURS:
        want_content, want_reasoning, want_calls, _why = OURS[record["id"]]
        want = (want_content, want_reasoning, [(n, a) for n, a in want_calls])
    else:
        expected = record["expected"]
        want = (
            (expected["content"] or "").strip() or None,  # whitespace around calls and reasoning: see docs/api.md
            (expected["reasoning"] or "").strip() or None,
            [(c["name"], c["arguments"]) for c in expected["tool_calls"]],
        )
    assert got == want
    for call, expected_call in zip(calls, record["expected"]["tool_calls"]):
        if "id" in expected_call and folder == "kimi_k2":  # Kimi's ids are the model's own
            assert call[2] == expected_call["id"]
    if tool == "mistral":
        assert all(len(c[2]) == 9 and c[2].isalnum() for c in calls)


@pytest.mark.parametrize("folder, record", [(f, r) for f, r in records() if r["expected"]["tool_calls"]], ids=lambda v: v["id"] if isinstance(v, dict) else v)
def test_an_answer_cut_anywhere_keeps_its_calls_with_the_arguments_generated_so_far(folder, record):
    """Cut at any point (max_tokens): the calls are those of the whole answer up to the cut, each with
    a prefix of its arguments (JSON or the start of it, as the anthropic SDK's partial parser reads
    it); the cut text is no call's half-written name, nor the call section's closing tags cut short: what
    text there is, is the start of the whole answer's text."""
    tool, reasoning = parsers_of(folder, record)
    tail = PROMPT_TAIL.get(record["id"], (record.get("context") or {}).get("generation_prompt_tail", ""))
    text = text_of(record)
    whole_content, _, whole = run(tool, reasoning, tail, record["tools"], [text])
    step = max(1, len(text) // 40)
    for at in range(1, len(text), step):
        content, _, calls = run(tool, reasoning, tail, record["tools"], [text[:at]], cut=True)
        assert " ".join(whole_content.split()).startswith(" ".join(content.split())), (at, content, whole_content)
        if len(calls) == len(whole) + 1:  # cut after a name, before what made the whole answer no call
            assert calls[-1][1] == "", at
            calls = calls[:-1]
        assert len(calls) <= len(whole), at
        for (name, arguments, _), (whole_name, whole_arguments, _) in zip(calls, whole):
            assert name == whole_name and whole_arguments.startswith(arguments), (at, arguments, whole_arguments)
            if arguments and arguments.startswith("{"):
                from_json(arguments, allow_partial=True)  # what the anthropic SDK does with input_json_delta


# --------------------------------------------------------------------------------------- detection

def _templates() -> list[Path]:
    return sorted(DATA.glob("*/*.jinja"))


@pytest.mark.parametrize("path", _templates(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_recorded_template_is_detected_as_its_own_family(path):
    relative = f"{path.parent.name}/{path.name}"
    detection = detect(path.read_text())
    assert detection.family is not None and detection.family.name == TEMPLATE_FAMILY.get(relative, TEMPLATE_FAMILY[path.parent.name])
    assert detection.warnings == ()


def test_template_less_families_are_found_by_their_markers_and_tokens():
    assert detect(None, {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"}).family.name == "kimi_k3"
    assert detect(None, {"<|tool_call>", '<|"|>'}).tool_parser == "gemma4"
    assert detect("{{ '<｜DSML｜tool_calls>' }}").tool_parser == "deepseek_v4"
    assert detect("{{ '<｜DSML｜ calls>' }}").tool_parser == "deepseek_v41"
    assert detect("{% set ns = ']<]minimax[>[' %}{{ ns + '<tool_call>' + ns + '<invoke name=' }}").tool_parser == "minimax_m3"
    assert detect("<tool_call>{{ name }}<arg_key>{{ k }}</arg_key><arg_value>").tool_parser == "poolside_v1"
    unknown = detect("{% for tool in tools %}{{ tool | tojson }}{% endfor %}")
    assert unknown.tool_parser is None and "runtime.tool_call_parser" in unknown.warnings[0]


def test_families_alike_are_a_warning_naming_the_setting():
    from trtllm_truss.parsers.detect import Family, register_family

    twin = register_family(Family("twin_of_hermes", "a twin", "qwen3_coder", template=("<tool_call>",)))
    try:
        detection = detect("{{ '<tool_call>' }}")
        assert detection.tool_parser == "hermes" and "runtime.tool_call_parser" in detection.warnings[0]
    finally:
        del FAMILIES[twin.name]


# ------------------------------------------------------------------------ rendered by the templates

# Templates that cannot render this conversation through transformers, and why.
UNRENDERED = {
    "deepseek_r1/chat_template.jinja": "writes calls only for content None, which transformers 5 drops from every message",
    "deepseek_r1/chat_template_r1_distill_llama_8b.jinja": "as above",
    "deepseek_r1/chat_template_llamacpp_r1_tool.jinja": "llama.cpp's Jinja (minja) only",
    "deepseek_v31/chat_template_vllm_tool.jinja": "llama.cpp's Jinja (minja) only",
    "kimi_k2/chat_template_k2_instruct_early.jinja": "renders no tool calls at all",
}
TEXT_ARGUMENTS = {"deepseek_v31/chat_template.jinja", "mistral/chat_template.jinja", "mistral/chat_template_v7.jinja"}


@pytest.fixture(scope="module")
def embedded_tokenizer():
    from trtllm_truss.api.prompt import PromptTokenizer

    return PromptTokenizer.load(Path(__file__).resolve().parents[2] / "data" / "embedded-llama").tokenizer


@pytest.mark.parametrize("path", _templates(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_template_renders_our_conversation_and_its_call_parses_back(path, embedded_tokenizer):
    """The embedded model's tokenizer with the family's template: our messages (a call, its result)
    as the request core hands them over render, the call in the family's own syntax (arguments as
    an object or as JSON text, whichever the template takes), which the family's parser reads back."""
    from trtllm_truss.api.prompt import PromptTokenizer
    from trtllm_truss.parsers import template_turns
    from trtllm_truss.serving.core import _template_turn

    relative = f"{path.parent.name}/{path.name}"
    detection = detect(path.read_text())
    tokenizer = embedded_tokenizer
    saved = tokenizer.chat_template
    tokenizer.chat_template = path.read_text()
    try:
        prompt = PromptTokenizer.of(tokenizer)
        turns = template_turns(detection.tool_parser, [_template_turn(m) for m in CONVERSATION])
        text = prompt.render_chat(turns, tools=[WEATHER_TOOL]) if relative not in UNRENDERED or "minja" not in UNRENDERED[relative] else None
    finally:
        tokenizer.chat_template = saved
    if relative in UNRENDERED:
        return
    assert "sunny" in text and "And in Rome?" in text
    assert prompt._text_arguments == (relative in TEXT_ARGUMENTS)
    tool = detection.tool_parser
    parser_cls = TOOL_PARSERS[tool]
    after = text.index("Weather in Paris?")
    mention = text.index("get_weather", after)
    openers = tuple(o for o in (*parser_cls.markers, *parser_cls.at_start) if o)
    start = max((text.rfind(o, after, mention) for o in openers), default=-1)
    if tool == "gpt_oss":
        start = text.rfind("to=functions.", after, mention + len("get_weather"))
    section = text[start:] if start >= 0 else text[after + len("Weather in Paris?"):]
    _, _, calls = run(tool, "gpt_oss" if tool == "gpt_oss" else None, "", [WEATHER_TOOL], [section])
    assert calls, section
    name, arguments, _ = calls[0]
    # Llama 4's pythonic template writes every value as a string (`days="3"`).
    assert (name, json.loads(arguments)) in (("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Paris", "days": "3"}))


# ------------------------------------------------------------------------------------ cost per feed

LONG_TOOLS = [{"type": "function", "function": {"name": "write", "parameters": {"properties": {"code": {"type": "string"}}}}}]


def _long_answer(family: str, size: int) -> str:
    body = ("x = 1  # a line of code\n" * (size // 24 + 1))[:size]
    return {
        "hermes": '<tool_call>{"name": "write", "arguments": {"code": ' + json.dumps(body) + "}}</tool_call>",
        "qwen3_coder": "<tool_call>\n<function=write>\n<parameter=code>\n" + body + "\n</parameter>\n</function>\n</tool_call>",
        "gemma4": '<|tool_call>call:write{code:<|"|>' + body + '<|"|>}<tool_call|>',
        "minimax_m3": ']<]minimax[>[<tool_call>]<]minimax[>[<invoke name="write">]<]minimax[>[<code>' + body + "]<]minimax[>[</code>]<]minimax[>[</invoke>]<]minimax[>[</tool_call>",
        "pythonic": "[write(code=" + repr(body) + ")]",
    }[family]


@pytest.mark.one_python  # the parsers' cost grows with what is fed on every Python alike
@pytest.mark.parametrize("family", ["hermes", "qwen3_coder", "gemma4", "minimax_m3", "pythonic"])
def test_a_feed_costs_what_it_adds_not_the_whole_call(family):
    """The parsers run per token in the stream workers: a call four times longer (fed a few characters
    at a time, as tokens come) takes about four times as long, not sixteen."""
    import time

    def seconds(size: int) -> float:
        answer = _long_answer(family, size)
        best = float("inf")
        for _ in range(5):
            parser = OutputParser.create(None, family, None, "", LONG_TOOLS)
            # this process's CPU time, not the wall clock: other processes on a busy machine (CI's other lane)
            # take the cores, not this loop's operations
            start = time.process_time()
            for at in range(0, len(answer), 4):
                parser.feed(answer[at:at + 4])
            parser.finish()
            best = min(best, time.process_time() - start)
        return best

    assert seconds(24_000) / seconds(6_000) < 9
