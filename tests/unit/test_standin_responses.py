"""The stand-in engine builds only the outputs a request asks for (engine_standin/responses.py)."""

from __future__ import annotations

import numpy as np

from trtllm_truss.engine_standin.responses import ENGINE_OUTPUT_NAMES, response_arrays


def test_only_requested_outputs_are_built():
    # What `ensemble_ids` and the benchmark's direct engine target ask for: a stub sending more
    # crashed with Python 3.12 (the backend drops the rest without holding the GIL).
    arrays = dict(response_arrays({"output_ids", "sequence_length"}, [5, 6], [], 0.0, [1, 2], 2))
    assert set(arrays) == {"output_ids", "sequence_length"}
    assert arrays["output_ids"].tolist() == [[[5, 6]]] and arrays["sequence_length"].tolist() == [[2]]
    assert [name for name, _ in response_arrays({"output_ids"}, [5], [], 0.0, [], 1)] == ["output_ids"]


def test_all_outputs_with_nvidia_shapes():
    arrays = dict(response_arrays(ENGINE_OUTPUT_NAMES, [7, 8, 9], [-0.5, -0.25, -1.0], -1.75, [3, 4], 3))
    assert set(arrays) == ENGINE_OUTPUT_NAMES
    assert arrays["output_ids"].shape == (1, 1, 3) and arrays["output_ids"].dtype == np.int32
    assert arrays["output_log_probs"].tolist() == [[[-0.5, -0.25, -1.0]]]
    assert arrays["cum_log_probs"].tolist() == [[-1.75]]
    assert arrays["prefix_ids"].tolist() == [[3, 4]]
    no_prefix = dict(response_arrays({"prefix_ids"}, [1], [], 0.0, [], 1))
    assert no_prefix["prefix_ids"].shape == (1, 0)
