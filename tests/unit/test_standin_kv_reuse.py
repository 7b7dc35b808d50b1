"""Prefix reuse in the engine stand-in: the model engine computes only the uncached prompt tokens and
answers as without reuse; the synthetic engine charges its prefill per uncached token."""

from __future__ import annotations

import time

import pytest
from standin_testing import Collected
from trtllm_truss.engine_standin import EngineLimits, GenerationRequest, StandinEngine, SyntheticEngine, build_kv_pool
from trtllm_truss.engine_standin.kv_blocks import BlockPool
from trtllm_truss.engine_standin.kv_events import KVEventBuffer
from trtllm_truss.engine_standin.settings import StandinSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # standin_testing.py

LIMITS = EngineLimits(max_batch_size=4, max_input_len=512, max_output_len=64)
TEXT = (
    "You are a careful assistant. Answer in one short sentence and cite the document you used. "
    "Documents: the river flows north through the valley; the bridge was built in the old town; "
    "the market opens at dawn and closes at noon. Question: "
)


def run(engine, request: GenerationRequest) -> Collected:
    collected = Collected()
    engine.submit(request, collected)
    collected.finish()
    return collected


def pool(reuse: bool = True, events: KVEventBuffer | None = None, blocks: int = 64) -> BlockPool:
    return BlockPool(16, blocks, reuse=reuse, events=events)


@pytest.fixture
def prompts(tokenizer):
    first = tokenizer.encode(TEXT + "when does the market open?").ids
    second = tokenizer.encode(TEXT + "who built the bridge in the old town, and in which year, by the records of the town?").ids
    assert len(first) > 48 and first[:48] == second[:48] and len(second) >= len(first) + 16
    return first, second


