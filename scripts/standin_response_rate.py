"""Responses per second the synthetic stand-in offers, called directly (`tensorrt_llm`, token ids).

    .venv/bin/python scripts/standin_response_rate.py --instances 4 --sender-threads 2 --streams 256

Renders a repository with the synthetic engine (one response per token, never merged), starts a real
tritonserver, runs `--streams` concurrent streaming requests on gRPC (spread over `--clients`
processes, since one Python gRPC client tops out well below the engine) and prints responses/s and
responses per request next to tokens per request (they must be equal).
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = REPO_ROOT / "data" / "embedded-llama"


def _client(url: str, streams: int, tokens: int, offset: int, out: multiprocessing.Queue) -> None:
    import tritonclient.grpc as grpcclient

    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    for i in range(streams):
        inputs = []
        for name, datatype, array in (
            ("input_ids", "INT32", np.array([[300 + (offset + i) % 200, 301, 302]], dtype=np.int32)),
            ("input_lengths", "INT32", np.array([[3]], dtype=np.int32)),
            ("request_output_len", "INT32", np.array([[tokens]], dtype=np.int32)),
            ("streaming", "BOOL", np.array([[True]], dtype=np.bool_)),
        ):
            tensor = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        client.async_stream_infer(
            "tensorrt_llm", inputs, request_id=f"{offset + i}", enable_empty_final_response=True,
            outputs=[grpcclient.InferRequestedOutput("output_ids")],
        )
    responses = generated = done = errors = 0
    first = last = None
    while done < streams:
        result, error = events.get(timeout=600)
        if error is not None:
            errors += 1
            done += 1
            continue
        ids = result.as_numpy("output_ids")
        now = time.monotonic()
        if ids is not None:
            responses += 1
            generated += ids.size
            first = first or now
            last = now
        if result.get_response().parameters["triton_final_response"].bool_param:
            done += 1
    client.stop_stream()
    client.close()
    out.put((responses, generated, errors, first, last))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--sender-threads", type=int, default=1)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--merge-responses", action="store_true")
    args = parser.parse_args()

    from trtllm_truss.config.runtime import RuntimeConfig
    from trtllm_truss.planning.plan import ServingPlan
    from trtllm_truss.repository import render_repository
    from trtllm_truss.runtime.supervisor import TritonServer

    runtime = RuntimeConfig(
        preprocessing_instance_count=1,
        postprocessing_instance_count=1,
        pytorch={
            "device": "cpu",
            "num_threads": 1,
            "synthetic": {"step_time_ms": args.step_ms},
            "instance_count": args.instances,
            "sender_threads": args.sender_threads,
            "merge_responses": args.merge_responses,
        },
    )
    plan = ServingPlan(
        backend="pytorch", tokenizer_dir=MODEL_DIR, model_dir=MODEL_DIR, max_batch_size=args.streams,
        max_input_len=512, max_output_len=max(args.tokens, 256), runtime=runtime,
    )
    repository = render_repository(plan, Path(tempfile.mkdtemp()) / "model_repository")
    server = TritonServer(repository, startup_timeout_s=300)
    server.start()
    try:
        server.wait_ready(300)
        out: multiprocessing.Queue = multiprocessing.Queue()
        per_client = [args.streams // args.clients + (1 if i < args.streams % args.clients else 0) for i in range(args.clients)]
        procs = [
            multiprocessing.Process(target=_client, args=(server.grpc_url, n, args.tokens, sum(per_client[:i]), out))
            for i, n in enumerate(per_client) if n
        ]
        for proc in procs:
            proc.start()
        results = [out.get(timeout=900) for _ in procs]
        for proc in procs:
            proc.join()
    finally:
        server.stop()
    responses = sum(r[0] for r in results)
    generated = sum(r[1] for r in results)
    errors = sum(r[2] for r in results)
    span = max(r[4] for r in results if r[4]) - min(r[3] for r in results if r[3])
    print(
        f"instances={args.instances} sender_threads={args.sender_threads} streams={args.streams} "
        f"step_ms={args.step_ms} merge={args.merge_responses}: {responses / span:,.0f} responses/s, "
        f"{generated / span:,.0f} tokens/s, responses/request {responses / args.streams:.1f}, "
        f"tokens/request {generated / args.streams:.1f}, errors {errors}"
    )


if __name__ == "__main__":
    main()
