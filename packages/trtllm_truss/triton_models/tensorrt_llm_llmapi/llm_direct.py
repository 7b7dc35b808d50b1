"""The LLM API driven directly, in one process, as `trtllm-serve` drives it: `bench`'s reference target `llm`.

The same `LLM(**model.yaml)` our llmapi model's host builds (llm_host.build_llm: TensorRT-LLM's, or the
double's with its executor in a worker process), with the load generated on the LLM's own event loop:
each request one `generate_async(inputs=, sampling_params=, streaming=True)`, its tokens counted as each
result update arrives. No Triton, no sockets, no HTTP: what is left is what the LLM API itself gives.

Run: `python -m trtllm_truss.triton_models.tensorrt_llm_llmapi.llm_direct MODEL_YAML`, with the llmapi model's
parameters (JSON) as the first line of stdin. Then one JSON command per line:
`{"run": [[index, input_ids, output_len], ...], "concurrency": C, "ignore_eos": "min_length" | "end_id" |
"none", "timeout_s": T}` -> one line `{"records": [[index, sent_at, first_at, last_at, finished_at,
responses, tokens, error], ...], "cpu_s": ...}` (times: `time.perf_counter()`, the system-wide monotonic
clock, so the caller's figures use them as they are); `{"quit": true}` ends it. The first line it writes
is `{"ready": pid}` or `{"failed": reason}`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from trtllm_truss.triton_models.tensorrt_llm_llmapi.llm_host import build_llm, new_event_loop


async def _one(llm: Any, api: Any, index: int, ids: list[int], output_len: int, ignore_eos: str, timeout_s: float) -> list:
    sampling = {"max_tokens": output_len, "detokenize": False}
    if ignore_eos == "min_length":
        sampling["min_tokens"] = output_len
    elif ignore_eos == "end_id":
        sampling["end_id"] = -1
    sent_at = time.perf_counter()
    first = last = finished = None
    responses = tokens = 0
    error = None

    async def consume() -> None:
        nonlocal first, last, responses, tokens
        result = llm.generate_async(inputs=ids, sampling_params=api.SamplingParams(**sampling), streaming=True)
        async for update in result:
            count = len(update.outputs[0].token_ids)
            if count > tokens:
                now = time.perf_counter()
                first = first or now
                last = now
                responses += 1
                tokens = count

    try:
        await asyncio.wait_for(consume(), timeout_s)
        finished = time.perf_counter()
    except asyncio.TimeoutError:
        error = f"timed out after {timeout_s:g} s"
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    return [index, sent_at, first, last, finished, responses, tokens, error]


async def _run_level(llm: Any, api: Any, command: dict) -> dict:
    requests = command["run"]
    records: list = [None] * len(requests)
    next_index = 0
    cpu_before = time.process_time()

    async def stream() -> None:
        nonlocal next_index
        while next_index < len(requests):
            i = next_index
            next_index += 1
            index, ids, output_len = requests[i]
            records[i] = await _one(llm, api, index, ids, output_len, command["ignore_eos"], command["timeout_s"])

    await asyncio.gather(*(stream() for _ in range(min(int(command["concurrency"]), len(requests)))))
    return {"records": records, "cpu_s": time.process_time() - cpu_before}


async def _serve(model_yaml: Path, parameters: dict[str, str]) -> int:
    try:
        llm, api, _ = build_llm(model_yaml, parameters)
    except Exception as exc:
        _write({"failed": f"{type(exc).__name__}: {exc}"})
        return 1
    _write({"ready": os.getpid()})
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            command = json.loads(line)
            if command.get("quit"):
                break
            _write(await _run_level(llm, api, command))
    finally:
        llm.shutdown()
    return 0


_PROTOCOL = sys.stdout


def _write(message: dict) -> None:
    _PROTOCOL.write(json.dumps(message) + "\n")
    _PROTOCOL.flush()


def main(argv: list[str]) -> int:
    global _PROTOCOL
    # The protocol keeps this process's stdout; whatever else writes to fd 1 (the executor's worker, a
    # library) goes to stderr instead.
    _PROTOCOL = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    parameters = json.loads(sys.stdin.readline() or "{}")
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(_serve(Path(argv[0]), parameters))
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
