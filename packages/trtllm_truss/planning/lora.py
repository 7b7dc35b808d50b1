"""LoRA adapters: what the plan serves, and whether the engine's limits can take each adapter.

`build.lora_adapters` names adapters (peft folders: `adapter_config.json` + `adapter_model.safetensors`);
each gets NVIDIA's `lora_task_id`, its 1-based position in the configuration, which is what the stream
workers send to pick it and what the engine maps back to the adapter. `build.lora_configuration` holds
the engine's limits (Baseten's `max_lora_rank`, `lora_target_modules` in NVIDIA's module names, and
`max_loras`). An adapter's own `adapter_config.json` is read here, never in the schema validators: at plan
time for a local folder, after the fetch for a hub or S3 one (`artifacts.prepare`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_truss.config.build import LORA_MODULES, LoraConfiguration

SECTION = "model_metadata.trt_llm.build"
HF_TO_NVIDIA = {hf: nvidia for nvidia, hf in LORA_MODULES.items()}
# Backends whose LoRA path this truss does not wire yet: the setting would do nothing there (none today:
# backend llmapi sends each task id's adapter as a LoRARequest, triton_models/tensorrt_llm_llmapi).
_NOT_WIRED: dict[str, str] = {}
# Engines of TensorRT-LLM >= 1.0 are built through the LLM API (artifacts/build.py, llm_api flow), whose
# LoRA build options this truss does not set yet.
_CPP_LORA_BEFORE = (1, 0)


# runtime keys that are NVIDIA's C++ backend parameters of the same names (tensorrtllm_backend v0.19.0
# model_instance_state.cc; README "LoRa").
LORA_CACHE_KEYS = (
    "lora_cache_optimal_adapter_size",
    "lora_cache_max_adapter_size",
    "lora_cache_gpu_memory_fraction",
    "lora_cache_host_memory_bytes",
)


@dataclass(frozen=True)
class PlannedAdapter:
    """One served adapter: its name (the OpenAI `model`), NVIDIA's task id, and where its files are."""

    name: str
    task_id: int
    dir: Path
    nvidia_dir: Path | None = None  # tensorrtllm: NVIDIA's model.lora_weights.npy / model.lora_config.npy


@dataclass(frozen=True)
class AdapterInfo:
    """What the engine's limits are checked against, from peft's adapter_config.json."""

    rank: int
    hf_modules: tuple[str, ...]  # Hugging Face module names (last component), sorted

    @property
    def nvidia_modules(self) -> tuple[str, ...]:
        return tuple(sorted(HF_TO_NVIDIA[m] for m in self.hf_modules if m in HF_TO_NVIDIA))


class AdapterError(ValueError):
    """An adapter folder whose config cannot be read as a LoRA adapter (one line, naming the adapter)."""


