"""Cached prompt tokens (the engine's reused KV blocks) where users read them: each dialect's usage,
/metrics, and the settings that switch reuse and its events on."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from trtllm_truss.api import responses as rsp
from trtllm_truss.api.messages_events import MessageEvents
from trtllm_truss.api.responses_events import ResponseEvents
from trtllm_truss.serving.metrics import ServingMetrics
from trtllm_truss.serving.openai_shared import usage_of
from trtllm_truss.serving.request import Finish
from trtllm_truss.serving.semantic_events import feed


def test_openai_usage_reports_cached_tokens_once_per_prompt():
    finishes = [Finish("stop", 100, 5, None, 64), Finish("stop", 100, 7, None, 96)]  # one prompt, n=2
    usage = usage_of(finishes, n=2)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens_details.cached_tokens) == (100, 12, 64)
    assert usage.model_dump()["prompt_tokens_details"] == {"cached_tokens": 64}
    assert usage_of([Finish("stop", 10, 1)]).prompt_tokens_details.cached_tokens == 0


def test_responses_usage_reports_cached_tokens_within_input_tokens():
    builder = ResponseEvents(rsp.parse_responses_request({"model": "m", "input": "hi"}), emit=False)
    builder.start()
    builder.text("ok")
    feed(builder, Finish("stop", 100, 3, None, 64))
    assert builder.usage["input_tokens"] == 100 and builder.usage["input_tokens_details"]["cached_tokens"] == 64
    assert builder.usage["total_tokens"] == 103


def test_messages_usage_follows_anthropic_cache_reads_are_not_input_tokens():
    builder = MessageEvents("m", emit=True)
    builder.start()
    builder.text("ok")
    events = feed(builder, Finish("stop", 100, 3, None, 64))
    expected = {"input_tokens": 36, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 64, "output_tokens": 3}
    assert builder.message()["usage"] == expected
    assert next(e for e in events if e["type"] == "message_delta")["usage"] == expected


def test_metrics_count_cached_prompt_tokens_beside_prompt_tokens():
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry, model_name="m")
    metrics.request_queued()
    metrics.request_started()
    metrics.request_finished("stop", 100, 5, cached_tokens=64)
    text = generate_latest(registry).decode()
    assert 'trtllm_prompt_tokens_cached_total{model_name="m"} 64.0' in text
    assert 'trtllm_prompt_tokens_total{model_name="m"} 100.0' in text
    metrics.unregister()


def _trt(runtime: dict, backend_build: dict | None = None) -> dict:
    return {
        "build": {"base_model_architecture": "llama", "huggingface_ckpt_repository": "data/embedded-llama", **(backend_build or {})},
        "runtime": runtime,
    }


def test_events_need_block_reuse_and_the_cpp_backend_has_none():
    from trtllm_truss.config.schema import TrtLlmConfig
    from trtllm_truss.planning.backend_settings import backend_setting_problems

    config = TrtLlmConfig.model_validate(_trt({"event_buffer_max_size": 100, "enable_kv_cache_reuse": True}))
    problems = backend_setting_problems(config, "tensorrtllm", "0.19.0")
    assert any("runtime.event_buffer_max_size" in p and "approximate" in p for p in problems)
    assert not any("event_buffer_max_size" in p for p in backend_setting_problems(config, "pytorch", None))


def _plan(tmp_path, runtime: str, plugin: str = ""):
    from pathlib import Path

    from trtllm_truss.config import load_config
    from trtllm_truss.planning.plan import make_plan
    from trtllm_truss.planning.probe import RuntimeFacts

    model = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.yaml").write_text(
        "model_name: t\nmodel_metadata:\n  trt_llm:\n    build:\n      base_model_architecture: llama\n"
        f"      huggingface_ckpt_repository: {model}\n{plugin}    runtime:\n{runtime}"
    )
    return make_plan(load_config(tmp_path, environ={}), RuntimeFacts(), artifacts_dir=tmp_path / "a")


def test_the_kv_settings_reach_the_stand_in_the_llmapi_model_yaml_and_the_stream_workers(tmp_path):
    from trtllm_truss.repository import repository_configs
    from trtllm_truss.repository.llmapi import plan_llm_args

    runtime = (
        "      backend: {backend}\n      enable_kv_cache_reuse: true\n      event_buffer_max_size: 500\n"
        "      max_tokens_in_paged_kv_cache: 4096\n"
    )
    plugin = "      plugin_configuration: {tokens_per_block: 32}\n"
    standin = _plan(tmp_path / "p", runtime.format(backend="pytorch") + "      pytorch: {synthetic: {prefill_time_per_token_ms: 0.5}}\n", plugin)
    params = repository_configs(standin)["tensorrt_llm"].parameter_dict
    assert {k: params[k] for k in ("tokens_per_block", "enable_kv_cache_reuse", "event_buffer_max_size",
                                   "max_tokens_in_paged_kv_cache", "synthetic_prefill_time_per_token_ms")} == {
        "tokens_per_block": "32", "enable_kv_cache_reuse": "true", "event_buffer_max_size": "500",
        "max_tokens_in_paged_kv_cache": "4096", "synthetic_prefill_time_per_token_ms": "0.5",
    }
    assert standin.tokens_per_block == 32
    llmapi = _plan(tmp_path / "l", runtime.format(backend="llmapi"))
    kv = plan_llm_args(llmapi)["kv_cache_config"]
    assert (kv["enable_block_reuse"], kv["event_buffer_max_size"], kv["max_tokens"]) == (True, 500, 4096)
    assert llmapi.tokens_per_block == 32  # TensorRT-LLM's KvCacheConfig default: cached tokens = reused blocks x 32
