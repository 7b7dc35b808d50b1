"""A fleet under truss's own server: `model_metadata.trt_llm.fleet` set (here by TRTLLM_FLEET__* overrides of the
embedded default, with block reuse and its KV events on), so `LLMService.load()` starts two replicas (two stacks
of the embedded default, real tritonservers, real NVIDIA Dynamo 1.6.1 with file discovery) and truss's event
loop routes each request with Dynamo's KV router, as a direct frontend of `serve --replicas` does.

- a chat completion and a streamed one through the fleet, and one answer of each other dialect, each naming
  the replica that took it (`x-replica`);
- KV routing: the same long prompt sent 5 times stays on one replica and comes back with `cached_tokens`
  >= 75 % of the prompt each time after the first;
- a replica killed (SIGKILL, with its tritonserver): the other serves meanwhile, and the fleet's own thread
  starts it again (truss's load thread, which started the fleet, ended long before): it rejoins as a new
  Dynamo instance and serves;
- a stop of truss's server (SIGTERM) leaves no process: no replica, tritonserver or python-backend stub.

One server for the module (two stacks take about a minute to start on 2 cores); the stop test is the last.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
from trtllm_truss.fronts.truss_server import TrussServer
from truss_serving import fleet_instances, fleet_replica_pids, poll, serve_truss

pytest.importorskip("dynamo.llm", reason="NVIDIA Dynamo not installed (requirements/fleet.txt; scripts/bootstrap.sh)")

pytestmark = [pytest.mark.truss_server, pytest.mark.triton, pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(900)]

STARTUP_TIMEOUT_S = 480  # two stacks loading the embedded model side by side on 2 cores
FLEET_ENV = {
    "TRTLLM_FLEET__REPLICAS": "2",  # the fleet section, as config.yaml would set it
    "TRTLLM_RUNTIME__ENABLE_KV_CACHE_REUSE": "true",
    "TRTLLM_RUNTIME__EVENT_BUFFER_MAX_SIZE": "10000",
}
LONG_PROMPT = " ".join(f"Ship {i} sails the northern sea with a crew of {i % 7 + 3} sailors and a cargo of salt." for i in range(40))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[TrussServer]:
    yield from serve_truss(tmp_path_factory.mktemp("truss_server_fleet"), FLEET_ENV, startup_timeout_s=STARTUP_TIMEOUT_S)


def _instances(server: TrussServer) -> set[str]:
    """The replicas' Dynamo instance ids now (what `x-replica` names them by)."""
    return set(fleet_instances(server).values())


def _chat(server: TrussServer, content: str, max_tokens: int = 4) -> httpx.Response:
    response = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": "embedded", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})
    assert response.status_code == 200, response.text
    return response


def _command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.NoSuchProcess:  # ZombieProcess included: ended, not yet reaped
        return ""


def test_chat_and_a_streamed_chat_through_the_fleet(fleet):
    # Both replicas' tritonservers were ready when load() returned; each joins Dynamo's fleet moments after.
    poll(lambda: len(_instances(fleet)) == 2, 60, what="both replicas in the fleet")
    instances = _instances(fleet)
    answer = _chat(fleet, "Tell me about the sea", max_tokens=8)
    body = answer.json()
    assert body["choices"][0]["message"]["content"] and body["usage"]["completion_tokens"] > 0, body
    assert answer.headers["x-replica"] in instances, (answer.headers, instances)
    with httpx.stream("POST", fleet.url + "/v1/chat/completions", timeout=120,
                      json={"model": "embedded", "stream": True, "max_tokens": 6,
                            "messages": [{"role": "user", "content": "Hi"}]}) as response:
        assert response.status_code == 200
        assert response.headers["x-replica"] in instances, response.headers
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 3, events


