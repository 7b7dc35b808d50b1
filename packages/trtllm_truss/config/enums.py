"""The section's enums, each with an `Annotated[..., _enum_parser(...)]` name type accepting every spelling
(seed upper case, DJL LMI aliases), and the bounded integer field types shared by the build and serve sections."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import BeforeValidator, Field

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
    our Triton model triton_models/tensorrt_llm_llmapi (NVIDIA's token-id interface); `pytorch` is *our*
    CPU/GPU stand-in engine (Hugging Face transformers), not NVIDIA's PyTorch backend."""

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
