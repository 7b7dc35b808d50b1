"""`trtllm-truss build [TRUSS_DIR]`: build (or fetch) the engine now and report key, location, size, time.

Build mode: the engine comes from the content-addressed cache, built on a miss. On a machine without
TensorRT-LLM (or with `--dry-run`) the build commands are printed instead, for the version given by
`--trtllm-version`. Serve mode: the engine and tokenizer are fetched and verified.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TextIO

HELP = "build or fetch the engine now; print the cache key, location, sizes and time"

# The version whose commands a machine without TensorRT-LLM is shown (newest with trtllm-build).
DEFAULT_PLAN_VERSION = "0.21.0"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("truss_dir", nargs="?", default=".", type=Path, help="truss directory (default: .)")
    parser.add_argument("--dry-run", action="store_true", help="only print the cache key inputs and the build commands")
    parser.add_argument(
        "--trtllm-version",
        default=None,
        help=f"plan for this TensorRT-LLM version (default: the installed one, else {DEFAULT_PLAN_VERSION})",
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="engine cache directory (default: <artifacts>/engines)")
    parser.add_argument("--examples-dir", type=Path, default=None, help="NVIDIA's examples/ directory (0.x builds)")
    parser.add_argument("--max-cache-bytes", type=int, default=None, help="evict least recently used engines above this")


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1000
    return f"{size} B"


def _say(text: str, file: TextIO | None = None) -> None:
    """print, with every declared secret's value (and URL user-info, hf_ tokens) hidden."""
    from trtllm_truss.config.errors import redact

    print(redact(text), file=file or sys.stdout)


def run(args: argparse.Namespace) -> int:
    from trtllm_truss.artifacts.build import BuildPlanError, BuildStepError
    from trtllm_truss.artifacts.engine_builder import EngineBuilder
    from trtllm_truss.artifacts.prepare import prepare_artifacts
    from trtllm_truss.artifacts.sources import FetchError
    from trtllm_truss.config import ConfigError, load_config
    from trtllm_truss.plan import PlanError, make_plan
    from trtllm_truss.probe import probe_facts

    out, err = sys.stdout, sys.stderr
    try:
        resolved = load_config(args.truss_dir)
    except ConfigError as exc:
        _say(f"{args.truss_dir / 'config.yaml'}: {len(exc.problems)} problem(s)", file=err)
        for problem in exc.problems:
            _say(problem, file=err)
        return 1

    facts = probe_facts()
    started = time.monotonic()
    try:
        if args.dry_run and (not facts.trtllm_usable or args.trtllm_version):
            facts = _target_machine(facts, resolved, args.trtllm_version or facts.trtllm_version or DEFAULT_PLAN_VERSION)
        # A dry run plans for the target machine: NVIDIA's llmapi model files need not be here.
        plan = make_plan(resolved, facts, check_backend_files=not args.dry_run)
        if plan.mode == "serve":
            return _fetch_serve_artifacts(plan, args, started)
        builder = EngineBuilder(
            cache_root=args.cache_dir, max_cache_bytes=args.max_cache_bytes, examples_dir=args.examples_dir
        )
        if plan.backend != "tensorrtllm" or args.dry_run:
            return _print_plan(plan, builder, facts, resolved, args)
        # Tokenizer fetch + engine (cache hit or build) + verification against this machine.
        _, results = prepare_artifacts(plan, build_engine=builder)
        acquisition = builder.last_acquisition
        assert acquisition is not None
        for result in results:
            _say(f"{result.kind}: {result.path} ({_human(result.total_bytes)})", file=out)
    except (PlanError, BuildPlanError, FetchError, ValueError) as exc:  # ValueError: engine verification
        _say(f"error: {exc}", file=err)
        return 1
    except BuildStepError as exc:
        _say(f"error: {exc}", file=err)
        return 2

    verb = {"local": "found in the cache", "built": "built", "remote": "downloaded from the shared store"}[acquisition.source]
    _say(f"engine {verb}", file=out)
    _say(f"  cache key : {acquisition.key}", file=out)
    _say(f"  location  : {acquisition.engine_dir}", file=out)
    _say(f"  size      : {_human(acquisition.total_bytes)} in {acquisition.file_count} files", file=out)
    _say(f"  time      : {acquisition.seconds:.1f} s", file=out)
    return 0


