"""Agent frameworks against this repository served by truss's own model server (truss 0.18.35, no
docker) on the embedded default, each to a valid typed result: pydantic-ai (an agent with one tool
and a typed output), instructor (JSON_SCHEMA and TOOLS modes) and langgraph's prebuilt ReAct agent.

The embedded model is tiny; the frameworks still complete because their typed outputs and forced tool
calls are guided decoding (the grammar admits only valid output). What each framework sends:
- pydantic-ai: the typed output as an output tool and `tool_choice: required` over it and the agent's
  tool, so every answer is a call (guided); a call to the output tool ends the run.
- instructor: JSON_SCHEMA is `response_format: json_schema`, TOOLS a named `tool_choice`: both guided.
- langgraph's ReAct loop binds its tools under `tool_choice: auto`: whether the model calls one is the
  model's choice (no grammar), so the test asserts what the server guarantees there (the loop ends,
  each AI message is text or calls of known tools); its `response_format` step is guided and gives
  the typed result.
Typed outputs forbid extra keys (pydantic `extra="forbid"`, JSON Schema `additionalProperties: false`)
where the framework does not: llguidance, the stand-in's grammar engine, otherwise admits any key.
One server for the module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field
from trtllm_truss.fronts.truss_server import TrussServer
from truss_serving import serve_truss

pytestmark = [pytest.mark.truss_server, pytest.mark.triton, pytest.mark.slow, pytest.mark.torch]

ASK = "What will the weather be in Paris?"
INSTRUCTIONS = "Answer questions about the weather using the weather tool."


class Forecast(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=12)
    sunny: bool


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=12)
    population: int = Field(ge=0, le=999)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[TrussServer]:
    yield from serve_truss(tmp_path_factory.mktemp("truss_server_agent_frameworks"), {})


def test_pydantic_ai_agent_with_a_tool_returns_its_typed_output(server: TrussServer):
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="not-checked", max_retries=0, timeout=120.0)
    model = OpenAIChatModel("embedded", provider=OpenAIProvider(openai_client=client))
    # One call per answer: with parallel calls the greedy embedded model keeps adding calls to the
    # guided array until max_tokens, and pydantic-ai refuses an answer whose last call the limit cut
    # (IncompleteToolCall, as with OpenAI's API, which returns that call: docs/api.md).
    settings = {"temperature": 0, "max_tokens": 64, "parallel_tool_calls": False}
    agent = Agent(model, output_type=Forecast, instructions=INSTRUCTIONS, model_settings=settings)
    cities: list[str] = []

    @agent.tool_plain
    def weather(city: str) -> str:
        """The weather forecast for a city."""
        cities.append(city)
        return f"Sunny in {city}."

    async def run():
        try:
            return await agent.run(ASK, usage_limits=UsageLimits(request_limit=4))
        finally:
            await client.close()

    result = asyncio.run(run())
    assert isinstance(result.output, Forecast)  # validated by pydantic-ai against the model
    responses = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
    # Every answer is calls (tool_choice required, guided): of the agent's tool or the output tool.
    assert all(p.tool_name in ("weather", "final_result") for r in responses for p in r.parts if isinstance(p, ToolCallPart))
    assert all(isinstance(p, ToolCallPart) for r in responses for p in r.parts), [r.parts for r in responses]
    assert len(cities) == len(responses) - 1  # each response but the last called the tool


@pytest.mark.parametrize("mode", ["JSON_SCHEMA", "TOOLS"])
def test_instructor_returns_the_response_model(server: TrussServer, mode: str):
    import instructor

    raw = openai.OpenAI(base_url=server.url + "/v1", api_key="not-checked", max_retries=0, timeout=120.0)
    client = instructor.from_openai(raw, mode=instructor.Mode[mode])
    city, completion = client.chat.completions.create_with_completion(
        model="embedded", response_model=City, max_retries=0, temperature=0, max_tokens=64,
        messages=[{"role": "user", "content": "Name a city by the sea."}],
    )
    assert isinstance(city, City)
    assert completion.choices[0].finish_reason == ("stop" if mode == "JSON_SCHEMA" else "tool_calls")


def test_langgraph_react_agent_ends_with_a_structured_response(server: TrussServer):
    import warnings

    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    with warnings.catch_warnings():  # langgraph 1.x points to langchain.agents; the prebuilt agent is still langgraph's
        warnings.simplefilter("ignore", DeprecationWarning)
        from langgraph.prebuilt import create_react_agent

    @tool
    def weather(city: str) -> str:
        """The weather forecast for a city."""
        return f"Sunny in {city}."

    llm = ChatOpenAI(
        model="embedded", base_url=server.url + "/v1", api_key="not-checked", temperature=0, max_tokens=64, max_retries=0, timeout=120
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(llm, [weather], response_format=Forecast, prompt=INSTRUCTIONS)
    state = agent.invoke({"messages": [("user", ASK)]}, {"recursion_limit": 8})
    assert isinstance(state["structured_response"], Forecast)
    answers = [m for m in state["messages"] if isinstance(m, AIMessage)]
    assert answers and all(call["name"] == "weather" for m in answers for call in m.tool_calls)
    assert not answers[-1].tool_calls  # the loop ended on an answer, then the typed result was asked for
