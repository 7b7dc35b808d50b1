"""A batch behind interactive traffic, on the direct front of this checkout's default deployment.

One run: interactive TTFT at `--streams` concurrent streamed chats, in `--rounds` rounds of a phase
without a batch then a phase with one running (a batch of `--lines` lines, cancelled after its phase),
and a last phase without (side by side, same server: each phase with a batch is compared with the phases
without on either side of it). Then a batch runs `--alone-s` seconds with no interactive request (its
lines per second on an idle host, against those beside interactive traffic), and a `--lines`-line batch runs to its end, the server stopped with
SIGTERM once half of it is answered and started again on the same store, and every line must be answered
exactly once (counted from its output file). Writes the raw numbers as JSON.

    .venv/bin/python docs/performance/batches/batch_study.py --out docs/performance/batches/embedded-1000-lines.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[3]


def start(work: Path, env: dict[str, str], n: int):
    from trtllm_truss.fronts.direct import start_direct_server

    proc = start_direct_server(REPO_ROOT, work / f"direct-{n}.log", env=env)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.process.poll() is not None:
            raise SystemExit(proc.log_tail())
        try:
            if httpx.get(proc.url + "/health/ready", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not become ready")


async def one_stream(client: httpx.AsyncClient, url: str, i: int, max_tokens: int) -> float:
    body = {"model": "embedded", "stream": True, "max_tokens": max_tokens, "temperature": 0.0,
            "messages": [{"role": "user", "content": f"Write about the number {i}."}]}
    started = time.perf_counter()
    first = None
    async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=HEADERS) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {") and '"content"' in line:
                first = time.perf_counter() - started
    assert first is not None
    return first


async def interactive(url: str, streams: int, per_stream: int, max_tokens: int) -> list[float]:
    async with httpx.AsyncClient(timeout=300) as client:
        async def worker(w: int) -> list[float]:
            return [await one_stream(client, url, w * 1000 + k, max_tokens) for k in range(per_stream)]

        results = await asyncio.gather(*(worker(w) for w in range(streams)))
    return [t for r in results for t in r]


def summary(ttfts: list[float]) -> dict:
    ordered = sorted(ttfts)
    return {"count": len(ordered), "p50_ms": 1000 * statistics.median(ordered),
            "p90_ms": 1000 * ordered[int(0.9 * (len(ordered) - 1))], "mean_ms": 1000 * statistics.fmean(ordered)}


HEADERS = {"Authorization": "Bearer sk-study"}


def batch_status(url: str, batch_id: str) -> dict:
    return httpx.get(f"{url}/v1/batches/{batch_id}", headers=HEADERS, timeout=30).json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--batch-max-tokens", type=int, default=16)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--per-stream", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--max-in-flight", type=int, default=4)
    parser.add_argument("--max-in-flight-under-load", type=int, default=1,
                        help="runtime.batches.max_in_flight_under_load: the batch lines started while interactive requests run")
    parser.add_argument("--alone-s", type=float, default=20.0,
                        help="seconds a batch runs with no interactive request (its lines/s on an idle host; 0: skipped)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-restart", action="store_true",
                        help="only the side-by-side TTFT phases, not the batch stopped and resumed (step 2)")
    parser.add_argument("--work-dir", type=Path, help="where the store and the servers' logs go (default: a new temporary folder)")
    args = parser.parse_args()

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="batch-study-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {"TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES": str(args.processes),
           "TRTLLM_RUNTIME__STORE__PATH": str(work / "store.sqlite3"),
           "TRTLLM_RUNTIME__BATCHES__MAX_IN_FLIGHT": str(args.max_in_flight),
           "TRTLLM_RUNTIME__BATCHES__MAX_IN_FLIGHT_UNDER_LOAD": str(args.max_in_flight_under_load),
           "TRTLLM_RUNTIME__BATCHES__POLL_S": "0.2"}
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "machine": platform.platform(),
                    "cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_at_start": os.getloadavg(),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    proc = start(work, env, 1)
    try:
        url = proc.url
        asyncio.run(interactive(url, 2, 1, 4))  # warm up

        def submit() -> dict:
            lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "embedded", "max_tokens": args.batch_max_tokens, "ignore_eos": True,
                               "messages": [{"role": "user", "content": f"Summarise item {i}."}]}} for i in range(args.lines)]
            data = "".join(json.dumps(line) + "\n" for line in lines).encode()
            uploaded = httpx.post(url + "/v1/files", headers=HEADERS, files={"file": ("in.jsonl", data)},
                                  data={"purpose": "batch"}, timeout=60).json()
            made = httpx.post(url + "/v1/batches", headers=HEADERS, timeout=60, json={
                "input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}).json()
            while batch_status(url, made["id"])["request_counts"]["completed"] < args.max_in_flight:
                time.sleep(0.2)  # the batch is on the engine before the phase starts
            return made

        def phase() -> tuple[list[float], float]:
            started = time.monotonic()
            ttfts = asyncio.run(interactive(url, args.streams, args.per_stream, args.max_tokens))
            return ttfts, time.monotonic() - started

        phases: list[dict] = []
        for _ in range(args.rounds):
            without, wall_s = phase()
            phases.append({"batch": False, "wall_s": wall_s} | summary(without) | {"ttft_s": without})
            load = submit()
            at_start = batch_status(url, load["id"])["request_counts"]["completed"]
            with_batch, wall_s = phase()
            during = batch_status(url, load["id"])
            # lines answered while the interactive phase ran (the status is read right before and after it)
            answered = during["request_counts"]["completed"] - at_start
            httpx.post(f"{url}/v1/batches/{load['id']}/cancel", headers=HEADERS, timeout=60)
            while batch_status(url, load["id"])["status"] != "cancelled":
                time.sleep(0.2)
            phases.append({"batch": True, "wall_s": wall_s, "batch_status_after": during["status"],
                           "batch_lines_answered_after": during["request_counts"]["completed"],
                           "batch_lines_answered_during": answered, "batch_lines_per_s_during": answered / wall_s}
                          | summary(with_batch) | {"ttft_s": with_batch})
        without, wall_s = phase()
        phases.append({"batch": False, "wall_s": wall_s} | summary(without) | {"ttft_s": without})
        report["phases"] = phases
        ratios = [p["p50_ms"] / statistics.fmean([phases[i - 1]["p50_ms"], phases[i + 1]["p50_ms"]])
                  for i, p in enumerate(phases) if p["batch"]]
        pooled = {kind: summary([t for p in phases if p["batch"] is kind for t in p["ttft_s"]]) for kind in (False, True)}
        report["ttft_p50_ratio_per_round"] = ratios  # each phase with a batch against the mean of its neighbours
        report["ttft_p50_ratio_median"] = statistics.median(ratios)
        report["pooled_without"], report["pooled_with"] = pooled[False], pooled[True]
        report["ttft_p50_ratio_pooled"] = pooled[True]["p50_ms"] / pooled[False]["p50_ms"]
        answered = sum(p["batch_lines_answered_during"] for p in phases if p["batch"])
        report["batch_lines_per_s_beside_interactive"] = answered / sum(p["wall_s"] for p in phases if p["batch"])
        if args.alone_s > 0:  # the same batch on an idle host: what the share under load costs the batch
            load = submit()
            at_start, started = batch_status(url, load["id"])["request_counts"]["completed"], time.monotonic()
            time.sleep(args.alone_s)
            answered = batch_status(url, load["id"])["request_counts"]["completed"] - at_start
            report["batch_lines_per_s_idle_host"] = answered / (time.monotonic() - started)
            httpx.post(f"{url}/v1/batches/{load['id']}/cancel", headers=HEADERS, timeout=60)
            while batch_status(url, load["id"])["status"] != "cancelled":
                time.sleep(0.2)
        if args.no_restart:
            return

        batch_started = time.monotonic()  # before the upload: submit() returns once a few lines are answered
        batch = submit()
        while batch_status(url, batch["id"])["request_counts"]["completed"] < args.lines // 2:
            time.sleep(0.5)
        before_stop = batch_status(url, batch["id"])["request_counts"]["completed"]
        first_half_s = time.monotonic() - batch_started
        proc.stop()  # SIGTERM halfway
        proc = start(work, env, 2)
        url = proc.url
        while (status := batch_status(url, batch["id"]))["status"] not in ("completed", "failed", "cancelled", "expired"):
            time.sleep(1.0)
        report["batch_s"] = time.monotonic() - batch_started
        # alone on the engine: the lines answered before the SIGTERM over the time they took (restart excluded)
        report["batch_lines_per_s_alone"] = before_stop / first_half_s
        output = httpx.get(f"{url}/v1/files/{status['output_file_id']}/content", headers=HEADERS, timeout=60).text
        ids = Counter(json.loads(line)["custom_id"] for line in output.splitlines())
        log = (work / "direct-2.log").read_text(errors="replace")
        resumed = [line for line in log.splitlines() if f"batch {batch['id']}:" in line and "lines to run" in line]
        report["batch"] = {
            "status": status["status"], "request_counts": status["request_counts"],
            "answered_before_sigterm": before_stop, "resumed_log": resumed,
            "output_lines": sum(ids.values()), "distinct_custom_ids": len(ids),
            "answered_more_than_once": sum(1 for c in ids.values() if c > 1),
            "missing": args.lines - len(ids),
        }
    finally:
        proc.stop()
        report["load_average_at_end"] = os.getloadavg()
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
