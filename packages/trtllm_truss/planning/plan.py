"""The serving plan: configuration + probed facts, every default resolved, frozen.

Stages after this one (artifacts, repository, runtime, engine, streaming, serving, fronts) read only the plan.
`make_plan` is pure given its inputs: machine facts are probed beforehand (`trtllm_truss.planning.probe`) and
passed in, and nothing is downloaded here. The plan says where every artifact will be and what must be
fetched to put it there; `trtllm_truss.artifacts.prepare_artifacts` does the fetching and returns the
plan with the engine's own limits filled in.

Paths in the plan:
- serve + tensorrtllm: `engine_dir` / `tokenizer_dir` are the download directories (or the local dirs).
- build + tensorrtllm: `engine_dir` is None until the build stage publishes the engine into the cache
  under `engine_cache_key(...)`; `tokenizer_dir` is the checkpoint's tokenizer files.
- build + llmapi: `model_dir` is the Hugging Face checkpoint NVIDIA's LLM API loads (no engine build),
  `tokenizer_dir` the same folder; `build` is the section the model.yaml is rendered from.
- pytorch (the stand-in): `model_dir` is the checkpoint it runs (the build checkpoint, or
  `runtime.pytorch.model`, which serve mode requires), and the tokenizer comes with it in build mode.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trtllm_truss.guides.engines import engine_guide_types, guide_engine, guided_decoding_off, guided_decoding_problems
from trtllm_truss.guides.tool_syntax import forced_syntax_off
from trtllm_truss.planning import lora
from trtllm_truss.planning.architectures import CheckpointArchitecture, architecture_problems
from trtllm_truss.planning.backend_settings import backend_setting_problems
from trtllm_truss.planning.probe import RuntimeFacts, version_tuple
from trtllm_truss.planning.speculation import engine_build, speculation_problems

if TYPE_CHECKING:
    from trtllm_truss.config import ResolvedConfig, RuntimeConfig
    from trtllm_truss.planning.engine_info import EngineInfo

# tensorrtllm: a TensorRT engine behind NVIDIA's C++ backend (ensemble layout); llmapi: NVIDIA's LLM API
# (PyTorch backend, TensorRT-LLM >= 1.0) behind our llmapi python model (same layout); pytorch: the stand-in.
Backend = Literal["tensorrtllm", "llmapi", "pytorch"]
LLMAPI_SINCE = (1, 0)
ArtifactRole = Literal["engine", "tokenizer", "model", "checkpoint", "draft", "adapter"]
ArtifactKind = Literal["engine", "tokenizer", "checkpoint", "adapter"]

# Bump when the key's inputs or the cached directory layout change meaning: old entries stop matching.
ENGINE_CACHE_KEY_VERSION = 1
ARTIFACTS_DIR_ENV = "TRTLLM_TRUSS_ARTIFACTS_DIR"
DEFAULT_ARTIFACTS_DIR = Path("~/.cache/trtllm-truss")
# Build fields that do not change the engine bytes: where it is published, and where the checkpoint
# lives (its identity enters the key as the resolved revision instead, so a moved local folder or a
# branch name never decides reuse).
# LoRA adapters reach NVIDIA's engine at runtime (lora_weights / lora_config), not in its bytes; the LoRA
# limits (lora_configuration: trtllm-build's --max_lora_rank, --lora_target_modules) do, and enter the key
# when set (unset, the key stays what it was before LoRA existed).
_KEY_EXCLUDED_BUILD_FIELDS = (
    "publish_repository", "huggingface_ckpt_repository", "huggingface_ckpt_revision", "lora_adapters"
)
# Limits the pytorch stand-in uses in serve mode when the checkpoint config has no context length.
_FALLBACK_CONTEXT_LEN = 2048


class PlanError(ValueError):
    """The configuration cannot run on this machine; one line per problem, each naming the key to change."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems: list[str] = list(problems) if problems else [message]


@dataclass(frozen=True)
class ArtifactRequest:
    """One artifact to make available before serving (or building)."""

    role: ArtifactRole
    source: str  # as configured: hub id, s3:// URL or path
    location: Literal["hub", "s3", "local"]
    kind: ArtifactKind
    dest: Path  # where the files will be; for local sources the directory itself
    revision: str | None = None


# TensorRT-LLM's KvCacheConfig.tokens_per_block default (the LLM API; model.yaml does not set it).
LLMAPI_TOKENS_PER_BLOCK = 32


