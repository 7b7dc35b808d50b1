"""Frames between the front, the guide compile service and its workers (`guides.compile_service`): a
4-byte big-endian length, then that many bytes of JSON (ASCII: a lone surrogate in a hostile guide is
written as its `\\udXXX` escape and read back as the same string)."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 64 << 20  # a guide is at most 4 MiB as JSON text, a few times that escaped


class WireError(ConnectionError):
    pass


def encode(message: Any) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode("ascii")
    return HEADER.pack(len(body)) + body


def _decode(body: bytes) -> Any:
    return json.loads(body.decode("ascii"))


def send(sock: socket.socket, message: Any) -> None:
    sock.sendall(encode(message))


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket) -> Any:
    """The next message, or None once the other side closed."""
    header = _exactly(sock, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise WireError(f"a frame of {size} bytes is over {MAX_FRAME_BYTES}")
    body = _exactly(sock, size)
    if body is None:
        return None
    return _decode(body)


async def read(reader: asyncio.StreamReader) -> Any:
    """The next message, or None once the other side closed."""
    try:
        header = await reader.readexactly(HEADER.size)
        (size,) = HEADER.unpack(header)
        if size > MAX_FRAME_BYTES:
            raise WireError(f"a frame of {size} bytes is over {MAX_FRAME_BYTES}")
        return _decode(await reader.readexactly(size))
    except asyncio.IncompleteReadError:
        return None


def write(writer: asyncio.StreamWriter, message: Any) -> None:
    writer.write(encode(message))
