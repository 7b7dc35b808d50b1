"""Facts about the machine, probed once: GPUs, TensorRT-LLM / TensorRT versions, whether TRT-LLM can run.

Probing does I/O (runs `nvidia-smi`, reads installed-package metadata), so it lives here and nowhere
near the config validators. `make_plan` takes the resulting `RuntimeFacts` as an argument, which keeps
planning a pure function that tests can feed with any machine they like.

TensorRT-LLM is detected from package metadata rather than by importing it: `import tensorrt_llm`
alone costs ~16 s and initialises CUDA.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import re
import shutil
import subprocess
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

# Distribution names under which TensorRT has been published on PyPI / NVIDIA's index.
_TENSORRT_DISTRIBUTIONS = ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt_cu12", "tensorrt-libs")
_TRTLLM_DISTRIBUTIONS = ("tensorrt_llm", "tensorrt-llm")


@dataclass(frozen=True)
class GpuInfo:
    """One visible GPU as nvidia-smi reports it."""

    name: str  # e.g. "NVIDIA H100 80GB HBM3"
    compute_capability: str | None = None  # e.g. "9.0"; None when the driver cannot report it
    memory_mib: int | None = None

    @property
    def sm(self) -> int | None:
        """Compute capability as TensorRT names it (`sm_90` -> 90)."""
        if not self.compute_capability:
            return None
        major, _, minor = self.compute_capability.partition(".")
        return int(major) * 10 + int(minor or 0)


@dataclass(frozen=True)
class RuntimeFacts:
    """What this machine can run. Frozen so it can be probed once and passed around."""

    gpus: tuple[GpuInfo, ...] = ()
    trtllm_version: str | None = None
    tensorrt_version: str | None = None
    # Why TensorRT-LLM cannot run here (None when it can); shown when `backend: tensorrtllm` is forced.
    trtllm_unavailable_reason: str | None = "TensorRT-LLM is not installed"
    # xgrammar's version where installed (TensorRT-LLM's pin, or ours): whether forced tool calls can be
    # guided in the family's own syntax (guides.tool_syntax.forced_syntax_off).
    xgrammar_version: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def gpu_model(self) -> str | None:
        return self.gpus[0].name if self.gpus else None

    @property
    def gpu_sm(self) -> int | None:
        return self.gpus[0].sm if self.gpus else None

    @property
    def trtllm_usable(self) -> bool:
        return self.trtllm_unavailable_reason is None


def _installed_version(distributions: tuple[str, ...]) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def parse_nvidia_smi_csv(
    text: str, columns: tuple[str, ...] = ("name", "compute_cap", "memory.total")
) -> tuple[GpuInfo, ...]:
    """Parse `nvidia-smi --query-gpu=<columns> --format=csv,noheader,nounits` output."""
    gpus: list[GpuInfo] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        row = dict(zip(columns, (p.strip() for p in line.split(","))))
        cap = row.get("compute_cap")
        mem = row.get("memory.total", "")
        gpus.append(
            GpuInfo(
                name=row.get("name", "unknown GPU"),
                compute_capability=cap if cap and cap not in ("[N/A]", "N/A") else None,
                memory_mib=int(mem) if mem.isdigit() else None,
            )
        )
    return tuple(gpus)


def probe_gpus(nvidia_smi: str | None = None, timeout_s: float = 15.0) -> tuple[tuple[GpuInfo, ...], str | None]:
    """Return (GPUs, note). No nvidia-smi or a failing one means no usable GPU; the note says why."""
    binary = nvidia_smi or shutil.which("nvidia-smi")
    if not binary:
        return (), "nvidia-smi not found: no NVIDIA GPU visible"
    # compute_cap needs driver >= 510; older drivers reject the field, so retry without it.
    for query in ("name,compute_cap,memory.total", "name,memory.total"):
        try:
            done = subprocess.run(
                [binary, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return (), f"nvidia-smi failed: {exc}"
        if done.returncode == 0:
            note = None if "compute_cap" in query else "driver cannot report compute capability"
            return parse_nvidia_smi_csv(done.stdout, tuple(query.split(","))), note
    return (), f"nvidia-smi exited {done.returncode}: {done.stderr.strip()[:200]}"


def probe_facts(*, nvidia_smi: str | None = None) -> RuntimeFacts:
    """Probe this machine once. Cheap (no TensorRT-LLM import); call it at startup, not per request."""
    gpus, gpu_note = probe_gpus(nvidia_smi)
    trtllm_version = _installed_version(_TRTLLM_DISTRIBUTIONS)
    tensorrt_version = _installed_version(_TENSORRT_DISTRIBUTIONS)
    if trtllm_version is None or importlib.util.find_spec("tensorrt_llm") is None:
        reason: str | None = "TensorRT-LLM is not installed (pip package tensorrt_llm)"
    elif not gpus:
        reason = f"TensorRT-LLM {trtllm_version} is installed but no GPU is visible ({gpu_note})"
    else:
        reason = None
    facts = RuntimeFacts(
        gpus=gpus,
        trtllm_version=trtllm_version,
        tensorrt_version=tensorrt_version,
        trtllm_unavailable_reason=reason,
        xgrammar_version=_installed_version(("xgrammar",)),
        notes=tuple(n for n in (gpu_note,) if n),
    )
    logger.debug("probed runtime facts: %s", facts)
    return facts


def version_tuple(version: str | None) -> tuple[int, int]:
    """(major, minor) of a TensorRT-LLM version string; (0, 0) when there is none."""
    match = re.match(r"^\s*v?(\d+)\.(\d+)", version or "")
    return (int(match[1]), int(match[2])) if match else (0, 0)
