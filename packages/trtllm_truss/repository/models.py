"""Build the `ModelConfig`s of the repository from a `ServingPlan`.

ensemble = preprocessing -> tensorrt_llm -> postprocessing (NVIDIA's text-in, text-out interface).
ensemble_ids = preprocessing -> tensorrt_llm: the same inputs, token ids out; the truss proxy streams
from it and detokenizes itself, so no streamed token crosses a python-backend model (see
docs/performance.md). `tensorrt_llm` is NVIDIA's C++ backend (`backend: "tensorrtllm"`) on the GPU
path, our LLM-API model (`backend: llmapi`: TensorRT-LLM's LLM API behind NVIDIA's tensor interface), or
our python-backend stand-in (`backend: pytorch`).
"""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_truss.planning import lora
from trtllm_truss.guides.engines import XGRAMMAR
from trtllm_truss.repository import interface as nv
from trtllm_truss.repository.interface import PREFIX_WINDOW_TOKENS
from trtllm_truss.repository.model_config import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    ModelConfig,
)
from trtllm_truss.planning.speculation import backend_parameters

if TYPE_CHECKING:
    from trtllm_truss.planning.plan import ServingPlan

ENSEMBLE, PREPROCESSING, ENGINE, POSTPROCESSING = "ensemble", "preprocessing", "tensorrt_llm", "postprocessing"
IDS_ENSEMBLE = "ensemble_ids"
MODEL_NAMES = (ENSEMBLE, IDS_ENSEMBLE, PREPROCESSING, ENGINE, POSTPROCESSING)
# Relay between the ensemble and an engine that cannot send `prefix_ids` (NVIDIA's C++ backend).
WINDOW_RELAY = "tensorrt_llm_window"

# Version of NVIDIA's backend whose parameter names and accepted values the GPU config follows.
TENSORRTLLM_BACKEND_VERSION = "v0.19.0"
BATCHING_STRATEGY = "inflight_fused_batching"


class RepositoryError(ValueError):
    """The plan cannot be rendered; the message names the plan field."""


def _flag(value: bool) -> str:
    # NVIDIA's C++ backend accepts true/false/1/0 (model_state.cc); one spelling everywhere.
    return "true" if value else "false"


def _enum_value(value: Any) -> str:
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


def _parameters(*pairs: tuple[str, Any]) -> tuple[tuple[str, str], ...]:
    """Parameters with unset (None) values omitted — never written as an empty or ${...} value."""
    out = []
    for key, value in pairs:
        if value is None:
            continue
        out.append((key, _flag(value) if isinstance(value, bool) else _enum_value(value)))
    return tuple(out)


def _queue(plan: ServingPlan, *, preferred: bool) -> DynamicBatching:
    return DynamicBatching(
        max_queue_delay_microseconds=plan.runtime.max_queue_delay_microseconds,
        preferred_batch_size=(plan.max_batch_size,) if preferred else (),
        max_queue_size=plan.runtime.max_queue_size,
    )


def preprocessing_config(plan: ServingPlan) -> ModelConfig:
    return ModelConfig(
        name=PREPROCESSING,
        backend="python",
        max_batch_size=plan.max_batch_size,
        # No queue delay: take whatever is already queued as one batch and tokenize it in one call.
        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=0),
        inputs=nv.PREPROCESSING_INPUTS,
        outputs=nv.PREPROCESSING_OUTPUTS,
        instance_groups=(InstanceGroup(plan.runtime.preprocessing_instance_count),),
        parameters=_parameters(
            ("tokenizer_dir", str(plan.tokenizer_dir)),
            ("add_special_tokens", True),
            ("max_input_len", plan.max_input_len),
            ("max_output_len", plan.max_output_len),
        ),
    )


def postprocessing_config(plan: ServingPlan) -> ModelConfig:
    return ModelConfig(
        name=POSTPROCESSING,
        backend="python",
        max_batch_size=plan.max_batch_size,
        # Several instances decode responses of one stream concurrently; Triton must hand the
        # results back in arrival order or streamed chunks would be reordered.
        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=0, preserve_ordering=True),
        inputs=nv.POSTPROCESSING_INPUTS,
        outputs=nv.POSTPROCESSING_OUTPUTS,
        instance_groups=(InstanceGroup(plan.runtime.postprocessing_instance_count),),
        parameters=_parameters(("tokenizer_dir", str(plan.tokenizer_dir)), ("skip_special_tokens", True)),
    )


