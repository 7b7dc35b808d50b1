"""Every model family's parsers over its own recorded outputs and real chat templates
(tests/data/tool_families, see its README.md): the calls, reasoning and text of each recorded
answer, fed whole, one character at a time and in random pieces (the same parts whatever the
pieces); answers cut anywhere (the calls cut keep the arguments generated so far, always JSON or
the start of it); detection over every recorded template (no family taken for another); each
family's template rendering our conversation (its calls parse back); the forced-call syntax each
family declares."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from pydantic_core import from_json
from trtllm_truss.parsers import (
    FAMILIES,
    TOOL_PARSERS,
    CallSyntax,
    OutputParser,
    detect,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "tool_families"

# folder -> (tool-call parser, reasoning parser) its recorded outputs are read with
PARSERS = {
    "deepseek_r1": ("deepseek_v3", "deepseek_r1"),
    "deepseek_v3": ("deepseek_v3", None),
    "deepseek_v31": ("deepseek_v31", "qwen3"),
    "deepseek_v32": ("deepseek_v32", "qwen3"),
    "deepseek_v4": ("deepseek_v4", "qwen3"),
    "devstral": ("mistral", "mistral"),
    "gemma4": ("gemma4", "gemma4"),
    "glm45": ("glm45", "glm45"),
    "glm47": ("glm47", "glm45"),
    "gpt_oss": ("gpt_oss", "gpt_oss"),
    "kimi_k2": ("kimi_k2", "kimi_k2"),
    "kimi_k3": ("kimi_k3", "kimi_k3"),
    "llama3_json": ("llama3_json", None),
    "llama4": ("pythonic", None),
    "minimax_m2": ("minimax_m2", "qwen3"),
    "minimax_m3": ("minimax_m3", "minimax_m3"),
    "mistral": ("mistral", None),
    "poolside_v1": ("poolside_v1", "qwen3"),
    "qwen3": ("hermes", "qwen3"),
    "qwen3_coder": ("qwen3_coder", "qwen3"),
}
PARSER_OF_ID = {"deepseek_v41_": "deepseek_v41"}  # id prefix -> tool-call parser, where a folder holds two

# Where a record's source assumed a prompt that opened the reasoning without saying so (vLLM's qwen3
# reasoning tests: Thinking-2507 / Qwen3.5 templates end the prompt with `<think>\n`).
PROMPT_TAIL = {
    "qwen3_reasoning_without_start_token": "<think>\n",
    "qwen3_reasoning_without_start_token_complete_reasoning": "<think>\n",
    "qwen3_reasoning_without_think_truncated": "<think>\n",
    "qwen3_reasoning_truncated_no_start_token": "<think>\n",
}
# End-of-turn tokens the engine stops at and the decoder skips: never in the text a parser reads.
END_TOKENS = ("<|eot|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_msg|>", "</s>", "<|im_end|>", "[e~[")

# Records whose source decided otherwise than this server's documented rules (docs/api.md, "Tool
# calls"): what this server answers instead, and why. (content, reasoning, [(name, arguments)]);
# "RAW:" arguments are the JSON prefix a committed call kept.
OURS: dict[str, tuple[str | None, str | None, list, str]] = {
    "deepseek_v3_malformed_unclosed_json": (None, None, [("get_weather", 'RAW:{"city": "Tokyo"\n')], "committed at `{`: a call, its arguments the JSON written before the text stopped being JSON"),
    "deepseek_v3_malformed_missing_call_begin": ("<｜tool▁calls▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"}\n```<｜tool▁calls▁end｜>", None, [], "no call begin: the model's text, as written"),
    "devstral_vllm_malformed_name_without_args": ("[TOOL_CALLS]toolname_no_args", None, [], "no [ARGS]: never committed, the model's text"),
    "ministral3_reasoning_then_fenced_json_output": ('```json\n{"amount": 123.45, "date": "2025-12-03"}\n```', "I need to output the invoice details in JSON", [], "the answer as written (no fence stripping)"),
    "gemma4_malformed_trailing_channel_close": ("Hello, world!\nWhat's up?<channel|>", None, [], "text after the reasoning is the answer, as written"),
    "gemma4_malformed_trailing_empty_thought": ("Hello, world!\nWhat's up?<|channel>thought\n<channel|>", None, [], "one reasoning block, at the start"),
    "gemma4_malformed_trailing_thought_and_close": ("Hello, world!\nWhat's up?<|channel>thought\n<channel|><channel|>", None, [], "one reasoning block, at the start"),
    "gemma4_malformed_double_channel_open": ("Hello, world!\nWhat's up?", "<|channel>thought", [], "the first <|channel> opens the reasoning; the rest is its text"),
    "glm45_vllm_malformed_xml": (None, None, [("get_weather", {"city": "Seattle", "incomplete_arg": "value"})], "an <arg_key> closed by its <arg_value> still names the value"),
    "glm45_vllm_text_between_calls": ("I will help you get the weather info.\n\nmeaningwhile, I will also check the weather in Shanghai.", None, [("get_weather", {"city": "Beijing", "date": "2025-08-01"}), ("get_weather", {"city": "Shanghai", "date": "2025-08-01"})], "text between calls is kept, not dropped"),
    "glm45_vllm_malformed_unclosed_call": (None, None, [("get_weather", 'RAW:{"city": "Beijing", "date": "2025-08-01"')], "committed at its name: a call with the arguments written"),
    "llama3_json_text_around_call": ("Here is the result: Would you like to know more?", None, [("getOpenIncidentsTool", {})], "text around the call is kept"),
    "llama3_json_three_calls_text_around": ("Here are the results: Would you like to know more?", None, [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {}), ("searchTool", {"query": "test2"})], "text around the calls is kept"),
    "llama3_json_brace_in_trailing_text": ("I used {searchTool} for this.", None, [("searchTool", {"query": "test"})], "text after the call is kept"),
    "llama31_meta_doc_builtin_brave_search": ('<|python_tag|>brave_search.call(query="latest price of 1oz gold")', None, [], "Llama's built-in tools are not function calls here"),
    "llama31_meta_doc_code_interpreter": ("<|python_tag|>def is_prime(n):\n    if n <= 1\n        return False\n    for i in range(2, int(n**0.5) + 1):\n        if n % i == 0:\n            return False\n    return True\n\nprint(is_prime(7))  # Output: True", None, [], "Llama's code interpreter is no function call here"),
    "llama31_meta_doc_function_tag": ('<function=trending_songs>{"n": 10}</function>', None, [], "a format the prompt asked for is not the family's own"),
    "llama3_meta_tool_utils_custom_function_tag": ('<function=getWeather>{"location":"New York","date":"2023-08-05"}', None, [], "a format the prompt asked for is not the family's own"),
    "llama4_meta_doc_custom_function_tag": ('<function=trending_songs>{"n": 10}</function>', None, [], "a format the prompt asked for is not the family's own"),
    "llama32_meta_doc_pythonic_two_calls": ("[get_weather(city='San Francisco', metric='celsius'), get_weather(city='Seattle', metric='celsius')]", None, [], "pythonic calls under the JSON template's parser (Llama 3.2 deployments with vLLM's pythonic template detect `pythonic`)"),
    "llama32_meta_doc_pythonic_python_tag": ('<|python_tag|>[get_weather(city="San Francisco", metric="celsius")]', None, [], "as above"),
    "llama4_malformed_bad_sibling": (None, None, [("bad", {"x": "b'z'"}), ("get_weather", {"city": "LA", "metric": "C"})], "a value JSON cannot hold is its text"),
    "llama4_malformed_non_finite": (None, None, [("calc", {"x": "1e999"}), ("get_weather", {"city": "LA", "metric": "C"})], "a value JSON cannot hold is its text"),
    "llama4_malformed_brackets": (None, None, [("foo", {"x": 1})], "committed at `foo(`: the arguments read"),
    "llama4_meta_tool_utils_malformed_positional_args": (None, None, [("get_boiling_point", {})], "committed at the name: positional arguments have no keys"),
    "llama4_meta_tool_utils_malformed_unclosed": (None, None, [("get_boiling_point", 'RAW:{"liquid_name": "water"')], "committed: the arguments written before the answer ended"),
    "minimax_m2_vllm_untyped_params_stay_strings": (None, None, [("get_weather", {"city": "Seattle", "days": 5})], "without a schema a value that is JSON is taken as JSON"),
    "minimax_m3_malformed_stray_close": ("]<]minimax[>[<tool_call>\n]<]minimax[>[</user_id> after error", None, [], "no invoke: the model's text"),
    "mistral_vllm_malformed_junk_before_list": ('[TOOL_CALLS]  junk [{"name": "add", "arguments":{"a": 1, "b": 2}}] trail', None, [], "no call after [TOOL_CALLS]: the model's text"),
    "mistral_vllm_malformed_not_json": ("[TOOL_CALLS] not json at all", None, [], "the model's text, as written"),
    "mistral_vllm_malformed_two_bot_tokens_pre_v11": (None, None, [("add", {"a": 1}), ("sub", {"b": 2})], "lenient: each [TOOL_CALLS] opens calls"),
    "mistral_vllm_trailing_text": ("extra trailing data", None, [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})], "text after the calls is kept"),
    "poolside_malformed_whitespace_only_name": ("<tool_call>   </tool_call>", None, [], "no name: the model's text"),
    "poolside_name_with_internal_space": ("<tool_call>  get weather  <arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>", None, [], "a function name is one word"),
    "qwen3_hermes_malformed_invalid_json": (None, None, [("final_answer", {"trigger": True})], "committed: the arguments closed, the object did not"),
    "qwen3_hermes_bare_string_arguments": ('<tool_call>\n{"name": "do_thing", "arguments": "hello"}\n</tool_call>', None, [], "arguments that are no object: the model's text"),
    "qwen35_reasoning_implicit_end_by_tool_call": ("I need to read the file.", None, [("bash", {"command": "cat /etc/hosts"})], "no prompt tail given: the answer opened no reasoning (a tail of `<think>\\n` makes it reasoning, and then the call inside it is reasoning too, as llama.cpp's qwen35_fake_call_inside_reasoning wants)"),
    "qwen35_reasoning_with_think_implicit_end_by_tool_call": (None, "I need to read the file.\n\n<tool_call>\n<function=bash>\n<parameter=command>\ncat /etc/hosts\n</parameter>\n</function>\n</tool_call>", [], "a call inside unclosed reasoning is reasoning (llama.cpp's rule)"),
}


def _records() -> list[tuple[str, dict]]:
    return [(folder, record) for folder in sorted(PARSERS) for record in json.loads((DATA / folder / "outputs.json").read_text())]


def _parsers(folder: str, record: dict) -> tuple[str, str | None]:
    tool, reasoning = PARSERS[folder]
    for prefix, parser in PARSER_OF_ID.items():
        if record["id"].startswith(prefix):
            tool = parser
    return tool, reasoning


def _text(record: dict) -> str:
    text = record["text"]
    for token in END_TOKENS:
        text = text.removesuffix(token)
    return text


def _run(tool: str, reasoning: str | None, tail: str, tools, pieces: list[str], cut: bool = False):
    """(content, reasoning, [(name, arguments text, id)]) of `pieces`, checking the parts' contract:
    a call's first part has its index (in order), id and name; later ones only argument text."""
    parser = OutputParser.create(reasoning, tool, None, tail, tools)
    parts = [part for piece in pieces for part in parser.feed(piece)] + parser.finish(cut)
    calls: list[list] = []
    for part in parts:
        if part[0] == "tool":
            _, index, call_id, name, arguments = part
            if name is not None:
                assert index == len(calls) and call_id, part
                calls.append([name, arguments, call_id])
            else:
                assert call_id is None and index == len(calls) - 1, part
                calls[index][1] += arguments
        else:
            assert part[0] in ("text", "reasoning") and part[1], part
    assert parser.tool_calls == len(calls)
    content = "".join(p[1] for p in parts if p[0] == "text")
    thinking = "".join(p[1] for p in parts if p[0] == "reasoning")
    return content, thinking, [tuple(c) for c in calls]


