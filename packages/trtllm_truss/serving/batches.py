"""The batch routes: OpenAI's `/v1/files` and `/v1/batches`, Anthropic's `/v1/messages/batches`, over the
deployment's store (`core.store`). A route only stores and reads; the lines are run by the host's one
`serving.batch_runner.BatchRunner`, which finds new batches and cancels in the store.

Everything belongs to the credential that made it (`stored_responses.request_owner`: a hash of the key):
another caller's file or batch is a 404, as an unknown one. Errors are each API's shape, naming the field.

What is kept, by kind: `file` (OpenAI's file object) and `file_content` (its text) under the file's id;
`batch` (the record of `api.batches.new_record`, status OpenAI's) and `batch_input` (its requests) under
the batch's id; `batch_answer` under `<batch id>/<line number>`, one per answered line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trtllm_truss.api import batches as shapes
from trtllm_truss.api.messages import error_response as anthropic_error
from trtllm_truss.serving.openai_shared import openai_error
from trtllm_truss.serving.stored_responses import request_owner
from trtllm_truss.store import Store, StoredObject, StoreError

logger = logging.getLogger(__name__)

FILE, CONTENT, BATCH, INPUT, ANSWER = "file", "file_content", "batch", "batch_input", "batch_answer"
EVERY = 2**31 - 1  # `Store.find`'s limit where every match is wanted (the pages are cut here)
_UNAVAILABLE = "the batch store is unavailable; retry shortly"


class _Answer(Exception):
    """An error answer, raised out of a route's work (rendered in the route's API shape)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


