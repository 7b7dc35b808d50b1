"""The checkpoint's architecture against what the deployment's TensorRT-LLM serves.

NVIDIA's LLM API (the PyTorch backend, runtime.backend llmapi) picks the model class from the checkpoint's own
`config.json` (`architectures`, the first name), so on that path `build.base_model_architecture` is optional and,
when given, must agree with the checkpoint. The engine-build path (`trtllm-build`, backend tensorrtllm) still needs
it: it picks NVIDIA's convert script of that family.

What each release serves is recorded from NVIDIA's supported-models page of the release
(tests/data/trtllm_pytorch_models/<version>.json, packaged as data/pytorch_architectures.json). The checks here
are pure: the checkpoint's config.json is read before planning (`trtllm_truss.artifacts.checkpoint_config`) and
passed in as a `CheckpointArchitecture`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from trtllm_truss.config.enums import Architecture

REGISTRY_FILE = Path(__file__).resolve().parent / "data" / "pytorch_architectures.json"
_KEY = "model_metadata.trt_llm.build"

# config.json `architectures` names of each engine-build family (Hugging Face's class names: the families
# trtllm-build's convert scripts take). A name starting with one of the prefixes belongs to the family.
FAMILY_PREFIXES: dict[Architecture, tuple[str, ...]] = {
    Architecture.LLAMA: ("Llama", "Mllama", "LlavaLlama"),
    Architecture.MISTRAL: ("Mistral",),
    Architecture.MIXTRAL: ("Mixtral",),
    Architecture.DEEPSEEK: ("Deepseek", "DeepSeek"),
    Architecture.FALCON: ("Falcon", "RWForCausalLM"),
    Architecture.INTERNLM: ("InternLM",),
    Architecture.BAICHUAN: ("Baichuan", "BaiChuan"),
    Architecture.CHATGLM: ("ChatGLM", "Glm"),
    Architecture.GPTJ: ("GPTJ",),
    Architecture.QWEN: ("Qwen", "QWen"),
    Architecture.GPT2: ("GPT2",),
    Architecture.SANTACODER: ("GPTBigCode",),
    Architecture.STARCODER: ("GPTBigCode", "Starcoder2"),
}
# Multi-token prediction layers ship only in DeepSeek-V3/R1 checkpoints (speculative.mode mtp).
_MTP_PREFIXES = ("DeepseekV3", "DeepseekV32")


@dataclass(frozen=True)
class CheckpointArchitecture:
    """What the checkpoint's config.json says (`architectures`), or why it could not be read."""

    source: str  # the checkpoint as configured (hub id or path)
    architectures: tuple[str, ...] = ()
    unread: str | None = None  # why config.json was not read (None: it was)

    @property
    def name(self) -> str | None:
        """The architecture TensorRT-LLM loads: the first of `architectures` (its AutoModel reads that one)."""
        return self.architectures[0] if self.architectures else None


@lru_cache(maxsize=1)
def registry() -> dict[str, frozenset[str]]:
    """TensorRT-LLM version -> the architectures its PyTorch backend serves (the packaged record)."""
    data = json.loads(REGISTRY_FILE.read_text())
    return {version: frozenset(names) for version, names in data["versions"].items()}


def recorded_version(trtllm_version: str | None) -> str | None:
    """The recorded release `trtllm_version` is (1.2.1, or 1.2.1.post1 / 1.2.1rc0 -> 1.2.1); None when not recorded."""
    if not trtllm_version:
        return None
    for version in registry():
        if trtllm_version == version or trtllm_version.startswith(version + ".post"):
            return version
    return None


def serving_versions(name: str) -> list[str]:
    """The recorded releases whose PyTorch backend serves `name`, oldest first."""
    found = [version for version, names in registry().items() if name in names]
    return sorted(found, key=lambda v: tuple(int(p) for p in v.split(".")))


def family_of(name: str) -> Architecture | None:
    """The engine-build family a config.json architecture belongs to (None: none of them)."""
    for family, prefixes in FAMILY_PREFIXES.items():
        if name.startswith(prefixes):
            return family
    return None


def _matches(family: Architecture, name: str) -> bool:
    return name.startswith(FAMILY_PREFIXES[family])


def architecture_problems(
    build: Any, backend: str, trtllm_version: str | None, checkpoint: CheckpointArchitecture | None, speculative: Any = None
) -> list[str]:
    """One line per problem, each naming its key: base_model_architecture missing on the engine-build path or
    contradicting the checkpoint; the checkpoint's architecture not served by the deployment's TensorRT-LLM."""
    if build is None:
        return []
    given = build.base_model_architecture
    if backend == "tensorrtllm" and given is None:
        families = ", ".join(a.value for a in Architecture)
        return [
            f"{_KEY}.base_model_architecture: required on the engine-build path (backend tensorrtllm: trtllm-build"
            f" converts a checkpoint of one family: {families}); set it, or serve the checkpoint with"
            " runtime.backend: llmapi (TensorRT-LLM >= 1.0), which reads the architecture from its config.json"
        ]
    name = checkpoint.name if checkpoint is not None else None
    if name is None:
        return []
    problems = []
    if given is not None and not _matches(given, name):
        found = family_of(name)
        fix = f"set it to {found.value}" if found is not None else "correct it"
        optional = " or remove it (optional on backend llmapi)" if backend == "llmapi" else ""
        problems.append(
            f"{_KEY}.base_model_architecture: {given.value}, but the checkpoint's config.json ({checkpoint.source})"
            f" names {name}; {fix}{optional}"
        )
    if backend == "llmapi":
        version = recorded_version(trtllm_version)
        if version is not None and name not in registry()[version]:
            others = serving_versions(name)
            where = (
                f"served by TensorRT-LLM {', '.join(others)}: choose a base_image with one of them"
                if others
                else f"no recorded release ({', '.join(registry())}) serves it"
            )
            problems.append(
                f"{_KEY}.huggingface_ckpt_repository: the checkpoint's architecture {name} is not served by TensorRT-LLM"
                f" {trtllm_version}'s PyTorch backend (runtime.backend llmapi); {where}"
            )
        mode = getattr(getattr(speculative, "mode", None), "value", getattr(speculative, "mode", None))
        if mode == "mtp" and given is None and not name.startswith(_MTP_PREFIXES):
            problems.append(
                f"model_metadata.trt_llm.speculative.mode: mtp uses the checkpoint's multi-token-prediction layers,"
                f" which only DeepSeek-V3/R1 checkpoints have, not {name}"
            )
    return problems


def describe(checkpoint: CheckpointArchitecture | None, backend: str, trtllm_version: str | None) -> list[str]:
    """What `validate` prints about the checkpoint's architecture (comment lines of the plan)."""
    if checkpoint is None:
        return []
    if checkpoint.name is None:
        why = checkpoint.unread or "its config.json names no architectures"
        return [f"# architecture: not checked: {why}"]
    line = f"# architecture: {checkpoint.name} (config.json of {checkpoint.source})"
    if backend != "llmapi":
        return [line + f"; backend {backend} does not load it by this name"]
    version = recorded_version(trtllm_version)
    if version is None:
        return [line + f"; TensorRT-LLM {trtllm_version} is not a recorded release ({', '.join(registry())}): not checked"]
    served = checkpoint.name in registry()[version]
    verdict = "serves it" if served else "does not serve it"
    return [line + f"; TensorRT-LLM {trtllm_version}'s PyTorch backend {verdict}"]
