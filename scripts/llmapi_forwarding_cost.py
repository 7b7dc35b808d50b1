"""The LLM host's own work per token against the LLM API driven directly, in one process (issue 39).

    .venv/bin/python scripts/llmapi_forwarding_cost.py --streams 256 --tokens 128 --repeats 7

Where the LLM's process is the limit (hundreds of streams at 2 ms steps), what the LLM host does per token on
top of what `trtllm-serve` does (iterate each result) decides how far the Triton model falls below the LLM
alone. This measures that part alone, deterministically: no executor, no sockets, no other process. One
event loop per run, `--streams` results of the LLM-API double (`GenerationResult`), fed as its dispatch thread
feeds them (one `_deliver` per engine iteration, one token per stream), followed either by the LLM host
(`LlmHost._submit`/`_follow`, its frames pickled and handed to writers that drop them) or by the `llm` target's
consumer (`llm_direct._one`), both through a stand-in LLM whose `generate_async` hands out those results. It
prints the CPU time per token of each (and of the feeding alone) over `--repeats` alternating runs, and
host / direct of the fastest runs. (scripts/llmapi_host_cost.py measures the whole processes instead, with
the noise of a shared machine.)
"""

from __future__ import annotations

import argparse
import asyncio
import time
from types import SimpleNamespace

from trtllm_truss.engine_standin import llmapi_double as double
from trtllm_truss.engine_standin.types import GenerationRequest
from trtllm_truss.triton_models.tensorrt_llm_llmapi import llm_direct, llm_host
from trtllm_truss.triton_models.tensorrt_llm_llmapi.llm_host import new_event_loop

API = SimpleNamespace(SamplingParams=double.SamplingParams, GuidedDecodingParams=double.GuidedDecodingParams,
                      LoRARequest=double.LoRARequest)
INSTANCES = 8


class _Transport:
    """An instance's connection that drops each frame: the socket's cost is scripts/llmapi_host_cost.py's."""

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        pass


class _LLM:
    """generate_async hands out the double's results, kept to be fed."""

    def __init__(self) -> None:
        self.results: list[double.GenerationResult] = []

    def generate_async(self, **_: object) -> double.GenerationResult:
        result = double.GenerationResult(asyncio.get_running_loop(), 1, True, None)
        self.results.append(result)
        return result


async def _feed(llm: _LLM, streams: int, tokens: int) -> float:
    """Each stream's tokens, one engine iteration at a time; CPU seconds from the first to the last."""
    while len(llm.results) < streams:  # every consumer has called generate_async
        await asyncio.sleep(0)
    started = time.process_time()
    for step in range(tokens):
        finish = double.FinishReason.LENGTH.value if step == tokens - 1 else None
        double._deliver([((result, 0), (0, [step], None, None, finish, None)) for result in llm.results])
        for _ in range(3):  # the woken results' tasks, then the frames they queued
            await asyncio.sleep(0)
    for _ in range(3):
        await asyncio.sleep(0)
    return time.process_time() - started


async def _host(streams: int, tokens: int) -> float:
    llm = _LLM()
    host = llm_host.LlmHost(llm, API, {})
    instances = [host.connect() for _ in range(INSTANCES)]
    for instance in instances:
        instance.connection_made(_Transport())
    for i in range(streams):
        host._submit(instances[i % INSTANCES], i, GenerationRequest(str(i), [1, 2, 3], tokens), 1, True, str(i))
    return await _feed(llm, streams, tokens)


async def _direct(streams: int, tokens: int) -> float:
    llm = _LLM()
    consumers = [asyncio.ensure_future(llm_direct._one(llm, API, i, [1, 2, 3], tokens, "none", 600.0)) for i in range(streams)]
    spent = await _feed(llm, streams, tokens)
    await asyncio.gather(*consumers)
    return spent


async def _feed_only(streams: int, tokens: int) -> float:
    llm = _LLM()
    for _ in range(streams):
        llm.generate_async()
    return await _feed(llm, streams, tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    runs = {"host": _host, "direct": _direct, "feeding": _feed_only}
    per_token: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            loop = new_event_loop()
            try:
                per_token[name].append(loop.run_until_complete(run(args.streams, args.tokens)) / (args.streams * args.tokens) * 1e6)
            finally:
                loop.close()
    for name, values in per_token.items():
        print(f"{name:8s} µs/token: min {min(values):.3f}, median {sorted(values)[len(values) // 2]:.3f}")
    print(f"host / direct (min): {min(per_token['host']) / min(per_token['direct']):.3f}")


if __name__ == "__main__":
    main()
