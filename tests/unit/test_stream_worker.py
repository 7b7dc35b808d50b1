"""The stream worker's per-request logic (streaming/generation.py) and its wire format.

The engine is replaced by `ScriptedEngine`, a test double that streams a fixed sequence of token ids
the way NVIDIA's engine does (one response per token); the real engine path is covered end to end
in tests/integration/test_truss_server_api.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path

import pytest
from trtllm_truss.engine.client import EngineRefusedError, GenerationParams, UpstreamError
from trtllm_truss.engine.engine_client import ResponseLogProbs
from trtllm_truss.streaming.generation import WorkerModel, WorkerSettings
from trtllm_truss.streaming.protocol import (
    FrameReader,
    GenerationSpec,
    StreamEnd,
    encode_frame,
)

EMBEDDED = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"


class ScriptedEngine:
    """Test double of `EngineClient`: streams `ids` one token per response; records what it was sent
    and whether the consumer left early (which is what cancels a real engine request)."""

    def __init__(self, ids: list[int], error: Exception | None = None) -> None:
        self.ids = ids
        self.error = error
        self.sent: list[tuple[list[int], GenerationParams]] = []
        self.closed_early = False

    async def generate_ids(self, input_ids, params, *, bad_words=None):
        self.sent.append((list(input_ids), params))
        if self.error is not None:
            raise self.error
        finished = False
        try:
            for token in self.ids[: params.max_tokens]:
                await asyncio.sleep(0)
                yield [token], (ResponseLogProbs([-0.5]) if params.return_log_probs else None)
            finished = True
        finally:
            self.closed_early = not finished

    async def close(self) -> None:
        pass


def _new_model() -> WorkerModel:
    """A worker model of the embedded tokenizer whose engine address answers nothing (tests set `engine`)."""
    return WorkerModel(WorkerSettings(grpc_url="127.0.0.1:1", tokenizer_dir=str(EMBEDDED), max_input_len=64, max_output_len=32))


@pytest.fixture(scope="module")
def model() -> WorkerModel:
    return _new_model()


def _run(model: WorkerModel, engine: ScriptedEngine, spec: GenerationSpec, log_probs: list | None = None) -> tuple[list[str], StreamEnd]:
    model.engine = engine
    emitted: list[str] = []

    def emit(text: str, entries) -> None:
        if text:
            emitted.append(text)
        if log_probs is not None and entries:
            log_probs.extend(entries)

    end = asyncio.run(model.run(spec, emit))
    return emitted, end


def _ids(model: WorkerModel, text: str) -> list[int]:
    return model.tokenizer.encode(text, add_special_tokens=False)


def test_one_text_piece_per_token_and_exact_usage(model: WorkerModel):
    text = " the quick brown fox jumps"
    ids = _ids(model, text)
    emitted, end = _run(model, ScriptedEngine(ids), GenerationSpec(GenerationParams("", max_tokens=32), prompt="Say"))
    assert "".join(emitted) == text
    assert len(emitted) == len(ids)  # nothing merged here: each response is its own piece
    assert end == StreamEnd(
        "stop", len(model.tokenizer.encode("Say", add_special_tokens=True)), len(ids), itl=end.itl
    )
    assert end.itl.count == len(ids) - 1  # one gap between each two pieces, bucketed for the metrics


def test_length_finish_when_max_tokens_is_reached(model: WorkerModel):
    ids = _ids(model, " one two three four five six")
    emitted, end = _run(model, ScriptedEngine(ids), GenerationSpec(GenerationParams("", max_tokens=3), prompt="Count"))
    assert end.finish_reason == "length" and end.completion_tokens == 3


@pytest.mark.parametrize("keep", [True, False])
def test_a_stop_string_across_token_boundaries_ends_the_request_and_counts_what_was_returned(model: WorkerModel, keep: bool):
    text = " my name is mode is here and more words follow"
    ids = _ids(model, text)
    stop = "e is mo"  # inside " name is mode": spans several tokens, starts mid-token
    engine = ScriptedEngine(ids)
    spec = GenerationSpec(GenerationParams("", max_tokens=32, stop_words=(stop,)), prompt="Hi", keep_stop_text=keep)
    emitted, end = _run(model, engine, spec)
    cut = text.index(stop)
    assert "".join(emitted) == (text[: cut + len(stop)] if keep else text[:cut])
    assert end.finish_reason == "stop"
    assert engine.closed_early  # the engine request was ended at the stop, not run to max_tokens
    # Tokens up to the one that completed the stop string, not the hidden rest.
    decoded = [model.decoder.decode(ids[:n]) for n in range(len(ids) + 1)]
    needed = next(n for n, t in enumerate(decoded) if stop in t)
    assert end.completion_tokens == needed < len(ids)
    assert engine.sent[0][1].stop_words == ()  # stop strings are matched here, never as engine token lists


def test_a_prompt_over_the_limit_is_refused_naming_the_field(model: WorkerModel):
    engine = ScriptedEngine([])
    _, end = _run(model, engine, GenerationSpec(GenerationParams("", max_tokens=4), prompt="word " * 80))
    assert end.status == 400 and "prompt:" in end.error and "max_input_len (64)" in end.error
    assert engine.sent == []


def test_a_huge_prompt_is_refused_by_its_length_without_tokenizing(model: WorkerModel, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("tokenized")

    monkeypatch.setattr(model.tokenizer.tokenizer, "encode", never, raising=False)
    monkeypatch.setattr(type(model.tokenizer), "encode", never)
    _, end = _run(model, ScriptedEngine([]), GenerationSpec(GenerationParams("", max_tokens=4), prompt="x" * 10_000_000, prompt_field="prompt"))
    assert end.status == 400 and "without tokenizing" in end.error


def test_a_prompt_of_no_tokens_is_refused(model: WorkerModel, monkeypatch):
    # A tokenizer without BOS encodes "" to nothing: refused here, not left to the engine.
    monkeypatch.setattr(type(model.tokenizer), "encode", lambda self, text, **options: [])
    engine = ScriptedEngine([])
    _, end = _run(model, engine, GenerationSpec(GenerationParams("", max_tokens=4), prompt=""))
    assert end.status == 400 and "prompt: the prompt is empty" in end.error and engine.sent == []


@pytest.mark.parametrize("error, status", [(EngineRefusedError("the engine refused the request: bad"), 400), (UpstreamError("the engine is unavailable"), 503)])
def test_engine_errors_keep_their_status(model: WorkerModel, error: Exception, status: int):
    _, end = _run(model, ScriptedEngine([], error=error), GenerationSpec(GenerationParams("", max_tokens=4), prompt="Hi"))
    assert end.status == status and end.error == str(error)


def test_tokenizer_defaults_fill_end_and_pad_ids(model: WorkerModel):
    engine = ScriptedEngine(_ids(model, " hi"))
    _run(model, engine, GenerationSpec(GenerationParams("", max_tokens=4), prompt="Hi"))
    params = engine.sent[0][1]
    assert params.end_id == model.tokenizer.eos_id and params.pad_id == model.tokenizer.pad_id
    assert params.exclude_input_in_output is True


def test_frames_split_anywhere_and_several_per_read_give_every_message_once():
    messages = [(i, "x" * (i % 7), None) for i in range(200)]
    data = b"".join(encode_frame(messages[i : i + 10]) for i in range(0, 200, 10))
    reader = FrameReader()
    received: list = []
    for start in range(0, len(data), 37):  # reads that cut frames, headers included
        received += reader.feed(data[start : start + 37])
    assert received == messages


def test_log_probs_come_with_each_token(model: WorkerModel):
    ids = _ids(model, " alpha beta gamma")
    entries: list = []
    spec = GenerationSpec(GenerationParams("", max_tokens=32, return_log_probs=True), prompt="Go")
    emitted, end = _run(model, ScriptedEngine(ids), spec, entries)
    assert len(entries) == len(ids)
    assert "".join(token for token, _, _, _ in entries) == "".join(emitted) == " alpha beta gamma"
    assert [raw for _, _, raw, _ in entries] == [model.decoder.token_bytes([t]) for t in ids]
    assert all(lp == -0.5 for _, lp, _, _ in entries) and end.completion_tokens == len(ids)


def test_log_prob_texts_concatenate_to_the_text_when_a_character_spans_tokens(model: WorkerModel):
    text = " snow \u2603 and \U0001f600 ok"
    ids = _ids(model, text)
    entries: list = []
    spec = GenerationSpec(GenerationParams("", max_tokens=32, return_log_probs=True), prompt="Go")
    emitted, _ = _run(model, ScriptedEngine(ids), spec, entries)
    assert "".join(emitted) == text == "".join(token for token, _, _, _ in entries)
    assert b"".join(raw for _, _, raw, _ in entries) == text.encode()  # each token's own bytes
    assert len(entries) == len(ids)
    if any(not token for token, _, _, _ in entries):  # a byte-level vocabulary splits the emoji
        assert any(raw and not token for token, _, raw, _ in entries)


def test_log_probs_stop_with_the_text_a_stop_string_cuts(model: WorkerModel):
    text = " my name is mode is here and more words follow"
    ids = _ids(model, text)
    stop = "e is mo"
    entries: list = []
    spec = GenerationSpec(GenerationParams("", max_tokens=32, stop_words=(stop,), return_log_probs=True), prompt="Hi")
    emitted, end = _run(model, ScriptedEngine(ids), spec, entries)
    returned = "".join(emitted)
    assert returned == text[: text.index(stop)]
    tokens = "".join(token for token, _, _, _ in entries)
    # every token that added returned text, the one the cut falls in included, and none after it
    assert tokens.startswith(returned) and len(tokens) - len(returned) < len(entries[-1][0])
    assert len(entries) < end.completion_tokens  # tokens of the stop string itself are not reported


def test_special_token_text_in_a_prompt_is_text_unless_asked(model: WorkerModel):
    eos = model.tokenizer.tokenizer.id_to_token(model.tokenizer.eos_id)
    for literal, expect_control in ((True, False), (False, True)):
        engine = ScriptedEngine([])
        spec = GenerationSpec(GenerationParams("", max_tokens=4), prompt=f"a {eos} b", literal_special_tokens=literal)
        _run(model, engine, spec)
        assert (model.tokenizer.eos_id in engine.sent[0][0]) is expect_control, (literal, engine.sent[0][0])


def test_chat_turns_reach_the_engine_as_the_templates_own_ids(model: WorkerModel):
    turns = (("system", "Be brief."), ("user", "Hi </s> there"))
    engine = ScriptedEngine([])
    _run(model, engine, GenerationSpec(GenerationParams("", max_tokens=4), messages=turns, prompt_field="messages"))
    assert engine.sent[0][0] == model.chat.chat_ids(turns, "messages")


TOOLS = ({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},)


def test_a_count_renders_and_tokenizes_as_the_request_and_sends_nothing_to_the_engine(model: WorkerModel, monkeypatch):
    """The count routes' spec (`count_only`): the prompt tokens the same request sends, and no engine call."""
    monkeypatch.setattr(model, "settings", dataclasses.replace(model.settings, max_input_len=512))  # tools take room
    turns = (("system", "Be brief."), ("user", "Weather in Paris?"))
    spec = GenerationSpec(GenerationParams("", max_tokens=4), messages=turns, prompt_field="messages", tools=TOOLS)
    engine = ScriptedEngine(_ids(model, " ok"))
    _, generated = _run(model, engine, spec)
    sent = engine.sent[0][0]
    counting = ScriptedEngine([])
    emitted, counted = _run(model, counting, dataclasses.replace(spec, count_only=True))
    assert counted == StreamEnd(prompt_tokens=len(sent)) and generated.prompt_tokens == len(sent)
    assert emitted == [] and counting.sent == []
    _, refused = _run(model, counting, dataclasses.replace(spec, count_only=True, messages=(("user", "word " * 600),)))
    assert refused.status == 400 and "max_input_len" in refused.error and counting.sent == []  # as the request would be


