"""`trtllm-truss build [TRUSS_DIR]`: build (or fetch) the engine now and report key, location, size, time.

Build mode: the engine comes from the content-addressed cache, built on a miss. Serve mode: the engine
and tokenizer are fetched and verified. With `--dry-run`, or where this machine cannot run the backend,
nothing is built or fetched: the plan of the deployment's machine is printed (`plan_for_target`: the
TensorRT-LLM of `--trtllm-version` or of base_image, the GPUs of resources.accelerator), the same plan
`trtllm-truss validate` prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from trtllm_truss.artifacts.engine_builder import EngineBuilder
    from trtllm_truss.artifacts.target import DeployTarget, PlanVersion
    from trtllm_truss.config import ResolvedConfig
    from trtllm_truss.planning.architectures import CheckpointArchitecture
    from trtllm_truss.planning.plan import ServingPlan
    from trtllm_truss.planning.probe import RuntimeFacts

HELP = "build or fetch the engine now; print the cache key, location, sizes and time"



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("truss_dir", nargs="?", default=".", type=Path, help="truss directory (default: .)")
    parser.add_argument("--dry-run", action="store_true", help="only print the cache key inputs and the build commands")
    parser.add_argument(
        "--trtllm-version",
        default=None,
        help="plan for this TensorRT-LLM version (default: the installed one, else base_image's, else the newest 0.x)",
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
    from trtllm_truss.artifacts.build_recipes import BuildPlanError
    from trtllm_truss.artifacts.build_runner import BuildStepError
    from trtllm_truss.artifacts.engine_builder import EngineBuilder
    from trtllm_truss.artifacts.prepare import prepare_artifacts
    from trtllm_truss.artifacts.sources import FetchError
    from trtllm_truss.config import ConfigError, load_config
    from trtllm_truss.planning.plan import PlanError, make_plan
    from trtllm_truss.planning.probe import probe_facts

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
    builder = EngineBuilder(cache_root=args.cache_dir, max_cache_bytes=args.max_cache_bytes, examples_dir=args.examples_dir)
    try:
        if args.dry_run:
            # A dry run plans for the deployment's machine (its image's TensorRT-LLM, its GPUs); see TargetPlan.
            from trtllm_truss.artifacts.checkpoint_config import checkpoint_architecture

            target = plan_for_target(
                resolved, facts, args.trtllm_version, examples_dir=args.examples_dir,
                checkpoint=checkpoint_architecture(resolved),
            )
            return _print_target_plan(target, builder, resolved)
        plan = make_plan(resolved, facts)
        if plan.mode == "serve":
            return _fetch_serve_artifacts(plan, args, started)
        if plan.backend != "tensorrtllm":
            # Nothing to build on this machine: show what the deployment's machine would run.
            target = plan_for_target(resolved, facts, args.trtllm_version, examples_dir=args.examples_dir)
            _say(f"no engine is built on this machine: {plan.backend_reason}")
            return _print_target_plan(target, builder, resolved)
        # Tokenizer fetch + engine (cache hit or build) + verification against this machine.
        _, results = prepare_artifacts(plan, build_engine=builder)
        acquisition = builder.last_acquisition
        assert acquisition is not None
        for result in results:
            _say(f"{result.kind}: {result.path} ({_human(result.total_bytes)})", file=out)
    except PlanError as exc:
        for problem in exc.problems:
            _say(f"error: {problem}", file=err)
        return 1
    except (BuildPlanError, FetchError, ValueError) as exc:  # ValueError: engine verification
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


@dataclass(frozen=True)
class TargetPlan:
    """The plan the deployment's machine would make, and how its TensorRT-LLM version was chosen."""

    plan: ServingPlan
    version: PlanVersion
    deploy: DeployTarget
    local: bool  # True: planned with this machine's own facts (it can run TensorRT-LLM)
    python: str  # the interpreter the printed commands name
    examples_dir: Path | None
    notes: tuple[str, ...] = ()


def plan_for_target(
    resolved: ResolvedConfig,
    facts: RuntimeFacts,
    requested_version: str | None,
    *,
    examples_dir: Path | None = None,
    checkpoint: CheckpointArchitecture | None = None,
) -> TargetPlan:
    """make_plan for the machine the config deploys to, downloading and building nothing.

    The TensorRT-LLM version: `requested_version`, else the one installed here when it can run (this is
    that machine), else base_image's (artifacts.target.IMAGE_TRTLLM_VERSIONS), else the default. The GPUs:
    resources.accelerator (none: no GPU, so backend auto means the stand-in), or with an explicit version
    and no accelerator, as many as the world size. Raises PlanError (with `.problems`, one per key) for
    settings that backend would refuse, exactly as `serve` would. `checkpoint`: the checkpoint's architecture (config.json,
    read beforehand by validate and init), checked against that TensorRT-LLM (planning.architectures).
    """
    from trtllm_truss.artifacts.target import DEFAULT_TARGET_PYTHON, plan_version, read_deploy_target, target_facts
    from trtllm_truss.planning.plan import make_plan

    deploy = read_deploy_target(resolved.truss_dir)
    version = plan_version(requested_version, facts, deploy)
    local = version.basis == "installed here"
    if not local:
        accelerator = resolved.accelerator
        gpus = accelerator.count if accelerator is not None else (resolved.trt_llm.world_size if requested_version else 0)
        facts = target_facts(
            gpus, accelerator, version.version, tensorrt_version=facts.tensorrt_version, xgrammar_version=facts.xgrammar_version
        )
    plan = make_plan(resolved, facts, checkpoint_architecture=checkpoint)
    notes: list[str] = []
    chosen_examples = examples_dir or deploy.examples_dir
    if (
        not local
        and plan.backend == "tensorrtllm"
        and plan.mode == "build"
        and chosen_examples is None
        and not version.version.startswith(("1.", "2."))
    ):
        notes.append(
            f"TensorRT-LLM {version.version} builds need NVIDIA's examples/ of that release, which images do not always"
            " ship (tensorrtllm_backend issue 739): if base_image keeps them outside /app/tensorrt_llm/examples,"
            " /opt/tensorrt_llm/examples and /workspace/TensorRT-LLM/examples, set TRTLLM_EXAMPLES_DIR in"
            " environment_variables (an engine already in the cache or in build.publish_repository needs no build)"
        )
    return TargetPlan(
        plan=plan,
        version=version,
        deploy=deploy,
        local=local,
        python=sys.executable if local else (deploy.python or DEFAULT_TARGET_PYTHON),
        examples_dir=chosen_examples,
        notes=tuple(notes),
    )


