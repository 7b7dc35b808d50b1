"""Each family end to end in a stream worker (streaming.generation.WorkerModel) on the embedded
model's tokenizer with the family's own chat template: the worker detects the family from the
template, renders a conversation with a call and its result through it, and parses a recorded
answer of the family (fed back token by token as the engine would stream it) into the same calls,
reasoning and text as the parser alone, with finish_reason `tool_calls`."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tool_families import CONVERSATION, DATA, OURS, PARSERS, TEMPLATE_FAMILY, WEATHER_TOOL, arguments_of, text_of
from trtllm_truss.engine.client import GenerationParams
from trtllm_truss.streaming.generation import WorkerModel, WorkerSettings
from trtllm_truss.streaming.protocol import GenerationSpec

EMBEDDED = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json", "config.json")


def _record(folder: str) -> dict | None:
    """The folder's first recorded answer with calls that this server reads as its source does."""
    for record in json.loads((DATA / folder / "outputs.json").read_text()):
        if record["expected"]["tool_calls"] and record["id"] not in OURS:
            return record
    return None


class _Engine:
    """Streams `ids` one token per response, as the engine does."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.prompt: list[int] = []

    async def generate_ids(self, input_ids, params, *, bad_words=None):
        self.prompt = list(input_ids)
        for token in self.ids:
            yield [token], None

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("folder", sorted(f for f in PARSERS if (DATA / f / "chat_template.jinja").is_file()))
def test_a_family_end_to_end_in_a_stream_worker(folder, tmp_path):
    record = _record(folder)
    if record is None:
        pytest.skip(f"{folder} has no recorded answer with calls read as its source reads it")
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer_dir.mkdir()
    for name in TOKENIZER_FILES:
        if (EMBEDDED / name).is_file():
            shutil.copy(EMBEDDED / name, tokenizer_dir / name)
    (tokenizer_dir / "chat_template.jinja").write_text((DATA / folder / "chat_template.jinja").read_text())
    model = WorkerModel(WorkerSettings(grpc_url="127.0.0.1:1", tokenizer_dir=str(tokenizer_dir), max_input_len=32768, max_output_len=4096))
    family = TEMPLATE_FAMILY[folder]
    from trtllm_truss.parsers import FAMILIES

    assert model.info().tool_call_parser == FAMILIES[family].tool_parser
    context = record.get("context") or {}
    kwargs = tuple(sorted((k, v) for k, v in context.items() if k in ("enable_thinking", "thinking")))
    text = text_of(record)
    ids = model.tokenizer.encode(text, add_special_tokens=False)
    engine = _Engine(ids)
    model.engine = engine
    from trtllm_truss.serving.core import _template_turn

    spec = GenerationSpec(
        GenerationParams("", max_tokens=len(ids) + 8),
        messages=tuple(_template_turn(m) for m in CONVERSATION),
        prompt_field="messages",
        tools=(WEATHER_TOOL,),
        chat_template_kwargs=kwargs,
        reasoning_parser=model.reasoning_parser,
        tool_parser=model.tool_call_parser,
    )
    parts: list = []
    end = asyncio.run(model.run(spec, lambda out, entries: parts.extend(out)))
    assert end.error is None, end.error
    prompt = model.tokenizer.decode(engine.prompt, skip_special_tokens=False)
    assert "sunny" in prompt and "And in Rome?" in prompt
    calls: list[list] = []
    for part in parts:
        if part[0] == "tool":
            if part[3] is not None:
                calls.append([part[3], ""])
            calls[part[1]][1] += part[4]
    expected = record["expected"]
    assert [(n, arguments_of(a)) for n, a in calls] == [(c["name"], c["arguments"]) for c in expected["tool_calls"]]
    content = "".join(p[1] for p in parts if p[0] == "text").strip() or None
    thinking = "".join(p[1] for p in parts if p[0] == "reasoning").strip() or None
    assert (content, thinking) == ((expected["content"] or "").strip() or None, (expected["reasoning"] or "").strip() or None)
    assert end.finish_reason == "tool_calls"
    _the_dialects_agree(parts, calls, thinking, end)


def _the_dialects_agree(parts: list, calls: list[list], thinking: str | None, end) -> None:
    """The worker's parts as the core's events (serving.generation) through Responses' and Messages'
    builders, streamed and not: the same calls and reasoning as the parser gave."""
    from trtllm_truss.api.messages_events import MessageEvents
    from trtllm_truss.api.responses import parse_responses_request
    from trtllm_truss.api.responses_events import ResponseEvents
    from trtllm_truss.serving.generation import _parsed_events
    from trtllm_truss.serving.request import Finish
    from trtllm_truss.serving.semantic_events import feed

    events = _parsed_events(parts, None) + [Finish(end.finish_reason, end.prompt_tokens, end.completion_tokens, None)]
    for emit in (True, False):
        responses = ResponseEvents(parse_responses_request({"model": "m", "input": "hi"}), emit=emit)
        messages = MessageEvents("m", emit=emit)
        for builder in (responses, messages):
            builder.start()
            for event in events:
                feed(builder, event)
        output = responses.response()["output"]
        assert [(o["name"], o["arguments"]) for o in output if o["type"] == "function_call"] == [tuple(c) for c in calls]
        reasoning = "".join(o["content"][0]["text"] for o in output if o["type"] == "reasoning").strip() or None
        assert reasoning == thinking
        content = messages.message()["content"]
        assert [(b["name"], b["input"]) for b in content if b["type"] == "tool_use"] == [(n, json.loads(a)) for n, a in calls]
        assert ("".join(b["thinking"] for b in content if b["type"] == "thinking").strip() or None) == thinking
        assert messages.message()["stop_reason"] == "tool_use" and responses.response()["status"] == "completed"
