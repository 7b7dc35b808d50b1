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

from trtllm_truss.runtime.cluster import ClusterPlan
from trtllm_truss.planning.plan import ServingPlan
from trtllm_truss.planning.probe import RuntimeFacts
from trtllm_truss.runtime.launch import TritonPorts, choose_free_ports
from trtllm_truss.runtime.supervisor import (
    ServerExit,
    TritonServer,
)
from trtllm_truss.runtime.tritonserver_install import locate_tritonserver

logger = logging.getLogger(__name__)
# `typing.Self` is Python 3.11+; the package supports 3.10.
_StackT = TypeVar("_StackT", bound="RunningStack")

# Called with a short description of each stage as it starts (e.g. to drive a spinner).
ProgressCallback = Callable[[str], None]
BuildEngine = Callable[[ServingPlan], Path]


@dataclass
class RunningStack:
    """A ready tritonserver serving the repository rendered for `plan`; on a worker node of a multi-node
    group (`cluster.group.node_rank` > 0) no server: the node's artifacts and repository are in place and
    node 0's mpirun starts this node's ranks."""

    plan: ServingPlan
    server: TritonServer | None
    repository_dir: Path
    cluster: ClusterPlan | None = None
    # Removed on stop() when start_stack created it.
    _scratch_dir: Path | None = field(default=None, repr=False)
    # Holds the engine cache's lease on the entry being served, so eviction leaves it alone.
    _engine_builder: object | None = field(default=None, repr=False)

    @property
    def is_worker_node(self) -> bool:
        return self.server is None

    def stop(self) -> None:
        if self.server is not None:
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
    tritonserver inherits the process environment minus every credential (trtllm_truss.config.child_env).
    `repository_dir` defaults to a fresh temporary directory removed by `RunningStack.stop()`
    (several nodes: always `<artifacts>/repositories/<content digest>`, the same path on every node; on a
    worker node the stack stops there, prepared, with no server). Errors of every stage propagate with their own
    message (ConfigError, PlanError, FetchError, RepositoryError, TritonInstallError, TritonStartupError).
    """
    # Imported here: each stage pulls in its own dependencies, and `validate` never needs them.
    from trtllm_truss.artifacts import prepare_artifacts
    from trtllm_truss.config import load_config
    from trtllm_truss.planning.plan import make_plan
    from trtllm_truss.planning.probe import probe_facts
    from trtllm_truss.repository import ENSEMBLE, IDS_ENSEMBLE, render_repository

    progress("reading the configuration")
    resolved = load_config(Path(truss_dir), environ, secrets=secrets)
    if facts is None:
        progress("probing GPUs and TensorRT-LLM")
        facts = probe_facts()
    plan = make_plan(resolved, facts, environ=environ)
    logger.info("backend %s (%s), world size %d", plan.backend, plan.backend_reason, plan.world_size)
    cluster = None
    if plan.node_count > 1:  # before any download: a group that does not match fails in seconds
        from trtllm_truss.runtime.cluster import cluster_plan

        cluster = cluster_plan(plan.tritonserver_ranks, plan.node_count, plan.gpus_per_node, environ)
        for line in cluster.describe():
            logger.info("%s", line)
        logger.info("this is node %d (%s)", cluster.group.node_rank, cluster.group.hosts[cluster.group.node_rank])
    # Before any download or build: a missing tritonserver should cost seconds, not a fetched engine.
    binary = locate_tritonserver(plan.runtime.tritonserver_path)

    if build_engine is None and plan.backend == "tensorrtllm" and plan.mode == "build":
        from trtllm_truss.artifacts.engine_builder import EngineBuilder

        build_engine = EngineBuilder(secrets=secrets, environ=environ)
    progress("fetching model artifacts" if plan.backend == "pytorch" else "fetching or building the engine")
    # A node of a multi-node world fetches only its own ranks' engine files (a prebuilt engine; a build
    # makes every rank's).
    engine_ranks = None
    if cluster is not None and plan.backend == "tensorrtllm" and plan.mode == "serve":
        engine_ranks = [p.rank for p in cluster.placement() if p.node == cluster.group.node_rank]
    plan, _ = prepare_artifacts(
        plan, secrets=secrets, environ=environ, build_engine=build_engine, engine_ranks=engine_ranks
    )

    if cluster is not None:
        # Every node renders the same repository at the same path (mpirun hands each rank node 0's paths).
        progress("rendering the Triton model repository")
        repository_dir = render_node_repository(plan, plan.artifacts_dir or Path(tempfile.gettempdir()))
        if not cluster.group.is_leader:
            logger.info(
                "node %d of %d is prepared (repository %s); node 0's mpirun starts its ranks",
                cluster.group.node_rank, cluster.group.node_count, repository_dir,
            )
            return RunningStack(plan=plan, server=None, repository_dir=repository_dir, cluster=cluster)
    # A multi-node world's hostfile goes to the scratch directory too.
    scratch = Path(tempfile.mkdtemp(prefix="trtllm-truss-stack-")) if repository_dir is None or cluster else None
    if repository_dir is None:
        assert scratch is not None
        repository_dir = scratch / "model_repository"
    server: TritonServer | None = None
    try:
        launch: dict = {}
        if cluster is None:
            progress("rendering the Triton model repository")
            render_repository(plan, repository_dir)
        else:
            assert scratch is not None
            launch = _prepare_world(plan, cluster, Path(repository_dir), scratch, environ, progress)
        server = TritonServer(
            repository_dir,
            world_size=plan.tritonserver_ranks,
            binary=binary,
            ports=ports,
            startup_timeout_s=startup_timeout_s or plan.runtime.startup_timeout_s,
            ready_models=(ENSEMBLE, IDS_ENSEMBLE),
            **launch,
        )
        if cluster is not None:
            server.add_exit_listener(lambda event: _log_world_exit(cluster, event))
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
        plan=plan,
        server=server,
        repository_dir=Path(repository_dir),
        cluster=cluster,
        _scratch_dir=scratch,
        _engine_builder=build_engine,
    )


def render_node_repository(plan: ServingPlan, artifacts_dir: Path) -> Path:
    """Render into `<artifacts>/repositories/<digest of the content>`: the same config gives every node the
    same path; a repository already there (an earlier start, or a node sharing the cache) is reused."""
    import os

    from trtllm_truss.runtime.cluster import repository_digest
    from trtllm_truss.repository import render_repository

    root = Path(artifacts_dir) / "repositories"
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".render-", dir=root))
    try:
        rendered = render_repository(plan, scratch / "model_repository")
        final = root / repository_digest(rendered)[:24]
        if not final.exists():
            try:
                os.rename(rendered, final)
            except OSError:
                if not final.exists():  # not another node's identical rendering winning the race
                    raise
        return final
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _prepare_world(
    plan: ServingPlan,
    cluster: ClusterPlan,
    repository_dir: Path,
    scratch: Path,
    environ: Mapping[str, str] | None = None,
    progress: ProgressCallback = _noop,
) -> dict:
    """Node 0's part of a world over several nodes, before mpirun: wait until every other node answers
    through the launch agent, write the hostfile, and return TritonServer's options (placement, environment
    forwarding, the rank wrapper that waits for each node's repository, rank 0's rendezvous address).
    Settings come from `environ` (default os.environ); what is forwarded, from the children's environment."""
    import os

    from trtllm_truss.config import child_env
    from trtllm_truss.runtime.cluster import (
        NODE_WAIT_ENV,
        WORLD_ADDRESS_ENV,
        launch_agent,
        node_wait_s,
        rank_env_args,
        rank_wrapper,
        wait_for_nodes,
        write_hostfile,
    )
    from trtllm_truss.repository.render import MARKER_FILE

    settings = os.environ if environ is None else environ
    wait_s, agent = node_wait_s(settings), launch_agent(settings)
    progress("waiting for every node to be reachable")
    wait_for_nodes(cluster, agent, wait_s, env=child_env.child_environment())
    # Both reach every rank (forwarded): the stand-in's rendezvous with rank 0, and how long it waits.
    extra_env = {WORLD_ADDRESS_ENV: f"{cluster.group.hosts[0]}:{choose_free_ports().http}", NODE_WAIT_ENV: str(wait_s)}
    rank_prefix = rank_env_args(child_env.child_environment({**os.environ, **extra_env}))
    rank_prefix += rank_wrapper(repository_dir / MARKER_FILE, wait_s)
    if plan.backend == "llmapi":
        # NVIDIA's multi-node LLM API launcher: rank 0 runs the command (tritonserver), the others serve as
        # its MPI workers (tensorrt_llm/llmapi/trtllm-llmapi-launch; tests/data/multinode records it).
        rank_prefix.append("trtllm-llmapi-launch")
    hostfile = write_hostfile(cluster, scratch)
    return {"env": extra_env, "mpi_args": cluster.mpirun_args(hostfile, agent=agent), "rank_prefix": rank_prefix}


def _log_world_exit(cluster: ClusterPlan, event: ServerExit) -> None:
    from trtllm_truss.runtime.cluster import explain_world_exit

    logger.error("%s", explain_world_exit(cluster, event.log_tail, will_restart=event.will_restart))
