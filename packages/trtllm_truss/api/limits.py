"""What the serving plan allows a single request: checked before anything reaches Triton."""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_truss.guides.oversized import MAX_SCHEMA_BYTES
from trtllm_truss.planning.logprobs import top_logprobs_off
from trtllm_truss.planning.plan import ServingPlan

# Bytes of text one token is assumed to cover at most (a generous bound: long tokens are runs of
# spaces or punctuation): `max_input_len` times this bounds a prompt that can fit, before tokenizing.
MAX_TOKEN_BYTES = 256
# A JSON string escape is at most 6 bytes per UTF-8 byte (`\u0001`), so a body holding a prompt that
# fits is at most this many times the prompt's bytes, plus room for a JSON Schema as large as a request
# may send (reduced if over the guide bound: guides.oversized) and the other fields.
JSON_ESCAPE_FACTOR = 6
BODY_OVERHEAD_BYTES = MAX_SCHEMA_BYTES + (1 << 20)


@dataclass(frozen=True)
class RequestLimits:
    max_input_len: int
    max_output_len: int
    max_beam_width: int = 1
    vocab_size: int | None = None  # bounds `end_id` when known
    max_token_bytes: int = MAX_TOKEN_BYTES  # the tokenizer's longest token in bytes, when known
    guided_decoding_off: str | None = None  # why guides cannot be enforced here (None: they are)
    guide_types: tuple[str, ...] | None = None  # the guide types the engine takes (None: any it compiles)
    guide_engine: str = "xgrammar"  # the grammar engine guides are checked with (guides.engines.guide_engine)
    # Why forced tool calls keep the JSON guide here (None: they are guided in the family's own syntax,
    # guides.tool_syntax); the default, for limits made by hand, is the JSON guide.
    forced_syntax_off: str | None = "not planned"
    # runtime.pytorch.guided_whitespace where the stand-in or the LLM-API double generates ("compact" |
    # "flexible"), else TensorRT-LLM's "flexible": a forced call's structural tag is built with it.
    guided_whitespace: str = "flexible"
    # build.lora_adapters: (name, NVIDIA lora_task_id) pairs; a request's `model` picks one.
    lora_task_ids: tuple[tuple[str, int], ...] = ()
    served_model_name: str | None = None  # runtime.served_model_name: the base model's name besides "model"
    # Why the engine returns no most likely tokens besides the sampled one (None: it returns up to
    # repository.interface.MAX_TOP_LOG_PROBS, our num_top_log_probs).
    top_logprobs_off: str | None = "the engine returns the log prob of the sampled token only"

    @property
    def max_prompt_bytes(self) -> int:
        """A prompt longer than this in UTF-8 cannot be `max_input_len` tokens or fewer."""
        return self.max_input_len * self.max_token_bytes

    @property
    def max_body_bytes(self) -> int:
        """Request bodies above this are refused (413) before they are parsed."""
        return JSON_ESCAPE_FACTOR * self.max_prompt_bytes + BODY_OVERHEAD_BYTES

    @classmethod
    def from_plan(
        cls, plan: ServingPlan, vocab_size: int | None = None, max_token_bytes: int | None = None
    ) -> RequestLimits:
        return cls(
            max_input_len=plan.max_input_len,
            max_output_len=plan.max_output_len,
            max_beam_width=plan.max_beam_width,
            vocab_size=vocab_size,
            max_token_bytes=max_token_bytes or MAX_TOKEN_BYTES,
            guided_decoding_off=plan.guided_decoding_off,
            guide_types=plan.guide_types,
            guide_engine=plan.guide_engine or "xgrammar",
            forced_syntax_off=plan.forced_syntax_off,
            guided_whitespace=plan.runtime.pytorch.guided_whitespace if plan.backend == "pytorch" or plan.llm_api_double else "flexible",
            lora_task_ids=tuple((adapter.name, adapter.task_id) for adapter in plan.lora_adapters),
            served_model_name=plan.runtime.served_model_name,
            top_logprobs_off=top_logprobs_off(plan),
        )
