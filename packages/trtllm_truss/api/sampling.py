"""Sampling fields shared by the native and the OpenAI schemas, and their translation to the ensemble.

Ranges follow OpenAI where OpenAI defines the field and TensorRT-LLM's `SamplingConfig` elsewhere,
and never exceed what the field's tensor holds (INT32, UINT64 for the seed, FP32): a value the
tensor cannot carry as sent is a field error here, not a failure when the tensor is built.
Every string must be text that UTF-8 can encode (no lone surrogates such as `"\\ud800"`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from trtllm_truss.api.errors import field_error
from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.engine.client import GenerationParams

# Sentinel end id that no token has: the engine then generates until max_tokens (ignore_eos).
IGNORE_EOS_END_ID = -1
MAX_WORDS = 32

# What the ensemble's input tensors hold (engine/client.py builds INT32, UINT64 and FP32 tensors).
INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1
FP32_MAX = 3.4028234663852886e38
# The smallest normal FP32 magnitude: below it a value loses precision or becomes 0.0 (1e-320 as a
# repetition penalty would reach the engine as 0, 1e-50 as top_p too).
FP32_MIN_NORMAL = 1.1754943508222875e-38


def utf8_text(value: str) -> str:
    """Refuse strings UTF-8 cannot encode: JSON's `\\ud800` escape yields a lone surrogate, which
    would fail later when the text is encoded for the tokenizer or for the answer."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        # repr() escapes the surrogate, so the message itself stays encodable.
        raise ValueError(
            f"is not valid Unicode text: lone surrogate {value[exc.start]!r} at character {exc.start}"
        ) from None
    return value


def fp32_value(value: float) -> float:
    """Refuse floats that the FP32 tensor would not carry as sent (0 stays 0)."""
    magnitude = abs(value)
    if magnitude != 0.0 and magnitude < FP32_MIN_NORMAL:
        raise ValueError(
            f"{value!r} is too close to 0 for a 32-bit float (nonzero values need a magnitude of at "
            f"least {FP32_MIN_NORMAL:.8g})"
        )
    if magnitude > FP32_MAX:
        raise ValueError(f"{value!r} is beyond the 32-bit float range (+-{FP32_MAX:.8g})")
    return value


Text = Annotated[str, AfterValidator(utf8_text)]
Float32 = Annotated[float, AfterValidator(fp32_value)]
Word = Annotated[str, StringConstraints(min_length=1, max_length=256), AfterValidator(utf8_text)]
WordList = Annotated[list[Word], Field(max_length=MAX_WORDS)]


class StrictModel(BaseModel):
    """No coercion ("5" is not 5), no unknown fields, no NaN/inf."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class SamplingFields(StrictModel):
    temperature: Float32 | None = Field(
        None, ge=0.0, le=2.0, description="0 selects greedy decoding; unset uses the engine default"
    )
    top_k: int | None = Field(None, ge=0, le=INT32_MAX, description="0 disables top-k filtering")
    top_p: Float32 | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=UINT64_MAX, description="random seed for reproducible sampling")
    repetition_penalty: Float32 | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: Float32 | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Float32 | None = Field(None, ge=-2.0, le=2.0)
    length_penalty: Float32 | None = Field(None, ge=-10.0, le=10.0, description="beam search only")
    min_tokens: int | None = Field(None, ge=0, le=INT32_MAX, description="generate at least this many tokens")
    end_id: int | None = Field(
        None, ge=0, le=INT32_MAX, description="token id that ends generation (default: the tokenizer's eos)"
    )
    ignore_eos: bool = Field(False, description="keep generating past the end token until max_tokens")


def resolve_max_tokens(field: str, requested: int | None, default: int, limits: RequestLimits) -> int:
    if requested is None:
        return min(default, limits.max_output_len)
    if requested > limits.max_output_len:
        raise field_error(field, f"{requested} is above this deployment's max_output_len ({limits.max_output_len})")
    return requested


def to_generation_params(
    sampling: SamplingFields,
    *,
    text_input: str,
    max_tokens: int,
    limits: RequestLimits,
    stop_words: Sequence[str] = (),
    bad_words: Sequence[str] = (),
    beam_width: int | None = None,
    default_top_p: float | None = None,
) -> GenerationParams:
    """The ensemble request for validated fields; raises HTTP 400 naming the field on a limit breach.

    `default_top_p`: sent when the request sets neither `top_p` nor `top_k` (the OpenAI routes send
    OpenAI's 1.0; with neither, TensorRT-LLM decodes greedily whatever the temperature)."""
    if sampling.min_tokens is not None and sampling.min_tokens > max_tokens:
        raise field_error("min_tokens", f"{sampling.min_tokens} is above max_tokens ({max_tokens})")
    if beam_width is not None and beam_width > limits.max_beam_width:
        raise field_error(
            "beam_width", f"{beam_width} is above this deployment's max_beam_width ({limits.max_beam_width})"
        )
    if sampling.end_id is not None:
        if sampling.ignore_eos:
            raise field_error("end_id", "cannot be combined with ignore_eos")
        if limits.vocab_size is not None and sampling.end_id >= limits.vocab_size:
            raise field_error("end_id", f"{sampling.end_id} is not a token id (vocabulary size {limits.vocab_size})")
    greedy = sampling.temperature == 0.0
    top_p = sampling.top_p if sampling.top_p is not None or sampling.top_k is not None else default_top_p
    return GenerationParams(
        text_input=text_input,
        max_tokens=max_tokens,
        # Beams are returned whole, not as deltas that concatenate, so they are not streamed.
        stream=not (beam_width or 1) > 1,
        end_id=IGNORE_EOS_END_ID if sampling.ignore_eos else sampling.end_id,
        top_k=1 if greedy else sampling.top_k,
        top_p=None if greedy else top_p,
        temperature=None if greedy else sampling.temperature,
        random_seed=sampling.seed,
        repetition_penalty=sampling.repetition_penalty,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        length_penalty=sampling.length_penalty,
        min_length=sampling.min_tokens,
        beam_width=beam_width,
        stop_words=tuple(stop_words),
        bad_words=tuple(bad_words),
    )
