"""How `model_metadata.trt_llm.speculative` reaches each backend, in NVIDIA's names, and what each refuses.

Sources (recorded in tests/data/trtllm_flags/, contract-tested):
* engine builds, TensorRT-LLM 0.x: `trtllm-build --speculative_decoding_mode lookahead_decoding --max_draft_len N`
  (tensorrt_llm/commands/build.py; 0.16.0 and 0.21.0 records), N from NVIDIA's
  `LookaheadDecodingConfig::calculateSpeculativeResourceTuple`;
* engine builds, 1.x: `LLM(speculative_config=LookaheadDecodingConfig(max_window_size, max_ngram_size,
  max_verification_set_size))`, which sets the build's speculative_decoding_mode and max_draft_len itself
  (llm_args.py `validate_speculative_config`);
* the C++ Triton backend: parameters `decoding_mode: lookahead`, `lookahead_window_size`, `lookahead_ngram_size`,
  `lookahead_verification_set_size` (tensorrtllm_backend v0.19.0 model_instance_state.cc; earlier tags accept
  `decoding_mode: lookahead` but read no sizes);
* the LLM-API backend: `speculative_config` with `decoding_type` Eagle / MTP / NGram / DraftTarget (1.0
  llm_args.py `DecodingBaseConfig.from_dict`); NVIDIA refuses Lookahead there (`supports_backend`: not pytorch).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtllm_truss.config.build import BuildConfig
from trtllm_truss.config.enums import Architecture
from trtllm_truss.config.speculative import SpeculativeConfig, SpeculativeMode

SECTION = "model_metadata.trt_llm.speculative"
# tensorrtllm_backend v0.19.0 is the first tag whose tensorrt_llm model reads the lookahead_* parameters.
LOOKAHEAD_PARAMETERS_SINCE = (0, 19)
LLMAPI_SINCE = (1, 0)
TRTLLM_BUILD_MODE = {SpeculativeMode.LOOKAHEAD: "lookahead_decoding"}
LLMAPI_DECODING_TYPE = {
    SpeculativeMode.LOOKAHEAD: "Lookahead",
    SpeculativeMode.DRAFT_TARGET: "DraftTarget",
    SpeculativeMode.EAGLE3: "Eagle",
    SpeculativeMode.MTP: "MTP",
    SpeculativeMode.NGRAM: "NGram",
}
# MTP layers ship in DeepSeek-V3/R1 checkpoints (config.json num_nextn_predict_layers); NVIDIA's
# MTPDecodingConfig hard-codes DeepSeek R1's thinking-phase tokens.
MTP_ARCHITECTURES = frozenset({Architecture.DEEPSEEK})
# An engine's config.json build_config.speculative_decoding_mode is NVIDIA's SpeculativeDecodingMode IntFlag
# (tensorrt_llm/models/modeling_utils.py: NONE 1, DRAFT_TOKENS_EXTERNAL 2, MEDUSA 4, LOOKAHEAD_DECODING 8, ...).
LOOKAHEAD_DECODING_FLAG = 8


class SpeculativeBuildConfig(BuildConfig):
    """The build section plus the speculation that changes the engine: what the builder and the engine cache key
    read (`ServingPlan.build`) when an engine is built for speculative decoding."""

    speculative: SpeculativeConfig


def engine_build(build: BuildConfig, speculative: SpeculativeConfig | None) -> BuildConfig:
    if speculative is None:
        return build
    values = {name: getattr(build, name) for name in BuildConfig.model_fields}
    return SpeculativeBuildConfig.model_construct(
        _fields_set=set(build.model_fields_set) | {"speculative"}, **values, speculative=speculative
    )


def _version(text: str | None) -> tuple[int, int]:
    match = re.match(r"^\s*v?(\d+)\.(\d+)", text or "")
    return (int(match[1]), int(match[2])) if match else (0, 0)


def speculation_problems(trt: Any, backend: str, trtllm_version: str | None) -> list[str]:
    """Why the backend that will run (at this TensorRT-LLM version) cannot do the configured speculation,
    one line each naming the key; empty when it can (or when nothing is configured)."""
    spec: SpeculativeConfig | None = trt.speculative
    if spec is None or backend == "pytorch":  # the stand-in: a warning at config time (config/checks.py)
        return []
    mode = spec.speculative_decoding_mode
    key = f"{SECTION}.speculative_decoding_mode"
    version = _version(trtllm_version)
    if backend == "tensorrtllm":
        if mode is SpeculativeMode.DRAFT_TARGET:
            return [
                (
                    f"{key}: draft_target on backend tensorrtllm needs a second (draft) engine orchestrated by NVIDIA's"
                    " tensorrt_llm_bls model, which this truss does not build; use runtime.backend llmapi (TensorRT-LLM"
                    " >= 1.0, DraftTargetDecodingConfig) or speculative_decoding_mode lookahead"
                )
            ]
        if mode is not SpeculativeMode.LOOKAHEAD:
            return [
                (
                    f"{key}: {mode.value} runs on NVIDIA's LLM-API backend only (its {LLMAPI_DECODING_TYPE[mode]}"
                    "DecodingConfig, TensorRT-LLM >= 1.0): set runtime.backend: llmapi, or use lookahead on engines"
                )
            ]
        if version < LOOKAHEAD_PARAMETERS_SINCE:
            return [
                (
                    f"{key}: lookahead on backend tensorrtllm needs TensorRT-LLM >= 0.19 (tensorrtllm_backend v0.19.0 is"
                    f" the first to read lookahead_window_size/ngram_size/verification_set_size); the target has"
                    f" {trtllm_version}, which would ignore the sizes"
                )
            ]
        return []
    if backend == "llmapi":
        if mode is SpeculativeMode.LOOKAHEAD:
            return [
                (
                    f"{key}: NVIDIA's LLM-API PyTorch backend refuses Lookahead (LookaheadDecodingConfig.supports_backend"
                    " is false for pytorch, llm_args.py); use runtime.backend: tensorrtllm (an engine) for lookahead,"
                    " or ngram / eagle3 / draft_target here"
                )
            ]
        build = trt.build
        if (
            mode is SpeculativeMode.MTP
            and build is not None
            and build.base_model_architecture is not None  # else the checkpoint's config.json decides (planning.architectures)
            and build.base_model_architecture not in MTP_ARCHITECTURES
        ):
            return [
                (
                    f"{key}: mtp uses the checkpoint's multi-token-prediction layers, which only DeepSeek-V3/R1"
                    f" checkpoints have (base_model_architecture deepseek), not {build.base_model_architecture.value}"
                )
            ]
    return []


def engine_speculation_problem(build_config: Mapping[str, Any], spec: SpeculativeConfig) -> str | None:
    """Why an engine (its config.json `build_config`) cannot run this speculation; None when it can."""
    mode, draft = build_config.get("speculative_decoding_mode"), build_config.get("max_draft_len")
    needed = spec.max_draft_len
    if not isinstance(mode, int) or not mode & LOOKAHEAD_DECODING_FLAG:
        return (
            f"{SECTION}.speculative_decoding_mode: lookahead, but the engine was not built for it (build_config"
            f" speculative_decoding_mode {mode!r}); rebuild with trtllm-build --speculative_decoding_mode"
            f" lookahead_decoding --max_draft_len {needed}, or remove speculative"
        )
    if isinstance(draft, int) and draft < needed:
        return (
            f"{SECTION}.lookahead_window_size: these sizes need {needed} draft tokens per step but the engine was"
            f" built with --max_draft_len {draft}; lower the lookahead sizes or rebuild the engine"
        )
    return None


def trtllm_build_flags(spec: SpeculativeConfig | None) -> list[str]:
    """trtllm-build flags (0.x) for the engine to run this speculation."""
    if spec is None:
        return []
    return ["--speculative_decoding_mode", TRTLLM_BUILD_MODE[spec.speculative_decoding_mode],
            "--max_draft_len", str(spec.max_draft_len)]


def lookahead_config(spec: SpeculativeConfig) -> dict[str, Any]:
    window, ngram, verification = spec.lookahead_sizes
    return {
        "decoding_type": "Lookahead",
        "max_window_size": window,
        "max_ngram_size": ngram,
        "max_verification_set_size": verification,
    }


def backend_parameters(spec: SpeculativeConfig | None) -> tuple[tuple[str, Any], ...]:
    """NVIDIA's C++ backend parameters (tensorrt_llm config.pbtxt) for this speculation."""
    if spec is None:
        return ()
    window, ngram, verification = spec.lookahead_sizes
    return (
        ("decoding_mode", "lookahead"),
        ("lookahead_window_size", window),
        ("lookahead_ngram_size", ngram),
        ("lookahead_verification_set_size", verification),
    )


def llmapi_speculative_config(spec: SpeculativeConfig, draft_dir: str | Path | None) -> dict[str, Any]:
    """`speculative_config` of the LLM-API model.yaml (trtllm-serve takes the same mapping in its
    --extra_llm_api_options file)."""
    mode = spec.speculative_decoding_mode
    config: dict[str, Any] = {"decoding_type": LLMAPI_DECODING_TYPE[mode]}
    if mode is SpeculativeMode.MTP:
        config["num_nextn_predict_layers"] = spec.max_draft_len
        return config
    config["max_draft_len"] = spec.max_draft_len
    if mode in (SpeculativeMode.DRAFT_TARGET, SpeculativeMode.EAGLE3):
        config["speculative_model_dir"] = str(draft_dir)
    if mode is SpeculativeMode.EAGLE3 and spec.eagle3_one_model is not None:
        config["eagle3_one_model"] = spec.eagle3_one_model
    if mode is SpeculativeMode.NGRAM:
        config["max_matching_ngram_size"] = spec.ngram_max_matching_size
    return config
