"""Drives one target at one load level and records what each request saw.

The loop does as little as possible per response (a clock read and a few additions): on a 2-core
machine the client shares the CPU with the server it measures. Text targets' tokens are counted
after the level has finished, for the same reason.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from trtllm_truss.bench.load import ClosedLoop, LoadLevel, OpenLoop, poisson_arrival_offsets
from trtllm_truss.bench.stats import RequestRecord
from trtllm_truss.bench.targets.base import BenchTarget
from trtllm_truss.bench.workload import BenchRequest, TokenizerLike

# auto: exact counts where the target gives them (engine token ids), re-tokenized text otherwise;
# retokenize: always re-tokenize text; requested: trust the requested output length of every
# request that finished (only meaningful with ignore-EOS requests).
TokenCounting = Literal["auto", "retokenize", "requested"]

ProgressCallback = Callable[[], None]


async def measure_request(
    target: BenchTarget, request: BenchRequest, timeout_s: float, on_done: ProgressCallback | None
) -> RequestRecord:
    record = RequestRecord(
        index=request.index,
        input_tokens=request.input_len,
        requested_output_tokens=request.output_len,
        sent_at=time.perf_counter(),
    )
    tokens = 0
    counted = True
    usage_tokens: int | None = None

    async def consume() -> None:
        nonlocal tokens, counted, usage_tokens
        async for chunk in target.stream(request):
            now = time.perf_counter()
            if chunk.usage_output_tokens is not None:
                usage_tokens = chunk.usage_output_tokens
            if chunk.cached_tokens is not None:
                record.cached_tokens = chunk.cached_tokens
            if chunk.replica is not None:
                record.replica = chunk.replica
            if not (chunk.token_count or chunk.text):
                continue  # e.g. an empty final response
            if record.first_output_at is None:
                record.first_output_at = now
            record.last_output_at = now
            record.response_count += 1
            if chunk.token_count is None:
                counted = False
            else:
                tokens += chunk.token_count
            if chunk.text:
                record.text_parts.append(chunk.text)

    try:
        # wait_for, not asyncio.timeout(): the package supports Python 3.10
        await asyncio.wait_for(consume(), timeout_s)
        record.finished_at = time.perf_counter()
        record.output_tokens = usage_tokens if usage_tokens is not None else (tokens if counted else None)
    except asyncio.TimeoutError:
        record.error = f"timed out after {timeout_s:g} s"
    except Exception as exc:  # one failed request must not end the level; it is counted as failed
        record.error = f"{type(exc).__name__}: {exc}"[:300]
    if on_done is not None:
        on_done()
    return record


async def run_level(
    target: BenchTarget,
    requests: Sequence[BenchRequest],
    level: LoadLevel,
    *,
    seed: int = 0,
    timeout_s: float = 600.0,
    on_done: ProgressCallback | None = None,
) -> list[RequestRecord]:
    """Send `requests` to `target` under `level`; records come back in request order. A target that runs
    whole levels itself (`llm`: the load must live in the LLM's own process) is handed the level."""
    own = getattr(target, "run_level", None)
    if own is not None:
        records = await own(requests, level, timeout_s)
        if on_done is not None:
            for _ in records:
                on_done()
        return sorted(records, key=lambda r: r.index)
    if isinstance(level, ClosedLoop):
        return await _closed_loop(target, requests, level.concurrency, timeout_s, on_done)
    if isinstance(level, OpenLoop):
        return await _open_loop(target, requests, level, seed, timeout_s, on_done)
    raise TypeError(f"unknown load level {level!r}")


async def _closed_loop(target, requests, concurrency, timeout_s, on_done) -> list[RequestRecord]:
    records: list[RequestRecord | None] = [None] * len(requests)
    next_index = 0

    async def stream_worker() -> None:
        nonlocal next_index
        while next_index < len(requests):
            i = next_index
            next_index += 1  # single-threaded event loop: no lock needed between await points
            records[i] = await measure_request(target, requests[i], timeout_s, on_done)

    await asyncio.gather(*(stream_worker() for _ in range(min(concurrency, len(requests)))))
    return [r for r in records if r is not None]


async def _open_loop(target, requests, level: OpenLoop, seed, timeout_s, on_done) -> list[RequestRecord]:
    offsets = poisson_arrival_offsets(level.request_rate, len(requests), seed)
    cap = asyncio.Semaphore(level.max_concurrency) if level.max_concurrency else None
    start = time.perf_counter()

    async def arrive(request: BenchRequest) -> RequestRecord:
        if cap is None:
            return await measure_request(target, request, timeout_s, on_done)
        async with cap:
            return await measure_request(target, request, timeout_s, on_done)

    tasks = []
    for request, offset in zip(requests, offsets):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # the arrival schedule itself, not synchronisation
        tasks.append(asyncio.create_task(arrive(request)))
    return list(await asyncio.gather(*tasks))


def count_output_tokens(
    records: Sequence[RequestRecord],
    method: TokenCounting,
    tokenizer: TokenizerLike | None,
    *,
    fixed_length: bool = False,
) -> tuple[str, list[str]]:
    """Fill `output_tokens` of every successful record. Returns the method used (for the report) and
    warnings.

    auto: exact counts where the target reports them (engine token ids); for text, the requested
    length when the requests are fixed-length (ignore-EOS: an engine that finished the request
    produced exactly that many tokens, which the engine target's exact counts confirm), else the
    re-tokenized text. Re-tokenizing is exact only when the text re-encodes to the generated ids;
    for arbitrary id sequences BPE merges make it lower, hence the preference for the requested length.
    """
    used: set[str] = set()
    short = 0
    for record in records:
        if not record.ok:
            continue
        if record.output_tokens is not None and method == "auto":
            used.add("exact")
            if fixed_length and record.output_tokens != record.requested_output_tokens:
                short += 1
        elif method == "requested" or (method == "auto" and fixed_length):
            record.output_tokens = record.requested_output_tokens
            used.add("requested")
        else:
            if tokenizer is None:
                raise ValueError("counting text tokens needs a tokenizer (--tokenizer or a truss dir)")
            text = "".join(record.text_parts)
            record.output_tokens = len(tokenizer.encode(text, add_special_tokens=False)) if text else 0
            used.add("retokenized")
        record.text_parts = []  # the text is no longer needed; free it before the next level
    warnings = []
    if short:
        warnings.append(
            f"{short} fixed-length request(s) produced a different number of tokens than requested: the engine"
            " does not honour the ignore-EOS option, so text targets counted by requested length are off"
        )
    return "+".join(sorted(used)) or "none", warnings


@dataclass(frozen=True)
class TargetSpec:
    """What a client process needs to build its own copy of a target."""

    name: str
    url: str
    ignore_eos: str = "min_length"
    timeout_s: float = 600.0


def client_shares(requests: Sequence[BenchRequest], concurrency: int, processes: int) -> list[tuple[list[BenchRequest], int]]:
    """The closed loop split over `processes`: every process-th request and its share of the streams."""
    processes = max(1, min(processes, concurrency, len(requests)))
    shares = []
    for k in range(processes):
        streams = concurrency // processes + (1 if k < concurrency % processes else 0)
        shares.append((list(requests[k::processes]), streams))
    return shares


def _client_process(
    spec: TargetSpec, requests: list[BenchRequest], concurrency: int, timeout_s: float, warmup: int, barrier
) -> tuple[list[RequestRecord], float]:
    """One client process: its own target and event loop; starts measuring with the others."""
    from trtllm_truss.bench.targets import make_target

    async def measure() -> tuple[list[RequestRecord], float]:
        target = make_target(spec.name, spec.url, spec.ignore_eos, spec.timeout_s)  # type: ignore[arg-type]
        await target.open()
        try:
            if warmup:
                await run_level(target, requests[:warmup], ClosedLoop(concurrency=warmup), timeout_s=timeout_s)
            barrier.wait()  # blocking on purpose: every process starts its measured load together
            cpu_before = time.process_time()
            records = await run_level(target, requests, ClosedLoop(concurrency=concurrency), timeout_s=timeout_s)
            return records, time.process_time() - cpu_before
        finally:
            await target.close()

    return asyncio.run(measure())


async def run_level_in_processes(
    spec: TargetSpec,
    requests: Sequence[BenchRequest],
    level: LoadLevel,
    processes: int,
    *,
    timeout_s: float = 600.0,
    warmup: int = 2,
) -> tuple[list[RequestRecord], float]:
    """`run_level` for a closed loop, from several client processes: one Python process can read
    about 30-40k streamed responses/s, below what a faithful engine sends on a large host. Returns
    the records in request order and the client processes' CPU seconds. `perf_counter` is the
    system-wide monotonic clock, so times from all processes are on one axis."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if not isinstance(level, ClosedLoop):
        raise ValueError("--client-processes > 1 needs closed-loop levels (--concurrency)")
    shares = client_shares(requests, level.concurrency, processes)
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(len(shares), mp_context=context) as pool:
        barrier = manager.Barrier(len(shares))
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(
            *(
                loop.run_in_executor(pool, _client_process, spec, share, streams, timeout_s, warmup, barrier)
                for share, streams in shares
            )
        )
    records = sorted((r for records, _ in results for r in records), key=lambda r: r.index)
    return records, sum(cpu for _, cpu in results)