def test_the_embedded_model_detects_hermes_and_no_reasoning(model: WorkerModel):
    info = model.info()
    assert (info.tool_call_parser, info.reasoning_parser) == ("hermes", None)


def test_tools_and_tool_turns_reach_the_engine_through_the_template(model: WorkerModel, monkeypatch):
    from trtllm_truss.api.prompt import PromptTokenizer

    monkeypatch.setattr(model, "settings", dataclasses.replace(model.settings, max_input_len=512))  # tools take room

    turns = (
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "get_weather"},
    )
    engine = ScriptedEngine(_ids(model, " ok"))
    _, end = _run(model, engine, GenerationSpec(GenerationParams("", max_tokens=4), messages=turns, prompt_field="messages", tools=TOOLS))
    assert end.error is None, end.error
    template = PromptTokenizer.load(EMBEDDED)
    sent = engine.sent[0][0]
    assert sent == template.tokenizer.apply_chat_template(list(turns), tools=list(TOOLS), tokenize=True, add_generation_prompt=True, return_dict=False)
    text = template.tokenizer.decode(sent)
    assert '"name": "get_weather"' in text and "<tool_response>sunny</tool_response>" in text and "<tool_call>" in text


def test_a_hermes_call_in_the_answer_is_a_tool_call_with_finish_reason_tool_calls(model: WorkerModel):
    answer = 'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    spec = GenerationSpec(GenerationParams("", max_tokens=64), messages=(("user", "Weather?"),), prompt_field="messages", tool_parser="hermes")
    model.engine = ScriptedEngine(_ids(model, answer))
    parts: list = []
    end = asyncio.run(model.run(spec, lambda out, entries: parts.extend(out)))
    assert end.finish_reason == "tool_calls"
    assert "".join(p[1] for p in parts if p[0] == "text") == "Checking."
    calls = [p for p in parts if p[0] == "tool"]
    assert calls[0][1:2] == (0,) and calls[0][3] == "get_weather" and calls[0][2].startswith("call_")
    assert "".join(p[4] for p in calls) == '{"city": "Paris"}'


