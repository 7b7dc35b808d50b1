"""`model_metadata.trt_llm.build`: compile an engine from a checkpoint (BuildConfig and its option models:
SmoothQuant, AWQ, plugins, LoRA adapters)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, Field, model_validator

from trtllm_truss.config.enums import (
    MAX_SEQUENCE_LEN,
    Architecture,
    ArchitectureName,
    AwqFormat,
    AwqFormatName,
    BaichuanModelVersion,
    BaichuanVersionName,
    ChatglmModelVersion,
    ChatglmVersionName,
    Dtype,
    DtypeName,
    ParallelCount,
    Quantization,
    QuantizationName,
    SequenceLen,
)
from trtllm_truss.config.fields import NonEmptyStr, StrictModel, field_problem


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
    base_model_architecture: ArchitectureName | None = Field(
        None,
        description="Model family of the checkpoint: required on the engine-build path (backend tensorrtllm); optional"
        " on backend llmapi, which reads the architecture from the checkpoint's config.json (given, it must agree).",
    )
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