def _target_machine(facts, resolved, version: str):
    """The GPU machine a dry run plans for: TensorRT-LLM `version` and as many GPUs as the world size
    (named after resources.accelerator), so the plan shows what that machine would run."""
    from trtllm_truss.probe import GpuInfo, RuntimeFacts

    name = str(resolved.accelerator or "GPU").split(":")[0]
    return RuntimeFacts(
        gpus=tuple(GpuInfo(name=name) for _ in range(resolved.trt_llm.world_size)),
        trtllm_version=version,
        tensorrt_version=facts.tensorrt_version,
        trtllm_unavailable_reason=None,
        notes=(f"dry run: planned for TensorRT-LLM {version} on {resolved.trt_llm.world_size} x {name}",),
    )


def _print_plan(plan, builder, facts, resolved, args: argparse.Namespace) -> int:
    from trtllm_truss.config import resolve_repository
    from trtllm_truss.plan import backend_setting_problems, llmapi_incompatibility, llmapi_version_ok

    build = resolved.trt_llm.build
    version = args.trtllm_version or facts.trtllm_version or DEFAULT_PLAN_VERSION
    requested = resolved.trt_llm.runtime.backend.value
    # The backend a GPU machine with `version` would choose (the same rule as choose_backend's auto).
    target = plan.backend if plan.backend != "pytorch" else (
        "llmapi"
        if requested in ("auto", "llmapi") and llmapi_version_ok(version) and llmapi_incompatibility(build) is None
        else "tensorrtllm"
    )
    problems = backend_setting_problems(resolved.trt_llm, target, version)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1
    if target == "llmapi":
        return _print_llmapi(plan, build, resolved, version)
    if plan.backend != "tensorrtllm":
        _say(f"no engine is built on this machine: {plan.backend_reason}")
        _say(f"a GPU machine with TensorRT-LLM {version} would run the commands below")
    location = resolve_repository(build.huggingface_ckpt_repository, resolved.truss_dir)
    checkpoint_dir = plan.checkpoint.dest if plan.checkpoint is not None else (
        location.local_path if location.kind == "local" else Path("<artifacts>/checkpoint")
    )
    try:
        key, inputs = builder.key_for(
            build, source=build.huggingface_ckpt_repository, revision=build.huggingface_ckpt_revision,
            location=location.kind, facts=facts, truss_dir=resolved.truss_dir,
        )
        _say(f"cache key (this machine's TensorRT-LLM/GPU facts): {key}")
        _say("key inputs: " + json.dumps(inputs, sort_keys=True))
    except Exception as exc:  # noqa: BLE001 - the key needs the checkpoint revision; show why it is unknown
        _say(f"cache key: unknown until the checkpoint revision resolves ({type(exc).__name__}: {exc})")
    _say(builder.build_plan_for(build, Path(checkpoint_dir), version).describe())
    return 0


def _print_llmapi(plan, build, resolved, version: str) -> int:
    from trtllm_truss.repository.llmapi import MODEL_NAME, render_model_yaml

    if plan.backend != "llmapi":
        print(f"no model is loaded on this machine: {plan.backend_reason}")
    model_dir = plan.model_dir if plan.backend == "llmapi" else "<the checkpoint folder after download>"
    print(f"# TensorRT-LLM {version} (llmapi): no engine build; NVIDIA's LLM API loads the checkpoint")
    print(f"# {MODEL_NAME}/1/model.yaml of the Triton repository:")
    print(render_model_yaml(build, resolved.trt_llm.runtime, model_dir), end="")
    return 0


def _fetch_serve_artifacts(plan, args: argparse.Namespace, started: float) -> int:
    from trtllm_truss.artifacts.prepare import prepare_artifacts

    if args.dry_run:
        for request in plan.fetches:
            _say(f"would fetch {request.role}: {request.source}@{request.revision or 'main'} -> {request.dest}")
        return 0
    _, results = prepare_artifacts(plan)
    for result in results:
        _say(f"{result.kind}: {result.path} ({len(result.files)} files, {_human(result.total_bytes)}, "
              f"revision {result.resolved_revision[:16]}, {'downloaded' if result.downloaded else 'reused'})")
    _say(f"time: {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    from trtllm_truss.cli import main

    sys.exit(main(["build", *sys.argv[1:]]))
