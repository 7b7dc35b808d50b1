"""Stop requests across the stand-in's instances (Triton stub processes of one model).

NVIDIA's `stop` input names the request to end by its Triton request id, but with several
`tensorrt_llm` instances Triton may hand the stop to another instance than the one serving that
request. Each instance binds a Linux abstract-namespace datagram socket named after the
tritonserver process, the model and its instance index; an instance that does not hold the id
forwards it to its siblings, and the one that holds it cancels it. Datagrams to a sibling that
is gone are dropped (nothing to stop there).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

MAX_ID_BYTES = 4096


def relay_address(server_pid: int, model_name: str, instance_index: int) -> str:
    """Abstract socket names start with NUL: no file on disk, gone when the process exits."""
    return f"\0trtllm-truss-stop.{server_pid}.{model_name}.{instance_index}"


class StopRelay:
    def __init__(
        self,
        model_name: str,
        instance_index: int,
        instance_count: int,
        on_stop: Callable[[str], None],
        *,
        server_pid: int | None = None,
    ) -> None:
        self.instance_index = instance_index
        self.instance_count = instance_count
        pid = os.getppid() if server_pid is None else server_pid  # the stub's parent is tritonserver
        self._siblings = [relay_address(pid, model_name, i) for i in range(instance_count) if i != instance_index]
        self._on_stop = on_stop
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        if instance_count > 1:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._socket.bind(relay_address(pid, model_name, instance_index))
            self._socket.settimeout(0.2)  # so close() is noticed without signalling the thread
            self._thread = threading.Thread(target=self._listen, name="stop-relay", daemon=True)
            self._thread.start()

    def forward(self, triton_id: str) -> int:
        """Ask every sibling instance to stop `triton_id`; returns how many were reached."""
        if self._socket is None:
            return 0
        payload = triton_id.encode("utf-8")[:MAX_ID_BYTES]
        reached = 0
        for address in self._siblings:
            try:
                self._socket.sendto(payload, address)
                reached += 1
            except OSError:  # that instance is not (or no longer) there
                pass
        return reached

    def _listen(self) -> None:
        assert self._socket is not None
        while not self._closed.is_set():
            try:
                payload = self._socket.recv(MAX_ID_BYTES)
            except socket.timeout:
                continue
            except OSError:  # closed
                return
            if not payload:
                continue
            try:
                self._on_stop(payload.decode("utf-8", "replace"))
            except Exception:
                log.exception("handling a forwarded stop failed")

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._socket is not None:
            self._socket.close()
