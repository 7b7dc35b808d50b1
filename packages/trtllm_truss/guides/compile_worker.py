"""The front's compile processes: one warm parent that forks them, and the forked workers themselves.

`python -m trtllm_truss.guides.compile_worker` (started by `guides.compile_service`, settings as one JSON
line on stdin) loads what a compile needs and is slow to load: the grammar engine and the deployment's
tokenizer as that engine takes it (xgrammar's TokenizerInfo, llguidance's LLTokenizer: seconds), the JSON
Schema meta-schemas. It starts no thread, then forks one worker per `fork` line on stdin, so a worker killed
over the budget is replaced in milliseconds, not in the seconds a fresh interpreter takes (the children share
its pages until they write them). Workers connect to the service's worker socket, say who they are, and
check one guide at a time (`guides.verdict.check`: the check, then the compile over the tokenizer), keeping
nothing of it: after a job that left it holding more than `TRIM_ABOVE_BYTES` of its own it gives the
allocator's freed pages back (`malloc_trim`), and one still holding more than `recycle_bytes` exits after
answering and the service forks another.

Every process here has a parent-death signal: the fork parent dies with the service, a worker with the
fork parent. Messages are `guides.wire` frames.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import sys
import traceback
from dataclasses import asdict
from typing import Any

log = logging.getLogger("trtllm_truss.guide_compile")

_PR_SET_PDEATHSIG = 1
DEFAULT_RECYCLE_BYTES = 128 << 20
TRIM_ABOVE_BYTES = 32 << 20
WARM_SCHEMA = '{"type":"object","properties":{"a":{"type":"integer"},"b":{"enum":["x","y"]}},"required":["a"]}'


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Ask the kernel for `signum` when the parent (the thread that started this process) dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)
    except (OSError, AttributeError):  # not Linux: the socket's end still stops a worker
        pass


def private_bytes() -> int:
    """Memory only this process holds (smaps_rollup's Private_Clean + Private_Dirty), in bytes. Not statm's
    resident - shared: that counts the pages a fork still shares with its parent as its own."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as rollup:
            lines = rollup.read().splitlines()
    except OSError:
        return 0
    return 1024 * sum(int(line.split()[1]) for line in lines if line.startswith((b"Private_Clean:", b"Private_Dirty:")))


def release_freed_memory() -> None:
    """glibc's `malloc_trim(0)` (nothing where the C library has none)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def main() -> None:
    settings = json.loads(sys.stdin.readline())
    logging.basicConfig(level=settings.get("log_level", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s guide-compile %(levelname)s %(name)s: %(message)s")
    die_with_parent(signal.SIGKILL)
    if os.getppid() != settings["service_pid"]:  # the service died before the request took effect
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the service alone decides
    compiler, why = _load(settings["engine"], settings["tokenizer_dir"])
    _warm(settings["engine"], compiler)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers
    parent = os.getpid()
    for line in sys.stdin:
        if line.strip() != "fork":
            continue
        if os.fork() == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _serve(settings, compiler, why, parent)
            except BaseException:  # noqa: BLE001 -- a worker never returns into the fork loop
                traceback.print_exc()
            finally:
                os._exit(0)


def _load(engine: str, tokenizer_dir: str) -> tuple[Any, str | None]:
    """The engine's compiler over the tokenizer, or (None, why not): then workers check guides without
    a tokenizer (`guides.verdict.judge`), still within the budget."""
    from trtllm_truss.guides.verdict import EngineCompiler

    compiler = EngineCompiler(engine, tokenizer_dir)
    if not compiler.available:
        return None, f"{engine} is not installed in this Python (guides are checked without the tokenizer)"
    try:
        compiler.load()
    except Exception as exc:  # any tokenizer problem: the check goes on without it
        log.warning("guides are checked without the tokenizer: loading it for %s failed: %s", engine, exc)
        return None, f"the tokenizer could not be loaded for {engine}: {exc}"
    return compiler, None


def _warm(engine: str, compiler: Any) -> None:
    """What every check imports and builds once (jsonschema's meta-schemas, the engine's converter), so
    forked workers start with it."""
    from trtllm_truss.guides.verdict import judge

    try:
        judge("json_schema", WARM_SCHEMA, engine, False)
        judge("json_schema", WARM_SCHEMA, engine, True)
    except Exception:  # noqa: BLE001 -- warming is an optimisation
        log.exception("warming the guide checker failed")


def _quiet_native_stderr() -> None:
    """xgrammar's C++ writes a warning to stderr for every keyword it approximates (thousands over a corpus):
    fd 2 goes to /dev/null, and this process's Python logging to the stderr it had."""
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    stream = os.fdopen(saved, "w", buffering=1)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(stream)
    sys.stderr = stream


def _serve(settings: dict, compiler: Any, why: str | None, parent: int) -> None:
    from trtllm_truss.guides import wire
    from trtllm_truss.guides.verdict import Refused, check

    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:
        return
    _quiet_native_stderr()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(settings["socket"])
    except OSError:  # the service that asked for this worker is gone
        return
    wire.send(sock, {"pid": os.getpid(), "compiler": compiler is not None, "why": why})
    engine, recycle = settings["engine"], int(settings.get("recycle_bytes") or DEFAULT_RECYCLE_BYTES)
    while True:
        job = wire.receive(sock)
        if job is None:  # the service closed the socket
            return
        try:
            verdict = check(job["type"], job.get("guide"), engine, bool(job.get("strict")), compiler)
        except Exception as exc:  # a checker bug refuses this guide, the worker goes on
            log.exception("checking a %s guide failed", job.get("type"))
            verdict = Refused(f"cannot be checked: {type(exc).__name__}: {exc}")
        held = private_bytes()
        if held > TRIM_ABOVE_BYTES:  # what the compile freed, back to the system (glibc keeps it otherwise)
            release_freed_memory()
            held = private_bytes()
        retire = held > recycle
        kind = "refused" if isinstance(verdict, Refused) else "accepted"
        wire.send(sock, {kind: asdict(verdict), "retire": retire})
        if retire:
            return


if __name__ == "__main__":
    main()
