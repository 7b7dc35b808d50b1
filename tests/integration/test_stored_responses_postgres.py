"""Stored responses on several replicas: two direct fronts (each its own stack, as two hosts would run) pointed
at one PostgreSQL server (Debian's, started on loopback for the module; skipped where it is absent), its
connection string in a truss secret. A chain of turns alternates between the replicas; a background
response made on one is polled and cancelled on the other; both report the same store on /metrics."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from postgres_server import postgres_binaries, postgres_server
from trtllm_truss.fronts.direct import start_direct_server
from trtllm_truss.fronts.truss_server import TrussServer
from truss_serving import REPO_ROOT, STARTUP_TIMEOUT_S, front_ready, poll

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(900)]

GREEDY = {"model": "embedded", "temperature": 0.0, "max_output_tokens": 8}
SECRET_URL_PASSWORD = "store-pass-9931"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory) -> Iterator[list[TrussServer]]:
    if postgres_binaries() is None:
        pytest.skip("PostgreSQL is not installed (scripts/bootstrap.sh installs Debian's postgresql as root)")
    pytest.importorskip("psycopg")
    work = tmp_path_factory.mktemp("replicas")
    with postgres_server(tmp_path_factory.mktemp("postgres")) as url:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:  # a password, as a real server's role has
            conn.execute(f"ALTER ROLE store PASSWORD '{SECRET_URL_PASSWORD}'")
        with_password = url.replace("store@", f"store:{SECRET_URL_PASSWORD}@")
        env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES": "1",
               "TRTLLM_RUNTIME__STORE__BACKEND": "postgres", "TRTLLM_RUNTIME__STORE__URL_SECRET": "store_url",
               "TRUSS_SECRET_store_url": with_password}
        servers = [start_direct_server(REPO_ROOT, work / f"replica-{i}.log", env=env) for i in range(2)]
        try:
            for server in servers:
                poll(lambda: server.process.poll() is not None or front_ready(server.url), STARTUP_TIMEOUT_S, what="replica ready")
                assert server.process.poll() is None, server.log_tail()
            yield servers
        finally:
            for server in servers:
                server.stop()
        for server in servers:
            assert SECRET_URL_PASSWORD not in server.log_path.read_text(errors="replace")


def _client(server: TrussServer, key: str = "sk-fleet-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def test_a_chain_alternates_between_replicas(replicas: list[TrussServer]):
    previous = None
    tokens = []
    for turn in range(4):
        client = _client(replicas[turn % 2])
        response = client.responses.create(input=f"Turn {turn}: tell me more.", previous_response_id=previous, **GREEDY)
        tokens.append(response.usage.input_tokens)
        previous = response.id
    assert tokens == sorted(tokens) and len(set(tokens)) == 4  # each turn rendered after all the earlier ones
    assert _client(replicas[0]).responses.retrieve(previous).id == previous  # made on replica 1, read on 0
    with pytest.raises(openai.NotFoundError):
        _client(replicas[0], "sk-fleet-b").responses.retrieve(previous)


def test_a_background_response_is_polled_and_cancelled_on_another_replica(replicas: list[TrussServer]):
    long = {**GREEDY, "max_output_tokens": 500, "extra_body": {"ignore_eos": True}}
    started = _client(replicas[0]).responses.create(input="Count.", background=True, **long)
    other = _client(replicas[1])
    assert other.responses.cancel(started.id).status == "cancelled"
    done = _client(replicas[1]).responses.create(input="Hi.", background=True, **GREEDY)
    final = poll(lambda: (r := _client(replicas[0]).responses.retrieve(done.id)).status not in ("queued", "in_progress") and r,
                 120, what="the background response ended")
    assert final.status in ("completed", "incomplete") and final.output_text
    assert _client(replicas[0]).responses.retrieve(started.id).status == "cancelled"


def test_both_replicas_report_the_one_store(replicas: list[TrussServer]):
    def objects(server: TrussServer) -> float:
        text = httpx.get(server.url + "/metrics", timeout=30).text
        return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("trtllm_store_objects"))

    _client(replicas[1]).responses.create(input="Counted.", **GREEDY)
    assert objects(replicas[0]) == objects(replicas[1]) >= 1
