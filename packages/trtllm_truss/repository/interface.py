"""The tensor interface of NVIDIA's `inflight_batcher_llm` repository, as data.

Names, dtypes, dims and optional flags follow triton-inference-server/tensorrtllm_backend v0.19.0,
`all_models/inflight_batcher_llm/{ensemble,preprocessing,tensorrt_llm,postprocessing}/config.pbtxt`,
so NVIDIA's clients (end_to_end_grpc_client.py, inflight_batcher_llm_client.py) work unchanged.
Our additions: the engine's `prefix_ids` output and postprocessing's optional `PREFIX_IDS` input,
which make streaming detokenization stateless (docs/design.md, last section), `ensemble_ids`,
the ensemble without postprocessing that the truss proxy reads token ids from, and, on our python
engines only, `num_top_log_probs` / `output_top_log_probs` / `output_top_ids` (top_logprobs up to
MAX_TOP_LOG_PROBS; NVIDIA's C++ backend has no such output).
"""

from __future__ import annotations

from trtllm_truss.repository.model_config import DataType, Tensor

BOOL, INT32, INT64, UINT64, FP16, FP32, STRING, UINT8 = (
    DataType.BOOL,
    DataType.INT32,
    DataType.INT64,
    DataType.UINT64,
    DataType.FP16,
    DataType.FP32,
    DataType.STRING,
    DataType.UINT8,
)
# NVIDIA's `${logits_datatype}` (context_logits, generation_logits): TYPE_FP32 in its examples.
LOGITS = DataType.FP32


def _opt(name: str, dtype: DataType, dims: tuple[int, ...] = (1,)) -> Tensor:
    return Tensor(name, dtype, dims, optional=True)


# ---------------------------------------------------------------- ensemble (user-facing)
ENSEMBLE_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", STRING, (1,)),
    _opt("decoder_text_input", STRING),  # encoder-decoder only: preprocessing refuses it by name
    Tensor("max_tokens", INT32, (1,)),
    _opt("num_return_sequences", INT32),
    _opt("bad_words", STRING, (-1,)),
    _opt("stop_words", STRING, (-1,)),
    _opt("end_id", INT32),
    _opt("pad_id", INT32),
    _opt("top_k", INT32),
    _opt("top_p", FP32),
    _opt("temperature", FP32),
    _opt("length_penalty", FP32),
    _opt("repetition_penalty", FP32),
    _opt("min_length", INT32),
    _opt("presence_penalty", FP32),
    _opt("frequency_penalty", FP32),
    _opt("random_seed", UINT64),
    _opt("return_log_probs", BOOL),
    _opt("return_context_logits", BOOL),
    _opt("return_generation_logits", BOOL),
    _opt("return_perf_metrics", BOOL),
    _opt("beam_width", INT32),
    _opt("stream", BOOL),
    _opt("exclude_input_in_output", BOOL),
    _opt("embedding_bias_words", STRING, (-1,)),
    _opt("embedding_bias_weights", FP32, (-1,)),
    # Guided decoding (v0.19.0 ensemble config.pbtxt: TYPE_STRING [1], optional, allow_ragged_batch),
    # passed straight to tensorrt_llm (preprocessing does not see them).
    Tensor("guided_decoding_guide_type", STRING, (1,), optional=True, allow_ragged_batch=True),
    Tensor("guided_decoding_guide", STRING, (1,), optional=True, allow_ragged_batch=True),
)
# The engine's outputs that a response carries only when asked for (NVIDIA's fillTritonResponse):
# logits with return_*_logits, batch_index when the request has batch size > 1, sequence_index
# when num_return_sequences > 1, the perf metrics with return_perf_metrics. Each is [1]-shaped per
# response ([1, 1] with the batch dimension) except the logits.
PERF_METRIC_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("kv_cache_alloc_new_blocks", INT32, (1,)),
    Tensor("kv_cache_reused_blocks", INT32, (1,)),
    Tensor("kv_cache_alloc_total_blocks", INT32, (1,)),
    Tensor("arrival_time_ns", INT64, (1,)),
    Tensor("first_scheduled_time_ns", INT64, (1,)),
    Tensor("first_token_time_ns", INT64, (1,)),
    Tensor("last_token_time_ns", INT64, (1,)),
    Tensor("acceptance_rate", FP32, (1,)),
    Tensor("total_accepted_draft_tokens", INT32, (1,)),
    Tensor("total_draft_tokens", INT32, (1,)),
)
ENGINE_OPTIONAL_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("context_logits", LOGITS, (-1, -1)),
    Tensor("generation_logits", LOGITS, (-1, -1, -1)),
    Tensor("batch_index", INT32, (1,)),
    Tensor("sequence_index", INT32, (1,)),
    *PERF_METRIC_OUTPUTS,
)

