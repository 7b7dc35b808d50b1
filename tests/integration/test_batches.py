"""Batches through the direct front (2 processes; frontend 0 runs them), with the official openai and
anthropic SDKs on the embedded default: a batch of lines for each endpoint (/v1/chat/completions,
/v1/completions, /v1/responses; Anthropic's /v1/messages) ends with every line answered once and its
custom_id kept; a bad line is its own error, not the batch's; cancel; another key's 404; and a restart
halfway (SIGTERM of the server mid-batch, started again on the same store file): the batch completes with
every line answered exactly once, counted in its output file.

One server for the module (restarted once by the restart test).
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from truss_serving import RestartableDirectFront, poll

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(900)]

KEY_A, KEY_B = "sk-batch-alice-1", "sk-batch-bob-2"
ENDED = ("completed", "failed", "cancelled", "expired")
BODIES = {
    "/v1/chat/completions": lambda i: {"model": "embedded", "max_tokens": 4, "temperature": 0.0,
                                       "messages": [{"role": "user", "content": f"Count to {i}."}]},
    "/v1/completions": lambda i: {"model": "embedded", "max_tokens": 4, "temperature": 0.0, "prompt": f"Number {i} is"},
    "/v1/responses": lambda i: {"model": "embedded", "max_output_tokens": 4, "temperature": 0.0, "store": False,
                                "input": f"Say {i}."},
}
OBJECT = {"/v1/chat/completions": "chat.completion", "/v1/completions": "text_completion", "/v1/responses": "response"}


class Served(RestartableDirectFront):
    def __init__(self, work: Path) -> None:
        super().__init__(work, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                                "TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES": "2",
                                "TRTLLM_RUNTIME__STORE__PATH": str(work / "store.sqlite3"),
                                "TRTLLM_RUNTIME__BATCHES__MAX_IN_FLIGHT": "2",
                                "TRTLLM_RUNTIME__BATCHES__POLL_S": "0.2"})

    def openai(self, key: str = KEY_A) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.proc.url + "/v1", api_key=key, max_retries=0, timeout=60)

    def anthropic(self, key: str = KEY_A) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.proc.url, api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    server = Served(tmp_path_factory.mktemp("batches"))
    try:
        yield server
    finally:
        server.proc.stop()


def _jsonl(endpoint: str, count: int, extra: list[dict] | None = None) -> bytes:
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": endpoint, "body": BODIES[endpoint](i)} for i in range(count)]
    return "".join(json.dumps(line) + "\n" for line in lines + (extra or [])).encode()


def _submit(client: openai.OpenAI, endpoint: str, count: int, extra: list[dict] | None = None):
    uploaded = client.files.create(file=("batch.jsonl", _jsonl(endpoint, count, extra)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.status == "processed"
    return client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h",
                                 metadata={"job": "test"})


def _ended(client: openai.OpenAI, batch_id: str, timeout_s: float = 300.0):
    return poll(lambda: (b := client.batches.retrieve(batch_id)).status in ENDED and b, timeout_s,
                what=f"batch {batch_id} ended")


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


@pytest.mark.parametrize("endpoint", list(BODIES))
def test_a_batch_of_each_endpoint_answers_every_line_once(served: Served, endpoint: str):
    client = served.openai()
    bad = {"custom_id": "bad-line", "method": "POST", "url": endpoint, "body": {**BODIES[endpoint](0), "temperature": -1}}
    batch = _submit(client, endpoint, 8, [bad])
    assert batch.status == "in_progress" and batch.request_counts.total == 9 and batch.metadata == {"job": "test"}
    done = _ended(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (8, 1)
    output, errors = _lines(client, done.output_file_id), _lines(client, done.error_file_id)
    assert Counter(line["custom_id"] for line in output) == Counter(f"line-{i}" for i in range(8))
    for line in output:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200 and line["response"]["request_id"]
        assert line["response"]["body"]["object"] == OBJECT[endpoint]
    assert [line["custom_id"] for line in errors] == ["bad-line"]
    assert errors[0]["response"]["status_code"] in (400, 422)
    assert "temperature" in errors[0]["response"]["body"]["error"]["message"]
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert batch.id in [b.id for b in client.batches.list(limit=100)]


def test_an_invalid_input_file_fails_the_batch_naming_the_line(served: Served):
    client = served.openai()
    uploaded = client.files.create(file=("bad.jsonl", b'{"custom_id": "a", "method": "POST", "url": "/v1/completions",'
                                         b' "body": {}}\nnot json\n'), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed"
    assert [(e.code, e.line) for e in batch.errors.data] == [("mismatched_endpoint", 1), ("invalid_json_line", 2)]
    with pytest.raises(openai.BadRequestError) as caught:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    assert caught.value.body["param"] == "endpoint"


def test_anthropic_message_batch(served: Served):
    client = served.anthropic()
    requests = [{"custom_id": f"msg-{i}", "params": {"model": "embedded", "max_tokens": 4, "temperature": 0.0,
                                                     "messages": [{"role": "user", "content": f"Hi {i}"}]}}
                for i in range(6)]
    requests.append({"custom_id": "bad", "params": {"model": "embedded", "max_tokens": 0, "messages": []}})
    batch = client.messages.batches.create(requests=requests)
    assert batch.processing_status == "in_progress" and batch.request_counts.processing == 7
    done = poll(lambda: (b := client.messages.batches.retrieve(batch.id)).processing_status == "ended" and b, 300.0,
                what="message batch ended")
    assert (done.request_counts.succeeded, done.request_counts.errored) == (6, 1)
    results = list(client.messages.batches.results(batch.id))
    assert Counter(r.custom_id for r in results) == Counter([f"msg-{i}" for i in range(6)] + ["bad"])
    for result in results:
        if result.custom_id == "bad":
            assert result.result.type == "errored"
            assert result.result.error.error.type == "invalid_request_error"
        else:
            assert result.result.type == "succeeded" and result.result.message.role == "assistant"
    assert batch.id in [b.id for b in client.messages.batches.list(limit=100)]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.batches.create(requests=[requests[0], requests[0]])
    assert "requests[1].custom_id" in caught.value.message
    assert client.messages.batches.delete(batch.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)


def test_cancel(served: Served):
    client = served.openai()
    batch = _submit(client, "/v1/completions", 40)
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelling"
    done = _ended(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert done.request_counts.completed < 40
    assert len(_lines(client, done.output_file_id)) == done.request_counts.completed
    finished = _ended(client, _submit(client, "/v1/completions", 1).id)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(finished.id)

    claude = served.anthropic()
    message_batch = claude.messages.batches.create(requests=[
        {"custom_id": f"c{i}", "params": {"model": "embedded", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}}
        for i in range(30)])
    assert claude.messages.batches.cancel(message_batch.id).processing_status == "canceling"
    ended = poll(lambda: (b := claude.messages.batches.retrieve(message_batch.id)).processing_status == "ended" and b,
                 300.0, what="message batch cancelled")
    counts = ended.request_counts
    assert counts.canceled > 0 and counts.succeeded + counts.errored + counts.canceled == 30
    kinds = Counter(r.result.type for r in claude.messages.batches.results(message_batch.id))
    assert kinds["canceled"] == counts.canceled and sum(kinds.values()) == 30


def test_another_keys_batches_and_files_are_not_found(served: Served):
    alice, bob = served.openai(KEY_A), served.openai(KEY_B)
    batch = _submit(alice, "/v1/chat/completions", 1)
    for call in (lambda: bob.batches.retrieve(batch.id), lambda: bob.batches.cancel(batch.id),
                 lambda: bob.files.retrieve(batch.input_file_id), lambda: bob.files.content(batch.input_file_id),
                 lambda: bob.files.delete(batch.input_file_id),
                 lambda: bob.batches.create(input_file_id=batch.input_file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in [b.id for b in bob.batches.list(limit=100)]
    assert batch.input_file_id not in [f.id for f in bob.files.list()]
    message_batch = served.anthropic(KEY_A).messages.batches.create(requests=[
        {"custom_id": "x", "params": {"model": "embedded", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}}])
    with pytest.raises(anthropic.NotFoundError):
        served.anthropic(KEY_B).messages.batches.retrieve(message_batch.id)
    _ended(alice, batch.id)


def test_a_restart_halfway_answers_every_line_exactly_once(served: Served):
    client = served.openai()
    count = 60
    lines = [{"custom_id": f"long-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "embedded", "max_tokens": 32, "ignore_eos": True,
                       "messages": [{"role": "user", "content": f"Tell a story about {i}."}]}} for i in range(count)]
    uploaded = client.files.create(file=("long.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()),
                                   purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    halfway = poll(lambda: (b := client.batches.retrieve(batch.id)).request_counts.completed >= 6 and b, 300.0,
                   what="6 lines answered")
    assert halfway.status == "in_progress" and halfway.request_counts.completed < count
    served.proc.stop()  # SIGTERM to the server's process group, lines on the engine
    served.start()
    client = served.openai()
    done = _ended(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (count, count, 0)
    output = _lines(client, done.output_file_id)
    assert Counter(line["custom_id"] for line in output) == Counter(f"long-{i}" for i in range(count))
    assert len({line["response"]["request_id"] for line in output}) == count
    assert all(line["response"]["body"]["usage"]["completion_tokens"] == 32 for line in output)
    # The restarted runner ran only what had no answer: more than none, fewer than all.
    log = (served.work / f"direct-{served.starts}.log").read_text(errors="replace")
    resumed = re.search(rf"batch {batch.id}: (\d+) of {count} lines to run", log)
    assert resumed is not None, log[-3000:]
    assert 0 < int(resumed.group(1)) <= count - halfway.request_counts.completed


def test_a_responses_line_stores_its_response_as_the_batch_owners(served: Served):
    client = served.openai()
    line = {"custom_id": "kept", "method": "POST", "url": "/v1/responses",
            "body": {"model": "embedded", "max_output_tokens": 4, "temperature": 0.0, "input": "Hello."}}
    uploaded = client.files.create(file=("r.jsonl", (json.dumps(line) + "\n").encode()), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h")
    done = _ended(client, batch.id)
    (output,) = _lines(client, done.output_file_id)
    response_id = output["response"]["body"]["id"]
    assert client.responses.retrieve(response_id).id == response_id  # stored (the default), the owner's
    with pytest.raises(openai.NotFoundError):
        served.openai(KEY_B).responses.retrieve(response_id)


def _requests_in_flight(url: str) -> int:
    """Requests on the engine (running and waiting, every frontend's: batch lines count too), from /metrics."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return round(sum(float(m.group(1)) for m in re.finditer(
        r"^trtllm_num_requests_(?:running|waiting)\{[^}]*\} ([0-9.e+]+)$", text, re.MULTILINE)))


