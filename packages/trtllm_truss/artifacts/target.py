"""The machine a deployment will run on, as `validate` and `build --dry-run` plan for it.

A dry run happens on a laptop or in CI, not in the image: the plan it shows must be the one the image
would make. That needs the image's TensorRT-LLM version (from `base_image.image`, for the images we
know), its Python (`base_image.python_executable_path`) and as many GPUs as the world size, named after
`resources.accelerator`. Nothing here touches the network or the image itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from trtllm_truss.planning.probe import GpuInfo, RuntimeFacts

# TensorRT-LLM inside each NVIDIA image we name, from NVIDIA's release notes
# (NVIDIA/TensorRT-LLM docs/source/release-notes.md, "Infrastructure Changes" of each release;
# tests/data/images/<image>.json keeps the source line and the test checks the two agree).
IMAGE_TRTLLM_VERSIONS: dict[str, str] = {
    "nvcr.io/nvidia/tritonserver:24.11-trtllm-python-py3": "0.15.0",  # Python 3.10 (the last image on it)
    "nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3": "0.16.0",  # Python 3.12 from here on
    "nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3": "0.17.0",
    "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3": "1.0.0",  # the LLM-API backend; Python in /usr/bin
    "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3": "1.1.0",
    "nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3": "1.2.0",  # Python in /opt/venv-tritonserver from here on
    "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3": "1.2.1",
    # Version only (tests/data/image_versions.json): from triton-inference-server/server
    # docs/introduction/compatibility.md; their Python environments are not recorded or tested.
    "nvcr.io/nvidia/tritonserver:25.05-trtllm-python-py3": "0.19.0",  # first with lookahead_* backend parameters
    "nvcr.io/nvidia/tritonserver:25.08-trtllm-python-py3": "0.21.0",  # the last 0.x
}
# The version a dry run plans for when nothing else says (the newest release with trtllm-build).
DEFAULT_PLAN_VERSION = "0.21.0"
# The interpreter a planned command names when the config does not say (NVIDIA's images: /usr/bin/python3).
DEFAULT_TARGET_PYTHON = "python3"
EXAMPLES_DIR_ENV = "TRTLLM_EXAMPLES_DIR"


@dataclass(frozen=True)
class DeployTarget:
    """What config.yaml says about the machine outside `model_metadata.trt_llm`."""

    image: str | None = None
    python: str | None = None  # base_image.python_executable_path
    environment: Mapping[str, str] | None = None  # environment_variables

    @property
    def image_trtllm_version(self) -> str | None:
        return IMAGE_TRTLLM_VERSIONS.get(self.image or "")

    @property
    def examples_dir(self) -> Path | None:
        value = (self.environment or {}).get(EXAMPLES_DIR_ENV)
        return Path(value) if value else None


def read_deploy_target(truss_dir: Path) -> DeployTarget:
    """base_image and environment_variables of `truss_dir/config.yaml` (already validated by load_config)."""
    try:
        data: Any = yaml.safe_load((Path(truss_dir) / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return DeployTarget()
    base = data.get("base_image") if isinstance(data, dict) else None
    base = base if isinstance(base, dict) else {}
    env = data.get("environment_variables") if isinstance(data, dict) else None
    env = {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
    image = base.get("image")
    python = base.get("python_executable_path")
    return DeployTarget(
        image=str(image) if image else None, python=str(python) if python else None, environment=env
    )


@dataclass(frozen=True)
class PlanVersion:
    version: str
    basis: str  # why this version: shown above the plan


def plan_version(requested: str | None, facts: RuntimeFacts, target: DeployTarget) -> PlanVersion:
    """The TensorRT-LLM version to plan for: --trtllm-version, else the one installed and usable here (this is
    the deployment machine), else the image's, else DEFAULT_PLAN_VERSION (said so)."""
    if requested:
        return PlanVersion(requested, "--trtllm-version")
    if facts.trtllm_usable and facts.trtllm_version:
        return PlanVersion(facts.trtllm_version, "installed here")
    if target.image_trtllm_version:
        return PlanVersion(target.image_trtllm_version, f"base_image {target.image}")
    shown = f"base_image {target.image} is not an image we know" if target.image else "no base_image"
    return PlanVersion(DEFAULT_PLAN_VERSION, f"{shown}; planned for {DEFAULT_PLAN_VERSION} (pass --trtllm-version)")


def target_facts(
    gpu_count: int, accelerator: Any, version: str, tensorrt_version: str | None = None, xgrammar_version: str | None = None
) -> RuntimeFacts:
    """The machine a dry run plans for: TensorRT-LLM `version` and `gpu_count` GPUs named after
    resources.accelerator (0: a CPU deployment, where backend auto means the stand-in, with this
    environment's `xgrammar_version`: our pinned requirements)."""
    name = str(getattr(accelerator, "gpu", None) or "GPU")
    if gpu_count < 1:
        return RuntimeFacts(
            gpus=(),
            trtllm_version=version,
            tensorrt_version=tensorrt_version,
            trtllm_unavailable_reason="resources.accelerator names no GPU (a CPU deployment)",
            xgrammar_version=xgrammar_version,
            notes=(f"dry run: planned for a machine without GPUs (TensorRT-LLM {version} cannot run there)",),
        )
    return RuntimeFacts(
        gpus=tuple(GpuInfo(name=name) for _ in range(gpu_count)),
        trtllm_version=version,
        tensorrt_version=tensorrt_version,
        trtllm_unavailable_reason=None,
        notes=(f"dry run: planned for TensorRT-LLM {version} on {gpu_count} x {name}",),
    )