ENSEMBLE_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", STRING, (-1,)),
    Tensor("cum_log_probs", FP32, (-1,)),
    Tensor("output_log_probs", FP32, (-1, -1)),
    # Passed through from the engine as NVIDIA's ensemble does (v0.19.0 lists
    # kv_cache_alloc_total_blocks twice; it is declared once here).
    *ENGINE_OPTIONAL_OUTPUTS,
    # Ours, beside NVIDIA's: tokens in this response per beam (engine's sequence_length), for usage.
    Tensor("sequence_length", INT32, (-1,)),
)

# ---------------------------------------------------------------- preprocessing
PREPROCESSING_INPUTS: tuple[Tensor, ...] = (
    Tensor("QUERY", STRING, (1,)),
    Tensor("REQUEST_OUTPUT_LEN", INT32, (1,)),
    _opt("BAD_WORDS_DICT", STRING, (-1,)),
    _opt("STOP_WORDS_DICT", STRING, (-1,)),
    _opt("END_ID", INT32),
    _opt("PAD_ID", INT32),
    # NVIDIA's (v0.19.0) text-model inputs besides the above; DECODER_QUERY (encoder-decoder) is
    # refused with a clear error, the multimodal inputs are not declared.
    _opt("DECODER_QUERY", STRING),
    _opt("EMBEDDING_BIAS_WORDS", STRING, (-1,)),
    _opt("EMBEDDING_BIAS_WEIGHTS", FP32, (-1,)),
)
PREPROCESSING_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("INPUT_ID", INT32, (-1,)),
    Tensor("REQUEST_INPUT_LEN", INT32, (1,)),
    Tensor("DECODER_INPUT_ID", INT32, (-1,)),
    Tensor("REQUEST_DECODER_INPUT_LEN", INT32, (1,)),
    Tensor("BAD_WORDS_IDS", INT32, (2, -1)),
    Tensor("STOP_WORDS_IDS", INT32, (2, -1)),
    Tensor("EMBEDDING_BIAS", FP32, (-1,)),
    Tensor("REQUEST_OUTPUT_LEN", INT32, (1,)),
    Tensor("OUT_END_ID", INT32, (1,)),
    Tensor("OUT_PAD_ID", INT32, (1,)),
)

