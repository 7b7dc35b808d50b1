"""What a verified engine's config.json says (`trtllm_truss.artifacts.engine_config` reads it), in one
shape for both layouts: the facts `ServingPlan.with_engine` takes its final limits from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from trtllm_truss.planning.probe import GpuInfo


@dataclass(frozen=True)
class EngineInfo:
    """What an engine's config.json says, in one shape for both layouts."""

    layout: Literal["new", "old"]
    version: str | None  # TensorRT-LLM version that built it; the old layout does not record it
    architecture: str
    dtype: str
    tensor_parallel: int
    pipeline_parallel: int
    world_size: int
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    max_batch_size: int
    max_input_len: int
    max_seq_len: int | None  # new layout: input + output
    max_output_len: int | None  # old layout (and new layouts up to ~0.10)
    max_beam_width: int
    max_num_tokens: int | None
    plugin_config: Mapping[str, Any] = field(default_factory=dict)
    rank_files: tuple[str, ...] = ()
    build_gpu: GpuInfo | None = None

    @property
    def output_len_limit(self) -> int:
        """Longest generation the engine allows for a maximal prompt (what requests are checked against)."""
        if self.max_output_len is not None:
            return self.max_output_len
        assert self.max_seq_len is not None
        return max(self.max_seq_len - self.max_input_len, 0)
