"""Eight processes racing on one empty cache build once; a builder killed mid-build leaves nothing
that a later run mistakes for a finished engine."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for the fakes package

from fakes.fake_trtllm_build import write_fake_engine  # noqa: E402

from trtllm_truss.artifacts.cache import EngineCache  # noqa: E402

KEY = "f" * 64


def _tree_digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}




def _worker(root: str, builds_log: str, start_at: float, results) -> None:
    def create(dest: Path) -> None:
        with open(builds_log, "a") as log:  # one line per real build, appended atomically
            log.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # a slow build, so the others arrive while it runs (not synchronisation)
        write_fake_engine(dest, tp=2, pp=2)

    while time.time() < start_at:  # line everyone up so they hit the empty cache together
        time.sleep(0.005)
    with EngineCache(root) as cache:
        result = cache.get(KEY, create)
        complete = (cache.entry_dir(KEY) / "COMPLETE").is_file()
        results.put((str(result.path), result.source, complete, _tree_digest(result.path)))


def test_eight_processes_build_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    builds_log = tmp_path / "builds.log"
    start_at = time.time() + 4.0  # spawn start-up takes a moment on 2 cores
    procs = [ctx.Process(target=_worker, args=(str(tmp_path / "cache"), str(builds_log), start_at, results)) for _ in range(8)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert len(builds_log.read_text().splitlines()) == 1, "more than one process built the engine"
    paths = {o[0] for o in outcomes}
    sources = sorted(o[1] for o in outcomes)
    assert len(paths) == 1 and sources == ["built"] + ["local"] * 7
    assert all(o[2] for o in outcomes)
    digests = [o[3] for o in outcomes]
    assert all(d == digests[0] for d in digests) and sorted(digests[0]) == ["config.json"] + [f"rank{r}.engine" for r in range(4)]


def _crashing_builder(root: str, ready_file: str) -> None:
    def create(dest: Path) -> None:
        (dest / "rank0.engine").write_bytes(b"partial")
        Path(ready_file).write_text("mid-build")
        time.sleep(600)  # killed here

    EngineCache(root).get_or_create(KEY, create)


def test_killed_builder_leaves_no_entry_and_next_run_rebuilds(tmp_path: Path) -> None:
    root, ready = tmp_path / "cache", tmp_path / "ready"
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_crashing_builder, args=(str(root), str(ready)))
    proc.start()
    deadline = time.monotonic() + 60
    while not ready.exists():  # poll for the builder to be mid-build
        assert time.monotonic() < deadline and proc.is_alive(), "builder never started"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL

    cache = EngineCache(root)
    assert cache.lookup(KEY) is None  # nothing that looks finished
    assert not cache.entry_dir(KEY).exists()
    assert any((root / "scratch").iterdir())  # the half-built scratch dir is still there ...
    builds: list[Path] = []
    result = cache.get(KEY, lambda dest: (builds.append(dest), write_fake_engine(dest)))
    assert result.source == "built" and len(builds) == 1
    assert not any((root / "scratch").iterdir())  # ... and the rebuild cleaned it
    assert cache.verify(KEY) == []
