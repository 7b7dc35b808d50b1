"""`model_metadata.trt_llm.speculative`: speculative decoding, checked without knowing the backend.

Which backend and TensorRT-LLM version runs which mode (and the names each one takes) is decided when
the plan is made (`trtllm_truss.planning.speculation`); here only what holds everywhere: the sizes NVIDIA's
`LookaheadDecodingConfig::isLegal` accepts, what each mode needs, and the Baseten `speculator`
spellings (`LOOKAHEAD_DECODING`, `DRAFT_TOKENS_EXTERNAL`, `num_draft_tokens`).
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import BeforeValidator, Field, model_validator

from trtllm_truss.config.fields import NonEmptyStr, StrictModel, field_problem


class SpeculativeMode(str, enum.Enum):
    LOOKAHEAD = "lookahead"
    DRAFT_TARGET = "draft_target"
    EAGLE3 = "eagle3"
    MTP = "mtp"
    NGRAM = "ngram"


# Baseten truss 0.18.36 `speculator.speculative_decoding_mode`, trtllm-build's --speculative_decoding_mode
# and the llmapi `decoding_type` names, compared after lower-casing with '-' and ' ' as '_'.
SPECULATIVE_MODE_ALIASES: dict[str, SpeculativeMode] = {
    "lookahead_decoding": SpeculativeMode.LOOKAHEAD,
    "draft_tokens_external": SpeculativeMode.DRAFT_TARGET,
    "drafttarget": SpeculativeMode.DRAFT_TARGET,
    "draft_target_model": SpeculativeMode.DRAFT_TARGET,
    "eagle": SpeculativeMode.EAGLE3,
    "eagle_3": SpeculativeMode.EAGLE3,
    "n_gram": SpeculativeMode.NGRAM,
}

# NVIDIA's defaults (executor.h, LookaheadDecodingConfig::kDefaultLookaheadDecoding{Window,Ngram,VerificationSet}).
DEFAULT_LOOKAHEAD = (4, 3, 4)
MAX_DRAFT_TOKENS = 2048  # Baseten's limit on speculator.num_draft_tokens


def _parse_mode(value: object) -> object:
    if isinstance(value, SpeculativeMode):
        return value
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_").replace(" ", "_")
        for member in SpeculativeMode:
            if member.value == key:
                return member
        if key in SPECULATIVE_MODE_ALIASES:
            return SPECULATIVE_MODE_ALIASES[key]
    allowed = ", ".join(m.value for m in SpeculativeMode)
    raise ValueError(
        f"{value!r} is not allowed; allowed values: {allowed} (also LOOKAHEAD_DECODING, DRAFT_TOKENS_EXTERNAL)"
    )


SpeculativeModeName = Annotated[SpeculativeMode, BeforeValidator(_parse_mode)]
DraftTokens = Annotated[int, Field(ge=1, le=MAX_DRAFT_TOKENS)]
LookaheadSize = Annotated[int, Field(ge=0, le=256)]

_LOOKAHEAD_FIELDS = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")
# Which optional keys each mode reads; any other one given is an error naming it.
_MODE_FIELDS: dict[SpeculativeMode, frozenset[str]] = {
    SpeculativeMode.LOOKAHEAD: frozenset(_LOOKAHEAD_FIELDS),
    SpeculativeMode.DRAFT_TARGET: frozenset({"num_draft_tokens", "draft_repository", "draft_revision"}),
    SpeculativeMode.EAGLE3: frozenset({"num_draft_tokens", "draft_repository", "draft_revision", "eagle3_one_model"}),
    SpeculativeMode.MTP: frozenset({"num_draft_tokens"}),
    SpeculativeMode.NGRAM: frozenset({"num_draft_tokens", "ngram_max_matching_size"}),
}
_REQUIRED: dict[SpeculativeMode, tuple[str, ...]] = {
    SpeculativeMode.DRAFT_TARGET: ("num_draft_tokens", "draft_repository"),
    SpeculativeMode.EAGLE3: ("num_draft_tokens", "draft_repository"),
    SpeculativeMode.MTP: ("num_draft_tokens",),
    SpeculativeMode.NGRAM: ("num_draft_tokens", "ngram_max_matching_size"),
}


def lookahead_max_draft_len(window: int, ngram: int, verification_set: int) -> int:
    """NVIDIA's LookaheadDecodingConfig::calculateSpeculativeResourceTuple, third element (maxDraftTokens):
    what trtllm-build's --max_draft_len must be at least for these sizes."""
    return (0 if ngram == 1 else ngram - 2) + (window - 1 + verification_set) * (ngram - 1)


