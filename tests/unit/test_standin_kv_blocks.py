"""The stand-in's paged KV block pool (engine_standin/kv_blocks.py) and its events (kv_events.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from trtllm_truss.engine_standin.kv_blocks import BlockPool, block_key
from trtllm_truss.engine_standin.kv_events import KVEventBuffer

CONTRACT = json.loads((Path(__file__).parents[1] / "data" / "trtllm_kv_reuse" / "kv_cache_events.json").read_text())


def _run(pool: BlockPool, ids: list[int], lora: int | None = None, keep: bool = False):
    lease = pool.acquire(ids, lora)
    pool.store(lease, ids, payload=lambda i: ("kv", i))
    if not keep:
        pool.release(lease)
    return lease


def test_a_repeated_prompt_reuses_its_full_blocks_but_never_its_last_token():
    pool = BlockPool(4, 100)
    prompt = list(range(10))  # 2 full blocks + 2 tokens
    first = _run(pool, prompt)
    assert (first.reused_blocks, first.total_blocks, first.new_blocks) == (0, 3, 3)
    second = _run(pool, prompt)
    assert (second.reused_blocks, second.reused_tokens) == (2, 8)
    assert pool.reused_blocks_total == 2 and pool.missed_blocks_total == 4
    # A prompt of exactly two blocks: its last token is computed, so only the first block is reused.
    exact = list(range(8))
    assert _run(pool, exact).reused_blocks == 1


def test_the_key_chains_the_parent_so_the_same_block_after_another_prefix_misses():
    pool = BlockPool(4, 100)
    _run(pool, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert _run(pool, [0, 2, 3, 4, 5, 6, 7, 8, 9]).reused_blocks == 0  # the first block differs
    assert _run(pool, [1, 2, 3, 4, 0, 6, 7, 8, 9]).reused_blocks == 1  # the second differs
    assert block_key(None, [5, 6, 7, 8], None) != block_key(block_key(None, [1, 2, 3, 4], None), [5, 6, 7, 8], None)


def test_lora_adapters_do_not_share_blocks():
    pool = BlockPool(4, 100)
    prompt = list(range(9))
    _run(pool, prompt, lora=1)
    assert _run(pool, prompt, lora=2).reused_blocks == 0
    assert _run(pool, prompt, lora=None).reused_blocks == 0
    assert _run(pool, prompt, lora=1).reused_blocks == 2


def test_reuse_off_matches_nothing_and_keeps_nothing():
    pool = BlockPool(4, 100, reuse=False)
    prompt = list(range(9))
    _run(pool, prompt)
    again = _run(pool, prompt)
    assert (again.reused_blocks, again.total_blocks) == (0, 3)
    assert pool.cached_blocks == 0


def test_least_recently_used_free_blocks_are_evicted_leaves_first():
    events = KVEventBuffer(100, window_size=64)
    pool = BlockPool(2, 4, events=events)
    a = _run(pool, [1, 1, 2, 2, 9])  # blocks a1 <- a2
    b = _run(pool, [3, 3, 4, 4, 9])  # blocks b1 <- b2: the pool is full
    assert pool.cached_blocks == 4
    events.drain()
    _run(pool, [5, 5, 9])  # needs one block: a's leaf goes first (a is the least recent)
    removed = [e["data"]["block_hashes"] for e in events.drain() if e["data"]["type"] == "removed"]
    assert removed == [[block_key(block_key(None, [1, 1], None), [2, 2], None)]]
    assert a.total_blocks == b.total_blocks == 3
    assert _run(pool, [3, 3, 4, 4, 9]).reused_blocks == 2  # b untouched
    assert _run(pool, [1, 1, 2, 2, 9]).reused_blocks == 1  # a's root is still there


def test_held_blocks_are_never_evicted_and_an_exhausted_pool_caches_no_more():
    pool = BlockPool(2, 2)
    held = _run(pool, [1, 1, 2, 2, 9], keep=True)  # holds both blocks
    other = _run(pool, [3, 3, 4, 4, 9])
    assert other.reused_blocks == 0 and pool.store_misses == 2
    assert _run(pool, [1, 1, 2, 2, 9]).reused_blocks == 2  # the held request's blocks are intact
    pool.release(held)
    assert pool.free_blocks == 2


def test_a_reused_chain_loses_its_leaf_before_its_root():
    pool = BlockPool(2, 3)
    _run(pool, [1, 1, 2, 2, 9])
    _run(pool, [1, 1, 2, 2, 9])  # a1, a2 both free again, a1 more recent than a2
    assert pool.cached_blocks == 2
    _run(pool, [7, 7, 8, 8, 9])  # needs 2: one free slot, then evicts a2 (the leaf)
    assert pool.cached_blocks == 3
    assert _run(pool, [1, 1, 2, 2, 9]).reused_blocks == 1


def test_events_have_tensorrt_llms_shape():
    events = KVEventBuffer(100, window_size=2048)
    pool = BlockPool(2, 2, events=events)
    _run(pool, [1, 2, 3, 4, 5])
    _run(pool, [6, 7, 8])
    created, stored, removed, stored_again = events.drain()
    for event in (created, stored, removed, stored_again):
        assert sorted(event) == sorted(CONTRACT["event"]["keys"])
        assert sorted(event["data"]) == sorted(CONTRACT["data_types"][event["data"]["type"]])
    assert [e["event_id"] for e in (created, stored, removed, stored_again)] == [0, 1, 2, 3]
    assert created["data"]["num_blocks_per_cache_level"] == [2, 0]
    assert stored["data"]["parent_hash"] is None
    first, second = stored["data"]["blocks"]
    assert sorted(first) == sorted(CONTRACT["stored_block"]["keys"]) and first["type"] == "stored_block"
    assert sorted(first["tokens"][0]) == sorted(CONTRACT["unique_token"]["keys"])
    assert [t["token_id"] for t in first["tokens"]] == [1, 2] and first["priority"] == CONTRACT["defaults"]["retention_priority"]
    assert second["block_hash"] == block_key(first["block_hash"], [3, 4], None)
    assert removed["data"]["block_hashes"] == [second["block_hash"]]  # the leaf, to make room
    assert 0 <= first["block_hash"] < 2**64 and stored["window_size"] == 2048


def test_a_full_buffer_drops_the_oldest_events_and_size_zero_keeps_none():
    events = KVEventBuffer(2, window_size=8)
    for i in range(5):
        events.removed([i])
    drained = events.drain()
    assert [e["event_id"] for e in drained] == [3, 4] and events.dropped == 3
    off = KVEventBuffer(0, window_size=8)
    off.created(10)
    assert off.drain() == [] and not off.enabled


def test_drain_waits_for_the_first_event_up_to_its_timeout():
    events = KVEventBuffer(10, window_size=8)
    assert events.drain(0.01) == []
    threading.Timer(0.05, lambda: events.removed([7])).start()
    drained = events.drain(5.0)
    assert [e["data"]["block_hashes"] for e in drained] == [[7]]


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="tokens_per_block"):
        BlockPool(0, 10)
    with pytest.raises(ValueError, match="event_buffer_max_size"):
        KVEventBuffer(-1, window_size=8)


def test_the_defaults_the_stand_in_uses_are_the_recorded_ones():
    from trtllm_truss.engine_standin import kv_events
    from trtllm_truss.engine_standin.llmapi_kv import DEFAULT_BLOCK_REUSE, DEFAULT_TOKENS_PER_BLOCK
    from trtllm_truss.planning.plan import LLMAPI_TOKENS_PER_BLOCK

    defaults = CONTRACT["kv_cache_config_defaults"]
    assert DEFAULT_TOKENS_PER_BLOCK == LLMAPI_TOKENS_PER_BLOCK == defaults["tokens_per_block"]
    assert DEFAULT_BLOCK_REUSE is defaults["enable_block_reuse"]
    assert kv_events.DEFAULT_PRIORITY == CONTRACT["defaults"]["retention_priority"]
    assert kv_events.CACHE_LEVEL == CONTRACT["defaults"]["cache_level"]
