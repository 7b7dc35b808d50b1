"""stop_signals: the stack's stop runs first, then the handler that was there (uvicorn's), once; a
second signal during the stop goes straight on. In a child process, so pytest's handlers stay as they are."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGES = str(Path(__file__).resolve().parents[2] / "packages")

# No lock is taken in a handler (the main thread may hold it when the handler runs): polls instead.
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from trtllm_truss.runtime.stop_signals import chain_stop_handlers
    events = []
    def previous(signum, frame):
        events.append(f"previous {signal.Signals(signum).name}")
    def poll(condition):
        deadline = time.monotonic() + 10
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)
    def stop():
        events.append("stop started")
        if sys.argv[1] == "twice":
            os.kill(os.getpid(), signal.SIGINT)  # a second signal while the stack stops
            poll(lambda: "previous SIGINT" in events)
        events.append("stop done")
    signal.signal(signal.SIGTERM, previous)
    signal.signal(signal.SIGINT, previous)
    assert chain_stop_handlers(stop)
    os.kill(os.getpid(), signal.SIGTERM)
    poll(lambda: "previous SIGTERM" in events)
    print(events)
""")



def _events(mode: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([PACKAGES, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_stop_runs_before_the_previous_handler() -> None:
    assert _events("once") == "['stop started', 'stop done', 'previous SIGTERM']"


def test_a_second_signal_during_the_stop_goes_straight_on() -> None:
    assert _events("twice") == "['stop started', 'previous SIGINT', 'stop done', 'previous SIGTERM']"
