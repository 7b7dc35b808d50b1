"""What the direct front guarantees beyond the SDK suites (which run against both fronts): an API key from a
truss secret (401 in each dialect's shape, never logged, in no child), metrics summed over its processes,
readiness 503 in every process while tritonserver is down, and a truss written by `init --front direct`
that truss validates and whose start_command serves it.

One server for the module: the embedded default with two frontends and a declared secret as API key.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import yaml
from trtllm_truss.cli import main
from trtllm_truss.fronts.direct import start_direct_server
from trtllm_truss.fronts.truss_server import TrussServer, free_port
from truss_serving import REPO_ROOT, STARTUP_TIMEOUT_S, front_ready, poll

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(600)]

API_KEY = "sk-direct-front-key-31337"
SECRET_ENV = {
    # config.yaml declares hf_access_token; the key is served from it (TRTLLM_RUNTIME__DIRECT_FRONT__API_KEY_SECRET)
    "TRUSS_SECRET_hf_access_token": API_KEY,
    "HF_TOKEN": "hf_processenvTOKEN1234567",
    "AWS_SECRET_ACCESS_KEY": "process/env+secret==",
}
FRONTENDS = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[TrussServer]:
    work = tmp_path_factory.mktemp("direct_front")
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **SECRET_ENV,
           "TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES": str(FRONTENDS),
           # One connection fills a frontend (fronts.accept): held connections reach both (from_every_frontend).
           "TRTLLM_RUNTIME__DIRECT_FRONT__FILL_CONNECTIONS": "1",
           "TRTLLM_RUNTIME__DIRECT_FRONT__API_KEY_SECRET": "hf_access_token"}
    proc = start_direct_server(REPO_ROOT, work / "direct.log", env=env)
    try:
        poll(lambda: proc.process.poll() is not None or front_ready(proc.url), STARTUP_TIMEOUT_S, what="direct front ready")
        assert proc.process.poll() is None, proc.log_tail()
        yield proc
    finally:
        proc.stop()


def _auth(key: str = API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def frontends(server: TrussServer) -> list[psutil.Process]:
    """The frontend processes alive now: a killed one the launcher has not reaped yet (a zombie) is not."""
    alive = []
    for process in psutil.Process(server.process.pid).children():
        try:
            if "trtllm_truss.fronts.direct_app" in process.cmdline():
                alive.append(process)
        except psutil.NoSuchProcess:  # ZombieProcess included
            pass
    return alive


# ------------------------------------------------------------------------------------------- API key

ROUTES = [
    ("/v1/models/model:predict", {"prompt": "Hi", "max_tokens": 4}, lambda body: isinstance(body["error"], str)),
    ("/predict", {"prompt": "Hi", "max_tokens": 4}, lambda body: isinstance(body["error"], str)),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4}, lambda body: body["error"]["code"] == "invalid_api_key"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
     lambda body: body["error"]["code"] == "invalid_api_key"),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 4}, lambda body: body["error"]["code"] == "invalid_api_key"),
    ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
     lambda body: body["type"] == "error" and body["error"]["type"] == "authentication_error"),
]


@pytest.mark.parametrize("path, body, shaped", ROUTES, ids=[r[0] for r in ROUTES])
def test_each_route_needs_the_key_and_refuses_in_its_own_shape(server: TrussServer, path, body, shaped):
    for headers in ({}, _auth("wrong"), {"Authorization": API_KEY}):
        refused = httpx.post(server.url + path, json=body, headers=headers, timeout=30)
        assert refused.status_code == 401 and shaped(refused.json()), (headers, refused.text)
    assert httpx.post(server.url + path, json=body, headers=_auth(), timeout=60).status_code == 200


def test_stored_responses_need_the_key_and_belong_to_it(server: TrussServer):
    stored = httpx.post(server.url + "/v1/responses", json={"input": "Hi", "max_output_tokens": 4}, headers=_auth(), timeout=60)
    assert stored.status_code == 200, stored.text
    path = f"/v1/responses/{stored.json()['id']}"
    for method, suffix in (("GET", ""), ("DELETE", ""), ("GET", "/input_items"), ("POST", "/cancel")):
        refused = httpx.request(method, server.url + path + suffix, headers=_auth("wrong"), timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", (method, suffix)
    assert httpx.get(server.url + "/v1/conversations/conv_x", timeout=30).status_code == 401
    assert httpx.get(server.url + path, headers=_auth(), timeout=30).json()["id"] == stored.json()["id"]


def test_batch_routes_need_the_key(server: TrussServer):
    for method, path in (("GET", "/v1/files"), ("POST", "/v1/files"), ("GET", "/v1/batches"), ("POST", "/v1/batches"),
                         ("GET", "/v1/batches/batch_x"), ("POST", "/v1/batches/batch_x/cancel")):
        refused = httpx.request(method, server.url + path, headers=_auth("wrong"), timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", (method, path)
    refused = httpx.get(server.url + "/v1/messages/batches", headers={"x-api-key": "wrong"}, timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server.url + "/v1/messages/batches", headers={"x-api-key": API_KEY}, timeout=30).status_code == 200
    assert httpx.get(server.url + "/v1/batches", headers=_auth(), timeout=30).json()["object"] == "list"


def test_sdks_send_the_key_and_health_stays_open(server: TrussServer):
    assert httpx.get(server.url + "/v1/models", timeout=10).status_code == 401
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    assert [m.id for m in client.models.list()] == ["embedded", "pirate"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()
    anthropic = pytest.importorskip("anthropic")
    claude = anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)  # sends x-api-key
    assert claude.messages.create(model="embedded", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]).content
    for path in ("/health/ready", "/health/live", "/v1/models/model", "/metrics"):  # probes carry no key
        assert httpx.get(server.url + path, timeout=10).status_code == 200, path


def test_no_secret_in_any_child_and_the_key_is_never_logged(server: TrussServer):
    children = psutil.Process(server.process.pid).children(recursive=True)
    kinds = {"direct_app": 0, "tritonserver": 0, "triton_python_backend_stub": 0, "streaming.worker": 0}
    for child in children:
        command = " ".join(child.cmdline())
        for kind in kinds:
            kinds[kind] += kind in command
        environ = Path(f"/proc/{child.pid}/environ").read_bytes()
        leaked = [name for name, value in SECRET_ENV.items() if value.encode() in environ]
        assert not leaked, (command[:120], leaked)
        # grpc's EventEngine client off in the processes that stream from Triton, and only there
        if "GRPC_EXPERIMENTS" not in os.environ:  # else the user's value reaches every child
            assert (b"GRPC_EXPERIMENTS=-event_engine_client\0" in environ) == ("direct_app" in command), command[:120]
    assert kinds["direct_app"] == FRONTENDS and kinds["tritonserver"] and kinds["triton_python_backend_stub"], kinds
    assert kinds["streaming.worker"] == 0, kinds  # each frontend streams on its own event loop
    environ = Path(f"/proc/{server.process.pid}/environ").read_bytes()
    assert API_KEY.encode() in environ  # the launcher holds it: the check above could see a leak
    assert API_KEY not in server.log_path.read_text(errors="replace")


# ------------------------------------------------------------------------------------------- metrics


def _successes(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("trtllm_request_success_total{"))


def test_metrics_are_the_sum_over_the_processes_whichever_answers(server: TrussServer):
    before = _successes(httpx.get(server.url + "/metrics", timeout=10).text)

    def complete(client: httpx.Client) -> httpx.Response:
        return client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=_auth(), timeout=60)

    answers = from_every_frontend(server, complete)
    assert all(answer.status_code == 200 for answer in answers)
    for _ in range(6):  # whichever frontend answers /metrics (a new connection each)
        assert _successes(httpx.get(server.url + "/metrics", timeout=10).text) == before + len(answers)


# --------------------------------------------------------------------------------------- readiness


def test_readiness_is_503_in_every_process_while_tritonserver_is_down(server: TrussServer):
    (triton,) = server.descendants("tritonserver")
    os.kill(triton.pid, signal.SIGKILL)
    poll(lambda: httpx.get(server.url + "/health/ready", timeout=5).status_code == 503, 10, 0.02, "readiness 503")
    statuses = [answer.status_code for answer in from_every_frontend(server, lambda c: c.get("/health/ready", timeout=5))]
    assert set(statuses) <= {503}, statuses  # none may say ready
    assert httpx.get(server.url + "/health/live", timeout=5).status_code == 200  # restarting, not dead
    poll(lambda: front_ready(server.url), STARTUP_TIMEOUT_S, 0.2, "ready again after the restart")
    answer = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=_auth(), timeout=60)
    assert answer.status_code == 200


# ---------------------------------------------------------------------- which frontend takes a connection


def test_a_killed_frontend_is_replaced_and_connections_are_served_meanwhile(server: TrussServer):
    """Killed, a frontend stops counting for new connections (the launcher clears its slot, fronts.accept):
    the other takes them until it is started again, and then it takes its share again."""
    before = {p.pid for p in frontends(server)}
    first = min(before)  # frontend 0, the first to fill
    os.kill(first, signal.SIGKILL)
    for _ in range(4):  # a new connection each, right after the kill
        answer = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=_auth(),
                            timeout=30)
        assert answer.status_code == 200
    poll(lambda: len(frontends(server)) == FRONTENDS and first not in {p.pid for p in frontends(server)},
         30, 0.1, "frontend 0 started again")
    (again,) = {p.pid for p in frontends(server)} - before
    poll(lambda: f"serving (pid {again}," in server.log_path.read_text(errors="replace"), STARTUP_TIMEOUT_S, 0.2,
         "the new frontend serving")
    answers = from_every_frontend(server, lambda c: c.get("/health/ready", timeout=5))
    assert [a.status_code for a in answers] == [200] * len(answers)


def from_every_frontend(server: TrussServer, request: Callable[[httpx.Client], httpx.Response]) -> list[httpx.Response]:
    """`request` on new connections, each held open, until every frontend has answered one: the fixture's
    `fill_connections` 1 hands the next connection to a frontend holding the fewest, whatever connections
    earlier tests left open."""
    pids = {p.pid for p in frontends(server)}
    answered: set[int] = set()
    answers, clients = [], []
    try:
        while answered != pids:
            assert len(clients) < 12, f"frontends {sorted(pids - answered)} took none of {len(clients)} connections"
            clients.append(httpx.Client(base_url=server.url))
            answer = request(clients[-1])
            answers.append(answer)
            answered.add(_frontend_of(server, answer))
    finally:
        for client in clients:
            client.close()
    return answers


def _frontend_of(server: TrussServer, answer: httpx.Response) -> int:
    """The pid of the frontend holding the connection `answer` came on (still open)."""
    client_port = answer.extensions["network_stream"].get_extra_info("client_addr")[1]
    for process in frontends(server):
        if any(c.raddr and c.raddr.port == client_port for c in process.net_connections("tcp")):
            return process.pid
    raise AssertionError(f"no frontend holds the connection from port {client_port}")


# ---------------------------------------------------------------------------------- init --front direct


@pytest.mark.timeout(420)
def test_init_front_direct_start_command_serves_the_truss(tmp_path: Path):
    truss_dir = tmp_path / "direct-truss"
    assert main(["init", str(truss_dir), "--front", "direct", "--from", "llama3.1-8b-fp8-h100"]) == 0
    config = yaml.safe_load((truss_dir / "config.yaml").read_text())
    server = config["docker_server"]
    # The embedded default's model section, and its data, in place of the GPU example's: CPU-servable.
    embedded = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())
    config["model_metadata"] = embedded["model_metadata"]
    (truss_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copytree(REPO_ROOT / "data", truss_dir / "data")
    port = free_port()
    command = shlex.split(server["start_command"].replace(f"--port {server['server_port']}", f"--port {port}"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": "",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    log = tmp_path / "start_command.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=truss_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        assert server["readiness_endpoint"] == "/health/ready"
        poll(lambda: process.poll() is not None or front_ready(url), STARTUP_TIMEOUT_S, what="start_command serving")
        assert process.poll() is None, log.read_text()[-3000:]
        assert httpx.get(url + server["liveness_endpoint"], timeout=5).status_code == 200
        answer = httpx.post(url + server["predict_endpoint"], json={"prompt": "Hi", "max_tokens": 4, "stream": False},
                            timeout=60)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
        # served from the folder's own packages/, not this checkout's
        fronts = [p for p in psutil.Process(process.pid).children() if "direct_app" in " ".join(p.cmdline())]
        assert fronts and all(str(truss_dir / "packages") in Path(f"/proc/{p.pid}/environ").read_text(errors="replace")
                              for p in fronts)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
