"""Routing in a fleet with real NVIDIA Dynamo 1.6.1 and no engine: two replica workers (the real
`runtime.fleet_replica.ReplicaWorker` over a stack that is only a Triton address, tests/fakes/fleet_replica_double.py)
and the front's `streaming.fleet_router.FleetRouter`, with file discovery.

KV cache events in TensorRT-LLM's JSON shape (`LLM.get_kv_cache_events`) are sent through the relay that
runs inside tritonserver (`runtime.kv_event_relay`) to one replica; Dynamo's KV router then sends that
prompt there. Also: the conversion of the events (full blocks only, signed hashes, removed after stored),
round robin over both, and a stopped replica leaving the fleet at once. Two workers per discovery backend:
`file` (one host) and `etcd` (across hosts; a real etcd from Debian's etcd-server, started once).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtllm_truss.runtime.fleet_events import LiveBlocks, to_signed_i64

ROOT = Path(__file__).resolve().parents[2]
DOUBLE = ROOT / "tests" / "fakes" / "fleet_replica_double.py"
BLOCK = 4
URLS = ("127.0.0.1:1101", "127.0.0.1:1102")


def stored(parent: int | None, blocks: list[tuple[int, list[int]]], event_id: int = 1) -> dict:
    """A "stored" event as TensorRT-LLM 1.x's KVCacheEventSerializer writes it."""
    return {"event_id": event_id, "window_size": 2048, "data": {
        "type": "stored", "parent_hash": parent,
        "blocks": [{"type": "stored_block", "block_hash": h, "cache_level": 0, "priority": 35,
                    "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens]}
                   for h, tokens in blocks]}}


# --- the conversion (no Dynamo) -------------------------------------------------------------------


def test_conversion_keeps_full_blocks_signs_hashes_and_forgets_on_restart():
    live = LiveBlocks(BLOCK)
    big = (1 << 64) - 5
    events = [
        {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [100, 0]}},
        stored(None, [(big, [1, 2, 3, 4]), (7, [5, 6, 7, 8]), (9, [9, 10])]),  # the last one partial
    ]
    out = live.convert(events)
    assert out == [{"type": "stored", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "num_block_tokens": [4, 4],
                    "block_hashes": [to_signed_i64(big), 7], "parent_hash": None}]
    assert to_signed_i64(big) == -5
    # The partial block was never announced: its removal is not either.
    assert live.convert([{"data": {"type": "removed", "block_hashes": [9, 7]}}]) == [
        {"type": "removed", "block_hashes": [7]}]
    assert live.forget_all() == {"type": "removed", "block_hashes": [-5]}
    assert live.forget_all() is None


# --- with Dynamo -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory) -> Iterator[str]:
    """A real etcd (Debian's etcd-server) on free loopback ports, for the module."""
    import shutil

    from trtllm_truss.fronts.truss_server import free_port

    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("no etcd (apt-get install etcd-server)")
    client, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{client}"
    process = subprocess.Popen(
        [binary, "--data-dir", str(tmp_path_factory.mktemp("etcd")), "--listen-client-urls", url,
         "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        import httpx

        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "etcd did not start"
            time.sleep(0.1)  # polling etcd's health endpoint
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.fixture(scope="module", params=["file", "etcd"])
def fleet(request, tmp_path_factory) -> Iterator[dict]:
    """Two replica workers found through `file` discovery, or through a real etcd (the across-hosts one)."""
    pytest.importorskip("dynamo.llm", reason="NVIDIA Dynamo not installed (requirements/fleet.txt)")
    from trtllm_truss.runtime.fleet_replica import ReplicaSettings

    discovery = request.param
    namespace = f"fleet-unit-{discovery}"
    if discovery == "file":
        variables = {"DYN_FILE_KV": str(tmp_path_factory.mktemp("fleet-discovery"))}
    else:
        variables = {"ETCD_ENDPOINTS": request.getfixturevalue("etcd_server")}
    env = {**os.environ, **variables, "DYN_LOG": "error",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "packages"), os.environ.get("PYTHONPATH", "")])}
    processes, addresses = [], []
    try:
        for index, url in enumerate(URLS):
            settings = ReplicaSettings(truss_dir=str(ROOT), index=index, namespace=namespace, discovery=discovery,
                                       kv_events=True, block_size=BLOCK)
            process = subprocess.Popen(
                [sys.executable, str(DOUBLE), settings.to_json(), url, str(ROOT / "data" / "embedded-llama")],
                stdout=subprocess.PIPE, env=env, start_new_session=True, text=True,
            )
            processes.append(process)
            line = process.stdout.readline()  # one line once in the fleet (or "" if it died)
            assert line, f"replica double {index} exited with {process.poll()}"
            addresses.append(json.loads(line)["events"])
        yield {"processes": processes, "events": addresses, "variables": variables, "discovery": discovery,
               "namespace": namespace}
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _router(fleet: dict, mode: str, **weights):
    from trtllm_truss.streaming.fleet_router import FleetFrontSettings, FleetRouter

    settings = FleetFrontSettings(namespace=fleet["namespace"], discovery=fleet["discovery"], router_mode=mode,
                                  block_size=BLOCK,
                                  environment=(*fleet["variables"].items(), ("DYN_LOG", "error")), **weights)
    return FleetRouter(settings, "tensorrt_llm")


