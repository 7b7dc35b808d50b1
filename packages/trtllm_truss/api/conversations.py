"""OpenAI's Conversations API (`/v1/conversations`): a conversation is a stored list of items (the Responses
API's input and output items) with metadata; a response created with `conversation` comes after its items,
and its input and output items are added to it when it ends.

What a stored conversation keeps: `{"conversation": <the conversation object>, "items": [...]}`, each item
with an id (`api.responses_stored.stored_input_items`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from trtllm_truss.api.conversation import validate_at
from trtllm_truss.api.errors import field_error
from trtllm_truss.api.responses_stored import stored_input_items
from trtllm_truss.api.sampling import StrictModel, Text

MAX_ITEMS_PER_REQUEST = 20  # OpenAI's bound on the items one create sends
MAX_METADATA_KEYS = 16
_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
_ROLES = ("user", "assistant", "system", "developer")


class ConversationCreate(StrictModel):
    items: list[dict[str, Any]] | None = Field(None, max_length=MAX_ITEMS_PER_REQUEST)
    metadata: dict[str, Text] | None = Field(None, max_length=MAX_METADATA_KEYS)


class ConversationUpdate(StrictModel):
    metadata: dict[str, Text] = Field(max_length=MAX_METADATA_KEYS)


class ItemsCreate(StrictModel):
    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_ITEMS_PER_REQUEST)
    include: list[Text] | None = None


def checked_items(items: list[dict[str, Any]], field: str = "items") -> list[dict[str, Any]]:
    """Items as they are stored (ids given), each checked to be one this deployment renders (400 naming
    `items[i]...` otherwise; its content is checked again when a response renders it)."""
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind not in _ITEM_TYPES:
            raise field_error(f"{field}[{i}].type", f"{kind!r} items are not served ({', '.join(_ITEM_TYPES)} are)")
        if kind == "message":
            if item.get("role") not in _ROLES:
                raise field_error(f"{field}[{i}].role", f"must be one of {', '.join(_ROLES)} (got {item.get('role')!r})", 422)
            if not isinstance(item.get("content"), (str, list)):
                raise field_error(f"{field}[{i}].content", "a string or a list of content parts is required", 422)
        elif kind in ("function_call", "function_call_output") and not isinstance(item.get("call_id"), str):
            raise field_error(f"{field}[{i}].call_id", "a string is required", 422)
    return stored_input_items(items)


def parse_create(body: Any) -> ConversationCreate:
    return validate_at(ConversationCreate, body)


def parse_update(body: Any) -> ConversationUpdate:
    return validate_at(ConversationUpdate, body)


def parse_items(body: Any) -> ItemsCreate:
    req = validate_at(ItemsCreate, body)
    if req.include:
        raise field_error("include", f"{req.include[0]!r}: no extra output is served (send include: [])")
    return req


def new_conversation(metadata: Mapping[str, str] | None, items: list[dict[str, Any]]) -> dict[str, Any]:
    """A stored conversation's record."""
    conversation = {"id": f"conv_{uuid.uuid4().hex}", "object": "conversation", "created_at": int(time.time()),
                    "metadata": dict(metadata or {})}
    return {"conversation": conversation, "items": items}


def conversation_id(value: str | Mapping[str, Any]) -> str:
    """The id a Responses request's `conversation` names (a string, or `{"id": ...}`)."""
    if isinstance(value, str):
        return value
    found = value.get("id")
    if not isinstance(found, str) or not found:
        raise field_error("conversation.id", "the conversation's id (a string) is required", 422)
    return found