@dataclass(frozen=True)
class ServingPlan:
    backend: Backend
    tokenizer_dir: Path
    max_batch_size: int
    max_input_len: int
    max_output_len: int
    runtime: RuntimeConfig
    engine_dir: Path | None = None  # TensorRT-LLM engine (backend "tensorrtllm")
    model_dir: Path | None = None  # Hugging Face checkpoint run by the stand-in (backend "pytorch")
    max_beam_width: int = 1
    tensor_parallel_count: int = 1
    pipeline_parallel_count: int = 1
    # --- added by the plan stage (all defaulted, so hand-made plans in tests stay short) ---
    mode: Literal["build", "serve"] = "build"
    backend_reason: str = ""  # why `backend` was chosen (shown by validate/serve)
    fetches: tuple[ArtifactRequest, ...] = ()  # what prepare_artifacts fetches before serving
    checkpoint: ArtifactRequest | None = None  # build + tensorrtllm: fetched by the builder on a cache miss
    build: Any = None  # build + tensorrtllm: the normalised BuildConfig the builder and cache key use
    facts: RuntimeFacts = field(default_factory=RuntimeFacts)
    # False while max_* are provisional: serve mode learns them from the engine (or the stand-in's
    # checkpoint) in prepare_artifacts. Renderers should refuse a plan whose limits are not final.
    limits_final: bool = True
    artifacts_dir: Path | None = None
    truss_dir: Path | None = None
    # model_metadata.trt_llm.speculative where the backend runs it (None for the stand-in), and the draft
    # checkpoint (draft_target / eagle3 on llmapi) once fetched.
    speculative: Any = None
    draft_dir: Path | None = None
    # resources.node_count and each node's GPUs: one MPI world of node_count x gpus_per_node ranks (runtime.cluster).
    node_count: int = 1
    gpus_per_node: int = 1
    # build.lora_adapters (name, NVIDIA task id, folder once fetched) and build.lora_configuration.
    lora_adapters: tuple[lora.PlannedAdapter, ...] = ()
    lora_configuration: Any = None
    # Backend llmapi where TensorRT-LLM cannot run: our llmapi model drives engine_standin/llmapi_double.py.
    llm_api_double: bool = False
    # Tokens per KV block of the engine that runs: build.plugin_configuration.tokens_per_block for an engine build
    # and the stand-in's block pool (engine_standin/kv_blocks.py), KvCacheConfig's default on llmapi; 64 (NVIDIA's
    # build default) for a prebuilt engine. Reused blocks x this = a response's cached tokens.
    tokens_per_block: int = 64

    @property
    def guided_decoding_off(self) -> str | None:
        """None when this deployment's engine path enforces guides, else why not (guides.engines)."""
        setting = getattr(self.runtime, "guided_decoding_backend", "auto")
        version = self.facts.trtllm_version
        return guided_decoding_off(setting, self.backend, version_tuple(version), version)

    @property
    def guide_engine(self) -> str | None:
        """The grammar engine ("xgrammar" | "llguidance") that enforces guides here; None when off."""
        setting = getattr(self.runtime, "guided_decoding_backend", "auto")
        return None if self.guided_decoding_off is not None else guide_engine(setting, self.backend)

    @property
    def forced_syntax_off(self) -> str | None:
        """None when forced tool calls are guided in the model family's own syntax here, else why they
        keep the JSON guide (guides.tool_syntax)."""
        return forced_syntax_off(
            backend=self.backend, engine=self.guide_engine, trtllm_version=self.facts.trtllm_version,
            llm_api_double=self.llm_api_double, xgrammar_version=self.facts.xgrammar_version,
        )

    @property
    def guide_types(self) -> tuple[str, ...] | None:
        """The guide types the engine path takes (None: all of guides.guide.GUIDE_TYPES the stand-in compiles)."""
        return engine_guide_types(self.backend)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_count * self.pipeline_parallel_count

    @property
    def tritonserver_ranks(self) -> int:
        """tritonserver processes to launch: one per rank for NVIDIA's C++ backend (leader mode under
        mpirun); one for NVIDIA's llmapi model, whose LLM API starts its own TP/PP workers (NVIDIA's
        model.py clears inherited MPI job variables for that), and one for the stand-in. Over several
        nodes every backend runs one rank per GPU of every node: the stand-in in leader mode as NVIDIA's
        backend does (so the multi-node launch runs for real without GPUs), llmapi under
        `trtllm-llmapi-launch`."""
        if self.node_count > 1:
            return self.node_count * self.gpus_per_node
        return self.world_size if self.backend == "tensorrtllm" else 1

    def with_engine(self, engine_dir: Path, info: EngineInfo) -> ServingPlan:
        """The plan once a verified engine is in place: its directory and its own limits."""
        return dataclasses.replace(
            self,
            engine_dir=Path(engine_dir),
            max_batch_size=info.max_batch_size,
            max_input_len=info.max_input_len,
            max_output_len=info.output_len_limit,
            max_beam_width=info.max_beam_width,
            limits_final=True,
        )