def lookahead_size_problem(window: int, ngram: int, verification_set: int) -> str | None:
    """NVIDIA's LookaheadDecodingConfig::isLegal, as a sentence (None: legal)."""
    if ngram < 1 or window < 1:
        return "lookahead_window_size and lookahead_ngram_size must be at least 1"
    if ngram == 1 and (window != 1 or verification_set != 0):
        return "with lookahead_ngram_size 1, lookahead_window_size must be 1 and lookahead_verification_set_size 0"
    return None


class SpeculativeConfig(StrictModel):
    speculative_decoding_mode: SpeculativeModeName = Field(
        description="lookahead (no extra model), draft_target (a smaller draft model), eagle3 (an Eagle 3 draft"
        " head), mtp (the checkpoint's own multi-token-prediction layers), ngram (draft tokens copied from the prompt)."
    )
    num_draft_tokens: DraftTokens | None = Field(
        None,
        description="Draft tokens proposed per step (NVIDIA's max_draft_len); for mtp the number of MTP layers used"
        " (num_nextn_predict_layers). Required for draft_target, eagle3, mtp and ngram; derived for lookahead.",
    )
    lookahead_window_size: LookaheadSize | None = Field(
        None, description="Lookahead: n-grams in the lookahead branch per step (W; NVIDIA's default 4)."
    )
    lookahead_ngram_size: LookaheadSize | None = Field(
        None, description="Lookahead: tokens per n-gram (N; NVIDIA's default 3)."
    )
    lookahead_verification_set_size: LookaheadSize | None = Field(
        None, description="Lookahead: n-grams verified per step (G; NVIDIA's default 4)."
    )
    draft_repository: NonEmptyStr | None = Field(
        None,
        description="draft_target: the draft model's checkpoint; eagle3: the Eagle 3 draft head. Hub repo id, s3://"
        " URL or path, fetched like the main checkpoint.",
    )
    draft_revision: NonEmptyStr | None = Field(None, description="Hub branch, tag or commit of draft_repository.")
    ngram_max_matching_size: int | None = Field(
        None, ge=1, le=64, description="ngram: longest prompt n-gram matched to propose drafts (max_matching_ngram_size)."
    )
    eagle3_one_model: bool | None = Field(
        None, description="eagle3: run the draft head inside the target model's engine (NVIDIA's default true)."
    )

    @model_validator(mode="after")
    def _fields_of_the_mode(self) -> SpeculativeConfig:
        mode = self.speculative_decoding_mode
        allowed = _MODE_FIELDS[mode]
        for name in sorted(self.model_fields_set - {"speculative_decoding_mode"} - allowed):
            if getattr(self, name) is not None:
                raise field_problem(name, f"does not apply to speculative_decoding_mode {mode.value}; remove it")
        for name in _REQUIRED.get(mode, ()):
            if getattr(self, name) is None:
                raise field_problem(name, f"required with speculative_decoding_mode {mode.value}")
        if mode is SpeculativeMode.LOOKAHEAD:
            problem = lookahead_size_problem(*self.lookahead_sizes)
            if problem:
                raise field_problem("lookahead_ngram_size", problem)
            if self.max_draft_len > MAX_DRAFT_TOKENS:
                raise field_problem(
                    "lookahead_window_size",
                    f"these sizes need {self.max_draft_len} draft tokens per step (NVIDIA's formula"
                    f" (N-2) + (W-1+G) x (N-1)), over {MAX_DRAFT_TOKENS}; lower one of them",
                )
        return self

    @property
    def lookahead_sizes(self) -> tuple[int, int, int]:
        """(window, ngram, verification set) with NVIDIA's defaults for the ones not given."""
        given = (self.lookahead_window_size, self.lookahead_ngram_size, self.lookahead_verification_set_size)
        return tuple(d if v is None else v for v, d in zip(given, DEFAULT_LOOKAHEAD))  # type: ignore[return-value]

    @property
    def max_draft_len(self) -> int:
        """Draft tokens per step the engine must make room for (trtllm-build --max_draft_len)."""
        if self.speculative_decoding_mode is SpeculativeMode.LOOKAHEAD:
            return lookahead_max_draft_len(*self.lookahead_sizes)
        assert self.num_draft_tokens is not None  # required by _fields_of_the_mode
        return self.num_draft_tokens