def _chunkings(text: str, seed: str) -> list[list[str]]:
    rng = random.Random(seed)
    out = [[text], list(text)]
    for _ in range(3):
        pieces, at = [], 0
        while at < len(text):
            size = rng.randint(1, 12)
            pieces.append(text[at:at + size])
            at += size
        out.append(pieces)
    return out


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return "RAW:" + text


@pytest.mark.parametrize("folder, record", _records(), ids=lambda v: v["id"] if isinstance(v, dict) else v)
def test_recorded_outputs_parse_alike_whole_and_streamed(folder, record):
    tool, reasoning = _parsers(folder, record)
    tail = PROMPT_TAIL.get(record["id"], (record.get("context") or {}).get("generation_prompt_tail", ""))
    text = _text(record)
    runs = [_run(tool, reasoning, tail, record["tools"], pieces) for pieces in _chunkings(text, record["id"])]
    results = {json.dumps([c, t, [call[:2] for call in calls]]) for c, t, calls in runs}
    assert len(results) == 1, results  # the same text, reasoning, calls and arguments, however it streamed
    content, thinking, calls = runs[0]
    got = ((content or "").strip() or None, (thinking or "").strip() or None, [(name, _arguments(args)) for name, args, _ in calls])
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


@pytest.mark.parametrize("folder, record", [(f, r) for f, r in _records() if r["expected"]["tool_calls"]], ids=lambda v: v["id"] if isinstance(v, dict) else v)
def test_an_answer_cut_anywhere_keeps_its_calls_with_the_arguments_generated_so_far(folder, record):
    """Cut at any point (max_tokens): the calls are those of the whole answer up to the cut, each with
    a prefix of its arguments (JSON or the start of it, as the anthropic SDK's partial parser reads
    it); the cut text is no call's half-written name."""
    tool, reasoning = _parsers(folder, record)
    tail = PROMPT_TAIL.get(record["id"], (record.get("context") or {}).get("generation_prompt_tail", ""))
    text = _text(record)
    _, _, whole = _run(tool, reasoning, tail, record["tools"], [text])
    step = max(1, len(text) // 40)
    for at in range(1, len(text), step):
        _, _, calls = _run(tool, reasoning, tail, record["tools"], [text[:at]], cut=True)
        if len(calls) == len(whole) + 1:  # cut after a name, before what made the whole answer no call
            assert calls[-1][1] == "", at
            calls = calls[:-1]
        assert len(calls) <= len(whole), at
        for (name, arguments, _), (whole_name, whole_arguments, _) in zip(calls, whole):
            assert name == whole_name and whole_arguments.startswith(arguments), (at, arguments, whole_arguments)
            if arguments and arguments.startswith("{"):
                from_json(arguments, allow_partial=True)  # what the anthropic SDK does with input_json_delta


# --------------------------------------------------------------------------------------- detection

# template file -> the family it must be detected as (every recorded template; folders whose
# templates teach another family's format are named here)
TEMPLATE_FAMILY = {
    "deepseek_r1": "deepseek_r1",
    "deepseek_v3": "deepseek_v3",
    "deepseek_v31": "deepseek_v31",
    "deepseek_v32": "deepseek_v32",
    "deepseek_v32/chat_template_vllm_v31_style.jinja": "deepseek_v31",  # vLLM's V3.2 template writes V3.1's calls
    "devstral": "devstral",
    "gemma4": "gemma4",
    "glm45": "glm45",
    "glm47": "glm47",
    "gpt_oss": "gpt_oss",
    "kimi_k2": "kimi_k2",
    "kimi_k3": "kimi_k3",
    "llama3_json": "llama3_json",
    "llama4": "llama4_pythonic",
    "llama4/chat_template_json.jinja": "llama4_json",
    "minimax_m2": "minimax_m2",
    "mistral": "mistral",
    "qwen3": "qwen3",
    "qwen3_coder": "qwen3_coder",
}


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


# ------------------------------------------------------------------------------- forced in own syntax


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_each_parser_declares_how_a_forced_call_is_written_and_its_calls_parse_back(name):
    """The seam for structural-tag guides: a `CallSyntax` (begin/end around the JSON arguments), or
    why the format cannot be written so. Calls written that way parse back as those calls."""
    forced = TOOL_PARSERS[name].forced
    assert isinstance(forced, (CallSyntax, str)) and forced != "not declared"
    if not isinstance(forced, CallSyntax):
        return
    calls = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]
    written = forced.section_begin + forced.separator.join(
        "".join((forced.around(n)[0], json.dumps(a), forced.around(n)[1])) for n, a in calls
    ) + forced.section_end
    reasoning = "gpt_oss" if name == "gpt_oss" else None
    if name == "gpt_oss":
        written = written.replace("<|start|>assistant", "", 1)  # the prompt opens the first message
    for pieces in _chunkings(written, name):
        _, _, got = _run(name, reasoning, "", None, pieces)
        assert [(n, json.loads(a)) for n, a, _ in got] == (calls if name != "gpt_oss" else calls), written


# ------------------------------------------------------------------------ rendered by the templates

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]},
    },
}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_abc123", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}
    ]},
    {"role": "tool", "tool_call_id": "call_abc123", "name": "get_weather", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "And in Rome?"},
]
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
    _, _, calls = _run(tool, "gpt_oss" if tool == "gpt_oss" else None, "", [WEATHER_TOOL], [section])
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


@pytest.mark.parametrize("family", ["hermes", "qwen3_coder", "gemma4", "minimax_m3", "pythonic"])
def test_a_feed_costs_what_it_adds_not_the_whole_call(family):
    """The parsers run per token in the stream workers: a call four times longer (fed a few characters
    at a time, as tokens come) takes about four times as long, not sixteen."""
    import time

    def seconds(size: int) -> float:
        answer = _long_answer(family, size)
        best = float("inf")
        for _ in range(3):
            parser = OutputParser.create(None, family, None, "", LONG_TOOLS)
            start = time.perf_counter()
            for at in range(0, len(answer), 4):
                parser.feed(answer[at:at + 4])
            parser.finish()
            best = min(best, time.perf_counter() - start)
        return best

    assert seconds(24_000) / seconds(6_000) < 9
