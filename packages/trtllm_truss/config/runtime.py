"""`model_metadata.trt_llm.runtime`: how the engine is served (RuntimeConfig and its sub-models: the
pytorch stand-in, the health probe)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trtllm_truss.config.enums import (
    Backend,
    BackendName,
    BatchSchedulerPolicy,
    DetokenizeIn,
    DetokenizeInName,
    Device,
    DeviceName,
    SchedulerPolicyName,
)
from trtllm_truss.config.fields import NonEmptyStr, StrictModel, field_problem
from trtllm_truss.config.batches import BatchesConfig
from trtllm_truss.config.store import StoreConfig


# --- runtime ------------------------------------------------------------------------------------


class SyntheticEngineConfig(StrictModel):
    """Tokens without a model, to measure the stack's own cost (`trtllm-truss bench`)."""

    step_time_ms: float = Field(0.0, ge=0.0, le=60_000.0, description="Sleep per engine step (0: as fast as possible).")
    prefill_time_per_token_ms: float = Field(
        0.0, ge=0.0, le=1_000.0,
        description="Prefill cost per prompt token not found in the KV cache (runtime.enable_kv_cache_reuse), spent"
        " on the engine thread as a real prefill holds the batch (0: prefill is free).",
    )


class PytorchEngineConfig(StrictModel):
    """The stand-in engine (backend pytorch): a Hugging Face causal LM run with PyTorch."""

    model: NonEmptyStr | None = Field(
        None, description="Checkpoint to run instead of build.huggingface_ckpt_repository (path or hub id)."
    )
    device: DeviceName = Field(Device.AUTO, description="auto: cuda when available, else cpu.")
    num_threads: int | None = Field(None, ge=1, le=1024, description="torch intra-op threads (None: torch default).")
    synthetic: SyntheticEngineConfig | None = Field(
        None,
        description="Set to emit tokens at no model cost (backend pytorch, and backend llmapi on its LLM-API double,"
        " where TensorRT-LLM cannot run).",
    )
    instance_count: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Engine instances (Triton stub processes, each with its own engine and a share of "
        "max_batch_size, and its own KV block pool). None: 1 for a model; for the synthetic engine one per 2 CPU cores"
        " (1..16); 1 in a fleet routed by KV (`fleet.router_mode` kv, approximate), one KV cache a replica.",
    )
    sender_threads: int = Field(
        1,
        ge=1,
        le=32,
        description="Response sender threads per instance. Keep 1: with 2, tritonserver 2.51's python backend "
        "crashed (SIGSEGV) now and then; raise instance_count for more responses/s instead.",
    )
    merge_responses: bool = Field(
        False,
        description="false (as NVIDIA's engine): one response per token per step, queued in order when the "
        "sender falls behind; true: merge the tokens waiting for a request into one response.",
    )
    guide_cache_bytes: int = Field(
        128 << 20,
        ge=0,
        le=1 << 38,
        description="Bytes of compiled guides each engine instance keeps (xgrammar's CompiledGrammar.memory_size_bytes;"
        " llguidance estimated from its grammar's size), least recently used first out. TensorRT-LLM's own bound is"
        " its XGRAMMAR_CACHE_LIMIT_GB variable (1 GB).",
    )
    guided_whitespace: Literal["compact", "flexible"] = Field(
        "compact",
        description="Whitespace between JSON tokens in guided output where the stand-in generates (backend pytorch,"
        " and llmapi's double): flexible: free, as TensorRT-LLM compiles guides (xgrammar any_whitespace, llguidance"
        " defaults); compact: none (the same engine and options otherwise), as the small embedded model emits blanks"
        " until max_tokens when they are free. Which guides are accepted does not change.",
    )


class LlmApiConfig(StrictModel):
    """Our llmapi Triton model (backend llmapi): N Triton instances in front of one LLM (docs/design.md)."""

    instance_count: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Triton instances of the llmapi model `tensorrt_llm`: each a python stub that sends its requests'"
        " responses (one send is a round trip to tritonserver, so more instances send more responses a second),"
        " all clients of one LLM in one process (the LLM host). None: one per 2 CPU cores, 1 to 16.",
    )


