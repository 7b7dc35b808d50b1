"""TensorRT-LLM versions and the tables a build plan reads: the releases that changed a flag, each
architecture's NVIDIA example directory, and each quantization type's TensorRT-LLM names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from trtllm_truss.config.build import BuildConfig
from trtllm_truss.config.enums import (
    Architecture,
    AwqFormat,
    Quantization,
)

Flow = Literal["checkpoint_then_engine", "llm_api"]
ExamplesLayout = Literal["legacy", "models"]


class BuildPlanError(ValueError):
    """The build section cannot be turned into a build for this TensorRT-LLM version."""


# ---- versions ------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class TrtllmVersion:
    major: int
    minor: int
    patch: int = 0
    text: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text: str) -> "TrtllmVersion":
        match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
        if not match:
            raise BuildPlanError(f"TensorRT-LLM version {text!r} is not of the form MAJOR.MINOR[.PATCH]")
        return cls(int(match[1]), int(match[2]), int(match[3] or 0), text.strip())

    def __str__(self) -> str:
        return self.text or f"{self.major}.{self.minor}.{self.patch}"

    @property
    def flow(self) -> Flow:
        return "llm_api" if self.major >= 1 else "checkpoint_then_engine"


OLDEST_SUPPORTED = TrtllmVersion(0, 9, 0)
# Releases that changed a spelling we emit (from NVIDIA's docs/sources of each tag).
MAX_SEQ_LEN_SINCE = TrtllmVersion(0, 12, 0)  # trtllm-build --max_seq_len replaces --max_output_len
KV_CACHE_TYPE_SINCE = TrtllmVersion(0, 13, 0)  # --kv_cache_type paged replaces --paged_kv_cache enable
MULTI_BLOCK_RUNTIME_SINCE = TrtllmVersion(0, 13, 0)  # multi_block_mode became a runtime option
# Plugin flag of the 0.9-0.13 line; later releases choose the all-reduce strategy at runtime.
CUSTOM_ALL_REDUCE_FLAG_UNTIL = TrtllmVersion(0, 14, 0)
FUSED_MLP_PLUGIN_SINCE = TrtllmVersion(0, 12, 0)  # --use_fused_mlp enable|disable plugin option
MODELS_LAYOUT_SINCE = TrtllmVersion(0, 18, 0)  # examples/<model> -> examples/models/{core,contrib}/<model>
# NVFP4: "Added NVFP4 Gemm support for Llama and Mixtral models" (TensorRT-LLM release notes, 0.17.0);
# quantize.py --qformat nvfp4 is in the 0.21.0 record, not in the 0.16.0 one.
NVFP4_SINCE = TrtllmVersion(0, 17, 0)


# ---- architecture -> NVIDIA example directory -----------------------------------------------------

ConvertFeature = Literal["weight_only", "int8_kv_cache", "smoothquant"]


@dataclass(frozen=True)
class ArchitectureRecipe:
    """Where an architecture's convert_checkpoint.py lives and which quantization flags it takes."""

    legacy_dir: str  # under examples/ (0.9 - 0.17)
    models_dir: str  # under examples/models/ (0.18+)
    convert_features: frozenset[ConvertFeature]
    # Directories used instead when the release at hand has them (an architecture's own example
    # that some releases shipped, e.g. examples/internlm before InternLM moved to the LLaMA script).
    preferred_if_present: tuple[str, ...] = ()


_ALL_FEATURES: frozenset[ConvertFeature] = frozenset({"weight_only", "int8_kv_cache", "smoothquant"})

ARCHITECTURE_RECIPES: dict[Architecture, ArchitectureRecipe] = {
    # Mistral, Mixtral and DeepSeek (v1 dense, LLaMA layout) convert with the LLaMA script.
    Architecture.LLAMA: ArchitectureRecipe("llama", "core/llama", _ALL_FEATURES),
    Architecture.MISTRAL: ArchitectureRecipe("llama", "core/llama", _ALL_FEATURES),
    Architecture.MIXTRAL: ArchitectureRecipe("llama", "core/llama", _ALL_FEATURES),
    Architecture.DEEPSEEK: ArchitectureRecipe("llama", "core/llama", _ALL_FEATURES),
    Architecture.INTERNLM: ArchitectureRecipe("llama", "core/llama", _ALL_FEATURES, ("internlm",)),
    Architecture.FALCON: ArchitectureRecipe("falcon", "contrib/falcon", frozenset({"weight_only"})),
    Architecture.BAICHUAN: ArchitectureRecipe("baichuan", "contrib/baichuan", _ALL_FEATURES),
    Architecture.CHATGLM: ArchitectureRecipe("chatglm", "core/glm-4-9b", _ALL_FEATURES),
    Architecture.GPTJ: ArchitectureRecipe("gptj", "contrib/gptj", frozenset({"weight_only"})),
    Architecture.QWEN: ArchitectureRecipe("qwen", "core/qwen", _ALL_FEATURES),
    Architecture.GPT2: ArchitectureRecipe("gpt", "core/gpt", _ALL_FEATURES),
    Architecture.SANTACODER: ArchitectureRecipe("gpt", "core/gpt", _ALL_FEATURES),
    Architecture.STARCODER: ArchitectureRecipe("gpt", "core/gpt", _ALL_FEATURES),
}


