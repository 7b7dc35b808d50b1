"""The count routes (direct front): `POST /v1/messages/count_tokens` through the official `anthropic`
SDK (`client.messages.count_tokens`) equals `usage.input_tokens` of the same Messages request for 50
varied bodies, and `POST /v1/responses/input_tokens` through the official `openai` SDK
(`client.responses.input_tokens.count`) equals the same response's `usage.input_tokens`; bad bodies
are refused in each API's error shape, naming the field.

The bodies are built from the Berkeley Function Calling Leaderboard's entries (tests/bfcl_corpus.py:
real users' questions and functions, and BFCL's ground-truth calls): tools with real schemas, system
prompts as a string or as text blocks, the question as a string or blocks, the ground-truth calls as
the assistant's `tool_use` blocks answered by `tool_result` blocks, several turns, and every
`tool_choice`. A count never reaches the engine (tritonserver's own request count of the engine model
stays put). truss's server has a fixed route table (docs/api.md), so only the direct front serves the
count routes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anthropic
import bfcl_corpus
import httpx
import openai
import psutil
import pytest
from trtllm_truss.fronts.truss_server import TrussServer
from truss_serving import serve_front

pytestmark = [pytest.mark.truss_server, pytest.mark.triton, pytest.mark.slow, pytest.mark.torch,
              pytest.mark.skipif(not bfcl_corpus.available(), reason="bfcl-eval (requirements/corpus.txt) is not installed")]

BODIES = 50
CATEGORIES = ("parallel_multiple", "live_multiple", "live_parallel_multiple", "multi_turn_base", "multiple")
MAX_FUNCTIONS = 3  # tools rendered into the prompt: the bodies stay within the embedded model's max_input_len
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[TrussServer]:
    # No engine probe: its one-token requests would move the engine's request count a count must not move.
    yield from serve_front("direct", tmp_path_factory.mktemp("count_tokens"), {"TRTLLM_RUNTIME__HEALTH__ENABLED": "false"})


def _entries() -> list[tuple[dict, list]]:
    """(entry, ground-truth calls) of BFCL's entries with at most MAX_FUNCTIONS functions, round robin
    over CATEGORIES, in file order."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    data = bfcl_corpus._data_dir()
    per_category = []
    for category in CATEGORIES:
        answers = {}
        answer_path = data / "possible_answer" / f"BFCL_v4_{category}.json"
        for line in answer_path.read_text().splitlines():
            answer = json.loads(line)
            answers[answer["id"]] = answer["ground_truth"]
        picked = []
        for line in (data / f"BFCL_v4_{category}.json").read_text().splitlines():
            entry = json.loads(line)
            functions = entry.get("function") or []
            if entry["id"] in answers and 0 < len(functions) <= MAX_FUNCTIONS:
                for function in functions:
                    schema = function["parameters"] = copy.deepcopy(function["parameters"])
                    schema["type"] = "object"
                    schema["properties"] = bfcl_corpus._openapi_types(schema.get("properties", {}), GORILLA_TO_OPENAPI)
                picked.append((entry, answers[entry["id"]]))
            if len(picked) == BODIES:
                break
        per_category.append(picked)
    mixed = [group[i] for i in range(BODIES) for group in per_category if i < len(group)]
    return mixed[:BODIES]


def _name(name: str) -> str:
    return name.replace(".", "_")  # BFCL's own handlers send dotted names with underscores


def _calls(truth: list) -> list[tuple[str, dict]]:
    """BFCL's ground truth (each parameter's acceptable values) as calls with the first value, optional
    parameters BFCL marks with "" left out; none for multi-turn entries (their answers are Python text)."""
    if any(not isinstance(call, dict) for call in truth):
        return []
    calls = []
    for call in truth:
        for name, parameters in call.items():
            calls.append((_name(name), {key: values[0] for key, values in parameters.items() if values and values[0] != ""}))
    return calls


