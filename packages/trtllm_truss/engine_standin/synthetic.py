"""The synthetic engine: tokens at (almost) no cost, to measure the serving stack behind it.

It keeps the scheduling of the real stand-in (batch limit, queue, cancellation, request_output_len,
stop words, end of request) but replaces the model with a cycle through ordinary vocabulary ids, so
detokenization downstream still does real work. `step_time_ms` paces decode steps (0 = as fast as
the loop runs); each step gives every running request one token. `prefill_time_per_token_ms` charges a
request's prefill per prompt token not found in the KV block pool (engine_standin/kv_blocks.py keeps the
same block accounting as the model engine, without tensors), on the engine thread as a real prefill
holds the batch. It has no model, so the logits it returns when asked (context / generation logits) are
zero-filled placeholders of NVIDIA's shapes.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from trtllm_truss.engine_standin.sampling import SequenceSamplingState
from trtllm_truss.engine_standin.scheduler import EngineBase, _Sequence
from trtllm_truss.engine_standin.types import (
    EngineLimits,
    FinishReason,
    GenerationOutput,
    SamplingParams,
)


def ordinary_token_ids(tokenizer_dir: Path | str | None, vocab_size: int, limit: int = 512) -> list[int]:
    """Ids of plain word pieces (letters, optionally a leading space) from the tokenizer, if one is there."""
    path = Path(tokenizer_dir) / "tokenizer.json" if tokenizer_dir else None
    if path is not None and path.is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
        ids = []
        for token_id in range(min(vocab_size, tokenizer.get_vocab_size())):
            text = tokenizer.decode([token_id])
            if text.strip().isalpha() and text.strip().isascii() and len(text.strip()) >= 2:
                ids.append(token_id)
            if len(ids) >= limit:
                break
        if ids:
            return ids
    # No tokenizer: skip the low ids where special tokens usually live.
    return list(range(min(256, vocab_size - 1), min(256 + limit, vocab_size)))


class SyntheticEngine(EngineBase):
    def __init__(
        self,
        limits: EngineLimits,
        vocab_size: int,
        token_cycle: list[int],
        *,
        step_time_ms: float = 0.0,
        name: str = "engine-synthetic",
        adapters=None,
        prefill_time_per_token_ms: float = 0.0,
        kv_pool=None,
    ) -> None:
        # `adapters` (lora_task_id -> name): accepted, and scheduled within max_loras like the model's, but
        # the tokens are synthetic whatever the adapter (config check: a warning).
        super().__init__(limits, vocab_size, name=name, adapters=adapters, kv_pool=kv_pool)
        if not token_cycle:
            raise ValueError("token_cycle: at least one token id is needed")
        self.token_cycle = token_cycle
        self.step_time_s = max(0.0, step_time_ms) / 1000.0
        self._next_step_at = 0.0
        self.prefill_s_per_token = max(0.0, prefill_time_per_token_ms) / 1000.0

    def _start(self, seq: _Sequence) -> bool:
        lease = self._lease(seq)
        self.kv_pool.store(lease, seq.request.input_ids)
        if self.prefill_s_per_token:
            time.sleep((len(seq.request.input_ids) - lease.reused_tokens) * self.prefill_s_per_token)
        if not self._running and self.step_time_s:
            # From idle, this prefill is the step: the first decode step comes one step later, not at once.
            self._next_step_at = time.monotonic() + self.step_time_s
        request = seq.request
        # The sampling state keeps the full sequence only when stop words need it.
        greedy = SamplingParams()
        seq.state = SequenceSamplingState(request.__class__(**{**request.__dict__, "sampling": greedy}), list(request.input_ids[-8:]), self.vocab_size)
        seq.cycle_offset = sum(request.input_ids) % len(self.token_cycle)
        return self._advance(seq, first=True)

    def _placeholder_logits(self, rows: int) -> np.ndarray:
        """Zero-filled logits (no model to compute them): NVIDIA's shape and dtype, no content."""
        return np.zeros((rows, self.vocab_size), dtype=np.float32)

    def _advance(self, seq: _Sequence, first: bool = False) -> bool:
        state = seq.state
        assert state is not None
        token = self.token_cycle[(seq.cycle_offset + state.generated) % len(self.token_cycle)]
        request = seq.request
        state.generated += 1
        if request.stop_words:
            state.tokens.append(token)
            from trtllm_truss.engine_standin.words import ends_with_any

            if ends_with_any(state.tokens, request.stop_words):
                self._emit(seq, self._logits(seq, first, GenerationOutput(request.request_id, [token], None, True, FinishReason.STOP_WORDS, None, state.generated)))
                return False
        finished = state.generated >= request.max_new_tokens
        if finished and seq.lease is not None and self.kv_pool.reuse:
            # The answer's full blocks join the cache as TensorRT-LLM stores a finished request's (its last token
            # has no KV yet); the tokens are the cycle's, so they are known without keeping them.
            cycle, offset = self.token_cycle, seq.cycle_offset
            answer = [cycle[(offset + j) % len(cycle)] for j in range(state.generated - 1)]
            self.kv_pool.store(seq.lease, list(request.input_ids) + answer)
        output = GenerationOutput(
            request.request_id,
            [token],
            [0.0] if request.return_log_probs else None,
            finished,
            FinishReason.LENGTH if finished else None,
            None,
            state.generated,
            # The one token it can pick is certain: the only alternative listed.
            top_log_probs=[([token], [0.0])] if request.return_log_probs and request.top_log_probs else None,
        )
        self._emit(seq, self._logits(seq, first, output))
        return not finished

    def _logits(self, seq: _Sequence, first: bool, output: GenerationOutput) -> GenerationOutput:
        request = seq.request
        if request.return_generation_logits:
            output.generation_logits = self._placeholder_logits(len(output.token_ids))
        if first and request.return_context_logits:
            output.context_logits = self._placeholder_logits(len(request.input_ids))
        return output

    def _step(self) -> None:
        if self.step_time_s:
            now = time.monotonic()
            if self._next_step_at > now:
                time.sleep(self._next_step_at - now)
            self._next_step_at = max(now, self._next_step_at) + self.step_time_s
        keep = [i for i, seq in enumerate(self._running) if self._advance(seq)]
        if len(keep) != len(self._running):
            self._remove_rows(keep)
