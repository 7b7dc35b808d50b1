"""Ends a python-backend stub whose tritonserver is gone, whatever the stub's own threads are doing.

Triton's stub ignores SIGTERM and SIGINT (python_backend `pb_stub.cc`) and leaves when its health thread,
polling the parent every 300 ms, finds it gone. That exit first takes the stub's
`stub_to_parent_message_mu_`, and a Python thread in an IPC round trip to tritonserver (`pb_utils.Metric`
calls, `MetricFamily`, is_cancelled, log records) holds that mutex, and for metrics the GIL, while it
waits without a timeout for a reply a dead tritonserver never sends. The stub then stays forever,
re-parented to init (issue 24; py-spy showed the stand-in's metrics thread in `Metric.set` and the
health thread waiting for the mutex).

`watch_parent()` starts one daemon thread that, every `poll_s`:
- compares `os.getppid()` with tritonserver's pid (the stub's parent): once re-parented, tritonserver
  is gone and the process ends (`os._exit`: the stub's Python finalization is what hangs), after removing
  the stub's shared-memory region, as Triton's own exit does (`os._exit` skips it; no one else will);
- re-arms faulthandler's watchdog (`dump_traceback_later(hang_s, exit=True)`), a C thread that needs no
  GIL: if this thread cannot run for `hang_s` (the GIL held by a thread blocked for good), the watchdog
  writes every thread's stack to stderr and ends the process.
`watch_parent()` also enables faulthandler for fatal signals: a stub that crashes or hangs while serving
leaves every thread's stack in tritonserver's log (forwarded as errors: runtime/triton_logs.py). It is
disabled again at `finalized()`: a stub of the stack segfaults while its interpreter tears down
(seen at the end of `make predict`), which ends nothing that serves.
`ParentWatch.finalized()` (called at the end of a model's `finalize`) gives the stub `grace_s` to exit:
tritonserver waits for the stub without a timeout once it has sent the finalize.

Triton's own exit also deadlocks when tritonserver dies while a model initializes (a rank killed before its
startup models are loaded: tritonserver installs its SIGTERM handler only after loading them, so the
signal ends it at once). After `initialize` returns, the stub's main thread waits, with the GIL held and
no timeout, for tritonserver's last message of the handshake (the deferred `stub_message_queue_->Pop()`
of `Stub::RunCommand`); the health thread sees the parent gone and then blocks for good taking the GIL
in `~Stub` (gdb showed both; its check, `kill(parent, 0)`, also sees a dead tritonserver alive until
init reaps it). So the watch:
- watches the pid the stub was started by, from the stub's command line (`tritonserver_pid()`), not
  `os.getppid()` at the time the watch starts: a tritonserver that died during a long initialize has
  already handed the stub to init, and the watch would otherwise wait for init to go;
- checks it, and arms the watchdog, in `start()` itself, in the model's thread: the watch thread may not
  get the GIL once before the main thread takes it for good, and an unarmed watchdog ends nothing.
A tritonserver that dies in the few milliseconds between `start()` and the end of that handshake leaves
the stub to the watchdog (gone after `hang_s`; its shared-memory region, which the watch otherwise
removes, then stays). The kernel's parent-death signal (PR_SET_PDEATHSIG) is no substitute: it fires when
the *thread* that forked the stub ends (one of tritonserver's model-loading threads), not tritonserver.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import threading
import time
from pathlib import Path

from trtllm_truss.runtime.process_tree import STUB_EXECUTABLE

logger = logging.getLogger(__name__)

POLL_S = 1.0
HANG_S = 10.0  # a GIL held this long by one thread is a hang, not work
EXIT_GRACE_S = 10.0
# python_backend's stub_launcher.cc starts a stub as `triton_python_backend_stub <model.py> <shm region>
# <shm default size> <shm growth size> <tritonserver's pid> ...`.
STUB_REGION_ARG = 2
STUB_PARENT_ARG = 5
SHM_DIR = Path("/dev/shm")  # where shm_open (boost's shared_memory_object) keeps a region


def _stub_argv() -> list[str] | None:
    """This process's command line if it is a python-backend stub."""
    try:
        argv = Path("/proc/self/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    return argv if len(argv) > STUB_PARENT_ARG and os.path.basename(argv[0]) == STUB_EXECUTABLE else None


def tritonserver_pid() -> int:
    """The tritonserver that started this stub (the pid its command line names, which the stub's own health
    thread watches); for any other process its parent. os.getppid() alone is wrong once that parent died:
    the process has been re-parented to init (or a subreaper)."""
    argv = _stub_argv()
    if argv is not None and argv[STUB_PARENT_ARG].isdigit():
        return int(argv[STUB_PARENT_ARG])
    return os.getppid()


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: a dead tritonserver stays one until init reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _remove_own_shm_region() -> None:
    """The stub's shared-memory region, which the stub itself removes when Triton's exit of an orphaned
    stub completes (its SharedMemoryManager's destructor) and os._exit skips. With tritonserver gone no
    one else will: a killed rank leaves it in /dev/shm otherwise."""
    argv = _stub_argv()
    region = argv[STUB_REGION_ARG] if argv is not None else ""
    if region and "/" not in region:
        try:
            (SHM_DIR / region).unlink(missing_ok=True)
        except OSError:
            pass


class ParentWatch:
    def __init__(self, name: str, *, poll_s: float = POLL_S, hang_s: float = HANG_S) -> None:
        self.name = name
        self.parent = tritonserver_pid()
        self._poll_s = poll_s
        self._hang_s = hang_s
        self._lock = threading.Lock()  # finalized() and the re-arming must not overtake each other
        self._finalized = False
        self._thread = threading.Thread(target=self._run, name=f"{name}-parent-watch", daemon=True)

    def start(self) -> ParentWatch:
        # Here, not only in the thread: see the module's docstring (a GIL held for good from the moment
        # the model's initialize returns, a tritonserver gone before the watch starts).
        _arm(self._hang_s)
        if os.getppid() != self.parent:
            if not _alive(self.parent):
                self._parent_gone()
            # Started through something between tritonserver and the stub that did not exec (Triton
            # itself execs the stub): watch that parent, as before.
            self.parent = os.getppid()
        self._thread.start()
        return self

    def finalized(self, grace_s: float = EXIT_GRACE_S) -> None:
        """The model is finalized: the process must be gone within `grace_s`, parent or not."""
        with self._lock:
            self._finalized = True
            _arm(grace_s)
        # A crash while the interpreter tears down is no longer a serving failure: keep the log quiet.
        faulthandler.disable()

    def _run(self) -> None:
        while os.getppid() == self.parent:
            with self._lock:
                if not self._finalized:
                    _arm(self._hang_s)
            time.sleep(self._poll_s)  # the poll period
        self._parent_gone()

    def _parent_gone(self) -> None:
        # Nothing is left to serve, and the stub's own exit may be the part that hangs.
        logger.error("%s: tritonserver (pid %d) is gone; ending this stub (pid %d)", self.name, self.parent, os.getpid())
        _remove_own_shm_region()
        os._exit(1)


def _arm(timeout_s: float) -> None:
    # fd 2 rather than sys.stderr: the stub's sys.stderr may be replaced or None; a closed pipe only
    # loses the stacks (the stub ignores SIGPIPE), the exit still happens.
    faulthandler.dump_traceback_later(timeout_s, exit=True, file=2)


def watch_parent(name: str) -> ParentWatch:
    """Start watching tritonserver from this stub (call once, from a model's `initialize`)."""
    faulthandler.enable(file=2, all_threads=True)
    return ParentWatch(name).start()


def exit_with_parent(parent_pid: int, poll_s: float = 0.5) -> None:
    """For a process a stub (or the LLM-API double's proxy) starts: end it once `parent_pid` is gone, as
    TensorRT-LLM's workers end with their proxy: the kernel's parent-death signal, and a thread that
    checks the parent (the signal is lost when the parent died before it was set)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