def _body(i: int, entry: dict, truth: list) -> dict:
    """One Messages body of entry i: its shape chosen by i (module docstring)."""
    tools = [{"name": _name(f["name"]), "description": f.get("description", ""), "input_schema": f["parameters"]}
             for f in entry["function"]]
    said = [message for turn in entry["question"] for message in turn]
    turns = [m["content"] for m in said if m.get("role") == "user"]
    systems = [m["content"] for m in said if m.get("role") == "system"]  # BFCL's live entries have real ones
    question = turns[0]
    messages: list[dict] = [{"role": "user", "content": question if i % 2 else [{"type": "text", "text": question}]}]
    calls = _calls(truth)
    if i % 4 in (2, 3) and calls:
        uses = [{"type": "tool_use", "id": f"toolu_{i}_{j}", "name": name, "input": arguments}
                for j, (name, arguments) in enumerate(calls)]
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "Let me look that up."}, *uses]})
        results = [{"type": "tool_result", "tool_use_id": use["id"],
                    "content": json.dumps({"status": "ok", "called": use["name"]}) if j % 2 == 0
                    else [{"type": "text", "text": f"{use['name']} returned 42"}]}
                   for j, use in enumerate(uses)]
        messages.append({"role": "user", "content": results})
        if i % 4 == 3:
            messages.append({"role": "assistant", "content": "Done: every call returned."})
            messages.append({"role": "user", "content": "Thanks. Anything else to check?"})
    for turn in turns[1:]:  # a multi-turn entry's later questions, each after an answer
        messages.append({"role": "assistant", "content": "Done."})
        messages.append({"role": "user", "content": turn})
    body: dict = {"model": "embedded", "messages": messages, "tools": tools}
    systems = systems or ["You are a careful assistant. Use the tools when they help.", "Answer briefly."]
    if i % 3 == 1:
        body["system"] = "\n".join(systems)
    elif i % 3 == 2:
        body["system"] = [{"type": "text", "text": text} for text in systems]
    choice = [None, {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": tools[0]["name"]}, {"type": "none"}][i % 5]
    if choice is not None:
        body["tool_choice"] = choice
    return body


def test_count_tokens_equals_the_messages_usage_for_50_varied_bodies(server: TrussServer):
    bodies = [_body(i, entry, truth) for i, (entry, truth) in enumerate(_entries())]
    assert len(bodies) == BODIES
    assert sum(any(isinstance(m["content"], list) and any(b["type"] == "tool_result" for b in m["content"])
                   for m in body["messages"]) for body in bodies) >= 15  # tool results in a good share
    claude = anthropic.Anthropic(base_url=server.url, api_key="not-checked", max_retries=0, timeout=120.0)

    def both(body: dict) -> tuple[int, int]:
        counted = claude.messages.count_tokens(**body).input_tokens
        used = claude.messages.create(**body, max_tokens=1, extra_body=GREEDY).usage.input_tokens
        return counted, used

    with ThreadPoolExecutor(4) as pool:
        pairs = list(pool.map(both, bodies))
    assert [i for i, (counted, used) in enumerate(pairs) if counted != used] == [], pairs
    assert len({used for _, used in pairs}) > BODIES // 2  # varied bodies, not one prompt again


def test_responses_input_tokens_equal_the_response_usage(server: TrussServer):
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="not-checked", max_retries=0, timeout=120.0)
    weather = {"type": "function", "name": "weather", "description": "The weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    bodies = [
        dict(input="Tell me about the sea"),
        dict(input="What is the weather in Oslo?", instructions="Be brief.", tools=[weather], tool_choice="auto"),
        dict(input=[
            {"role": "user", "content": "Weather in Rome?"},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{\"city\": \"Rome\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "{\"sky\": \"clear\"}"},
            {"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]},
        ], tools=[weather], tool_choice="required"),
    ]
    for body in bodies:
        counted = oai.responses.input_tokens.count(model="embedded", **body)
        used = oai.responses.create(model="embedded", max_output_tokens=1, store=False, **body, **GREEDY).usage.input_tokens
        assert (counted.object, counted.input_tokens) == ("response.input_tokens", used), body


def _engine_requests(server: TrussServer) -> float:
    """Requests the engine model (`tensorrt_llm`) has taken, by tritonserver's own metrics."""
    (triton,) = [p for p in psutil.Process(server.process.pid).children(recursive=True)
                 if "bin/tritonserver" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE]
    port = next(arg.split("=", 1)[1] for arg in triton.cmdline() if arg.startswith("--metrics-port="))
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30.0).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("nv_inference_request_success{", "nv_inference_request_failure{")) and 'model="tensorrt_llm"' in line)


def test_a_count_never_reaches_the_engine(server: TrussServer):
    claude = anthropic.Anthropic(base_url=server.url, api_key="not-checked", max_retries=0, timeout=120.0)
    body = {"model": "embedded", "messages": [{"role": "user", "content": "How many tokens is this?"}]}
    claude.messages.create(**body, max_tokens=1, extra_body=GREEDY)
    before = _engine_requests(server)
    assert before >= 1  # the engine's own count sees requests
    counts = {claude.messages.count_tokens(**body).input_tokens for _ in range(5)}
    assert len(counts) == 1 and _engine_requests(server) == before


def test_bad_count_bodies_are_refused_in_each_apis_shape_naming_the_field(server: TrussServer):
    with httpx.Client(base_url=server.url, timeout=60.0) as http:
        answer = http.post("/v1/messages/count_tokens", json={"model": "embedded"})
        assert answer.status_code == 422, answer.text  # a field the schema requires, as on /v1/messages
        error = answer.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert "messages" in error["error"]["message"]
        answer = http.post("/v1/messages/count_tokens", json={"messages": [{"role": "user", "content": "Hi"}],
                                                               "tools": [{"name": "bad name", "input_schema": {"type": "object"}}]})
        assert answer.status_code == 400 and "tools[0].name" in answer.json()["error"]["message"], answer.text
        answer = http.post("/v1/responses/input_tokens", json={"input": [{"role": "wizard", "content": "Hi"}]})
        assert answer.status_code == 422 and "input[0].role" in answer.json()["error"]["message"], answer.text