def tensorrtllm_engine_config(plan: ServingPlan, xgrammar_tokenizer_info: Path | None = None) -> ModelConfig:
    """NVIDIA's C++ backend; parameter names/values as read by its model_instance_state.cc.
    `xgrammar_tokenizer_info`: where the renderer writes NVIDIA's tokenizer info for xgrammar
    (guides.engines); required when this deployment enforces guides."""
    if plan.engine_dir is None:
        raise RepositoryError("plan.engine_dir: required for backend 'tensorrtllm' (the built engine directory)")
    runtime = plan.runtime
    guided: tuple[tuple[str, Any], ...] = ()
    if plan.guided_decoding_off is None:
        if xgrammar_tokenizer_info is None:
            raise RepositoryError("xgrammar_tokenizer_info: required where guided decoding is on (the renderer writes it)")
        guided = (("guided_decoding_backend", XGRAMMAR), ("xgrammar_tokenizer_info_path", str(xgrammar_tokenizer_info)))
    return ModelConfig(
        name=ENGINE,
        backend="tensorrtllm",
        max_batch_size=plan.max_batch_size,
        decoupled=runtime.decoupled_mode,  # streaming needs it; non-streamed requests get one response
        dynamic_batching=_queue(plan, preferred=True),
        inputs=nv.engine_inputs(cpp_backend=True),
        outputs=nv.ENGINE_OUTPUTS + nv.ENGINE_OPTIONAL_OUTPUTS,
        instance_groups=(InstanceGroup(1),),  # the backend drives all GPUs of the rank itself
        parameters=_parameters(
            ("gpt_model_type", BATCHING_STRATEGY),
            ("gpt_model_path", str(plan.engine_dir)),
            ("max_beam_width", plan.max_beam_width),
            ("batch_scheduler_policy", runtime.batch_scheduler_policy),
            ("kv_cache_free_gpu_mem_fraction", runtime.kv_cache_free_gpu_mem_fraction),
            ("max_tokens_in_paged_kv_cache", runtime.max_tokens_in_paged_kv_cache),
            ("enable_kv_cache_reuse", runtime.enable_kv_cache_reuse),
            ("enable_chunked_context", runtime.enable_chunked_context),
            ("exclude_input_in_output", runtime.exclude_input_in_output),
            ("kv_cache_host_memory_bytes", runtime.kv_cache_host_memory_bytes),
            ("kv_cache_onboard_blocks", runtime.kv_cache_onboard_blocks),
            *((name, getattr(runtime, name)) for name in lora.LORA_CACHE_KEYS),
            *backend_parameters(plan.speculative),
            *guided,
        ),
        extra={"nvidia_backend_version": TENSORRTLLM_BACKEND_VERSION},
    )


