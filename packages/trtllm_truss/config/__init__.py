"""The `model_metadata.trt_llm` configuration: schema, sources (file, env, DJL aliases), provenance.

See docs/configuration.md for every key, its default and the override scheme.
"""

from trtllm_truss.config.accelerator import GPU_COMPUTE_CAPABILITY, Accelerator, parse_accelerator
from trtllm_truss.config.build import AwqOptions, BuildConfig, PluginConfiguration, SmoothQuantOptions
from trtllm_truss.config.enums import (
    Architecture,
    AwqFormat,
    Backend,
    BaichuanModelVersion,
    BatchSchedulerPolicy,
    ChatglmModelVersion,
    Device,
    Dtype,
    Quantization,
)
from trtllm_truss.config.errors import ConfigError
from trtllm_truss.config.loader import ResolvedConfig, fleet_configured, load_config
from trtllm_truss.config.locations import RepositoryLocation, is_hub_repo_id, resolve_repository
from trtllm_truss.config.runtime import PytorchEngineConfig, RuntimeConfig, SyntheticEngineConfig
from trtllm_truss.config.schema import ServeConfig, TrtLlmConfig
from trtllm_truss.config.sources import DJL_ALIASES, Source, env_name

__all__ = [
    "GPU_COMPUTE_CAPABILITY",
    "DJL_ALIASES",
    "Accelerator",
    "Architecture",
    "AwqFormat",
    "AwqOptions",
    "Backend",
    "BaichuanModelVersion",
    "BatchSchedulerPolicy",
    "BuildConfig",
    "ChatglmModelVersion",
    "ConfigError",
    "Device",
    "Dtype",
    "PluginConfiguration",
    "PytorchEngineConfig",
    "Quantization",
    "RepositoryLocation",
    "ResolvedConfig",
    "RuntimeConfig",
    "ServeConfig",
    "SmoothQuantOptions",
    "Source",
    "SyntheticEngineConfig",
    "TrtLlmConfig",
    "env_name",
    "is_hub_repo_id",
    "fleet_configured",
    "load_config",
    "parse_accelerator",
    "resolve_repository",
]
