"""The tensors of one stand-in engine response, free of Triton (the model wraps them in pb_utils).

Shapes and dtypes are those of NVIDIA's C++ backend (tensorrtllm_backend v0.19.0,
model_instance_state.cc `fillTritonResponse`): every response belongs to one batch item and one
sequence, so each tensor has a leading dimension of 1; `batch_index` / `sequence_index` ([1, 1]
INT32) come only when the request has several rows / num_return_sequences > 1, the perf metrics
([1, 1] each) only with return_perf_metrics, the logits only with return_*_logits.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from trtllm_truss.repository.interface import (
    ENGINE_OPTIONAL_OUTPUTS,
    ENGINE_OUTPUTS,
    PREFIX_IDS_OUTPUT,
    TOP_IDS_OUTPUT,
    TOP_LOG_PROBS_OUTPUT,
    TOP_LOG_PROBS_OUTPUTS,
)

# Everything the stand-in can send (the repository declares the same for its `tensorrt_llm`).
ENGINE_OUTPUT_NAMES = frozenset(
    t.name for t in (*ENGINE_OUTPUTS, *ENGINE_OPTIONAL_OUTPUTS, PREFIX_IDS_OUTPUT, *TOP_LOG_PROBS_OUTPUTS)
)


@dataclass(frozen=True)
class PerfMetrics:
    """NVIDIA's per-request perf metrics (executor RequestPerfMetrics). Times are steady-clock
    nanoseconds (time.monotonic_ns(), std::chrono::steady_clock on Linux). The block counts are those of
    the request's prompt in the engine's KV block pool (engine_standin/kv_blocks.py: kv_block_metrics);
    the stand-in has no speculative decoding."""

    arrival_time_ns: int
    first_scheduled_time_ns: int
    first_token_time_ns: int
    last_token_time_ns: int
    kv_cache_alloc_new_blocks: int = 1
    kv_cache_reused_blocks: int = 0
    kv_cache_alloc_total_blocks: int = 1
    acceptance_rate: float = 0.0
    total_accepted_draft_tokens: int = 0
    total_draft_tokens: int = 0

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        int32, int64 = np.int32, np.int64
        return [
            ("kv_cache_alloc_new_blocks", np.array([[self.kv_cache_alloc_new_blocks]], dtype=int32)),
            ("kv_cache_reused_blocks", np.array([[self.kv_cache_reused_blocks]], dtype=int32)),
            ("kv_cache_alloc_total_blocks", np.array([[self.kv_cache_alloc_total_blocks]], dtype=int32)),
            ("arrival_time_ns", np.array([[self.arrival_time_ns]], dtype=int64)),
            ("first_scheduled_time_ns", np.array([[self.first_scheduled_time_ns]], dtype=int64)),
            ("first_token_time_ns", np.array([[self.first_token_time_ns]], dtype=int64)),
            ("last_token_time_ns", np.array([[self.last_token_time_ns]], dtype=int64)),
            ("acceptance_rate", np.array([[self.acceptance_rate]], dtype=np.float32)),
            ("total_accepted_draft_tokens", np.array([[self.total_accepted_draft_tokens]], dtype=int32)),
            ("total_draft_tokens", np.array([[self.total_draft_tokens]], dtype=int32)),
        ]


def kv_block_metrics(request) -> dict[str, int]:
    """The KV block counts of a request the engine prefilled (GenerationRequest.kv_*), as PerfMetrics fields;
    empty before its prefill (PerfMetrics' defaults)."""
    total = getattr(request, "kv_total_blocks", None)
    if total is None:
        return {}
    reused = request.kv_reused_blocks
    return {"kv_cache_alloc_total_blocks": total, "kv_cache_reused_blocks": reused, "kv_cache_alloc_new_blocks": total - reused}


def kv_block_arrays(requested: Collection[str], total: int, reused: int) -> list[tuple[str, np.ndarray]]:
    """NVIDIA's three KV block perf outputs ([1, 1] INT32) of a request's prompt, those `requested`."""
    values = {"kv_cache_alloc_total_blocks": total, "kv_cache_reused_blocks": reused, "kv_cache_alloc_new_blocks": total - reused}
    return [(name, np.array([[value]], dtype=np.int32)) for name, value in values.items() if name in requested]


@dataclass(frozen=True)
class ResponseExtras:
    """What a response carries besides ids and log probs; None = not sent."""

    batch_index: int | None = None  # set only when the request has batch size > 1
    sequence_index: int | None = None  # set only when num_return_sequences > 1
    context_logits: np.ndarray | None = None  # [prompt_len, vocab]
    generation_logits: np.ndarray | None = None  # [beams, tokens, vocab] or streaming [tokens, beams, vocab]
    perf: PerfMetrics | None = None


NO_EXTRAS = ResponseExtras()


def generation_logits_array(rows: list[np.ndarray], vocab_size: int, *, streaming: bool, max_new_tokens: int) -> np.ndarray:
    """TensorRT-LLM's layout (executor Result.generationLogits): streaming, this response's tokens
    as [tokens, beams, vocab]; otherwise the whole request as [beams, max_new_tokens, vocab] (the
    executor's buffer is sized by the request's max new tokens; positions never generated are 0)."""
    tokens = np.concatenate(rows, axis=0) if rows else np.zeros((0, vocab_size), dtype=np.float32)
    if streaming:
        return tokens.reshape(tokens.shape[0], 1, tokens.shape[1])
    out = np.zeros((1, max(max_new_tokens, tokens.shape[0]), tokens.shape[1] if tokens.size else vocab_size), dtype=np.float32)
    out[0, : tokens.shape[0]] = tokens
    return out


def response_arrays(
    requested: Collection[str],
    tokens: list[int],
    log_probs: list[float],
    cum_log_prob: float,
    prefix: list[int],
    generated: int,
    extras: ResponseExtras = NO_EXTRAS,
    tops: list | None = None,
) -> list[tuple[str, np.ndarray]]:
    """Only the `requested` outputs, by name. Triton's python backend drops unrequested output
    tensors itself, releasing their arrays without the GIL while a sender thread sends: with
    Python 3.12 that segfaults the stub on the first response (before 3.12 it is a data race).
    `log_probs` cover the `generated` tokens only (zeros when not asked for), as NVIDIA's do; `tops`
    (num_top_log_probs, ours): per generated token, the k most likely (ids, log probs)."""
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
    if tops:
        arrays.extend(top_arrays(requested, tops))
    if extras is NO_EXTRAS:
        return arrays
    if extras.context_logits is not None and "context_logits" in requested:
        arrays.append(("context_logits", np.asarray(extras.context_logits, dtype=np.float32)[None]))
    if extras.generation_logits is not None and "generation_logits" in requested:
        arrays.append(("generation_logits", np.asarray(extras.generation_logits, dtype=np.float32)[None]))
    if extras.batch_index is not None and "batch_index" in requested:
        arrays.append(("batch_index", np.array([[extras.batch_index]], dtype=np.int32)))
    if extras.sequence_index is not None and "sequence_index" in requested:
        arrays.append(("sequence_index", np.array([[extras.sequence_index]], dtype=np.int32)))
    if extras.perf is not None:
        arrays.extend((name, array) for name, array in extras.perf.arrays() if name in requested)
    return arrays


def top_arrays(requested: Collection[str], tops: list) -> list[tuple[str, np.ndarray]]:
    """output_top_log_probs / output_top_ids ([1, 1, tokens, k]: batch, beam, token, rank) of `tops`,
    one (ids, log probs) per token; a token with fewer than k (a vocabulary under k) is padded with
    id -1 and log prob -inf."""
    k = max(len(ids) for ids, _ in tops)
    values = np.full((1, 1, len(tops), k), -np.inf, dtype=np.float32)
    ids = np.full((1, 1, len(tops), k), -1, dtype=np.int32)
    for position, (token_ids, log_probs) in enumerate(tops):
        ids[0, 0, position, : len(token_ids)] = token_ids
        values[0, 0, position, : len(log_probs)] = log_probs
    arrays = []
    if TOP_LOG_PROBS_OUTPUT.name in requested:
        arrays.append((TOP_LOG_PROBS_OUTPUT.name, values))
    if TOP_IDS_OUTPUT.name in requested:
        arrays.append((TOP_IDS_OUTPUT.name, ids))
    return arrays
