"""The whole serving stack in one call: config -> plan -> artifacts -> repository -> ready tritonserver.

`trtllm-truss serve` and `LLMService.load()` (the truss startup hook) both use `start_stack`, so the
composition of the stages lives in exactly one place.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from trtllm_truss.plan import ServingPlan
from trtllm_truss.probe import RuntimeFacts
from trtllm_truss.supervisor import TritonPorts, TritonServer
from trtllm_truss.tritonserver_install import locate_tritonserver

logger = logging.getLogger(__name__)
# `typing.Self` is Python 3.11+; the package supports 3.10.
_StackT = TypeVar("_StackT", bound="RunningStack")

# Called with a short description of each stage as it starts (e.g. to drive a spinner).
ProgressCallback = Callable[[str], None]
BuildEngine = Callable[[ServingPlan], Path]


@dataclass
class RunningStack:
    """A ready tritonserver serving the repository rendered for `plan`."""

    plan: ServingPlan
    server: TritonServer
    repository_dir: Path
    # Removed on stop() when start_stack created it.
    _scratch_dir: Path | None = field(default=None, repr=False)
    # Holds the engine cache's lease on the entry being served, so eviction leaves it alone.
    _engine_builder: object | None = field(default=None, repr=False)

    def stop(self) -> None:
        self.server.stop()
        if self._scratch_dir is not None:
            shutil.rmtree(self._scratch_dir, ignore_errors=True)
            self._scratch_dir = None

    def __enter__(self: _StackT) -> _StackT:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _noop(_: str) -> None:
    pass


def start_stack(
    truss_dir: Path | str,
    *,
    secrets: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    facts: RuntimeFacts | None = None,
    repository_dir: Path | None = None,
    ports: TritonPorts | None = None,
    build_engine: BuildEngine | None = None,
    startup_timeout_s: float | None = None,
    progress: ProgressCallback = _noop,
) -> RunningStack:
    """Bring the stack up and return it once the ensemble is ready.

    `environ` is what the configuration's environment overrides are read from (default: os.environ);
    tritonserver inherits the process environment minus every credential (trtllm_truss.child_env).
    `repository_dir` defaults to a fresh temporary directory removed by `RunningStack.stop()`. Errors of every stage propagate with their own
    message (ConfigError, PlanError, FetchError, RepositoryError, TritonInstallError, TritonStartupError).
    """
    # Imported here: each stage pulls in its own dependencies, and `validate` never needs them.
    from trtllm_truss.artifacts import prepare_artifacts
    from trtllm_truss.config import load_config
    from trtllm_truss.plan import make_plan
    from trtllm_truss.probe import probe_facts
    from trtllm_truss.repository import ENSEMBLE, IDS_ENSEMBLE, render_repository
    from trtllm_truss.repository.models import ENGINE

    progress("reading the configuration")
    resolved = load_config(Path(truss_dir), environ)
    if secrets is not None:  # truss's mapping can hold values load_config could not see (e.g. a local run's)
        from trtllm_truss.config.errors import remember_secret_values
        from trtllm_truss.config.secrets import secret_values

        remember_secret_values(secret_values(resolved.secrets, secrets=secrets, environ=environ))
    if facts is None:
        progress("probing GPUs and TensorRT-LLM")
        facts = probe_facts()
    plan = make_plan(resolved, facts, environ=environ)
    logger.info("backend %s (%s), world size %d", plan.backend, plan.backend_reason, plan.world_size)
    # Before any download or build: a missing tritonserver should cost seconds, not a fetched engine.
    binary = locate_tritonserver(plan.runtime.tritonserver_path)

    if build_engine is None and plan.backend == "tensorrtllm" and plan.mode == "build":
        from trtllm_truss.artifacts.engine_builder import EngineBuilder

        build_engine = EngineBuilder(secrets=secrets, environ=environ)
    progress("fetching model artifacts" if plan.backend == "pytorch" else "fetching or building the engine")
    plan, _ = prepare_artifacts(plan, secrets=secrets, environ=environ, build_engine=build_engine)

    scratch = None
    if repository_dir is None:
        scratch = Path(tempfile.mkdtemp(prefix="trtllm-truss-stack-"))
        repository_dir = scratch / "model_repository"
    server: TritonServer | None = None
    try:
        progress("rendering the Triton model repository")
        render_repository(plan, repository_dir)
        server = TritonServer(
            repository_dir,
            world_size=plan.tritonserver_ranks,
            binary=binary,
            ports=ports,
            startup_timeout_s=startup_timeout_s or plan.runtime.startup_timeout_s,
            # NVIDIA's llmapi layout is one model, no ensembles.
            ready_models=(ENGINE,) if plan.backend == "llmapi" else (ENSEMBLE, IDS_ENSEMBLE),
        )
        progress(f"starting tritonserver (world size {plan.world_size}, {plan.tritonserver_ranks} process(es))")
        server.start()
        progress("waiting for the models to be ready")
        server.wait_ready()
    except BaseException:
        if server is not None:
            server.stop()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    return RunningStack(
        plan=plan, server=server, repository_dir=Path(repository_dir), _scratch_dir=scratch, _engine_builder=build_engine
    )
