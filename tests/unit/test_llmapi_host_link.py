"""The frames between our llmapi model's instances and its LLM host (triton_models/tensorrt_llm_llmapi/host_link.py)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct

import pytest

from trtllm_truss.triton_models.tensorrt_llm_llmapi.host_link import (
    MAX_FRAME_BYTES,
    FrameReader,
    PendingUpdates,
    encode,
    host_address,
)
from trtllm_truss.triton_models.tensorrt_llm_llmapi.llm_host import _Instance


def test_frames_cross_a_socket_whole_however_the_bytes_arrive():
    left, right = socket.socketpair()
    first, second = [("submit", (1, 0), {"x": 1}, 1, True, "id")], [("abort", (1, 0))]
    data = encode(first) + encode(second)
    for i in range(0, len(data), 3):  # three bytes at a time
        left.sendall(data[i : i + 3])
    left.close()
    reader = FrameReader(right)
    assert reader.read() == first and reader.has_frame() and reader.read() == second
    assert reader.read() is None  # EOF


def test_the_host_handles_each_frame_once_whole_however_the_bytes_arrive():
    """The host's side of a connection (`llm_host._Instance`, read in the loop's I/O callback): frames split over
    reads or joined in one are handled whole and in order; a length over the limit raises (the loop then closes
    the connection); a lost connection aborts the rows it had in flight."""
    class Host:
        def __init__(self) -> None:
            self.handled: list = []
            self.instances: set = set()

        def _handle(self, instance, message) -> None:
            self.handled.append(message)

    class Transport:
        def __init__(self) -> None:
            self.written: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.written.append(data)

    class Result:
        aborted = False

        def abort(self) -> None:
            self.aborted = True

    host, transport = Host(), Transport()
    instance = _Instance(host)  # type: ignore[arg-type]
    instance.connection_made(transport)
    assert transport.written == [encode([("ready", {"pid": os.getpid()})])]
    first, second = [("submit", (1, 0), {"x": 1}, 1, True, "id")], [("abort", (1, 0)), ("stop", "id")]
    data = encode(first) + encode(second)
    cut = len(data) - 5  # within the second frame
    for i in range(0, cut, 3):  # three bytes at a time, then the rest of the second frame at once
        instance.data_received(data[i : min(i + 3, cut)])
    assert host.handled == first
    instance.data_received(data[cut:])
    assert host.handled == first + second
    with pytest.raises(ValueError, match="frame of"):
        instance.data_received(struct.pack("<I", MAX_FRAME_BYTES + 1))
    result = instance.results[(1, 0)] = Result()
    host.instances.add(instance)
    instance.connection_lost(None)
    assert result.aborted and instance not in host.instances


def test_a_sequences_updates_are_merged_into_one_response_in_order():
    updates = [
        ((1, 0), 0, [5], [-0.5], None, None, None),
        ((2, 0), 0, [7], [-0.1], None, None, None),
        ((1, 0), 0, [6, 8], [-0.25, -0.125], None, None, None),
        ((1, 0), 1, [9], [-1.0], None, "length", None),  # another sequence of the same row: its own
        ((1, 0), 0, [], [], None, "stop", None),
        ((1, 0), 0, [4], [-2.0], None, None, None),  # after its end: never merged into it
        ((3, 0), None, None, None, None, None, "the executor is gone"),
    ]
    pending = PendingUpdates(lambda update: False)
    pending.add(updates)
    answered = []
    while pending:
        answered.append(pending.pop())
    assert answered == [  # the ended sequences first, in the order they ended
        ((1, 0), 1, [9], [-1.0], None, "length", None),
        ((1, 0), 0, [5, 6, 8], [-0.5, -0.25, -0.125], None, "stop", None),
        ((2, 0), 0, [7], [-0.1], None, None, None),
        ((1, 0), 0, [4], [-2.0], None, None, None),
        ((3, 0), None, [], None, None, None, "the executor is gone"),
    ]


def test_the_host_is_named_after_its_tritonserver_and_repository():
    one = host_address("/repo/a", 100)
    assert one.startswith("\0trtllm-truss-llmapi-100-")
    assert one != host_address("/repo/b", 100) and one != host_address("/repo/a", 101)


def test_a_new_streams_first_token_is_answered_before_the_others_next_ones():
    """Updates read while others wait: the sequences that have sent nothing yet go first, each sequence's tokens
    stay in one update in order, the others keep their order, and an error is never taken for a first token."""
    started = {(1, 0), (2, 0)}
    pending = PendingUpdates(lambda update: update[0] not in started)
    pending.add([((1, 0), 0, [5], None, None, None, None), ((2, 0), 0, [7], None, None, None, None)])
    assert pending.pop() == ((1, 0), 0, [5], None, None, None, None)
    pending.add([
        ((1, 0), 0, [6], None, None, None, None),
        ((3, 0), 0, [1], None, None, None, None),  # a new stream's first token
        ((2, 0), 0, [8], None, None, "stop", None),
        ((3, 0), 0, [2], None, None, None, None),
        ((4, 0), None, None, None, None, None, "refused"),
    ])
    answered = []
    while pending:
        answered.append(pending.pop())
    assert answered == [
        ((3, 0), 0, [1, 2], None, None, None, None),
        ((2, 0), 0, [7, 8], None, None, "stop", None),
        ((1, 0), 0, [6], None, None, None, None),
        ((4, 0), None, [], None, None, None, "refused"),
    ]


def test_an_ended_streams_last_response_is_answered_before_the_others_next_ones():
    """A started stream whose end arrives while others wait goes ahead of them with every token it had
    waiting, so its caller sees the end after one send; an error is not moved: it stays behind the tokens
    read before it, which its row would otherwise lose."""
    pending = PendingUpdates(lambda update: False)  # every stream has started
    pending.add([
        ((1, 0), 0, [5], None, None, None, None),
        ((2, 0), 0, [7], None, None, None, None),
        ((3, 0), 0, [1], None, None, None, None),
        ((3, 0), None, None, None, None, None, "the request failed"),
        ((2, 0), 0, [8], None, None, "length", None),
        ((1, 0), 0, [6], None, None, None, None),
    ])
    answered = []
    while pending:
        answered.append(pending.pop())
    assert answered == [
        ((2, 0), 0, [7, 8], None, None, "length", None),
        ((1, 0), 0, [5, 6], None, None, None, None),
        ((3, 0), 0, [1], None, None, None, None),
        ((3, 0), None, [], None, None, None, "the request failed"),
    ]


async def test_a_dead_executors_failures_reach_the_instances_before_the_host_stops():
    """The LLM-API double's dispatch thread sets the executor's error, then fails every open request: the host's
    watch stops it only once those failures are written, so each stream ends with the executor's reason rather
    than the bare "host gone" of a closed connection (a stop in between left them to that)."""
    from types import SimpleNamespace

    from trtllm_truss.engine_standin import llmapi_double as double
    from trtllm_truss.engine_standin.types import FinishReason, GenerationRequest
    from trtllm_truss.triton_models.tensorrt_llm_llmapi import llm_host
    from trtllm_truss.triton_models.tensorrt_llm_llmapi.host_link import take_frame

    loop = asyncio.get_running_loop()
    executor = SimpleNamespace(error=None, cancel=lambda engine_id: None)
    results: list = []

    class LLM:
        def __init__(self) -> None:
            self.executor = executor

        def generate_async(self, **_: object) -> double.GenerationResult:
            results.append(double.GenerationResult(loop, 1, True, executor))
            return results[-1]

    class Transport:
        def __init__(self) -> None:
            self.written = bytearray()

        def is_closing(self) -> bool:
            return False

        def write(self, data: bytes) -> None:
            self.written += data

    api = SimpleNamespace(SamplingParams=double.SamplingParams, GuidedDecodingParams=double.GuidedDecodingParams,
                          LoRARequest=double.LoRARequest)
    host = llm_host.LlmHost(LLM(), api, {})
    instance, transport = host.connect(), Transport()
    instance.connection_made(transport)
    for key in range(3):
        host._submit(instance, key, GenerationRequest(str(key), [1, 2, 3], 8), 1, True, str(key))
    executor.error = "the executor worker process (pid 1) exited with -9"
    watch = loop.create_task(host.watch_executor())
    await asyncio.sleep(0)  # the watch has seen the error; the requests' failures come after it, as the thread sends them
    assert not host.stopped.is_set()
    reason = f"the executor is gone: {executor.error}"
    double._deliver([((result, 0), (str(i), [], None, None, FinishReason.ERROR.value, reason)) for i, result in enumerate(results)])
    await asyncio.wait_for(watch, 10)
    assert host.stopped.is_set()
    updates = []
    while (frame := take_frame(transport.written)) is not None:
        updates += frame
    errors = {update[0]: update[6] for update in updates[1:] if update[6] is not None}  # after `ready`
    assert errors == {key: reason for key in range(3)}, updates