class HealthProbeConfig(StrictModel):
    """A one-token generation sent to the engine model (through the `tensorrt_llm_window` relay when our routes
    stream text through it), so a hung engine or a dead relay reads unhealthy."""

    enabled: bool = Field(True, description="Probe the engine model (or the relay in front of it) on an interval.")
    interval_s: float = Field(
        10.0, gt=0.0, le=3600.0,
        description="Seconds between probes while the engine answers (an unhealthy one is probed every 0.5 s).",
    )
    timeout_s: float = Field(5.0, gt=0.0, le=600.0, description="A probe not answered within this is a failure.")


class DirectFrontConfig(StrictModel):
    """The direct front (`trtllm-truss serve --front direct`, truss's `docker_server`): our own HTTP server."""

    processes: int | None = Field(
        None,
        ge=1,
        le=64,
        description="HTTP front processes sharing the port, each with its own request core, tokenizer and engine"
        " client (None: one per 4 CPU cores, 1 to 16).",
    )
    api_key_secret: NonEmptyStr | None = Field(
        None,
        description="Name of the truss secret (config.yaml `secrets:`) holding an API key: every API request must"
        " then send `Authorization: Bearer <key>` (401 otherwise). None: no key is checked.",
    )
    fill_connections: int | None = Field(
        None,
        ge=0,
        le=100_000,
        description="Open connections the lowest front process takes before the next one takes any (a burst"
        " waiting to be accepted is shared by as many as have room for it); once every process holds this many,"
        " those holding the fewest take new ones. Fewer processes carrying more streams spend less CPU per token."
        " None: 8 x stream_interval. 0: the kernel hands each connection to any process.",
    )
    stream_worker_processes: bool = Field(
        False,
        description="Stream through worker processes behind each front process (runtime.stream_workers of them"
        " in all), as the truss front does. false: each front process tokenizes, streams from the engine and"
        " detokenizes on its own event loop, with no relay hop.",
    )


class GuidesConfig(StrictModel):
    """How the front checks what a guide (response_format, tool_choice required / named, guided_*) costs before
    it reaches the engine: a compile service per replica (docs/api.md, "Structured output", "What a guide may
    cost")."""

    compile_budget_s: float = Field(
        1.0,
        gt=0.0,
        le=60.0,
        description="Seconds one guide may take to be checked and compiled with the engine's compiler over the"
        " model's tokenizer (meta-schema, best-effort preparation, compile); a guide over it is refused with 400"
        " naming its field and this budget, and the refusal is cached. TensorRT-LLM compiles a new guide inside"
        " its executor's step, so this is also the longest a new guide can stall a batch there.",
    )
    compile_processes: int = Field(
        2,
        ge=1,
        le=32,
        description="Warm compile processes per replica (forked from one that holds the tokenizer). Guides over"
        " 16 KiB use at most this minus one, so one is kept for small guides; a guide that cannot start within"
        " compile_budget_s is a 429 with Retry-After.",
    )
    cache_bytes: int = Field(
        64 << 20,
        ge=0,
        le=1 << 36,
        description="Bytes of checked guides (verdicts, refusals included: their text and notes) the front keeps,"
        " least recently used first out; a known guide is answered from it at once.",
    )


