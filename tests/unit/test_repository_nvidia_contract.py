"""The rendered repository against NVIDIA's inflight_batcher_llm contract, for a named version.

Everything below marked NVIDIA_* is data read from triton-inference-server/tensorrtllm_backend at tag
v0.19.0 (the last tag holding both the model configs and the C++ backend in that repository):
  * parameter names / types / accepted values: inflight_batcher_llm/src/model_instance_state.cc
    (GetParameter<T>(...) calls, getBatchingTypeFromParams, batch_scheduler_policy and decoding_mode
    parsing) and inflight_batcher_llm/src/model_state.cc (GetParameter<bool>: True/true/TRUE/1,
    False/false/FALSE/0; integers via std::stoi, floats via std::stof);
  * tensors: all_models/inflight_batcher_llm/{ensemble,tensorrt_llm,preprocessing,postprocessing}/config.pbtxt.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from trtllm_truss.planning.plan import ServingPlan
from trtllm_truss.repository import (
    TENSORRTLLM_BACKEND_VERSION,
    DataType,
    repository_configs,
)

try:
    from trtllm_truss.config import RuntimeConfig
except ImportError:
    from trtllm_truss.config.runtime import RuntimeConfig

NVIDIA_VERSION = "v0.19.0"
NVIDIA_SOURCE = "triton-inference-server/tensorrtllm_backend@v0.19.0:inflight_batcher_llm/src/model_instance_state.cc"

_BOOL = frozenset({"True", "true", "TRUE", "1", "False", "false", "FALSE", "0"})
# name -> "int" | "float" | "bool" | "str" | frozenset(accepted values)
NVIDIA_TENSORRTLLM_PARAMETERS: dict[str, object] = {
    "gpt_model_type": frozenset({"V1", "v1", "inflight_batching", "inflight_fused_batching"}),
    "gpt_model_path": "str",
    "encoder_model_path": "str",
    "max_beam_width": "int",
    "max_tokens_in_paged_kv_cache": "int",
    "max_attention_window_size": "str",  # comma-separated ints
    "sink_token_length": "int",
    "batch_scheduler_policy": frozenset({"max_utilization", "guaranteed_no_evict"}),
    "kv_cache_free_gpu_mem_fraction": "float",
    "cross_kv_cache_fraction": "float",
    "kv_cache_host_memory_bytes": "int",
    "kv_cache_onboard_blocks": "bool",
    "exclude_input_in_output": "bool",
    "cancellation_check_period_ms": "int",
    "stats_check_period_ms": "int",
    "iter_stats_max_iterations": "int",
    "request_stats_max_iterations": "int",
    "enable_kv_cache_reuse": "bool",
    "normalize_log_probs": "bool",
    "enable_chunked_context": "bool",
    "gpu_device_ids": "str",
    "participant_ids": "str",
    "num_nodes": "int",
    "lora_cache_optimal_adapter_size": "int",
    "lora_cache_max_adapter_size": "int",
    "lora_cache_gpu_memory_fraction": "float",
    "lora_cache_host_memory_bytes": "int",
    "lora_prefetch_dir": "str",
    "decoding_mode": frozenset(
        {"top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle"}
    ),
    "executor_worker_path": "str",
    "lookahead_window_size": "int",
    "lookahead_ngram_size": "int",
    "lookahead_verification_set_size": "int",
    "medusa_choices": "str",
    "eagle_choices": "str",
    "gpu_weights_percent": "float",
    "enable_context_fmha_fp32_acc": "bool",
    "multi_block_mode": "bool",
    "cuda_graph_mode": "bool",
    "cuda_graph_cache_size": "int",
    "speculative_decoding_fast_logits": "bool",
    "tokenizer_dir": "str",
    "guided_decoding_backend": "str",
    "xgrammar_tokenizer_info_path": "str",
    "recv_poll_period_ms": "int",
}

# (name, data_type, dims, optional) from the v0.19.0 ensemble config.pbtxt (the inputs we expose).
NVIDIA_ENSEMBLE_INPUTS = {
    "text_input": ("TYPE_STRING", (1,), False),
    "decoder_text_input": ("TYPE_STRING", (1,), True),
    "max_tokens": ("TYPE_INT32", (1,), False),
    "num_return_sequences": ("TYPE_INT32", (1,), True),
    "bad_words": ("TYPE_STRING", (-1,), True),
    "stop_words": ("TYPE_STRING", (-1,), True),
    "end_id": ("TYPE_INT32", (1,), True),
    "pad_id": ("TYPE_INT32", (1,), True),
    "top_k": ("TYPE_INT32", (1,), True),
    "top_p": ("TYPE_FP32", (1,), True),
    "temperature": ("TYPE_FP32", (1,), True),
    "length_penalty": ("TYPE_FP32", (1,), True),
    "repetition_penalty": ("TYPE_FP32", (1,), True),
    "min_length": ("TYPE_INT32", (1,), True),
    "presence_penalty": ("TYPE_FP32", (1,), True),
    "frequency_penalty": ("TYPE_FP32", (1,), True),
    "random_seed": ("TYPE_UINT64", (1,), True),
    "return_log_probs": ("TYPE_BOOL", (1,), True),
    "return_context_logits": ("TYPE_BOOL", (1,), True),
    "return_generation_logits": ("TYPE_BOOL", (1,), True),
    "return_perf_metrics": ("TYPE_BOOL", (1,), True),
    "beam_width": ("TYPE_INT32", (1,), True),
    "stream": ("TYPE_BOOL", (1,), True),
    "exclude_input_in_output": ("TYPE_BOOL", (1,), True),
    "embedding_bias_words": ("TYPE_STRING", (-1,), True),
    "embedding_bias_weights": ("TYPE_FP32", (-1,), True),
    "guided_decoding_guide_type": ("TYPE_STRING", (1,), True),
    "guided_decoding_guide": ("TYPE_STRING", (1,), True),
}
# The engine's outputs a response carries only when asked for (v0.19.0 tensorrt_llm and ensemble
# config.pbtxt; the ensemble passes them through under the same names).
NVIDIA_OPTIONAL_ENGINE_OUTPUTS = {
    "context_logits": ("TYPE_FP32", (-1, -1)),  # ${logits_datatype}: TYPE_FP32 by default
    "generation_logits": ("TYPE_FP32", (-1, -1, -1)),
    "batch_index": ("TYPE_INT32", (1,)),
    "sequence_index": ("TYPE_INT32", (1,)),
    "kv_cache_alloc_new_blocks": ("TYPE_INT32", (1,)),
    "kv_cache_reused_blocks": ("TYPE_INT32", (1,)),
    "kv_cache_alloc_total_blocks": ("TYPE_INT32", (1,)),
    "arrival_time_ns": ("TYPE_INT64", (1,)),
    "first_scheduled_time_ns": ("TYPE_INT64", (1,)),
    "first_token_time_ns": ("TYPE_INT64", (1,)),
    "last_token_time_ns": ("TYPE_INT64", (1,)),
    "acceptance_rate": ("TYPE_FP32", (1,)),
    "total_accepted_draft_tokens": ("TYPE_INT32", (1,)),
    "total_draft_tokens": ("TYPE_INT32", (1,)),
}
NVIDIA_ENSEMBLE_OUTPUTS = {
    "text_output": ("TYPE_STRING", (-1,)),
    "cum_log_probs": ("TYPE_FP32", (-1,)),
    "output_log_probs": ("TYPE_FP32", (-1, -1)),
    **NVIDIA_OPTIONAL_ENGINE_OUTPUTS,
}
# tensorrt_llm inputs of v0.19.0: (data_type, dims, optional, reshaped to a scalar)
NVIDIA_ENGINE_INPUTS = {
    "input_ids": ("TYPE_INT32", (-1,), True, False),
    "input_lengths": ("TYPE_INT32", (1,), False, True),
    "request_output_len": ("TYPE_INT32", (1,), False, True),
    "end_id": ("TYPE_INT32", (1,), True, True),
    "pad_id": ("TYPE_INT32", (1,), True, True),
    "stop_words_list": ("TYPE_INT32", (2, -1), True, False),
    "bad_words_list": ("TYPE_INT32", (2, -1), True, False),
    "embedding_bias": ("TYPE_FP32", (-1,), True, False),
    "decoder_input_ids": ("TYPE_INT32", (-1,), True, False),
    "decoder_input_lengths": ("TYPE_INT32", (1,), True, True),
    "beam_width": ("TYPE_INT32", (1,), True, True),
    "temperature": ("TYPE_FP32", (1,), True, True),
    "runtime_top_k": ("TYPE_INT32", (1,), True, True),
    "runtime_top_p": ("TYPE_FP32", (1,), True, True),
    "runtime_top_p_min": ("TYPE_FP32", (1,), True, True),
    "runtime_top_p_decay": ("TYPE_FP32", (1,), True, True),
    "runtime_top_p_reset_ids": ("TYPE_INT32", (1,), True, True),
    "len_penalty": ("TYPE_FP32", (1,), True, True),
    "early_stopping": ("TYPE_BOOL", (1,), True, True),
    "repetition_penalty": ("TYPE_FP32", (1,), True, True),
    "min_length": ("TYPE_INT32", (1,), True, True),
    "beam_search_diversity_rate": ("TYPE_FP32", (1,), True, True),
    "presence_penalty": ("TYPE_FP32", (1,), True, True),
    "frequency_penalty": ("TYPE_FP32", (1,), True, True),
    "random_seed": ("TYPE_UINT64", (1,), True, True),
    "return_log_probs": ("TYPE_BOOL", (1,), True, True),
    "return_context_logits": ("TYPE_BOOL", (1,), True, True),
    "return_generation_logits": ("TYPE_BOOL", (1,), True, True),
    "return_perf_metrics": ("TYPE_BOOL", (1,), True, True),
    "exclude_input_in_output": ("TYPE_BOOL", (1,), True, True),
    "stop": ("TYPE_BOOL", (1,), True, True),
    "streaming": ("TYPE_BOOL", (1,), True, True),
    "num_return_sequences": ("TYPE_INT32", (1,), True, True),
    "prompt_embedding_table": ("TYPE_FP16", (-1, -1), True, False),
    "prompt_vocab_size": ("TYPE_INT32", (1,), True, True),
    "lora_task_id": ("TYPE_UINT64", (1,), True, True),
    "lora_weights": ("TYPE_FP16", (-1, -1), True, False),
    "lora_config": ("TYPE_INT32", (-1, 3), True, False),
    "prompt_table_extra_ids": ("TYPE_UINT64", (-1,), True, False),
    "draft_input_ids": ("TYPE_INT32", (-1,), True, False),
    "draft_logits": ("TYPE_FP32", (-1, -1), True, False),  # ${logits_datatype}
    "draft_acceptance_threshold": ("TYPE_FP32", (1,), True, True),
    "lookahead_window_size": ("TYPE_INT32", (1,), True, False),
    "lookahead_ngram_size": ("TYPE_INT32", (1,), True, False),
    "lookahead_verification_set_size": ("TYPE_INT32", (1,), True, False),
    "retention_token_range_starts": ("TYPE_INT32", (-1,), True, False),
    "retention_token_range_ends": ("TYPE_INT32", (-1,), True, False),
    "retention_token_range_priorities": ("TYPE_INT32", (-1,), True, False),
    "retention_token_range_durations_ms": ("TYPE_INT32", (-1,), True, False),
    "retention_decode_priority": ("TYPE_INT32", (1,), True, False),
    "retention_decode_duration_ms": ("TYPE_INT32", (1,), True, False),
    "guided_decoding_guide_type": ("TYPE_STRING", (1,), True, False),
    "guided_decoding_guide": ("TYPE_STRING", (1,), True, False),
}
NVIDIA_ENGINE_OUTPUTS = {
    "output_ids": ("TYPE_INT32", (-1, -1)),
    "sequence_length": ("TYPE_INT32", (-1,)),
    "cum_log_probs": ("TYPE_FP32", (-1,)),
    "output_log_probs": ("TYPE_FP32", (-1, -1)),
    **NVIDIA_OPTIONAL_ENGINE_OUTPUTS,
}
NVIDIA_PREPROCESSING_INPUTS = {
    "QUERY": ("TYPE_STRING", (1,), False),
    "REQUEST_OUTPUT_LEN": ("TYPE_INT32", (1,), False),
    "BAD_WORDS_DICT": ("TYPE_STRING", (-1,), True),
    "STOP_WORDS_DICT": ("TYPE_STRING", (-1,), True),
    "END_ID": ("TYPE_INT32", (1,), True),
    "PAD_ID": ("TYPE_INT32", (1,), True),
    "DECODER_QUERY": ("TYPE_STRING", (1,), True),
    "EMBEDDING_BIAS_WORDS": ("TYPE_STRING", (-1,), True),
    "EMBEDDING_BIAS_WEIGHTS": ("TYPE_FP32", (-1,), True),
}
# preprocessing outputs of v0.19.0 for text models (OUT_PROMPT_TABLE_EXTRA_IDS and the multimodal
# outputs are left out: this repository serves text models only)
NVIDIA_PREPROCESSING_OUTPUTS = {
    "INPUT_ID": ("TYPE_INT32", (-1,)),
    "REQUEST_INPUT_LEN": ("TYPE_INT32", (1,)),
    "DECODER_INPUT_ID": ("TYPE_INT32", (-1,)),
    "REQUEST_DECODER_INPUT_LEN": ("TYPE_INT32", (1,)),
    "BAD_WORDS_IDS": ("TYPE_INT32", (2, -1)),
    "STOP_WORDS_IDS": ("TYPE_INT32", (2, -1)),
    "EMBEDDING_BIAS": ("TYPE_FP32", (-1,)),
    "REQUEST_OUTPUT_LEN": ("TYPE_INT32", (-1,)),
    "OUT_END_ID": ("TYPE_INT32", (1,)),
    "OUT_PAD_ID": ("TYPE_INT32", (1,)),
}
NVIDIA_POSTPROCESSING_INPUTS = {"TOKENS_BATCH": ("TYPE_INT32", (-1, -1), False), "SEQUENCE_LENGTH": ("TYPE_INT32", (-1,), False)}


def _plan(backend: str = "tensorrtllm", **runtime: object) -> ServingPlan:
    return ServingPlan(
        backend=backend,  # type: ignore[arg-type]
        tokenizer_dir=Path("/models/tokenizer"),
        engine_dir=Path("/models/engine"),
        model_dir=Path("/models/hf"),
        max_batch_size=16,
        max_input_len=1024,
        max_output_len=512,
        max_beam_width=2,
        runtime=RuntimeConfig(**runtime),
    )


def _accepts(kind: object, value: str) -> bool:
    """Would NVIDIA's GetParameter<T> parse `value` (std::stoi / std::stof / the bool spellings)?"""
    if isinstance(kind, frozenset):
        return value in kind
    if kind == "bool":
        return value in _BOOL
    if kind == "int":
        return re.fullmatch(r"-?[0-9]+", value) is not None
    if kind == "float":
        return re.fullmatch(r"-?[0-9]+(\.[0-9]*)?([eE]-?[0-9]+)?", value) is not None
    return value != ""


