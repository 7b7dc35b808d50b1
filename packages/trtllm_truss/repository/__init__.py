"""ServingPlan -> Triton model repository (ensemble, ensemble_ids, preprocessing, tensorrt_llm, postprocessing)."""

from trtllm_truss.repository.model_config import (
    DataType,
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    InstanceKind,
    ModelConfig,
    Tensor,
)
from trtllm_truss.repository.models import (
    ENSEMBLE,
    IDS_ENSEMBLE,
    MODEL_NAMES,
    TENSORRTLLM_BACKEND_VERSION,
    WINDOW_RELAY,
    RepositoryError,
    repository_configs,
)
from trtllm_truss.repository.pbtxt import to_pbtxt
from trtllm_truss.repository.render import render_repository

__all__ = [
    "ENSEMBLE",
    "IDS_ENSEMBLE",
    "MODEL_NAMES",
    "TENSORRTLLM_BACKEND_VERSION",
    "WINDOW_RELAY",
    "DataType",
    "DynamicBatching",
    "EnsembleStep",
    "InstanceGroup",
    "InstanceKind",
    "ModelConfig",
    "RepositoryError",
    "Tensor",
    "render_repository",
    "repository_configs",
    "to_pbtxt",
]
