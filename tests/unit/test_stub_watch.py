"""stub_watch ends a process whose parent vanished, even while one of its threads holds the GIL for good
(what a python-backend stub does when tritonserver dies during a metrics IPC call). Real processes:
a parent that starts the watched child, then is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

PACKAGES = str(Path(__file__).resolve().parents[2] / "packages")

CHILD = textwrap.dedent("""
    import ctypes, signal, sys, threading
    from trtllm_truss.runtime.stub_watch import ParentWatch
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as Triton's stub
    ParentWatch("test", poll_s=0.2, hang_s=float(sys.argv[1])).start()
    print("watching", flush=True)
    if sys.argv[2] == "hold-gil":
        # pause() through PyDLL keeps the GIL: no Python thread runs again, the watch thread included.
        ctypes.PyDLL(None).pause()
    threading.Event().wait()
""")

# The parent prints its child's pid, then waits to be killed.
PARENT = textwrap.dedent("""
    import subprocess, sys, threading
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "watching"
    print(child.pid, flush=True)
    threading.Event().wait()
""")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def _orphan_after_parent_kill(hang_s: float, mode: str) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([PACKAGES, os.environ.get("PYTHONPATH", "")])}
    # stderr dropped: the watchdog writes every thread's stack there before it ends the child
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(hang_s), mode], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    return child, time.monotonic()


@pytest.mark.parametrize("mode, hang_s, within_s", [("idle", 60.0, 10.0), ("hold-gil", 2.0, 15.0)])
def test_a_watched_process_ends_when_its_parent_is_killed(mode: str, hang_s: float, within_s: float) -> None:
    child, killed_at = _orphan_after_parent_kill(hang_s, mode)
    try:
        while not _gone(child) and time.monotonic() - killed_at < within_s:
            time.sleep(0.05)
        assert _gone(child), f"the {mode} child (pid {child}) outlived its parent by {within_s} s"
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)


def test_a_watched_stub_that_crashes_writes_its_threads_stacks():
    """watch_parent() enables faulthandler: a segfault leaves the stacks that say where the stub died."""
    crash = textwrap.dedent("""
        import signal, threading
        from trtllm_truss.runtime.stub_watch import watch_parent
        watch_parent("crash-test")
        def die_here():  # to this thread: os.kill's signal may land on the watch's thread, and this one go on
            signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)
        die_here()
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([PACKAGES, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert "in die_here" in done.stderr
