"""The tensors of one stand-in engine response, free of Triton (the model wraps them in pb_utils)."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from trtllm_truss.repository.interface import ENGINE_OUTPUTS, PREFIX_IDS_OUTPUT

# Everything the stand-in can send (the repository declares the same for its `tensorrt_llm`).
ENGINE_OUTPUT_NAMES = frozenset(t.name for t in (*ENGINE_OUTPUTS, PREFIX_IDS_OUTPUT))


def response_arrays(
    requested: Collection[str],
    tokens: list[int],
    log_probs: list[float],
    cum_log_prob: float,
    prefix: list[int],
    generated: int,
) -> list[tuple[str, np.ndarray]]:
    """Only the `requested` outputs, by name. Triton's python backend drops unrequested output
    tensors itself, releasing their arrays without the GIL while a sender thread sends: with
    Python 3.12 that segfaults the stub on the first response (before 3.12 it is a data race).
    `log_probs` cover the `generated` tokens only (zeros when not asked for), as NVIDIA's do."""
    count = len(tokens)
    arrays: list[tuple[str, np.ndarray]] = []
    if "output_ids" in requested:
        arrays.append(("output_ids", np.asarray(tokens, dtype=np.int32).reshape(1, 1, count)))
    if "sequence_length" in requested:
        arrays.append(("sequence_length", np.array([[count]], dtype=np.int32)))
    if "cum_log_probs" in requested:
        arrays.append(("cum_log_probs", np.array([[cum_log_prob]], dtype=np.float32)))
    if "output_log_probs" in requested:
        lp = np.zeros((1, 1, generated), dtype=np.float32)
        if log_probs:
            lp[0, 0, :] = log_probs
        arrays.append(("output_log_probs", lp))
    if "prefix_ids" in requested:
        arrays.append(("prefix_ids", np.asarray(prefix, dtype=np.int32).reshape(1, len(prefix))))
    return arrays