class RuntimeConfig(StrictModel):
    backend: BackendName = Field(
        Backend.AUTO,
        description="auto: llmapi (NVIDIA's LLM API) for build mode on TensorRT-LLM >= 1.0, tensorrtllm (an engine)"
        " on older versions and for serve mode, else the pytorch stand-in (our Hugging Face engine, no GPU needed).",
    )
    kv_cache_free_gpu_mem_fraction: float = Field(
        0.9, gt=0.0, le=1.0, description="Share of free GPU memory for the KV cache."
    )
    max_tokens_in_paged_kv_cache: int | None = Field(
        None, ge=1, description="Cap on KV-cache tokens (None: by fraction)."
    )
    kv_cache_host_memory_bytes: int | None = Field(
        None,
        ge=1,
        le=1 << 44,
        description="Host (CPU) memory for KV-cache blocks offloaded from the GPU, in bytes (None: no offload)."
        " tensorrtllm: kv_cache_host_memory_bytes; llmapi: kv_cache_config.host_cache_size.",
    )
    kv_cache_onboard_blocks: bool | None = Field(
        None,
        description="Bring offloaded blocks back to the GPU before reuse (NVIDIA's default true)."
        " tensorrtllm: kv_cache_onboard_blocks; llmapi: kv_cache_config.onboard_blocks.",
    )
    lora_cache_optimal_adapter_size: int | None = Field(
        None, ge=1, le=1024, description="NVIDIA's lora_cache_optimal_adapter_size: the adapter size (rank) cache pages are sized for."
    )
    lora_cache_max_adapter_size: int | None = Field(
        None, ge=1, le=1024, description="NVIDIA's lora_cache_max_adapter_size: the largest adapter size the cache takes."
    )
    lora_cache_gpu_memory_fraction: float | None = Field(
        None, gt=0.0, le=1.0, description="NVIDIA's lora_cache_gpu_memory_fraction: share of the GPU memory left after the engine loads."
    )
    lora_cache_host_memory_bytes: int | None = Field(
        None, ge=1, le=1 << 44, description="NVIDIA's lora_cache_host_memory_bytes: host memory for cached adapters."
    )
    served_model_name: NonEmptyStr | None = Field(
        None,
        description="The base model's name in a request's `model` (Baseten's name), besides \"model\" and an absent or"
        " empty one. Set, or with build.lora_adapters, any other `model` that names no adapter is a 404.",
    )
    max_num_sequences: int | None = Field(None, ge=1, description="Sequences the batch manager keeps state for.")
    batch_scheduler_policy: SchedulerPolicyName = Field(
        BatchSchedulerPolicy.GUARANTEED_NO_EVICT,
        description="guaranteed_no_evict reserves KV cache for a whole request up front.",
    )
    enable_kv_cache_reuse: bool = Field(False, description="Reuse KV cache of shared prompt prefixes.")
    event_buffer_max_size: int = Field(
        0, ge=0, le=1 << 20,
        description="KV cache events (blocks stored and removed, TensorRT-LLM's kv_cache_config.event_buffer_max_size)"
        " kept for a consumer such as a KV-aware router; 0: no events. Needs enable_kv_cache_reuse.",
    )
    enable_chunked_context: bool = Field(False, description="Split long prompts across engine steps.")
    exclude_input_in_output: bool = Field(
        False,
        description="Default for requests that do not send exclude_input_in_output: false (NVIDIA's default) "
        "returns the prompt before the generated tokens of a non-streamed response. The truss proxy always sends it.",
    )
    decoupled_mode: bool = Field(
        True,
        description="NVIDIA's decoupled_mode: true renders tensorrt_llm (and so the ensembles) decoupled, "
        "needed for streaming and by the truss proxy; false serves NVIDIA's unary clients (HTTP, gRPC ModelInfer), "
        "one response per request, no streaming.",
    )
    preprocessing_instance_count: int = Field(2, ge=1, le=64, description="Tokenizer instances (each costs a CPU).")
    postprocessing_instance_count: int = Field(
        2, ge=1, le=64, description="Detokenizer instances of the text `ensemble` (each costs a CPU)."
    )
    detokenize_in: DetokenizeInName = Field(
        DetokenizeIn.PROXY,
        description="proxy: the truss proxy streams token ids from `ensemble_ids` and decodes them (no "
        "python-backend hop per token); postprocessing: it streams text from `ensemble`.",
    )
    tool_call_parser: str = Field(
        "auto",
        pattern=r"^[a-z0-9_]{1,64}$",
        description="How tool calls are read from chat answers: a registered parser (the model family's"
        " format: docs/api.md's table of families, e.g. hermes, qwen3_coder, deepseek_v31, kimi_k2, glm45,"
        " gpt_oss); auto: the family detected from the chat template and the tokenizer's special tokens"
        " (`trtllm-truss validate` says which and why); none: tools with tool_choice auto are refused. An"
        " unknown name fails `validate` and the load.",
    )
    guided_decoding_backend: Literal["auto", "xgrammar", "llguidance", "none"] = Field(
        "auto",
        description="The grammar engine that enforces structured output (response_format, tool_choice required/named,"
        " guided_*), as TensorRT-LLM names it: xgrammar (NVIDIA's C++ backend from TensorRT-LLM 0.19, its tokenizer"
        " info written at load; the PyTorch path) or llguidance (TensorRT-LLM's PyTorch path only: the pytorch"
        " stand-in and backend llmapi; a config error on backend tensorrtllm); auto: xgrammar, and guided requests"
        " answered 400 where the engine path has none (engines before 0.19); none: off, guided requests get 400."
        " Guides are checked before they are queued with the same engine and options.",
    )
    reasoning_parser: str = Field(
        "auto",
        pattern=r"^[a-z0-9_]{1,64}$",
        description="How a reasoning model's thinking is split from its answer into reasoning_content: a"
        " registered parser (docs/api.md, Reasoning: qwen3, deepseek_r1, glm45, kimi_k2, gpt_oss, ...); auto:"
        " the family detected from the chat template; none: the answer is returned as it is.",
    )
    stream_workers: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Stream-worker processes that tokenize, stream from the engine and detokenize, off truss's"
        " event loop (None: half the CPU cores, 1 to 8).",
    )
    max_stream_chunks_per_s: float = Field(
        10_000.0,
        gt=0,
        le=1e7,
        description="HTTP stream chunks per second over all streams that truss's single thread is asked to"
        " write: with more open streams than this allows one chunk per token, a stream's next chunk waits"
        " open streams / this seconds after its last one and carries every token that arrived meanwhile.",
    )
    stream_interval: int = Field(
        1,
        ge=1,
        le=1024,
        description="Decode steps per streamed engine response (TensorRT-LLM's LLM API `stream_interval`): a"
        " request's first token comes at once, then one response every this many steps with the tokens made"
        " meanwhile, and the last with the final flag. Above 1 the engine, Triton and the stream workers handle"
        " that many times fewer responses per token. Backends llmapi and pytorch; NVIDIA's C++ backend"
        " (tensorrtllm) sends every step and has no such setting.",
    )
    max_queued_requests: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="Requests admitted beyond the engine's batch (max_batch_size) before new ones get HTTP 429"
        " with Retry-After (None: 2 x max_batch_size).",
    )
    trust_remote_code: bool = Field(
        False,
        description="Run the tokenizer code a checkpoint ships (tokenizer_config.json auto_map.AutoTokenizer,"
        " e.g. ChatGLM, Baichuan, InternLM v1) when it has no tokenizer.json. Off: such a tokenizer is refused"
        " with an error naming this key.",
    )
    max_queue_delay_microseconds: int = Field(0, ge=0, le=60_000_000, description="Dynamic-batching wait.")
    max_queue_size: int | None = Field(
        None, ge=1, description="Requests queued before Triton rejects (None: unbounded)."
    )
    startup_timeout_s: float = Field(600.0, gt=0, le=86_400, description="How long tritonserver may take to be ready.")
    tritonserver_path: NonEmptyStr | None = Field(
        None, description="tritonserver binary (None: found on PATH / pytriton)."
    )
    pytorch: PytorchEngineConfig = Field(default_factory=PytorchEngineConfig)
    llmapi: LlmApiConfig = Field(default_factory=lambda: LlmApiConfig())
    health: HealthProbeConfig = Field(default_factory=lambda: HealthProbeConfig())
    direct_front: DirectFrontConfig = Field(default_factory=lambda: DirectFrontConfig())
    guides: GuidesConfig = Field(default_factory=lambda: GuidesConfig())
    store: StoreConfig = Field(default_factory=lambda: StoreConfig())
    batches: BatchesConfig = Field(default_factory=lambda: BatchesConfig())

    @model_validator(mode="after")
    def _lora_cache_sizes(self) -> RuntimeConfig:
        optimal, largest = self.lora_cache_optimal_adapter_size, self.lora_cache_max_adapter_size
        if optimal is not None and largest is not None and optimal > largest:
            raise field_problem(
                "lora_cache_optimal_adapter_size", f"{optimal} is above lora_cache_max_adapter_size {largest}"
            )
        return self