# ---------------------------------------------------------------- tensorrt_llm
# (name, dtype, dims, optional, ragged). The C++ backend reads [1]-shaped inputs as scalars, so
# NVIDIA's config reshapes them to []; the python stand-in reads them as they come.
_ENGINE_INPUT_SPECS: tuple[tuple[str, DataType, tuple[int, ...], bool, bool], ...] = (
    ("input_ids", INT32, (-1,), True, True),  # optional in v0.19 (encoder-only requests); always sent here
    ("input_lengths", INT32, (1,), False, False),
    ("request_output_len", INT32, (1,), False, False),
    ("end_id", INT32, (1,), True, False),
    ("pad_id", INT32, (1,), True, False),
    ("stop_words_list", INT32, (2, -1), True, True),
    ("bad_words_list", INT32, (2, -1), True, True),
    ("beam_width", INT32, (1,), True, False),
    ("temperature", FP32, (1,), True, False),
    ("runtime_top_k", INT32, (1,), True, False),
    ("runtime_top_p", FP32, (1,), True, False),
    ("len_penalty", FP32, (1,), True, False),
    ("repetition_penalty", FP32, (1,), True, False),
    ("min_length", INT32, (1,), True, False),
    ("presence_penalty", FP32, (1,), True, False),
    ("frequency_penalty", FP32, (1,), True, False),
    ("random_seed", UINT64, (1,), True, False),
    ("return_log_probs", BOOL, (1,), True, False),
    ("return_context_logits", BOOL, (1,), True, False),
    ("return_generation_logits", BOOL, (1,), True, False),
    ("return_perf_metrics", BOOL, (1,), True, False),
    ("num_return_sequences", INT32, (1,), True, False),
    ("exclude_input_in_output", BOOL, (1,), True, False),
    ("stop", BOOL, (1,), True, False),
    ("streaming", BOOL, (1,), True, False),
    # From NVIDIA's preprocessing: decoder ids ([pad_id], ignored for decoder-only models) and the
    # embedding bias over the vocabulary (empty unless the client sent bias words).
    ("decoder_input_ids", INT32, (-1,), True, True),
    ("decoder_input_lengths", INT32, (1,), True, False),
    ("embedding_bias", FP32, (-1,), True, True),
    # Guided decoding (v0.19.0): NVIDIA's guide type (json, json_schema, regex, ebnf_grammar) and its
    # text, TYPE_STRING [1], ragged, not reshaped; the stand-in enforces them with llguidance.
    ("guided_decoding_guide_type", STRING, (1,), True, True),
    ("guided_decoding_guide", STRING, (1,), True, True),
)
# NVIDIA's inputs that the stand-in declares but refuses by name (engine_standin/unsupported_inputs.py says
# why for each): declared on both paths so that NVIDIA's core-model clients reach the engine on the GPU
# path and get a reason, not Triton's "unexpected inference input", on the stand-in.
_STANDIN_REFUSED_INPUT_SPECS: tuple[tuple[str, DataType, tuple[int, ...], bool, bool], ...] = (
    ("runtime_top_p_min", FP32, (1,), True, False),
    ("runtime_top_p_decay", FP32, (1,), True, False),
    ("runtime_top_p_reset_ids", INT32, (1,), True, False),
    ("early_stopping", BOOL, (1,), True, False),
    ("beam_search_diversity_rate", FP32, (1,), True, False),
    ("prompt_embedding_table", FP16, (-1, -1), True, True),
    ("prompt_table_extra_ids", UINT64, (-1,), True, True),
    ("prompt_vocab_size", INT32, (1,), True, False),
    # Speculative decoding driven by the client (NVIDIA's draft-target BLS sends these).
    ("draft_input_ids", INT32, (-1,), True, True),
    ("draft_logits", LOGITS, (-1, -1), True, True),
    ("draft_acceptance_threshold", FP32, (1,), True, False),
    # Per-request lookahead sizes (tensorrtllm_backend v0.19.0), within the engine's configured ones.
    ("lookahead_window_size", INT32, (1,), True, True),
    ("lookahead_ngram_size", INT32, (1,), True, True),
    ("lookahead_verification_set_size", INT32, (1,), True, True),
    # KV-cache retention (executor KvCacheRetentionConfig): priorities of prompt token ranges and of
    # decoded blocks, for eviction and host offload.
    ("retention_token_range_starts", INT32, (-1,), True, True),
    ("retention_token_range_ends", INT32, (-1,), True, True),
    ("retention_token_range_priorities", INT32, (-1,), True, True),
    ("retention_token_range_durations_ms", INT32, (-1,), True, True),
    ("retention_decode_priority", INT32, (1,), True, True),
    ("retention_decode_duration_ms", INT32, (1,), True, True),
)
# [1]-shaped inputs NVIDIA's config.pbtxt (v0.19.0) leaves without `reshape: { shape: [ ] }`.
_NOT_RESHAPED = frozenset(
    {
        "lookahead_window_size",
        "lookahead_ngram_size",
        "lookahead_verification_set_size",
        "retention_decode_priority",
        "retention_decode_duration_ms",
        "guided_decoding_guide_type",
        "guided_decoding_guide",
    }
)
# NVIDIA's LoRA task id on the stand-in, which maps it to a configured adapter (build.lora_adapters); the
# C++ backend declares it below with the LoRA weights and config, which the stand-in does not take.
STANDIN_LORA_INPUTS: tuple[Tensor, ...] = (Tensor("lora_task_id", UINT64, (1,), optional=True),)
# Inputs only NVIDIA's engine implements; the stand-in does not declare them (Triton then rejects them with
# "unexpected inference input" instead of silently ignoring them).
_ENGINE_ONLY_GPU_INPUT_SPECS: tuple[tuple[str, DataType, tuple[int, ...], bool, bool], ...] = (
    ("lora_task_id", UINT64, (1,), True, False),
    ("lora_weights", FP16, (-1, -1), True, True),
    ("lora_config", INT32, (-1, 3), True, True),
)
# NVIDIA's v0.19.0 tensorrt_llm inputs this repository does not declare, and why: Triton answers a request
# that sends one with "unexpected inference input '<name>'" (docs/api.md lists them).
REFUSED_ENGINE_INPUTS: dict[str, str] = {
    "encoder_input_features": "encoder-decoder and multimodal engines (Whisper, mllama) only; text models are served",
    "encoder_output_lengths": "encoder-decoder and multimodal engines only; text models are served",
    "cross_attention_mask": "multimodal cross-attention (mllama) only; text models are served",
    "skip_cross_attn_blocks": "multimodal cross-attention (mllama) only; text models are served",
    "mrope_rotary_cos_sin": "multimodal rotary positions (Qwen2-VL) only; text models are served",
    "mrope_position_deltas": "multimodal rotary positions (Qwen2-VL) only; text models are served",
    "context_phase_params": "disaggregated serving (separate context and generation servers), not configured here",
}