def test_contract_version_is_named() -> None:
    assert TENSORRTLLM_BACKEND_VERSION == NVIDIA_VERSION


@pytest.mark.parametrize(
    "runtime",
    [
        {},
        {
            "max_tokens_in_paged_kv_cache": 40960,
            "kv_cache_free_gpu_mem_fraction": 0.55,
            "batch_scheduler_policy": "max_utilization",
            "enable_kv_cache_reuse": True,
            "enable_chunked_context": True,
            "exclude_input_in_output": False,
            "lora_cache_optimal_adapter_size": 8,
            "lora_cache_max_adapter_size": 64,
            "lora_cache_gpu_memory_fraction": 0.05,
            "lora_cache_host_memory_bytes": 1 << 30,
        },
    ],
)
def test_gpu_parameters_use_nvidia_names_and_accepted_values(runtime: dict) -> None:
    engine = repository_configs(_plan(**runtime))["tensorrt_llm"]
    assert engine.backend == "tensorrtllm" and engine.decoupled is True
    params = engine.parameter_dict
    for name, value in params.items():
        assert name in NVIDIA_TENSORRTLLM_PARAMETERS, f"{name}: not a parameter of {NVIDIA_SOURCE}"
        assert _accepts(NVIDIA_TENSORRTLLM_PARAMETERS[name], value), f"{name}={value!r} rejected by {NVIDIA_SOURCE}"
        assert "${" not in value
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["gpt_model_path"] == "/models/engine"
    assert params["max_beam_width"] == "2"
    expected = RuntimeConfig(**runtime)
    assert float(params["kv_cache_free_gpu_mem_fraction"]) == expected.kv_cache_free_gpu_mem_fraction
    assert params["batch_scheduler_policy"] == str(getattr(expected.batch_scheduler_policy, "value", expected.batch_scheduler_policy))
    assert params["enable_kv_cache_reuse"] == str(expected.enable_kv_cache_reuse).lower()
    assert params["enable_chunked_context"] == str(expected.enable_chunked_context).lower()
    assert params["exclude_input_in_output"] == str(expected.exclude_input_in_output).lower()
    for name in ("lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size", "lora_cache_host_memory_bytes"):
        assert params.get(name) == (None if getattr(expected, name) is None else str(getattr(expected, name)))
    if expected.lora_cache_gpu_memory_fraction is not None:
        assert float(params["lora_cache_gpu_memory_fraction"]) == expected.lora_cache_gpu_memory_fraction
    if expected.max_tokens_in_paged_kv_cache is None:
        assert "max_tokens_in_paged_kv_cache" not in params  # unset: omitted, never an empty or ${...} value
    else:
        assert params["max_tokens_in_paged_kv_cache"] == str(expected.max_tokens_in_paged_kv_cache)


