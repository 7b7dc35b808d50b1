"""Responses with state: stored responses (`store`), turns continued by `previous_response_id`, responses
run in the background (`background: true`), and the routes that read them back: `GET` / `DELETE
/v1/responses/{id}`, `GET /v1/responses/{id}/input_items`, `POST /v1/responses/{id}/cancel`.

Everything lives in the deployment's store (`trtllm_truss.store`, `core.store`), shared by every front
process (and, on PostgreSQL, every replica): a follow-up turn or a poll may land on any of them. Each
stored response belongs to the credential that made it (`request_owner`: a hash of the API key sent);
another caller's id is a 404, as an unknown one.

A background response is run by the process that took it, as a task of its event loop: stored `queued`,
`in_progress` once the engine admitted it, then `completed` / `incomplete` / `failed`. Its runner reads
the stored status every `CANCEL_POLL_S` (a cancel may come to another process: it writes `cancelled`,
and the runner stops the generation) and rewrites it every `HEARTBEAT_S`; a running response not
rewritten for `STALE_S` lost its process (a restart) and reads as `failed`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from trtllm_truss.api import responses_stored as stored
from trtllm_truss.api.responses import ResponsesRequest, response_object
from trtllm_truss.api.responses_events import ResponseEvents
from trtllm_truss.serving import semantic_events
from trtllm_truss.serving.core import Refused, RequestCore
from trtllm_truss.serving.openai_shared import openai_error
from trtllm_truss.store import ANONYMOUS, Store, StoredObject, StoreError, TooLarge, owner_of
from trtllm_truss.streaming.protocol import GenerationSpec

logger = logging.getLogger(__name__)

KIND = "response"
CANCEL_POLL_S = 0.5
HEARTBEAT_S = 10.0
STALE_S = 6 * HEARTBEAT_S
_BACKGROUND: set[asyncio.Task] = set()  # running background responses (a task nobody holds may be collected)


def request_owner(http_request: Any) -> str:
    """Whom a request's stored objects belong to: the hash of the key it sent (`Authorization: Bearer
    <key>` or any other scheme, or Anthropic's `x-api-key`); no key at all is the anonymous owner."""
    if http_request is None:
        return ANONYMOUS
    owner = getattr(http_request, "store_owner", None)  # a batch line: its batch's owner (serving.batch_runner)
    if isinstance(owner, str):
        return owner
    headers = http_request.headers
    given = headers.get("authorization", "").strip()
    if given:
        scheme, _, token = given.partition(" ")
        return owner_of(token.strip() or scheme)
    return owner_of(headers.get("x-api-key", "").strip() or None)


async def call(store: Store, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`store.method(...)` off the event loop; a store that fails is a 503 (an object grown past the whole
    bound a 400)."""
    try:
        return await asyncio.to_thread(method, *args, **kwargs)
    except TooLarge as exc:
        raise Refused(400, f"invalid request: {exc}") from None
    except StoreError as exc:
        logger.error("%s", exc)
        raise Refused(503, "the response store is unavailable; retry shortly", {"Retry-After": "1"}) from None


async def previous_history(store: Store, req: ResponsesRequest, owner: str) -> list[dict[str, Any]]:
    """The items the turn continued by `req.previous_response_id` comes after (404 for an id this caller
    has not stored; 400 for a background response still running)."""
    found = await call(store, store.get, KIND, req.previous_response_id, owner)
    if found is None:
        raise Refused(
            404, f"invalid request: previous_response_id: no response with id {req.previous_response_id[:80]!r} is"
            " stored for this API key",
            error={"param": "previous_response_id", "code": "previous_response_not_found"},
        )
    if found.status in stored.RUNNING:
        raise Refused(400, f"invalid request: previous_response_id: {req.previous_response_id[:80]!r} is still"
                      f" {found.status}: wait for it to end",
                      error={"param": "previous_response_id"})
    return stored.continued_history(found.body)


CONVERSATION = "conversation"  # the kind of a stored conversation (serving.conversations)


def appended(items: list[dict[str, Any]]) -> Callable[[StoredObject], StoredObject]:
    """A `Store.modify` change: `items` added at the end of a conversation."""

    def change(obj: StoredObject) -> StoredObject:
        obj.body["items"].extend(items)
        return obj

    return change


class Keeper:
    """Keeps what a request asked for once its response has ended: the response (`store: true`), its input
    and output items added to its `conversation`."""

    def __init__(self, store: Store, owner: str, items: list[dict[str, Any]], history: list[dict[str, Any]],
                 *, keep_response: bool = True, conversation: str | None = None) -> None:
        self.store, self.owner, self.items, self.history = store, owner, items, history
        self.keep_response, self.conversation = keep_response, conversation

    def object(self, response: dict[str, Any]) -> StoredObject:
        return StoredObject(KIND, response["id"], self.owner, response["status"],
                            stored.record(response, self.items, self.history), created_at=response["created_at"])

    async def keep(self, response: dict[str, Any]) -> None:
        """Stored; a store that fails costs the later reads, not this answer (logged)."""
        try:
            if self.conversation is not None:
                added = [*self.items, *response["output"]]
                if await asyncio.to_thread(self.store.modify, CONVERSATION, self.conversation, self.owner, appended(added)) is None:
                    logger.warning("response %s: its conversation is gone; its items were not added", response["id"])
            if self.keep_response and not await asyncio.to_thread(self.store.put, self.object(response)):
                logger.warning("response %s not stored: larger than runtime.store.max_bytes", response["id"])
        except StoreError as exc:
            logger.error("response %s not kept: %s", response["id"], exc)

    async def stream(self, events: Any, builder: ResponseEvents) -> Any:
        """`events` passed on, the last one (`response.completed`) only once the response is stored: a
        client that read it finds the response by id."""
        held = None
        async for event in events:
            if held is not None:
                yield held
            held = event
        if getattr(builder, "usage", None) is not None:
            await self.keep(builder.response())
        if held is not None:
            yield held


# --- background ---------------------------------------------------------------------------------


async def start_background(core: RequestCore, req: ResponsesRequest, spec: GenerationSpec, keeper: Keeper) -> dict[str, Any]:
    """Stored as `queued` and run detached; the queued response is the answer."""
    builder = ResponseEvents(req, emit=False)
    queued = response_object(req, builder.id, builder.created_at, status="queued", output=[])
    await call(keeper.store, keeper.store.put, keeper.object(queued))
    task = asyncio.get_running_loop().create_task(_run(core, spec, builder, keeper, queued))
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return queued


async def _run(core: RequestCore, spec: GenerationSpec, builder: ResponseEvents, keeper: Keeper, queued: dict[str, Any]) -> None:
    store = keeper.store
    running = StoredObject(**{**keeper.object(queued).__dict__})

    async def generate() -> dict[str, Any]:
        generation = await core.open(spec, None)
        running.status = "in_progress"
        running.body["response"] = {**queued, "status": "in_progress"}
        await asyncio.to_thread(store.update, running, if_status=("queued",))
        await semantic_events.collect(generation, builder, None)
        return builder.response()

    work = asyncio.ensure_future(generate())
    beat = time.monotonic()
    try:
        while not (await asyncio.wait({work}, timeout=CANCEL_POLL_S))[0]:
            try:
                current = await asyncio.to_thread(store.get, KIND, queued["id"], keeper.owner)
                if time.monotonic() - beat > HEARTBEAT_S:  # this runner's view: a poll's read may predate in_progress
                    await asyncio.to_thread(store.update, running, if_status=stored.RUNNING)
                    beat = time.monotonic()
            except StoreError as exc:  # the generation goes on; its end is written once the store is back
                logger.warning("background response %s: %s", queued["id"], exc)
                continue
            if current is None or current.status not in stored.RUNNING:  # cancelled, deleted or evicted
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                return
        try:
            final = work.result()
        except (Refused, HTTPException) as exc:
            message = exc.message if isinstance(exc, Refused) else str(exc.detail)
            final = {**queued, "status": "failed", "error": {"code": "server_error", "message": message}}
        await asyncio.to_thread(store.update, keeper.object(final), if_status=stored.RUNNING)
    except StoreError as exc:
        logger.error("background response %s: %s", queued["id"], exc)
    except Exception:  # noqa: BLE001 - a task's failure would otherwise vanish
        logger.exception("background response %s failed", queued["id"])
        failed = {**queued, "status": "failed", "error": {"code": "server_error", "message": "the server failed running it"}}
        try:
            await asyncio.to_thread(store.update, keeper.object(failed), if_status=stored.RUNNING)
        except StoreError:
            pass
    finally:
        if not work.done():
            work.cancel()


# --- the routes that read stored responses ------------------------------------------------------


def _not_found(response_id: str) -> JSONResponse:
    return openai_error(404, f"invalid request: response_id: no response with id {response_id[:80]!r} is stored for"
                        " this API key", param="response_id", code="not_found")


async def routed(core: RequestCore, work: Callable[[Store], Awaitable[Any]]) -> Any:
    store = core.store
    if store is None:
        return openai_error(404, "this deployment keeps no responses (runtime.store.enabled is false)", param="response_id")
    try:
        return await work(store)
    except Refused as exc:
        return openai_error(exc.status, exc.message, exc.headers, **(exc.error or {}))
    except HTTPException as exc:
        field = str(exc.detail).removeprefix("invalid request: ").partition(":")[0]
        return openai_error(exc.status_code, str(exc.detail), param=field or None)


async def read_owned(core: RequestCore, kind: str, object_id: str, http_request: Any,
                     not_found: Callable[[str], JSONResponse], answer: Callable[[StoredObject], Any]) -> Any:
    """A route that reads one stored object of the caller's: `answer(found)`, or `not_found(object_id)`."""

    async def work(store: Store) -> Any:
        found = await call(store, store.get, kind, object_id, request_owner(http_request))
        return not_found(object_id) if found is None else answer(found)

    return await routed(core, work)


async def delete_owned(core: RequestCore, kind: str, object_id: str, http_request: Any,
                       not_found: Callable[[str], JSONResponse], deleted: dict[str, Any]) -> Any:
    """A route that deletes one stored object of the caller's: `deleted`, or `not_found(object_id)`."""

    async def work(store: Store) -> Any:
        if not await call(store, store.delete, kind, object_id, request_owner(http_request)):
            return not_found(object_id)
        return deleted

    return await routed(core, work)


async def _live(store: Store, response_id: str, owner: str) -> StoredObject | None:
    """The stored response; one still running whose process stopped (no heartbeat) is stored as failed."""
    found = await call(store, store.get, KIND, response_id, owner)
    if found is not None and found.status in stored.RUNNING and time.time() - found.updated_at > STALE_S:
        response = {**found.body["response"], "status": "failed",
                    "error": {"code": "server_error", "message": "the server running it stopped before it ended"}}
        found.status, found.body = "failed", {**found.body, "response": response}
        if not await call(store, store.update, found, if_status=stored.RUNNING):
            found = await call(store, store.get, KIND, response_id, owner)
    return found


async def retrieve(core: RequestCore, response_id: str, http_request: Any) -> Any:
    async def work(store: Store) -> Any:
        if http_request is not None and http_request.query_params.get("stream", "false").lower() == "true":
            return openai_error(400, "invalid request: stream: a stored response is read whole here (stream=false)", param="stream")
        found = await _live(store, response_id, request_owner(http_request))
        return _not_found(response_id) if found is None else found.body["response"]

    return await routed(core, work)


async def delete(core: RequestCore, response_id: str, http_request: Any) -> Any:
    return await delete_owned(core, KIND, response_id, http_request, _not_found,
                              {"id": response_id, "object": "response", "deleted": True})


async def input_items(core: RequestCore, response_id: str, http_request: Any) -> Any:
    query = dict(http_request.query_params) if http_request is not None else {}
    return await read_owned(core, KIND, response_id, http_request, _not_found,
                            lambda found: stored.input_item_page(found.body["input_items"], query))


async def cancel(core: RequestCore, response_id: str, http_request: Any) -> Any:
    """A running background response ends `cancelled` (its generation stopped by its runner, wherever
    it runs); an ended one is answered as it is (cancelling is idempotent)."""

    async def work(store: Store) -> Any:
        owner = request_owner(http_request)
        found = await _live(store, response_id, owner)
        if found is None:
            return _not_found(response_id)
        response = found.body["response"]
        if not response.get("background"):
            return openai_error(400, "invalid request: response_id: only background responses can be cancelled", param="response_id")
        if found.status in stored.RUNNING:
            response = {**response, "status": "cancelled"}
            found.status, found.body = "cancelled", {**found.body, "response": response}
            if not await call(store, store.update, found, if_status=stored.RUNNING):
                ended = await call(store, store.get, KIND, response_id, owner)  # it ended meanwhile
                return _not_found(response_id) if ended is None else ended.body["response"]
        return response

    return await routed(core, work)
