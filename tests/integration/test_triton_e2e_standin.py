"""The rendered repository as shipped for backend "pytorch" (stand-in engine + embedded model) on the
real tritonserver: stop/bad words wired through, seeded sampling, concurrency, cancellation."""

from __future__ import annotations

import queue
import re
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from engine_wire import raw_inputs, request_error
from ensemble_stream import ensemble_inputs, run_on_stream, stop_engine_request

pytestmark = [pytest.mark.triton, pytest.mark.timeout(300)]

PROMPTS = [
    "The module",
    "Return the",
    "This function is used to",
    "If the file",
    "A list of",
    "class",
    "The following example",
    "Note that",
]


def _greedy(server, prompt: str, max_tokens: int, **options) -> str:
    return run_on_stream(server.grpc_url, {"r": ensemble_inputs(prompt, max_tokens, stream=False, **options)})["r"].text


def test_streamed_equals_non_streamed_with_the_real_model(standin_triton) -> None:
    requests = {}
    for i, prompt in enumerate(PROMPTS):
        requests[f"s{i}"] = ensemble_inputs(prompt, 24, stream=True, top_k=1)
    streamed = run_on_stream(standin_triton.grpc_url, requests)
    for i, prompt in enumerate(PROMPTS):
        whole = _greedy(standin_triton, prompt, 24, top_k=1)
        assert whole, prompt
        assert streamed[f"s{i}"].text == whole, prompt


def _prompt_with_word(server, max_tokens: int) -> tuple[str, str, str]:
    """(prompt, greedy text, a " word" in that text after its first characters)."""
    for prompt in PROMPTS:
        full = _greedy(server, prompt, max_tokens)
        for match in re.finditer(r" [A-Za-z]{3,}", full):
            if match.start() >= 2:
                return prompt, full, match.group(0)
    pytest.fail(f"no greedy continuation of {PROMPTS} contains a word")


def test_stop_word_ends_generation_at_the_word(standin_triton) -> None:
    prompt, full, word = _prompt_with_word(standin_triton, 48)
    expected = full[: full.index(word) + len(word)]
    assert expected != full
    assert _greedy(standin_triton, prompt, 48, stop_words=[word]) == expected
    streamed = run_on_stream(
        standin_triton.grpc_url, {"s": ensemble_inputs(prompt, 48, stream=True, stop_words=[word])}
    )["s"]
    assert streamed.text == expected


def test_bad_words_never_appear(standin_triton) -> None:
    prompt, full, word = _prompt_with_word(standin_triton, 32)
    constrained = _greedy(standin_triton, prompt, 32, bad_words=[word])
    assert word not in constrained
    assert constrained != full


def test_seeded_sampling_is_reproducible(standin_triton) -> None:
    options = {"temperature": 1.0, "top_k": 50, "top_p": 0.95}
    requests = {
        "a": ensemble_inputs("The module", 24, stream=True, random_seed=1234, **options),
        "b": ensemble_inputs("The module", 24, stream=False, random_seed=1234, **options),
    }
    for seed in (1, 2, 3):
        requests[f"other{seed}"] = ensemble_inputs("The module", 24, stream=False, random_seed=seed, **options)
    results = run_on_stream(standin_triton.grpc_url, requests)
    again = run_on_stream(standin_triton.grpc_url, {"a": requests["a"]})["a"]
    assert results["a"].text == results["b"].text == again.text
    assert any(results[f"other{seed}"].text != results["a"].text for seed in (1, 2, 3))


def test_unseeded_sampling_differs_between_requests(standin_triton) -> None:
    """No random_seed: each request draws a fresh seed (it used to be 0 for all: identical texts)."""
    options = {"temperature": 1.0, "top_k": 50, "top_p": 0.95}
    requests = {f"u{i}": ensemble_inputs("The module", 16, stream=False, **options) for i in range(6)}
    texts = {result.text for result in run_on_stream(standin_triton.grpc_url, requests).values()}
    assert len(texts) > 1, texts


