"""The serving plan: configuration + probed facts, every default resolved, frozen.

Stages after this one (artifacts, repository, supervisor, service) read only the plan.
`make_plan` and the cache key are filled in by the artifacts work (issue 5); the dataclass below is
the contract the repository renderer and the service code against.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from trtllm_truss.config import RuntimeConfig

Backend = Literal["tensorrtllm", "pytorch"]


@dataclass(frozen=True)
class ServingPlan:
    backend: Backend
    tokenizer_dir: Path
    max_batch_size: int
    max_input_len: int
    max_output_len: int
    runtime: "RuntimeConfig"
    engine_dir: Path | None = None  # TensorRT-LLM engine (backend "tensorrtllm")
    model_dir: Path | None = None  # Hugging Face checkpoint run by the stand-in (backend "pytorch")
    max_beam_width: int = 1
    tensor_parallel_count: int = 1
    pipeline_parallel_count: int = 1

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_count * self.pipeline_parallel_count
