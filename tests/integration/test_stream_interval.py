"""runtime.stream_interval on the stand-in running the embedded model (real tritonserver, real stream
workers): the engine answers a streamed request at its first step, every fourth step and its last, as
TensorRT-LLM's LLM API does, and the serving path turns those multi-token responses into the same text,
stop strings and usage as one response per token would."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import _plan, _serve
from engine_wire import Stream, engine_inputs
from tokenizers import Tokenizer
from trtllm_truss.engine.client import GenerationParams
from trtllm_truss.config.runtime import RuntimeConfig
from trtllm_truss.repository import render_repository
from trtllm_truss.streaming.environment import worker_environment
from trtllm_truss.streaming.generation import WorkerSettings
from trtllm_truss.streaming.pool import StreamPool
from trtllm_truss.streaming.protocol import GenerationSpec

pytestmark = [pytest.mark.triton, pytest.mark.torch, pytest.mark.timeout(300)]

INTERVAL = 4
TOKENS = 13  # answered at steps 1, 4, 8, 12 and 13
PROMPT_IDS = [1, 300, 301, 302, 303]


@pytest.fixture(scope="module")
def interval_triton(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    runtime = RuntimeConfig(
        preprocessing_instance_count=1,
        postprocessing_instance_count=1,
        stream_interval=INTERVAL,
        pytorch={"device": "cpu", "num_threads": 1},
    )
    repository = render_repository(_plan(runtime, max_batch_size=4), tmp_path_factory.mktemp("interval") / "model_repository")
    yield from _serve(repository)


def engine_chunks(server, *, streaming: bool) -> list[list[int]]:
    stream = Stream(server.grpc_url)
    try:
        stream.send("r", engine_inputs(PROMPT_IDS, TOKENS, streaming=streaming))
        return stream.collect({"r"}, timeout_s=120)["r"]
    finally:
        stream.close()


def test_the_engine_answers_at_the_first_step_every_interval_and_the_last(interval_triton) -> None:
    streamed = engine_chunks(interval_triton, streaming=True)
    assert [len(chunk) for chunk in streamed] == [1, 3, 4, 4, 1], streamed
    (whole,) = engine_chunks(interval_triton, streaming=False)
    # Non-streamed responses are untouched (the prompt comes first unless excluded; greedy: same tokens).
    assert whole[-TOKENS:] == [token for chunk in streamed for token in chunk]


def test_the_serving_path_reads_multi_token_responses_as_text_stops_and_usage(interval_triton, embedded_model_dir) -> None:
    settings = WorkerSettings(
        grpc_url=interval_triton.grpc_url, tokenizer_dir=str(embedded_model_dir), max_input_len=512, max_output_len=64
    )
    pool = StreamPool(settings, workers=1, max_in_flight=4, environment=worker_environment(os.environ))
    pool.start()
    tokenizer = Tokenizer.from_file(str(embedded_model_dir / "tokenizer.json"))

    async def complete(stop: tuple[str, ...] = ()) -> tuple[list[str], object]:
        params = GenerationParams("", max_tokens=TOKENS, top_k=1, stop_words=stop)
        stream = await pool.submit(GenerationSpec(params, prompt_ids=tuple(PROMPT_IDS)))
        parts = []
        while (text := await stream.next_text()) is not None:
            parts.append(text)
        stream.close()
        return parts, stream.end

    async def both():
        # One event loop for both requests: the pool's sockets belong to the loop of its first request.
        parts, end = await complete()
        chunks = engine_chunks(interval_triton, streaming=True)
        expected = tokenizer.decode([token for chunk in chunks for token in chunk])
        assert "".join(parts) == expected
        assert len(parts) <= 5  # no more pieces than the engine's responses
        assert (end.completion_tokens, end.finish_reason, end.error) == (TOKENS, "length", None)
        # A stop string that starts after the engine's first two responses (so inside a later, multi-token
        # one; not after the pieces read, which a busy worker may merge): the text stops right before it.
        first_two = len(tokenizer.decode([token for chunk in chunks[:2] for token in chunk]))
        words = expected.split()
        stop = next(w for w in words[2:] if len(w) > 2 and expected.index(w) > first_two)
        stopped, end = await complete((stop,))
        assert "".join(stopped) == expected[: expected.index(stop)]
        assert (end.finish_reason, end.stop_sequence) == ("stop", stop)

    try:
        asyncio.run(both())
    finally:
        pool.stop()
