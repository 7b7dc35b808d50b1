"""The model families' recorded data (tests/data/tool_families) as the tests read it: which parsers
read each folder's outputs, where this server's documented rules answer otherwise than a record's
source (and why), which family each recorded template is, and a conversation to render."""

from __future__ import annotations

import json
import random
from pathlib import Path

from trtllm_truss.parsers import OutputParser

DATA = Path(__file__).resolve().parent / "data" / "tool_families"

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


def records() -> list[tuple[str, dict]]:
    return [(folder, record) for folder in sorted(PARSERS) for record in json.loads((DATA / folder / "outputs.json").read_text())]


def parsers_of(folder: str, record: dict) -> tuple[str, str | None]:
    tool, reasoning = PARSERS[folder]
    for prefix, parser in PARSER_OF_ID.items():
        if record["id"].startswith(prefix):
            tool = parser
    return tool, reasoning


def text_of(record: dict) -> str:
    text = record["text"]
    for token in END_TOKENS:
        text = text.removesuffix(token)
    return text


def run(tool: str, reasoning: str | None, tail: str, tools, pieces: list[str], cut: bool = False):
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


def chunkings(text: str, seed: str) -> list[list[str]]:
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


def arguments_of(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return "RAW:" + text


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
