"""Where values come from: config.yaml (current or legacy keys), `TRTLLM_*` variables, DJL aliases.

Each source writes into one nested dict (the raw `model_metadata.trt_llm` section) and records, per
leaf key, a `Source`. Precedence, lowest to highest: schema default < config.yaml < DJL alias <
`TRTLLM_<SECTION>__<FIELD>`. Nothing here validates values; the schema does, afterwards.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from trtllm_truss.config.accelerator import Accelerator
from trtllm_truss.config.errors import SECTION_PATH, closest, did_you_mean, dotted, show_value
from trtllm_truss.config.schema import TrtLlmConfig

KeyPath = tuple[str, ...]  # relative to model_metadata.trt_llm, e.g. ("build", "max_input_len")

ENV_PREFIX = "TRTLLM_"
ENV_SEPARATOR = "__"
NULL_WORDS = ("", "null", "none")


@dataclass(frozen=True)
class Source:
    kind: Literal["file", "env", "default"]
    detail: str = ""  # "config.yaml", the variable name, or how a default was derived

    def __str__(self) -> str:
        return f"{self.kind} ({self.detail})" if self.detail else self.kind


DEFAULT = Source("default")


@dataclass
class RawSection:
    """The unvalidated section plus provenance and the problems found while assembling it."""

    data: dict[str, Any] = field(default_factory=dict)
    origins: dict[KeyPath, Source] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def set(self, path: KeyPath, value: Any, source: Source) -> None:
        node = self.data
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                return  # the file put a scalar where a section belongs; validation reports it
            node = child
        node[path[-1]] = value
        # an override replaces whatever the file had below this key
        for key in [k for k in self.origins if k[: len(path)] == path]:
            del self.origins[key]
        self.origins[path] = source

    @property
    def mode_hint(self) -> Literal["build", "serve"]:
        """The mode the section asks for so far (for aliases that exist in both modes)."""
        return "serve" if self.data.get("serve") is not None and self.data.get("build") is None else "build"


# --- config.yaml --------------------------------------------------------------------------------

# The "TRTLLM" truss kept these directly under model_metadata; they mean a serve section.
LEGACY_KEYS: dict[str, KeyPath] = {
    "engine_repository": ("serve", "engine_repository"),
    "tokenizer_repository": ("serve", "tokenizer_repository"),
    "tensor_parallelism": ("serve", "tensor_parallel_count"),
}


def _record_file_leaves(raw: RawSection, node: Any, path: KeyPath, source: Source) -> None:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            _record_file_leaves(raw, value, path + (str(key),), source)
    elif path:
        raw.origins[path] = source


def section_from_file(truss_config: Mapping[str, Any], raw: RawSection, file_label: str = "config.yaml") -> None:
    """Copy `model_metadata.trt_llm` (or the legacy keys) from a parsed config.yaml into `raw`."""
    # truss's normalised config.yaml (what its server reads) always has `trt_llm: null`.
    if truss_config.get("trt_llm") is not None:
        raw.problems.append(
            "trt_llm: the top-level key belongs to truss's own engine builder; put this section under"
            " model_metadata.trt_llm"
        )
    metadata = truss_config.get("model_metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raw.problems.append(f"model_metadata: expected a mapping, got {type(metadata).__name__}")
        return
    section = metadata.get("trt_llm")
    legacy = {key: metadata[key] for key in LEGACY_KEYS if key in metadata}
    if section is not None:
        if not isinstance(section, dict):
            raw.problems.append(f"{SECTION_PATH}: expected a mapping with build or serve, got {show_value(section)}")
            return
        for key in legacy:
            raw.problems.append(
                f"model_metadata.{key}: legacy key cannot be combined with {SECTION_PATH}; move it to"
                f" {SECTION_PATH}.{'.'.join(LEGACY_KEYS[key])}"
            )
        raw.data.update(json.loads(json.dumps(section, default=str)))  # a deep copy of plain data
        _record_file_leaves(raw, raw.data, (), Source("file", file_label))
        return
    for key, value in legacy.items():
        raw.set(LEGACY_KEYS[key], value, Source("file", f"{file_label} model_metadata.{key} (legacy)"))
    if not legacy:
        close = did_you_mean("trt_llm", [str(k) for k in metadata])
        if close:
            raw.warnings.append(f"model_metadata: no trt_llm key;{close}")


# --- TRTLLM_<SECTION>__<FIELD> ------------------------------------------------------------------


def _unwrap(annotation: Any) -> list[Any]:
    """The concrete types an annotation admits (Optional/Union/Annotated removed)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _unwrap(arg)]
    return [annotation]