async def _until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await condition()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def test_kv_events_through_the_relay_steer_the_router(fleet):
    from trtllm_truss.runtime.kv_event_relay import KvEventRelay

    prompt = list(range(1000, 1016))  # four full blocks
    batch = [stored(None, [(1, prompt[0:4]), (2, prompt[4:8]), (3, prompt[8:12]), (4, prompt[12:16])])]
    pending = [batch]
    relay = KvEventRelay(lambda timeout: pending.pop() if pending else (time.sleep(timeout) or []),
                         fleet["events"][1]).start()  # to replica 1, as its engine's relay would

    async def run() -> None:
        router = _router(fleet, "kv")
        await router.start()
        try:
            await _until(lambda: _ready(router, 2), 20, "both replicas in the router's view")

            async def routed_to_replica_1():
                route = await router.route(prompt + [7, 7])
                await route.done()
                # Named by the Dynamo instance the router chose (the front's x-replica header).
                assert route.replica == str(route.worker_id) and route.worker_id in router.replicas()
                return route.engine.grpc_url == URLS[1]

            await _until(routed_to_replica_1, 20, "the prompt routed to the replica that holds its blocks")
            async def no_request_active() -> bool:  # Dynamo's router applies a `free` after it returns
                loads = await router.kv_router.get_potential_loads(prompt + [7, 7])
                return all(row["active_requests"] == 0 for row in loads)

            for _ in range(3):  # and it stays there, each time the last one's load is off the router's view
                await _until(no_request_active, 20, "the router's view of the last request freed")
                assert await routed_to_replica_1()
        finally:
            await router.close()

    try:
        asyncio.run(run())
    finally:
        relay.close()
    assert relay.sent == 1 and relay.dropped == 0


async def _ready(router, count: int) -> bool:
    return len(router.replicas()) >= count


def test_round_robin_uses_both_replicas_and_names_each(fleet):
    """Each stream is told the replica that serves it: its Dynamo instance id, one per replica."""
    async def served_by(engine):  # in place of an engine's stream: which Triton the route reached
        yield engine.grpc_url

    async def run() -> tuple[set[tuple[str, str]], set[str]]:
        router = _router(fleet, "round_robin")
        await router.start()
        try:
            await _until(lambda: _ready(router, 2), 20, "both replicas")
            seen = set()
            for _ in range(4):
                told: list[str] = []
                async for url in router.stream([1, 2, 3], served_by, on_replica=told.append):
                    assert len(told) == 1, told  # told before the stream's first item
                    seen.add((url, told[0]))
            return seen, {str(i) for i in router.replicas()}
        finally:
            await router.close()

    seen, instances = asyncio.run(run())
    assert {url for url, _ in seen} == set(URLS)
    assert {name for _, name in seen} == instances and len(seen) == 2, (seen, instances)  # one name per replica


def test_approximate_mode_keeps_a_prefix_where_it_sent_it(fleet):
    """No events: Dynamo's router remembers where it routed a prompt's blocks (update_indexer)."""
    prompt = list(range(2000, 2016))

    async def run() -> set[str]:
        router = _router(fleet, "approximate")
        await router.start()
        try:
            await _until(lambda: _ready(router, 2), 20, "both replicas")
            urls = set()
            for _ in range(4):
                route = await router.route(prompt + [len(urls)])
                await route.done()
                urls.add(route.engine.grpc_url)
            return urls
        finally:
            await router.close()

    assert len(asyncio.run(run())) == 1


def test_the_router_is_built_with_the_fleets_weights(fleet):
    """fleet.overlap_score_credit / prefill_load_scale / router_temperature reach Dynamo's KvRouterConfig (read
    back through Dynamo's own getters), and that router routes."""
    async def run() -> tuple[float, float]:
        router = _router(fleet, "kv", overlap_score_credit=2.5, prefill_load_scale=3.0, router_temperature=0.5)
        await router.start()
        try:
            await _until(lambda: _ready(router, 2), 20, "both replicas")
            route = await router.route([11, 12, 13, 14, 15])
            await route.done()
            assert route.engine.grpc_url in URLS
            config = router.kv_router_config
            return config.overlap_score_credit, config.prefill_load_scale
        finally:
            await router.close()

    assert asyncio.run(run()) == (2.5, 3.0)


def test_a_stopped_replica_leaves_at_once(fleet):
    """Last in the module: it stops replica 0 (SIGTERM: it unregisters, no lease to wait out)."""
    async def run() -> None:
        router = _router(fleet, "kv")
        await router.start()
        try:
            await _until(lambda: _ready(router, 2), 20, "both replicas")
            victim = fleet["processes"][0]
            victim.send_signal(signal.SIGTERM)
            await asyncio.to_thread(victim.wait, 20)
            assert victim.returncode == 0
            await _until(lambda: _one_left(router), 5, "the stopped replica out of the router's view")
            for _ in range(3):
                route = await router.route([5, 6, 7, 8, 9])
                await route.done()
                assert route.engine.grpc_url == URLS[1]
        finally:
            await router.close()

    asyncio.run(run())


async def _one_left(router) -> bool:
    return len(router.replicas()) == 1
