"""Engine builds: the `build` section -> a typed `BuildPlan` for the TensorRT-LLM version at hand -> run it.

TensorRT-LLM's build entry points changed across releases, so the plan is chosen by version:

* 0.9 - 0.21 ("checkpoint_then_engine"): NVIDIA's `convert_checkpoint.py` of the model's example
  directory (or `examples/quantization/quantize.py` for recipes that need calibration), then
  `trtllm-build`. TP/PP are fixed by the first step.
* 1.x ("llm_api"): `tensorrt_llm._tensorrt_engine.LLM(...).save(dir)`, run by
  `python -m trtllm_truss.artifacts.llmapi_build SPEC_JSON` inside the build environment.

Flag spellings follow the sources of each version; `tests/data/trtllm_flags/<version>/` records them
and the contract tests check every generated command against them (an earlier truss passed
`--int8-kv_cache` and every KV-int8 build failed).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Mapping, Protocol, TextIO

from trtllm_truss.config.child_env import child_environment
from trtllm_truss.config.errors import redact
from trtllm_truss.config.schema import (
    Architecture,
    AwqFormat,
    BuildConfig,
    Quantization,
)
from trtllm_truss.planning.lora import lora_build_flags
from trtllm_truss.planning.speculation import lookahead_config, trtllm_build_flags

logger = logging.getLogger(__name__)

Flow = Literal["checkpoint_then_engine", "llm_api"]
ExamplesLayout = Literal["legacy", "models"]


class BuildPlanError(ValueError):
    """The build section cannot be turned into a build for this TensorRT-LLM version."""


class BuildStepError(RuntimeError):
    """A build step exited non-zero; the message carries the step, its command and its log tail."""

    def __init__(self, step: "BuildStep", returncode: int, log_tail: list[str]):
        self.step = step
        self.returncode = returncode
        self.log_tail = log_tail
        tail = "\n".join(f"    {line}" for line in log_tail) or "    (no output)"
        super().__init__(
            f"build step {step.name!r} failed with exit code {returncode}: {step.shell_command()}\n"
            f"  last {len(log_tail)} log lines:\n{tail}"
        )


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


# ---- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildStep:
    name: str  # "convert_checkpoint", "quantize", "trtllm-build", "llm_api_save"
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # added to the build's environment; never secrets
    cwd: Path | None = None

    def shell_command(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class LlmApiSpec:
    """Arguments of `tensorrt_llm._tensorrt_engine.LLM(...)` for the 1.x engine path, as plain data."""

    model: str
    output_dir: str
    dtype: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    build_config: Mapping[str, object]
    plugin_config: Mapping[str, object]
    quant_config: Mapping[str, object]
    calib_config: Mapping[str, object] | None
    speculative_config: Mapping[str, object] | None = None  # LLM(speculative_config=...): lookahead engines

    def to_json(self) -> str:
        return json.dumps(
            {
                "model": self.model,
                "output_dir": self.output_dir,
                "dtype": self.dtype,
                "tensor_parallel_size": self.tensor_parallel_size,
                "pipeline_parallel_size": self.pipeline_parallel_size,
                "build_config": dict(self.build_config),
                "plugin_config": dict(self.plugin_config),
                "quant_config": dict(self.quant_config),
                "calib_config": None if self.calib_config is None else dict(self.calib_config),
                "speculative_config": None if self.speculative_config is None else dict(self.speculative_config),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> "LlmApiSpec":
        raw = json.loads(text)
        return cls(**raw)


@dataclass(frozen=True)
class BuildPlan:
    trtllm_version: str
    flow: Flow
    checkpoint_dir: Path  # the Hugging Face checkpoint the build reads
    output_dir: Path  # where the engine ends up
    steps: tuple[BuildStep, ...]
    llm_api_spec: LlmApiSpec | None = None
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        lines = [f"# TensorRT-LLM {self.trtllm_version} ({self.flow}): {len(self.steps)} step(s)"]
        lines += [f"# note: {note}" for note in self.notes]
        for number, step in enumerate(self.steps, start=1):
            prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(step.env.items()))
            cd = f"cd {shlex.quote(str(step.cwd))} && " if step.cwd else ""
            lines.append(f"# {number}. {step.name}")
            lines.append(f"{cd}{prefix + ' ' if prefix else ''}{step.shell_command()}")
        return "\n".join(lines)


def _enable(flag: bool) -> str:
    return "enable" if flag else "disable"


def plan_build(
    config: BuildConfig,
    *,
    trtllm_version: str,
    checkpoint_dir: Path,
    output_dir: Path,
    work_dir: Path,
    examples_dir: Path | None = None,
    python: str = sys.executable,
    trtllm_build: str = "trtllm-build",
) -> BuildPlan:
    """The steps that turn the checkpoint in `checkpoint_dir` into an engine in `output_dir`.

    `work_dir` holds the intermediate TensorRT-LLM checkpoint; `examples_dir` is NVIDIA's
    `examples/` directory of the same release (needed by the 0.x flow only).
    """
    version = TrtllmVersion.parse(trtllm_version)
    if version < OLDEST_SUPPORTED:
        raise BuildPlanError(
            f"TensorRT-LLM {version} predates the checkpoint + trtllm-build flow; use 0.9 or newer"
        )
    if config.base_model_architecture not in ARCHITECTURE_RECIPES:
        allowed = ", ".join(a.value for a in ARCHITECTURE_RECIPES)
        raise BuildPlanError(
            f"build.base_model_architecture {config.base_model_architecture.value!r} has no build recipe; "
            f"allowed: {allowed}"
        )
    if config.base_model_architecture is Architecture.CHATGLM and config.pipeline_parallel_count != 1:
        raise BuildPlanError(
            "build.pipeline_parallel_count must be 1 for chatglm (NVIDIA's converter supports tensor parallelism only)"
        )
    if config.quantization_type.is_fp4 and version < NVFP4_SINCE:
        raise BuildPlanError(
            f"build.quantization_type {config.quantization_type.value}: NVFP4 arrived in TensorRT-LLM 0.17"
            f" (quantize.py --qformat nvfp4); the target has {version}"
        )
    if version.flow == "llm_api":
        return _plan_llm_api(config, version, checkpoint_dir, output_dir, python)
    if config.quantization_type is Quantization.FP4_FP4_KV:
        raise BuildPlanError(
            f"build.quantization_type fp4_fp4_kv: TensorRT-LLM {version}'s quantize.py has no FP4 KV cache"
            " (--kv_cache_dtype int8 or fp8); use fp4_kv (FP8 KV cache) or TensorRT-LLM >= 1.0"
            " (QuantConfig kv_cache_quant_algo NVFP4)"
        )
    return _plan_checkpoint_then_engine(
        config, version, checkpoint_dir, output_dir, work_dir, examples_dir, python, trtllm_build
    )


def _plan_checkpoint_then_engine(
    config: BuildConfig,
    version: TrtllmVersion,
    checkpoint_dir: Path,
    output_dir: Path,
    work_dir: Path,
    examples_dir: Path | None,
    python: str,
    trtllm_build: str,
) -> BuildPlan:
    recipe = ARCHITECTURE_RECIPES[config.base_model_architecture]
    quant = quant_recipe(config)
    examples = examples_dir.resolve() if examples_dir else Path("examples")
    tllm_ckpt = work_dir / "tllm_checkpoint"
    notes: list[str] = []
    if examples_dir is None:
        notes.append("examples/ stands for NVIDIA's examples directory of this release (TRTLLM_EXAMPLES_DIR)")
    parallel = ["--tp_size", str(config.tensor_parallel_count), "--pp_size", str(config.pipeline_parallel_count)]

    convert_flags = _convert_quant_flags(config, recipe.convert_features)
    if convert_flags is not None:
        script = examples / convert_script_relpath(config.base_model_architecture, version, examples_dir)
        argv = [python, str(script), "--model_dir", str(checkpoint_dir), "--output_dir", str(tllm_ckpt),
                "--dtype", config.dtype.value, *parallel, *convert_flags]
        argv += _architecture_flags(config)
        first = BuildStep("convert_checkpoint", tuple(argv), cwd=script.parent if examples_dir else None)
    else:
        script = examples / "quantization" / "quantize.py"
        argv = [python, str(script), "--model_dir", str(checkpoint_dir), "--output_dir", str(tllm_ckpt),
                "--dtype", config.dtype.value, "--qformat", quant.qformat, *parallel]
        if quant.kv_cache_dtype:
            argv += ["--kv_cache_dtype", quant.kv_cache_dtype]
        if config.quantization_type is Quantization.AWQ:
            argv += ["--calib_size", str(config.awq.calib_size)]
        notes.append(
            f"{config.quantization_type.value} uses NVIDIA ModelOpt calibration (examples/quantization/quantize.py)"
        )
        if config.quantization_type is Quantization.SMOOTH_QUANT:
            notes.append("quantize.py --qformat int8_sq picks its own alpha/per-token/per-channel settings")
        first = BuildStep("quantize", tuple(argv), cwd=script.parent if examples_dir else None)

    plugins = config.plugin_configuration
    build = [trtllm_build, "--checkpoint_dir", str(tllm_ckpt), "--output_dir", str(output_dir),
             "--max_batch_size", str(config.max_batch_size), "--max_input_len", str(config.max_input_len),
             "--max_beam_width", str(config.max_beam_width)]
    if version >= MAX_SEQ_LEN_SINCE:
        build += ["--max_seq_len", str(config.max_seq_len)]
    else:
        build += ["--max_output_len", str(config.max_output_len)]
    if config.max_num_tokens is not None:
        build += ["--max_num_tokens", str(config.max_num_tokens)]
    # Plugins in the dtype of the model: accepted by every release (newer ones also take "auto").
    build += ["--gemm_plugin", config.dtype.value, "--gpt_attention_plugin", config.dtype.value,
              "--remove_input_padding", "enable", "--context_fmha", "enable"]
    if version >= KV_CACHE_TYPE_SINCE:
        build += ["--kv_cache_type", "paged" if plugins.paged_kv_cache else "continuous"]
    else:
        build += ["--paged_kv_cache", _enable(plugins.paged_kv_cache)]
    build += ["--tokens_per_block", str(plugins.tokens_per_block)]
    build += ["--use_paged_context_fmha", _enable(plugins.use_paged_context_fmha)]
    if version < CUSTOM_ALL_REDUCE_FLAG_UNTIL:
        build += ["--use_custom_all_reduce", _enable(plugins.use_custom_all_reduce)]
    if plugins.use_fused_mlp and version >= FUSED_MLP_PLUGIN_SINCE:
        build += ["--use_fused_mlp", "enable"]
    elif plugins.use_fused_mlp:
        notes.append(f"use_fused_mlp is not passed to trtllm-build {version} (a plugin option since 0.12)")
    if version < MULTI_BLOCK_RUNTIME_SINCE:
        build += ["--multi_block_mode", _enable(plugins.multi_block_mode)]
    elif plugins.multi_block_mode:
        notes.append("multi_block_mode is a runtime option since TensorRT-LLM 0.13 (on by default there)")
    if config.quantization_type is Quantization.SMOOTH_QUANT and config.smoothquant.multi_query_mode:
        notes.append("smoothquant.multi_query_mode needs no flag: the converter reads the KV-head count from the checkpoint")
    build += trtllm_build_flags(getattr(config, "speculative", None))
    build += lora_build_flags(config)
    build += ["--workers", str(config.tensor_parallel_count * config.pipeline_parallel_count)]
    second = BuildStep("trtllm-build", tuple(build))
    return BuildPlan(str(version), "checkpoint_then_engine", checkpoint_dir, output_dir, (first, second), None, tuple(notes))


def _convert_quant_flags(config: BuildConfig, features: frozenset[ConvertFeature]) -> list[str] | None:
    """convert_checkpoint.py quantization flags, or None when quantize.py must do it instead."""
    q = config.quantization_type
    if q is Quantization.NO_QUANT:
        return []
    if q in (Quantization.WEIGHTS_INT8, Quantization.WEIGHTS_INT4, Quantization.WEIGHTS_KV_INT8, Quantization.WEIGHTS_KV_INT4):
        kv = q in (Quantization.WEIGHTS_KV_INT8, Quantization.WEIGHTS_KV_INT4)
        if "weight_only" not in features or (kv and "int8_kv_cache" not in features):
            return None
        precision = "int8" if q in (Quantization.WEIGHTS_INT8, Quantization.WEIGHTS_KV_INT8) else "int4"
        flags = ["--use_weight_only", "--weight_only_precision", precision]
        return flags + (["--int8_kv_cache"] if kv else [])
    if q is Quantization.SMOOTH_QUANT:
        if "smoothquant" not in features:
            return None
        sq = config.smoothquant
        flags = ["--smoothquant", repr(float(sq.alpha))]
        flags += ["--per_token"] if sq.per_token else []
        flags += ["--per_channel"] if sq.per_channel else []
        return flags
    return None  # awq, fp8, fp8_kv: calibration through quantize.py


def _architecture_flags(config: BuildConfig) -> list[str]:
    if config.base_model_architecture is Architecture.CHATGLM and config.chatglm_model_version is not None:
        return ["--chatglm_version", _CHATGLM_FAMILY[config.chatglm_model_version.value]]
    if config.base_model_architecture is Architecture.BAICHUAN and config.baichuan_model_version is not None:
        return ["--model_version", config.baichuan_model_version.value]
    if config.base_model_architecture in _GPT_VARIANTS:
        return ["--gpt_variant", _GPT_VARIANTS[config.base_model_architecture]]
    return []


_GPT_VARIANTS = {Architecture.GPT2: "gpt2", Architecture.SANTACODER: "santacoder", Architecture.STARCODER: "starcoder"}


# chatglm_model_version (DJL's names) -> convert_checkpoint.py --chatglm_version (the model family).
_CHATGLM_FAMILY = {
    "chatglm_6b": "chatglm",
    "chatglm2_6b": "chatglm2",
    "chatglm2_6b_32k": "chatglm2",
    "chatglm3_6b": "chatglm3",
    "chatglm3_6b_base": "chatglm3",
    "chatglm3_6b_32k": "chatglm3",
    "glm_10b": "glm",
}


def _plan_llm_api(
    config: BuildConfig, version: TrtllmVersion, checkpoint_dir: Path, output_dir: Path, python: str
) -> BuildPlan:
    quant = quant_recipe(config)
    plugins = config.plugin_configuration
    build_config: dict[str, object] = {
        "max_batch_size": config.max_batch_size,
        "max_input_len": config.max_input_len,
        "max_seq_len": config.max_seq_len,
        "max_beam_width": config.max_beam_width,
        "kv_cache_type": "PAGED" if plugins.paged_kv_cache else "CONTINUOUS",
    }
    if config.max_num_tokens is not None:
        build_config["max_num_tokens"] = config.max_num_tokens
    plugin_config: dict[str, object] = {
        "gemm_plugin": config.dtype.value,
        "gpt_attention_plugin": config.dtype.value,
        "use_paged_context_fmha": plugins.use_paged_context_fmha,
        "tokens_per_block": plugins.tokens_per_block,
        "use_fused_mlp": plugins.use_fused_mlp,
    }
    quant_config: dict[str, object] = {}
    if quant.quant_algo is not None:
        quant_config["quant_algo"] = quant.quant_algo
    if quant.kv_cache_quant_algo is not None:
        quant_config["kv_cache_quant_algo"] = quant.kv_cache_quant_algo
    if config.quantization_type is Quantization.SMOOTH_QUANT:
        quant_config["smoothquant_val"] = float(config.smoothquant.alpha)
    calib_config = None
    if quant.needs_calibration:
        samples = config.awq.calib_size if config.quantization_type is Quantization.AWQ else 512
        calib_config = {"calib_batches": samples, "calib_batch_size": 1}
    notes = []
    if plugins.multi_block_mode:
        notes.append("multi_block_mode is a runtime option in TensorRT-LLM 1.x (on by default)")
    spec = LlmApiSpec(
        model=str(checkpoint_dir),
        output_dir=str(output_dir),
        dtype=config.dtype.value,
        tensor_parallel_size=config.tensor_parallel_count,
        pipeline_parallel_size=config.pipeline_parallel_count,
        build_config=build_config,
        plugin_config=plugin_config,
        quant_config=quant_config,
        calib_config=calib_config,
        speculative_config=lookahead_config(config.speculative) if getattr(config, "speculative", None) else None,
    )
    step = BuildStep("llm_api_save", (python, "-m", "trtllm_truss.artifacts.llmapi_build", spec.to_json()))
    return BuildPlan(str(version), "llm_api", checkpoint_dir, output_dir, (step,), spec, tuple(notes))


# ---- running a plan ------------------------------------------------------------------------------


class LineSink(Protocol):
    def __call__(self, line: str) -> None: ...


def _stderr_sink(stream: TextIO) -> LineSink:
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            stream.write(line + "\n")
            stream.flush()

    return write


def run_build_plan(
    plan: BuildPlan,
    *,
    env: Mapping[str, str] | None = None,
    log_prefix: str = "[engine-build] ",
    sink: LineSink | None = None,
    tail_lines: int = 40,
    secrets: tuple[str, ...] = (),
) -> None:
    """Run each step with its output streamed line by line (prefixed); stop at the first failure.

    `secrets` (and every secret value load_config remembered) are replaced by '***' in every forwarded
    line and in the error's log tail; the steps' environment has no credential (child_env).
    """
    emit = sink or _stderr_sink(sys.stderr)
    base_env = child_environment(os.environ if env is None else env, secrets=secrets)

    def clean(line: str) -> str:
        return redact(line, secrets)

    for number, step in enumerate(plan.steps, start=1):
        emit(clean(f"{log_prefix}step {number}/{len(plan.steps)} {step.name}: {step.shell_command()}"))
        step_env = {**base_env, **step.env, "PYTHONUNBUFFERED": "1"}
        tail: deque[str] = deque(maxlen=tail_lines)
        try:
            process = subprocess.Popen(
                list(step.argv),
                cwd=str(step.cwd) if step.cwd else None,
                env=step_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                bufsize=1,
            )
        except OSError as exc:
            raise BuildStepError(step, 127, [clean(f"cannot start {step.argv[0]!r}: {exc}")]) from exc
        assert process.stdout is not None
        for raw in process.stdout:
            line = clean(raw.rstrip("\n"))
            tail.append(line)
            emit(f"{log_prefix}{step.name}: {line}")
        returncode = process.wait()
        if returncode != 0:
            raise BuildStepError(step, returncode, list(tail))
    emit(f"{log_prefix}done: engine in {plan.output_dir}")


# ---- from the build section to a cache entry ------------------------------------------------------

FetchCheckpoint = Callable[[str, "str | None", Path], Path]


def engine_create_fn(
    config: BuildConfig,
    *,
    trtllm_version: str,
    fetch_checkpoint: FetchCheckpoint,
    work_root: Path,
    examples_dir: Path | None = None,
    python: str = sys.executable,
    trtllm_build: str = "trtllm-build",
    env: Mapping[str, str] | None = None,
    sink: LineSink | None = None,
    secrets: tuple[str, ...] = (),
) -> Callable[[Path], None]:
    """A `create_fn` for `EngineCache.get_or_create`: fetch the checkpoint, plan, run into `dest`.

    `fetch_checkpoint(repository, revision, dest_dir) -> checkpoint_dir` comes from the caller
    (e.g. the hub fetcher with the token bound), which keeps this module free of download details.
    """

    def create(dest: Path) -> None:
        work = dest.parent / "work"
        work.mkdir(parents=True, exist_ok=True)
        checkpoint = fetch_checkpoint(config.huggingface_ckpt_repository, config.huggingface_ckpt_revision, work_root)
        plan = plan_build(
            config,
            trtllm_version=trtllm_version,
            checkpoint_dir=checkpoint,
            output_dir=dest,
            work_dir=work,
            examples_dir=examples_dir,
            python=python,
            trtllm_build=trtllm_build,
        )
        try:
            run_build_plan(plan, env=env, sink=sink, secrets=secrets)
        finally:
            # The intermediate checkpoint is as large as the engine; never publish it.
            shutil.rmtree(work, ignore_errors=True)

    return create