def test_gpu_queue_settings_come_from_runtime() -> None:
    engine = repository_configs(_plan(max_queue_delay_microseconds=250, max_queue_size=77))["tensorrt_llm"]
    assert engine.dynamic_batching is not None
    assert engine.dynamic_batching.max_queue_delay_microseconds == 250
    assert engine.dynamic_batching.max_queue_size == 77
    assert engine.dynamic_batching.preferred_batch_size == (16,)


def _check_inputs(config, expected: dict, *, check_reshape: bool) -> None:
    for name, spec in expected.items():
        tensor = config.input(name)
        data_type, dims, optional = spec[:3]
        assert (tensor.data_type.value, tensor.dims, tensor.optional) == (data_type, dims, optional), name
        if check_reshape:
            assert (tensor.reshape == ()) is spec[3], name


@pytest.mark.parametrize("backend", ["tensorrtllm", "pytorch"])
def test_ensemble_and_python_model_tensors_match_nvidia(backend: str) -> None:
    configs = repository_configs(_plan(backend))
    ensemble = configs["ensemble"]
    _check_inputs(ensemble, NVIDIA_ENSEMBLE_INPUTS, check_reshape=False)
    assert {t.name for t in ensemble.inputs} == set(NVIDIA_ENSEMBLE_INPUTS)
    for name, (data_type, dims) in NVIDIA_ENSEMBLE_OUTPUTS.items():
        assert (ensemble.output(name).data_type.value, ensemble.output(name).dims) == (data_type, dims)
    _check_inputs(configs["preprocessing"], NVIDIA_PREPROCESSING_INPUTS, check_reshape=False)
    preprocessing = configs["preprocessing"]
    assert {t.name for t in preprocessing.outputs} == set(NVIDIA_PREPROCESSING_OUTPUTS)
    for name, (data_type, dims) in NVIDIA_PREPROCESSING_OUTPUTS.items():
        if name != "REQUEST_OUTPUT_LEN":  # NVIDIA declares [-1] and sends [1]; ours declares [1]
            assert (preprocessing.output(name).data_type.value, preprocessing.output(name).dims) == (data_type, dims), name
    _check_inputs(configs["postprocessing"], NVIDIA_POSTPROCESSING_INPUTS, check_reshape=False)
    assert configs["postprocessing"].input("PREFIX_IDS").optional  # our addition must not break NVIDIA's wiring