def describe_target_plan(target: TargetPlan, resolved: ResolvedConfig) -> list[str]:
    """What the deployment's machine would run, as printed by `validate` and `build --dry-run`: the
    trtllm-build flow's commands, the llmapi model.yaml, or what serve mode fetches. No network."""
    from trtllm_truss.artifacts.build import plan_build
    from trtllm_truss.config import resolve_repository

    plan = target.plan
    gpus = f"{plan.facts.gpu_count} x {plan.facts.gpus[0].name}" if plan.facts.gpus else "no GPU"
    where = "this machine" if target.local else "the deployment's machine"
    lines = [
        f"# plan for {where}: {gpus}, TensorRT-LLM {target.version.version} ({target.version.basis})",
        f"# backend {plan.backend}: {plan.backend_reason}",
    ]
    lines += [f"# note: {note}" for note in target.notes]
    if plan.backend == "tensorrtllm" and plan.speculative is not None:
        from trtllm_truss.planning.speculation import backend_parameters

        parameters = ", ".join(f"{name}={value}" for name, value in backend_parameters(plan.speculative))
        lines.append(f"# tensorrt_llm parameters for speculative decoding: {parameters}")
    if plan.mode == "serve":
        lines += [
            f"would fetch {request.role}: {request.source}@{request.revision or 'main'} -> {request.dest}"
            for request in plan.fetches
        ]
        return lines
    if plan.backend == "pytorch":
        lines.append(f"# no engine build: the pytorch stand-in runs the checkpoint {plan.model_dir}")
        return lines + _adapter_lines(plan)
    if plan.backend == "llmapi":
        from trtllm_truss.repository.llmapi import MODEL_YAML, render_model_yaml
        from trtllm_truss.repository.models import ENGINE

        if plan.llm_api_double:
            lines.append(
                "# llmapi on the LLM-API double (TensorRT-LLM cannot run here): no engine build; the stand-in engine"
                " runs the checkpoint behind the LLM API's names; model.yaml as TensorRT-LLM would get it:"
            )
        else:
            lines.append(
                f"# TensorRT-LLM {target.version.version} (llmapi): no engine build; NVIDIA's LLM API (PyTorch backend)"
                " loads the checkpoint"
            )
        lines.append(f"# {ENGINE}/1/{MODEL_YAML} of the Triton repository:")
        lines += render_model_yaml(plan).splitlines()
        return lines + _adapter_lines(plan)
    build = plan.build
    checkpoint_dir = plan.checkpoint.dest if plan.checkpoint is not None else (
        resolve_repository(build.huggingface_ckpt_repository, resolved.truss_dir).local_path
    )
    build_plan = plan_build(
        build,
        trtllm_version=target.version.version,
        checkpoint_dir=Path(checkpoint_dir),
        output_dir=Path("<engine cache>/scratch/<key>/engine"),
        work_dir=Path("<engine cache>/scratch/<key>/work"),
        examples_dir=target.examples_dir,
        python=target.python,
    )
    lines += build_plan.describe().splitlines()
    return lines + _adapter_lines(plan)


def _adapter_lines(plan) -> list[str]:
    """One line per LoRA adapter: its task id, the request `model` that picks it, where it is fetched to."""
    return [
        f"# LoRA adapter {adapter.name!r} (lora_task_id {adapter.task_id}, request model={adapter.name!r}): {adapter.dir}"
        for adapter in plan.lora_adapters
    ]


def _print_target_plan(target: TargetPlan, builder: EngineBuilder, resolved: ResolvedConfig) -> int:
    plan = target.plan
    if plan.backend == "tensorrtllm" and plan.mode == "build":
        build = plan.build
        checkpoint = plan.checkpoint
        try:
            key, inputs = builder.key_for(
                build, source=checkpoint.source, revision=checkpoint.revision, location=checkpoint.location,
                facts=plan.facts, truss_dir=resolved.truss_dir,
            )
            _say(f"cache key (for the planned machine's TensorRT-LLM/GPU facts): {key}")
            _say("key inputs: " + json.dumps(inputs, sort_keys=True))
        except Exception as exc:  # noqa: BLE001 - the key needs the checkpoint revision; show why it is unknown
            _say(f"cache key: unknown until the checkpoint revision resolves ({type(exc).__name__}: {exc})")
    for line in describe_target_plan(target, resolved):
        _say(line)
    return 0


def _fetch_serve_artifacts(plan, args: argparse.Namespace, started: float) -> int:
    from trtllm_truss.artifacts.prepare import prepare_artifacts

    _, results = prepare_artifacts(plan)
    for result in results:
        _say(f"{result.kind}: {result.path} ({len(result.files)} files, {_human(result.total_bytes)}, "
              f"revision {result.resolved_revision[:16]}, {'downloaded' if result.downloaded else 'reused'})")
    _say(f"time: {time.monotonic() - started:.1f} s")
    return 0

