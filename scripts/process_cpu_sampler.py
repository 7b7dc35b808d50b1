"""Per-process CPU of a running stack, sampled once a second (a harness tool for issue 39, not the product).

    python scripts/process_cpu_sampler.py OUT.jsonl [PERIOD_S]   # until killed
    python scripts/process_cpu_sampler.py summarize OUT.jsonl[.gz]

Each line: `{"t": seconds since start, "machine": CPU seconds of the whole machine so far, "procs": {pid: [role,
cpu seconds so far]}}` for the processes of our llmapi stack: the LLM host, the double's executor worker,
Triton's python stubs, tritonserver, the direct front's processes and bench's client processes. `summarize`
turns the file into each role's busiest process over one period, the busiest period of the whole machine, and
the LLM host's cores over the periods where it was busy: whether one process is the limit."""

from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path

import psutil

ROLES = (  # (role, a word of its command line), the first match wins
    ("llm_host", "tensorrt_llm_llmapi.llm_host"),
    ("llm_direct", "tensorrt_llm_llmapi.llm_direct"),
    ("executor_worker", "engine_standin.llmapi_executor"),
    ("python_stub", "triton_python_backend_stub"),
    ("tritonserver", "tritonserver"),
    ("front", "trtllm_truss.fronts"),
    ("bench_client", "multiprocessing.spawn"),  # bench's client processes (spawned)
    ("bench", "trtllm_truss.cli"),  # bench itself, and the launcher it starts (`serve`)
)


def role_of(cmdline: str) -> str | None:
    return next((role for role, word in ROLES if word in cmdline), None)


def sample() -> dict[str, list]:
    procs = {}
    for process in psutil.process_iter(["cmdline", "cpu_times"]):
        role = role_of(" ".join(process.info["cmdline"] or ()))
        times = process.info["cpu_times"]
        if role is not None and times is not None:  # None: gone or not readable while iterated
            procs[str(process.pid)] = [role, times.user + times.system]
    return procs


def machine_cpu_seconds() -> float:
    """Every core's busy time (user, nice, system, irq, softirq, steal)."""
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq + times.steal


def record(path: str, period_s: float) -> None:
    start = time.monotonic()
    with open(path, "a", encoding="utf-8") as out:
        while True:
            line = {"t": round(time.monotonic() - start, 2), "machine": machine_cpu_seconds(), "procs": sample()}
            out.write(json.dumps(line) + "\n")
            out.flush()
            time.sleep(period_s)  # a sampling period, not a synchronisation


def summarize(path: str) -> dict:
    """Per role, the most cores one process of it used over one period; and the LLM host's cores per period
    while it was busy (over 0.2 cores)."""
    text = gzip.decompress(Path(path).read_bytes()).decode() if path.endswith(".gz") else Path(path).read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    busiest: dict[str, float] = {}
    host: list[float] = []
    machine = 0.0
    for before, after in zip(lines, lines[1:]):
        period = after["t"] - before["t"]
        if period <= 0:
            continue
        if "machine" in after:  # (the first version sampled processes only)
            machine = max(machine, round((after["machine"] - before["machine"]) / period, 1))
        for pid, (role, cpu) in after["procs"].items():
            if pid in before["procs"]:
                cores = (cpu - before["procs"][pid][1]) / period
                busiest[role] = max(busiest.get(role, 0.0), round(cores, 2))
                if role == "llm_host" and cores > 0.2:
                    host.append(round(cores, 2))
    return {"busiest_process_cores": busiest, "machine_busiest_cores": machine, "llm_host_busy_cores": host}


if __name__ == "__main__":
    if sys.argv[1] == "summarize":
        print(json.dumps(summarize(sys.argv[2])))
    else:
        record(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1.0)
