"""OpenAI's Conversations API over the deployment's store (`api.conversations`): `POST /v1/conversations`,
`GET` / `POST` (metadata) / `DELETE /v1/conversations/{id}`, `GET` / `POST /v1/conversations/{id}/items`,
`GET` / `DELETE /v1/conversations/{id}/items/{item_id}`; and what a Responses request with `conversation`
needs: the items it comes after (`history`), and its items added when it ends (`append`).

A conversation belongs to the credential that made it (`stored_responses.request_owner`), as a stored
response does; every change is one atomic read-change-write of the store (`Store.modify`), so turns
answered by different processes add their items without losing each other's.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from trtllm_truss.api import conversations as api
from trtllm_truss.api.responses_stored import input_item_page
from trtllm_truss.serving.core import Refused, RequestCore
from trtllm_truss.serving.openai_shared import openai_error
from trtllm_truss.serving.stored_responses import CONVERSATION as KIND
from trtllm_truss.serving.stored_responses import appended, call, delete_owned, read_owned, request_owner, routed
from trtllm_truss.store import Store, StoredObject


def _not_found(conversation_id: str) -> JSONResponse:
    return openai_error(404, f"invalid request: conversation_id: no conversation with id {conversation_id[:80]!r} is"
                        " stored for this API key", param="conversation_id", code="not_found")


async def history(store: Store, conversation_id: str, owner: str) -> list[dict[str, Any]]:
    """The items a response in the conversation comes after (404 naming `conversation` if there is none)."""
    found = await call(store, store.get, KIND, conversation_id, owner)
    if found is None:
        raise Refused(404, f"invalid request: conversation: no conversation with id {conversation_id[:80]!r} is stored"
                      " for this API key", error={"param": "conversation", "code": "not_found"})
    return list(found.body["items"])


async def append(store: Store, conversation_id: str, owner: str, items: list[dict[str, Any]]) -> bool:
    """`items` added at the end of the conversation; False if it is gone."""
    return await call(store, store.modify, KIND, conversation_id, owner, appended(items)) is not None


# --- routes -------------------------------------------------------------------------------------


async def create(core: RequestCore, body: Any, http_request: Any) -> Any:
    async def work(store: Store) -> Any:
        req = api.parse_create(body)
        record = api.new_conversation(req.metadata, api.checked_items(req.items or []))
        conversation = record["conversation"]
        obj = StoredObject(KIND, conversation["id"], request_owner(http_request), "active", record,
                           created_at=float(conversation["created_at"]))
        if not await call(store, store.put, obj):
            return openai_error(400, "invalid request: items: larger than this deployment's store holds", param="items")
        return conversation

    return await routed(core, work)


async def retrieve(core: RequestCore, conversation_id: str, http_request: Any) -> Any:
    return await read_owned(core, KIND, conversation_id, http_request, _not_found, lambda found: found.body["conversation"])


async def update(core: RequestCore, conversation_id: str, body: Any, http_request: Any) -> Any:
    async def work(store: Store) -> Any:
        req = api.parse_update(body)

        def change(obj: StoredObject) -> StoredObject:
            obj.body["conversation"]["metadata"] = dict(req.metadata)
            return obj

        found = await call(store, store.modify, KIND, conversation_id, request_owner(http_request), change)
        return _not_found(conversation_id) if found is None else found.body["conversation"]

    return await routed(core, work)


async def delete(core: RequestCore, conversation_id: str, http_request: Any) -> Any:
    return await delete_owned(core, KIND, conversation_id, http_request, _not_found,
                              {"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def list_items(core: RequestCore, conversation_id: str, http_request: Any) -> Any:
    query = dict(http_request.query_params) if http_request is not None else {}
    return await read_owned(core, KIND, conversation_id, http_request, _not_found,
                            lambda found: input_item_page(found.body["items"], query))


async def add_items(core: RequestCore, conversation_id: str, body: Any, http_request: Any) -> Any:
    async def work(store: Store) -> Any:
        items = api.checked_items(api.parse_items(body).items)
        if not await append(store, conversation_id, request_owner(http_request), items):
            return _not_found(conversation_id)
        return {"object": "list", "data": items, "first_id": items[0]["id"], "last_id": items[-1]["id"], "has_more": False}

    return await routed(core, work)


def _item_not_found(item_id: str) -> JSONResponse:
    return openai_error(404, f"invalid request: item_id: no item {item_id[:80]!r} in this conversation",
                        param="item_id", code="not_found")


async def retrieve_item(core: RequestCore, conversation_id: str, item_id: str, http_request: Any) -> Any:
    def answer(found: StoredObject) -> Any:
        for item in found.body["items"]:
            if item.get("id") == item_id:
                return item
        return _item_not_found(item_id)

    return await read_owned(core, KIND, conversation_id, http_request, _not_found, answer)


async def delete_item(core: RequestCore, conversation_id: str, item_id: str, http_request: Any) -> Any:
    """The item removed; the answer is the conversation (as OpenAI's)."""

    async def work(store: Store) -> Any:
        missing: list[bool] = []

        def change(obj: StoredObject) -> StoredObject | None:
            kept = [item for item in obj.body["items"] if item.get("id") != item_id]
            if len(kept) == len(obj.body["items"]):
                missing.append(True)
                return None
            obj.body["items"] = kept
            return obj

        found = await call(store, store.modify, KIND, conversation_id, request_owner(http_request), change)
        if found is None:
            return _not_found(conversation_id)
        if missing:
            return _item_not_found(item_id)
        return found.body["conversation"]

    return await routed(core, work)