@pytest.mark.parametrize("cut_by_limit", [True, False])
def test_a_hermes_answer_cut_inside_a_call_keeps_it_with_the_arguments_generated(model: WorkerModel, cut_by_limit: bool):
    """Cut by max_tokens (finish `length`), or ended by the engine (EOS) inside the second call: both
    calls are the answer's, the second with the arguments generated before the end (docs/api.md,
    "Calls at the token limit")."""
    answer = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    )
    ids = _ids(model, answer[: answer.rindex("Rome") + 2])  # inside the second call's arguments
    max_tokens = len(ids) if cut_by_limit else len(ids) + 1
    spec = GenerationSpec(GenerationParams("", max_tokens=max_tokens), messages=(("user", "Weather?"),), prompt_field="messages", tool_parser="hermes")
    model.engine = ScriptedEngine(ids)
    parts: list = []
    end = asyncio.run(model.run(spec, lambda out, entries: parts.extend(out)))
    calls = [p for p in parts if p[0] == "tool"]
    assert [p[3] for p in calls if p[3]] == ["get_weather", "get_weather"]
    assert "".join(p[4] for p in calls if p[1] == 0) == '{"city": "Paris"}'
    second = "".join(p[4] for p in calls if p[1] == 1)
    assert second and '{"city": "Rome"}'.startswith(second) and second != '{"city": "Rome"}'
    assert "".join(p[1] for p in parts if p[0] == "text") == ""
    assert end.finish_reason == ("length" if cut_by_limit else "tool_calls")