def examples_layout(version: TrtllmVersion) -> ExamplesLayout:
    return "models" if version >= MODELS_LAYOUT_SINCE else "legacy"


def convert_script_relpath(architecture: Architecture, version: TrtllmVersion, examples_dir: Path | None = None) -> str:
    """`<dir>/convert_checkpoint.py` relative to examples/; an existing file in `examples_dir` wins
    over the version rule, because containers sometimes ship examples of another layout."""
    recipe = ARCHITECTURE_RECIPES[architecture]
    candidates = [f"models/{recipe.models_dir}", recipe.legacy_dir]
    if examples_layout(version) == "legacy":
        candidates.reverse()
    if examples_dir is not None:
        for candidate in (*recipe.preferred_if_present, *candidates):
            if (examples_dir / candidate / "convert_checkpoint.py").is_file():
                return f"{candidate}/convert_checkpoint.py"
    return f"{candidates[0]}/convert_checkpoint.py"


# ---- quantization -> TensorRT-LLM names ------------------------------------------------------------


@dataclass(frozen=True)
class QuantRecipe:
    quant_algo: str | None  # TensorRT-LLM QuantAlgo member name (None: no quantization)
    kv_cache_quant_algo: str | None
    qformat: str  # examples/quantization/quantize.py --qformat
    kv_cache_dtype: str | None  # quantize.py --kv_cache_dtype
    needs_calibration: bool


def smoothquant_algo(per_token: bool, per_channel: bool) -> str:
    channel = "PER_CHANNEL" if per_channel else "PER_TENSOR"
    if per_token:
        return f"W8A8_SQ_{channel}_PER_TOKEN_PLUGIN"
    return f"W8A8_SQ_{channel}_PLUGIN" if per_channel else "W8A8_SQ_PER_TENSOR_PLUGIN"


def quant_recipe(config: BuildConfig) -> QuantRecipe:
    q = config.quantization_type
    if q is Quantization.NO_QUANT:
        return QuantRecipe(None, None, "full_prec", None, False)
    if q is Quantization.WEIGHTS_INT8:
        return QuantRecipe("W8A16", None, "int8_wo", None, False)
    if q is Quantization.WEIGHTS_KV_INT8:
        return QuantRecipe("W8A16", "INT8", "int8_wo", "int8", True)
    if q is Quantization.WEIGHTS_INT4:
        return QuantRecipe("W4A16", None, "int4_wo", None, False)
    if q is Quantization.WEIGHTS_KV_INT4:  # there is no INT4 KV cache in TensorRT-LLM: INT8 KV it is
        return QuantRecipe("W4A16", "INT8", "int4_wo", "int8", True)
    if q is Quantization.SMOOTH_QUANT:
        sq = config.smoothquant
        return QuantRecipe(smoothquant_algo(sq.per_token, sq.per_channel), None, "int8_sq", None, True)
    if q is Quantization.AWQ:
        w4a8 = config.awq.format is AwqFormat.W4A8_AWQ
        return QuantRecipe("W4A8_AWQ" if w4a8 else "W4A16_AWQ", None, config.awq.format.value, None, True)
    if q is Quantization.FP8:
        return QuantRecipe("FP8", None, "fp8", None, True)
    if q is Quantization.FP8_KV:
        return QuantRecipe("FP8", "FP8", "fp8", "fp8", True)
    if q is Quantization.FP4:
        return QuantRecipe("NVFP4", None, "nvfp4", None, True)
    if q is Quantization.FP4_KV:  # Baseten's fp4_kv: NVFP4 weights, FP8 KV cache
        return QuantRecipe("NVFP4", "FP8", "nvfp4", "fp8", True)
    if q is Quantization.FP4_FP4_KV:  # quantize.py has no FP4 KV cache (--kv_cache_dtype int8|fp8): 1.x only
        return QuantRecipe("NVFP4", "NVFP4", "nvfp4", None, True)
    raise BuildPlanError(f"build.quantization_type {q!r} has no TensorRT-LLM recipe")
