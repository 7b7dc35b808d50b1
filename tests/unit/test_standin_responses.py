"""The stand-in engine builds only the outputs a request asks for (engine_standin/responses.py)."""

from __future__ import annotations

import numpy as np
from trtllm_truss.engine_standin.responses import (
    ENGINE_OUTPUT_NAMES,
    PerfMetrics,
    ResponseExtras,
    generation_logits_array,
    response_arrays,
)

BASE_OUTPUTS = {"output_ids", "sequence_length", "cum_log_probs", "output_log_probs", "prefix_ids"}


def test_only_requested_outputs_are_built():
    # What `ensemble_ids` and the benchmark's direct engine target ask for: a stub sending more
    # crashed with Python 3.12 (the backend drops the rest without holding the GIL).
    arrays = dict(response_arrays({"output_ids", "sequence_length"}, [5, 6], [], 0.0, [1, 2], 2))
    assert set(arrays) == {"output_ids", "sequence_length"}
    assert arrays["output_ids"].tolist() == [[[5, 6]]] and arrays["sequence_length"].tolist() == [[2]]
    assert [name for name, _ in response_arrays({"output_ids"}, [5], [], 0.0, [], 1)] == ["output_ids"]


def test_all_outputs_with_nvidia_shapes():
    arrays = dict(response_arrays(ENGINE_OUTPUT_NAMES, [7, 8, 9], [-0.5, -0.25, -1.0], -1.75, [3, 4], 3))
    # A plain request (one row, one sequence, nothing else asked for) gets NVIDIA's base outputs only.
    assert set(arrays) == BASE_OUTPUTS
    assert arrays["output_ids"].shape == (1, 1, 3) and arrays["output_ids"].dtype == np.int32
    assert arrays["output_log_probs"].tolist() == [[[-0.5, -0.25, -1.0]]]
    assert arrays["cum_log_probs"].tolist() == [[-1.75]]
    assert arrays["prefix_ids"].tolist() == [[3, 4]]
    no_prefix = dict(response_arrays({"prefix_ids"}, [1], [], 0.0, [], 1))
    assert no_prefix["prefix_ids"].shape == (1, 0)


def test_extras_have_nvidias_shapes_and_dtypes():
    """model_instance_state.cc fillTritonResponse (v0.19.0): batch_index / sequence_index and every
    perf metric [1, 1] (INT32, INT64 for the times, FP32 acceptance_rate), context logits
    [1, prompt_len, vocab], generation logits [1, beams, max_new_tokens, vocab] when not streaming."""
    perf = PerfMetrics(arrival_time_ns=10, first_scheduled_time_ns=20, first_token_time_ns=30, last_token_time_ns=40)
    extras = ResponseExtras(
        batch_index=2,
        sequence_index=1,
        context_logits=np.ones((4, 11), dtype=np.float32),
        generation_logits=generation_logits_array([np.ones((1, 11), dtype=np.float32)] * 3, 11, streaming=False, max_new_tokens=5),
        perf=perf,
    )
    tops = [([7, 1], [-0.1, -2.5]), ([8], [-0.2]), ([9, 2], [-0.3, -1.0])]
    arrays = dict(response_arrays(ENGINE_OUTPUT_NAMES, [7, 8, 9], [], 0.0, [], 3, extras, tops))
    assert set(arrays) == ENGINE_OUTPUT_NAMES
    # Ours (num_top_log_probs): [batch, beam, token, k], a short row padded with id -1 / -inf.
    assert (arrays["output_top_ids"].shape, arrays["output_top_ids"].dtype) == ((1, 1, 3, 2), np.int32)
    assert arrays["output_top_ids"][0, 0].tolist() == [[7, 1], [8, -1], [9, 2]]
    assert arrays["output_top_log_probs"].dtype == np.float32 and np.isneginf(arrays["output_top_log_probs"][0, 0, 1, 1])
    shapes = {name: (array.shape, array.dtype) for name, array in arrays.items()}
    assert shapes["batch_index"] == ((1, 1), np.int32) and arrays["batch_index"].tolist() == [[2]]
    assert shapes["sequence_index"] == ((1, 1), np.int32) and arrays["sequence_index"].tolist() == [[1]]
    assert shapes["context_logits"] == ((1, 4, 11), np.float32)
    assert shapes["generation_logits"] == ((1, 1, 5, 11), np.float32)
    assert arrays["generation_logits"][0, 0, :3].min() == 1.0 and arrays["generation_logits"][0, 0, 3:].max() == 0.0
    for name in ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "total_accepted_draft_tokens", "total_draft_tokens"):
        assert shapes[name] == ((1, 1), np.int32), name
    for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns"):
        assert shapes[name] == ((1, 1), np.int64), name
    assert shapes["acceptance_rate"] == ((1, 1), np.float32)
    assert arrays["last_token_time_ns"].tolist() == [[40]]


def test_streaming_generation_logits_are_tokens_by_beams():
    # Result.generationLogits in streaming mode: [tokens, beams, vocab]; with the batch dim [1, 1, 1, V].
    streamed = generation_logits_array([np.zeros((1, 7), dtype=np.float32)], 7, streaming=True, max_new_tokens=9)
    assert streamed.shape == (1, 1, 7)
    arrays = dict(response_arrays({"generation_logits"}, [5], [], 0.0, [], 1, ResponseExtras(generation_logits=streamed)))
    assert arrays["generation_logits"].shape == (1, 1, 1, 7)


def test_extras_only_when_requested_by_name():
    extras = ResponseExtras(batch_index=1, perf=PerfMetrics(1, 2, 3, 4))
    names = [name for name, _ in response_arrays({"output_ids", "batch_index"}, [5], [], 0.0, [], 1, extras)]
    assert names == ["output_ids", "batch_index"]
