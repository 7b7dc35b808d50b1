"""Requests, outputs and limits of the engine stand-in (independent of Triton).

The fields follow TensorRT-LLM's request semantics (the `tensorrt_llm` Triton model's inputs), so the
python-backend model only converts tensors into these objects and back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class FinishReason(str, Enum):
    LENGTH = "length"  # request_output_len tokens generated
    END_ID = "end_id"  # the end token was generated (it is not part of the output, as in TensorRT-LLM)
    STOP_WORDS = "stop_words"  # a stop sequence was generated (its tokens are kept in the output)
    CANCELLED = "cancelled"
    ERROR = "error"


class RequestRejected(ValueError):
    """The request cannot be served as asked (bad option or over a limit); the engine keeps running."""


@dataclass(frozen=True)
class EngineLimits:
    max_batch_size: int  # sequences decoded together; more requests wait in the queue
    max_input_len: int
    max_output_len: int


@dataclass(frozen=True)
class SamplingParams:
    """TensorRT-LLM defaults: top_k == 0 and top_p == 0 means greedy; top_k == 1 is greedy too."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_length: int = 0  # the end token is masked until this many tokens are generated
    random_seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or (self.top_k == 0 and self.top_p <= 0.0)

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


@dataclass(frozen=True)
class Guide:
    """NVIDIA's guided decoding of one request: `guided_decoding_guide_type` (trtllm_truss.guides.guide.GUIDE_TYPES)
    and its `guided_decoding_guide` text (None for "json")."""

    guide_type: str
    guide: str | None = None


@dataclass
class GenerationRequest:
    request_id: str
    input_ids: list[int]
    max_new_tokens: int  # request_output_len
    end_id: int | None = None  # None: never stops on a token
    pad_id: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_words: list[list[int]] = field(default_factory=list)  # token-id sequences
    bad_words: list[list[int]] = field(default_factory=list)  # token-id sequences never generated
    beam_width: int = 1
    return_log_probs: bool = False
    top_log_probs: int = 0  # num_top_log_probs (ours): the k most likely tokens of each step, with their log probs
    embedding_bias: list[float] | None = None  # added to the logits each step (one value per vocab id)
    # NVIDIA's return_context_logits / return_generation_logits: the model's raw logits (before
    # bias, penalties and sampling) of every prompt position / of each generated token.
    return_context_logits: bool = False
    return_generation_logits: bool = False
    guide: Guide | None = None  # every token is chosen among those the guide allows
    lora_task_id: int | None = None  # NVIDIA's lora_task_id: a configured LoRA adapter (None: the base model)
    # When the engine admitted the request (time.monotonic_ns(), the clock of NVIDIA's
    # std::chrono::steady_clock perf metrics); set by the engine.
    first_scheduled_ns: int | None = None
    # Its prompt's KV blocks in the engine's block pool, and how many of them were reused from the cache
    # (NVIDIA's kv_cache_alloc_total_blocks / kv_cache_reused_blocks); set by the engine at prefill.
    kv_total_blocks: int | None = None
    kv_reused_blocks: int = 0


@dataclass
class GenerationOutput:
    """One step's result for one request: only the tokens new since the previous output."""

    request_id: str
    token_ids: list[int]
    log_probs: list[float] | None = None  # log-probability of each new token (when asked for)
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    generated_count: int = 0  # tokens generated so far for this request, these included
    context_logits: Any = None  # numpy float32 [prompt_len, vocab], first output only (when asked)
    generation_logits: Any = None  # numpy float32 [len(token_ids), vocab] (when asked)
    # num_top_log_probs: per new token, the k most likely (token ids, log probs), largest first.
    top_log_probs: list[tuple[list[int], list[float]]] | None = None
