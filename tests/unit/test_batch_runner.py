"""The batch runner over a real store (SQLite; two runners also on PostgreSQL, as two hosts), with the route handlers replaced by recorders (the runner's
part alone: which lines run, which answers are kept, who holds a batch): every line answered once by two
runners on one store; a halt mid-batch keeps nothing cut off and a restarted runner runs only the lines
without an answer; a lease held by a stopped runner is taken over once it ran out; a cancel ends the batch
with the lines not yet run left out; a 503 is not kept and the line runs again."""

from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace

import pytest
from trtllm_truss.api import batches as shapes
from trtllm_truss.config.batches import BatchesConfig
from trtllm_truss.serving import batch_runner
from trtllm_truss.serving.batch_runner import BatchRunner
from trtllm_truss.serving.batches import ANSWER, BATCH, INPUT
from trtllm_truss.store import StoredObject, owner_of
from trtllm_truss.store.sqlite import SqliteStore
from test_store import Backend, backend, postgres_url  # noqa: F401 - fixtures: each backend

OWNER = owner_of("sk-test")
ENDPOINT = "/v1/completions"


def _store(tmp_path) -> SqliteStore:
    return SqliteStore(tmp_path / "store.sqlite3", ttl_s=3600.0, max_bytes=1 << 26)


def _batch(store: SqliteStore, count: int, batch_id: str = "batch_test") -> str:
    lines = [{"custom_id": f"c{i}", "body": {"prompt": str(i)}} for i in range(count)]
    store.put(StoredObject(INPUT, batch_id, OWNER, "ready", {"lines": lines}))
    record = shapes.new_record("openai", ENDPOINT, count, input_file_id="file-x")
    shapes.stamp(record, "in_progress")
    store.put(StoredObject(BATCH, batch_id, OWNER, "in_progress", record))
    return batch_id


class Recorder:
    """Stands for the route: records each call; `gate` (if set) holds every answer until it is set."""

    def __init__(self, status: int = 200) -> None:
        self.calls: list[str] = []
        self.gate: asyncio.Event | None = None
        self.status = status

    async def __call__(self, core, body, caller):
        self.calls.append(body["prompt"])
        assert caller.store_owner == OWNER
        if self.gate is not None:
            await self.gate.wait()
        if self.status != 200:
            return batch_runner.openai_error(self.status, "busy")
        return {"object": "text_completion", "choices": [{"text": body["prompt"]}]}


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    handler = Recorder()
    monkeypatch.setitem(batch_runner._HANDLERS, ENDPOINT, handler)
    return handler


def _runner(store, runner_id: str, **config) -> BatchRunner:
    core = SimpleNamespace(store=store)
    return BatchRunner(core, BatchesConfig(**{"max_in_flight": 3, "poll_s": 0.01, **config}), runner_id=runner_id)


def _answers(store, batch_id: str) -> list[str]:
    return [o.body["custom_id"] for o in store.find(ANSWER, owner=OWNER, id_prefix=batch_id + "/", limit=1000)]


