"""The native `/v1/models/model:predict` request and response.

Compatible with the earlier TRT-LLM trusses (`prompt`, `max_tokens`, `beam_width`,
`stop_words_list`, `bad_words_list`, `repetition_penalty`, streamed text chunks) and extended with
chat `messages`, the remaining sampling knobs and a non-streamed JSON answer with usage.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trtllm_truss.api.sampling import INT32_MAX, SamplingFields, StrictModel, Text, WordList
from trtllm_truss.guides.guide import GUIDE_TYPES

DEFAULT_MAX_TOKENS = 50
FinishReason = Literal["stop", "length"]


class TextPart(StrictModel):
    type: Literal["text"]
    text: Text


class ChatMessage(StrictModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | list[TextPart]
    name: Text | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class PredictRequest(SamplingFields):
    prompt: Text | None = Field(None, description="text to complete (or give `messages`)")
    messages: list[ChatMessage] | None = Field(
        None, min_length=1, description="chat turns, formatted with the tokenizer's chat template"
    )
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description=f"tokens to generate (default {DEFAULT_MAX_TOKENS})")
    beam_width: int | None = Field(None, ge=1, le=INT32_MAX, description="beam search width; > 1 needs stream=false")
    stop_words_list: WordList = Field(default_factory=list, description="generation ends at any of these")
    bad_words_list: WordList = Field(default_factory=list, description="these never appear in the output")
    stream: bool = Field(True, description="stream text chunks (true) or answer once with JSON (false)")
    literal_special_tokens: bool = Field(
        True, description="special-token text in `prompt` (\"</s>\") is plain text; false: it is the control token"
    )
    # NVIDIA's names (tensorrt_llm model inputs, tensorrtllm_backend v0.19.0): the output constraint.
    guided_decoding_guide_type: Literal[GUIDE_TYPES] | None = Field(  # type: ignore[valid-type]
        None, description="json, json_schema, regex, ebnf_grammar or structural_tag"
    )
    guided_decoding_guide: Text | None = Field(None, description="the schema / regex / grammar text (none for json)")
    model: Text | None = Field(
        None, description="a LoRA adapter of build.lora_adapters by name; absent, \"\" or \"model\": the base model"
    )

    @model_validator(mode="after")
    def _one_input(self) -> PredictRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("prompt, messages: give exactly one of them")
        if self.beam_width is not None and self.beam_width > 1 and self.stream:
            raise ValueError("beam_width: beam search (beam_width > 1) needs stream=false")
        return self


class PromptTokensDetails(StrictModel):
    # Prompt tokens whose KV the engine found in its cache (runtime.enable_kv_cache_reuse), OpenAI's field.
    cached_tokens: int = 0


class Usage(StrictModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class PredictResponse(StrictModel):
    text: str
    finish_reason: FinishReason
    usage: Usage
