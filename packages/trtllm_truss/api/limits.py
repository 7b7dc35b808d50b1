"""What the serving plan allows a single request: checked before anything reaches Triton."""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_truss.plan import ServingPlan


@dataclass(frozen=True)
class RequestLimits:
    max_input_len: int
    max_output_len: int
    max_beam_width: int = 1
    vocab_size: int | None = None  # bounds `end_id` when known

    @classmethod
    def from_plan(cls, plan: ServingPlan, vocab_size: int | None = None) -> RequestLimits:
        return cls(
            max_input_len=plan.max_input_len,
            max_output_len=plan.max_output_len,
            max_beam_width=plan.max_beam_width,
            vocab_size=vocab_size,
        )
