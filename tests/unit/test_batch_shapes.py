"""What comes into a batch is checked naming the field or the line, and what goes out has each API's shape."""

from __future__ import annotations

import json

import pytest
from fastapi import HTTPException
from trtllm_truss.api import batches as shapes


def _line(custom_id="a", url="/v1/chat/completions", body=None, **extra) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body or {"messages": []}, **extra})


def test_openai_lines_are_checked_line_by_line():
    text = "\n".join([_line("a"), "not json", _line("a"), _line("b", url="/v1/completions"), _line("c", method="GET"),
                      json.dumps({"custom_id": "d", "url": "/v1/chat/completions", "body": "x"}), "", _line("e")])
    lines, errors = shapes.parse_openai_lines(text, "/v1/chat/completions", max_lines=100)
    assert [line["custom_id"] for line in lines] == ["a", "e"]
    assert [(e["line"], e["code"], e["param"]) for e in errors] == [
        (2, "invalid_json_line", None), (3, "duplicate_custom_id", "custom_id"), (4, "mismatched_endpoint", "url"),
        (5, "invalid_request", "method"), (6, "invalid_request", "body")]
    _, errors = shapes.parse_openai_lines(_line("a") + "\n" + _line("b"), "/v1/chat/completions", max_lines=1)
    assert [e["code"] for e in errors] == ["too_many_requests"]
    assert shapes.parse_openai_lines("\n", "/v1/chat/completions", 10)[1][0]["code"] == "empty_file"


@pytest.mark.parametrize(("body", "field"), [
    ({"endpoint": "/v1/chat/completions", "completion_window": "24h"}, "input_file_id"),
    ({"input_file_id": "f", "endpoint": "/v1/embeddings", "completion_window": "24h"}, "endpoint"),
    ({"input_file_id": "f", "endpoint": "/v1/completions", "completion_window": "1h"}, "completion_window"),
    ({"input_file_id": "f", "endpoint": "/v1/completions", "completion_window": "24h", "metadata": {"k": 1}}, "metadata"),
])
def test_a_bad_openai_create_names_the_field(body, field):
    with pytest.raises(HTTPException) as caught:
        shapes.check_openai_create(body)
    assert caught.value.status_code == 400 and f": {field}: " in caught.value.detail


@pytest.mark.parametrize(("requests", "field"), [
    ([], "requests"),
    ([{"custom_id": "has space", "params": {}}], "requests[0].custom_id"),
    ([{"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}], "requests[1].custom_id"),
    ([{"custom_id": "a"}], "requests[0].params"),
    ([{"custom_id": "a", "params": {"stream": True}}], "requests[0].params.stream"),
])
def test_a_bad_anthropic_create_names_the_field(requests, field):
    with pytest.raises(HTTPException) as caught:
        shapes.parse_anthropic_requests({"requests": requests}, max_lines=10)
    assert f": {field}: " in caught.value.detail


def test_the_objects_of_each_api():
    record = shapes.new_record("openai", "/v1/completions", 5, input_file_id="file-1")
    shapes.stamp(record, "in_progress")
    record["counts"] = {"succeeded": 2, "errored": 1}
    batch = shapes.openai_batch("batch_1", "in_progress", record)
    assert batch["request_counts"] == {"total": 5, "completed": 2, "failed": 1}
    assert batch["object"] == "batch" and isinstance(batch["in_progress_at"], int) and batch["completed_at"] is None
    shapes.stamp(record, "cancelling")
    shapes.stamp(record, "cancelled")
    message_batch = shapes.anthropic_batch("msgbatch_1", "cancelled", record, "/results")
    assert message_batch["processing_status"] == "ended" and message_batch["results_url"] == "/results"
    assert message_batch["request_counts"] == {"processing": 0, "succeeded": 2, "errored": 1, "canceled": 2, "expired": 0}
    assert message_batch["ended_at"].endswith("Z") and message_batch["cancel_initiated_at"] is not None
    running = shapes.anthropic_batch("msgbatch_1", "in_progress", record, "/results")
    assert running["request_counts"]["processing"] == 2 and running["results_url"] is None
    kept = shapes.answer("x", 200, {"id": "m"})
    assert shapes.openai_output_line("batch_ab", 3, kept)["id"] == "batch_req_ab0000003"
    assert shapes.anthropic_result_line("x", kept, "completed")["result"] == {"type": "succeeded", "message": {"id": "m"}}
    assert shapes.anthropic_result_line("x", None, "expired")["result"] == {"type": "expired"}


def test_pages():
    items = [{"id": str(i)} for i in range(5)]
    assert shapes.page(items, after=None, before=None, limit=2) == ([{"id": "0"}, {"id": "1"}], True)
    assert shapes.page(items, after="3", before=None, limit=2) == ([{"id": "4"}], False)
    assert shapes.page(items, after=None, before="3", limit=2) == ([{"id": "1"}, {"id": "2"}], True)
    with pytest.raises(HTTPException):
        shapes.page(items, after=None, before=None, limit=0)
