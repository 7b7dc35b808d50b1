"""Target `llm`: the LLM API driven directly in one process (`generate_async`, streaming), the shape of
`trtllm-serve`: the reference the llmapi path is measured against (`bench --compare --with-llm`).

The truss's own plan decides what runs: its `LLM(**model.yaml)` and our llmapi model's parameters are
rendered as `serve` renders them (backend llmapi: TensorRT-LLM's LLM where it is installed, else the
LLM-API double with its executor in a worker process), and a child process
(`triton_models/tensorrt_llm_llmapi/llm_direct.py`) builds that LLM once and runs each level's load on
the LLM's own event loop, so what is measured is the LLM API alone: no Triton, no socket between the load
and the LLM. The child's processes (and the executor's) are this target's CPU.

With TensorRT-LLM itself the child loads the model on the GPU beside the stack's own LLM: measure this
target alone then (`--target llm`), or with a model both fit.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import AsyncIterator

from trtllm_truss.bench.load import ClosedLoop, LoadLevel
from trtllm_truss.bench.stats import RequestRecord
from trtllm_truss.bench.targets.base import IgnoreEos, StreamChunk, TargetError, TargetName
from trtllm_truss.bench.workload import BenchRequest

PROGRAM = "trtllm_truss.triton_models.tensorrt_llm_llmapi.llm_direct"


class LlmTarget:
    name: TargetName = "llm"

    def __init__(self, truss_dir: Path, ignore_eos: IgnoreEos = "min_length", timeout_s: float = 600.0,
                 environ: Mapping[str, str] | None = None) -> None:
        self.truss_dir = Path(truss_dir)
        self.url = f"llm-api://{self.truss_dir}"
        self.ignore_eos = ignore_eos
        self.timeout_s = timeout_s
        self.environ = environ
        self._process: subprocess.Popen | None = None
        self._scratch: tempfile.TemporaryDirectory | None = None
        self.cpu_s = 0.0  # the child's own CPU seconds in the last level

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def open(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._start)

    def _start(self) -> None:
        from trtllm_truss.config import load_config
        from trtllm_truss.planning.plan import make_plan
        from trtllm_truss.planning.probe import probe_facts
        from trtllm_truss.repository import repository_configs
        from trtllm_truss.repository.llmapi import write_model_yaml

        plan = make_plan(load_config(self.truss_dir, self.environ), probe_facts(), environ=self.environ)
        if plan.backend != "llmapi":
            raise TargetError(f"target llm: the truss serves backend {plan.backend!r}; the LLM API runs with backend llmapi")
        self._scratch = tempfile.TemporaryDirectory(prefix="trtllm-bench-llm-")
        model_yaml = write_model_yaml(Path(self._scratch.name), plan)
        parameters = repository_configs(plan)["tensorrt_llm"].parameter_dict
        self._process = subprocess.Popen(
            [sys.executable, "-m", PROGRAM, str(model_yaml)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self._send(dict(parameters))
        first = self._receive()
        if "ready" not in first:
            raise TargetError(f"target llm: the LLM could not be built: {first.get('failed', first)}")

    def _send(self, message: dict) -> None:
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(json.dumps(message) + "\n")
        self._process.stdin.flush()

    def _receive(self) -> dict:
        assert self._process is not None and self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise TargetError(f"target llm: its process exited with {self._process.wait()}")
        return json.loads(line)

    async def run_level(self, requests: Sequence[BenchRequest], level: LoadLevel, timeout_s: float) -> list[RequestRecord]:
        """The whole level, run in the LLM's own process (closed loop)."""
        if not isinstance(level, ClosedLoop):
            raise TargetError("target llm: closed-loop levels (--concurrency) only")
        command = {
            "run": [[r.index, list(r.input_ids), r.output_len] for r in requests],
            "concurrency": level.concurrency, "ignore_eos": self.ignore_eos, "timeout_s": timeout_s,
        }

        def exchange() -> dict:
            self._send(command)
            return self._receive()

        answer = await asyncio.get_running_loop().run_in_executor(None, exchange)
        self.cpu_s = answer["cpu_s"]
        by_index = {r.index: r for r in requests}
        records = []
        for index, sent, first, last, finished, responses, tokens, error in answer["records"]:
            request = by_index[index]
            records.append(RequestRecord(
                index=index, input_tokens=request.input_len, requested_output_tokens=request.output_len,
                sent_at=sent, finished_at=finished, first_output_at=first, last_output_at=last,
                response_count=responses, output_tokens=tokens if error is None else None, error=error,
            ))
        return records

    def stream(self, request: BenchRequest) -> AsyncIterator[StreamChunk]:
        raise TargetError("target llm: runs whole levels in its own process (run_level)")

    async def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            try:
                self._process = process
                self._send({"quit": True})
            except (BrokenPipeError, OSError):
                pass
            finally:
                self._process = None
            try:
                await asyncio.get_running_loop().run_in_executor(None, process.wait, 60)
            except subprocess.TimeoutExpired:
                process.kill()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
