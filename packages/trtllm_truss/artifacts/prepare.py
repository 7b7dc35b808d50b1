"""`prepare_artifacts`: execute a plan's fetches, verify the engine, return the plan with final limits."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from trtllm_truss.artifacts.engine_config import EngineVerificationError, verify_engine_dir
from trtllm_truss.artifacts.fetch import DEFAULT_MAX_WORKERS, FetchResult, fetch_repository
from trtllm_truss.artifacts.hub import resolve_hf_token
from trtllm_truss.artifacts.sources import FetchError
from trtllm_truss.artifacts.lora_weights import with_nvidia_layouts
from trtllm_truss.planning.lora import check_adapters
from trtllm_truss.planning.plan import PlanError, ServingPlan, stand_in_limits
from trtllm_truss.planning.speculation import engine_speculation_problem

logger = logging.getLogger(__name__)

BuildEngine = Callable[[ServingPlan], Path]


def prepare_artifacts(
    plan: ServingPlan,
    *,
    secrets: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    build_engine: BuildEngine | None = None,
    max_workers: int = DEFAULT_MAX_WORKERS,
    engine_ranks: Collection[int] | None = None,
) -> tuple[ServingPlan, list[FetchResult]]:
    """Fetch what the plan lists, verify the engine against this machine, and fill in the final limits.

    `engine_ranks`: this node's ranks of a multi-node world; a fetched engine brings (and is checked
    for) only their `rank*.engine` files. None: every rank's.

    `build_engine` (build mode with tensorrtllm) returns the engine directory from the engine cache,
    building on a miss; without it the returned plan keeps `engine_dir=None` for the caller to fill.
    The HF token comes from `secrets["hf_access_token"]`, TRUSS_SECRET_hf_access_token or HF_TOKEN.
    """
    token = resolve_hf_token(secrets, environ)
    results: list[FetchResult] = []
    for request in plan.fetches:
        result = fetch_repository(
            request.source,
            request.dest,
            revision=request.revision,
            kind=request.kind,
            token=token,
            environ=environ,
            base_dir=plan.truss_dir,
            max_workers=max_workers,
            ranks=engine_ranks if request.role == "engine" else None,
        )
        logger.info(
            "%s %s: %s (%d files, %.1f MB, revision %s)",
            request.role,
            request.source,
            result.path,
            len(result.files),
            result.total_bytes / 1e6,
            result.resolved_revision[:16],
        )
        results.append(result)

    # Adapters fetched from the hub or S3 are checked against the engine's LoRA limits once here.
    problems = check_adapters(plan.lora_adapters, plan.lora_configuration)
    if problems:
        raise PlanError("; ".join(problems), problems)
    if plan.backend == "tensorrtllm" and plan.lora_adapters:  # what the workers send with a task's first request
        revisions = {Path(result.path): result.resolved_revision for result in results}
        layouts = with_nvidia_layouts(plan.lora_adapters, plan.artifacts_dir or Path("."), revisions)
        plan = dataclasses.replace(plan, lora_adapters=layouts)

    engine_dir = plan.engine_dir
    if plan.backend == "tensorrtllm" and engine_dir is None and build_engine is not None:
        engine_dir = build_engine(plan)
    if plan.backend == "tensorrtllm" and engine_dir is not None:
        facts = plan.facts
        info = verify_engine_dir(
            engine_dir,
            expected_tp=plan.tensor_parallel_count,
            expected_pp=plan.pipeline_parallel_count,
            # Over several nodes the world's GPUs are every node's (the config gave each node its share).
            gpu_count=facts.gpu_count * plan.node_count,
            runtime_trtllm_version=facts.trtllm_version,
            runtime_gpu=facts.gpus[0] if facts.gpus else None,
            ranks=engine_ranks,
        )
        if plan.speculative is not None:
            build_config = json.loads((Path(engine_dir) / "config.json").read_text(encoding="utf-8")).get("build_config")
            problem = engine_speculation_problem(build_config or {}, plan.speculative)
            if problem:
                raise EngineVerificationError(problem)
        return plan.with_engine(engine_dir, info), results

    if plan.backend == "pytorch" and not plan.limits_final:
        assert plan.model_dir is not None
        config_path = plan.model_dir / "config.json"
        try:
            model_config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise FetchError(f"{config_path}: cannot read the stand-in checkpoint's config ({exc})") from None
        return dataclasses.replace(plan, limits_final=True, **stand_in_limits(model_config, plan.runtime)), results
    if not plan.limits_final:
        raise PlanError("the plan's limits are still provisional: no engine was fetched or built")
    return plan, results