def read_adapter(name: str, directory: Path) -> AdapterInfo:
    path = Path(directory) / "adapter_config.json"
    where = f"{SECTION}.lora_adapters.{name}"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AdapterError(f"{where}: cannot read {path} ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise AdapterError(f"{where}: {path} is not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(config, Mapping) or config.get("peft_type", "LORA") != "LORA":
        kind = config.get("peft_type") if isinstance(config, Mapping) else type(config).__name__
        raise AdapterError(f"{where}: {path} is a {kind} adapter, not LoRA")
    modules = config.get("target_modules")
    if isinstance(modules, str):
        raise AdapterError(
            f"{where}: target_modules is the pattern {modules!r}; the engine needs the module names listed"
            " (q_proj, v_proj, ...)"
        )
    if not isinstance(modules, list) or not modules or not all(isinstance(m, str) for m in modules):
        raise AdapterError(f"{where}: {path} lists no target_modules")
    ranks = [config.get("r")] + list((config.get("rank_pattern") or {}).values())
    if not all(isinstance(r, int) and r >= 1 for r in ranks):
        raise AdapterError(f"{where}: {path} has no valid rank r (got {config.get('r')!r})")
    return AdapterInfo(rank=max(ranks), hf_modules=tuple(sorted({m.rsplit(".", 1)[-1] for m in modules})))


def adapter_problems(name: str, info: AdapterInfo, limits: LoraConfiguration | None) -> list[str]:
    """Why the engine's LoRA limits cannot take this adapter, one line each naming it (empty: they can)."""
    limits = limits or LoraConfiguration()
    where = f"{SECTION}.lora_adapters.{name}"
    problems = []
    unknown = [m for m in info.hf_modules if m not in HF_TO_NVIDIA]
    if unknown:
        problems.append(
            f"{where}: targets {', '.join(unknown)}, which NVIDIA's LoRA does not apply to (it takes"
            f" {', '.join(sorted(HF_TO_NVIDIA))})"
        )
    if info.rank > limits.max_lora_rank:
        problems.append(
            f"{where}: rank {info.rank} is above {SECTION}.lora_configuration.max_lora_rank {limits.max_lora_rank};"
            " raise max_lora_rank or use a smaller adapter"
        )
    allowed = set(limits.lora_target_modules)
    if allowed:
        outside = [m for m in info.nvidia_modules if m not in allowed]
        if outside:
            problems.append(
                f"{where}: targets {', '.join(outside)} (NVIDIA's names), not in {SECTION}.lora_configuration."
                f"lora_target_modules [{', '.join(limits.lora_target_modules)}]; add them there"
            )
    return problems


def check_adapters(adapters: tuple[PlannedAdapter, ...], limits: LoraConfiguration | None) -> list[str]:
    """Problems of every adapter whose folder is there (a remote one not yet fetched is checked after)."""
    problems: list[str] = []
    for adapter in adapters:
        if not (adapter.dir / "adapter_config.json").is_file():
            continue
        try:
            problems += adapter_problems(adapter.name, read_adapter(adapter.name, adapter.dir), limits)
        except AdapterError as exc:
            problems.append(str(exc))
    return problems


def backend_problems(build: Any, runtime: Any, backend: str, trtllm_version: str | None = None) -> list[str]:
    """LoRA settings given to a backend (or a path) that would not apply them, one line each."""
    problems = []
    if backend == "llmapi":
        problems += [
            f"model_metadata.trt_llm.runtime.{name}: a parameter of NVIDIA's C++ backend; the LLM-API backend sizes"
            " its LoRA cache by adapters (LoraConfig.max_loras / max_cpu_loras); remove it"
            for name in LORA_CACHE_KEYS
            if getattr(runtime, name) is not None
        ]
    if build is None or not build.lora_adapters:
        return problems
    if backend in _NOT_WIRED:
        problems.append(
            f"{SECTION}.lora_adapters: not served by backend {backend}: {_NOT_WIRED[backend]}; use backend pytorch"
        )
    elif backend == "tensorrtllm":
        match = re.match(r"^\s*v?(\d+)\.(\d+)", trtllm_version or "")
        if match and (int(match[1]), int(match[2])) >= _CPP_LORA_BEFORE:
            problems.append(
                f"{SECTION}.lora_adapters: TensorRT-LLM {trtllm_version} engines are built through the LLM API, whose"
                " LoRA build options this truss does not set yet; use a 0.x release (tritonserver 25.08 or older)"
            )
        limits = build.lora_configuration
        if limits is not None and limits.max_loras is not None:
            problems.append(
                f"{SECTION}.lora_configuration.max_loras: not a setting of NVIDIA's C++ backend, whose LoRA cache is"
                " sized by runtime.lora_cache_gpu_memory_fraction / lora_cache_host_memory_bytes; remove it"
            )
        if limits is None or not limits.lora_target_modules:
            problems.append(
                f"{SECTION}.lora_configuration.lora_target_modules: required with backend tensorrtllm: the engine is"
                " built for these modules (trtllm-build --lora_target_modules), e.g. [attn_q, attn_k, attn_v, attn_dense]"
            )
        if getattr(build.dtype, "value", build.dtype) != "float16":
            problems.append(
                f"{SECTION}.dtype: LoRA on backend tensorrtllm needs float16 (NVIDIA's lora_weights input is"
                f" TYPE_FP16), not {getattr(build.dtype, 'value', build.dtype)}"
            )
    elif getattr(runtime.detokenize_in, "value", runtime.detokenize_in) == "postprocessing":
        # NVIDIA's ensemble (v0.19.0 config.pbtxt) has no lora_task_id input to pass on.
        problems.append(
            "model_metadata.trt_llm.runtime.detokenize_in: postprocessing streams through NVIDIA's ensemble, which"
            " has no lora_task_id input, so build.lora_adapters could not be picked; use detokenize_in: proxy"
        )
    return problems


def lora_build_flags(build: Any) -> list[str]:
    """trtllm-build's LoRA flags for an engine that serves build.lora_adapters (NVIDIA's
    tensorrt_llm/commands/build.py, 0.16.0 to 0.21.0): the LoRA plugin in the model's dtype, the rank the
    plugin's workspace is sized for, and the modules (given on the command line, which NVIDIA prefers over
    reading them from --lora_dir, so the adapters are not needed to build)."""
    if not getattr(build, "lora_adapters", None):
        return []
    limits = build.lora_configuration or LoraConfiguration()
    return [
        "--lora_plugin", build.dtype.value,
        "--max_lora_rank", str(limits.max_lora_rank),
        "--lora_target_modules", *limits.lora_target_modules,
    ]


def stand_in_parameter(adapters: tuple[PlannedAdapter, ...]) -> str:
    """The stand-in's `lora_adapters` parameter: JSON {task id: {"name", "dir"}}."""
    return json.dumps({str(a.task_id): {"name": a.name, "dir": str(a.dir)} for a in adapters}, sort_keys=True)


def worker_lora_weights(adapters: tuple[PlannedAdapter, ...]) -> dict[str, str]:
    """What the stream workers send the C++ backend per task id (WorkerSettings.lora_weights)."""
    return {str(a.task_id): str(a.nvidia_dir) for a in adapters if a.nvidia_dir is not None}


def task_ids(adapters: tuple[PlannedAdapter, ...]) -> dict[str, int]:
    return {a.name: a.task_id for a in adapters}
