"""TensorRT-LLM's `stream_interval` for the stand-in: which decode steps of a streamed request answer.

TensorRT-LLM's PyTorch executor (1.x, `PyExecutor._handle_responses`) answers a streaming request at its
first decode iteration, at every iteration divisible by `stream_interval`, and when it finishes; each
response carries the tokens made since the previous one. The stand-in makes one token per iteration, so
the output's `generated_count` is that iteration.
"""

from __future__ import annotations

import numpy as np

from trtllm_truss.engine_standin.types import GenerationOutput


class IntervalBuffer:
    """One streamed generation's outputs held between the steps that answer (engine thread only)."""

    __slots__ = ("_held", "interval")

    def __init__(self, interval: int) -> None:
        if interval < 1:
            raise ValueError(f"stream_interval must be >= 1, not {interval}")
        self.interval = interval
        self._held: list[GenerationOutput] = []

    def admit(self, output: GenerationOutput) -> GenerationOutput | None:
        """The output to send now (what was held joined with this one), or None while it is held."""
        step = output.generated_count
        if not (output.finished or step == 1 or step % self.interval == 0):
            self._held.append(output)
            return None
        if not self._held:
            return output
        held, self._held = self._held, []
        return joined([*held, output])


def joined(outputs: list[GenerationOutput]) -> GenerationOutput:
    """Consecutive outputs of one generation as one: their tokens (and log probs, logits) in order,
    the last one's end."""
    last = outputs[-1]
    with_log_probs = [o.log_probs for o in outputs if o.log_probs is not None]
    logits = [o.generation_logits for o in outputs if o.generation_logits is not None]
    tops = [top for o in outputs for top in (o.top_log_probs or ())]
    return GenerationOutput(
        request_id=last.request_id,
        token_ids=[token for o in outputs for token in o.token_ids],
        log_probs=[p for probs in with_log_probs for p in probs] if with_log_probs else None,
        finished=last.finished,
        finish_reason=last.finish_reason,
        error=last.error,
        generated_count=last.generated_count,
        context_logits=next((o.context_logits for o in outputs if o.context_logits is not None), None),
        generation_logits=np.concatenate(logits, axis=0) if logits else None,
        top_log_probs=tops or None,
    )
