"""`resources.accelerator` ("H100:2") parsed into a GPU type, a count and its compute capability.

Parsed here rather than through truss so that the serving container needs no truss import; the
spellings follow truss 0.18's `AcceleratorSpec` (a string `TYPE[:COUNT]` or `{accelerator, count}`).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_truss.config.errors import did_you_mean

# Compute capability (SM, major*10 + minor) of the GPU types truss can request. FP8 kernels need
# SM >= 89, bfloat16 needs SM >= 80.
GPU_COMPUTE_CAPABILITY: dict[str, int] = {
    "V100": 70,
    "T4": 75,
    "A100": 80,
    "A100_40GB": 80,
    "A10G": 86,
    "L4": 89,
    "L40S": 89,
    "H100": 90,
    "H100_40GB": 90,
    "H200": 90,
    "B200": 100,
    "B300": 103,
    "GB300": 103,
    "RTX_PRO_6000": 120,
}

FP8_MIN_COMPUTE_CAPABILITY = 89
BF16_MIN_COMPUTE_CAPABILITY = 80
# NVFP4 kernels are Blackwell's (SM 10.x, 12.x): TensorRT-LLM 0.17 release notes, "Blackwell support ... NVFP4".
FP4_MIN_COMPUTE_CAPABILITY = 100

# Memory of one GPU of each type, GiB, as NVIDIA's datasheets state it (the driver reports a little less:
# an H100 80GB shows 81559 MiB). Only the KV-cache estimate of `trtllm-truss validate` reads it.
GPU_MEMORY_GIB: dict[str, float] = {
    "V100": 16,
    "T4": 16,
    "A100": 80,
    "A100_40GB": 40,
    "A10G": 24,
    "L4": 24,
    "L40S": 48,
    "H100": 80,
    "H100_40GB": 40,
    "H200": 141,
    "B200": 180,
    "B300": 288,
    "GB300": 288,
    "RTX_PRO_6000": 96,
}


@dataclass(frozen=True)
class Accelerator:
    gpu: str
    count: int

    @property
    def compute_capability(self) -> int | None:
        """SM version as an int (90 for H100), or None for a GPU type missing from the table."""
        return GPU_COMPUTE_CAPABILITY.get(self.gpu)

    @property
    def memory_gib(self) -> float | None:
        """Memory of one GPU (GiB), or None for a GPU type missing from the table."""
        return GPU_MEMORY_GIB.get(self.gpu)

    def __str__(self) -> str:
        return self.gpu if self.count == 1 else f"{self.gpu}:{self.count}"


def gpus_with_compute_capability(minimum: int) -> list[str]:
    return [gpu for gpu, sm in GPU_COMPUTE_CAPABILITY.items() if sm >= minimum]


def parse_accelerator(value: object) -> Accelerator | None:
    """Parse `resources.accelerator`; None when no GPU is requested. Raises ValueError (message
    without the key path; the caller adds it)."""
    if value is None or value == "":
        return None
    if isinstance(value, dict):
        unknown = set(value) - {"accelerator", "count"}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}; allowed: accelerator, count")
        gpu, count = value.get("accelerator"), value.get("count", 1)
        if gpu is None:
            return None
    elif isinstance(value, str):
        gpu, _, count_text = value.strip().partition(":")
        count = count_text if count_text else 1
    else:
        raise ValueError(f"expected a string like 'H100:2', got {type(value).__name__}")
    gpu = str(gpu).strip()
    if gpu not in GPU_COMPUTE_CAPABILITY and gpu != "B10":
        allowed = ", ".join(GPU_COMPUTE_CAPABILITY)
        raise ValueError(f"unknown GPU type {gpu!r};{did_you_mean(gpu, GPU_COMPUTE_CAPABILITY)} allowed: {allowed}")
    try:
        count_int = int(count)
    except (TypeError, ValueError):
        raise ValueError(f"GPU count {count!r} is not a positive integer (format TYPE:COUNT, e.g. 'H100:2')") from None
    if count_int < 1:
        raise ValueError(f"GPU count {count_int} is not a positive integer (format TYPE:COUNT, e.g. 'H100:2')")
    return Accelerator(gpu=gpu, count=count_int)