def standin_instance_count(plan: ServingPlan) -> int:
    """Engine instances of the stand-in: as configured, else 1 for a model (each would load it) and
    one per 2 cores (1..16, as the llmapi model) for the synthetic engine, whose cap is the IPC cost of each response
    (docs/design.md, "The engine stand-in"). Never more than max_batch_size (each needs a slot)."""
    pytorch = plan.runtime.pytorch
    count = pytorch.instance_count
    if count is None:
        count = max(1, min(16, (os.cpu_count() or 1) // 2)) if pytorch.synthetic is not None else 1
        return min(count, plan.max_batch_size)
    if count > plan.max_batch_size:
        raise RepositoryError(
            f"runtime.pytorch.instance_count: {count} exceeds max_batch_size {plan.max_batch_size}"
            " (each instance runs a share of the batch)"
        )
    return count


def pytorch_engine_config(plan: ServingPlan) -> ModelConfig:
    """The python-backend stand-in (triton_models/tensorrt_llm_pytorch/model.py)."""
    model_dir = plan.model_dir
    runtime = plan.runtime
    pytorch = runtime.pytorch
    if model_dir is None:
        raise RepositoryError("plan.model_dir: required for backend 'pytorch' (the Hugging Face checkpoint to run)")
    synthetic = pytorch.synthetic
    # Each instance batches continuously across its requests, with its share of max_batch_size.
    return _python_engine_config(
        plan,
        standin_instance_count(plan),
        _parameters(
            ("model_dir", str(model_dir)),
            ("tokenizer_dir", str(plan.tokenizer_dir)),
            ("max_batch_size", plan.max_batch_size),
            ("max_input_len", plan.max_input_len),
            ("max_output_len", plan.max_output_len),
            ("max_beam_width", plan.max_beam_width),
            ("max_num_sequences", runtime.max_num_sequences),
            ("exclude_input_in_output", runtime.exclude_input_in_output),
            ("device", pytorch.device),
            ("num_threads", pytorch.num_threads),
            ("synthetic", synthetic is not None),
            ("synthetic_step_time_ms", synthetic.step_time_ms if synthetic is not None else None),
            ("prefix_window_tokens", PREFIX_WINDOW_TOKENS),
            ("sender_threads", pytorch.sender_threads),
            ("merge_responses", pytorch.merge_responses),
            ("stream_interval", runtime.stream_interval),
            # runtime.guided_decoding_backend resolved (guides.engines.guide_engine): the engine the stand-in masks with.
            ("guided_decoding_backend", plan.guide_engine or "none"),
            ("guided_whitespace", pytorch.guided_whitespace),  # runtime.pytorch.guided_whitespace
            ("guide_cache_bytes", pytorch.guide_cache_bytes),  # runtime.pytorch.guide_cache_bytes, per instance
            # build.lora_adapters: NVIDIA's lora_task_id -> adapter (engine_standin/settings.py).
            ("lora_adapters", lora.stand_in_parameter(plan.lora_adapters) if plan.lora_adapters else None),
            ("lora_max_loras", getattr(plan.lora_configuration, "max_loras", None)),
            # The paged KV block pool and prefix reuse (engine_standin/kv_blocks.py), its events and prefill cost.
            ("tokens_per_block", plan.tokens_per_block),
            ("enable_kv_cache_reuse", runtime.enable_kv_cache_reuse),
            ("max_tokens_in_paged_kv_cache", runtime.max_tokens_in_paged_kv_cache),
            ("event_buffer_max_size", runtime.event_buffer_max_size),
            ("synthetic_prefill_time_per_token_ms", synthetic.prefill_time_per_token_ms if synthetic is not None else None),
        ),
    )


def _python_engine_config(plan: ServingPlan, instances: int, parameters: tuple[tuple[str, str], ...]) -> ModelConfig:
    """The `tensorrt_llm` model as one of our python models (the stand-in, our llmapi model): NVIDIA's
    tensor interface, plus our LoRA-by-name and top-k log-prob tensors."""
    return ModelConfig(
        name=ENGINE,
        backend="python",
        max_batch_size=plan.max_batch_size,
        decoupled=plan.runtime.decoupled_mode,
        dynamic_batching=_queue(plan, preferred=False),
        inputs=nv.engine_inputs(cpp_backend=False) + nv.STANDIN_LORA_INPUTS + (nv.TOP_LOG_PROBS_INPUT,),
        outputs=nv.ENGINE_OUTPUTS + nv.ENGINE_OPTIONAL_OUTPUTS + (nv.PREFIX_IDS_OUTPUT, *nv.TOP_LOG_PROBS_OUTPUTS),
        instance_groups=(InstanceGroup(instances),),
        parameters=parameters,
    )


# Our llmapi model's `llm_api` parameter: TensorRT-LLM's LLM API, or its double where TensorRT-LLM cannot run.
LLM_API_REAL, LLM_API_DOUBLE = "tensorrt_llm", "double"


def llmapi_engine_config(plan: ServingPlan) -> ModelConfig:
    """Our llmapi model (triton_models/tensorrt_llm_llmapi/model.py): NVIDIA's tensor interface in front of
    `tensorrt_llm.LLM`, `llmapi_instance_count` instances, all clients of one LLM (their LLM host, which one
    of them starts), configured by its `1/model.yaml`."""
    if plan.model_dir is None or plan.build is None:
        raise RepositoryError("plan.model_dir: backend llmapi needs the build section and the checkpoint folder")
    runtime = plan.runtime
    double = plan.llm_api_double
    # runtime.pytorch.synthetic: the double's stand-in engine only (planning refuses it with TensorRT-LLM).
    synthetic = runtime.pytorch.synthetic if double else None
    return _python_engine_config(
        plan,
        llmapi_instance_count(plan),
        _parameters(
            ("llm_api", LLM_API_DOUBLE if double else LLM_API_REAL),
            # The double's own settings (no LLM() argument of NVIDIA's, so not in model.yaml), named as the
            # stand-in's parameters (pytorch_engine_config): runtime.pytorch.guided_whitespace and .synthetic.
            ("guided_whitespace", runtime.pytorch.guided_whitespace if double else None),
            ("synthetic", True if synthetic is not None else None),
            ("synthetic_step_time_ms", synthetic.step_time_ms if synthetic is not None else None),
            ("synthetic_prefill_time_per_token_ms", synthetic.prefill_time_per_token_ms if synthetic is not None else None),
            ("tokenizer_dir", str(plan.tokenizer_dir)),
            ("max_input_len", plan.max_input_len),
            ("max_output_len", plan.max_output_len),
            ("exclude_input_in_output", runtime.exclude_input_in_output),
            ("prefix_window_tokens", PREFIX_WINDOW_TOKENS),
            ("lora_adapters", lora.stand_in_parameter(plan.lora_adapters) if plan.lora_adapters else None),
            # An instance waits this long for the LLM to be built (as the stack waits for tritonserver).
            ("startup_timeout_s", runtime.startup_timeout_s),
        ),
    )


def llmapi_instance_count(plan: ServingPlan) -> int:
    """runtime.llmapi.instance_count, else one per 2 CPU cores (1..16): each instance is one more sender."""
    configured = plan.runtime.llmapi.instance_count
    return configured if configured is not None else max(1, min(16, (os.cpu_count() or 2) // 2))


def window_relay_config(plan: ServingPlan) -> ModelConfig:
    """triton_models/tensorrt_llm_window: forwards to `tensorrt_llm`, adds `prefix_ids` per response."""
    return ModelConfig(
        name=WINDOW_RELAY,
        backend="python",
        max_batch_size=plan.max_batch_size,
        decoupled=True,
        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=0),
        inputs=nv.engine_inputs(cpp_backend=False),
        outputs=nv.ENGINE_OUTPUTS + nv.ENGINE_OPTIONAL_OUTPUTS + (nv.PREFIX_IDS_OUTPUT,),
        # One relay thread per request; the instance only moves tensors.
        instance_groups=(InstanceGroup(1),),
        parameters=_parameters(
            ("engine_model", ENGINE),
            ("prefix_window_tokens", PREFIX_WINDOW_TOKENS),
            # The engine runs at most max_batch_size sequences; the rest may wait in the relay.
            ("max_concurrent_streams", plan.max_batch_size),
            ("exclude_input_in_output", plan.runtime.exclude_input_in_output),
        ),
    )


def _preprocessing_step() -> EnsembleStep:
    return EnsembleStep(
        model_name=PREPROCESSING,
        input_map=(
            ("QUERY", "text_input"),
            ("DECODER_QUERY", "decoder_text_input"),
            ("REQUEST_OUTPUT_LEN", "max_tokens"),
            ("BAD_WORDS_DICT", "bad_words"),
            ("STOP_WORDS_DICT", "stop_words"),
            ("END_ID", "end_id"),
            ("PAD_ID", "pad_id"),
            ("EMBEDDING_BIAS_WORDS", "embedding_bias_words"),
            ("EMBEDDING_BIAS_WEIGHTS", "embedding_bias_weights"),
        ),
        output_map=(
            ("INPUT_ID", "_INPUT_ID"),
            ("REQUEST_INPUT_LEN", "_REQUEST_INPUT_LEN"),
            ("DECODER_INPUT_ID", "_DECODER_INPUT_ID"),
            ("REQUEST_DECODER_INPUT_LEN", "_REQUEST_DECODER_INPUT_LEN"),
            ("EMBEDDING_BIAS", "_EMBEDDING_BIAS"),
            ("REQUEST_OUTPUT_LEN", "_REQUEST_OUTPUT_LEN"),
            ("BAD_WORDS_IDS", "_BAD_WORDS_IDS"),
            ("STOP_WORDS_IDS", "_STOP_WORDS_IDS"),
            ("OUT_END_ID", "_PREPROCESSOR_END_ID"),
            ("OUT_PAD_ID", "_PREPROCESSOR_PAD_ID"),
        ),
    )


def _engine_step(model_name: str, output_map: tuple[tuple[str, str], ...]) -> EnsembleStep:
    return EnsembleStep(
        model_name=model_name,
        input_map=(
            ("input_ids", "_INPUT_ID"),
            ("input_lengths", "_REQUEST_INPUT_LEN"),
            ("request_output_len", "_REQUEST_OUTPUT_LEN"),
            ("end_id", "_PREPROCESSOR_END_ID"),
            ("pad_id", "_PREPROCESSOR_PAD_ID"),
            # Older trusses computed these ids and never passed them on: stop/bad words were ignored.
            ("stop_words_list", "_STOP_WORDS_IDS"),
            ("bad_words_list", "_BAD_WORDS_IDS"),
            ("decoder_input_ids", "_DECODER_INPUT_ID"),
            ("decoder_input_lengths", "_REQUEST_DECODER_INPUT_LEN"),
            ("embedding_bias", "_EMBEDDING_BIAS"),
            *nv.ENSEMBLE_TO_ENGINE_PASSTHROUGH,
        ),
        output_map=output_map,
    )


def ensemble_config(plan: ServingPlan, *, engine_sends_prefix_ids: bool, engine_step_model: str = ENGINE) -> ModelConfig:
    engine_outputs: tuple[tuple[str, str], ...] = (
        ("output_ids", "_TOKENS_BATCH"),
        # Also an ensemble output: the proxy's usage and finish_reason count the engine's tokens.
        ("sequence_length", "sequence_length"),
        ("cum_log_probs", "cum_log_probs"),
        ("output_log_probs", "output_log_probs"),
        # Sent by the engine only when asked for (or, batch_index / sequence_index, when the
        # request has several rows / sequences); then passed through as NVIDIA's ensemble does.
        *((t.name, t.name) for t in nv.ENGINE_OPTIONAL_OUTPUTS),
    )
    if engine_sends_prefix_ids:
        engine_outputs += (("prefix_ids", "_PREFIX_IDS"),)
    post_inputs: tuple[tuple[str, str], ...] = (("TOKENS_BATCH", "_TOKENS_BATCH"), ("SEQUENCE_LENGTH", "sequence_length"))
    if engine_sends_prefix_ids:
        post_inputs += (("PREFIX_IDS", "_PREFIX_IDS"),)
    postprocess = EnsembleStep(model_name=POSTPROCESSING, input_map=post_inputs, output_map=(("OUTPUT", "text_output"),))
    return ModelConfig(
        name=ENSEMBLE,
        platform="ensemble",
        max_batch_size=plan.max_batch_size,
        inputs=nv.ENSEMBLE_INPUTS,
        outputs=nv.ENSEMBLE_OUTPUTS,
        ensemble_steps=(_preprocessing_step(), _engine_step(engine_step_model, engine_outputs), postprocess),
    )


def ids_ensemble_config(plan: ServingPlan) -> ModelConfig:
    """`ensemble`'s inputs, the engine's `output_ids` and `sequence_length` out: no postprocessing
    step and no window relay, because the reader (the truss proxy) detokenizes the stream itself."""
    engine_outputs = tuple((t.name, t.name) for t in nv.IDS_ENSEMBLE_OUTPUTS)
    return ModelConfig(
        name=IDS_ENSEMBLE,
        platform="ensemble",
        max_batch_size=plan.max_batch_size,
        inputs=nv.ENSEMBLE_INPUTS,
        outputs=nv.IDS_ENSEMBLE_OUTPUTS,
        ensemble_steps=(_preprocessing_step(), _engine_step(ENGINE, engine_outputs)),
    )


def repository_configs(
    plan: ServingPlan, *, window_relay: bool | None = None, xgrammar_tokenizer_info: Path | None = None
) -> dict[str, ModelConfig]:
    """All model configs by name. `window_relay` routes the ensemble through `tensorrt_llm_window`
    (default: exactly when the engine cannot send `prefix_ids` itself, i.e. NVIDIA's backend).
    `xgrammar_tokenizer_info`: see `tensorrtllm_engine_config`."""
    if plan.max_batch_size < 1:
        raise RepositoryError(f"plan.max_batch_size: must be >= 1, got {plan.max_batch_size}")
    if plan.backend == "tensorrtllm":
        engine = tensorrtllm_engine_config(plan, xgrammar_tokenizer_info)
    elif plan.backend == "pytorch":
        engine = pytorch_engine_config(plan)
    elif plan.backend == "llmapi":
        engine = llmapi_engine_config(plan)
    else:
        raise RepositoryError(f"plan.backend: expected 'tensorrtllm', 'llmapi' or 'pytorch', got {plan.backend!r}")
    engine_sends_prefix = any(t.name == nv.PREFIX_IDS_OUTPUT.name for t in engine.outputs)
    if window_relay is None:
        # Only streamed chunks need prefix_ids; a non-decoupled engine answers each request whole.
        window_relay = not engine_sends_prefix and plan.runtime.decoupled_mode
    configs = {
        ENSEMBLE: ensemble_config(
            plan,
            engine_sends_prefix_ids=engine_sends_prefix or window_relay,
            engine_step_model=WINDOW_RELAY if window_relay else ENGINE,
        ),
        IDS_ENSEMBLE: ids_ensemble_config(plan),
        PREPROCESSING: preprocessing_config(plan),
        ENGINE: engine,
        POSTPROCESSING: postprocessing_config(plan),
    }
    if window_relay:
        if not plan.runtime.decoupled_mode:
            raise RepositoryError("runtime.decoupled_mode: the tensorrt_llm_window relay streams; it needs decoupled_mode true")
        configs[WINDOW_RELAY] = window_relay_config(plan)
    return configs
