"""The stand-in's stream_interval: which outputs of a streamed generation are sent, and what the
joined ones carry (TensorRT-LLM's PyExecutor answers at decode iteration 1, every interval-th, and the last)."""

from __future__ import annotations

import numpy as np
import pytest
from trtllm_truss.engine_standin.stream_interval import IntervalBuffer
from trtllm_truss.engine_standin.types import FinishReason, GenerationOutput


def step(n: int, *, finished: bool = False, logits: bool = False) -> GenerationOutput:
    return GenerationOutput(
        request_id="r",
        token_ids=[100 + n],
        log_probs=[-float(n)],
        finished=finished,
        finish_reason=FinishReason.LENGTH if finished else None,
        generated_count=n,
        context_logits=np.ones((2, 3), dtype=np.float32) if n == 1 and logits else None,
        generation_logits=np.full((1, 3), n, dtype=np.float32) if logits else None,
    )


@pytest.mark.parametrize(
    ("interval", "steps", "sent"),
    [
        (1, 5, [[1], [2], [3], [4], [5]]),
        (4, 13, [[1], [2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13]]),
        (4, 12, [[1], [2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]),
        (3, 2, [[1], [2]]),
        (8, 1, [[1]]),
    ],
)
def test_first_token_at_once_then_every_interval_steps_then_the_last(interval, steps, sent):
    buffer = IntervalBuffer(interval)
    out = [buffer.admit(step(n, finished=n == steps)) for n in range(1, steps + 1)]
    answered = [o for o in out if o is not None]
    assert [[t - 100 for t in o.token_ids] for o in answered] == sent
    assert [o.log_probs for o in answered] == [[-float(n) for n in group] for group in sent]
    assert [o.finished for o in answered] == [False] * (len(sent) - 1) + [True]
    assert answered[-1].finish_reason is FinishReason.LENGTH and answered[-1].generated_count == steps


def test_held_logits_travel_with_their_tokens():
    buffer = IntervalBuffer(3)
    first = buffer.admit(step(1, logits=True))
    assert first is not None and first.context_logits.shape == (2, 3)
    assert buffer.admit(step(2, logits=True)) is None
    joined = buffer.admit(step(3, logits=True))
    assert joined.generation_logits[:, 0].tolist() == [2.0, 3.0] and joined.context_logits is None


def test_a_cancelled_generation_sends_what_was_held():
    buffer = IntervalBuffer(4)
    buffer.admit(step(1))
    buffer.admit(step(2))
    end = GenerationOutput(request_id="r", token_ids=[], finished=True, finish_reason=FinishReason.CANCELLED, generated_count=2)
    last = buffer.admit(end)
    assert last.token_ids == [102] and last.finish_reason is FinishReason.CANCELLED


def test_interval_below_one_is_refused():
    with pytest.raises(ValueError, match="stream_interval must be >= 1"):
        IntervalBuffer(0)
