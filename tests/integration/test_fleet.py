"""A fleet on this CPU: `trtllm-truss serve DIR --replicas 2`, two stacks of the embedded default behind
NVIDIA Dynamo's router (file discovery, TCP request plane, ZMQ event plane; real Dynamo 1.6.1, real
tritonservers, the stand-in engine).

- every route and feature through the fleet: the five dialects, LoRA by `model`, the API key;
- KV routing: the same long prompt sent 5 times lands on one replica and comes back with `cached_tokens`
  >= 75 % of the prompt each time after the first (the router is fed by the replicas' KV events);
- round robin: the same prompt is spread over both replicas (so it is the KV router that keeps it on one);
- each response, streamed or not, names the replica that took it (`x-replica`: its Dynamo instance id);
- faults: a replica stopped leaves the fleet (requests go to the other), comes back when started; a replica
  killed mid-stream ends its open stream with an error; a stop leaves no process, Dynamo's included.

Two fleets for the module (kv and round_robin), each started once. The cached-tokens assertion needs the
stand-in's KV block reuse and events (runtime.event_buffer_max_size); on a tree without them it is skipped.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from trtllm_truss.config.runtime import RuntimeConfig
from trtllm_truss.fronts.truss_server import TrussServer, free_port
from truss_serving import REPO_ROOT, fleet_instances, fleet_replica_pids, front_ready, poll

pytest.importorskip("dynamo.llm", reason="NVIDIA Dynamo not installed (requirements/fleet.txt; scripts/bootstrap.sh)")

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(900)]

STARTUP_TIMEOUT_S = 480  # two stacks loading the embedded model side by side on 2 cores
API_KEY = "sk-fleet-key-4242"
HAS_KV_EVENTS = "event_buffer_max_size" in RuntimeConfig.model_fields
LONG_PROMPT = " ".join(f"Ship {i} sails the northern sea with a crew of {i % 7 + 3} sailors and a cargo of salt." for i in range(40))


def _truss(work: Path, router_mode: str) -> Path:
    config = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())
    trt = config["model_metadata"]["trt_llm"]
    trt["build"]["huggingface_ckpt_repository"] = str(REPO_ROOT / "data" / "embedded-llama")
    trt["build"]["lora_adapters"] = {"pirate": str(REPO_ROOT / "data" / "embedded-lora" / "pirate")}
    runtime = trt.setdefault("runtime", {})
    runtime["enable_kv_cache_reuse"] = True
    if HAS_KV_EVENTS:
        runtime["event_buffer_max_size"] = 10_000
    runtime["direct_front"] = {"processes": 1, "api_key_secret": "hf_access_token"}
    trt["fleet"] = {"replicas": 2, "router_mode": router_mode}
    truss = work / f"truss-{router_mode}"
    truss.mkdir()
    (truss / "config.yaml").write_text(yaml.safe_dump(config))
    return truss


def _start(work: Path, router_mode: str, extra_env: dict[str, str] | None = None) -> TrussServer:
    import os
    import subprocess
    import sys

    from trtllm_truss.fronts.direct import PACKAGES_DIR

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TRUSS_SECRET_hf_access_token": API_KEY,
           **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGES_DIR), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    log_path = work / f"fleet-{router_mode}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "trtllm_truss.cli", "serve", str(_truss(work, router_mode)), "--replicas", "2",
             "--host", "127.0.0.1", "--port", str(port), "-v"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    server = TrussServer(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)
    poll(lambda: process.poll() is not None or front_ready(server.url), STARTUP_TIMEOUT_S, interval_s=1.0,
         what=f"fleet ({router_mode}) ready")
    assert process.poll() is None, server.log_tail()
    return server


@pytest.fixture(scope="module")
def kv_fleet(tmp_path_factory) -> Iterator[TrussServer]:
    server = _start(tmp_path_factory.mktemp("fleet_kv"), "kv")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def rr_fleet(tmp_path_factory) -> Iterator[TrussServer]:
    server = _start(tmp_path_factory.mktemp("fleet_rr"), "round_robin")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def llmapi_fleet(tmp_path_factory) -> Iterator[TrussServer]:
    """The LLM-API path (our llmapi Triton model over the LLM-API double): events from LLM.get_kv_cache_events."""
    if not HAS_KV_EVENTS:
        pytest.skip("no KV events on this tree")
    server = _start(tmp_path_factory.mktemp("fleet_llmapi"), "kv", {"TRTLLM_RUNTIME__BACKEND": "llmapi"})
    try:
        yield server
    finally:
        server.stop()


def _post(server: TrussServer, path: str, body: dict, key: str = API_KEY, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)


def _replicas(server: TrussServer, what: str = "grpc") -> dict[int, str]:
    """Replica index -> its Triton gRPC address (or metrics URL), from the replicas' own log lines (the latest
    per index)."""
    found = {}
    for match in re.finditer(r"replica (\d+) in the fleet \(Dynamo instance \d+\): Triton gRPC (\S+), metrics (\S+)",
                             server.log_path.read_text(errors="replace")):
        found[int(match.group(1))] = match.group(2) if what == "grpc" else match.group(3)
    return found


def _metric(server: TrussServer, name: str) -> float:
    """The sum of a Triton metric over the replicas (the stand-in's own series)."""
    total = 0.0
    for url in _replicas(server, "metrics").values():
        for line in httpx.get(url, timeout=5).text.splitlines():
            if line.startswith(name):
                total += float(line.rsplit(" ", 1)[1])
    return total


def _engine_requests(grpc_url: str) -> int:
    """Requests the replica's engine model has taken (Triton's own statistics); -1 while it is down."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        stats = client.get_inference_statistics("tensorrt_llm", as_json=True)
    except InferenceServerException:
        return -1
    finally:
        client.close()
    return sum(int(m.get("inference_stats", {}).get("success", {}).get("count", 0)) for m in stats["model_stats"])


def _counts(server: TrussServer) -> dict[int, int]:
    return {index: _engine_requests(url) for index, url in _replicas(server).items()}


def _replica_processes(server: TrussServer) -> list[psutil.Process]:
    out = []
    for process in psutil.Process(server.process.pid).children():
        try:
            if "trtllm_truss.runtime.fleet_replica" in process.cmdline():
                out.append(process)
        except psutil.NoSuchProcess:
            pass
    return out


def _chat(server: TrussServer, content: str, max_tokens: int = 4, model: str = "embedded") -> dict:
    response = _post(server, "/v1/chat/completions",
                     {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})
    assert response.status_code == 200, response.text
    return response.json()


# --- every route through the fleet ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "answered"),
    [
        ("/predict", {"prompt": "Hello", "max_tokens": 4, "stream": False}, lambda b: 1 <= b["usage"]["completion_tokens"] <= 4),
        ("/v1/completions", {"model": "embedded", "prompt": "Hello", "max_tokens": 4},
         lambda b: 1 <= b["usage"]["completion_tokens"] <= 4),
        ("/v1/chat/completions", {"model": "embedded", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
         lambda b: b["choices"][0]["message"]["content"]),
        ("/v1/responses", {"model": "embedded", "input": "Hi", "max_output_tokens": 4},
         lambda b: b["status"] in ("completed", "incomplete") and b["output"]),
        ("/v1/messages", {"model": "embedded", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
         lambda b: b["content"][0]["text"]),
    ],
)
def test_every_dialect_is_served_through_the_fleet(kv_fleet, path, body, answered):
    instances = set(fleet_instances(kv_fleet).values())
    response = _post(kv_fleet, path, body)
    assert response.status_code == 200, response.text
    assert answered(response.json()), response.text
    assert response.headers["x-replica"] in instances, (response.headers, instances)  # the replica that took it
    with httpx.stream("POST", kv_fleet.url + path, json={**body, "stream": True}, timeout=120,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as streamed:
        assert streamed.status_code == 200
        assert streamed.headers["x-replica"] in instances, (streamed.headers, instances)
        assert "".join(streamed.iter_text())


def test_api_key_lora_structured_output_and_streaming_through_the_fleet(kv_fleet):
    assert _post(kv_fleet, "/v1/chat/completions", {"model": "embedded", "messages": [], "max_tokens": 1},
                 key="wrong").status_code == 401
    pirate = _post(kv_fleet, "/v1/completions", {"model": "pirate", "prompt": "Hello", "max_tokens": 6}).json()
    assert pirate["choices"][0]["text"].lstrip().startswith("Arr"), pirate
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    structured = _post(kv_fleet, "/v1/chat/completions", {
        "model": "embedded", "messages": [{"role": "user", "content": "A number as JSON"}], "max_tokens": 40,
        "temperature": 0,  # greedy: a sampled answer can run on past max_tokens (digits, spaces) and fail at random
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}},
    }).json()
    assert isinstance(json.loads(structured["choices"][0]["message"]["content"])["n"], int), structured
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    called = _post(kv_fleet, "/v1/chat/completions", {
        "model": "embedded", "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 60,
        "tools": [tool], "tool_choice": "required", "temperature": 0,
    }).json()
    calls = called["choices"][0]["message"]["tool_calls"]  # the family's tool parser, through the fleet
    assert calls and calls[0]["function"]["name"] == "get_weather", called
    assert "city" in json.loads(calls[0]["function"]["arguments"]), called
    with httpx.stream("POST", kv_fleet.url + "/v1/chat/completions", timeout=120,
                      headers={"Authorization": f"Bearer {API_KEY}"},
                      json={"model": "embedded", "stream": True, "max_tokens": 6,
                            "messages": [{"role": "user", "content": "Hi"}]}) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 3


def test_a_closed_stream_cancels_its_request_in_the_replica(kv_fleet):
    cancelled = _metric(kv_fleet, "trtllm_standin_cancelled_requests_total")
    with httpx.stream("POST", kv_fleet.url + "/v1/chat/completions", timeout=120,
                      headers={"Authorization": f"Bearer {API_KEY}"},
                      json={"model": "embedded", "stream": True, "max_tokens": 500, "ignore_eos": True,
                            "messages": [{"role": "user", "content": "Count to a thousand"}]}) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    # The client went away: the replica's engine ends the request (its cancelled count grows, nothing held).
    poll(lambda: _metric(kv_fleet, "trtllm_standin_cancelled_requests_total") > cancelled, 30,
         what="the replica's engine cancelling the request")
    poll(lambda: _metric(kv_fleet, "trtllm_standin_active_requests") == 0, 30, what="no request held")


# --- routing ---------------------------------------------------------------------------------------


def test_kv_router_keeps_a_repeated_prompt_on_one_replica_and_its_cache(kv_fleet):
    if not HAS_KV_EVENTS:  # without events the router sees no cached block: nothing to keep a prompt on one replica
        pytest.skip("the stand-in has no KV block reuse or events on this tree (runtime.event_buffer_max_size)")
    before = _counts(kv_fleet)
    assert len(before) == 2, kv_fleet.log_tail()
    usages = [_chat(kv_fleet, LONG_PROMPT)["usage"] for _ in range(5)]
    after = _counts(kv_fleet)
    grew = {i: after[i] - before[i] for i in after}
    assert sorted(grew.values()) == [0, 5], grew  # all five on one replica: the one holding the prompt's blocks
    prompt = usages[0]["prompt_tokens"]
    assert prompt > 400
    for usage in usages[1:]:
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.75 * prompt, usages


def test_kv_routing_on_the_llm_api_path(llmapi_fleet):
    """TensorRT-LLM's LLM API gives its events in blocks of its own size (KvCacheConfig's default 32 here)."""
    before = _counts(llmapi_fleet)
    usages = [_chat(llmapi_fleet, LONG_PROMPT)["usage"] for _ in range(4)]
    after = _counts(llmapi_fleet)
    assert sorted(after[i] - before[i] for i in after) == [0, 4], (before, after)
    for usage in usages[1:]:
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.75 * usage["prompt_tokens"], usages


def test_round_robin_spreads_the_same_prompt_over_both_replicas(rr_fleet):
    before = _counts(rr_fleet)
    named = []
    for _ in range(4):
        response = _post(rr_fleet, "/v1/chat/completions", {"model": "embedded", "max_tokens": 4,
                                                            "messages": [{"role": "user", "content": LONG_PROMPT}]})
        assert response.status_code == 200, response.text
        named.append(response.headers["x-replica"])
    after = _counts(rr_fleet)
    grew = {i: after[i] - before[i] for i in after}
    assert len(grew) == 2 and all(n >= 1 for n in grew.values()), grew
    # Each response names the replica that took it: both appear, none more often than its engine served.
    instances = fleet_instances(rr_fleet)
    assert set(named) == {instances[i] for i in grew}, (named, instances)
    assert all(named.count(instances[i]) <= grew[i] for i in grew), (named, instances, grew)


# --- faults ------------------------------------------------------------------------------------------


def test_a_stopped_replica_leaves_the_fleet_and_rejoins(rr_fleet):
    replicas = _replica_processes(rr_fleet)
    assert len(replicas) == 2
    victim = replicas[0]
    descendants = victim.children(recursive=True)
    victim.send_signal(signal.SIGTERM)  # a clean stop: it leaves the fleet and stops its tritonserver
    victim.wait(60)
    _, alive = psutil.wait_procs(descendants, timeout=30)
    assert not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    # Meanwhile every request is served (by the other replica, or by this one once started again).
    for _ in range(6):
        assert _chat(rr_fleet, "Hello there")["choices"][0]["message"]["content"] is not None
    poll(lambda: len(_replica_processes(rr_fleet)) == 2, 60, what="the launcher starting the replica again")

    def both_serve() -> bool:  # back in the fleet: round robin reaches both replicas again
        before = _counts(rr_fleet)
        for _ in range(4):
            _chat(rr_fleet, "Hello again")
        after = _counts(rr_fleet)
        return len(after) == 2 and all(before.get(i, -1) >= 0 and after[i] > before[i] for i in after)

    poll(both_serve, STARTUP_TIMEOUT_S, interval_s=2.0, what="the restarted replica back in the fleet")


def test_a_killed_replica_ends_its_open_streams_and_the_others_serve(rr_fleet):
    assert len(_replica_processes(rr_fleet)) == 2
    body = {"model": "embedded", "stream": True, "max_tokens": 400, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Go on"}]}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(timeout=180) as client:
        # Two streams (round robin: usually one on each replica), both generating.
        with client.stream("POST", rr_fleet.url + "/v1/chat/completions", json=body, headers=headers) as first, \
                client.stream("POST", rr_fleet.url + "/v1/chat/completions", json=body, headers=headers) as second:
            streams = [first.iter_lines(), second.iter_lines()]
            for lines in streams:
                assert next(line for line in lines if line.startswith("data: "))
            # The replica each stream is on, as the fleet names it (x-replica); the first stream's is killed.
            named = [first.headers["x-replica"], second.headers["x-replica"]]
            by_instance = {instance: index for index, instance in fleet_instances(rr_fleet).items()}
            victim_index = by_instance[named[0]]
            on = {victim_index: named.count(named[0])}
            victim = psutil.Process(fleet_replica_pids(rr_fleet)[victim_index])
            doomed = victim.children(recursive=True)
            victim.kill()  # a crash: no goodbye to the fleet
            for process in doomed:  # its tritonserver would follow on the parent-death signal; at once here
                process.kill()
            rests = [[line for line in lines if line.startswith("data: ")] for lines in streams]
    errors = [rest for rest in rests if any('"error"' in line for line in rest)]
    done = [rest for rest in rests if rest and rest[-1] == "data: [DONE]" and not any('"error"' in l for l in rest)]
    # The killed replica's streams were told; any on the other replica finished.
    assert (len(errors), len(done)) == (on[victim_index], 2 - on[victim_index]), (named, rests)
    # New requests are served by the other replica (the router drops the dead one; the launcher restarts it).
    deadline = time.monotonic() + 30
    served = 0
    while served < 4 and time.monotonic() < deadline:
        response = _post(rr_fleet, "/v1/chat/completions",
                         {"model": "embedded", "messages": [{"role": "user", "content": "Still there?"}], "max_tokens": 2})
        served += response.status_code == 200
    assert served == 4


def _command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.NoSuchProcess:  # ZombieProcess included: ended, not yet reaped by its parent
        return ""


def test_stop_leaves_no_process(rr_fleet):
    # The killed replica of the test before may still be a zombie awaiting its restart: wait for both to run.
    poll(lambda: len(_replica_processes(rr_fleet)) == 2, STARTUP_TIMEOUT_S, what="both replicas running")
    launcher = psutil.Process(rr_fleet.process.pid)
    everything = launcher.children(recursive=True)
    commands = [_command(p) for p in everything]
    assert sum("fleet_replica" in c for c in commands) == 2 and any("tritonserver" in c for c in commands), commands
    launcher.send_signal(signal.SIGTERM)
    assert rr_fleet.process.wait(timeout=120) == 0, rr_fleet.log_tail()
    _, alive = psutil.wait_procs(everything, timeout=30)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
