"""OpenAI's Batch API (`/v1/files`, `/v1/batches`) and Anthropic's Message Batches (`/v1/messages/batches`):
their inputs checked, their objects and their result lines shaped. Nothing here runs or stores anything
(`serving.batches` does).

A batch is kept as one record (`new_record`) whatever the API: its lines' endpoint, its times, the counts
of its answered lines, the runner that holds it. Its status is OpenAI's (validating, in_progress,
finalizing, completed, failed, cancelling, cancelled, expired); Anthropic's `processing_status` is read
from it (`ANTHROPIC_STATUS`). Each line's answer is kept as its own record (`answer`): the status code and
body the line's route answered, which each API renders its way (`openai_output_line`, `anthropic_result_line`).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from trtllm_truss.api.errors import encodable, field_error

OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
MESSAGES_ENDPOINT = "/v1/messages"
COMPLETION_WINDOWS = {"24h": 24 * 3600.0}
ANTHROPIC_WINDOW_S = 24 * 3600.0  # Anthropic: a batch ends within 24 hours, expired past them
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # Anthropic's pattern for a request's custom_id
MAX_CUSTOM_ID = 512
MAX_LIST_LIMIT = 100
DEFAULT_LIST_LIMIT = 20

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")  # the runner's
ENDED = ("completed", "failed", "cancelled", "expired")
CANCELLABLE = ("validating", "in_progress")
ANTHROPIC_STATUS = {
    "validating": "in_progress", "in_progress": "in_progress", "finalizing": "in_progress",
    "cancelling": "canceling", "completed": "ended", "failed": "ended", "cancelled": "ended", "expired": "ended",
}
_TIME_OF = {"in_progress": "in_progress_at", "finalizing": "finalizing_at", "completed": "completed_at",
            "failed": "failed_at", "expired": "expired_at", "cancelling": "cancelling_at", "cancelled": "cancelled_at"}


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def stamp(body: dict[str, Any], status: str, now: float | None = None) -> None:
    """Note in a batch record when it entered `status` (the first time)."""
    key = _TIME_OF.get(status)
    if key is not None:
        body["times"].setdefault(key, now or time.time())


def new_record(api: str, endpoint: str, lines: int, *, input_file_id: str | None = None,
               completion_window: str = "24h", metadata: Mapping[str, Any] | None = None,
               errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    now = time.time()
    window = COMPLETION_WINDOWS.get(completion_window, ANTHROPIC_WINDOW_S)
    return {
        "api": api, "endpoint": endpoint, "lines": lines, "input_file_id": input_file_id,
        "completion_window": completion_window, "metadata": dict(metadata) if metadata else None,
        "created_at": now, "expires_at": now + window, "times": {}, "errors": errors,
        "output_file_id": None, "error_file_id": None, "counts": {"succeeded": 0, "errored": 0},
        "unrun": 0, "runner": None, "lease_until": 0.0,
    }


# --- checking what comes in --------------------------------------------------------------------------


def check_openai_create(body: Any) -> tuple[str, str, str, dict[str, Any] | None]:
    """(input_file_id, endpoint, completion_window, metadata) of a `POST /v1/batches` body; 400 naming the field."""
    if not isinstance(body, Mapping):
        raise field_error("body", "expected a JSON object")
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise field_error("input_file_id", "required: the id of a file uploaded with purpose batch")
    endpoint = body.get("endpoint")
    if endpoint not in OPENAI_ENDPOINTS:
        raise field_error("endpoint", f"must be one of {', '.join(OPENAI_ENDPOINTS)} (got {str(endpoint)[:80]!r})")
    window = body.get("completion_window")
    if window not in COMPLETION_WINDOWS:
        raise field_error("completion_window", f"must be one of {', '.join(COMPLETION_WINDOWS)} (got {str(window)[:40]!r})")
    metadata = body.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, Mapping) or len(metadata) > 16
        or any(not isinstance(k, str) or len(k) > 64 or not isinstance(v, str) or len(v) > 512 for k, v in metadata.items())
    ):
        raise field_error("metadata", "at most 16 string keys (64 characters) with string values (512 characters)")
    return file_id, endpoint, window, dict(metadata) if metadata else None


def parse_openai_lines(text: str, endpoint: str, max_lines: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The requests of a batch's JSONL input (`{custom_id, method, url, body}` a line), or the problems
    that fail the batch, as OpenAI lists them in `errors.data` ({code, message, param, line})."""
    lines: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()

    def problem(number: int, code: str, message: str, param: str | None = None) -> None:
        if len(errors) < 100:
            errors.append({"code": code, "message": encodable(message), "param": param, "line": number})

    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if len(lines) >= max_lines:
            problem(number, "too_many_requests", f"a batch holds at most {max_lines} requests")
            break
        try:
            line = json.loads(raw)
        except ValueError as exc:
            problem(number, "invalid_json_line", f"line {number} is not JSON: {exc}")
            continue
        if not isinstance(line, dict):
            problem(number, "invalid_request", f"line {number}: expected a JSON object")
            continue
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
            problem(number, "invalid_request", f"line {number}: custom_id: required, a string of 1 to {MAX_CUSTOM_ID}"
                    " characters", "custom_id")
            continue
        if custom_id in seen:
            problem(number, "duplicate_custom_id", f"line {number}: custom_id {custom_id[:80]!r} is used by an earlier"
                    " line; each line's must be unique", "custom_id")
            continue
        seen.add(custom_id)
        if line.get("method", "POST") != "POST":
            problem(number, "invalid_request", f"line {number}: method: must be POST", "method")
            continue
        if line.get("url") != endpoint:
            problem(number, "mismatched_endpoint", f"line {number}: url: {str(line.get('url'))[:80]!r} is not the"
                    f" batch's endpoint {endpoint}", "url")
            continue
        if not isinstance(line.get("body"), dict):
            problem(number, "invalid_request", f"line {number}: body: required, a JSON object", "body")
            continue
        lines.append({"custom_id": custom_id, "body": line["body"]})
    if not lines and not errors:
        problem(0, "empty_file", "the input file holds no requests")
    return lines, errors


