"""CPU per streamed response of ways a stream worker could read the engine over Triton gRPC.

    .venv/bin/python scripts/grpc_read_cost.py --instances 2 --streams 64 --tokens 128 --step-ms 2

Starts a real tritonserver with the faithful synthetic engine (one response per token), then, in one
fresh client process per variant, runs `--streams` concurrent streams `--rounds` times and prints the
client process's CPU (all its threads) per response and its responses/s:
- `aio`: what the stream workers do (`EngineClient.generate_ids`: one grpc.aio bidi call per request);
- `aio-shared`: one grpc.aio bidi call per process carrying every request, one reader task routing
  responses by request id;
- `sync-shared`: one synchronous gRPC bidi call per process, iterated on one reader thread that hands
  the responses to the event loop in batches (one loop wake-up per batch);
- `sync-per-stream`: a synchronous call per request, each iterated on its own thread, batched hand-off;
- `aio-uvloop`: `aio` on uvloop's event loop instead of asyncio's.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import queue
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = REPO_ROOT / "data" / "embedded-llama"
VARIANTS = ("aio", "aio-uvloop", "aio-shared", "sync-shared", "sync-per-stream")


class Inbox:
    """One request's responses, filled on the loop; its reader is woken once per batch."""

    def __init__(self, loop):
        self.loop = loop
        self.items: list = []
        self.waiter: asyncio.Future | None = None

    def put_all(self, items):
        self.items.extend(items)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def take(self):
        while not self.items:
            self.waiter = self.loop.create_future()
            await self.waiter
        items, self.items = self.items, []
        return items


def _final(response) -> bool:
    final = response.parameters.get("triton_final_response")
    return final is not None and final.bool_param


def _request(ids, tokens, interface):
    from trtllm_truss.engine.client import GenerationParams
    from trtllm_truss.engine.engine_client import build_engine_request

    return build_engine_request(ids, GenerationParams("", max_tokens=tokens, min_length=tokens), interface, uuid.uuid4().hex)