def test_greedy_answers_with_reuse_equal_those_without(runner, prompts):
    plain = StandinEngine(runner, LIMITS, kv_pool=pool(reuse=False)).start()
    reusing = StandinEngine(runner, LIMITS, kv_pool=pool()).start()
    try:
        for i, ids in enumerate([*prompts, prompts[0]]):
            expected = run(plain, GenerationRequest(f"p{i}", list(ids), 24)).tokens
            request = GenerationRequest(f"r{i}", list(ids), 24)
            assert run(reusing, request).tokens == expected
            if i == 0:
                assert request.kv_reused_blocks == 0
            else:  # the shared prefix (the whole prompt but its last token, the third time) came from the cache
                assert request.kv_reused_blocks * 16 >= 48
            assert request.kv_total_blocks == -(-len(ids) // 16)
    finally:
        plain.shutdown()
        reusing.shutdown()


def test_reuse_off_reuses_nothing_and_an_adapter_does_not_reuse_the_base_models_blocks(runner, prompts):
    plain = StandinEngine(runner, LIMITS, kv_pool=pool(reuse=False)).start()
    try:
        run(plain, GenerationRequest("a", list(prompts[0]), 2))
        again = GenerationRequest("b", list(prompts[0]), 2)
        run(plain, again)
        assert again.kv_reused_blocks == 0 and again.kv_total_blocks == -(-len(prompts[0]) // 16)
    finally:
        plain.shutdown()
    shared = pool()
    base = SyntheticEngine(LIMITS, 4096, [300, 301], kv_pool=shared, adapters={7: "pirate"}).start()
    try:
        run(base, GenerationRequest("c", list(prompts[0]), 2))
        adapted = GenerationRequest("d", list(prompts[0]), 2, lora_task_id=7)
        run(base, adapted)
        assert adapted.kv_reused_blocks == 0
    finally:
        base.shutdown()


def test_events_of_a_request_name_its_blocks_with_their_tokens(runner, prompts):
    events = KVEventBuffer(100, window_size=LIMITS.max_input_len + LIMITS.max_output_len)
    engine = StandinEngine(runner, LIMITS, kv_pool=pool(events=events)).start()
    try:
        assert engine.kv_events is events
        run(engine, GenerationRequest("a", list(prompts[0]), 2))
        drained = engine.kv_events.drain(5.0)
        assert [e["data"]["type"] for e in drained] == ["created", "stored"]
        blocks = drained[1]["data"]["blocks"]
        assert len(blocks) == len(prompts[0]) // 16
        assert [t["token_id"] for b in blocks for t in b["tokens"]] == prompts[0][: len(blocks) * 16]
        run(engine, GenerationRequest("b", list(prompts[1]), 2))
        (stored,) = engine.kv_events.drain(5.0)
        shared = next(i for i, (a, b) in enumerate(zip(*prompts)) if a != b) // 16  # full blocks in common
        assert stored["data"]["parent_hash"] == blocks[shared - 1]["block_hash"]
        assert stored["data"]["blocks"][0]["tokens"][0]["token_id"] == prompts[1][shared * 16]
    finally:
        engine.shutdown()


def test_synthetic_prefill_costs_time_per_uncached_token_only(prompts, monkeypatch):
    from trtllm_truss.engine_standin import synthetic

    slept: list[float] = []

    class Clock:  # the engine's sleeps, recorded (and taken, so pacing stays real)
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            slept.append(seconds)
            time.sleep(seconds)

    monkeypatch.setattr(synthetic, "time", Clock)
    engine = SyntheticEngine(LIMITS, 4096, [300, 301], prefill_time_per_token_ms=2.0, kv_pool=pool()).start()
    try:
        ids = list(prompts[0])
        run(engine, GenerationRequest("a", ids, 1))
        warm = GenerationRequest("b", ids, 1)
        run(engine, warm)
        uncached = len(ids) - warm.kv_reused_blocks * 16
        assert 1 <= uncached < 16
        assert slept == pytest.approx([len(ids) * 0.002, uncached * 0.002])
    finally:
        engine.shutdown()


def test_settings_size_the_pool_from_the_kv_settings():
    settings = StandinSettings.from_parameters({
        "model_dir": "/m", "max_batch_size": "2", "max_input_len": "100", "max_output_len": "28",
        "tokens_per_block": "32", "enable_kv_cache_reuse": "true", "event_buffer_max_size": "10",
    })
    built = build_kv_pool(settings)
    assert (built.tokens_per_block, built.max_blocks, built.reuse) == (32, 2 * 128 // 32, True)
    assert built.events is not None and built.events.max_size == 10 and built.events.window_size == 128
    capped = StandinSettings.from_parameters({"model_dir": "/m", "max_tokens_in_paged_kv_cache": "256", "tokens_per_block": "64"})
    assert build_kv_pool(capped).max_blocks == 4 and not build_kv_pool(capped).reuse


def test_a_finished_answer_is_cached_for_the_next_turn_and_answers_stay_the_same(runner, prompts):
    plain = StandinEngine(runner, LIMITS, kv_pool=pool(reuse=False)).start()
    reusing = StandinEngine(runner, LIMITS, kv_pool=pool()).start()
    try:
        first = list(prompts[0])
        answer = run(reusing, GenerationRequest("a", first, 40)).tokens
        assert answer == run(plain, GenerationRequest("pa", first, 40)).tokens
        turn = first + answer + list(prompts[1][-6:])  # the next turn repeats the answer
        request = GenerationRequest("b", turn, 16)
        assert run(reusing, request).tokens == run(plain, GenerationRequest("pb", turn, 16)).tokens
        assert request.kv_reused_blocks * 16 > len(first)  # blocks of the answer came from the cache
    finally:
        plain.shutdown()
        reusing.shutdown()


def test_the_synthetic_engine_caches_its_answers_too(prompts):
    engine = SyntheticEngine(LIMITS, 4096, list(range(300, 340)), kv_pool=pool()).start()
    try:
        first = list(prompts[0])
        answer = run(engine, GenerationRequest("a", first, 40)).tokens
        request = GenerationRequest("b", first + answer + [5, 6, 7], 2)
        run(engine, request)
        assert request.kv_reused_blocks == (len(first) + len(answer) - 1) // 16
    finally:
        engine.shutdown()