def test_gpu_engine_tensors_match_nvidia() -> None:
    engine = repository_configs(_plan())["tensorrt_llm"]
    _check_inputs(engine, NVIDIA_ENGINE_INPUTS, check_reshape=True)
    for name, (data_type, dims) in NVIDIA_ENGINE_OUTPUTS.items():
        assert (engine.output(name).data_type.value, engine.output(name).dims) == (data_type, dims), name
    assert "prefix_ids" not in {t.name for t in engine.outputs}  # NVIDIA's engine has no such output


def test_stand_in_engine_declares_the_subset_it_implements() -> None:
    engine = repository_configs(_plan("pytorch"))["tensorrt_llm"]
    assert engine.backend == "python" and engine.decoupled is True
    # Ours beside NVIDIA's: num_top_log_probs (repository/interface.py), with its two outputs.
    names = {t.name for t in engine.inputs} - {"num_top_log_probs"}
    assert names <= set(NVIDIA_ENGINE_INPUTS)
    assert {"output_top_log_probs", "output_top_ids"} <= {t.name for t in engine.outputs}
    for tensor in (t for t in engine.inputs if t.name in names):
        data_type, dims, optional, _ = NVIDIA_ENGINE_INPUTS[tensor.name]
        assert (tensor.data_type.value, tensor.dims, tensor.optional) == (data_type, dims, optional)
        assert tensor.reshape is None
    assert engine.output("prefix_ids").data_type is DataType.INT32
    # Every output NVIDIA's engine declares (context_phase_params, disaggregated serving, aside).
    for name, (data_type, dims) in NVIDIA_ENGINE_OUTPUTS.items():
        assert (engine.output(name).data_type.value, engine.output(name).dims) == (data_type, dims), name
    for name in ("num_return_sequences", "return_context_logits", "return_generation_logits", "return_perf_metrics"):
        assert engine.input(name).optional, name