def test_the_batch_takes_one_line_at_a_time_beside_an_interactive_request(served: Served):
    """The module's server runs 2 batch lines on an idle host (max_in_flight 2) and 1 while interactive
    requests are in flight (max_in_flight_under_load's default): with one long interactive stream open, the
    engine settles at that stream and one batch line."""
    client, url = served.openai(), served.proc.url
    lines = [{"custom_id": f"share-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "embedded", "max_tokens": 16, "ignore_eos": True,
                       "messages": [{"role": "user", "content": f"Describe {i}."}]}} for i in range(400)]
    uploaded = client.files.create(file=("share.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()),
                                   purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    poll(lambda: _requests_in_flight(url) == 2, 120.0, what="the idle share: 2 batch lines on the engine")
    ended = threading.Event()

    def interactive() -> None:
        body = {"model": "embedded", "stream": True, "max_tokens": 500, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Tell a long story."}]}
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300,
                              headers={"Authorization": f"Bearer {KEY_A}"}) as response:
                for _ in response.iter_lines():
                    pass
        finally:
            ended.set()

    stream = threading.Thread(target=interactive)
    stream.start()
    try:
        settled = []  # consecutive scrapes reading the stream and one batch line

        def one_line_beside_the_stream() -> bool:
            settled.append(_requests_in_flight(url) == 2 and not ended.is_set())
            return settled[-5:] == [True] * 5

        poll(lambda: ended.is_set() or one_line_beside_the_stream(), 240.0, what="one batch line beside the stream")
        assert settled[-5:] == [True] * 5, "the interactive stream ended before the batch's share settled at 1 line"
    finally:
        stream.join(timeout=300)
        client.batches.cancel(batch.id)
        _ended(client, batch.id)


def test_active_batches_on_metrics(served: Served):
    text = httpx.get(served.proc.url + "/metrics", timeout=30).text
    assert 'trtllm_batches_active{model_name="model",status="in_progress"}' in text
    assert "trtllm_batch_lines_pending" in text