ENGINE_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("output_ids", INT32, (-1, -1)),
    Tensor("sequence_length", INT32, (-1,)),
    Tensor("cum_log_probs", FP32, (-1,)),
    Tensor("output_log_probs", FP32, (-1, -1)),
)
# `ensemble_ids` (ours): the ensemble's inputs, the engine's token outputs under the engine's names.
IDS_ENSEMBLE_OUTPUTS: tuple[Tensor, ...] = tuple(t for t in ENGINE_OUTPUTS if t.name in ("output_ids", "sequence_length"))
# How many preceding tokens the engine sends with each response (`prefix_ids`: up to that many ids that
# precede this response's output_ids; ours, not NVIDIA's).
PREFIX_WINDOW_TOKENS = 8
PREFIX_IDS_OUTPUT = Tensor("prefix_ids", INT32, (-1,))
# Ours, not NVIDIA's: the k most likely tokens at each generated position (OpenAI's top_logprobs /
# completions logprobs), which NVIDIA's C++ backend has no output for (there top_logprobs stays at most 1,
# with greedy decoding). Declared only by our python engines (the tensor stand-in and our llmapi model):
# `num_top_log_probs` (k, 0..MAX_TOP_LOG_PROBS) in; per response [beams, tokens, k] log probs (FP32,
# largest first, log-softmax of the distribution the token was chosen from, as output_log_probs) and their
# token ids out.
MAX_TOP_LOG_PROBS = 20
TOP_LOG_PROBS_INPUT = Tensor("num_top_log_probs", INT32, (1,), optional=True)
TOP_LOG_PROBS_OUTPUT = Tensor("output_top_log_probs", FP32, (-1, -1, -1))
TOP_IDS_OUTPUT = Tensor("output_top_ids", INT32, (-1, -1, -1))
TOP_LOG_PROBS_OUTPUTS: tuple[Tensor, ...] = (TOP_LOG_PROBS_OUTPUT, TOP_IDS_OUTPUT)


def engine_inputs(*, cpp_backend: bool) -> tuple[Tensor, ...]:
    specs = _ENGINE_INPUT_SPECS + _STANDIN_REFUSED_INPUT_SPECS + (_ENGINE_ONLY_GPU_INPUT_SPECS if cpp_backend else ())
    tensors = []
    for name, dtype, dims, optional, ragged in specs:
        scalar = dims == (1,) and cpp_backend and name not in _NOT_RESHAPED
        tensors.append(
            Tensor(name, dtype, dims, optional=optional, allow_ragged_batch=ragged, reshape=() if scalar else None)
        )
    return tuple(tensors)


# ---------------------------------------------------------------- postprocessing
POSTPROCESSING_INPUTS: tuple[Tensor, ...] = (
    Tensor("TOKENS_BATCH", INT32, (-1, -1)),
    Tensor("SEQUENCE_LENGTH", INT32, (-1,)),
    Tensor("PREFIX_IDS", INT32, (-1,), optional=True),
)
POSTPROCESSING_OUTPUTS: tuple[Tensor, ...] = (Tensor("OUTPUT", STRING, (-1,)),)

# ---------------------------------------------------------------- ensemble wiring
# user-facing input -> tensorrt_llm input, for inputs passed straight through (renamed as NVIDIA does)
ENSEMBLE_TO_ENGINE_PASSTHROUGH: tuple[tuple[str, str], ...] = (
    ("runtime_top_k", "top_k"),
    ("runtime_top_p", "top_p"),
    ("temperature", "temperature"),
    ("len_penalty", "length_penalty"),
    ("repetition_penalty", "repetition_penalty"),
    ("min_length", "min_length"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("random_seed", "random_seed"),
    ("return_log_probs", "return_log_probs"),
    ("return_context_logits", "return_context_logits"),
    ("return_generation_logits", "return_generation_logits"),
    ("return_perf_metrics", "return_perf_metrics"),
    ("num_return_sequences", "num_return_sequences"),
    ("beam_width", "beam_width"),
    ("streaming", "stream"),
    ("exclude_input_in_output", "exclude_input_in_output"),
    ("guided_decoding_guide_type", "guided_decoding_guide_type"),
    ("guided_decoding_guide", "guided_decoding_guide"),
)


# Names of the inputs the stand-in declares and refuses (engine_standin/unsupported_inputs.py has the reasons).
STANDIN_REFUSED_INPUT_NAMES: frozenset[str] = frozenset(spec[0] for spec in _STANDIN_REFUSED_INPUT_SPECS)