@pytest.mark.parametrize("backend", ["tensorrtllm", "pytorch"])
def test_stop_and_bad_words_are_wired_to_the_engine(backend: str) -> None:
    """Older trusses computed the ids in preprocessing and never mapped them to the engine."""
    ensemble = repository_configs(_plan(backend))["ensemble"]
    pre, engine, post = ensemble.ensemble_steps
    # NVIDIA's engine sends no prefix_ids, so on the GPU path the relay stands in front of it.
    engine_step = "tensorrt_llm_window" if backend == "tensorrtllm" else "tensorrt_llm"
    assert (pre.model_name, engine.model_name, post.model_name) == ("preprocessing", engine_step, "postprocessing")
    pre_in, pre_out = dict(pre.input_map), dict(pre.output_map)
    engine_in = dict(engine.input_map)
    assert pre_in["STOP_WORDS_DICT"] == "stop_words" and pre_in["BAD_WORDS_DICT"] == "bad_words"
    assert engine_in["stop_words_list"] == pre_out["STOP_WORDS_IDS"]
    assert engine_in["bad_words_list"] == pre_out["BAD_WORDS_IDS"]
    # NVIDIA's renames on the way to the engine
    for engine_name, user_name in [
        ("runtime_top_k", "top_k"),
        ("runtime_top_p", "top_p"),
        ("len_penalty", "length_penalty"),
        ("streaming", "stream"),
        ("random_seed", "random_seed"),
        ("exclude_input_in_output", "exclude_input_in_output"),
        ("end_id", pre_out["OUT_END_ID"]),
        ("pad_id", pre_out["OUT_PAD_ID"]),
    ]:
        assert engine_in[engine_name] == user_name, engine_name