async def call(store: Store, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return await asyncio.to_thread(method, *args, **kwargs)
    except StoreError as exc:
        logger.error("%s", exc)
        raise _Answer(503, _UNAVAILABLE) from None


def answer_ids(batch_id: str, answers: list[StoredObject]) -> dict[int, dict[str, Any]]:
    """The kept answers of a batch by line number."""
    return {int(o.id.rsplit("/", 1)[1]): o.body for o in answers}


class BatchRoutes:
    """The routes of both batch APIs over one store; `config`: `runtime.batches`."""

    def __init__(self, store: Store | None, config: Any) -> None:
        self.store = store
        self.config = config

    # --- plumbing -------------------------------------------------------------------------------

    def _route(self, work: Callable[..., Any], anthropic: bool = False) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                if self.store is None or not self.config.enabled:
                    why = "batches are off in this deployment (runtime.batches.enabled, runtime.store.enabled)"
                    raise _Answer(404, why)
                result = await work(request, request_owner(request))
            except _Answer as exc:
                return self._error(anthropic, exc.status, exc.message, exc.param)
            except HTTPException as exc:  # field_error: "invalid request: <field>: ..."
                detail = str(exc.detail)
                param = detail.removeprefix("invalid request: ").split(":", 1)[0] if ":" in detail else None
                return self._error(anthropic, exc.status_code, detail, param)
            return result if isinstance(result, Response) else JSONResponse(result)

        return endpoint

    @staticmethod
    def _error(anthropic: bool, status: int, message: str, param: str | None) -> Response:
        headers = {"Retry-After": "1"} if status == 503 else None
        if anthropic:
            return anthropic_error(status, message, headers)
        return openai_error(status, message, headers, param=param)

    async def _json(self, request: Request) -> Any:
        """The JSON body, read up to `runtime.batches.max_file_bytes` (an Anthropic batch carries its requests)."""
        limit, chunks, size = self.config.max_file_bytes, [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _Answer(413, f"invalid request: body: larger than {limit} bytes (runtime.batches.max_file_bytes)")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except ValueError as exc:
            raise _Answer(400, f"invalid request: body: not JSON: {exc}") from None

    async def _owned(self, kind: str, id: str, owner: str, what: str) -> StoredObject:
        found = await call(self.store, self.store.get, kind, id, owner)
        if found is None:
            raise _Answer(404, f"no {what} with id {id[:80]!r} for this API key")
        return found

    def routes(self) -> list[tuple[str, Callable[[Request], Any], str]]:
        """(path, endpoint, method) of every batch route."""
        r, a = self._route, (lambda work: self._route(work, anthropic=True))
        return [
            ("/v1/files", r(self.upload_file), "POST"),
            ("/v1/files", r(self.list_files), "GET"),
            ("/v1/files/{file_id}", r(self.get_file), "GET"),
            ("/v1/files/{file_id}", r(self.delete_file), "DELETE"),
            ("/v1/files/{file_id}/content", r(self.file_content), "GET"),
            ("/v1/batches", r(self.create_batch), "POST"),
            ("/v1/batches", r(self.list_batches), "GET"),
            ("/v1/batches/{batch_id}", r(self.get_batch), "GET"),
            ("/v1/batches/{batch_id}/cancel", r(self.cancel_batch), "POST"),
            ("/v1/messages/batches", a(self.create_message_batch), "POST"),
            ("/v1/messages/batches", a(self.list_message_batches), "GET"),
            ("/v1/messages/batches/{batch_id}", a(self.get_message_batch), "GET"),
            ("/v1/messages/batches/{batch_id}", a(self.delete_message_batch), "DELETE"),
            ("/v1/messages/batches/{batch_id}/results", a(self.message_batch_results), "GET"),
            ("/v1/messages/batches/{batch_id}/cancel", a(self.cancel_message_batch), "POST"),
        ]

    # --- files ----------------------------------------------------------------------------------

    async def upload_file(self, request: Request, owner: str) -> Any:
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise _Answer(400, "invalid request: body: a file is uploaded as multipart/form-data (fields file, purpose)")
        limit = self.config.max_file_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit + 65536:
            raise _Answer(413, f"invalid request: file: larger than {limit} bytes (runtime.batches.max_file_bytes)", "file")
        form = await request.form(max_files=1, max_fields=8)
        try:
            purpose, upload = form.get("purpose"), form.get("file")
            if purpose != "batch":
                raise _Answer(400, f"invalid request: purpose: only 'batch' is served (got {str(purpose)[:40]!r})", "purpose")
            if upload is None or isinstance(upload, str):
                raise _Answer(400, "invalid request: file: required, the JSONL file's bytes", "file")
            data = await upload.read(limit + 1)
            filename = upload.filename or "batch.jsonl"
        finally:
            await form.close()
        if len(data) > limit:
            raise _Answer(413, f"invalid request: file: larger than {limit} bytes (runtime.batches.max_file_bytes)", "file")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise _Answer(400, "invalid request: file: not UTF-8 text (a JSONL file)", "file") from None
        file_id = shapes.new_id("file-")
        obj = shapes.file_object(file_id, len(data), filename[:256], "batch", time.time())
        if not await call(self.store, self.store.put, StoredObject(CONTENT, file_id, owner, "processed", {"text": text})):
            raise _Answer(413, "invalid request: file: larger than the store's bound (runtime.store.max_bytes)", "file")
        await call(self.store, self.store.put, StoredObject(FILE, file_id, owner, "processed", obj))
        return obj

    async def list_files(self, request: Request, owner: str) -> Any:
        query = request.query_params
        files = [o.body for o in await call(self.store, self.store.find, FILE, owner=owner, limit=EVERY)]
        if query.get("purpose"):
            files = [f for f in files if f["purpose"] == query["purpose"]]
        if query.get("order", "desc") == "desc":
            files.reverse()
        data, more = shapes.page(files, after=query.get("after"), before=None, limit=query.get("limit"))
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": more}

    async def get_file(self, request: Request, owner: str) -> Any:
        return (await self._owned(FILE, request.path_params["file_id"], owner, "file")).body

    async def delete_file(self, request: Request, owner: str) -> Any:
        file_id = request.path_params["file_id"]
        if not await call(self.store, self.store.delete, FILE, file_id, owner):
            raise _Answer(404, f"no file with id {file_id[:80]!r} for this API key")
        await call(self.store, self.store.delete, CONTENT, file_id, owner)
        return {"id": file_id, "object": "file", "deleted": True}

    async def file_content(self, request: Request, owner: str) -> Any:
        file_id = request.path_params["file_id"]
        await self._owned(FILE, file_id, owner, "file")
        content = await self._owned(CONTENT, file_id, owner, "file content")
        return Response(content.body["text"].encode("utf-8"), media_type="application/octet-stream")

    # --- OpenAI's batches -----------------------------------------------------------------------

    async def create_batch(self, request: Request, owner: str) -> Any:
        file_id, endpoint, window, metadata = shapes.check_openai_create(await self._json(request))
        found = await call(self.store, self.store.get, FILE, file_id, owner)
        if found is None:
            raise _Answer(404, f"invalid request: input_file_id: no file with id {file_id[:80]!r} for this API key",
                          "input_file_id")
        if found.body["purpose"] != "batch":
            raise _Answer(400, "invalid request: input_file_id: the file's purpose is not batch", "input_file_id")
        content = await self._owned(CONTENT, file_id, owner, "file content")
        lines, errors = shapes.parse_openai_lines(content.body["text"], endpoint, self.config.max_lines)
        record = shapes.new_record("openai", endpoint, len(lines), input_file_id=file_id, completion_window=window,
                                   metadata=metadata, errors=errors or None)
        return await self._create(shapes.new_id("batch_"), owner, record, lines, failed=bool(errors))

    async def _create(self, batch_id: str, owner: str, record: dict[str, Any], lines: list[dict[str, Any]],
                      *, failed: bool = False) -> dict[str, Any]:
        status = "failed" if failed else "in_progress"
        shapes.stamp(record, status)
        if not failed:
            kept = await call(self.store, self.store.put, StoredObject(INPUT, batch_id, owner, "ready", {"lines": lines}))
            if not kept:
                raise _Answer(413, "invalid request: the batch's requests are larger than the store's bound"
                              " (runtime.store.max_bytes)")
        await call(self.store, self.store.put, StoredObject(BATCH, batch_id, owner, status, record))
        if record["api"] == "anthropic":
            return record | {"_status": status}
        return shapes.openai_batch(batch_id, status, record)

    async def get_batch(self, request: Request, owner: str) -> Any:
        found = await self._owned(BATCH, request.path_params["batch_id"], owner, "batch")
        if found.body["api"] != "openai":
            raise _Answer(404, f"no batch with id {found.id!r} for this API key")
        return shapes.openai_batch(found.id, found.status, found.body)

    async def list_batches(self, request: Request, owner: str) -> Any:
        found = [o for o in await call(self.store, self.store.find, BATCH, owner=owner, limit=EVERY) if o.body["api"] == "openai"]
        items = [shapes.openai_batch(o.id, o.status, o.body) for o in reversed(found)]
        query = request.query_params
        data, more = shapes.page(items, after=query.get("after"), before=None, limit=query.get("limit"))
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": more}

    async def _cancel(self, batch_id: str, owner: str, api: str) -> StoredObject:
        found = await self._owned(BATCH, batch_id, owner, "batch")
        if found.body["api"] != api:
            raise _Answer(404, f"no batch with id {batch_id[:80]!r} for this API key")
        while found.status in shapes.CANCELLABLE:
            shapes.stamp(found.body, "cancelling")
            cancelled = StoredObject(BATCH, batch_id, owner, "cancelling", found.body, found.created_at)
            if await call(self.store, self.store.update, cancelled, if_status=shapes.CANCELLABLE):
                return cancelled
            found = await self._owned(BATCH, batch_id, owner, "batch")  # the runner wrote first: look again
        if found.status in ("cancelling", "cancelled"):
            return found
        raise _Answer(409, f"the batch is {found.status}: only a batch in progress can be cancelled")

    async def cancel_batch(self, request: Request, owner: str) -> Any:
        done = await self._cancel(request.path_params["batch_id"], owner, "openai")
        return shapes.openai_batch(done.id, done.status, done.body)

    # --- Anthropic's message batches ------------------------------------------------------------

    @staticmethod
    def _message_batch(request: Request, batch_id: str, status: str, record: dict[str, Any]) -> dict[str, Any]:
        # A path, not a URL: behind a proxy with a path prefix this server does not know its public URL, and
        # the anthropic client joins a path to its base_url (prefix included).
        return shapes.anthropic_batch(batch_id, status, record, f"/v1/messages/batches/{batch_id}/results")

    async def _owned_message_batch(self, batch_id: str, owner: str) -> StoredObject:
        found = await self._owned(BATCH, batch_id, owner, "message batch")
        if found.body["api"] != "anthropic":
            raise _Answer(404, f"no message batch with id {batch_id[:80]!r} for this API key")
        return found

    async def create_message_batch(self, request: Request, owner: str) -> Any:
        lines = shapes.parse_anthropic_requests(await self._json(request), self.config.max_lines)
        record = shapes.new_record("anthropic", shapes.MESSAGES_ENDPOINT, len(lines))
        batch_id = shapes.new_id("msgbatch_")
        made = await self._create(batch_id, owner, record, lines)
        return self._message_batch(request, batch_id, made.pop("_status"), made)

    async def get_message_batch(self, request: Request, owner: str) -> Any:
        found = await self._owned_message_batch(request.path_params["batch_id"], owner)
        return self._message_batch(request, found.id, found.status, found.body)

    async def list_message_batches(self, request: Request, owner: str) -> Any:
        found = [o for o in await call(self.store, self.store.find, BATCH, owner=owner, limit=EVERY) if o.body["api"] == "anthropic"]
        items = [self._message_batch(request, o.id, o.status, o.body) for o in reversed(found)]
        query = request.query_params
        data, more = shapes.page(items, after=query.get("after_id"), before=query.get("before_id"),
                                 limit=query.get("limit"))
        return {"data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None}

    async def cancel_message_batch(self, request: Request, owner: str) -> Any:
        done = await self._cancel(request.path_params["batch_id"], owner, "anthropic")
        return self._message_batch(request, done.id, done.status, done.body)

    async def message_batch_results(self, request: Request, owner: str) -> Any:
        found = await self._owned_message_batch(request.path_params["batch_id"], owner)
        if found.status not in shapes.ENDED:
            raise _Answer(400, "the batch's results are ready once its processing_status is ended")
        inputs = await self._owned(INPUT, found.id, owner, "message batch input")
        answers = answer_ids(found.id, await call(self.store, self.store.find, ANSWER, owner=owner, id_prefix=found.id + "/", limit=EVERY))
        lines = (shapes.anthropic_result_line(line["custom_id"], answers.get(i), found.status)
                 for i, line in enumerate(inputs.body["lines"]))
        text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
        return Response(text.encode("utf-8"), media_type="application/binary")

    async def delete_message_batch(self, request: Request, owner: str) -> Any:
        found = await self._owned_message_batch(request.path_params["batch_id"], owner)
        if found.status not in shapes.ENDED:
            raise _Answer(400, "the batch is still processing: cancel it and wait for it to end before deleting it")
        for answer in await call(self.store, self.store.find, ANSWER, owner=owner, id_prefix=found.id + "/", limit=EVERY):
            await call(self.store, self.store.delete, ANSWER, answer.id, owner)
        await call(self.store, self.store.delete, INPUT, found.id, owner)
        await call(self.store, self.store.delete, BATCH, found.id, owner)
        return {"id": found.id, "type": "message_batch_deleted"}
