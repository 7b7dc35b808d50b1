"""Which frontend takes a new connection (`runtime.direct_front.fill_connections`): the lowest one first.

Every frontend of the direct front can accept from the one listening socket. Left to the kernel, new
connections spread over all of them, so at 64 streams on 8 frontends each event loop carries 8 streams
and wakes for nearly every engine response alone. A loop that carries more streams handles several
responses per wake-up: on the 32-core host, half the frontends used 12-22 % less CPU per token at the
same load (docs/performance.md, "Frontend count against CPU per token"), but could not carry the
highest loads. Filling gives both: new connections go to the lowest-numbered frontend that holds fewer
than `fill` open connections; once every frontend holds `fill`, to those holding the fewest (left to the
kernel, a burst of connections spreads unevenly: at 512 streams that cost a tenth of the throughput,
docs/performance.md, "Filling frontends").

A burst of new connections is not taken one frontend after another: each frontend's loop also starts
the requests that arrive on what it accepted, and 256 connections filled in turn cost the first
round of a bench a fifth of its throughput on the 32-core host. While more connections wait in the
kernel's accept queue than the frontends before it have room for, the next frontend with room takes
them too, so a burst is accepted in parallel and still ends up packed.

How: each frontend accepts on its own event loop (`ConnectionFiller`, in place of uvicorn's listening
server) and reads the socket only while `accepts_connections` says so. Each publishes its open
connections in the replica's shared file (`fronts.replica_state`). One whose count changes where it
matters to the others (crossing `fill`, or at or above it), or that sees more connections waiting than
it has room for, sends them `RECHECK_SIGNAL`, so the next one starts accepting within a wake-up, not a
poll; a timer rechecks every `RECHECK_S` as well, for a frontend that died (the launcher clears its
slot). Connections stay where they were accepted: this decides placement, never moves a stream. `fill`
0 is not handled here: uvicorn's own listener then leaves every connection to the kernel.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import socket
import struct
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

RECHECK_SIGNAL = signal.SIGUSR1
RECHECK_S = 0.1
_TCP_INFO_BYTES = 28  # struct tcp_info through tcpi_unacked: 8 u8 fields, then u32s, unacked the fifth
_TCP_INFO_UNACKED = struct.Struct("=24xI")
_PAUSE_ON_ERROR_S = 0.5  # out of file descriptors: accepting again at once would spin


def accepts_connections(index: int, connections: Sequence[int], pids: Sequence[int], fill: int, waiting: int = 0) -> bool:
    """Whether frontend `index` should take new connections now, among the frontends that are up (pid
    published; `index` itself always counts): the lowest one holding fewer than `fill` takes them, and so
    does each next one with room while more connections are `waiting` (in the kernel's accept queue) than
    the ones before it have room for; when every one holds `fill` or more, those holding the fewest do."""
    present = [(j, n) for j, (n, pid) in enumerate(zip(connections, pids)) if pid or j == index]
    room_before = 0
    for j, open_connections in present:
        if open_connections < fill:
            if room_before and room_before >= waiting:
                return False  # the frontends before it take what is waiting
            if j == index:
                return True
            room_before += fill - open_connections
    if room_before:
        return False  # `index` is full and others have room
    return connections[index] <= min(n for _, n in present)


class ConnectionFiller:
    """Accepts from the shared listening socket on this frontend's event loop while it is the frontend
    to fill, and hands each connection to uvicorn's protocol (`start`'s factory)."""

    def __init__(self, listener: socket.socket, state: Any, index: int, fill: int) -> None:
        self._listener = listener
        self._state = state  # fronts.replica_state.ReplicaState
        self._index = index
        self.fill = fill
        self.open_connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._factory: Callable[[], asyncio.Protocol] | None = None
        self._reading = False
        self._paused_until = 0.0
        self._overflowing = False
        self._timer: asyncio.TimerHandle | None = None
        self._connecting: set[asyncio.Task] = set()

    def start(self, protocol_factory: Callable[[], asyncio.Protocol]) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._factory = protocol_factory
        self._listener.setblocking(False)
        loop.add_signal_handler(RECHECK_SIGNAL, self.recheck)
        self._tick()

    def stop(self) -> None:
        """Accept nothing more (uvicorn's shutdown then closes the open connections)."""
        loop = self._loop
        if loop is None:
            return
        self._loop = None
        if self._timer is not None:
            self._timer.cancel()
        if self._reading:
            loop.remove_reader(self._listener.fileno())
            self._reading = False
        loop.remove_signal_handler(RECHECK_SIGNAL)
        signal.signal(RECHECK_SIGNAL, signal.SIG_IGN)  # a peer's late recheck must not end this process

    def protocol_class(self, base: type) -> type:
        """uvicorn's protocol class, counting its connections here when they close."""
        filler = self

        class Counted(base):  # type: ignore[valid-type, misc]
            def connection_lost(self, exc: Exception | None) -> None:
                super().connection_lost(exc)
                filler._closed()

        return Counted

    # --- deciding -------------------------------------------------------------------------------------

    def recheck(self, waiting: int | None = None) -> None:
        """Read the socket or not, by `accepts_connections`; `waiting` when the caller just read it."""
        loop = self._loop
        if loop is None:
            return
        state = self._state
        if waiting is None:
            waiting = self._waiting()
        wanted = accepts_connections(self._index, state.connections(), state.frontend_pids(), self.fill, waiting)
        if wanted and loop.time() < self._paused_until:
            wanted = False
        if wanted and not self._reading:
            loop.add_reader(self._listener.fileno(), self._accept)
            self._reading = True
        elif not wanted and self._reading:
            loop.remove_reader(self._listener.fileno())
            self._reading = False

    def _waiting(self) -> int:
        """Connections in the kernel's accept queue: Linux's TCP_INFO of a listening socket holds it as
        `tcpi_unacked` (0 where that cannot be read)."""
        try:
            return _TCP_INFO_UNACKED.unpack_from(
                self._listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES))[0]
        except (OSError, AttributeError, struct.error):
            return 0

    def _tick(self) -> None:
        self.recheck()
        if self._loop is not None:
            self._timer = self._loop.call_later(RECHECK_S, self._tick)

    def _publish(self, peers_affected: bool) -> None:
        """Publish the count; tell the others when it may change who accepts: crossing `fill`, any change
        at or above it (where the fewest connections decide), or more waiting than this one has room for."""
        self._state.set_connections(self._index, self.open_connections)
        waiting = self._waiting()
        overflowing = self._reading and waiting > self.fill - self.open_connections > 0
        if peers_affected or (overflowing and not self._overflowing):
            self._tell_peers()
            self.recheck(waiting)
        self._overflowing = overflowing

    def _tell_peers(self) -> None:
        me = os.getpid()
        for pid in self._state.frontend_pids():
            if pid and pid != me:
                try:
                    os.kill(pid, RECHECK_SIGNAL)
                except (ProcessLookupError, PermissionError):
                    pass  # gone; the launcher clears its slot

    # --- connections ----------------------------------------------------------------------------------

    def _accept(self) -> None:
        loop = self._loop
        while self._reading and loop is not None:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                self.recheck()  # drained (or another frontend took it): helpers in a burst stop here
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                logger.warning("cannot accept a connection (%s); pausing %g s", exc.strerror, _PAUSE_ON_ERROR_S)
                self._paused_until = loop.time() + _PAUSE_ON_ERROR_S
                self.recheck()
                return
            conn.setblocking(False)
            self.open_connections += 1
            task = loop.create_task(self._connect(conn))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)
            self._publish(peers_affected=self.open_connections >= self.fill)

    async def _connect(self, conn: socket.socket) -> None:
        assert self._loop is not None and self._factory is not None
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError as exc:  # the client left before the transport was up
            logger.debug("accepted connection lost at once: %r", exc)
            conn.close()
            self._closed()

    def _closed(self) -> None:
        self.open_connections -= 1
        if self._loop is not None:
            self._publish(peers_affected=self.open_connections >= self.fill - 1)