def section_model(annotation: Any) -> type[BaseModel] | None:
    for candidate in _unwrap(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def allows_none(annotation: Any) -> bool:
    return type(None) in _unwrap(annotation)


def model_at(path: KeyPath, root: type[BaseModel] = TrtLlmConfig) -> type[BaseModel] | None:
    """The model class that holds the keys below `path`, or None if `path` is not a section."""
    model: type[BaseModel] | None = root
    for part in path:
        if model is None or part not in model.model_fields:
            return None
        model = section_model(model.model_fields[part].annotation)
    return model


def env_name(path: KeyPath) -> str:
    return ENV_PREFIX + ENV_SEPARATOR.join(p.upper() for p in path)


def _parse_env_key(name: str) -> tuple[KeyPath | None, Any]:
    """Map a variable name to a key path, or explain why it names no key."""
    parts = tuple(p.lower() for p in name[len(ENV_PREFIX) :].split(ENV_SEPARATOR))
    model: type[BaseModel] = TrtLlmConfig
    for depth, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            where = dotted(SECTION_PATH, *parts[:depth])
            match = closest(part, list(fields))
            hint = f" did you mean {env_name(parts[:depth] + (match,))}?" if match else ""
            key = dotted(SECTION_PATH, *parts[: depth + 1])
            return None, f"{name}: unknown key {key};{hint} allowed keys of {where}: {', '.join(fields)}"
        sub = section_model(fields[part].annotation)
        if depth == len(parts) - 1:
            return parts, fields[part].annotation
        if sub is None:
            return None, f"{name}: {dotted(SECTION_PATH, *parts[: depth + 1])} is a value, not a section"
        model = sub
    return None, f"{name}: names no key"


def _env_value(text: str, annotation: Any) -> Any:
    """Typed parsing that the schema cannot do from a string: null words and whole sections (JSON).
    Numbers and booleans stay strings; pydantic's lax mode converts them by the field's type."""
    if allows_none(annotation) and text.strip().lower() in NULL_WORDS:
        return None
    # A section, a mapping (build.lora_adapters) or a list (lora_target_modules) is given as JSON.
    containers = any(typing.get_origin(t) in (dict, list) for t in _unwrap(annotation))
    if section_model(annotation) is not None or containers:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text  # the schema reports "expected a mapping"
    return text


def trtllm_env_overrides(
    environ: Mapping[str, str], raw: RawSection, env_labels: Mapping[str, str]
) -> list[tuple[KeyPath, Any, Source]]:
    """Collect `TRTLLM_<SECTION>__<FIELD>[__<FIELD>...]` overrides. Variables without `__` are
    TensorRT-LLM's own (`TRTLLM_...` knobs) and are left alone."""
    overrides = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or ENV_SEPARATOR not in name[len(ENV_PREFIX) :]:
            continue
        path, annotation_or_problem = _parse_env_key(name)
        if path is None:
            raw.problems.append(annotation_or_problem)
            continue
        value = _env_value(environ[name], annotation_or_problem)
        overrides.append((path, value, Source("env", name + env_labels.get(name, ""))))
    return overrides


# --- DJL-Serving LMI aliases ----------------------------------------------------------------------

MODE = "{mode}"  # placeholder: build or serve, whichever the section uses


@dataclass(frozen=True)
class DjlAlias:
    names: tuple[str, ...]  # several names of one setting; they must agree when set together
    target: KeyPath


DJL_ALIASES: tuple[DjlAlias, ...] = (
    DjlAlias(("HF_MODEL_ID", "OPTION_MODEL_ID"), ("build", "huggingface_ckpt_repository")),
    DjlAlias(("OPTION_REVISION",), ("build", "huggingface_ckpt_revision")),
    DjlAlias(("TENSOR_PARALLEL_DEGREE", "OPTION_TENSOR_PARALLEL_DEGREE"), (MODE, "tensor_parallel_count")),
    DjlAlias(("PIPELINE_PARALLEL_DEGREE", "OPTION_PIPELINE_PARALLEL_DEGREE"), (MODE, "pipeline_parallel_count")),
    DjlAlias(("OPTION_MAX_INPUT_LEN",), ("build", "max_input_len")),
    DjlAlias(("OPTION_MAX_OUTPUT_LEN",), ("build", "max_output_len")),
    DjlAlias(("OPTION_MAX_ROLLING_BATCH_SIZE",), ("build", "max_batch_size")),
    DjlAlias(("OPTION_MAX_NUM_TOKENS",), ("build", "max_num_tokens")),
    DjlAlias(("OPTION_QUANTIZE",), ("build", "quantization_type")),
    DjlAlias(("OPTION_DTYPE",), ("build", "dtype")),
    DjlAlias(("OPTION_GPT_MODEL_VERSION",), ("build", "base_model_architecture")),
    DjlAlias(("OPTION_CHATGLM_MODEL_VERSION",), ("build", "chatglm_model_version")),
    DjlAlias(("OPTION_BAICHUAN_MODEL_VERSION",), ("build", "baichuan_model_version")),
    DjlAlias(("OPTION_SMOOTHQUANT_ALPHA",), ("build", "smoothquant", "alpha")),
    DjlAlias(("OPTION_SMOOTHQUANT_PER_TOKEN",), ("build", "smoothquant", "per_token")),
    DjlAlias(("OPTION_SMOOTHQUANT_PER_CHANNEL",), ("build", "smoothquant", "per_channel")),
    DjlAlias(("OPTION_MULTI_QUERY_MODE",), ("build", "smoothquant", "multi_query_mode")),
    DjlAlias(("OPTION_AWQ_FORMAT",), ("build", "awq", "format")),
    DjlAlias(("OPTION_AWQ_CALIB_SIZE",), ("build", "awq", "calib_size")),
    DjlAlias(("OPTION_MULTI_BLOCK_MODE",), ("build", "plugin_configuration", "multi_block_mode")),
    DjlAlias(("OPTION_USE_FUSED_MLP",), ("build", "plugin_configuration", "use_fused_mlp")),
    DjlAlias(("OPTION_USE_CUSTOM_ALL_REDUCE",), ("build", "plugin_configuration", "use_custom_all_reduce")),
    DjlAlias(("OPTION_TOKENS_PER_BLOCK",), ("build", "plugin_configuration", "tokens_per_block")),
    DjlAlias(("OPTION_BATCH_SCHEDULER_POLICY",), ("runtime", "batch_scheduler_policy")),
    DjlAlias(("OPTION_KV_CACHE_FREE_GPU_MEM_FRACTION",), ("runtime", "kv_cache_free_gpu_mem_fraction")),
    DjlAlias(("OPTION_MAX_NUM_SEQUENCES",), ("runtime", "max_num_sequences")),
    DjlAlias(("OPTION_ENABLE_KV_CACHE_REUSE",), ("runtime", "enable_kv_cache_reuse")),
)

# DJL settings with no counterpart here: TensorRT-LLM 0.9+ reads them from the checkpoint's
# config.json, or removed them. Reported as warnings so a migrated deployment notices.
DJL_IGNORED: dict[str, str] = {
    "OPTION_ENABLE_TRT_OVERLAP": "removed from TensorRT-LLM's batch manager",
    "OPTION_ROTARY_BASE": "read from the checkpoint's config.json",
    "OPTION_ROTARY_DIM": "read from the checkpoint's config.json",
    "OPTION_ROTARY_SCALING_TYPE": "read from the checkpoint's config.json",
    "OPTION_ROTARY_SCALING_FACTOR": "read from the checkpoint's config.json",
}
DJL_ROLLING_BATCH_OK = ("trtllm", "auto", "")
TENSOR_PARALLEL_MAX = "max"


def djl_overrides(
    environ: Mapping[str, str],
    raw: RawSection,
    mode: Literal["build", "serve"],
    accelerator: Accelerator | None,
    env_labels: Mapping[str, str],
) -> list[tuple[KeyPath, Any, Source]]:
    overrides = []
    for alias in DJL_ALIASES:
        present = [(name, environ[name].strip()) for name in alias.names if name in environ]
        if not present:
            continue
        target = tuple(mode if p == MODE else p for p in alias.target)
        key = dotted(SECTION_PATH, *target)
        if len({value for _, value in present}) > 1:
            shown = ", ".join(f"{n}={show_value(v)}" for n, v in present)
            raw.problems.append(f"{key}: DJL aliases disagree ({shown}); set only one")
            continue
        name, value = present[0]
        if target[0] == "build" and mode == "serve":
            raw.problems.append(
                f"{key}: set by {name} (DJL alias) but the configuration serves a prebuilt engine"
                f" ({SECTION_PATH}.serve); unset {name}"
            )
            continue
        if target[-1] == "tensor_parallel_count" and value.lower() == TENSOR_PARALLEL_MAX:
            if accelerator is None:
                raw.problems.append(f"{key}: {name}=max needs resources.accelerator (e.g. H100:4) to count the GPUs")
                continue
            value = str(accelerator.count)
        overrides.append((target, value, Source("env", f"{name} (DJL alias){env_labels.get(name, '')}")))
    for name, why in DJL_IGNORED.items():
        if name in environ:
            raw.warnings.append(f"{name}: ignored ({why})")
    rolling = environ.get("OPTION_ROLLING_BATCH")
    if rolling is not None and rolling.strip().lower() not in DJL_ROLLING_BATCH_OK:
        raw.warnings.append(
            f"OPTION_ROLLING_BATCH: {show_value(rolling)} ignored; this server always batches in flight"
        )
    return overrides
