"""NVIDIA's `tensorrt_llm` inputs the stand-in declares but cannot honour: each refused by name, with why.

Declared so that a client gets this reason instead of Triton's bare "unexpected inference input"; an empty
tensor asks for nothing and passes. The list must cover `repository.interface.STANDIN_REFUSED_INPUT_NAMES`
(tests/unit/test_standin_unsupported_inputs.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from trtllm_truss.engine_standin.types import RequestRejected

_BEAM = "beam search option; the stand-in decodes with beam width 1"
_TOP_P_DECAY = "NVIDIA's top-p decay sampling, which the stand-in does not implement"
_PROMPT_TABLE = "prompt-tuning / multimodal embedding table, which the stand-in's Hugging Face model does not take"
_DRAFT = (
    "client-driven speculative decoding (draft tokens verified by the engine); the stand-in generates one token"
    " per step: send the request without it, or serve with backend tensorrtllm"
)
_LOOKAHEAD = (
    "per-request lookahead decoding size; the stand-in does not speculate (model_metadata.trt_llm.speculative"
    " runs on backends tensorrtllm and llmapi)"
)
_RETENTION = (
    "KV-cache retention priority; the stand-in keeps each sequence's cache for its lifetime and has no block"
    " reuse or host offload to prioritise"
)

UNSUPPORTED_INPUTS: dict[str, str] = {
    "runtime_top_p_min": _TOP_P_DECAY,
    "runtime_top_p_decay": _TOP_P_DECAY,
    "runtime_top_p_reset_ids": _TOP_P_DECAY,
    "early_stopping": _BEAM,
    "beam_search_diversity_rate": _BEAM,
    "prompt_embedding_table": _PROMPT_TABLE,
    "prompt_table_extra_ids": _PROMPT_TABLE,
    "prompt_vocab_size": _PROMPT_TABLE,
    "draft_input_ids": _DRAFT,
    "draft_logits": _DRAFT,
    "draft_acceptance_threshold": _DRAFT,
    "lookahead_window_size": _LOOKAHEAD,
    "lookahead_ngram_size": _LOOKAHEAD,
    "lookahead_verification_set_size": _LOOKAHEAD,
    "retention_token_range_starts": _RETENTION,
    "retention_token_range_ends": _RETENTION,
    "retention_token_range_priorities": _RETENTION,
    "retention_token_range_durations_ms": _RETENTION,
    "retention_decode_priority": _RETENTION,
    "retention_decode_duration_ms": _RETENTION,
}


def refuse_unsupported(arrays: Mapping[str, object]) -> None:
    """Raise RequestRejected naming every non-empty input of `arrays` (name -> numpy array) the stand-in
    cannot honour."""
    sent = [name for name in UNSUPPORTED_INPUTS if name in arrays and getattr(arrays[name], "size", 1) > 0]
    if sent:
        reasons = "; ".join(f"{name}: {UNSUPPORTED_INPUTS[name]}" for name in sent)
        raise RequestRejected(f"tensorrt_llm (PyTorch stand-in) cannot honour {', '.join(sent)}: {reasons}")
