"""KV cache reuse through the LLM-API double as TensorRT-LLM 1.x's LLM API reports it: kv_cache_config applied,
request_perf_metrics.kv_cache_metrics per request, get_kv_cache_events(_async) in TensorRT-LLM's JSON shape
across the executor's process boundary (tests/data/trtllm_kv_reuse/kv_cache_events.json)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTRACT = json.loads((REPO / "tests" / "data" / "trtllm_kv_reuse" / "kv_cache_events.json").read_text())
NAMES = json.loads((REPO / "tests" / "data" / "trtllm_flags" / "1.2.1" / "llmapi_generate.json").read_text())


def test_the_names_the_double_takes_are_tensorrt_llms():
    from dataclasses import fields

    from trtllm_truss.engine_standin.llmapi_double import SamplingParams
    from trtllm_truss.engine_standin.llmapi_kv import kv_pool_parameters

    assert "return_perf_metrics" in NAMES["sampling_params_fields"]
    assert {f.name for f in fields(SamplingParams)} <= set(NAMES["sampling_params_fields"])
    read = {"enable_block_reuse", "tokens_per_block", "max_tokens", "event_buffer_max_size"}
    assert read <= set(NAMES["kv_cache_config_fields"])
    assert kv_pool_parameters({}) == {"enable_kv_cache_reuse": "true", "tokens_per_block": "32", "event_buffer_max_size": "0"}


@pytest.mark.torch  # the double's executor worker builds the stand-in's synthetic engine
def test_perf_metrics_and_events_of_a_repeated_prompt():
    from trtllm_truss.engine_standin.llmapi_double import LLM, SamplingParams

    llm = LLM(
        model=str(REPO / "data" / "embedded-llama"), max_batch_size=2, max_seq_len=512,
        kv_cache_config={"enable_block_reuse": True, "tokens_per_block": 16, "event_buffer_max_size": 100},
        double_synthetic_step_time_ms=0.0,
    )
    prompt = list(range(300, 340))  # 2 full blocks of 16 and 8 tokens
    try:
        async def run(perf: bool):
            params = SamplingParams(max_tokens=2, top_k=1, end_id=-1, return_perf_metrics=perf)
            return (await llm.generate_async(inputs=prompt, sampling_params=params).aresult()).outputs[0]

        first = asyncio.run(run(True))
        metrics = first.request_perf_metrics.kv_cache_metrics
        assert (metrics.num_total_allocated_blocks, metrics.num_reused_blocks, metrics.num_missed_blocks) == (3, 0, 3)
        second = asyncio.run(run(True))
        metrics = second.request_perf_metrics.kv_cache_metrics
        assert (metrics.num_reused_blocks, metrics.num_new_allocated_blocks) == (2, 1)
        assert metrics.kv_cache_hit_rate == pytest.approx(2 / 3)
        assert asyncio.run(run(False)).request_perf_metrics is None  # only when asked for

        events = llm.get_kv_cache_events(timeout=5)
        assert [e["data"]["type"] for e in events] == ["created", "stored"]
        assert [e["event_id"] for e in events] == [0, 1]
        for event in events:
            assert sorted(event) == sorted(CONTRACT["event"]["keys"])
            assert sorted(event["data"]) == sorted(CONTRACT["data_types"][event["data"]["type"]])
        stored = events[1]["data"]
        assert stored["parent_hash"] is None
        assert [[t["token_id"] for t in b["tokens"]] for b in stored["blocks"]] == [prompt[:16], prompt[16:32]]
        assert llm.get_kv_cache_events(timeout=0.05) == []  # drained

        async def drain_async():
            await run(False)  # a new prompt stores new blocks
            return [event async for event in llm.get_kv_cache_events_async(timeout=5)]

        prompt[:] = list(range(600, 640))
        assert [e["data"]["type"] for e in asyncio.run(drain_async())] == ["stored"]
    finally:
        llm.shutdown()


def test_an_instance_keeps_a_sequences_kv_block_counts_through_merged_updates():
    """The host sends a sequence's KV block counts once, as an eighth element of one update; merging the
    updates waiting for an instance keeps them, and updates without them stay seven long."""
    from trtllm_truss.triton_models.tensorrt_llm_llmapi.host_link import PendingUpdates

    pending = PendingUpdates(lambda update: False)
    pending.add([("k", 0, [5], None, None, None, None), ("k", 0, [6], None, None, None, None, (4, 3))])
    pending.add([("k", 0, [7], None, None, "stop", None)])
    assert pending.pop() == ("k", 0, [5, 6, 7], None, None, "stop", None, (4, 3))
    pending.add([("j", 0, [1], None, None, None, None)])
    assert pending.pop() == ("j", 0, [1], None, None, None, None)


def test_kv_block_counts_come_from_the_llm_apis_request_perf_metrics():
    from trtllm_truss.engine_standin.llmapi_double import CompletionOutput
    from trtllm_truss.engine_standin.llmapi_kv import request_perf_metrics
    from trtllm_truss.triton_models.tensorrt_llm_llmapi.llm_request import kv_block_counts

    assert kv_block_counts(CompletionOutput(0)) is None
    assert kv_block_counts(CompletionOutput(0, request_perf_metrics=request_perf_metrics(5, 4))) == (5, 4)
