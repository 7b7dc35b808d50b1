"""The Responses API's output, built from one generation's events in the order they come.

`ResponseEvents` is fed the generation as it goes (reasoning text, answer text, tool calls and their
argument fragments, the end) and returns the semantic stream events each step makes, in OpenAI's
order: `response.created`, `response.in_progress`; per output item `response.output_item.added`,
its parts (`response.content_part.added`, `response.output_text.delta`... / `response.reasoning_text.delta`...
/ `response.function_call_arguments.delta`...), their `.done` events, `response.output_item.done`;
then `response.completed` (or `response.incomplete` when `max_output_tokens` ran out). The same
builder answers a non-streamed request with `response()`, so both carry the same output.

Items are opened as their first piece arrives: a reasoning item, a message, then function calls,
in the order the model wrote them; an item is closed when another begins or the generation ends.
"""

from __future__ import annotations

import json
import time
from typing import Any

from trtllm_truss.api.responses import ResponsesRequest, new_id, response_object, usage


class ResponseEvents:
    def __init__(self, req: ResponsesRequest, *, emit: bool) -> None:
        self.req = req
        self.id = new_id("resp")
        self.created_at = time.time()
        self.emit = emit  # a streamed answer: build the events (else only the output)
        self.output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being written
        self._calls: dict[int, dict[str, Any]] = {}  # tool-call index -> its item
        self._sequence = 0
        self.reasoning_chars = 0

    # --- events ---------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _snapshot(self, status: str, **extra: Any) -> dict[str, Any]:
        return response_object(self.req, self.id, self.created_at, status=status, output=list(self.output), **extra)

    def start(self) -> list[dict[str, Any]]:
        if not self.emit:
            return []
        return [
            self._event("response.created", response=self._snapshot("in_progress")),
            self._event("response.in_progress", response=self._snapshot("in_progress")),
        ]

    def _item_where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self.output.index(item)}

    def _begin(self, item: dict[str, Any], part: dict[str, Any] | None) -> list[dict[str, Any]]:
        events = self._close()
        self.output.append(item)
        self._open = item
        if self.emit:
            events.append(self._event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item, content=[]) if "content" in item else dict(item)))
            if part is not None:
                events.append(self._event("response.content_part.added", **self._item_where(item), content_index=0, part=dict(part)))
        return events

    def _close(self) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        if item["status"] == "in_progress":
            item["status"] = "completed"
        if not self.emit:
            return []
        where = self._item_where(item)
        events = []
        if item["type"] == "message":
            part = item["content"][0]
            events.append(self._event("response.output_text.done", **where, content_index=0, text=part["text"], logprobs=[]))
            events.append(self._event("response.content_part.done", **where, content_index=0, part=part))
        elif item["type"] == "reasoning":
            part = item["content"][0]
            events.append(self._event("response.reasoning_text.done", **where, content_index=0, text=part["text"]))
            events.append(self._event("response.content_part.done", **where, content_index=0, part=part))
        else:
            events.append(self._event("response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"]))
        events.append(self._event("response.output_item.done", output_index=where["output_index"], item=item))
        return events

    def reasoning(self, delta: str) -> list[dict[str, Any]]:
        if not delta:
            return []
        events = []
        if self._open is None or self._open["type"] != "reasoning":
            part = {"type": "reasoning_text", "text": ""}
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [part], "status": "in_progress"}
            events = self._begin(item, part)
        self._open["content"][0]["text"] += delta
        self.reasoning_chars += len(delta)
        if self.emit:
            events.append(self._event("response.reasoning_text.delta", **self._item_where(self._open), content_index=0, delta=delta))
        return events

    def text(self, delta: str) -> list[dict[str, Any]]:
        if not delta:
            return []
        events = []
        if self._open is None or self._open["type"] != "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": [part]}
            events = self._begin(item, part)
        self._open["content"][0]["text"] += delta
        if self.emit:
            events.append(self._event("response.output_text.delta", **self._item_where(self._open), content_index=0, delta=delta, logprobs=[]))
        return events

    def tool_call(self, index: int, call_id: str, name: str) -> list[dict[str, Any]]:
        item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress", "call_id": call_id, "name": name, "arguments": ""}
        self._calls[index] = item
        return self._begin(item, None)

    def tool_arguments(self, index: int, delta: str) -> list[dict[str, Any]]:
        item = self._calls[index]
        item["arguments"] += delta
        if not self.emit or not delta:
            return []
        return [self._event("response.function_call_arguments.delta", **self._item_where(item), delta=delta)]

    def finish(
        self, finish_reason: str | None, prompt_tokens: int, completion_tokens: int, stop_sequence: str | None = None,
        cached_tokens: int = 0,
    ) -> list[dict[str, Any]]:
        self.usage = usage(prompt_tokens, completion_tokens, cached_tokens=cached_tokens)
        self.incomplete = finish_reason == "length"
        # What the limit cut is incomplete: the last item, unless it is a call whose arguments were
        # complete (a call the limit cut keeps the arguments generated so far: not a whole object).
        last = self._open
        if self.incomplete and last is not None:
            if last["type"] != "function_call" or not complete_object(last["arguments"]):
                last["status"] = "incomplete"
        events = self._close()
        if self.emit:
            kind = "response.incomplete" if self.incomplete else "response.completed"
            events.append(self._event(kind, response=self.response()))
        return events

    def failed(self, message: str, status: int = 500) -> list[dict[str, Any]]:
        """A generation that failed after the stream began: `error`, then `response.failed`."""
        error = {"code": "server_error", "message": message}
        return [
            self._event("error", code="server_error", message=message, param=None),
            self._event("response.failed", response=self._snapshot("failed", error=error)),
        ]

    def response(self) -> dict[str, Any]:
        """The whole response, once `finish` has been fed."""
        if self.incomplete:
            return self._snapshot("incomplete", usage_=self.usage, incomplete_reason="max_output_tokens")
        return self._snapshot("completed", usage_=self.usage)


def complete_object(text: str) -> bool:
    """Whether a call's arguments are a whole JSON object (not the start of one the limit cut)."""
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
