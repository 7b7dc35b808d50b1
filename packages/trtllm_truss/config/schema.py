"""The `model_metadata.trt_llm` schema: strict pydantic models, no I/O in any validator.

Checks that need facts from outside the section (the GPUs in `resources.accelerator`) live in
`trtllm_truss.config.checks`; everything here depends only on the section itself.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trtllm_truss.config.build import BuildConfig
from trtllm_truss.config.enums import Backend, ParallelCount
from trtllm_truss.config.fields import NonEmptyStr, StrictModel, field_problem
from trtllm_truss.config.fleet import FleetConfig
from trtllm_truss.config.runtime import RuntimeConfig
from trtllm_truss.config.speculative import SpeculativeConfig


# --- serve --------------------------------------------------------------------------------------


class ServeConfig(StrictModel):
    engine_repository: NonEmptyStr = Field(description="Hub repo id, s3:// URL or local path of a built engine.")
    engine_revision: NonEmptyStr | None = Field(None, description="Hub branch, tag or commit of the engine.")
    tokenizer_repository: NonEmptyStr = Field(description="Hub repo id or local path; defaults to engine_repository.")
    tokenizer_revision: NonEmptyStr | None = Field(
        None, description="Defaults to engine_revision when the tokenizer is the engine's repository."
    )
    tensor_parallel_count: ParallelCount = Field(1, description="Must equal the engine's tp_size.")
    pipeline_parallel_count: ParallelCount = Field(1, description="Must equal the engine's pp_size.")

    @model_validator(mode="before")
    @classmethod
    def _tokenizer_defaults_to_engine(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("tokenizer_repository") is None and "engine_repository" in data:
            data = {**data, "tokenizer_repository": data["engine_repository"]}
            if data.get("tokenizer_revision") is None:
                data["tokenizer_revision"] = data.get("engine_revision")
        return data

    @model_validator(mode="after")
    def _s3_urls_name_a_bucket(self) -> ServeConfig:
        for field in ("engine_repository", "tokenizer_repository"):
            value = getattr(self, field)
            if value.startswith("s3://") and not value[len("s3://") :].strip("/"):
                raise field_problem(field, f"{value!r} names no bucket; expected s3://BUCKET/PREFIX")
        if self.engine_repository.startswith("s3://") and self.engine_revision is not None:
            raise field_problem("engine_revision", "revisions apply to hub repositories, not s3:// URLs; remove it")
        return self


# --- the section --------------------------------------------------------------------------------


class TrtLlmConfig(StrictModel):
    build: BuildConfig | None = None
    serve: ServeConfig | None = None
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    speculative: SpeculativeConfig | None = None
    fleet: FleetConfig | None = None  # several replicas behind Dynamo's router (config.fleet)

    @model_validator(mode="after")
    def _exactly_one_mode(self) -> TrtLlmConfig:
        if self.build is not None and self.serve is not None:
            raise field_problem(
                "", "build and serve cannot both be set; keep build (compile an engine) or serve (a prebuilt engine)"
            )
        if self.build is None and self.serve is None:
            raise field_problem("", "set exactly one of build (compile from a checkpoint) or serve (a prebuilt engine)")
        if self.build is not None and not self.runtime.enable_chunked_context:
            limit = self.build.max_num_tokens
            if limit is not None and limit < self.build.max_input_len:
                raise field_problem(
                    "build.max_num_tokens",
                    f"{limit} is below build.max_input_len {self.build.max_input_len}, so a"
                    " full prompt never fits one engine step; raise it or set runtime.enable_chunked_context: true",
                )
        plugins = self.build.plugin_configuration if self.build is not None else None
        if plugins is not None and not plugins.use_paged_context_fmha:
            for flag in ("enable_kv_cache_reuse", "enable_chunked_context"):
                if getattr(self.runtime, flag):
                    raise field_problem(
                        f"runtime.{flag}", "needs build.plugin_configuration.use_paged_context_fmha: true"
                    )
        if self.runtime.event_buffer_max_size and not self.runtime.enable_kv_cache_reuse:
            # TensorRT-LLM emits KV cache events only with block reuse on (LLM.get_kv_cache_events).
            raise field_problem("runtime.event_buffer_max_size", "needs runtime.enable_kv_cache_reuse: true")
        if plugins is not None and not plugins.paged_kv_cache and self.runtime.enable_kv_cache_reuse:
            raise field_problem(
                "runtime.enable_kv_cache_reuse", "needs build.plugin_configuration.paged_kv_cache: true"
            )
        if self.speculative is not None and self.build is not None and self.build.max_beam_width > 1:
            raise field_problem(
                "build.max_beam_width",
                f"{self.build.max_beam_width} with speculative decoding: NVIDIA's decoding mode is either beam_search"
                " or a speculative one (lookahead, eagle, ...), never both; set max_beam_width: 1 or remove speculative",
            )
        if self.serve is not None and self.runtime.backend is Backend.PYTORCH and self.runtime.pytorch.model is None:
            raise field_problem(
                "runtime.pytorch.model",
                "required with backend pytorch in serve mode (a prebuilt engine has no"
                " Hugging Face checkpoint for the stand-in to run)",
            )
        return self

    @property
    def mode(self) -> Literal["build", "serve"]:
        return "build" if self.build is not None else "serve"

    @property
    def section(self) -> BuildConfig | ServeConfig:
        section = self.build if self.build is not None else self.serve
        assert section is not None  # guaranteed by _exactly_one_mode
        return section

    @property
    def tensor_parallel_count(self) -> int:
        return self.section.tensor_parallel_count

    @property
    def pipeline_parallel_count(self) -> int:
        return self.section.pipeline_parallel_count

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_count * self.pipeline_parallel_count