# --- backend choice ------------------------------------------------------------------------------


def llmapi_version_ok(version: str | None) -> bool:
    return version_tuple(version) >= LLMAPI_SINCE


def llmapi_incompatibility(build: Any) -> str | None:
    """Why NVIDIA's LLM API cannot serve this build section as is (None: it can).

    The PyTorch backend loads a checkpoint as it is: it reads a pre-quantized checkpoint's own
    quantization (ModelOpt FP8/NVFP4, `hf_quant_config.json`) but runs no calibration; only the KV-cache
    dtype is a load-time choice (`kv_cache_config.dtype: fp8`).
    """
    if build is None:
        return "serve mode names a prebuilt engine; the LLM API backend loads checkpoints"
    quantization = getattr(build.quantization_type, "value", build.quantization_type)
    if quantization not in ("no_quant", "fp8_kv"):
        return (
            f"build.quantization_type {quantization} needs a calibration/engine build; the LLM API backend loads a"
            " checkpoint as is (use quantization_type no_quant with a pre-quantized FP8/NVFP4 checkpoint, or fp8_kv)"
        )
    return None


def choose_backend(
    requested: str, facts: RuntimeFacts, world_size: int, *, build: Any = None, mode: str = "build"
) -> tuple[Backend, str]:
    """Resolve `runtime.backend`: `auto` -> llmapi (TensorRT-LLM >= 1.0, build mode, a checkpoint it can load as
    is) or tensorrtllm, only when TensorRT-LLM and enough GPUs are really there; else the pytorch stand-in."""
    requested = getattr(requested, "value", requested)
    if requested == "pytorch":
        return "pytorch", "runtime.backend is pytorch (the stand-in engine)"
    if requested == "llmapi" and not facts.trtllm_usable:
        problem = llmapi_incompatibility(build if mode == "build" else None)
        if problem is not None:
            raise PlanError(f"runtime.backend is llmapi but {problem}; or set runtime.backend: tensorrtllm")
        return "llmapi", (
            f"runtime.backend is llmapi, but {facts.trtllm_unavailable_reason}: our llmapi model runs on the LLM-API"
            " double (engine_standin/llmapi_double.py: the stand-in engine behind the LLM API's names), which exists"
            " only because TensorRT-LLM cannot run here"
        )
    if requested in ("tensorrtllm", "llmapi"):
        if not facts.trtllm_usable:
            raise PlanError(
                f"runtime.backend is {requested} but {facts.trtllm_unavailable_reason}; "
                "set runtime.backend: auto (or pytorch) to run the PyTorch stand-in on this machine"
            )
        if facts.gpu_count < world_size:
            raise PlanError(
                f"runtime.backend is {requested} with world size {world_size} (tensor x pipeline parallel) but "
                f"{facts.gpu_count} GPU(s) are visible; lower tensor_parallel_count/pipeline_parallel_count "
                f"or run on {world_size} GPUs"
            )
        if requested == "llmapi":
            if not llmapi_version_ok(facts.trtllm_version):
                raise PlanError(
                    f"runtime.backend is llmapi but TensorRT-LLM {facts.trtllm_version} is installed; NVIDIA's LLM API"
                    " backend (all_models/llmapi) needs TensorRT-LLM >= 1.0: use runtime.backend: tensorrtllm or auto"
                )
            problem = llmapi_incompatibility(build if mode == "build" else None)
            if problem is not None:
                raise PlanError(f"runtime.backend is llmapi but {problem}; or set runtime.backend: tensorrtllm")
            return "llmapi", f"runtime.backend is llmapi (TensorRT-LLM {facts.trtllm_version} LLM API)"
        return "tensorrtllm", f"runtime.backend is tensorrtllm (TensorRT-LLM {facts.trtllm_version})"
    if requested != "auto":
        raise PlanError(f"runtime.backend is {requested!r}; allowed values: auto, tensorrtllm, llmapi, pytorch")
    if not facts.trtllm_usable:
        return "pytorch", f"backend auto -> pytorch: {facts.trtllm_unavailable_reason}"
    if facts.gpu_count < world_size:
        return "pytorch", (
            f"backend auto -> pytorch: world size {world_size} needs {world_size} GPUs, {facts.gpu_count} visible"
        )
    if llmapi_version_ok(facts.trtllm_version):
        problem = llmapi_incompatibility(build if mode == "build" else None)
        if problem is None:
            return "llmapi", (
                f"backend auto -> llmapi: TensorRT-LLM {facts.trtllm_version} LLM API (PyTorch backend) on {facts.gpu_model}"
            )
        return "tensorrtllm", f"backend auto -> tensorrtllm (an engine): {problem}"
    return "tensorrtllm", f"backend auto -> tensorrtllm: TensorRT-LLM {facts.trtllm_version} on {facts.gpu_model}"