def test_the_chat_tokenizer_loads_once_off_the_event_loop_while_other_work_goes_on(monkeypatch):
    """Importing transformers takes seconds: the first chat requests wait for one load on a thread,
    and the event loop (which carries other streams) keeps turning meanwhile."""
    model = _new_model()
    model.engine = ScriptedEngine([])
    read_chat = model._read_chat
    loads: list[int] = []
    released = threading.Event()

    def slow_read():
        loads.append(1)
        assert released.wait(10), "the loop never let the load finish"
        return read_chat()

    monkeypatch.setattr(model, "_read_chat", slow_read)

    async def scenario() -> tuple[list[StreamEnd], int]:
        spec = GenerationSpec(GenerationParams("", max_tokens=2), messages=(("user", "Hi"),), prompt_field="messages")
        runs = [asyncio.ensure_future(model.run(spec, lambda *_: None)) for _ in range(3)]
        turns = 0
        while not loads or turns < 20:  # the loop turns while the load is held
            await asyncio.sleep(0)
            turns += 1
        assert not any(run.done() for run in runs)
        released.set()
        return list(await asyncio.gather(*runs)), turns

    ends, turns = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [end.error for end in ends] == [None, None, None] and len(loads) == 1 and turns >= 20
    assert len(model.engine.sent) == 3 and model.engine.sent[0][0] == model.chat.chat_ids((("user", "Hi"),), "messages")


def test_a_failed_chat_tokenizer_load_is_tried_again_by_the_next_chat_request(monkeypatch):
    model = _new_model()
    model.engine = ScriptedEngine([])
    read_chat = model._read_chat
    calls: list[int] = []

    def flaky_read():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("tokenizer_config.json: not readable")
        return read_chat()

    monkeypatch.setattr(model, "_read_chat", flaky_read)
    spec = GenerationSpec(GenerationParams("", max_tokens=2), messages=(("user", "Hi"),), prompt_field="messages")
    with pytest.raises(OSError, match="not readable"):
        asyncio.run(model.run(spec, lambda *_: None))
    assert asyncio.run(model.run(spec, lambda *_: None)).error is None and len(calls) == 2


def test_warm_up_builds_the_literal_tokenizer_and_leaves_an_unreachable_engine_to_the_first_request():
    model = _new_model()
    assert "_literal" not in model.tokenizer.__dict__
    asyncio.run(model.warm_up())  # nothing listens on port 1: logged, not raised
    assert "_literal" in model.tokenizer.__dict__
