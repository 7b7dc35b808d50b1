"""Stop the stack when truss's server is told to stop (SIGTERM: a container stop; SIGINT: Ctrl-C).

truss 0.18 calls no model hook on shutdown: its uvicorn waits for every open response (up to an hour),
then the process exits and the stack is left to parent-death signals, with nobody to sweep up what
tritonserver leaves (issue 24). So the service puts its own handler in front of the one uvicorn
installed: on the first signal the stack stops (stream workers first, so their streams end and
tritonserver is not held by them, then tritonserver and every process of its session), and only then
does the process signal itself again, which passes the signal on to uvicorn's handler: the server exits
after the stack is gone. A second signal while the stack stops goes straight on (a second Ctrl-C forces
uvicorn's exit).

Handlers can only be installed on the main thread and truss runs `load()` on another one, so the service
installs this from its first call on truss's event loop (the readiness check, `is_healthy`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def chain_stop_handlers(stop: Callable[[], None], signals: Iterable[signal.Signals] = STOP_SIGNALS) -> bool:
    """Run `stop()` (on a thread) before the handlers in place now. Only on the main thread; returns
    whether the handlers were installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = {sig: signal.getsignal(sig) for sig in signals}
    # The handler only writes to a pipe: a handler runs between any two bytecodes of the main thread,
    # which may hold a lock the handler would need (threading's, an Event's, logging's).
    read_fd, write_fd = os.pipe()
    signalled: list[int] = []

    def pass_on(signum: int, frame: object = None) -> None:
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    def stop_then_pass_on() -> None:
        signum = os.read(read_fd, 1)[0]
        logger.info("%s: stopping the stack before the server", signal.Signals(signum).name)
        try:
            stop()
        except Exception:
            logger.exception("stopping the stack failed")
        finally:
            # Handlers run on the main thread: the same signal again reaches `handler`, which now
            # passes it on.
            os.kill(os.getpid(), signum)

    def handler(signum: int, frame: object) -> None:
        if signalled:
            pass_on(signum, frame)
            return
        signalled.append(signum)
        os.write(write_fd, bytes([signum]))

    threading.Thread(target=stop_then_pass_on, name="stack-stop", daemon=True).start()
    for sig in previous:
        signal.signal(sig, handler)
    return True
