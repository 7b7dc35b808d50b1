"""Dynamo's mocker fleet as the reference: replay a trace against N `dynamo.mocker` workers behind Dynamo's
frontend, once per router mode, with `trtllm-truss bench --trace`.

For each router mode (kv, round-robin): a fresh file-discovery directory, `python -m dynamo.frontend
--discovery-backend file --router-mode MODE --kv-cache-block-size B`, one `python -m dynamo.mocker`
process running N workers (`--num-workers N`: they share one tokio runtime, lighter on a small machine;
each registers as its own instance and keeps its own KV pool of `--pool-blocks` blocks), then the replay,
then both stopped. Needs ai-dynamo and ai-dynamo-runtime (1.6.1) in the running Python.

  python docs/performance/fleet-kv-routing/harness.py --replicas 2 --trace-limit 60 \\
      --trace-block-tokens 16 --block-size 16 --pool-blocks 256 --out /tmp/mocker-smoke

Writes OUT/mocker-<mode>.json (bench.replay's report) and OUT/*.log (the fleet's output).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[3]
DEFAULT_TRACE = Path(__file__).resolve().parent / "conversation_trace_first600s.jsonl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=2, help="mocker workers (default: 2)")
    parser.add_argument("--router-modes", default="kv,round-robin", help="comma-separated (default: kv,round-robin)")
    parser.add_argument("--model-path", default=str(REPO / "data" / "embedded-llama"), help="tokenizer/model dir")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block, mocker and router (default: 16)")
    parser.add_argument("--pool-blocks", type=int, default=1024, help="KV blocks per worker (--num-gpu-blocks-override)")
    parser.add_argument("--engine-type", default="vllm", help="the mocker's scheduler model: vllm, sglang, trtllm")
    parser.add_argument("--speedup-ratio", type=float, default=1.0,
                        help="the mocker's timing: >1 faster, 0 no simulated delay (default: 1)")
    parser.add_argument("--decode-speedup-ratio", type=float, default=1.0, help="decode-only speedup (default: 1)")
    parser.add_argument("--mocker-arg", action="append", default=[], help="one more argument for dynamo.mocker")
    parser.add_argument("--frontend-arg", action="append", default=[],
                        help="one more argument for dynamo.frontend, e.g. the KV router's --router-policy-config")
    parser.add_argument("--http-port", type=int, default=8931)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--trace-limit", type=int, default=None)
    parser.add_argument("--trace-block-tokens", type=int, default=16)
    parser.add_argument("--trace-time-scale", type=float, default=1.0)
    parser.add_argument("--trace-max-input", type=int, default=None)
    parser.add_argument("--trace-max-output", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=None, help="back to back with this many streams (default: at the timestamps)")
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON reports and logs")
    return parser.parse_args(argv)


def _start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    handle = log.open("wb")
    # A session of its own, so that stopping it stops what it started and nothing else.
    return subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)


def _stop(process: subprocess.Popen, timeout_s: float = 20.0) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout_s)


def _workers_registered(discovery: Path) -> int:
    """Instances of the workers' generate endpoint in the file discovery store: one file each under
    v1/instances/, named (URL-quoted) namespace/component/generate/instance id."""
    instances = discovery / "v1" / "instances"
    names = [unquote(p.name).split("/") for p in instances.iterdir()] if instances.is_dir() else []
    return sum(1 for parts in names if len(parts) >= 2 and parts[-2] == "generate")


def _wait_ready(url: str, discovery: Path, replicas: int, processes: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in processes:
            if p.poll() is not None:
                raise RuntimeError(f"{' '.join(map(str, p.args[:4]))} exited with {p.returncode}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:
                listed = json.load(resp).get("data")
        except OSError:
            listed = None
        if listed and _workers_registered(discovery) >= replicas:
            return
        time.sleep(0.5)  # polling readiness with a deadline
    raise RuntimeError(f"the fleet at {url} was not ready with {replicas} workers within {timeout_s:g} s")


def run_mode(args: argparse.Namespace, mode: str) -> Path:
    url = f"http://127.0.0.1:{args.http_port}"
    report = args.out / f"mocker-{mode}.json"
    # Under OUT, so that the processes of this run are recognisable by their environment; removed after.
    with tempfile.TemporaryDirectory(prefix=f"discovery-{mode}-", dir=args.out) as discovery:
        env = {**os.environ, "DYN_FILE_KV": discovery}
        frontend = _start([
            sys.executable, "-m", "dynamo.frontend", "--http-port", str(args.http_port), "--discovery-backend", "file",
            "--router-mode", mode, "--kv-cache-block-size", str(args.block_size), *args.frontend_arg,
        ], args.out / f"frontend-{mode}.log", env)
        mocker = _start([
            sys.executable, "-m", "dynamo.mocker", "--model-path", args.model_path, "--discovery-backend", "file",
            "--num-workers", str(args.replicas), "--block-size", str(args.block_size),
            "--num-gpu-blocks-override", str(args.pool_blocks), "--engine-type", args.engine_type,
            "--speedup-ratio", str(args.speedup_ratio), "--decode-speedup-ratio", str(args.decode_speedup_ratio),
            *args.mocker_arg,
        ], args.out / f"mocker-{mode}.log", env)
        try:
            _wait_ready(url, Path(discovery), args.replicas, [frontend, mocker], args.startup_timeout)
            bench = [
                sys.executable, "-m", "trtllm_truss.cli", "bench", str(REPO), "--trace", str(args.trace),
                "--url", url, "--tokenizer", args.model_path, "--dynamo-worker-id", "--ignore-eos", "end_id",
                "--trace-block-tokens", str(args.trace_block_tokens), "--kv-block-tokens", str(args.block_size),
                "--trace-time-scale", str(args.trace_time_scale), "--lru-pool-blocks", str(args.replicas * args.pool_blocks),
                "--json", str(report), "--no-progress",
            ]
            for option, value in (("--trace-limit", args.trace_limit), ("--trace-max-input", args.trace_max_input),
                                  ("--trace-max-output", args.trace_max_output), ("--concurrency", args.concurrency)):
                if value is not None:
                    bench += [option, str(value)]
            subprocess.run(bench, cwd=REPO, check=True)
        finally:
            _stop(mocker)
            _stop(frontend)
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    (args.out / "harness-settings.json").write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")
    for mode in args.router_modes.split(","):
        print(f"--- router mode {mode}: {run_mode(args, mode.strip())}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