def parse_anthropic_requests(body: Any, max_lines: int) -> list[dict[str, Any]]:
    """The requests of a `POST /v1/messages/batches` body; 400 naming the field (`requests[3].custom_id`)."""
    if not isinstance(body, Mapping):
        raise field_error("body", "expected a JSON object")
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        raise field_error("requests", "required: a non-empty list of {custom_id, params}")
    if len(requests) > max_lines:
        raise field_error("requests", f"a batch holds at most {max_lines} requests (got {len(requests)})")
    seen: set[str] = set()
    lines = []
    for i, request in enumerate(requests):
        if not isinstance(request, Mapping):
            raise field_error(f"requests[{i}]", "expected an object {custom_id, params}")
        custom_id = request.get("custom_id")
        if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
            raise field_error(f"requests[{i}].custom_id", "required: 1 to 64 letters, digits, '_' or '-'")
        if custom_id in seen:
            raise field_error(f"requests[{i}].custom_id", f"{custom_id!r} is used by an earlier request; each must be unique")
        seen.add(custom_id)
        params = request.get("params")
        if not isinstance(params, Mapping):
            raise field_error(f"requests[{i}].params", "required: a Messages request body")
        if params.get("stream"):
            raise field_error(f"requests[{i}].params.stream", "a batch's requests are not streamed")
        lines.append({"custom_id": custom_id, "body": dict(params)})
    return lines


def line_refusal(endpoint: str, body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(field, why) for what a batch line may not ask (it has no client to stream to or poll for it)."""
    if body.get("stream"):
        return "body.stream", "a batch's requests are not streamed"
    if endpoint == "/v1/responses" and body.get("background"):
        return "body.background", "a batch's requests run in the batch, not in the background"
    return None


# --- what goes out -------------------------------------------------------------------------------------


def answer(custom_id: str, status_code: int, body: Any) -> dict[str, Any]:
    """A line's answer as kept: what its route answered."""
    return {"custom_id": custom_id, "status_code": status_code, "body": body, "request_id": new_id("req_")}


def openai_output_line(batch_id: str, index: int, kept: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": f"batch_req_{batch_id.removeprefix('batch_')}{index:07d}",
        "custom_id": kept["custom_id"],
        "response": {"status_code": kept["status_code"], "request_id": kept["request_id"], "body": kept["body"]},
        "error": None,
    }


def openai_expired_line(batch_id: str, index: int, custom_id: str) -> dict[str, Any]:
    return {"id": f"batch_req_{batch_id.removeprefix('batch_')}{index:07d}", "custom_id": custom_id, "response": None,
            "error": {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}}


def anthropic_result_line(custom_id: str, kept: Mapping[str, Any] | None, record_status: str) -> dict[str, Any]:
    if kept is None:
        kind = "expired" if record_status == "expired" else "canceled"
        return {"custom_id": custom_id, "result": {"type": kind}}
    if 200 <= kept["status_code"] < 300:
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": kept["body"]}}
    return {"custom_id": custom_id, "result": {"type": "errored", "error": kept["body"]}}


def file_object(file_id: str, size: int, filename: str, purpose: str, created_at: float) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "bytes": size, "created_at": int(created_at), "expires_at": None,
            "filename": filename, "purpose": purpose, "status": "processed", "status_details": None}


