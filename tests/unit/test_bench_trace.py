"""Trace replay's inputs: Mooncake-format traces read, token-id prompts synthesized per hash id, and the
trace's own bound on KV reuse (infinite cache, LRU pool) on a trace small enough to check by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_truss.bench.reuse_bound import infinite_cache_reuse, lru_pool_reuse, token_blocks, trace_blocks
from trtllm_truss.bench.trace import TraceRequest, TraceSynthesis, read_trace, synthesize
from trtllm_truss.bench.workload import WorkloadError

STUDY = Path(__file__).resolve().parents[2] / "docs" / "performance" / "fleet-kv-routing"
VOCABULARY = list(range(100, 400))

# Blocks of 4 tokens. Full blocks: input_length // 4 of the hash ids.
#   r0 [1,2,3] 10 tokens -> full [1,2]          nothing seen before           -> 0
#   r1 [1,2,4,5] 16      -> full [1,2,4,5]      1,2 seen (r0)                 -> 8
#   r2 [1,2,3] 12        -> full [1,2,3]        1,2 seen; 3 was partial in r0 -> 8
#   r3 [9,2] 8           -> full [9,2]          9 unseen (2 after 9 is another block) -> 0
#   r4 [1,2,3,7] 13      -> full [1,2,3]        1,2,3 seen (r2)               -> 12
TINY = [([1, 2, 3], 10), ([1, 2, 4, 5], 16), ([1, 2, 3], 12), ([9, 2], 8), ([1, 2, 3, 7], 13)]


def _tiny_blocks():
    return [trace_blocks(hash_ids, length, 4) for hash_ids, length in TINY]


def test_infinite_cache_bound_counts_prefixes_of_full_blocks_seen_before():
    bound = infinite_cache_reuse(_tiny_blocks(), 4)
    assert bound.per_request == [0, 8, 8, 0, 12]
    assert bound.cached_tokens == 28
    assert bound.as_dict(input_tokens=59) | {} == {
        "cache": "infinite", "pool_blocks": None, "block_tokens": 4, "requests": 5,
        "cached_tokens": 28, "input_tokens": 59, "cached_fraction": 28 / 59,
    }


def test_lru_pool_evicts_least_recently_used_tails_first():
    # Pool of 3, touched last block first: after r1 the pool is (oldest first) b4, a2, a1 (b5 evicted);
    # after r2: c3, a2, a1; r3 adds d2, d9 and evicts c3 and a2; r4 then finds only a1.
    assert lru_pool_reuse(_tiny_blocks(), 4, pool_blocks=3).per_request == [0, 8, 8, 0, 4]
    assert lru_pool_reuse(_tiny_blocks(), 4, pool_blocks=100).per_request == infinite_cache_reuse(_tiny_blocks(), 4).per_request
    with pytest.raises(ValueError, match="pool_blocks"):
        lru_pool_reuse(_tiny_blocks(), 4, pool_blocks=0)


def test_token_blocks_keep_full_blocks_only():
    assert token_blocks([1, 2, 3, 4, 5, 6, 7], 3) == [(1, 2, 3), (4, 5, 6)]
    assert token_blocks([1, 2], 3) == []


def _rows(*rows):
    return [TraceRequest(timestamp=t, input_length=n, output_length=o, hash_ids=h) for t, n, o, h in rows]


def test_requests_sharing_hash_ids_share_exactly_those_token_blocks():
    trace = _rows((1000, 1000, 50, (7, 8)), (1500, 1300, 60, (7, 8, 9)), (4000, 600, 5, (7, 11)))
    prompts = synthesize(trace, TraceSynthesis(block_tokens=16, trace_block_tokens=512), VOCABULARY, time_scale=0.5)
    a, b, c = (p.request.input_ids for p in prompts)
    # Lengths scale by 16/512, rounded up: 1000 -> 32, 1300 -> 41, 600 -> 19.
    assert [len(a), len(b), len(c)] == [32, 41, 19]
    assert b[:32] == a and c[:16] == a[:16]
    assert c[16:19] != b[16:19]  # hash 11 is not hash 8
    assert len(set(a[:16])) > 1 and set(a) <= set(VOCABULARY)
    assert [p.arrival_s for p in prompts] == [0.0, 0.25, 1.5]  # relative to the first, time-scaled
    assert [p.request.output_len for p in prompts] == [50, 60, 5]
    again = synthesize(trace, TraceSynthesis(block_tokens=16), VOCABULARY, time_scale=0.5)
    assert [p.request.input_ids for p in again] == [a, b, c]  # deterministic
    other_seed = synthesize(trace, TraceSynthesis(block_tokens=16, seed=1), VOCABULARY)
    assert other_seed[0].request.input_ids != a


def test_synthesized_prompts_reach_the_bound_the_trace_describes():
    # The engine's view (token blocks of the prompts sent) agrees with the trace's (hash ids).
    trace = _rows(*((i, length * 128, 1, tuple(ids)) for i, (ids, length) in enumerate(TINY)))
    prompts = synthesize(trace, TraceSynthesis(block_tokens=16), VOCABULARY)
    by_tokens = infinite_cache_reuse([token_blocks(p.request.input_ids, 16) for p in prompts], 16)
    by_hash = infinite_cache_reuse([trace_blocks(t.hash_ids, t.input_length, 512) for t in trace], 512)
    assert by_tokens.per_request == [v // 32 for v in by_hash.per_request] == [0, 32, 32, 0, 48]


def test_caps_cut_whole_blocks_and_output_lengths():
    trace = _rows((0, 2000, 900, (1, 2, 3, 4)), (10, 100, 0, (1,)))
    synthesis = TraceSynthesis(block_tokens=16, max_input_tokens=40, max_output_tokens=64)
    first, second = synthesize(trace, synthesis, VOCABULARY)
    assert first.request.input_len == 32 and first.hash_ids == (1, 2) and first.truncated
    assert first.request.output_len == 64
    assert second.request.input_len == 4 and not second.truncated
    assert second.request.output_len == 1  # a zero output length still asks for one token
    with pytest.raises(WorkloadError, match="below one block"):
        TraceSynthesis(block_tokens=16, max_input_tokens=8)


def test_read_trace_names_the_line_and_field(tmp_path):
    path = tmp_path / "t.jsonl"
    good = {"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1], "extra": "ignored"}
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(good | {"hash_ids": []}) + "\n")
    with pytest.raises(WorkloadError, match=r"line 3: hash_ids: "):
        read_trace(path)
    assert read_trace(path, limit=1) == [TraceRequest(timestamp=0, input_length=10, output_length=2, hash_ids=(1,))]
    path.write_text("{not json\n")
    with pytest.raises(WorkloadError, match="line 1: not JSON"):
        read_trace(path)


def test_the_studys_trace_subset_reads_and_has_reuse():
    trace = read_trace(STUDY / "conversation_trace_first600s.jsonl")
    assert len(trace) == 1750 and max(t.timestamp for t in trace) < 600_000
    bound = infinite_cache_reuse([trace_blocks(t.hash_ids, t.input_length, 512) for t in trace], 512)
    total = sum(t.input_length for t in trace)
    assert 0.2 < bound.cached_tokens / total < 1.0


def test_a_prompts_last_token_is_never_a_hit_though_its_block_serves_later_requests():
    # r0 fills 2 blocks exactly; r1 repeats it: an engine computes r1's last token, so only block 1 hits.
    # r2 extends it: both blocks, stored when r0 ran, are hits.
    prompts, lengths = [[1, 2], [1, 2], [1, 2, 3]], [8, 8, 12]
    assert infinite_cache_reuse(prompts, 4).per_request == [0, 8, 8]
    assert infinite_cache_reuse(prompts, 4, lengths).per_request == [0, 4, 8]
    assert lru_pool_reuse(prompts, 4, 10, lengths).per_request == [0, 4, 8]