async def _run_variant(variant: str, url: str, streams: int, tokens: int, rounds: int) -> tuple[int, float, float]:
    import grpc
    from tritonclient.grpc import service_pb2_grpc
    from trtllm_truss.engine.client import CHANNEL_ARGS, GenerationParams, first_beam_ids
    from trtllm_truss.engine.engine_client import EngineClient

    loop = asyncio.get_running_loop()
    client = EngineClient(url)
    interface = await client.interface()
    counted = [0]

    def count(response):
        for output, raw in zip(response.outputs, response.raw_output_contents):
            if output.name == "output_ids" and first_beam_ids(raw, output.shape):
                counted[0] += 1

    inboxes: dict[str, Inbox] = {}
    pending: list = []  # (request id, response) handed over by a reader thread
    lock = threading.Lock()
    scheduled = [False]

    def drain():
        with lock:
            batch, pending[:] = list(pending), []
            scheduled[0] = False
        by_id: dict[str, list] = {}
        for rid, response in batch:
            by_id.setdefault(rid, []).append(response)
        for rid, items in by_id.items():
            inbox = inboxes.get(rid)
            if inbox is not None:
                inbox.put_all(items)

    def hand_over(rid, response):  # on a reader thread
        with lock:
            pending.append((rid, response))
            if scheduled[0]:
                return
            scheduled[0] = True
        loop.call_soon_threadsafe(drain)

    shared_send = None
    stoppers = []
    if variant == "aio-shared":
        call = client._ensemble._triton()._client_stub.ModelStreamInfer()

        async def reader():
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    return
                response = message.infer_response
                inbox = inboxes.get(response.id)
                if inbox is not None:
                    inbox.put_all([response])

        reader_task = loop.create_task(reader())
        stoppers.append(reader_task.cancel)
        write_lock = asyncio.Lock()  # one write at a time on a call

        async def shared_send(request):
            async with write_lock:
                await call.write(request)
    elif variant in ("sync-shared", "sync-per-stream"):
        channel = grpc.insecure_channel(url, options=CHANNEL_ARGS)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stoppers.append(channel.close)
        if variant == "sync-shared":
            outgoing: queue.Queue = queue.Queue()

            def requests():
                while (item := outgoing.get()) is not None:
                    yield item

            responses = stub.ModelStreamInfer(requests())

            def read_all():
                try:
                    for message in responses:
                        hand_over(message.infer_response.id, message.infer_response)
                except grpc.RpcError:
                    pass

            threading.Thread(target=read_all, daemon=True).start()
            stoppers.insert(0, lambda: outgoing.put(None))

            async def shared_send(request):
                outgoing.put(request)

    async def one(k: int):
        ids = [300 + k % 200, 301, 302]
        if variant in ("aio", "aio-uvloop"):
            params = GenerationParams("", max_tokens=tokens, min_length=tokens)
            async for new_ids, _ in client.generate_ids(ids, params):
                counted[0] += 1
            return
        request = _request(ids, tokens, interface)
        inbox = inboxes[request.id] = Inbox(loop)
        if shared_send is not None:
            await shared_send(request)
        else:
            def read_one():
                one_more: queue.Queue = queue.Queue()
                one_more.put(request)

                def requests():
                    yield one_more.get()
                    one_more.get()  # keep our side open until the final response

                call = stub.ModelStreamInfer(requests())
                for message in call:
                    hand_over(request.id, message.infer_response)
                    if _final(message.infer_response):
                        one_more.put(None)
                        call.cancel()
                        return

            threading.Thread(target=read_one, daemon=True).start()
        try:
            while True:
                done = False
                for response in await inbox.take():
                    count(response)
                    done = done or _final(response)
                if done:
                    return
        finally:
            del inboxes[request.id]

    await asyncio.gather(*(one(k) for k in range(min(streams, 8))))  # warm-up
    counted[0] = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        await asyncio.gather(*(one(k) for k in range(streams)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    for stop in stoppers:
        stop()
    await client.close()
    return counted[0], cpu, wall


def _child(variant, url, streams, tokens, rounds, out):
    if variant.endswith("-uvloop"):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    out.put((variant, *asyncio.run(_run_variant(variant, url, streams, tokens, rounds))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--url", help="a running tritonserver with the synthetic engine (else one is started)")
    args = parser.parse_args()

    server = None
    url = args.url
    if url is None:
        from trtllm_truss.config.runtime import RuntimeConfig
        from trtllm_truss.planning.plan import ServingPlan
        from trtllm_truss.repository import render_repository
        from trtllm_truss.runtime.supervisor import TritonServer

        runtime = RuntimeConfig(
            preprocessing_instance_count=1, postprocessing_instance_count=1,
            pytorch={"device": "cpu", "num_threads": 1, "synthetic": {"step_time_ms": args.step_ms},
                     "instance_count": args.instances},
        )
        plan = ServingPlan(
            backend="pytorch", tokenizer_dir=MODEL_DIR, model_dir=MODEL_DIR, max_batch_size=max(args.streams, 8),
            max_input_len=512, max_output_len=max(args.tokens, 256), runtime=runtime,
        )
        server = TritonServer(render_repository(plan, Path(tempfile.mkdtemp()) / "model_repository"), startup_timeout_s=300)
        server.start()
        server.wait_ready(300)
        url = server.grpc_url
    try:
        context = multiprocessing.get_context("spawn")
        for variant in args.variants.split(","):
            out = context.Queue()
            proc = context.Process(target=_child, args=(variant, url, args.streams, args.tokens, args.rounds, out))
            proc.start()
            name, responses, cpu, wall = out.get(timeout=900)
            proc.join()
            print(
                f"{name:>16}: {responses} responses, {responses / wall:,.0f}/s, client CPU {cpu:.2f} s = "
                f"{cpu / max(responses, 1) * 1e6:.1f} us/response ({cpu / wall:.2f} cores)", flush=True,
            )
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
