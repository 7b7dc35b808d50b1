"""The batch runner's share of the engine follows the host's interactive load: with interactive requests in
flight it starts a line only while fewer than `max_in_flight_under_load` are on the engine (0: none), with
none up to `max_in_flight`; lines already on the engine are never cancelled, and every line is answered
once. The load signal is driven by the test (the runner reads it through `interactive_in_flight`); the
route is a stand-in whose every call waits until the test finishes it. The signal itself: what every
front process admitted less the batch lines' own streams (a real `ReplicaState` and pool bound)."""

from __future__ import annotations

import asyncio
import contextvars
from types import SimpleNamespace

import pytest
from trtllm_truss.config.batches import BatchesConfig
from trtllm_truss.fronts.replica_state import ReplicaState
from trtllm_truss.serving import batch_runner
from trtllm_truss.serving.batch_runner import BatchRunner
from trtllm_truss.serving.batches import BATCH
from trtllm_truss.streaming.pool import BoundedPool, background_request
from test_batch_runner import ENDPOINT, OWNER, _answers, _batch, _store, _until


class Engine:
    """Stands for the route: each line stays "on the engine" until the test finishes it."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.done: dict[str, asyncio.Event] = {}
        self.cancelled = 0

    async def __call__(self, core, body, caller):
        prompt = body["prompt"]
        self.done[prompt] = asyncio.Event()
        self.started.append(prompt)
        try:
            await self.done[prompt].wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return {"object": "text_completion", "choices": [{"text": prompt}]}

    def on_engine(self) -> list[str]:
        return [p for p in self.started if not self.done[p].is_set()]

    def finish(self, count: int | None = None) -> None:
        for prompt in self.on_engine()[:count]:
            self.done[prompt].set()


class Load:
    """The host's interactive requests in flight, as the test sets them; counts the runner's reads."""

    def __init__(self, interactive: int) -> None:
        self.interactive = interactive
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.interactive

    async def read_again(self, times: int = 5) -> None:
        """Until the runner has read the load `times` more times: it had as many chances to start a line."""
        target = self.reads + times
        await _until(lambda: self.reads >= target)


@pytest.fixture
def engine(monkeypatch) -> Engine:
    route = Engine()
    monkeypatch.setitem(batch_runner._HANDLERS, ENDPOINT, route)
    monkeypatch.setattr(batch_runner, "LOAD_HOLD_S", 0.0)
    return route


def _runner(store, load: Load, **config) -> BatchRunner:
    settings = BatchesConfig(**{"max_in_flight": 3, "max_in_flight_under_load": 1, "poll_s": 0.01, **config})
    return BatchRunner(SimpleNamespace(store=store), settings, runner_id="host-a", interactive_in_flight=load)


async def _drain(store, batch_id: str, engine: Engine) -> None:
    """Finish lines as they start until the batch is completed."""
    def done() -> bool:
        engine.finish()
        return store.get(BATCH, batch_id, OWNER).status == "completed"

    await _until(done)


def test_the_share_shrinks_under_interactive_load_and_grows_without(tmp_path, engine):
    store = _store(tmp_path)
    batch_id = _batch(store, 20)
    load = Load(interactive=2)

    async def main():
        runner = _runner(store, load)
        runner.start()
        await _until(lambda: len(engine.started) == 1)
        await load.read_again()
        assert len(engine.on_engine()) == 1  # under load: one line at a time

        load.interactive = 0  # the interactive requests ended: the idle share
        await _until(lambda: len(engine.on_engine()) == 3)
        await load.read_again()
        assert len(engine.on_engine()) == 3 and len(engine.started) == 3

        load.interactive = 5  # interactive requests again: the lines on the engine stay, no new one starts
        await load.read_again()
        assert len(engine.on_engine()) == 3 and len(engine.started) == 3 and engine.cancelled == 0

        engine.finish()  # the three end: one new line in their place, not three
        await _until(lambda: len(engine.started) == 4)
        await load.read_again()
        assert len(engine.on_engine()) == 1 and len(engine.started) == 4

        load.interactive = 0
        await _drain(store, batch_id, engine)
        await runner.stop()

    asyncio.run(main())
    assert sorted(_answers(store, batch_id)) == sorted(f"c{i}" for i in range(20))
    assert sorted(engine.started) == sorted(str(i) for i in range(20)) and engine.cancelled == 0


def test_a_share_of_zero_pauses_the_batch_under_load(tmp_path, engine):
    store = _store(tmp_path)
    batch_id = _batch(store, 8)
    load = Load(interactive=1)

    async def main():
        runner = _runner(store, load, max_in_flight_under_load=0)
        runner.start()
        await load.read_again(10)
        assert engine.started == []  # paused while interactive requests are in flight

        load.interactive = 0
        await _until(lambda: len(engine.started) == 3)
        load.interactive = 1
        engine.finish()  # the lines on the engine end; none starts after them
        await load.read_again()
        assert len(engine.started) == 3 and engine.on_engine() == []

        load.interactive = 0
        await _drain(store, batch_id, engine)
        await runner.stop()

    asyncio.run(main())
    assert sorted(_answers(store, batch_id)) == sorted(f"c{i}" for i in range(8))
    assert len(engine.started) == 8


def test_the_host_stays_under_load_for_the_hold_after_the_last_request(tmp_path, engine, monkeypatch):
    monkeypatch.setattr(batch_runner, "LOAD_HOLD_S", 3600.0)
    store = _store(tmp_path)
    _batch(store, 6)
    load = Load(interactive=1)

    async def main():
        runner = _runner(store, load)
        runner.start()
        await _until(lambda: len(engine.started) == 1)
        load.interactive = 0  # a closed-loop client between two requests: still the host's traffic
        await load.read_again()
        assert len(engine.on_engine()) == 1
        await runner.stop()  # halts: the line on the engine is not kept, it runs again at the next start

    asyncio.run(main())


def test_without_a_load_signal_the_runner_takes_max_in_flight(tmp_path, engine):
    store = _store(tmp_path)
    batch_id = _batch(store, 10)

    async def main():
        runner = BatchRunner(SimpleNamespace(store=store),
                             BatchesConfig(max_in_flight=3, max_in_flight_under_load=0, poll_s=0.01), runner_id="host-a")
        runner.start()
        await _until(lambda: len(engine.on_engine()) == 3)
        await _drain(store, batch_id, engine)
        await runner.stop()

    asyncio.run(main())
    assert len(engine.started) == 10


def test_the_load_signal_is_what_the_front_admitted_less_the_batch_lines(tmp_path):
    """Frontend 0 (the runner's, with one batch line's stream and one interactive) and frontend 1 (two
    interactive) share one admission bound; the signal direct_app gives the runner reads 3."""
    state = ReplicaState.create(tmp_path / "state", frontends=2, max_in_flight=16)
    pools = [BoundedPool(max_in_flight=16, chunk_rate=1e9, admission=state.admission(i)) for i in range(2)]

    def interactive_in_flight() -> int:
        return state.admitted() - pools[0].background_streams

    def batch_line_claim() -> bool:
        background_request.set(True)
        return pools[0].claim()

    assert contextvars.copy_context().run(batch_line_claim) is True  # a batch line's task: its own context
    assert pools[0].claim() is False  # an interactive request of frontend 0
    pools[1].claim(), pools[1].claim()
    assert state.admitted() == 4 and pools[0].background_streams == 1
    assert interactive_in_flight() == 3

    pools[0].release(True)  # the batch line's stream closed
    pools[1].release()
    assert pools[0].background_streams == 0 and interactive_in_flight() == 2
    state.close()
