"""Where a first token's time goes on the llmapi path: a harness tool for issue 39, not the product.

    git apply docs/performance/llmapi-path/first-token-trace.patch   # temporary: each process logs its first-token events
    mkdir /tmp/trtllm-trace                               # tracing is on while this folder exists
    trtllm-truss bench . --compare --with-llm ...         # with TRTLLM_RUNTIME__BACKEND=llmapi
    python scripts/first_token_trace.py /tmp/trtllm-trace [--json OUT.json]

The patch has each process append `event key monotonic_ns` lines to /tmp/trtllm-trace/PID.txt (one clock for
every process of the machine): the instance stub when Triton hands it a request (`accept`), reads the request's
first tokens from the host (`stub_read`), takes them from its queue (`stub_pop`) and has sent them
(`stub_sent`); the LLM host when it submits the request (`host_submit`) and its result yields the first tokens
(`host_first`); the double's executor worker when the request arrives (`w_submit`) and its first tokens leave
the engine (`w_first`); the LLM's dispatch thread when they arrive (`dispatch_first`); and the LLM driven
directly (`submit`, `direct_first`). This prints each leg's median, mean and 90th percentile in milliseconds,
for the Triton model's requests (bench's, request ids `bench-*`), the HTTP front's and the LLM alone's.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path

TRITON_LEGS = (
    ("stub accept -> host submit", "accept", "host_submit"),
    ("host submit -> worker", "host_submit", "w_submit"),
    ("worker: arrival -> first tokens", "w_submit", "w_first"),
    ("worker -> host's dispatch thread", "w_first", "dispatch_first"),
    ("dispatch thread -> host's result", "dispatch_first", "host_first"),
    ("host -> stub read", "host_first", "stub_read"),
    ("stub: read -> its turn", "stub_read", "stub_pop"),
    ("stub: send", "stub_pop", "stub_sent"),
    ("whole: stub accept -> sent", "accept", "stub_sent"),
)
DIRECT_LEGS = (
    ("submit -> worker", "submit", "w_submit"),
    ("worker: arrival -> first tokens", "w_submit", "w_first"),
    ("worker -> dispatch thread", "w_first", "dispatch_first"),
    ("dispatch thread -> the caller's result", "dispatch_first", "direct_first"),
    ("whole: submit -> first tokens", "submit", "direct_first"),
)
ENGINE_SIDE = ("w_submit", "w_first", "dispatch_first", "submit")  # keyed by the engine's request id


def read(folder: Path) -> dict[str, dict[str, int]]:
    events: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for path in folder.glob("*.txt"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                events[parts[0]][parts[1]] = int(parts[2])
    return events


def legs(events: dict[str, dict[str, int]]) -> dict[str, dict[str, dict[str, float]]]:
    engine_id = {}  # Triton request id -> the engine's request id
    by_triton: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for key, at in events["host_submit"].items():
        triton_id, request_id = key.split("|")
        engine_id[triton_id] = request_id
        by_triton["host_submit"][triton_id] = at
    for event in ("accept", "host_first", "stub_read", "stub_pop", "stub_sent"):
        by_triton[event] = events[event]

    def at(event: str, triton_id: str) -> int | None:
        if event in ENGINE_SIDE:
            return events[event].get(engine_id.get(triton_id, ""))
        return by_triton[event].get(triton_id)

    def summary(values: list[float]) -> dict[str, float]:
        values.sort()
        return {"n": len(values), "median_ms": statistics.median(values), "mean_ms": statistics.mean(values),
                "p90_ms": values[int(len(values) * 0.9)]}

    out: dict[str, dict[str, dict[str, float]]] = {}
    for path, is_bench in (("triton_model", True), ("http", False)):
        ids = [t for t in events["accept"] if t.startswith("bench-") == is_bench]
        out[path] = {}
        for name, start, end in TRITON_LEGS:
            values = [(b - a) / 1e6 for t in ids if (a := at(start, t)) is not None and (b := at(end, t)) is not None]
            if values:
                out[path][name] = summary(values)
    direct = list(events["direct_first"])
    out["llm"] = {}
    for name, start, end in DIRECT_LEGS:
        values = [(events[end][r] - events[start][r]) / 1e6 for r in direct if r in events[start] and r in events[end]]
        if values:
            out["llm"][name] = summary(values)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", type=Path, help="also write the legs here")
    args = parser.parse_args()
    result = legs(read(args.folder))
    for path, rows in result.items():
        print(path)
        for name, s in rows.items():
            print(f"  {name:40s} n={s['n']:6d}  median {s['median_ms']:6.2f} ms  mean {s['mean_ms']:6.2f}  p90 {s['p90_ms']:6.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
