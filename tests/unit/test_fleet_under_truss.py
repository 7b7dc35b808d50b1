"""The parts of a fleet under truss's own server that need no server: what turns it on, where its replicas are
started from (truss runs `load()` on a thread that ends), and the `x-replica` header on truss's responses.
The fleet itself under truss's server: tests/integration/test_truss_server_fleet.py."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from pydantic import BaseModel
from starlette.responses import JSONResponse, Response
from trtllm_truss.config import fleet_configured
from trtllm_truss.config.fleet import FleetConfig
from trtllm_truss.planning.fleet import make_fleet_plan
from trtllm_truss.serving.replica_header import REPLICA_HEADER, with_replica_header

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_fleet_section_turns_the_fleet_on_under_both_fronts(monkeypatch):
    from trtllm_truss.commands.serve import _has_fleet_section

    assert not fleet_configured(REPO_ROOT, {})  # this repository's config.yaml: one stack
    assert fleet_configured(REPO_ROOT, {"TRTLLM_FLEET__REPLICAS": "2"})  # the section, from an override
    monkeypatch.delenv("TRTLLM_FLEET__REPLICAS", raising=False)
    assert not _has_fleet_section(REPO_ROOT)
    monkeypatch.setenv("TRTLLM_FLEET__REPLICAS", "2")  # `serve .` reads the same override
    assert _has_fleet_section(REPO_ROOT)


class _Exited:
    """A replica process that has exited."""

    pid = 4242
    returncode = 1

    def poll(self) -> int:
        return 1


def test_watched_replicas_are_started_and_restarted_from_the_fleets_own_thread(tmp_path: Path, monkeypatch):
    """A replica's parent-death signal follows the thread that started it: started from truss's load thread, it
    would be stopped when load() returns. start_watched spawns on a thread that lives as long as the fleet."""
    from trtllm_truss.runtime.fleet import FleetReplicas

    plan = make_fleet_plan(FleetConfig(replicas=2), backend="pytorch", gpu_count=0, gpus_per_replica=1,
                           enable_kv_cache_reuse=True)
    replicas = FleetReplicas(tmp_path, plan, FleetConfig(replicas=2), environ={})
    spawned_on: list[threading.Thread] = []
    respawned = threading.Event()

    def spawn(replica) -> None:
        spawned_on.append(threading.current_thread())
        replica.starts += 1
        replica.process = _Exited() if replica.starts == 1 and replica.settings.index == 0 else SimpleNamespace(
            pid=1, poll=lambda: None)
        if replica.starts == 2:
            respawned.set()

    monkeypatch.setattr(replicas, "_spawn", spawn)
    monkeypatch.setattr(replicas, "_end", lambda replica, signum: None)
    loader = threading.Thread(target=lambda: replicas.start_watched(interval_s=0.01))  # truss's load thread
    loader.start()
    loader.join()
    try:
        assert respawned.wait(10), "the exited replica was not started again"
        assert len(spawned_on) == 3 and len(set(spawned_on)) == 1, spawned_on
        watcher = spawned_on[0]
        assert watcher is not loader and watcher.name == "fleet-replicas" and watcher.is_alive()
    finally:
        replicas.stop()
    watcher.join(5)
    assert not watcher.is_alive()  # stop() ends the watch


class _Answer(BaseModel):
    text: str
    extra: str | None = None


def _request(replicas: list[str] | None) -> SimpleNamespace:
    return SimpleNamespace(state=SimpleNamespace(replicas=replicas) if replicas else SimpleNamespace())


def test_the_replica_header_on_truss_servers_answers():
    assert with_replica_header({"a": 1}, _request(None)) == {"a": 1}  # no fleet: truss renders it as before
    answer = with_replica_header({"a": 1}, _request(["7"]))
    assert isinstance(answer, JSONResponse) and answer.headers[REPLICA_HEADER] == "7" and answer.body == b'{"a":1}'
    model = with_replica_header(_Answer(text="hi"), _request(["7", "9"]))
    assert model.headers[REPLICA_HEADER] == "7, 9" and model.body == b'{"text":"hi","extra":null}'
    streamed = Response(b"x")
    assert with_replica_header(streamed, _request(["7"])) is streamed and streamed.headers[REPLICA_HEADER] == "7"
