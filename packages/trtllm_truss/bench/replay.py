"""Trace replay: send a trace's requests to one target at the trace's own arrival times (time-scaled) or
as fast as a number of streams allows, and report what a fleet's KV cache made of them.

The report (JSON, schema_version 1, "kind": "trace_replay"):
  {"trace": {"path", "requests", "truncated", "synthesis": {...}, "time_scale"}, "settings": {...},
   "metrics": LevelMetrics (TTFT, ITL, end-to-end, tokens/s: bench.stats),
   "reuse": {"input_tokens", "cached_tokens", "cached_reported", "cached_fraction",
             "bound": infinite-cache bound (bench.reuse_bound), "cached_over_bound",
             "lru": the finite-pool reference | null,
             "bound_given_routing": the bound of each replica's own requests, summed (replicas named)},
   "per_replica": {replica: {"requests", "input_tokens", "cached_tokens", "output_tokens", "bound_tokens"}},
   "records": [[index, ttft_ms, e2e_ms, input_tokens, cached_tokens, output_tokens, replica, error]],
   "warnings": [...]}
Replicas are named as the responses name them (bench.targets.openai); "unknown" where they do not.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from trtllm_truss.bench.load import ClosedLoop
from trtllm_truss.bench.report import MachineInfo
from trtllm_truss.bench.reuse_bound import infinite_cache_reuse, lru_pool_reuse, token_blocks
from trtllm_truss.bench.runner import ProgressCallback, measure_request, run_level
from trtllm_truss.bench.stats import RequestRecord, summarize
from trtllm_truss.bench.targets.base import BenchTarget
from trtllm_truss.bench.trace import BlockTokens, TracePrompt
from trtllm_truss.bench.workload import BenchRequest

UNKNOWN_REPLICA = "unknown"


@dataclass(frozen=True)
class ReplayPlan:
    prompts: Sequence[TracePrompt]
    concurrency: int | None = None  # None: at the trace's arrival times; else this many streams, back to back
    max_concurrency: int | None = None  # at arrival times: cap on requests in flight (arrivals beyond it wait)
    timeout_s: float = 600.0
    kv_block_tokens: int = 512  # the engine's tokens per KV block, for the bounds
    lru_pool_blocks: int | None = None  # the finite-pool reference: blocks of one pool shared by all requests


async def replay(target: BenchTarget, plan: ReplayPlan, on_done: ProgressCallback | None = None) -> list[RequestRecord]:
    """Every request of the plan once, in trace order; records come back in request order."""
    requests = [p.request for p in plan.prompts]
    if plan.concurrency is not None:
        return await run_level(target, requests, ClosedLoop(concurrency=plan.concurrency), timeout_s=plan.timeout_s, on_done=on_done)
    cap = asyncio.Semaphore(plan.max_concurrency) if plan.max_concurrency else None

    async def arrive(request: BenchRequest) -> RequestRecord:
        if cap is None:
            return await measure_request(target, request, plan.timeout_s, on_done)
        async with cap:
            return await measure_request(target, request, plan.timeout_s, on_done)

    start = time.perf_counter()
    tasks = []
    for prompt in plan.prompts:
        delay = start + prompt.arrival_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # the trace's arrival schedule itself, not synchronisation
        tasks.append(asyncio.create_task(arrive(prompt.request)))
    return list(await asyncio.gather(*tasks))


def warmup_requests(vocabulary: Sequence[int], block_tokens: int, count: int, seed: int = 0) -> list[BenchRequest]:
    """Short requests whose one block comes from hash ids no trace uses (negative), so that warming the
    connections up leaves nothing in the KV cache that the trace could reuse."""
    blocks = BlockTokens(vocabulary, block_tokens, seed)
    return [BenchRequest(-1 - i, "", blocks.of(-1 - i), 4) for i in range(count)]


def replay_report(
    plan: ReplayPlan, records: Sequence[RequestRecord], *, trace: dict[str, Any], settings: dict[str, Any],
) -> dict[str, Any]:
    """The replay's figures (module docstring); records must have their output tokens counted."""
    metrics = summarize(records)
    ok = [r for r in records if r.ok]
    input_tokens = sum(r.input_tokens for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    # The bounds count the requests that succeeded, so that a failure lowers neither side alone.
    sent = {r.index for r in ok}
    blocks = [token_blocks(p.request.input_ids, plan.kv_block_tokens) for p in plan.prompts]
    lengths = [p.request.input_len for p in plan.prompts]  # a prompt's last token is never a hit
    bound = infinite_cache_reuse(blocks, plan.kv_block_tokens, lengths)
    bound_tokens = sum(t for p, t in zip(plan.prompts, bound.per_request) if p.request.index in sent)
    reuse: dict[str, Any] = {
        "input_tokens": input_tokens,
        "cached_tokens": cached,
        "cached_reported": sum(1 for r in ok if r.cached_tokens is not None),
        "cached_fraction": cached / input_tokens if input_tokens else None,
        "bound": bound.as_dict(sum(lengths)) | {"cached_tokens_of_succeeded": bound_tokens},
        "cached_over_bound": cached / bound_tokens if bound_tokens else None,
        "lru": None,
    }
    if plan.lru_pool_blocks is not None:
        lru = lru_pool_reuse(blocks, plan.kv_block_tokens, plan.lru_pool_blocks, lengths)
        reuse["lru"] = lru.as_dict(sum(lengths))
    per_replica: dict[str, dict[str, int]] = {}
    for r in ok:
        row = per_replica.setdefault(r.replica or UNKNOWN_REPLICA, {"requests": 0, "input_tokens": 0, "cached_tokens": 0, "output_tokens": 0})
        row["requests"] += 1
        row["input_tokens"] += r.input_tokens
        row["cached_tokens"] += r.cached_tokens or 0
        row["output_tokens"] += r.output_tokens or 0
    # The bound again, each replica on its own with the requests it was given: what an unbounded pool per
    # replica would have kept. Below the trace's bound: the routing split prefixes; above the cached
    # tokens: the finite pools evicted them.
    if any(r.replica for r in ok):
        index_of = {p.request.index: i for i, p in enumerate(plan.prompts)}
        given = 0
        for name, row in per_replica.items():
            mine = [index_of[r.index] for r in ok if (r.replica or UNKNOWN_REPLICA) == name]
            mine_bound = infinite_cache_reuse([blocks[i] for i in mine], plan.kv_block_tokens, [lengths[i] for i in mine])
            row["bound_tokens"] = mine_bound.cached_tokens
            given += mine_bound.cached_tokens
        reuse["bound_given_routing"] = given
    warnings = []
    if ok and reuse["cached_reported"] == 0:
        warnings.append("no response reported usage.prompt_tokens_details.cached_tokens: cached tokens count as 0")
    if trace.get("truncated"):
        warnings.append(f"{trace['truncated']} prompt(s) cut to the input maximum (whole blocks kept)")
    return {
        "schema_version": 1,
        "kind": "trace_replay",
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": MachineInfo.current().model_dump(),
        "trace": trace,
        "settings": settings,
        "metrics": metrics.model_dump(),
        "reuse": reuse,
        "per_replica": dict(sorted(per_replica.items())),
        "records": [_record_row(r) for r in records],
        "warnings": warnings,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _record_row(r: RequestRecord) -> list[Any]:
    return [r.index, _ms(r.ttft_s), _ms(r.e2e_s), r.input_tokens, r.cached_tokens, r.output_tokens, r.replica, r.error]


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The few figures a reader wants first."""
    m, reuse = report["metrics"], report["reuse"]
    ratio = reuse["cached_over_bound"]
    lines = [
        f"requests: {m['succeeded']}/{m['requests']} succeeded in {m['duration_s']:.1f} s;"
        f" output {m['output_tokens_per_s']:,.1f} tok/s",
        f"TTFT p50 {_fmt(m['ttft_ms']['p50'])} ms, p99 {_fmt(m['ttft_ms']['p99'])} ms;"
        f" end-to-end p50 {_fmt(m['e2e_ms']['p50'])} ms",
        f"cached tokens: {reuse['cached_tokens']:,} of {reuse['input_tokens']:,} prompt tokens;"
        f" the trace's bound (infinite cache): {reuse['bound']['cached_tokens_of_succeeded']:,};"
        f" cached / bound: {'-' if ratio is None else f'{ratio:.3f}'}",
    ]
    if reuse["lru"] is not None:
        lines.append(f"LRU pool of {reuse['lru']['pool_blocks']} blocks would cache {reuse['lru']['cached_tokens']:,} tokens")
    if reuse.get("bound_given_routing") is not None:
        lines.append(f"bound given the routing (each replica's requests, unbounded pools): {reuse['bound_given_routing']:,}")
    lines += [f"replica {name}: {row['requests']} requests, {row['cached_tokens']:,} cached of {row['input_tokens']:,}"
              for name, row in report["per_replica"].items()]
    return lines


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def write_report(report: dict[str, Any], path: Path) -> None:
    """Indented JSON, with one line per request record."""
    head = json.dumps({k: v for k, v in report.items() if k != "records"}, indent=1)
    rows = ",\n".join("  " + json.dumps(row) for row in report.get("records", []))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head[:-2] + ',\n "records": [\n' + rows + "\n ]\n}\n", encoding="utf-8")
