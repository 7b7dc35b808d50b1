"""What our llmapi model's Triton instances and the LLM host say to each other (llm_host.py, model.py).

Frames on a Unix stream socket: a 4-byte little-endian length and a pickled list of messages (both ends
are this package, started by the same interpreter; the socket is in the abstract namespace of this
machine, named after the tritonserver that owns the model, so only its stubs find it).

instance -> host: `("submit", key, GenerationRequest, n, streaming, triton_id)` (one Triton row: a
`generate_async` call), `("abort", key)`, `("stop", triton_id)` (NVIDIA's `stop` input, which may reach
any instance: the host knows every instance's requests), `("shutdown",)` (the instance that started the
host, in its finalize).
host -> instance: first `("ready", info)` or `("failed", message)`, then lists of updates
`(key, index, token_ids, log_probs, tops, finish_reason, error)`: the new tokens of sequence `index`
(since the last update), their log probs (None unless asked for), their k most likely tokens (None
unless asked for), and when the sequence ended its finish reason ("stop", "length", "cancelled"); an
update with `error` ends the whole row (index None).
"""

from __future__ import annotations

import hashlib
import itertools
import pickle
import socket
import struct
from collections import OrderedDict
from collections.abc import Callable

HEADER = struct.Struct("<I")
MAX_FRAME_BYTES = 1 << 30


def host_address(repository: str, tritonserver_pid: int) -> str:
    """The host's socket: one per tritonserver process and model repository (a restarted tritonserver
    gets a new host)."""
    digest = hashlib.sha256(repository.encode()).hexdigest()[:16]
    return f"\0trtllm-truss-llmapi-{tritonserver_pid}-{digest}"


def encode(messages: list) -> bytes:
    data = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def take_frame(buffer: bytearray) -> list | None:
    """The first whole frame's messages, cut from the front of `buffer`; None until it is all there. A length
    over MAX_FRAME_BYTES raises as soon as its header is in. (The instances' blocking reads and the host's
    event-loop reads both go through here.)"""
    if len(buffer) < HEADER.size:
        return None
    (length,) = HEADER.unpack_from(buffer)
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {length} bytes")
    end = HEADER.size + length
    if len(buffer) < end:
        return None
    messages = pickle.loads(buffer[HEADER.size : end])
    del buffer[:end]
    return messages


class FrameReader:
    """Blocking reads of whole frames from a socket (one thread)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()

    def read(self) -> list | None:
        """The next frame's messages; None at EOF."""
        while (messages := take_frame(self._buffer)) is None:
            chunk = self._sock.recv(1 << 20)
            if not chunk:
                return None
            self._buffer += chunk
        return messages

    def has_frame(self) -> bool:
        if len(self._buffer) < HEADER.size:
            return False
        return len(self._buffer) >= HEADER.size + HEADER.unpack_from(self._buffer)[0]


class PendingUpdates:
    """The updates an instance has read from the host and not answered yet, in the order it answers them.

    A sequence's updates join into one (its tokens, log probs and top tokens in order, the last one's end):
    while the instance was sending, the LLM went on, and as the LLM API's own result carries every token made
    since it was last read, one response carries them (one send, not several). Two kinds are answered before
    the rest, in the order they became so: sequences that have sent nothing yet (`unstarted`, asked when
    their first update arrives), and sequences that have ended. A new stream's first token, and an ended
    stream's last response, wait for one send, not behind every other stream's next response: the caller
    waits for both (a closed loop's or an agent's next request starts at the end). An error update ends its
    row and is kept as it is, in its place, after the tokens read before it. An update may carry an eighth
    element, the sequence's KV block counts (total, reused; with return_perf_metrics): the merged update keeps
    the latest."""

    def __init__(self, unstarted: Callable[[tuple], bool]) -> None:
        self._unstarted = unstarted
        self._first: OrderedDict[tuple, list] = OrderedDict()
        self._rest: OrderedDict[tuple, list] = OrderedDict()
        self._apart = itertools.count()  # entries never merged into: errors, updates after an end

    def __bool__(self) -> bool:
        return bool(self._first or self._rest)

    def add(self, updates: list[tuple]) -> None:
        for update in updates:
            key, index, tokens, log_probs, tops, finish, error, *kv = update
            if error is not None:
                self._rest[(key, None, next(self._apart))] = [key, index, [], log_probs, tops, finish, error]
                continue
            slot = (key, index)
            entry = self._first.get(slot) or self._rest.get(slot)
            if entry is None or entry[5] is not None:  # new, or after its end (never merged into it)
                queue = self._first if finish is not None or self._unstarted(update) else self._rest
                queue[slot if entry is None else (key, index, next(self._apart))] = [
                    key, index, list(tokens or ()), log_probs, tops, finish, None, *kv
                ]
                continue
            if kv:
                entry[7:] = kv
            entry[2] += tokens or ()
            entry[3] = None if log_probs is None else (entry[3] or []) + log_probs
            entry[4] = None if tops is None else (entry[4] or []) + tops
            entry[5] = finish
            if finish is not None and slot in self._rest:  # ended: its last response goes first
                self._first[slot] = self._rest.pop(slot)

    def pop(self) -> tuple:
        """The next update to answer (there must be one)."""
        return tuple((self._first or self._rest).popitem(last=False)[1])
