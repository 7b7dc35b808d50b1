"""CPU per token of the LLM host (our llmapi model's one LLM process) against the LLM API driven directly (issue 39).

    .venv/bin/python scripts/llmapi_host_cost.py --streams 256 --requests 2048 --rounds 2

Both run this repository's truss as `backend: llmapi` on the synthetic engine (`--step-ms`, `--interval`),
over the LLM-API double with its executor in a worker process, on the same load of `--requests` rows of 128
tokens at `--streams` at a time:
- `llm_direct.py` (bench's `llm` target): `generate_async` per request in its own process; its own CPU time;
- `llm_host.py`, fed by `--instances` connections standing in for the Triton instances (threads of this
  process that submit rows and read the host's frames, as model.py does, without Triton); the host's CPU time
  from /proc (its threads, not the executor worker's).
It prints each round's CPU per token and tokens/s. Where the LLM's process is the limit (hundreds of streams
at 2 ms steps), the ratio of the two CPU figures bounds the Triton model's tokens/s against the LLM alone.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from trtllm_truss.config import load_config
from trtllm_truss.engine_standin.types import GenerationRequest, SamplingParams
from trtllm_truss.planning.plan import make_plan
from trtllm_truss.planning.probe import probe_facts
from trtllm_truss.repository import repository_configs
from trtllm_truss.repository.llmapi import write_model_yaml
from trtllm_truss.triton_models.tensorrt_llm_llmapi.host_link import FrameReader, encode

PACKAGE = "trtllm_truss.triton_models.tensorrt_llm_llmapi"
OUTPUT_LEN = 128
PROMPT = list(range(100, 164))


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def measure_direct(model_yaml: Path, parameters: dict, env: dict, args: argparse.Namespace) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", f"{PACKAGE}.llm_direct", str(model_yaml)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=env,
    )
    assert process.stdin is not None and process.stdout is not None

    def send(message: dict) -> None:
        process.stdin.write(json.dumps(message) + "\n")
        process.stdin.flush()

    send(parameters)
    assert "ready" in json.loads(process.stdout.readline())
    for _ in range(args.rounds):
        started = time.perf_counter()
        send({"run": [[i, PROMPT, OUTPUT_LEN] for i in range(args.requests)], "concurrency": args.streams,
              "ignore_eos": "min_length", "timeout_s": 600})
        answer = json.loads(process.stdout.readline())
        wall = time.perf_counter() - started
        tokens = sum(record[6] for record in answer["records"])
        report("llm direct", answer["cpu_s"], tokens, wall)
    send({"quit": True})
    process.wait(60)


def measure_host(model_yaml: Path, parameters: dict, env: dict, args: argparse.Namespace) -> None:
    name = f"trtllm-truss-host-cost-{os.getpid()}"
    host = subprocess.Popen(
        [sys.executable, "-m", f"{PACKAGE}.llm_host", name, str(model_yaml), str(os.getpid())], stdin=subprocess.PIPE, env=env,
    )
    assert host.stdin is not None
    host.stdin.write(json.dumps(parameters).encode())
    host.stdin.close()
    links = [connect("\0" + name, host) for _ in range(args.instances)]
    for _ in range(args.rounds):
        cpu_before, started = cpu_seconds(host.pid), time.perf_counter()
        tokens = host_round(links, args)
        report("llm host", cpu_seconds(host.pid) - cpu_before, tokens, time.perf_counter() - started)
    links[0][0].sendall(encode([("shutdown",)]))
    host.wait(60)


def host_round(links: list[tuple[socket.socket, FrameReader]], args: argparse.Namespace) -> int:
    """`args.requests` rows through the host, `args.streams` at a time, spread over the links; the tokens received."""
    lock = threading.Lock()
    slots = threading.Semaphore(args.streams)
    state = {"next": 0, "ended": 0, "tokens": 0}

    def submit(link: tuple[socket.socket, FrameReader], instance: int) -> None:
        while True:
            with lock:
                row = state["next"]
                if row >= args.requests:
                    return
                state["next"] += 1
            slots.acquire()
            generation = GenerationRequest(
                request_id=str(row), input_ids=PROMPT, max_new_tokens=OUTPUT_LEN, sampling=SamplingParams(min_length=OUTPUT_LEN),
            )
            link[0].sendall(encode([("submit", (instance, row), generation, 1, True, "")]))

    def receive(link: tuple[socket.socket, FrameReader]) -> None:
        link[0].settimeout(0.2)
        while state["ended"] < args.requests:
            try:
                updates = link[1].read()
            except TimeoutError:
                continue
            for _, _, tokens, _, _, finish, error in updates or ():
                with lock:
                    state["tokens"] += len(tokens or ())
                    if finish is not None or error is not None:
                        state["ended"] += 1
                        slots.release()

    threads = [threading.Thread(target=receive, args=(link,)) for link in links]
    threads += [threading.Thread(target=submit, args=(link, i)) for i, link in enumerate(links)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return state["tokens"]


def connect(address: str, host: subprocess.Popen, timeout_s: float = 120.0) -> tuple[socket.socket, FrameReader]:
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(address)
            break
        except OSError:
            sock.close()
        if host.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the LLM host did not start")
        time.sleep(0.1)
    reader = FrameReader(sock)
    first = reader.read()
    if not first or first[0][0] != "ready":
        raise SystemExit(f"the LLM host: {first}")
    return sock, reader


def report(what: str, cpu_s: float, tokens: int, wall_s: float) -> None:
    print(f"{what}: {cpu_s:.2f} s CPU for {tokens} tokens in {wall_s:.2f} s: {cpu_s / tokens * 1e6:.2f} us/token,"
          f" {tokens / wall_s:,.0f} tok/s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--requests", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--instances", type=int, default=4, help="connections standing in for Triton instances")
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--interval", type=int, default=1, help="runtime.stream_interval")
    args = parser.parse_args()
    repo = Path(__file__).resolve().parents[1]
    env = dict(
        os.environ, TRTLLM_RUNTIME__BACKEND="llmapi", TRTLLM_RUNTIME__STREAM_INTERVAL=str(args.interval),
        TRTLLM_RUNTIME__PYTORCH__SYNTHETIC=json.dumps({"step_time_ms": args.step_ms}),
        TRTLLM_BUILD__MAX_BATCH_SIZE=str(max(args.streams, 8)), TRTLLM_RUNTIME__MAX_QUEUED_REQUESTS=str(max(args.streams, 8)),
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo / "packages"), env.get("PYTHONPATH", "")) if p)
    plan = make_plan(load_config(repo, env), probe_facts(), environ=env)
    with tempfile.TemporaryDirectory(prefix="trtllm-host-cost-") as scratch:
        model_yaml = write_model_yaml(Path(scratch), plan)
        parameters = dict(repository_configs(plan)["tensorrt_llm"].parameter_dict)
        measure_direct(model_yaml, parameters, env, args)
        measure_host(model_yaml, parameters, env, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
