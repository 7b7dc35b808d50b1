"""Engine acquisition for build mode: cache key -> local cache -> (shared hub store) -> build.

`EngineBuilder` is the `build_engine` callable `prepare_artifacts` takes: given a build-mode plan it
returns the engine directory, building at most once per cache key across every process that shares
the cache directory. The key comes from `trtllm_truss.planning.plan.engine_cache_key` (build section,
checkpoint commit, TensorRT-LLM / TensorRT versions, GPU, TP/PP); the token is never part of it.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from trtllm_truss.artifacts.build import BuildPlan, plan_build
from trtllm_truss.artifacts.build_recipes import BuildPlanError
from trtllm_truss.artifacts.build_runner import LineSink, engine_create_fn
from trtllm_truss.artifacts.cache import EngineCache
from trtllm_truss.artifacts.hub_engine_store import HubEngineStore, decide_remote_use
from trtllm_truss.artifacts.engine_config import write_build_record
from trtllm_truss.config.child_env import child_environment
from trtllm_truss.planning.plan import ServingPlan, engine_cache_key_inputs

logger = logging.getLogger(__name__)

EXAMPLES_DIR_ENV = "TRTLLM_EXAMPLES_DIR"
# Where NVIDIA's containers put the examples of the installed release (tests/data/images records the
# Triton images' layout with its sources):
# - /app/examples: Triton's trtllm-python-py3 images from 25.01 (tensorrtllm_backend v0.17.0 on,
#   dockerfile/Dockerfile.triton.trt_llm_backend: `WORKDIR /app`, `COPY tensorrt_llm/examples examples`);
#   24.12 and earlier ship no examples at all.
# - /app/tensorrt_llm/examples: TensorRT-LLM's own release image (docker/Dockerfile.multi, stage
#   `release`: `WORKDIR /app/tensorrt_llm`, `COPY examples examples`).
EXAMPLES_DIR_CANDIDATES = (
    Path("/app/examples"),
    Path("/app/tensorrt_llm/examples"),
)
ENGINE_CACHE_SUBDIR = "engines"
MAX_CACHE_BYTES_ENV = "TRTLLM_TRUSS_ENGINE_CACHE_MAX_BYTES"


def find_examples_dir(environ: Mapping[str, str] | None = None, *, root: Path = Path("/")) -> Path | None:
    """TRTLLM_EXAMPLES_DIR, else the first of EXAMPLES_DIR_CANDIDATES (under `root`, the filesystem
    root but for tests) that holds a directory; None when the image has no examples."""
    environ = os.environ if environ is None else environ
    configured = environ.get(EXAMPLES_DIR_ENV)
    if configured:
        return Path(configured)
    candidates = (root / path.relative_to("/") for path in EXAMPLES_DIR_CANDIDATES)
    return next((path for path in candidates if path.is_dir()), None)


@dataclass(frozen=True)
class EngineAcquisition:
    """What `trtllm-truss build` reports."""

    key: str
    key_inputs: dict[str, Any]
    engine_dir: Path
    source: Literal["local", "built", "remote"]
    seconds: float
    total_bytes: int
    file_count: int


class EngineBuilder:
    """Callable `build_engine(plan) -> engine_dir` for `prepare_artifacts` (build mode, tensorrtllm)."""

    def __init__(
        self,
        *,
        secrets: Mapping[str, object] | None = None,
        environ: Mapping[str, str] | None = None,
        cache_root: Path | None = None,
        max_cache_bytes: int | None = None,
        examples_dir: Path | None = None,
        python: str = sys.executable,
        trtllm_build: str = "trtllm-build",
        sink: LineSink | None = None,
    ) -> None:
        self.secrets = secrets
        self.environ = dict(os.environ if environ is None else environ)
        self.cache_root = cache_root
        if max_cache_bytes is None and self.environ.get(MAX_CACHE_BYTES_ENV):
            max_cache_bytes = int(self.environ[MAX_CACHE_BYTES_ENV])
        self.max_cache_bytes = max_cache_bytes
        self.examples_dir = examples_dir
        self.python = python
        self.trtllm_build = trtllm_build
        self.sink = sink
        # Kept for the life of the process: the cache holds a lease on the entry we serve from.
        self._caches: dict[Path, EngineCache] = {}
        self.last_acquisition: EngineAcquisition | None = None

    def __call__(self, plan: ServingPlan) -> Path:
        return self.acquire(plan).engine_dir

    def _token(self) -> str | None:
        from trtllm_truss.artifacts.hub import resolve_hf_token

        return resolve_hf_token(self.secrets, self.environ)

    def _cache(self, plan: ServingPlan) -> EngineCache:
        root = self.cache_root or (Path(plan.artifacts_dir or ".").expanduser() / ENGINE_CACHE_SUBDIR)
        root = Path(root).resolve()
        if root not in self._caches:
            self._caches[root] = EngineCache(root, max_bytes=self.max_cache_bytes)
        return self._caches[root]

    def cache_key(self, plan: ServingPlan, *, token: str | None = None) -> tuple[str, dict[str, Any]]:
        """(key, the inputs it hashes); resolves the checkpoint revision to a commit/fingerprint."""
        from trtllm_truss.artifacts.revision_record import REVISIONS_SUBDIR

        checkpoint = _require_build_plan(plan)
        return self.key_for(
            plan.build, source=checkpoint.source, revision=checkpoint.revision, location=checkpoint.location,
            facts=plan.facts, truss_dir=plan.truss_dir, token=token,
            record_dir=self._cache(plan).root / REVISIONS_SUBDIR,
        )

    def key_for(
        self, build: Any, *, source: str, revision: str | None, location: str, facts: Any,
        truss_dir: Path | None, token: str | None = None, record_dir: Path | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """`record_dir`: where each hub revision, once resolved, is recorded, so a replica whose engine is
        cached starts while the hub is unreachable (the key needs the checkpoint's commit)."""
        from trtllm_truss.artifacts.fetch import resolve_revision
        from trtllm_truss.artifacts.hub import HubUnreachableError
        from trtllm_truss.artifacts.revision_record import read_revision_record, write_revision_record
        from trtllm_truss.planning.plan import engine_cache_key

        try:
            resolved = resolve_revision(
                source, revision=revision, kind="checkpoint", token=token, environ=self.environ, base_dir=truss_dir
            )
        except HubUnreachableError:
            recorded = read_revision_record(record_dir, source, revision) if location == "hub" else None
            if recorded is None:
                raise
            logger.warning(
                "hub unreachable: using the recorded revision %s of %s@%s for the engine cache key",
                recorded[:16], source, revision or "main",
            )
            resolved = recorded
        else:
            if location == "hub":
                write_revision_record(record_dir, source, revision, resolved)
        kwargs = dict(checkpoint_revision=resolved, facts=facts, checkpoint_repo_id=source if location == "hub" else None)
        return engine_cache_key(build, **kwargs), engine_cache_key_inputs(build, **kwargs)

    def build_plan_for(
        self, build: Any, checkpoint_dir: Path, trtllm_version: str, *, output_dir: Path | None = None
    ) -> BuildPlan:
        """The commands a build would run (for `--dry-run` and machines without TensorRT-LLM)."""
        return plan_build(
            build,
            trtllm_version=trtllm_version,
            checkpoint_dir=checkpoint_dir,
            output_dir=output_dir or Path("<engine cache>/scratch/<key>/engine"),
            work_dir=Path("<engine cache>/scratch/<key>/work"),
            examples_dir=self.examples_dir or find_examples_dir(self.environ),
            python=self.python,
            trtllm_build=self.trtllm_build,
        )

    def acquire(self, plan: ServingPlan) -> EngineAcquisition:
        from trtllm_truss.artifacts.fetch import fetch_repository

        checkpoint = _require_build_plan(plan)
        version = plan.facts.trtllm_version
        if not version:
            raise BuildPlanError(
                "cannot build an engine: TensorRT-LLM is not installed here (run `trtllm-truss build --dry-run` "
                "to see the commands, or build on a GPU machine with TensorRT-LLM)"
            )
        token = self._token()
        key, inputs = self.cache_key(plan, token=token)
        cache = self._cache(plan)
        local_hit = cache.lookup(key) is not None
        decision = decide_remote_use(getattr(plan.build, "publish_repository", None), local_hit=local_hit)
        remote = None
        if decision.look_up_remote and plan.build.publish_repository.startswith("s3://"):
            from trtllm_truss.artifacts.remote_store import S3EngineStore

            remote = S3EngineStore(plan.build.publish_repository, environ=self.environ)
        elif decision.look_up_remote:
            from trtllm_truss.artifacts.hub import hub_endpoint

            remote = HubEngineStore(plan.build.publish_repository, token=token, endpoint=hub_endpoint(self.environ))
        logger.info("engine cache key %s (%s)", key, decision.reason)

        examples_dir = self.examples_dir or find_examples_dir(self.environ)
        examples_missing = examples_dir is None and not version.startswith(("1.", "2."))

        resolved_revision = inputs["checkpoint"]["revision"]

        def fetch_checkpoint(repository: str, revision: str | None, dest_root: Path) -> Path:
            # The resolved commit, not the branch: the engine must match the key it is stored under.
            pinned = resolved_revision if checkpoint.location == "hub" else checkpoint.revision
            result = fetch_repository(
                checkpoint.source, checkpoint.dest, revision=pinned, kind="checkpoint", token=token,
                environ=self.environ, base_dir=plan.truss_dir,
            )
            return result.path

        create = engine_create_fn(
            plan.build,
            trtllm_version=version,
            fetch_checkpoint=fetch_checkpoint,
            work_root=checkpoint.dest,
            examples_dir=examples_dir,
            python=self.python,
            trtllm_build=self.trtllm_build,
            env=child_environment(self.environ, secrets=(token,) if token else ()),
            sink=self.sink,
            secrets=(token,) if token else (),
        )
        def create_with_build_record(dest: Path) -> None:
            # Checked only when a build really runs: an engine in the cache or the fleet's store needs no scripts.
            if examples_missing:
                raise BuildPlanError(
                    f"TensorRT-LLM {version} builds with NVIDIA's examples/ scripts, which this image does not have"
                    f" (looked in {', '.join(map(str, EXAMPLES_DIR_CANDIDATES))}; Triton's trtllm images ship them"
                    f" in /app/examples from 25.01 on, 24.12 and earlier not at all); set {EXAMPLES_DIR_ENV} to the"
                    " examples directory of that release (a checkout of NVIDIA/TensorRT-LLM at its tag), or serve a"
                    " prebuilt engine (serve.engine_repository)"
                )
            create(dest)
            write_build_record(dest, plan.facts.gpus[0] if plan.facts.gpus else None, trtllm_version=version, cache_key=key)

        result = cache.get(key, create_with_build_record, remote=remote)
        self.last_acquisition = EngineAcquisition(
            key=key,
            key_inputs=inputs,
            engine_dir=result.path,
            source=result.source,
            seconds=result.seconds,
            total_bytes=result.total_bytes,
            file_count=len(result.manifest.files),
        )
        return self.last_acquisition


def _require_build_plan(plan: ServingPlan):
    if plan.mode != "build" or plan.build is None or plan.checkpoint is None:
        raise BuildPlanError(
            "model_metadata.trt_llm.build: this plan has no build section (serve mode fetches a prebuilt engine)"
        )
    return plan.checkpoint
