"""Run inside an image's environment (PYTHONPATH=packages): load an example and plan it as the image would.

Engine examples (backend tensorrtllm): plan, render the repository, plan the build. LLM-API examples
(TensorRT-LLM 1.x): `trtllm-truss validate` as a user runs it, which plans and prints the model.yaml of
NVIDIA's llmapi model (no build). Prints one JSON line. The GPU facts are given, not probed: TensorRT-LLM
itself is not installable here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import sys
import tempfile
from pathlib import Path

import yaml

from trtllm_truss.artifacts.build import plan_build
from trtllm_truss.config import load_config
from trtllm_truss.planning.plan import make_plan
from trtllm_truss.planning.probe import GpuInfo, RuntimeFacts
from trtllm_truss.repository.render import render_repository


def _validate_llmapi(example_dir: str) -> dict:
    from trtllm_truss.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["validate", example_dir])
    if code != 0:
        raise SystemExit(f"validate exited {code}:\n{err.getvalue()[-3000:]}")
    text = out.getvalue()
    document = yaml.safe_load(text.split("model.yaml of the Triton repository:\n", 1)[1].split("\n# KV cache")[0])
    planned_for = next(line for line in text.splitlines() if line.startswith("# plan for the deployment's machine"))
    return {"model_yaml_keys": sorted(document), "planned_for": planned_for}


def main(example_dir: str, trtllm_version: str) -> None:
    resolved = load_config(Path(example_dir), environ={})
    gpus = (GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 81559),) * max(resolved.trt_llm.world_size, 1)
    facts = RuntimeFacts(gpus=gpus, trtllm_version=trtllm_version, tensorrt_version="10", trtllm_unavailable_reason=None)
    scratch = Path(tempfile.mkdtemp(prefix="image-env-"))
    plan = make_plan(resolved, facts, artifacts_dir=scratch / "artifacts")
    outcome: dict = {"python": "%d.%d" % sys.version_info[:2], "backend": plan.backend}
    if plan.backend == "llmapi":
        outcome.update(_validate_llmapi(example_dir))
    else:
        build = plan_build(
            resolved.trt_llm.build,
            trtllm_version=trtllm_version,
            checkpoint_dir=scratch / "checkpoint",
            output_dir=scratch / "engine",
            work_dir=scratch / "work",
        )
        # the repository is rendered once the engine exists: point the plan at where the build puts it
        repository = render_repository(dataclasses.replace(plan, engine_dir=scratch / "engine"), scratch / "repository")
        outcome.update(
            models=sorted(p.name for p in repository.iterdir() if p.is_dir()),
            build_steps=len(build.steps),
            build_trtllm_version=build.trtllm_version,
        )
    print(json.dumps(outcome))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
