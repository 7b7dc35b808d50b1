"""The `model_metadata.trt_llm` schema: strict pydantic models, no I/O in any validator.

Checks that need facts from outside the section (the GPUs in `resources.accelerator`) live in
`trtllm_truss.config.checks`; everything here depends only on the section itself.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from trtllm_truss.config.fields import NonEmptyStr, StrictModel, field_problem
from trtllm_truss.config.speculative import SpeculativeConfig

# A prompt plus its output beyond this many tokens is certainly a typo (the largest production
# context windows are ~1M tokens); the engine would try to reserve memory for it.
MAX_SEQUENCE_LEN = 1 << 20


# --- enums with every accepted spelling ---------------------------------------------------------


class Architecture(str, enum.Enum):
    LLAMA = "llama"
    MISTRAL = "mistral"
    MIXTRAL = "mixtral"
    DEEPSEEK = "deepseek"
    FALCON = "falcon"
    INTERNLM = "internlm"
    BAICHUAN = "baichuan"
    CHATGLM = "chatglm"
    GPTJ = "gptj"
    QWEN = "qwen"
    GPT2 = "gpt2"
    SANTACODER = "santacoder"
    STARCODER = "starcoder"


class Quantization(str, enum.Enum):
    """One name per TensorRT-LLM quantization recipe; values are truss's lowercase names."""

    NO_QUANT = "no_quant"
    WEIGHTS_INT8 = "weights_int8"
    WEIGHTS_KV_INT8 = "weights_kv_int8"
    WEIGHTS_INT4 = "weights_int4"
    WEIGHTS_KV_INT4 = "weights_kv_int4"
    SMOOTH_QUANT = "smooth_quant"
    AWQ = "awq"
    FP8 = "fp8"
    FP8_KV = "fp8_kv"
    # NVFP4 weights and activations (Blackwell): 16-bit KV cache, FP8 KV cache (Baseten's fp4_kv), or NVFP4 KV cache.
    FP4 = "fp4"
    FP4_KV = "fp4_kv"
    FP4_FP4_KV = "fp4_fp4_kv"

    @property
    def is_fp8(self) -> bool:
        return self in (Quantization.FP8, Quantization.FP8_KV)

    @property
    def is_fp4(self) -> bool:
        return self in (Quantization.FP4, Quantization.FP4_KV, Quantization.FP4_FP4_KV)


class Dtype(str, enum.Enum):
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


class Backend(str, enum.Enum):
    """What runs the model. `llmapi` is NVIDIA's LLM API (its PyTorch backend, TensorRT-LLM >= 1.0) behind
    NVIDIA's `triton_backend/all_models/llmapi` python model; `pytorch` is *our* CPU/GPU stand-in engine
    (Hugging Face transformers), not NVIDIA's PyTorch backend."""

    AUTO = "auto"
    TENSORRTLLM = "tensorrtllm"
    LLMAPI = "llmapi"
    PYTORCH = "pytorch"


class DetokenizeIn(str, enum.Enum):
    PROXY = "proxy"
    POSTPROCESSING = "postprocessing"


class BatchSchedulerPolicy(str, enum.Enum):
    MAX_UTILIZATION = "max_utilization"
    GUARANTEED_NO_EVICT = "guaranteed_no_evict"


class ChatglmModelVersion(str, enum.Enum):
    CHATGLM_6B = "chatglm_6b"
    CHATGLM2_6B = "chatglm2_6b"
    CHATGLM2_6B_32K = "chatglm2_6b_32k"
    CHATGLM3_6B = "chatglm3_6b"
    CHATGLM3_6B_BASE = "chatglm3_6b_base"
    CHATGLM3_6B_32K = "chatglm3_6b_32k"
    GLM_10B = "glm_10b"


class BaichuanModelVersion(str, enum.Enum):
    V1_7B = "v1_7b"
    V1_13B = "v1_13b"
    V2_7B = "v2_7b"
    V2_13B = "v2_13b"


