"""Running a `BuildPlan` (each step a subprocess, its output streamed and redacted) and the
`EngineCache` create_fn that fetches a checkpoint, plans the build and runs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Callable, Mapping, Protocol, TextIO

from trtllm_truss.artifacts.build import BuildPlan, BuildStep, plan_build
from trtllm_truss.config.build import BuildConfig
from trtllm_truss.config.child_env import child_environment
from trtllm_truss.config.errors import redact


class BuildStepError(RuntimeError):
    """A build step exited non-zero; the message carries the step, its command and its log tail."""

    def __init__(self, step: "BuildStep", returncode: int, log_tail: list[str]):
        self.step = step
        self.returncode = returncode
        self.log_tail = log_tail
        tail = "\n".join(f"    {line}" for line in log_tail) or "    (no output)"
        super().__init__(
            f"build step {step.name!r} failed with exit code {returncode}: {step.shell_command()}\n"
            f"  last {len(log_tail)} log lines:\n{tail}"
        )


# ---- running a plan ------------------------------------------------------------------------------


class LineSink(Protocol):
    def __call__(self, line: str) -> None: ...


def _stderr_sink(stream: TextIO) -> LineSink:
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            stream.write(line + "\n")
            stream.flush()

    return write


def run_build_plan(
    plan: BuildPlan,
    *,
    env: Mapping[str, str] | None = None,
    log_prefix: str = "[engine-build] ",
    sink: LineSink | None = None,
    tail_lines: int = 40,
    secrets: tuple[str, ...] = (),
) -> None:
    """Run each step with its output streamed line by line (prefixed); stop at the first failure.

    `secrets` (and every secret value load_config remembered) are replaced by '***' in every forwarded
    line and in the error's log tail; the steps' environment has no credential (config.child_env).
    """
    emit = sink or _stderr_sink(sys.stderr)
    base_env = child_environment(os.environ if env is None else env, secrets=secrets)

    def clean(line: str) -> str:
        return redact(line, secrets)

    for number, step in enumerate(plan.steps, start=1):
        emit(clean(f"{log_prefix}step {number}/{len(plan.steps)} {step.name}: {step.shell_command()}"))
        step_env = {**base_env, **step.env, "PYTHONUNBUFFERED": "1"}
        tail: deque[str] = deque(maxlen=tail_lines)
        try:
            process = subprocess.Popen(
                list(step.argv),
                cwd=str(step.cwd) if step.cwd else None,
                env=step_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                bufsize=1,
            )
        except OSError as exc:
            raise BuildStepError(step, 127, [clean(f"cannot start {step.argv[0]!r}: {exc}")]) from exc
        assert process.stdout is not None
        for raw in process.stdout:
            line = clean(raw.rstrip("\n"))
            tail.append(line)
            emit(f"{log_prefix}{step.name}: {line}")
        returncode = process.wait()
        if returncode != 0:
            raise BuildStepError(step, returncode, list(tail))
    emit(f"{log_prefix}done: engine in {plan.output_dir}")


# ---- from the build section to a cache entry ------------------------------------------------------

FetchCheckpoint = Callable[[str, "str | None", Path], Path]


def engine_create_fn(
    config: BuildConfig,
    *,
    trtllm_version: str,
    fetch_checkpoint: FetchCheckpoint,
    work_root: Path,
    examples_dir: Path | None = None,
    python: str = sys.executable,
    trtllm_build: str = "trtllm-build",
    env: Mapping[str, str] | None = None,
    sink: LineSink | None = None,
    secrets: tuple[str, ...] = (),
) -> Callable[[Path], None]:
    """A `create_fn` for `EngineCache.get_or_create`: fetch the checkpoint, plan, run into `dest`.

    `fetch_checkpoint(repository, revision, dest_dir) -> checkpoint_dir` comes from the caller
    (e.g. the hub fetcher with the token bound), which keeps this module free of download details.
    """

    def create(dest: Path) -> None:
        work = dest.parent / "work"
        work.mkdir(parents=True, exist_ok=True)
        checkpoint = fetch_checkpoint(config.huggingface_ckpt_repository, config.huggingface_ckpt_revision, work_root)
        plan = plan_build(
            config,
            trtllm_version=trtllm_version,
            checkpoint_dir=checkpoint,
            output_dir=dest,
            work_dir=work,
            examples_dir=examples_dir,
            python=python,
            trtllm_build=trtllm_build,
        )
        try:
            run_build_plan(plan, env=env, sink=sink, secrets=secrets)
        finally:
            # The intermediate checkpoint is as large as the engine; never publish it.
            shutil.rmtree(work, ignore_errors=True)

    return create
