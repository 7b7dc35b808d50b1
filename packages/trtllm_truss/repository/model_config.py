"""Typed mirror of the parts of Triton's `ModelConfig` protobuf that our repository uses.

Field names follow `model_config.proto` (triton-inference-server/common) so that the text-format
writer can print them one to one; `pbtxt.py` turns these objects into `config.pbtxt`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class DataType(str, enum.Enum):
    BOOL = "TYPE_BOOL"
    UINT8 = "TYPE_UINT8"
    UINT64 = "TYPE_UINT64"
    INT32 = "TYPE_INT32"
    INT64 = "TYPE_INT64"
    FP16 = "TYPE_FP16"
    FP32 = "TYPE_FP32"
    STRING = "TYPE_STRING"


class InstanceKind(str, enum.Enum):
    CPU = "KIND_CPU"
    GPU = "KIND_GPU"
    MODEL = "KIND_MODEL"


@dataclass(frozen=True)
class Tensor:
    """One `input` or `output` entry. `dims` exclude the batch dimension (max_batch_size > 0)."""

    name: str
    data_type: DataType
    dims: tuple[int, ...]
    optional: bool = False  # inputs only
    allow_ragged_batch: bool = False  # inputs only
    reshape: tuple[int, ...] | None = None  # e.g. () to drop a [1] dim for the C++ backend

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Tensor.name must not be empty")
        if not self.dims:
            raise ValueError(f"Tensor {self.name!r}: dims must not be empty")
        if any(d == 0 or d < -1 for d in self.dims):
            raise ValueError(f"Tensor {self.name!r}: dims must be positive or -1, got {list(self.dims)}")


@dataclass(frozen=True)
class InstanceGroup:
    count: int
    kind: InstanceKind = InstanceKind.CPU

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"instance_group.count must be >= 1, got {self.count}")


@dataclass(frozen=True)
class DynamicBatching:
    max_queue_delay_microseconds: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_size: int | None = None  # default_queue_policy.max_queue_size; None = unbounded
    preserve_ordering: bool = False  # responses leave in the order requests arrived, across instances


@dataclass(frozen=True)
class EnsembleStep:
    """`input_map` / `output_map` keys are the step model's tensor names, values ensemble tensors."""

    model_name: str
    input_map: tuple[tuple[str, str], ...]
    output_map: tuple[tuple[str, str], ...]
    model_version: int = -1


@dataclass(frozen=True)
class ModelConfig:
    name: str
    max_batch_size: int
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    backend: str | None = None  # "python", "tensorrtllm"
    platform: str | None = None  # "ensemble"
    decoupled: bool | None = None  # model_transaction_policy.decoupled; None = not written
    dynamic_batching: DynamicBatching | None = None
    instance_groups: tuple[InstanceGroup, ...] = ()
    parameters: tuple[tuple[str, str], ...] = ()  # all Triton parameters are strings
    ensemble_steps: tuple[EnsembleStep, ...] = ()
    extra: dict[str, str] = field(default_factory=dict, compare=False)  # not written; notes for tests

    def __post_init__(self) -> None:
        if (self.backend is None) == (self.platform is None):
            raise ValueError(f"model {self.name!r}: exactly one of backend or platform must be set")
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            names = [t.name for t in tensors]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError(f"model {self.name!r}: duplicate {kind} names {duplicates}")
        keys = [k for k, _ in self.parameters]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            raise ValueError(f"model {self.name!r}: duplicate parameters {duplicates}")

    def input(self, name: str) -> Tensor:
        return _find(self.inputs, name, f"{self.name}.input")

    def output(self, name: str) -> Tensor:
        return _find(self.outputs, name, f"{self.name}.output")

    @property
    def parameter_dict(self) -> dict[str, str]:
        return dict(self.parameters)


def _find(tensors: tuple[Tensor, ...], name: str, where: str) -> Tensor:
    for tensor in tensors:
        if tensor.name == name:
            return tensor
    raise KeyError(f"{where}: no tensor named {name!r}")