@pytest.mark.parametrize("backend", ["tensorrtllm", "pytorch"])
def test_every_ensemble_tensor_is_produced_and_consumed(backend: str) -> None:
    configs = repository_configs(_plan(backend))
    ensemble = configs["ensemble"]
    produced = {t.name for t in ensemble.inputs}
    for step in ensemble.ensemble_steps:
        model = configs[step.model_name]
        for model_input, tensor in step.input_map:
            model.input(model_input)  # exists on the step's model
            assert tensor in produced, f"{step.model_name}.{model_input} <- {tensor}: nothing produces it"
        for model_output, tensor in step.output_map:
            model.output(model_output)
            produced.add(tensor)
    for output in ensemble.outputs:
        assert output.name in produced
    # Every user-facing input reaches some step.
    consumed = {tensor for step in ensemble.ensemble_steps for _, tensor in step.input_map}
    assert {t.name for t in ensemble.inputs} <= consumed


def test_gpu_window_relay_forwards_what_nvidia_engine_accepts() -> None:
    configs = repository_configs(_plan())
    relay, engine = configs["tensorrt_llm_window"], configs["tensorrt_llm"]
    assert relay.backend == "python" and relay.decoupled is True
    assert relay.parameter_dict["engine_model"] == "tensorrt_llm"
    for tensor in relay.inputs:  # forwarded unchanged by BLS, so they must fit the engine's inputs
        target = engine.input(tensor.name)
        assert (tensor.data_type, tensor.dims, tensor.optional) == (target.data_type, target.dims, target.optional)
    for tensor in relay.outputs:
        if tensor.name != "prefix_ids":
            assert engine.output(tensor.name).data_type == tensor.data_type
    post_inputs = dict(configs["ensemble"].ensemble_steps[2].input_map)
    assert "PREFIX_IDS" in post_inputs


def test_relay_can_be_forced_or_disabled() -> None:
    assert "tensorrt_llm_window" not in repository_configs(_plan("pytorch"))
    forced = repository_configs(_plan("pytorch"), window_relay=True)
    assert forced["ensemble"].ensemble_steps[1].model_name == "tensorrt_llm_window"
    plain_gpu = repository_configs(_plan(), window_relay=False)
    assert "tensorrt_llm_window" not in plain_gpu
    assert "PREFIX_IDS" not in dict(plain_gpu["ensemble"].ensemble_steps[2].input_map)
