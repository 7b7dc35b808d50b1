"""Forced tool calls are calls only, with parallel calls allowed (OpenAI's default): 40 sampled chats
at `max_tokens` 150 through each of chat completions (`tool_choice: "required"`), Messages
(`{"type": "any"}`) and Responses (`"required"`), on the embedded default under truss's server. At
least 38 of each 40 end with calls and no text: the guide in the family's own syntax lets the answer
end after any complete call and lets nothing but another call follow one (guides.tool_syntax,
`calls_only`). Before that, xgrammar's `triggered_tags` let the model write a call and then run on
in text up to its token limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anthropic
import openai
import pytest
from trtllm_truss.fronts.truss_server import TrussServer
from truss_serving import serve_front

pytestmark = [pytest.mark.truss_server, pytest.mark.triton, pytest.mark.slow, pytest.mark.torch]

CHATS = 40
AT_LEAST = 38
MAX_TOKENS = 150
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}
TOOLS = [
    ("get_weather", "The weather in a city", CITY),
    ("get_time", "The local time in a city", CITY),
    ("search", "Search the web", {"type": "object", "properties": {"query": {"type": "string", "maxLength": 40}}, "required": ["query"]}),
]
ASKS = [
    "Weather and time in Paris, Rome and Oslo?",
    "What is the weather like in Lisbon today?",
    "Find me the latest news about sailing, then tell me the time in Sydney.",
    "Is it raining in London? Also what time is it there?",
    "Look up who won the chess championship.",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[TrussServer]:
    yield from serve_front("truss", tmp_path_factory.mktemp("forced_calls_only"), {})


def _sampling(i: int) -> dict:
    return {"temperature": 1.0, "seed": i}


def _chat(oai: openai.OpenAI, i: int) -> tuple[int, str]:
    """(calls, text) of one `required` chat."""
    tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": p}} for n, d, p in TOOLS]
    choice = oai.chat.completions.create(
        model="embedded", messages=[{"role": "user", "content": ASKS[i % len(ASKS)]}], tools=tools,
        tool_choice="required", max_tokens=MAX_TOKENS, **_sampling(i),
    ).choices[0]
    return len(choice.message.tool_calls or []), choice.message.content or ""


def _messages(claude: anthropic.Anthropic, i: int) -> tuple[int, str]:
    """(calls, text) of one Messages request under `{"type": "any"}`."""
    tools = [{"name": n, "description": d, "input_schema": p} for n, d, p in TOOLS]
    message = claude.messages.create(
        model="embedded", max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": ASKS[i % len(ASKS)]}], tools=tools,
        tool_choice={"type": "any"}, extra_body=_sampling(i),
    )
    text = "".join(block.text for block in message.content if block.type == "text")
    return sum(block.type == "tool_use" for block in message.content), text


def _responses(oai: openai.OpenAI, i: int) -> tuple[int, str]:
    """(calls, text) of one `required` response."""
    tools = [{"type": "function", "name": n, "description": d, "parameters": p, "strict": False} for n, d, p in TOOLS]
    response = oai.responses.create(
        model="embedded", input=ASKS[i % len(ASKS)], tools=tools, tool_choice="required", max_output_tokens=MAX_TOKENS,
        store=False, temperature=1.0, extra_body={"seed": i},
    )
    return sum(item.type == "function_call" for item in response.output), response.output_text


@pytest.mark.parametrize("route", ["chat", "messages", "responses"])
def test_forced_answers_with_parallel_calls_allowed_are_calls_only(server: TrussServer, route: str):
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="not-checked", max_retries=0, timeout=300.0)
    claude = anthropic.Anthropic(base_url=server.url, api_key="not-checked", max_retries=0, timeout=300.0)
    one = {"chat": lambda i: _chat(oai, i), "messages": lambda i: _messages(claude, i), "responses": lambda i: _responses(oai, i)}[route]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(CHATS)))
    calls_only = [i for i, (calls, text) in enumerate(answers) if calls > 0 and not text]
    print(route, len(calls_only), "of", CHATS, "calls only;", sum(c > 0 for c, _ in answers), "with calls")
    assert len(calls_only) >= AT_LEAST, [answer for answer in answers if answer[0] == 0 or answer[1]]