async def _until(condition, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "not reached in time"
        await asyncio.sleep(0.01)


def test_two_runners_on_one_store_answer_every_line_once(backend: Backend, recorder):
    """Two hosts' runners on one database (PostgreSQL), or two processes' on one file (SQLite)."""
    store_a, store_b = backend.open(max_bytes=1 << 26), backend.open(max_bytes=1 << 26)
    batch_id = _batch(store_a, 30)

    async def main():
        a, b = _runner(store_a, "host-a"), _runner(store_b, "host-b")
        a.start(), b.start()
        await _until(lambda: store_a.get(BATCH, batch_id, OWNER).status == "completed")
        await a.stop(), await b.stop()
        return a, b

    a, b = asyncio.run(main())
    assert sorted(_answers(store_a, batch_id)) == sorted(f"c{i}" for i in range(30))
    assert sorted(recorder.calls) == sorted(str(i) for i in range(30))  # the lease: one runner ran it
    assert {a.lines_answered, b.lines_answered} == {0, 30}
    done = store_a.get(BATCH, batch_id, OWNER)
    assert done.body["counts"] == {"succeeded": 30, "errored": 0} and done.body["runner"] is None
    output = store_a.get("file_content", done.body["output_file_id"], OWNER).body["text"].splitlines()
    assert len(output) == 30 and done.body["error_file_id"] is None


def test_a_halt_keeps_nothing_cut_off_and_a_restart_runs_only_the_rest(tmp_path, recorder):
    store = _store(tmp_path)
    batch_id = _batch(store, 12)

    async def first_run():
        recorder.gate = asyncio.Event()
        runner = _runner(store, "host-a")
        runner.start()
        await _until(lambda: len(recorder.calls) == 3)  # three lines on the "engine"
        runner.halt()  # the exit signal, before the workers stop
        recorder.gate.set()  # the cut-off lines end (as a stop would end them) after the halt
        await runner.stop()

    asyncio.run(first_run())
    assert _answers(store, batch_id) == []
    assert store.get(BATCH, batch_id, OWNER).status == "in_progress"

    async def second_run():
        recorder.gate = None
        runner = _runner(store, "host-a")  # the same runner id, started again: takes its lease back at once
        runner.start()
        await _until(lambda: store.get(BATCH, batch_id, OWNER).status == "completed")
        await runner.stop()

    asyncio.run(second_run())
    assert sorted(_answers(store, batch_id)) == sorted(f"c{i}" for i in range(12))
    assert len(recorder.calls) == 3 + 12  # the three cut off ran again, nothing else twice


def test_a_stopped_runners_lease_is_taken_over_once_it_ran_out(tmp_path, recorder, monkeypatch):
    store = _store(tmp_path)
    batch_id = _batch(store, 4)
    monkeypatch.setattr(batch_runner, "LEASE_S", 0.5)

    async def main():
        gone = _runner(store, "host-a")
        assert await gone._claim(store.get(BATCH, batch_id, OWNER)) is not None  # then it stops, silently
        other = _runner(store, "host-b")
        assert await other._claim(store.get(BATCH, batch_id, OWNER)) is None  # held
        other.start()
        await _until(lambda: store.get(BATCH, batch_id, OWNER).status == "completed")
        await other.stop()
        return other

    other = asyncio.run(main())
    assert other.lines_answered == 4


def test_a_cancel_ends_the_batch_with_what_was_answered(tmp_path, recorder):
    store = _store(tmp_path)
    batch_id = _batch(store, 20)

    async def main():
        recorder.gate = asyncio.Event()
        runner = _runner(store, "host-a")
        runner.start()
        await _until(lambda: len(recorder.calls) == 3)
        found = store.get(BATCH, batch_id, OWNER)
        shapes.stamp(found.body, "cancelling")
        assert store.update(StoredObject(BATCH, batch_id, OWNER, "cancelling", found.body, found.created_at),
                            if_status=shapes.CANCELLABLE)
        await _until(lambda: store.get(BATCH, batch_id, OWNER).status == "cancelled")
        await runner.stop()

    asyncio.run(main())
    done = store.get(BATCH, batch_id, OWNER)
    assert done.body["counts"] == {"succeeded": 0, "errored": 0}  # the three on the engine were stopped
    assert len(recorder.calls) == 3 and _answers(store, batch_id) == []
    assert shapes.anthropic_batch(batch_id, done.status, done.body, "")["request_counts"]["canceled"] == 20


def test_an_engine_refusal_is_not_kept_and_the_line_runs_again(tmp_path, recorder):
    store = _store(tmp_path)
    batch_id = _batch(store, 2)
    recorder.status = 503

    async def main():
        runner = _runner(store, "host-a")
        runner.start()
        await _until(lambda: len(recorder.calls) >= 4)  # each line tried twice: nothing kept
        assert _answers(store, batch_id) == []
        recorder.status = 200
        await _until(lambda: store.get(BATCH, batch_id, OWNER).status == "completed")
        await runner.stop()

    asyncio.run(main())
    assert sorted(_answers(store, batch_id)) == ["c0", "c1"]


def test_a_lease_of_a_gone_process_of_this_host_is_taken_at_once(tmp_path, recorder):
    import socket
    import subprocess
    import sys

    store = _store(tmp_path)
    batch_id = _batch(store, 2)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)

    async def main():
        this_host = socket.gethostname()
        # a live process of this host (pytest's parent), a gone one, one of another host
        for holder, taken in ((f"{this_host}:{os.getppid()}", False), (f"{this_host}:{gone.stdout.strip()}", True),
                              ("another-host:1", False)):
            found = store.get(BATCH, batch_id, OWNER)
            found.body.update(runner=holder, lease_until=time.time() + 60)
            assert store.update(found)
            runner = BatchRunner(SimpleNamespace(store=store), BatchesConfig())
            assert (await runner._claim(store.get(BATCH, batch_id, OWNER)) is not None) is taken, holder

    asyncio.run(main())
