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


# A stub whose tritonserver dies while the model initializes: the watch starts (at the end of initialize)
# once the stub has already been re-parented. Run with a python-backend stub's command line
# (`triton_python_backend_stub <model.py> <shm region> <size> <size> <tritonserver's pid> ...`) so that
# watch_parent() finds what it finds in a stub.
LATE_CHILD = textwrap.dedent("""
    import os, threading
    from trtllm_truss.runtime.stub_watch import watch_parent
    started_by = os.getppid()
    print("started", flush=True)
    while os.getppid() == started_by:  # the model's load outlasts tritonserver
        threading.Event().wait(0.01)
    watch_parent("late")
    threading.Event().wait()
""")

LATE_PARENT = textwrap.dedent("""
    import os, subprocess, sys, threading
    stub_argv = [sys.argv[1], sys.argv[2], sys.argv[3], "1048576", "1048576", str(os.getpid()), "x"]
    child = subprocess.Popen(stub_argv, executable=sys.executable, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "started"
    print(child.pid, flush=True)
    threading.Event().wait()
""")

STUB_PATH = "/opt/tritonserver/backends/python/triton_python_backend_stub"


def test_a_watch_started_after_tritonserver_died_ends_the_stub_at_once(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(LATE_CHILD)
    region = Path("/dev/shm") / f"stub_watch_test_{os.getpid()}"
    region.write_bytes(b"")  # the stub's shm region, which tritonserver can no longer remove
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([PACKAGES, os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen(
        [sys.executable, "-c", LATE_PARENT, STUB_PATH, str(model), region.name],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    killed_at = time.monotonic()
    within_s = 5.0  # the hang watchdog (HANG_S) does not fire: the watch thread runs
    try:
        while not _gone(child) and time.monotonic() - killed_at < within_s:
            time.sleep(0.05)
        assert _gone(child), f"the stub (pid {child}) outlived tritonserver by {within_s} s: its watch took init for tritonserver"
        assert not region.exists(), "the stub left its shared-memory region behind"
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)
        region.unlink(missing_ok=True)


def test_the_stubs_command_line_names_the_tritonserver_to_watch(tmp_path):
    from trtllm_truss.runtime.stub_watch import tritonserver_pid

    assert tritonserver_pid() == os.getppid()  # not a stub: its parent
    model = tmp_path / "model.py"
    model.write_text("from trtllm_truss.runtime.stub_watch import tritonserver_pid\nprint(tritonserver_pid())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([PACKAGES, os.environ.get("PYTHONPATH", "")])}
    stub_argv = [STUB_PATH, str(model), "region", "1048576", "1048576", "4242", "x"]
    done = subprocess.run(stub_argv, executable=sys.executable, capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.strip() == "4242", done.stderr


def test_a_stub_started_through_a_process_that_stays_watches_that_process(tmp_path):
    """Not ended for a parent that is not the pid on its command line while that pid runs (a launcher
    that does not exec the stub); ended once that parent goes."""
    model = tmp_path / "model.py"
    model.write_text("import threading\nfrom trtllm_truss.runtime.stub_watch import watch_parent\n"
                     "watch_parent('wrapped')\nprint('watching', flush=True)\nthreading.Event().wait()\n")
    stub_argv = [STUB_PATH, str(model), "region", "1048576", "1048576", str(os.getpid()), "x"]
    launcher = "import subprocess, sys; subprocess.run(sys.argv[1:], executable=sys.executable)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([PACKAGES, os.environ.get("PYTHONPATH", "")])}
    wrapper = subprocess.Popen([sys.executable, "-c", launcher, *stub_argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    child = None
    try:
        assert wrapper.stdout.readline().strip() == "watching"  # start() did not end it
        child = next(int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _parent_of(int(pid)) == wrapper.pid)
        wrapper.kill()
        wrapper.wait()
        killed_at = time.monotonic()
        while not _gone(child) and time.monotonic() - killed_at < 10.0:
            time.sleep(0.05)
        assert _gone(child), f"the stub (pid {child}) outlived its parent by 10 s"
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
        if child is not None and not _gone(child):
            os.kill(child, signal.SIGKILL)


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_the_hang_watchdog_is_armed_before_the_watch_thread_runs():
    """The stub's main thread can take the GIL for good as soon as initialize returns (it waits for
    tritonserver holding it): the watchdog must not wait for the watch thread's first turn. Here the
    thread is held on the watch's lock, and the GIL taken for good, from start() on."""
    child = textwrap.dedent("""
        import ctypes
        from trtllm_truss.runtime.stub_watch import ParentWatch
        watch = ParentWatch("test", poll_s=0.2, hang_s=1.0)
        with watch._lock:
            watch.start()
            ctypes.PyDLL(None).pause()
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([PACKAGES, os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-c", child], stderr=subprocess.DEVNULL, env=env)
    try:
        assert process.wait(timeout=30) == 1  # faulthandler's exit=True
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


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
