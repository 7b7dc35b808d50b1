"""The batch runner: one per host, a task on the event loop of the process that owns it (the direct front's
frontend 0, truss's server process). It finds batches in the store, runs their lines through the same
dialect modules as interactive requests (their non-streamed path, on this process's request core), keeps
each line's answer in the store, and ends the batch.

Behind interactive traffic: the engine takes no request priority on our paths (TensorRT-LLM 1.2's
`generate_async` has none, nor has Triton's tensorrtllm backend), so the runner bounds its own share. While
the host has interactive requests in flight (`interactive_in_flight`: what every front process admitted,
less the batch lines' own streams), it starts a line only while fewer than
`runtime.batches.max_in_flight_under_load` are on the engine; with none, up to `max_in_flight`. Lines
already on the engine when interactive requests come finish (nothing is cancelled), and the host counts as
under load for `LOAD_HOLD_S` after the last interactive request seen: a closed-loop client between two
requests is still traffic, and a line started in that gap would hold the engine for its whole length.

Exactly once, across restarts: a line's answer is written with `Store.add`, which keeps the first of two
writes; that one write is both the answer and the line's done mark. A runner (re)starting a batch lists its
answers and runs only the lines without one; a line that was on the engine when its process stopped has no
answer and runs again, a line whose answer was written never does. A batch is held by one runner at a time
through a lease in its record (`runner`, `lease_until`, taken with `Store.update(if_updated_at=...)`),
renewed every `HEARTBEAT_S`; a runner that stopped without a word is replaced once its lease ran out, or at
once by a runner of the same host (the lease names the host and the process, which is seen to be gone).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from starlette.responses import Response

from trtllm_truss.api import batches as shapes
from trtllm_truss.api.messages import error_response as anthropic_error
from trtllm_truss.serving import chat, completions, messages, responses
from trtllm_truss.serving.batches import ANSWER, BATCH, CONTENT, EVERY, FILE, INPUT, answer_ids
from trtllm_truss.serving.core import RequestCore
from trtllm_truss.serving.openai_shared import openai_error
from trtllm_truss.store import StoredObject, StoreError
from trtllm_truss.streaming.pool import background_request

logger = logging.getLogger(__name__)

LEASE_S = 30.0
RETRIED = (429, 503)  # answers not kept: the line runs again later
HEARTBEAT_S = 1.0
LOAD_HOLD_S = 0.5  # under load this long after the last interactive request seen
LOAD_POLL_S = 0.02  # how often a line waiting for its share reads the load (a shared counter: cheap)
_HANDLERS: dict[str, Callable[..., Any]] = {
    "/v1/chat/completions": chat.chat_completions,
    "/v1/completions": completions.completions,
    "/v1/responses": responses.responses,
    shapes.MESSAGES_ENDPOINT: messages.messages,
}


class BatchCaller:
    """What a batch line's route sees of its caller: the batch's owner (a `/v1/responses` line stores and
    continues that owner's responses), and a client that never leaves."""

    headers: dict[str, str] = {}
    query_params: dict[str, str] = {}

    def __init__(self, owner: str) -> None:
        self.store_owner = owner

    async def is_disconnected(self) -> bool:
        return False


class _Run:
    """One batch being run by this runner."""

    def __init__(self, batch: StoredObject, counts: dict[str, int]) -> None:
        self.batch = batch
        self.counts = counts
        self.tasks: set[asyncio.Task] = set()
        self.stopped = False
        self.lost = False  # another runner holds it, or it was deleted: leave it as it is
        self.ending: str | None = None  # "cancelled" or "expired"

    def halt(self, *, lost: bool = False, ending: str | None = None) -> None:
        self.stopped = True
        self.lost = self.lost or lost
        self.ending = self.ending or ending
        for task in list(self.tasks):
            task.cancel()


def _error_body(endpoint: str, status: int, message: str, param: str | None = None) -> Any:
    rendered = anthropic_error(status, message) if endpoint == shapes.MESSAGES_ENDPOINT else openai_error(status, message, param=param)
    return json.loads(rendered.body)


class LineShare:
    """How many batch lines may be on the engine now: `max_in_flight` on an idle host,
    `max_in_flight_under_load` while interactive requests are in flight (and `LOAD_HOLD_S` after).
    Without a load signal (`interactive_in_flight` None), always `max_in_flight`."""

    def __init__(self, config: Any, interactive_in_flight: Callable[[], int] | None) -> None:
        self.idle = config.max_in_flight
        self.under_load = config.max_in_flight_under_load
        self._interactive = interactive_in_flight
        self._load_seen_at = float("-inf")
        self.in_flight = 0  # this runner's lines on the engine
        self._freed = asyncio.Event()

    def allowed(self) -> int:
        if self._interactive is None:
            return self.idle
        now = time.monotonic()
        if self._interactive() > 0:
            self._load_seen_at = now
            return self.under_load
        return self.under_load if now - self._load_seen_at < LOAD_HOLD_S else self.idle

    async def acquire(self, run: _Run) -> bool:
        """Wait for a line's place (False if the run stopped meanwhile): woken by a line's end, and every
        LOAD_POLL_S to read the load again."""
        while self.in_flight >= self.allowed():
            if run.stopped:
                return False
            self._freed.clear()
            try:
                await asyncio.wait_for(self._freed.wait(), LOAD_POLL_S)
            except asyncio.TimeoutError:
                pass
        if run.stopped:
            return False
        self.in_flight += 1
        return True

    def release(self) -> None:
        self.in_flight -= 1
        self._freed.set()


class BatchRunner:
    """Runs the host's batches; `start()` on the owning process's event loop, `stop()` before it ends.
    `interactive_in_flight`: the host's interactive requests in flight now (every front process's, not the
    batch lines'); None runs `max_in_flight` lines whatever the load."""

    def __init__(self, core: RequestCore, config: Any, runner_id: str | None = None,
                 interactive_in_flight: Callable[[], int] | None = None) -> None:
        self.core = core
        self.config = config
        self.runner_id = runner_id or f"{socket.gethostname()}:{os.getpid()}"
        self.lines_answered = 0  # by this runner, since its start
        self.interactive_in_flight = interactive_in_flight
        self.share: LineShare | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._runs: set[_Run] = set()

    @property
    def store(self) -> Any:
        return self.core.store

    def start(self) -> None:
        self.share = LineShare(self.config, self.interactive_in_flight)
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="batch runner")
        logger.info("batch runner %s started (%d lines at once, %d under interactive load)", self.runner_id,
                    self.config.max_in_flight, self.config.max_in_flight_under_load if self.interactive_in_flight
                    else self.config.max_in_flight)

    def halt(self) -> None:
        """At once, from the exit signal's handler, before the stream workers stop: nothing answered from
        now on is kept (a line cut off by the stop would read as failed; it runs again at the next start)."""
        self._stopping = True
        for run in list(self._runs):
            run.halt(lost=True)
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        self.halt()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        while True:
            ran = False
            try:
                ran = await self.run_once()
            except StoreError as exc:
                logger.warning("batch runner: %s", exc)
            except Exception:  # noqa: BLE001 - the runner outlives a batch it could not handle
                logger.exception("batch runner: a pass failed")
            if not ran:
                await asyncio.sleep(self.config.poll_s)

    async def run_once(self) -> bool:
        """Run the oldest active batch this runner can hold until it ends (True) or cannot go on for now:
        lost to another runner, lines refused for a while (False, as when there is none)."""
        for batch in await asyncio.to_thread(self.store.find, BATCH, statuses=shapes.ACTIVE, limit=EVERY):
            held = await self._claim(batch)
            if held is not None:
                return await self._run(held)
        return False

    def _held_by_another(self, holder: str | None, lease_until: float) -> bool:
        """Whether another live runner holds a lease: not if it ran out, nor if its holder was a process of
        this host that is gone (a restarted server takes its batches back at once)."""
        if holder in (None, self.runner_id) or lease_until <= time.time():
            return False
        host, _, pid = holder.rpartition(":")
        if host == socket.gethostname() and pid.isdigit():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
        return True

    async def _claim(self, batch: StoredObject) -> StoredObject | None:
        now = time.time()
        if self._held_by_another(batch.body.get("runner"), batch.body.get("lease_until", 0.0)):
            return None
        held = StoredObject(BATCH, batch.id, batch.owner, batch.status,
                            dict(batch.body, runner=self.runner_id, lease_until=now + LEASE_S), batch.created_at)
        if await asyncio.to_thread(self.store.update, held, if_updated_at=batch.updated_at):
            return held
        return None

    # --- one batch --------------------------------------------------------------------------------

    async def _run(self, batch: StoredObject) -> bool:
        store, owner = self.store, batch.owner
        inputs = await asyncio.to_thread(store.get, INPUT, batch.id, owner)
        if inputs is None:  # evicted or expired from the store before it ran
            await self._end(batch, "failed", errors=[{"code": "input_lost", "message": "the batch's requests are no"
                                                      " longer in the store (runtime.store bounds)", "param": None, "line": None}])
            return True
        lines = inputs.body["lines"]
        answers = answer_ids(batch.id, await asyncio.to_thread(store.find, ANSWER, owner=owner, id_prefix=batch.id + "/", limit=EVERY))
        run = _Run(batch, _counts_of(answers))
        if batch.status == "cancelling":
            run.halt(ending="cancelled")
        elif time.time() > batch.body["expires_at"]:
            run.halt(ending="expired")
        pending = [i for i in range(len(lines)) if i not in answers]
        if pending and not run.stopped:
            logger.info("batch %s: %d of %d lines to run", batch.id, len(pending), len(lines))
            self._runs.add(run)
            try:
                await self._run_lines(run, lines, pending)
            finally:
                self._runs.discard(run)
        return not run.lost and not self._stopping and await self._finish(run)

    async def _run_lines(self, run: _Run, lines: list[dict[str, Any]], pending: list[int]) -> None:
        assert self.share is not None
        share = self.share
        watcher = asyncio.create_task(self._watch(run))
        caller = BatchCaller(run.batch.owner)
        try:
            for i in pending:
                if not await share.acquire(run):
                    break
                task = asyncio.create_task(self._line(run, i, lines[i], caller))
                run.tasks.add(task)
                task.add_done_callback(lambda t: (run.tasks.discard(t), share.release()))
            while run.tasks:
                await asyncio.wait(set(run.tasks))
        finally:
            watcher.cancel()
            for task in list(run.tasks):  # this process is stopping: what was on the engine runs again later
                task.cancel()
            await asyncio.gather(watcher, *run.tasks, return_exceptions=True)

    async def _line(self, run: _Run, index: int, line: dict[str, Any], caller: BatchCaller) -> None:
        endpoint = run.batch.body["endpoint"]
        background_request.set(True)  # this task's streams are not interactive load (its own context)
        status_code, body = await self.answer(endpoint, line["body"], caller)
        if self._stopping or run.lost:
            return  # cut off by the stop, or no longer this runner's: run again by whoever holds it next
        if status_code in RETRIED:
            return  # the engine is busy or away: the line runs again in the batch's next pass
        kept = shapes.answer(line["custom_id"], status_code, body)
        obj = StoredObject(ANSWER, f"{run.batch.id}/{index:07d}", run.batch.owner,
                           "succeeded" if 200 <= status_code < 300 else "errored", kept)
        try:
            added = await asyncio.to_thread(self.store.add, obj)
            if not added and await asyncio.to_thread(self.store.get, ANSWER, obj.id, obj.owner) is None:
                # larger than the store's whole bound: an error answer in its place
                kept = shapes.answer(line["custom_id"], 500, _error_body(
                    endpoint, 500, "the answer is larger than the store's bound (runtime.store.max_bytes)"))
                obj = StoredObject(ANSWER, obj.id, obj.owner, "errored", kept)
                added = await asyncio.to_thread(self.store.add, obj)
        except StoreError as exc:  # not kept: the line runs again in the batch's next pass
            logger.warning("batch %s line %d: its answer was not kept: %s", run.batch.id, index, exc)
            return
        if added:
            run.counts[obj.status] += 1
            self.lines_answered += 1

    async def answer(self, endpoint: str, body: dict[str, Any], caller: BatchCaller) -> tuple[int, Any]:
        """(status code, body) of one line, as its route answers it without a stream."""
        refusal = shapes.line_refusal(endpoint, body)
        if refusal is not None:
            field, why = refusal
            return 400, _error_body(endpoint, 400, f"invalid request: {field}: {why}", field)
        try:
            result = await _HANDLERS[endpoint](self.core, dict(body), caller)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a line's failure is its answer, not the batch's end
            logger.exception("batch line to %s failed", endpoint)
            return 500, _error_body(endpoint, 500, "the request failed inside the server")
        if isinstance(result, BaseModel):
            return 200, result.model_dump(mode="json", exclude_none=True)
        if isinstance(result, Response) and hasattr(result, "body"):
            return result.status_code, json.loads(result.body)
        if isinstance(result, dict):
            return 200, result
        return 500, _error_body(endpoint, 500, f"the route answered a {type(result).__name__}")

    async def _watch(self, run: _Run) -> None:
        """Every HEARTBEAT_S: renew the lease and the counts; stop on a cancel, a deletion, a lost lease or
        the end of the completion window."""
        batch = run.batch
        while not run.stopped:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                current = await asyncio.to_thread(self.store.get, BATCH, batch.id, batch.owner)
                if current is None or current.body.get("runner") != self.runner_id:
                    run.halt(lost=True)
                elif current.status == "cancelling":
                    run.halt(ending="cancelled")
                elif time.time() > current.body["expires_at"]:
                    run.halt(ending="expired")
                else:
                    body = dict(current.body, lease_until=time.time() + LEASE_S, counts=dict(run.counts))
                    renewed = StoredObject(BATCH, batch.id, batch.owner, current.status, body, current.created_at)
                    await asyncio.to_thread(self.store.update, renewed, if_status=("in_progress",),
                                            if_updated_at=current.updated_at)
            except StoreError as exc:
                logger.warning("batch %s: the lease was not renewed: %s", batch.id, exc)

    # --- the end ------------------------------------------------------------------------------------

    async def _finish(self, run: _Run) -> bool:
        """End the batch if every line is answered (or it was cancelled or expired); False if some lines
        must run again."""
        store, batch = self.store, run.batch
        current = await asyncio.to_thread(store.get, BATCH, batch.id, batch.owner)
        if current is None or current.body.get("runner") != self.runner_id or current.status not in shapes.ACTIVE:
            return True
        ending = run.ending or ("cancelled" if current.status == "cancelling" else None)
        answers = answer_ids(batch.id, await asyncio.to_thread(store.find, ANSWER, owner=batch.owner, id_prefix=batch.id + "/", limit=EVERY))
        if ending is None and len(answers) < current.body["lines"]:
            return False  # answers not kept (refused for now, or the store failed): those lines run again
        await self._end(current, ending or "completed", answers=answers)
        return True

    async def _end(self, batch: StoredObject, status: str, *, answers: dict[int, dict[str, Any]] | None = None,
                   errors: list[dict[str, Any]] | None = None) -> None:
        store, body = self.store, dict(batch.body)
        answers = answers or {}
        body["counts"] = _counts_of(answers)
        body["runner"] = None
        if errors:
            body["errors"] = errors
        if body["api"] == "openai" and status != "failed":
            shapes.stamp(body, "finalizing")
            inputs = await asyncio.to_thread(store.get, INPUT, batch.id, batch.owner)
            custom_ids = [line["custom_id"] for line in inputs.body["lines"]] if inputs is not None else []
            body["output_file_id"], body["error_file_id"] = await self._write_files(batch, answers, custom_ids, status)
        shapes.stamp(body, status)
        ended = StoredObject(BATCH, batch.id, batch.owner, status, body, batch.created_at)
        if await asyncio.to_thread(store.update, ended, if_status=shapes.ACTIVE):
            logger.info("batch %s %s: %d answered (%d errors) of %d", batch.id, status, len(answers),
                        body["counts"]["errored"], body["lines"])

    async def _write_files(self, batch: StoredObject, answers: dict[int, dict[str, Any]], custom_ids: list[str],
                           status: str) -> tuple[str | None, str | None]:
        """OpenAI's output file (2xx answers) and error file (the others; with `expired`, the lines not run)."""
        output, errors = [], []
        for i in sorted(answers):
            kept = answers[i]
            (output if 200 <= kept["status_code"] < 300 else errors).append(shapes.openai_output_line(batch.id, i, kept))
        if status == "expired":
            errors += [shapes.openai_expired_line(batch.id, i, c) for i, c in enumerate(custom_ids) if i not in answers]
        base = batch.id.removeprefix("batch_")
        ids = []
        for part, lines in (("output", output), ("error", errors)):
            if not lines:
                ids.append(None)
                continue
            file_id = f"file-{base}{part}"  # the same id if a restart ends the batch again
            text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
            obj = shapes.file_object(file_id, len(text.encode("utf-8")), f"{batch.id}_{part}.jsonl", "batch_output", time.time())
            if not await asyncio.to_thread(self.store.put, StoredObject(CONTENT, file_id, batch.owner, "processed", {"text": text})):
                logger.error("batch %s: its %s file is larger than the store's bound", batch.id, part)
                ids.append(None)
                continue
            await asyncio.to_thread(self.store.put, StoredObject(FILE, file_id, batch.owner, "processed", obj))
            ids.append(file_id)
        return ids[0], ids[1]


def _counts_of(answers: dict[int, dict[str, Any]]) -> dict[str, int]:
    succeeded = sum(1 for kept in answers.values() if 200 <= kept["status_code"] < 300)
    return {"succeeded": succeeded, "errored": len(answers) - succeeded}
