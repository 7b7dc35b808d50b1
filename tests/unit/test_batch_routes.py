"""The batch routes over a real SQLite store, in-process (starlette's test client; no engine: nothing here
runs a line): what each refusal answers, in each API's shape naming the field, and the lists' pages."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient
from trtllm_truss.config.batches import BatchesConfig
from trtllm_truss.serving.batches import BatchRoutes
from trtllm_truss.store.sqlite import SqliteStore

ALICE = {"Authorization": "Bearer sk-alice"}
LINE = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Hi", "max_tokens": 2}}


def _client(tmp_path, store=True, **config) -> TestClient:
    routes = BatchRoutes(SqliteStore(tmp_path / "s.sqlite3", ttl_s=3600.0, max_bytes=1 << 24) if store else None,
                         BatchesConfig(**config))
    return TestClient(Starlette(routes=[Route(p, e, methods=[m]) for p, e, m in routes.routes()]))


def _upload(client: TestClient, data: bytes, purpose: str = "batch"):
    return client.post("/v1/files", headers=ALICE, files={"file": ("in.jsonl", data)}, data={"purpose": purpose})


def test_files_refusals_name_the_field(tmp_path):
    client = _client(tmp_path, max_file_bytes=2048)
    refused = _upload(client, b"{}\n", purpose="fine-tune")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "purpose"
    refused = _upload(client, b"x" * 4096)
    assert refused.status_code == 413 and refused.json()["error"]["param"] == "file"
    refused = _upload(client, b"\xff\xfe")
    assert refused.status_code == 400 and "UTF-8" in refused.json()["error"]["message"]
    refused = client.post("/v1/files", headers=ALICE, json={"purpose": "batch"})
    assert refused.status_code == 400 and "multipart" in refused.json()["error"]["message"]


def test_files_list_pages_and_delete(tmp_path):
    client = _client(tmp_path)
    ids = [_upload(client, (json.dumps(LINE) + "\n").encode()).json()["id"] for _ in range(3)]
    first = client.get("/v1/files", headers=ALICE, params={"limit": 2}).json()
    assert [f["id"] for f in first["data"]] == ids[::-1][:2] and first["has_more"]
    rest = client.get("/v1/files", headers=ALICE, params={"limit": 2, "after": first["last_id"]}).json()
    assert [f["id"] for f in rest["data"]] == ids[:1] and not rest["has_more"]
    assert client.get("/v1/files", headers=ALICE, params={"limit": 0}).json()["error"]["param"] == "limit"
    assert client.delete(f"/v1/files/{ids[0]}", headers=ALICE).json() == {"id": ids[0], "object": "file", "deleted": True}
    assert client.get(f"/v1/files/{ids[0]}/content", headers=ALICE).status_code == 404
    assert client.get(f"/v1/files/{ids[1]}", headers={"Authorization": "Bearer sk-bob"}).status_code == 404


def test_an_anthropic_batch_in_progress_has_no_results_and_cannot_be_deleted(tmp_path):
    client = _client(tmp_path)
    made = client.post("/v1/messages/batches", headers={"x-api-key": "sk-alice"}, json={"requests": [
        {"custom_id": "a", "params": {"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}}]})
    assert made.status_code == 200 and made.json()["processing_status"] == "in_progress"
    batch_id = made.json()["id"]
    for method, path in (("GET", f"/v1/messages/batches/{batch_id}/results"), ("DELETE", f"/v1/messages/batches/{batch_id}")):
        refused = client.request(method, path, headers={"x-api-key": "sk-alice"})
        assert refused.status_code == 400 and refused.json()["type"] == "error", path
    assert client.get(f"/v1/messages/batches/{batch_id}", headers={"x-api-key": "sk-bob"}).json()["error"]["type"] == "not_found_error"
    # An OpenAI route does not show an Anthropic batch, nor the other way round.
    assert client.get(f"/v1/batches/{batch_id}", headers={"Authorization": "Bearer sk-alice"}).status_code == 404
    cancelled = client.post(f"/v1/messages/batches/{batch_id}/cancel", headers={"x-api-key": "sk-alice"}).json()
    assert cancelled["processing_status"] == "canceling" and cancelled["cancel_initiated_at"]


def test_a_body_over_the_bound_is_413(tmp_path):
    client = _client(tmp_path, max_file_bytes=1024)
    big = {"requests": [{"custom_id": f"r{i}", "params": {"max_tokens": 2, "messages": []}} for i in range(100)]}
    assert client.post("/v1/messages/batches", headers={"x-api-key": "k"}, json=big).status_code == 413


@pytest.mark.parametrize("store, enabled", [(False, True), (True, False)])
def test_off_is_404(tmp_path, store, enabled):
    client = _client(tmp_path, store=store, enabled=enabled)
    assert client.get("/v1/batches", headers=ALICE).status_code == 404
    assert client.get("/v1/messages/batches", headers=ALICE).json()["type"] == "error"


def test_active_batches_on_metrics(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest
    from trtllm_truss.serving.batch_metrics import BatchCollector

    store = SqliteStore(tmp_path / "s.sqlite3", ttl_s=3600.0, max_bytes=1 << 24)
    routes = BatchRoutes(store, BatchesConfig())
    client = TestClient(Starlette(routes=[Route(p, e, methods=[m]) for p, e, m in routes.routes()]))
    requests = [{"custom_id": f"r{i}", "params": {"max_tokens": 2, "messages": []}} for i in range(3)]
    assert client.post("/v1/messages/batches", headers={"x-api-key": "k"}, json={"requests": requests}).status_code == 200
    registry = CollectorRegistry()
    registry.register(BatchCollector(store))
    text = generate_latest(registry).decode()
    assert 'trtllm_batches_active{model_name="model",status="in_progress"} 1.0' in text
    assert 'trtllm_batch_lines_pending{model_name="model"} 3.0' in text