def test_32_concurrent_streams_complete_and_overlap(standin_triton) -> None:
    requests = {f"c{i}": ensemble_inputs(PROMPTS[i % len(PROMPTS)], 24, stream=True, top_k=1) for i in range(32)}
    results = run_on_stream(standin_triton.grpc_url, requests, timeout_s=240)
    reference = {p: _greedy(standin_triton, p, 24, top_k=1) for p in PROMPTS}
    for i in range(32):
        result = results[f"c{i}"]
        assert result.done and len(result.chunks) > 1
        assert result.text == reference[PROMPTS[i % len(PROMPTS)]]
    # Continuous batching: at the moment the last stream produced its first text, most others were
    # still running (a serial engine would have finished them all before starting it).
    intervals = [(r.first_at, r.last_at) for r in results.values()]
    latest_start = max(start for start, _ in intervals)
    active_then = sum(1 for start, end in intervals if start <= latest_start <= end)
    assert active_then >= 16, intervals


@pytest.mark.parametrize("layout", ["synthetic_two_slot_triton", "synthetic_two_slot_relay_triton"])
def test_cancelled_stream_frees_its_slot(layout: str, request: pytest.FixtureRequest) -> None:
    """Cancelling the gRPC stream alone does not reach the in-flight engine step (Triton only
    cancels ensemble steps scheduled later), so the stream is cancelled and `stop` is sent to
    `tensorrt_llm` with the same request id, as NVIDIA's clients do."""
    server = request.getfixturevalue(layout)
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        for i in range(2):  # 256 tokens x 50 ms: ~13 s each, occupying both slots
            client.async_stream_infer("ensemble", ensemble_inputs("x", 256, stream=True), request_id=f"long{i}")
        started: set[str] = set()
        deadline = time.monotonic() + 30
        while len(started) < 2:
            result, error = events.get(timeout=max(0.1, deadline - time.monotonic()))
            assert error is None, error
            started.add(result.get_response().id)
    finally:
        client.stop_stream(cancel_requests=True)  # the client goes away mid-stream
        client.close()
    for i in range(2):
        stop_engine_request(server.grpc_url, f"long{i}")
    begin = time.monotonic()
    result = run_on_stream(server.grpc_url, {"after": ensemble_inputs("x", 4, stream=True)}, timeout_s=60)["after"]
    elapsed = time.monotonic() - begin
    assert result.done
    assert elapsed < 6.0, f"new request waited {elapsed:.1f} s: cancelled streams kept their slots"



def test_engine_client_reads_the_draft_totals_the_stand_in_reports(standin_triton) -> None:
    """NVIDIA's perf outputs total_draft_tokens / total_accepted_draft_tokens travel to the worker's
    metrics (the stand-in drafts nothing: 0 and 0); the generation itself is unchanged."""
    import asyncio

    from trtllm_truss.engine.client import GenerationParams
    from trtllm_truss.engine.engine_client import EngineClient

    totals: list[tuple[int, int]] = []

    async def run() -> list[int]:
        client = EngineClient(standin_triton.grpc_url)
        try:
            ids: list[int] = []
            params = GenerationParams(text_input="", max_tokens=4, temperature=0.0, top_k=1)
            async for new, _ in client.generate_ids([1, 450, 3883], params, on_draft_stats=lambda *t: totals.append(t)):
                ids += new
            return ids
        finally:
            await client.close()

    ids = asyncio.run(run())
    assert len(ids) == 4 and totals and set(totals) == {(0, 0)}


def test_stand_in_refuses_a_draft_input_by_name(standin_triton) -> None:
    inputs = raw_inputs({
        "input_ids": np.array([[1, 450]], dtype=np.int32),
        "input_lengths": np.array([[2]], dtype=np.int32),
        "request_output_len": np.array([[4]], dtype=np.int32),
        "draft_input_ids": np.array([[450, 3883]], dtype=np.int32),
    })
    error = request_error(standin_triton.grpc_url, inputs, request_id="draft-1", timeout_s=60)
    assert error is not None and "draft_input_ids" in str(error) and "cannot honour" in str(error)