@pytest.mark.parametrize(
    ("path", "body", "answered"),
    [
        ("/v1/models/model:predict", {"prompt": "Hello", "max_tokens": 4, "stream": False},
         lambda b: 1 <= b["usage"]["completion_tokens"] <= 4),
        ("/v1/completions", {"model": "embedded", "prompt": "Hello", "max_tokens": 4},
         lambda b: 1 <= b["usage"]["completion_tokens"] <= 4),
        ("/v1/responses", {"model": "embedded", "input": "Hi", "max_output_tokens": 4},
         lambda b: b["status"] in ("completed", "incomplete") and b["output"]),
        ("/v1/messages", {"model": "embedded", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
         lambda b: b["content"][0]["text"]),
    ],
)
def test_the_other_dialects_through_the_fleet(fleet, path, body, answered):
    response = httpx.post(fleet.url + path, json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert answered(response.json()), response.text
    assert response.headers["x-replica"] in _instances(fleet), response.headers


def test_kv_router_keeps_a_repeated_prompt_on_one_replica_and_its_cache(fleet):
    answers = [_chat(fleet, LONG_PROMPT) for _ in range(5)]
    replicas = {answer.headers["x-replica"] for answer in answers}
    assert len(replicas) == 1, replicas  # all five on the replica holding the prompt's blocks
    usages = [answer.json()["usage"] for answer in answers]
    prompt = usages[0]["prompt_tokens"]
    assert prompt > 400
    for usage in usages[1:]:
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.75 * prompt, usages


def test_a_killed_replica_is_started_again_by_the_fleet_and_rejoins(fleet):
    poll(lambda: len(_instances(fleet)) == 2, 60, what="both replicas in the fleet")
    killed_instance = fleet_instances(fleet)[0]
    victim = psutil.Process(fleet_replica_pids(fleet)[0])
    doomed = victim.children(recursive=True)
    victim.kill()  # a crash: no goodbye to the fleet
    for process in doomed:  # its tritonserver would follow on the parent-death signal; at once here
        process.kill()
    # Meanwhile the other replica serves (a request that finds the dead one is routed once more).
    deadline, served = time.monotonic() + 30, []
    while len(served) < 4 and time.monotonic() < deadline:
        response = httpx.post(fleet.url + "/v1/chat/completions", timeout=60, json={
            "model": "embedded", "messages": [{"role": "user", "content": "Still there?"}], "max_tokens": 2})
        if response.status_code == 200:
            served.append(response.headers["x-replica"])
    assert len(served) == 4 and killed_instance not in served, served
    # Started again by the fleet's thread: a new process, a new Dynamo instance, both in the fleet.
    poll(lambda: fleet_replica_pids(fleet).get(0) not in (None, victim.pid), 480, interval_s=2.0,
         what="replica 0 started again")
    back = poll(lambda: fleet_instances(fleet).get(0) not in (None, killed_instance) and fleet_instances(fleet)[0],
                120, interval_s=1.0, what="replica 0 back in the fleet")
    # The new instance takes requests: of two streams open at once, the router sends the second where the
    # first is not (its load), so the two together name both replicas.

    def both_named() -> bool:
        with httpx.Client(timeout=120) as client, \
                client.stream("POST", fleet.url + "/v1/chat/completions", json=_long_stream("Go on")) as first, \
                client.stream("POST", fleet.url + "/v1/chat/completions", json=_long_stream("Tell me more")) as second:
            return {first.headers["x-replica"], second.headers["x-replica"]} == {back, served[0]}

    poll(both_named, 60, interval_s=0.5, what="the restarted replica and the other both serving")


def _long_stream(content: str) -> dict:
    return {"model": "embedded", "stream": True, "max_tokens": 64, "ignore_eos": True,
            "messages": [{"role": "user", "content": content}]}


def test_a_stop_of_truss_server_leaves_no_process(fleet):
    server = psutil.Process(fleet.process.pid)
    everything = server.children(recursive=True)
    commands = [_command(p) for p in everything]
    assert sum("trtllm_truss.runtime.fleet_replica" in c for c in commands) == 2, commands
    assert sum("tritonserver" in c for c in commands) >= 2, commands
    server.send_signal(signal.SIGTERM)  # the service's stop handler: every replica first, then truss's server
    fleet.process.wait(timeout=120)
    _, alive = psutil.wait_procs(everything, timeout=30)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, _command(p)) for p in alive]