class AwqFormat(str, enum.Enum):
    INT4_AWQ = "int4_awq"
    W4A8_AWQ = "w4a8_awq"


class Device(str, enum.Enum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


# Spellings from the seeds (TRT-LLM Builder Truss upper case, DJL LMI names) -> canonical member.
# Keys are compared after lower-casing and turning '-' and ' ' into '_'.
QUANTIZATION_ALIASES: dict[str, Quantization] = {
    "none": Quantization.NO_QUANT,
    "weights_only_int8": Quantization.WEIGHTS_INT8,
    "int8_wo": Quantization.WEIGHTS_INT8,
    "weights_only_int4": Quantization.WEIGHTS_INT4,
    "int4_wo": Quantization.WEIGHTS_INT4,
    "smoothquant": Quantization.SMOOTH_QUANT,
    "int8_sq": Quantization.SMOOTH_QUANT,
    "int4_awq": Quantization.AWQ,
    "nvfp4": Quantization.FP4,
}
ARCHITECTURE_ALIASES: dict[str, Architecture] = {
    "gpt_j": Architecture.GPTJ,
    "santa_coder": Architecture.SANTACODER,
    "star_coder": Architecture.STARCODER,
}
DTYPE_ALIASES: dict[str, Dtype] = {
    "fp16": Dtype.FLOAT16,
    "half": Dtype.FLOAT16,
    "bf16": Dtype.BFLOAT16,
    "fp32": Dtype.FLOAT32,
    "float": Dtype.FLOAT32,
}


def _normalise(text: str) -> str:
    return text.strip().lower().replace("-", "_").replace(" ", "_")


def _enum_parser(enum_cls: type[enum.Enum], aliases: dict[str, enum.Enum] | None = None, extra_help: str = ""):
    """A before-validator accepting any spelling of `enum_cls`; the error lists the allowed values."""
    aliases = aliases or {}

    def parse(value: object) -> object:
        if isinstance(value, enum_cls):
            return value
        if isinstance(value, str):
            key = _normalise(value)
            for member in enum_cls:
                if member.value == key:
                    return member
            if key in aliases:
                return aliases[key]
        allowed = ", ".join(m.value for m in enum_cls)
        raise ValueError(f"{value!r} is not allowed; allowed values: {allowed}{extra_help}")

    return BeforeValidator(parse)


ArchitectureName = Annotated[Architecture, _enum_parser(Architecture, ARCHITECTURE_ALIASES, " (any case)")]
QuantizationName = Annotated[
    Quantization,
    _enum_parser(
        Quantization,
        QUANTIZATION_ALIASES,
        " (also NO_QUANT, WEIGHTS_ONLY_INT8, WEIGHTS_KV_INT8, WEIGHTS_ONLY_INT4, WEIGHTS_KV_INT4,"
        " SMOOTH_QUANT, FP8, FP8_KV, FP4, FP4_KV, smoothquant, nvfp4)",
    ),
]
DtypeName = Annotated[Dtype, _enum_parser(Dtype, DTYPE_ALIASES, " (or fp16, bf16, fp32)")]
BackendName = Annotated[Backend, _enum_parser(Backend)]
SchedulerPolicyName = Annotated[BatchSchedulerPolicy, _enum_parser(BatchSchedulerPolicy)]
DetokenizeInName = Annotated[DetokenizeIn, _enum_parser(DetokenizeIn)]
ChatglmVersionName = Annotated[ChatglmModelVersion, _enum_parser(ChatglmModelVersion)]
BaichuanVersionName = Annotated[BaichuanModelVersion, _enum_parser(BaichuanModelVersion)]
AwqFormatName = Annotated[AwqFormat, _enum_parser(AwqFormat)]
DeviceName = Annotated[Device, _enum_parser(Device)]

SequenceLen = Annotated[int, Field(ge=1, le=MAX_SEQUENCE_LEN)]
ParallelCount = Annotated[int, Field(ge=1, le=64)]


# --- build --------------------------------------------------------------------------------------


class SmoothQuantOptions(StrictModel):
    alpha: float = Field(0.8, ge=0.0, le=1.0, description="SmoothQuant migration strength (DJL default 0.8).")
    per_token: bool = Field(False, description="Per-token activation scaling (slower, more accurate).")
    per_channel: bool = Field(False, description="Per-channel weight scaling (slower, more accurate).")
    multi_query_mode: bool = Field(False, description="Set for models with multi-query attention.")


class AwqOptions(StrictModel):
    calib_size: int = Field(32, ge=1, le=100_000, description="Number of calibration samples.")
    format: AwqFormatName = Field(AwqFormat.INT4_AWQ, description="int4_awq, or w4a8_awq (Hopper+).")


class PluginConfiguration(StrictModel):
    multi_block_mode: bool = Field(False, description="Split long KV sequences across blocks in generation MHA.")
    paged_kv_cache: bool = Field(True, description="Paged KV cache (required for in-flight batching).")
    use_fused_mlp: bool = Field(False, description="Horizontal fusion in gated MLPs.")
    use_paged_context_fmha: bool = Field(
        True, description="Paged context FMHA; needed for KV-cache reuse and chunked context."
    )
    use_custom_all_reduce: bool = Field(False, description="Custom all-reduce kernel for NVLink-connected GPUs.")
    tokens_per_block: int = Field(64, ge=1, le=1024, description="Tokens per paged KV-cache block (a power of two).")

    @model_validator(mode="after")
    def _power_of_two_block(self) -> PluginConfiguration:
        if self.tokens_per_block & (self.tokens_per_block - 1):
            raise field_problem("tokens_per_block", f"{self.tokens_per_block} is not a power of two (e.g. 32, 64, 128)")
        return self


# --- LoRA adapters (Baseten's build.lora_adapters / build.lora_configuration) -----------------------

# NVIDIA's LoRA module names -> the Hugging Face module names they stand for (TensorRT-LLM
# tensorrt_llm/lora_manager.py, get_default_trtllm_modules_to_hf_modules; examples/hf_lora_convert.py).
LORA_MODULES: dict[str, str] = {
    "attn_q": "q_proj",
    "attn_k": "k_proj",
    "attn_v": "v_proj",
    "attn_dense": "o_proj",
    "mlp_h_to_4h": "gate_proj",
    "mlp_4h_to_h": "down_proj",
    "mlp_gate": "up_proj",
}
# Baseten's pattern for an adapter name (the OpenAI `model` that picks it).
_ADAPTER_NAME = re.compile(r"^[a-zA-Z0-9_\-\.:]+$")


def _adapter_shorthand(value: object) -> object:
    """`name: org/repo` is `name: {repo: org/repo}`."""
    return {"repo": value} if isinstance(value, str) else value


def _lora_module(value: object) -> object:
    if isinstance(value, str) and value in LORA_MODULES:
        return value
    hf = {v: k for k, v in LORA_MODULES.items()}
    hint = f" ({value!r} is the Hugging Face name of {hf[value]!r})" if isinstance(value, str) and value in hf else ""
    raise ValueError(f"{value!r} is not one of NVIDIA's LoRA modules{hint}; allowed values: {', '.join(LORA_MODULES)}")


class LoraAdapterSource(StrictModel):
    repo: NonEmptyStr = Field(
        description="The adapter's folder (adapter_config.json + adapter_model.safetensors): hub repo id, s3:// URL or"
        " local path, fetched like the checkpoint (private hub repos with the same hf_access_token secret)."
    )
    revision: NonEmptyStr | None = Field(None, description="Hub branch, tag or commit of repo.")


LoraModuleName = Annotated[str, BeforeValidator(_lora_module)]


class LoraConfiguration(StrictModel):
    max_lora_rank: int = Field(64, ge=1, le=1024, description="Largest adapter rank the engine takes (Baseten's default 64).")
    lora_target_modules: list[LoraModuleName] = Field(
        default_factory=list,
        description="NVIDIA's module names the engine applies adapters to (attn_q, attn_k, attn_v, attn_dense,"
        " mlp_h_to_4h, mlp_4h_to_h, mlp_gate); empty: those the adapters name.",
    )
    max_loras: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Different adapters one engine step may run at once (NVIDIA's LoraConfig.max_loras); a request for"
        " another adapter waits for a slot. None: all configured adapters.",
    )


_HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def _publish_repository_problem(value: str) -> str | None:
    """Why `value` is not a place to publish engines (None when it is)."""
    if value.startswith("s3://"):
        bucket = value[len("s3://") :].partition("/")[0]
        if not _S3_BUCKET.match(bucket):
            return f"{value!r}: {bucket!r} is not an S3 bucket name; expected s3://BUCKET/PREFIX"
        return None
    if "://" in value or not _HUB_REPO_ID.match(value):
        return f"{value!r} is neither a hub repo id (owner/name) nor an s3://BUCKET/PREFIX URL"
    return None


class BuildConfig(StrictModel):
    base_model_architecture: ArchitectureName = Field(description="Model family of the checkpoint.")
    huggingface_ckpt_repository: NonEmptyStr = Field(
        description="Hub repo id, or a local path (relative paths resolve against the truss dir)."
    )
    huggingface_ckpt_revision: NonEmptyStr | None = Field(None, description="Hub branch, tag or commit.")
    dtype: DtypeName = Field(Dtype.FLOAT16, description="Compute dtype of the engine.")
    max_input_len: SequenceLen = Field(1024, description="Longest prompt in tokens.")
    max_output_len: SequenceLen = Field(512, description="Most generated tokens per request.")
    max_batch_size: int = Field(64, ge=1, le=4096, description="Most sequences in one engine step.")
    max_beam_width: int = Field(1, ge=1, le=64, description="Widest beam search the engine allows.")
    max_num_tokens: int | None = Field(
        None, ge=1, le=MAX_SEQUENCE_LEN * 16, description="Most tokens in one engine step (None: TRT-LLM default)."
    )
    quantization_type: QuantizationName = Field(Quantization.NO_QUANT, description="Quantization recipe.")
    smoothquant: SmoothQuantOptions = Field(default_factory=SmoothQuantOptions, description="Only with smooth_quant.")
    awq: AwqOptions = Field(default_factory=AwqOptions, description="Only with awq.")
    tensor_parallel_count: ParallelCount = Field(1, description="GPUs each layer is split across.")
    pipeline_parallel_count: ParallelCount = Field(1, description="Pipeline stages.")
    expert_parallel_count: ParallelCount | None = Field(
        None,
        description="MoE expert parallelism (backend llmapi: LLM(moe_expert_parallel_size=...); None: TensorRT-LLM"
        " decides). Must divide tensor_parallel_count x pipeline_parallel_count.",
    )
    plugin_configuration: PluginConfiguration = Field(default_factory=PluginConfiguration)
    chatglm_model_version: ChatglmVersionName | None = Field(None, description="Required for chatglm.")
    baichuan_model_version: BaichuanVersionName | None = Field(None, description="Required for baichuan.")
    publish_repository: NonEmptyStr | None = Field(
        None,
        description="Where the fleet shares built engines: a hub repo id (owner/name) or s3://BUCKET/PREFIX."
        " One replica builds each engine and publishes it; the others download it.",
    )
    lora_adapters: dict[str, Annotated[LoraAdapterSource, BeforeValidator(_adapter_shorthand)]] | None = Field(
        None,
        description="LoRA adapters served beside the base model: name (the OpenAI `model` that picks it) -> repo"
        " (or {repo, revision}).",
    )
    lora_configuration: LoraConfiguration | None = Field(
        None, description="The engine's LoRA limits (max_lora_rank, lora_target_modules, max_loras); needs lora_adapters."
    )

    @model_validator(mode="after")
    def _cross_field(self) -> BuildConfig:
        arch = self.base_model_architecture
        # field_problem attributes each error to the key to change, so its path ends the message prefix.
        for field, needed_by in (
            ("chatglm_model_version", Architecture.CHATGLM),
            ("baichuan_model_version", Architecture.BAICHUAN),
        ):
            value = getattr(self, field)
            enum_cls = ChatglmModelVersion if needed_by is Architecture.CHATGLM else BaichuanModelVersion
            allowed = ", ".join(m.value for m in enum_cls)
            if arch is needed_by and value is None:
                raise field_problem(
                    field, f"required when base_model_architecture is {arch.value}; allowed values: {allowed}"
                )
            if arch is not needed_by and value is not None:
                raise field_problem(
                    field, f"only applies to base_model_architecture {needed_by.value}, not {arch.value}; remove it"
                )
        if self.max_input_len + self.max_output_len > MAX_SEQUENCE_LEN:
            raise field_problem(
                "max_output_len",
                f"max_input_len + max_output_len = {self.max_input_len + self.max_output_len}"
                f" exceeds {MAX_SEQUENCE_LEN} tokens; lower one of them",
            )
        if "smoothquant" in self.model_fields_set and self.quantization_type is not Quantization.SMOOTH_QUANT:
            raise field_problem(
                "smoothquant",
                f"options only apply with quantization_type smooth_quant (it is"
                f" {self.quantization_type.value}); remove them or set quantization_type: smooth_quant",
            )
        if self.publish_repository is not None:
            problem = _publish_repository_problem(self.publish_repository)
            if problem:
                raise field_problem("publish_repository", problem)
        if self.expert_parallel_count is not None:
            world = self.tensor_parallel_count * self.pipeline_parallel_count
            if world % self.expert_parallel_count:
                raise field_problem(
                    "expert_parallel_count",
                    f"{self.expert_parallel_count} does not divide the world size {world}"
                    " (tensor_parallel_count x pipeline_parallel_count)",
                )
        for name in self.lora_adapters or {}:
            if not _ADAPTER_NAME.match(name) or name == "model":
                raise field_problem(
                    f"lora_adapters.{name}",
                    "an adapter name is letters, digits, '_', '-', '.' and ':' (the OpenAI `model` that picks it),"
                    " and not 'model' (the base model's name)",
                )
        if self.lora_configuration is not None and not self.lora_adapters:
            raise field_problem("lora_configuration", "only applies with lora_adapters; add adapters or remove it")
        if "awq" in self.model_fields_set and self.quantization_type is not Quantization.AWQ:
            raise field_problem(
                "awq",
                f"options only apply with quantization_type awq (it is {self.quantization_type.value});"
                " remove them or set quantization_type: awq",
            )
        return self

    @property
    def max_seq_len(self) -> int:
        return self.max_input_len + self.max_output_len


# --- serve --------------------------------------------------------------------------------------


class ServeConfig(StrictModel):
    engine_repository: NonEmptyStr = Field(description="Hub repo id, s3:// URL or local path of a built engine.")
    engine_revision: NonEmptyStr | None = Field(None, description="Hub branch, tag or commit of the engine.")
    tokenizer_repository: NonEmptyStr = Field(description="Hub repo id or local path; defaults to engine_repository.")
    tokenizer_revision: NonEmptyStr | None = Field(
        None, description="Defaults to engine_revision when the tokenizer is the engine's repository."
    )
    tensor_parallel_count: ParallelCount = Field(1, description="Must equal the engine's tp_size.")
    pipeline_parallel_count: ParallelCount = Field(1, description="Must equal the engine's pp_size.")

    @model_validator(mode="before")
    @classmethod
    def _tokenizer_defaults_to_engine(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("tokenizer_repository") is None and "engine_repository" in data:
            data = {**data, "tokenizer_repository": data["engine_repository"]}
            if data.get("tokenizer_revision") is None:
                data["tokenizer_revision"] = data.get("engine_revision")
        return data

    @model_validator(mode="after")
    def _s3_urls_name_a_bucket(self) -> ServeConfig:
        for field in ("engine_repository", "tokenizer_repository"):
            value = getattr(self, field)
            if value.startswith("s3://") and not value[len("s3://") :].strip("/"):
                raise field_problem(field, f"{value!r} names no bucket; expected s3://BUCKET/PREFIX")
        if self.engine_repository.startswith("s3://") and self.engine_revision is not None:
            raise field_problem("engine_revision", "revisions apply to hub repositories, not s3:// URLs; remove it")
        return self


# --- runtime ------------------------------------------------------------------------------------


class SyntheticEngineConfig(StrictModel):
    """Tokens without a model, to measure the stack's own cost (`trtllm-truss bench`)."""

    step_time_ms: float = Field(0.0, ge=0.0, le=60_000.0, description="Sleep per engine step (0: as fast as possible).")


class PytorchEngineConfig(StrictModel):
    """The stand-in engine (backend pytorch): a Hugging Face causal LM run with PyTorch."""

    model: NonEmptyStr | None = Field(
        None, description="Checkpoint to run instead of build.huggingface_ckpt_repository (path or hub id)."
    )
    device: DeviceName = Field(Device.AUTO, description="auto: cuda when available, else cpu.")
    num_threads: int | None = Field(None, ge=1, le=1024, description="torch intra-op threads (None: torch default).")
    synthetic: SyntheticEngineConfig | None = Field(None, description="Set to emit tokens at no model cost.")
    instance_count: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Engine instances (Triton stub processes, each with its own engine and a share of "
        "max_batch_size). None: 1 for a model; for the synthetic engine one per 2 CPU cores (1..8).",
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


class LlmApiRuntimeConfig(StrictModel):
    """Backend llmapi: where NVIDIA's `llmapi` Triton model comes from (it is not part of this package)."""

    model_source_dir: NonEmptyStr | None = Field(
        None,
        description="NVIDIA's triton_backend/all_models/llmapi/tensorrt_llm directory (config.pbtxt, 1/model.py,"
        " 1/helpers.py) of the TensorRT-LLM version installed (None: $TRTLLM_LLMAPI_MODEL_DIR, then the image's"
        " known locations).",
    )
    decoupled: bool = Field(True, description="Triton decoupled mode (needed for streaming responses).")


class HealthProbeConfig(StrictModel):
    """A one-token generation sent straight to the engine model, so a hung engine reads unhealthy."""

    enabled: bool = Field(True, description="Probe the engine model on an interval.")
    interval_s: float = Field(10.0, gt=0.0, le=3600.0, description="Seconds between probes.")
    timeout_s: float = Field(5.0, gt=0.0, le=600.0, description="A probe not answered within this is a failure.")


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
    tool_call_parser: Literal["auto", "none", "hermes", "llama3_json", "mistral", "deepseek_v3", "gpt_oss"] = Field(
        "auto",
        description="How tool calls are read from chat answers (the model family's format); auto: detected from"
        " the chat template's markers (<tool_call>: hermes, [TOOL_CALLS]: mistral, ...); none: tools are refused.",
    )
    guided_decoding_backend: Literal["auto", "xgrammar", "none"] = Field(
        "auto",
        description="What enforces structured output (response_format, tool_choice required/named, guided_*):"
        " auto: xgrammar on backend tensorrtllm from TensorRT-LLM 0.19 (its tokenizer info is written at load),"
        " llguidance on the pytorch stand-in, and guided requests answered 400 where the engine path has none"
        " (older engines, backend llmapi); xgrammar: required (a config error where it cannot run); none: off,"
        " guided requests get 400.",
    )
    reasoning_parser: Literal["auto", "none", "deepseek_r1", "qwen3", "gpt_oss"] = Field(
        "auto",
        description="How a reasoning model's thinking is split from its answer into reasoning_content; auto:"
        " detected from the chat template (<think>, harmony channels); none: the answer is returned as it is.",
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
    llmapi: LlmApiRuntimeConfig = Field(default_factory=lambda: LlmApiRuntimeConfig())
    health: HealthProbeConfig = Field(default_factory=lambda: HealthProbeConfig())

    @model_validator(mode="after")
    def _lora_cache_sizes(self) -> RuntimeConfig:
        optimal, largest = self.lora_cache_optimal_adapter_size, self.lora_cache_max_adapter_size
        if optimal is not None and largest is not None and optimal > largest:
            raise field_problem(
                "lora_cache_optimal_adapter_size", f"{optimal} is above lora_cache_max_adapter_size {largest}"
            )
        return self


# --- the section --------------------------------------------------------------------------------


class TrtLlmConfig(StrictModel):
    build: BuildConfig | None = None
    serve: ServeConfig | None = None
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    speculative: SpeculativeConfig | None = None

    @model_validator(mode="after")
    def _exactly_one_mode(self) -> TrtLlmConfig:
        if self.build is not None and self.serve is not None:
            raise field_problem(
                "", "build and serve cannot both be set; keep build (compile an engine) or serve (a prebuilt engine)"
            )
        if self.build is None and self.serve is None:
            raise field_problem("", "set exactly one of build (compile from a checkpoint) or serve (a prebuilt engine)")
        if self.build is not None and not self.runtime.enable_chunked_context:
            limit = self.build.max_num_tokens
            if limit is not None and limit < self.build.max_input_len:
                raise field_problem(
                    "build.max_num_tokens",
                    f"{limit} is below build.max_input_len {self.build.max_input_len}, so a"
                    " full prompt never fits one engine step; raise it or set runtime.enable_chunked_context: true",
                )
        plugins = self.build.plugin_configuration if self.build is not None else None
        if plugins is not None and not plugins.use_paged_context_fmha:
            for flag in ("enable_kv_cache_reuse", "enable_chunked_context"):
                if getattr(self.runtime, flag):
                    raise field_problem(
                        f"runtime.{flag}", "needs build.plugin_configuration.use_paged_context_fmha: true"
                    )
        if plugins is not None and not plugins.paged_kv_cache and self.runtime.enable_kv_cache_reuse:
            raise field_problem(
                "runtime.enable_kv_cache_reuse", "needs build.plugin_configuration.paged_kv_cache: true"
            )
        if self.speculative is not None and self.build is not None and self.build.max_beam_width > 1:
            raise field_problem(
                "build.max_beam_width",
                f"{self.build.max_beam_width} with speculative decoding: NVIDIA's decoding mode is either beam_search"
                " or a speculative one (lookahead, eagle, ...), never both; set max_beam_width: 1 or remove speculative",
            )
        if self.serve is not None and self.runtime.backend is Backend.PYTORCH and self.runtime.pytorch.model is None:
            raise field_problem(
                "runtime.pytorch.model",
                "required with backend pytorch in serve mode (a prebuilt engine has no"
                " Hugging Face checkpoint for the stand-in to run)",
            )
        return self

    @property
    def mode(self) -> Literal["build", "serve"]:
        return "build" if self.build is not None else "serve"

    @property
    def section(self) -> BuildConfig | ServeConfig:
        section = self.build if self.build is not None else self.serve
        assert section is not None  # guaranteed by _exactly_one_mode
        return section

    @property
    def tensor_parallel_count(self) -> int:
        return self.section.tensor_parallel_count

    @property
    def pipeline_parallel_count(self) -> int:
        return self.section.pipeline_parallel_count

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_count * self.pipeline_parallel_count
