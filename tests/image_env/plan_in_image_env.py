"""Run inside an image's environment (PYTHONPATH=packages): load an example, plan, render, plan the build.

Prints one JSON line. The GPU facts are given, not probed: TensorRT-LLM itself is not installable here.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from trtllm_truss.artifacts.build import plan_build
from trtllm_truss.config import load_config
from trtllm_truss.planning.plan import make_plan
from trtllm_truss.planning.probe import GpuInfo, RuntimeFacts
from trtllm_truss.repository.render import render_repository


def main(example_dir: str, trtllm_version: str) -> None:
    resolved = load_config(Path(example_dir), environ={})
    gpus = (GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 81559),) * max(resolved.trt_llm.world_size, 1)
    facts = RuntimeFacts(gpus=gpus, trtllm_version=trtllm_version, tensorrt_version="10", trtllm_unavailable_reason=None)
    scratch = Path(tempfile.mkdtemp(prefix="image-env-"))
    plan = make_plan(resolved, facts, artifacts_dir=scratch / "artifacts")
    build = plan_build(
        resolved.trt_llm.build,
        trtllm_version=trtllm_version,
        checkpoint_dir=scratch / "checkpoint",
        output_dir=scratch / "engine",
        work_dir=scratch / "work",
    )
    # the repository is rendered once the engine exists: point the plan at where the build puts it
    repository = render_repository(dataclasses.replace(plan, engine_dir=scratch / "engine"), scratch / "repository")
    print(
        json.dumps(
            {
                "python": "%d.%d" % sys.version_info[:2],
                "backend": plan.backend,
                "models": sorted(p.name for p in repository.iterdir() if p.is_dir()),
                "build_steps": len(build.steps),
                "build_trtllm_version": build.trtllm_version,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
