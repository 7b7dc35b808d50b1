"""`trtllm-truss init DIR`: write a new, complete truss folder ready for `truss push DIR`.

The folder holds config.yaml (from one of `examples/`, with the common choices applied from flags),
model/model.py, packages/trtllm_truss (which truss copies to /packages and puts on sys.path) and a
.truss_ignore that keeps caches out of the upload. Nothing of the development repository (tests,
docs, venvs) is copied, so the upload is the served code only.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

HELP = "write a new truss folder (config.yaml, model/, packages/, .truss_ignore) for `truss push`"

# The development repository this package lives in: model/model.py and examples/ come from it.
REPO_ROOT = Path(__file__).resolve().parents[3]
PACKAGE_DIR = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = REPO_ROOT / "examples"
MODEL_PY = REPO_ROOT / "model" / "model.py"

# Without --from: a TensorRT-LLM 1.x truss on NVIDIA's newest recorded image, the checkpoint served by the
# LLM API (no engine build). A prebuilt engine (--engine-repository) is a 0.x C++ engine: the legacy example.
DEFAULT_BUILD_EXAMPLE = "llama3.1-8b-fp8-h100"
DEFAULT_SERVE_EXAMPLE = "legacy-llama3-70b-engine-tp2-h100"

# truss's .truss_ignore replaces its built-in list, so the useful part of that list comes first.
TRUSS_IGNORE = """\
# What `truss push` leaves out (this file replaces truss's built-in list).
__pycache__/
*.py[cod]
*.egg-info/
.pytest_cache/
.mypy_cache/
.ruff_cache/
.cache
.env
.venv
.venv*/
.git
*.log
*.tmp
*.swp
tests/
docs/
"""

_COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".pytest_cache")


class InitError(Exception):
    """A choice that cannot make a valid truss; the message names the flag."""


# `--front direct`: truss's docker_server runs our own HTTP server (`trtllm-truss serve --front direct`).
# The command works from the truss folder itself (a local run) and in the image, where truss puts
# config.yaml and data/ under /app and packages/ at /packages; supervisord runs it without a shell.
DIRECT_PORT = 8000  # any but 8080, which Baseten's proxy holds
DIRECT_START_COMMAND = (
    "/bin/sh -c 'if [ -f config.yaml ] && [ -d packages/trtllm_truss ]; then d=$PWD; else d=/app; fi;"
    ' export PYTHONPATH="$d/packages:/packages${PYTHONPATH:+:$PYTHONPATH}";'
    f' exec python3 -m trtllm_truss.cli serve "$d" --front direct --port {DIRECT_PORT}' "'"
)
# What a docker_server image must install itself (truss's server brings these for the Model class path),
# pinned as in requirements/lock.txt.
DIRECT_REQUIREMENTS = (
    "fastapi==0.124.4", "uvicorn==0.54.0", "httptools==0.9.0", "uvloop==0.23.0", "prometheus_client==0.26.0",
    "rich==13.9.4", "python-multipart==0.0.34",  # /v1/files: the batch input files' multipart uploads
)


def direct_front(config: dict[str, Any]) -> dict[str, Any]:
    """`config` served by the direct front: truss's docker_server section and the server's requirements."""
    config["docker_server"] = {
        "start_command": DIRECT_START_COMMAND,
        "server_port": DIRECT_PORT,
        "predict_endpoint": "/v1/models/model:predict",
        "readiness_endpoint": "/health/ready",
        "liveness_endpoint": "/health/live",
    }
    requirements = list(config.get("requirements") or [])
    names = {str(r).split("==")[0].split("[")[0].lower() for r in requirements}
    requirements += [r for r in DIRECT_REQUIREMENTS if r.split("==")[0].lower() not in names]
    config["requirements"] = requirements
    config.get("runtime", {}).pop("predict_concurrency", None)  # truss's server setting; none serves here
    return config


def available_examples() -> list[str]:
    return sorted(p.parent.name for p in EXAMPLES_DIR.glob("*/config.yaml"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("truss_dir", type=Path, help="folder to create (must not exist or be empty)")
    parser.add_argument(
        "--from",
        dest="example",
        help=f"start from this example of examples/ ({', '.join(available_examples()) or 'none found'});"
        f" default {DEFAULT_BUILD_EXAMPLE}, or {DEFAULT_SERVE_EXAMPLE} with --engine-repository",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--checkpoint-repository", help="build from this Hugging Face checkpoint repository")
    source.add_argument("--engine-repository", help="serve this prebuilt engine repository (no build)")
    parser.add_argument("--tokenizer-repository", help="tokenizer of a prebuilt engine (default: kept from the example)")
    parser.add_argument("--architecture", help="build.base_model_architecture (llama, mistral, mixtral, qwen, ...): needed"
                        " by an engine build; optional on the LLM-API path, which reads the checkpoint's config.json")
    parser.add_argument("--quantization", help="build.quantization_type (no_quant, fp8, weights_int8, ...): a calibration"
                        " recipe needs an engine-build example (--from legacy-...); the LLM API takes fp8_kv")
    parser.add_argument("--accelerator", help="resources.accelerator, e.g. H100, H100:2, A100:4")
    parser.add_argument("--name", help="model_name (default: the folder's name)")
    parser.add_argument("--force", action="store_true", help="write into a non-empty folder")
    parser.add_argument("--front", choices=("truss", "direct"), default="truss",
                        help="truss: truss's server runs model/model.py (default); direct: truss's docker_server runs"
                             f" `trtllm-truss serve --front direct` on port {DIRECT_PORT} (N processes, runtime.direct_front)")


def _example_config(name: str) -> dict[str, Any]:
    path = EXAMPLES_DIR / name / "config.yaml"
    if not path.is_file():
        raise InitError(f"--from {name}: no such example; choose one of {', '.join(available_examples())}")
    return yaml.safe_load(path.read_text())


def _tensor_parallel(accelerator: str) -> int:
    _, _, count = accelerator.partition(":")
    if count and not count.isdigit():
        raise InitError(f"--accelerator {accelerator}: expected GPU[:COUNT], e.g. H100 or H100:2")
    return int(count or 1)


# What NVIDIA's LLM API (backend llmapi) loads as is: no calibration, no engine build.
_LLMAPI_QUANTIZATIONS = ("no_quant", "fp8_kv")
# The engine-build example --quantization can start from instead (TensorRT-LLM 0.x trtllm-build).
ENGINE_BUILD_EXAMPLE = "legacy-llama3-8b-fp8-engine-h100"


def _llmapi_target(config: dict[str, Any]) -> tuple[str, str | None] | None:
    """(runtime.backend, base_image's TensorRT-LLM) when this config runs on the LLM API; None when it does not."""
    from trtllm_truss.artifacts.target import IMAGE_TRTLLM_VERSIONS
    from trtllm_truss.planning.plan import llmapi_version_ok

    section = config["model_metadata"]["trt_llm"]
    backend = str((section.get("runtime") or {}).get("backend", "auto"))
    version = IMAGE_TRTLLM_VERSIONS.get(str((config.get("base_image") or {}).get("image", "")))
    if backend == "llmapi" or (backend == "auto" and llmapi_version_ok(version)):
        return backend, version
    return None


def _llmapi_quantization_problem(config: dict[str, Any], example: str, quantization: str) -> str | None:
    """Why --quantization cannot hold on the backend this config runs (None: it can)."""
    from trtllm_truss.config.enums import Quantization

    value = str(quantization).lower()
    if value in _LLMAPI_QUANTIZATIONS or value not in {q.value for q in Quantization}:
        return None  # an unknown name is the schema's to refuse, naming build.quantization_type
    target = _llmapi_target(config)
    if target is None:
        return None
    backend, version = target
    return (
        f"--quantization {quantization}: example {example} serves the checkpoint with TensorRT-LLM"
        f" {version or '1.x'}'s LLM API (runtime.backend {backend}), which loads a checkpoint as it is and runs no"
        f" calibration, so {quantization} cannot be applied there. Instead: a pre-quantized checkpoint"
        " (--checkpoint-repository of an FP8/NVFP4 checkpoint, e.g. nvidia/Llama-3.1-8B-Instruct-FP8 or"
        " Qwen/Qwen3-8B-FP8, without --quantization; --quantization fp8_kv for an FP8 KV cache), or an engine build"
        f" (--from {ENGINE_BUILD_EXAMPLE}: TensorRT-LLM 0.x trtllm-build quantizes at build time)"
    )


def build_config(args: argparse.Namespace) -> dict[str, Any]:
    """The example's config with the flags applied (the trt_llm section is validated afterwards)."""
    serve = args.engine_repository is not None
    example = args.example or (DEFAULT_SERVE_EXAMPLE if serve else DEFAULT_BUILD_EXAMPLE)
    config = _example_config(example)
    section = config.setdefault("model_metadata", {}).setdefault("trt_llm", {})
    config["model_name"] = args.name or args.truss_dir.resolve().name

    if args.checkpoint_repository is not None and "build" not in section:
        raise InitError(f"--checkpoint-repository: example {example} serves a prebuilt engine; use --from with a build example")
    if serve and "serve" not in section:
        raise InitError(f"--engine-repository: example {example} builds an engine; use --from with a serving example")
    if serve and (args.architecture or args.quantization):
        raise InitError("--architecture/--quantization describe a build; a prebuilt engine (--engine-repository) has them fixed")
    if args.tokenizer_repository and "serve" not in section:
        raise InitError("--tokenizer-repository applies to a prebuilt engine (serve); a build uses its checkpoint's tokenizer")

    build = section.get("build")
    if build is not None:
        if args.checkpoint_repository:
            build["huggingface_ckpt_repository"] = args.checkpoint_repository
            if not args.architecture and _llmapi_target(config) is not None:
                # the example's family was its own checkpoint's; the LLM API reads the new one's config.json
                build.pop("base_model_architecture", None)
        if args.architecture:
            build["base_model_architecture"] = args.architecture
        if args.quantization:
            problem = _llmapi_quantization_problem(config, example, args.quantization)
            if problem is not None:
                raise InitError(problem)
            build["quantization_type"] = args.quantization
    served = section.get("serve")
    if served is not None:
        if args.engine_repository:
            served["engine_repository"] = args.engine_repository
        if args.tokenizer_repository:
            served["tokenizer_repository"] = args.tokenizer_repository
    if args.accelerator:
        config.setdefault("resources", {})["accelerator"] = args.accelerator
        # one engine rank per GPU of every node: the parallel layout follows the accelerator count (per node)
        # times resources.node_count
        parallel = served if served is not None else build
        resources = config.get("resources") or {}
        nodes = resources.get("node_count") if isinstance(resources.get("node_count"), int) else 1
        gpus = _tensor_parallel(args.accelerator) * max(nodes, 1)
        tensor_parallel = gpus // int(parallel.get("pipeline_parallel_count", 1) or 1)
        parallel["tensor_parallel_count"] = max(tensor_parallel, 1)
    return config


def write_truss(truss_dir: Path, config: dict[str, Any], *, force: bool = False) -> list[Path]:
    """Write the folder; returns the files written (relative to `truss_dir`)."""
    if truss_dir.exists() and any(truss_dir.iterdir()) and not force:
        raise InitError(f"{truss_dir} exists and is not empty (--force writes into it)")
    if not MODEL_PY.is_file():
        raise InitError(f"{MODEL_PY} is missing: run init from a checkout of trtllm-truss (pip install -e .)")
    truss_dir.mkdir(parents=True, exist_ok=True)
    (truss_dir / "model").mkdir(exist_ok=True)
    shutil.copy2(MODEL_PY, truss_dir / "model" / "model.py")
    target = truss_dir / "packages" / PACKAGE_DIR.name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(PACKAGE_DIR, target, ignore=_COPY_IGNORE)
    header = (
        f"# Made by `trtllm-truss init`. Edit model_metadata.trt_llm (docs/configuration.md of trtllm-truss),\n"
        f"# then `truss push {truss_dir.name}`. Store the Hugging Face token as the hf_access_token secret.\n"
    )
    (truss_dir / "config.yaml").write_text(header + yaml.safe_dump(config, sort_keys=False))
    (truss_dir / ".truss_ignore").write_text(TRUSS_IGNORE)
    return sorted(p.relative_to(truss_dir) for p in truss_dir.rglob("*") if p.is_file())


def _remove_written(truss_dir: Path, files: list[Path], existed: bool, was_empty: bool) -> None:
    """Take back what init wrote: the folder (or its contents) when it held nothing before, else the files written."""
    if not existed:
        shutil.rmtree(truss_dir, ignore_errors=True)
    elif was_empty:
        for child in truss_dir.iterdir():
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    else:
        for name in files:
            (truss_dir / name).unlink(missing_ok=True)


def _plan_problems(resolved: Any) -> list[str]:
    """The lines `validate`'s plan check reports as errors for this truss (empty: validate accepts it)."""
    import io

    from rich.console import Console

    from trtllm_truss.commands.validate import check_plan

    out, err = io.StringIO(), io.StringIO()
    code = check_plan(
        resolved, None, Console(file=out, width=160), Console(file=err, highlight=False, soft_wrap=True)
    )
    if code == 0:
        return []
    lines = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
    return [line.removeprefix("error: ") for line in lines] or err.getvalue().splitlines()


def run(args: argparse.Namespace) -> int:
    from trtllm_truss.config import ConfigError, load_config
    from trtllm_truss.config.errors import redact

    existed = args.truss_dir.exists()
    was_empty = not existed or not any(args.truss_dir.iterdir())
    try:
        config = build_config(args)
        if getattr(args, "front", "truss") == "direct":
            config = direct_front(config)
        files = write_truss(args.truss_dir, config, force=args.force)
    except InitError as exc:
        print(f"trtllm-truss init: {exc}", file=sys.stderr)
        return 2
    # init writes only what `validate` accepts: the schema, then the same plan check.
    try:
        resolved = load_config(args.truss_dir, environ={})
        problems = _plan_problems(resolved)
    except ConfigError as exc:  # a flag value our schema refuses: name the key
        problems = exc.problems
    if problems:
        _remove_written(args.truss_dir, files, existed, was_empty)
        print(f"trtllm-truss init: the truss would not validate, so {args.truss_dir} was not written:", file=sys.stderr)
        for problem in problems:
            print(f"  {redact(problem)}", file=sys.stderr)
        return 1
    print(f"wrote {args.truss_dir} ({len(files)} files; {resolved.trt_llm.mode} mode, accelerator {resolved.accelerator})")
    print(f"next: edit {args.truss_dir / 'config.yaml'}, then `truss push {args.truss_dir}`")
    return 0
