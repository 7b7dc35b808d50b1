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
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from trtllm_truss.artifacts.build_recipes import (
    ARCHITECTURE_RECIPES,
    CUSTOM_ALL_REDUCE_FLAG_UNTIL,
    FUSED_MLP_PLUGIN_SINCE,
    KV_CACHE_TYPE_SINCE,
    MAX_SEQ_LEN_SINCE,
    MULTI_BLOCK_RUNTIME_SINCE,
    NVFP4_SINCE,
    OLDEST_SUPPORTED,
    BuildPlanError,
    ConvertFeature,
    Flow,
    TrtllmVersion,
    convert_script_relpath,
    quant_recipe,
)
from trtllm_truss.config.build import BuildConfig
from trtllm_truss.config.enums import (
    Architecture,
    Quantization,
)
from trtllm_truss.planning.lora import lora_build_flags
from trtllm_truss.planning.speculation import lookahead_config, trtllm_build_flags

logger = logging.getLogger(__name__)


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
        given = getattr(config.base_model_architecture, "value", None)
        what = f"{given!r} has no build recipe" if given else "is required for an engine build (trtllm-build)"
        raise BuildPlanError(f"build.base_model_architecture {what}; allowed: {allowed}")
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