# --- artifact locations --------------------------------------------------------------------------


def artifacts_dir_from(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(environ.get(ARTIFACTS_DIR_ENV) or DEFAULT_ARTIFACTS_DIR).expanduser()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", text).strip("-.") or "default"


def _request(
    resolved: ResolvedConfig,
    role: ArtifactRole,
    source: str,
    revision: str | None,
    kind: ArtifactKind,
    artifacts_dir: Path,
    key_path: str,
) -> ArtifactRequest:
    """Where `source` will be on disk. Only checks path existence (via the config's resolver)."""
    try:
        location = resolved.resolve_repository(source)
    except ValueError as exc:
        raise PlanError(f"model_metadata.trt_llm.{key_path}: {exc}") from None
    if location.kind == "local":
        assert location.local_path is not None
        if revision:
            raise PlanError(
                f"model_metadata.trt_llm.{key_path}: {source!r} is a local folder, which has no revisions; "
                "remove the revision setting"
            )
        return ArtifactRequest(role, source, "local", kind, location.local_path, None)
    name = location.repo_id if location.kind == "hub" else f"s3--{location.bucket}--{location.prefix}"
    dest = artifacts_dir / "downloads" / kind / _slug(str(name)) / _slug(revision or "default")
    return ArtifactRequest(role, source, location.kind, kind, dest, revision)


# --- make_plan -----------------------------------------------------------------------------------


def make_plan(
    resolved: ResolvedConfig,
    facts: RuntimeFacts,
    *,
    artifacts_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
    checkpoint_architecture: CheckpointArchitecture | None = None,
) -> ServingPlan:
    """Turn a validated config and the machine's facts into a frozen plan (no downloads, no builds).
    `checkpoint_architecture`: the checkpoint's config.json, read beforehand where it is wanted (validate, init:
    `trtllm_truss.artifacts.checkpoint_config`); checked against the deployment's TensorRT-LLM."""
    trt = resolved.trt_llm
    runtime = trt.runtime
    root = Path(artifacts_dir) if artifacts_dir is not None else artifacts_dir_from(environ)
    node_count = resolved.node_count
    # The config checked that the world fills node_count nodes: each node needs its share of the GPUs.
    ranks_per_node = max(1, trt.world_size // node_count)
    backend, reason = choose_backend(runtime.backend, facts, ranks_per_node, build=trt.build, mode=trt.mode)
    problems = backend_setting_problems(trt, backend, facts.trtllm_version, llm_api_double=not facts.trtllm_usable)
    problems += speculation_problems(trt, backend, facts.trtllm_version)
    problems += guided_decoding_problems(
        runtime.guided_decoding_backend, backend, version_tuple(facts.trtllm_version), facts.trtllm_version
    )
    problems += lora.backend_problems(trt.build, runtime, backend, facts.trtllm_version)
    problems += architecture_problems(trt.build, backend, facts.trtllm_version, checkpoint_architecture, trt.speculative)
    if problems:
        raise PlanError("; ".join(problems), problems)
    common: dict[str, Any] = {
        "backend": backend,
        "backend_reason": reason,
        "runtime": runtime,
        "mode": trt.mode,
        "facts": facts,
        "artifacts_dir": root,
        "truss_dir": resolved.truss_dir,
        # The stand-in is one process whatever TP/PP the engine it stands in for would use.
        "tensor_parallel_count": trt.tensor_parallel_count if backend != "pytorch" else 1,
        "pipeline_parallel_count": trt.pipeline_parallel_count if backend != "pytorch" else 1,
        "speculative": trt.speculative if backend != "pytorch" else None,
        "node_count": node_count,
        "gpus_per_node": ranks_per_node if node_count > 1 else 1,
    }
    model_override = runtime.pytorch.model

    if trt.build is not None:
        build = trt.build
        limits = {
            "max_batch_size": build.max_batch_size,
            "max_input_len": build.max_input_len,
            "max_output_len": build.max_output_len,
            "max_beam_width": build.max_beam_width,
        }
        checkpoint = _request(
            resolved,
            "checkpoint",
            build.huggingface_ckpt_repository,
            build.huggingface_ckpt_revision,
            "checkpoint",
            root,
            "build.huggingface_ckpt_repository",
        )
        if backend == "pytorch":
            model = checkpoint
            if model_override is not None:
                model = _request(resolved, "model", model_override, None, "checkpoint", root, "runtime.pytorch.model")
            model = dataclasses.replace(model, role="model")
            adapters = _plan_adapters(resolved, build, root, common)
            return ServingPlan(
                tokenizer_dir=model.dest, model_dir=model.dest, fetches=(model, *adapters),
                tokens_per_block=build.plugin_configuration.tokens_per_block, **limits, **common,
            )
        if backend == "llmapi":
            # NVIDIA's LLM API loads the checkpoint itself: fetched like the stand-in's, no engine build.
            model = dataclasses.replace(checkpoint, role="model")
            fetches: tuple[ArtifactRequest, ...] = (model, *_plan_adapters(resolved, build, root, common))
            common["llm_api_double"] = not facts.trtllm_usable
            spec = trt.speculative
            if spec is not None and spec.draft_repository is not None:
                draft = _request(
                    resolved, "draft", spec.draft_repository, spec.draft_revision, "checkpoint", root,
                    "speculative.draft_repository",
                )
                fetches += (draft,)
                common["draft_dir"] = draft.dest
            return ServingPlan(
                tokenizer_dir=model.dest, model_dir=model.dest, fetches=fetches, build=build,
                tokens_per_block=LLMAPI_TOKENS_PER_BLOCK, **limits, **common,
            )
        # tensorrtllm: the tokenizer comes from the checkpoint; the weights only on a cache miss.
        tokenizer = dataclasses.replace(
            checkpoint, role="tokenizer", kind="tokenizer", dest=_tokenizer_dest(checkpoint, root)
        )
        adapters = _plan_adapters(resolved, build, root, common)
        return ServingPlan(
            tokenizer_dir=tokenizer.dest,
            fetches=(tokenizer, *adapters),
            checkpoint=checkpoint,
            build=engine_build(build, trt.speculative),
            tokens_per_block=build.plugin_configuration.tokens_per_block,
            **limits,
            **common,
        )

    serve = trt.serve
    assert serve is not None  # the config guarantees exactly one of build / serve
    tokenizer = _request(
        resolved,
        "tokenizer",
        serve.tokenizer_repository,
        serve.tokenizer_revision,
        "tokenizer",
        root,
        "serve.tokenizer_repository",
    )
    # Provisional limits: the engine's config.json (or the stand-in checkpoint) decides them in prepare_artifacts.
    provisional = {
        "max_batch_size": 1,
        "max_input_len": 1,
        "max_output_len": 1,
        "max_beam_width": 1,
        "limits_final": False,
    }
    if backend == "pytorch":
        if model_override is None:
            raise PlanError(
                "model_metadata.trt_llm.runtime.pytorch.model: required when serving a prebuilt engine with the "
                "pytorch stand-in (an engine holds no Hugging Face weights); set it to a checkpoint path or hub id"
            )
        model = _request(resolved, "model", model_override, None, "checkpoint", root, "runtime.pytorch.model")
        return ServingPlan(
            tokenizer_dir=tokenizer.dest, model_dir=model.dest, fetches=(model, tokenizer), **provisional, **common
        )
    engine = _request(
        resolved, "engine", serve.engine_repository, serve.engine_revision, "engine", root, "serve.engine_repository"
    )
    return ServingPlan(
        tokenizer_dir=tokenizer.dest, engine_dir=engine.dest, fetches=(engine, tokenizer), **provisional, **common
    )


def _plan_adapters(resolved: ResolvedConfig, build: Any, root: Path, common: dict[str, Any]) -> tuple[ArtifactRequest, ...]:
    """build.lora_adapters in configuration order (task ids follow it), each fetched like a checkpoint; sets
    the plan's `lora_adapters` / `lora_configuration` in `common` and checks the local ones' configs."""
    requests = [
        (name, _request(resolved, "adapter", source.repo, source.revision, "adapter", root, f"build.lora_adapters.{name}.repo"))
        for name, source in (build.lora_adapters or {}).items()
    ]
    common["lora_adapters"] = tuple(
        lora.PlannedAdapter(name, task_id, request.dest) for task_id, (name, request) in enumerate(requests, start=1)
    )
    common["lora_configuration"] = build.lora_configuration
    problems = lora.check_adapters(common["lora_adapters"], build.lora_configuration)
    if problems:
        raise PlanError("; ".join(problems), problems)
    return tuple(request for _, request in requests)


def _tokenizer_dest(checkpoint: ArtifactRequest, root: Path) -> Path:
    if checkpoint.location == "local":
        return checkpoint.dest  # a local checkpoint holds its tokenizer: use it in place
    return root / "downloads" / "tokenizer" / checkpoint.dest.parent.name / checkpoint.dest.name


def stand_in_limits(model_config: Mapping[str, Any], runtime: RuntimeConfig) -> dict[str, int]:
    """Limits for the pytorch stand-in in serve mode, where no build section states them:
    the checkpoint's context window, a quarter of it for generation."""
    context = model_config.get("max_position_embeddings")
    if not isinstance(context, int) or context < 2:
        context = _FALLBACK_CONTEXT_LEN
    output = max(1, context // 4)
    return {
        "max_batch_size": runtime.max_num_sequences or 32,
        "max_input_len": context - output,
        "max_output_len": output,
        "max_beam_width": 1,
    }


# --- engine cache key ----------------------------------------------------------------------------


def _build_section_dict(build: Any) -> dict[str, Any]:
    if hasattr(build, "model_dump"):
        data = build.model_dump(mode="json")  # every field, defaults included: the normalised section
    elif isinstance(build, Mapping):
        data = json.loads(json.dumps(dict(build), default=str))
    else:
        raise TypeError(f"build must be a BuildConfig or a mapping, got {type(build).__name__}")
    for name in _KEY_EXCLUDED_BUILD_FIELDS:
        data.pop(name, None)
    if data.get("lora_configuration", 0) is None:
        del data["lora_configuration"]
    return data


def engine_cache_key_inputs(
    build: Any,
    *,
    checkpoint_revision: str,
    facts: RuntimeFacts,
    checkpoint_repo_id: str | None = None,
) -> dict[str, Any]:
    """Everything that changes the engine bytes, as plain JSON data (shown by `trtllm-truss build`).

    `checkpoint_revision` must be immutable: a hub commit sha or a content fingerprint
    (`trtllm_truss.artifacts.resolve_revision`), never a branch name. Runtime-only knobs
    (`runtime.*`) are not inputs; neither is any token.
    """
    if not checkpoint_revision or not isinstance(checkpoint_revision, str):
        raise ValueError("checkpoint_revision must be the resolved commit sha or content fingerprint")
    section = _build_section_dict(build)
    return {
        "cache_key_version": ENGINE_CACHE_KEY_VERSION,
        "build": section,
        "checkpoint": {"repo_id": checkpoint_repo_id, "revision": checkpoint_revision},
        "tensorrt_llm_version": facts.trtllm_version,
        "tensorrt_version": facts.tensorrt_version,
        "gpu": {"model": facts.gpu_model, "sm": facts.gpu_sm},
        "tensor_parallel": section.get("tensor_parallel_count", 1),
        "pipeline_parallel": section.get("pipeline_parallel_count", 1),
    }


def engine_cache_key(
    build: Any,
    *,
    checkpoint_revision: str,
    facts: RuntimeFacts,
    checkpoint_repo_id: str | None = None,
) -> str:
    """sha256 (hex) over the canonical JSON of `engine_cache_key_inputs`."""
    inputs = engine_cache_key_inputs(
        build, checkpoint_revision=checkpoint_revision, facts=facts, checkpoint_repo_id=checkpoint_repo_id
    )
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