def _at(record: Mapping[str, Any], key: str) -> int | None:
    value = record["times"].get(key)
    return None if value is None else int(value)


def openai_batch(batch_id: str, status: str, record: Mapping[str, Any]) -> dict[str, Any]:
    counts = record["counts"]
    errors = record.get("errors")
    return {
        "id": batch_id, "object": "batch", "endpoint": record["endpoint"],
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": record["input_file_id"], "completion_window": record["completion_window"],
        "status": status, "output_file_id": record["output_file_id"], "error_file_id": record["error_file_id"],
        "created_at": int(record["created_at"]), "in_progress_at": _at(record, "in_progress_at"),
        "expires_at": int(record["expires_at"]), "finalizing_at": _at(record, "finalizing_at"),
        "completed_at": _at(record, "completed_at"), "failed_at": _at(record, "failed_at"),
        "expired_at": _at(record, "expired_at"), "cancelling_at": _at(record, "cancelling_at"),
        "cancelled_at": _at(record, "cancelled_at"),
        "request_counts": {"total": record["lines"], "completed": counts["succeeded"], "failed": counts["errored"]},
        "metadata": record["metadata"],
    }


def _rfc3339(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def anthropic_batch(batch_id: str, status: str, record: Mapping[str, Any], results_url: str) -> dict[str, Any]:
    counts = record["counts"]
    processing_status = ANTHROPIC_STATUS[status]
    ended = processing_status == "ended"
    unrun = record["lines"] - counts["succeeded"] - counts["errored"]
    times = record["times"]
    ended_at = next((times[k] for k in ("completed_at", "cancelled_at", "expired_at", "failed_at") if k in times), None)
    return {
        "id": batch_id, "type": "message_batch", "processing_status": processing_status,
        "request_counts": {
            "processing": 0 if ended else unrun, "succeeded": counts["succeeded"], "errored": counts["errored"],
            "canceled": unrun if ended and status != "expired" else 0, "expired": unrun if status == "expired" else 0,
        },
        "ended_at": _rfc3339(ended_at), "created_at": _rfc3339(record["created_at"]),
        "expires_at": _rfc3339(record["expires_at"]), "archived_at": None,
        "cancel_initiated_at": _rfc3339(times.get("cancelling_at")),
        "results_url": results_url if ended else None,
    }


def page(items: Sequence[dict[str, Any]], *, after: str | None, before: str | None, limit: Any,
         field: str = "limit") -> tuple[list[dict[str, Any]], bool]:
    """One page of `items` (newest first) after the one with id `after` (or before `before`); has_more."""
    try:
        size = DEFAULT_LIST_LIMIT if limit is None else int(limit)
    except ValueError:
        raise field_error(field, f"expected an integer from 1 to {MAX_LIST_LIMIT}") from None
    if not 1 <= size <= MAX_LIST_LIMIT:
        raise field_error(field, f"expected an integer from 1 to {MAX_LIST_LIMIT}")
    ids = [item["id"] for item in items]
    start, stop = 0, len(items)
    if after:
        start = ids.index(after) + 1 if after in ids else len(items)
    if before:
        stop = ids.index(before) if before in ids else 0
        start = max(start, stop - size)
    chosen = list(items[start:stop])[:size]
    more = (start + len(chosen) < stop) if not before else start > 0
    return chosen, more
