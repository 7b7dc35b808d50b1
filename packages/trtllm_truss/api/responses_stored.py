"""What a stored response keeps, and OpenAI's shapes of reading it back.

A stored response is one record: the `response` object as `GET /v1/responses/{id}` answers it, the turn's
`input_items` (each with an id, as `GET /v1/responses/{id}/input_items` lists them) and the `history`
before them (the earlier turns' input and output items, when the turn continued one by
`previous_response_id`). A turn that continues this one is rendered from `continued_history(record)`:
its history, its input items and its output items, then the new input (as OpenAI, not its
`instructions`: each turn sends its own). The history is copied into each record, so a turn can be
continued after an earlier one in its chain was deleted or evicted.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from trtllm_truss.api.errors import field_error

# Statuses of a background response; a response answered in the request is stored when it ended.
RUNNING = ("queued", "in_progress")
_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
MAX_LIST_LIMIT = 100
DEFAULT_LIST_LIMIT = 20


def stored_input_items(items: list[Any]) -> list[dict[str, Any]]:
    """The turn's input items as OpenAI lists them: each with a `type` and an `id`, a message's text as
    content parts (`input_text`; `output_text` in an assistant's)."""
    listed = []
    for item in items:
        entry = dict(item)
        kind = entry.setdefault("type", "message")
        entry.setdefault("id", f"{_ITEM_PREFIX.get(kind, 'item')}_{uuid.uuid4().hex}")
        if kind == "message" and isinstance(entry.get("content"), str):
            part = "output_text" if entry.get("role") == "assistant" else "input_text"
            entry["content"] = [{"type": part, "text": entry["content"]}]
        listed.append(entry)
    return listed


def record(response: dict[str, Any], input_items: list[dict[str, Any]], history: list[dict[str, Any]]) -> dict[str, Any]:
    return {"response": response, "input_items": input_items, "history": history}


def continued_history(stored: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The items a turn continuing `stored` comes after."""
    return [*stored["history"], *stored["input_items"], *stored["response"]["output"]]


def list_query(query: Mapping[str, str]) -> tuple[int, str, str | None, str | None]:
    """`limit`, `order`, `after`, `before` of `GET .../input_items` (400 naming the parameter)."""
    raw = query.get("limit")
    limit = DEFAULT_LIST_LIMIT
    if raw is not None:
        try:
            limit = int(raw)
        except ValueError:
            raise field_error("limit", f"expected an integer from 1 to {MAX_LIST_LIMIT}, got {raw[:40]!r}") from None
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise field_error("limit", f"must be from 1 to {MAX_LIST_LIMIT} (got {limit})")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise field_error("order", f"must be 'asc' or 'desc' (got {order[:40]!r})")
    return limit, order, query.get("after"), query.get("before")


def input_item_page(items: list[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    """One page of a response's input items, OpenAI's list shape (`data`, `first_id`, `last_id`, `has_more`)."""
    limit, order, after, before = list_query(query)
    ordered = list(items) if order == "asc" else list(reversed(items))
    ids = [item.get("id") for item in ordered]
    start, end = 0, len(ordered)
    for name, cursor in (("after", after), ("before", before)):
        if cursor is not None and cursor not in ids:
            raise field_error(name, f"{cursor[:80]!r} is not an input item of this response")
    if after is not None:
        start = ids.index(after) + 1
    if before is not None:
        end = ids.index(before)
    window = ordered[start:end]
    if before is not None and after is None:
        page = window[-limit:]  # the page just before the cursor
        has_more = len(window) > limit
    else:
        page = window[:limit]
        has_more = len(window) > limit
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": has_more,
    }
