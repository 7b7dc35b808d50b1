"""The Messages API's output, built from one generation's events in the order they come.

`MessageEvents` is fed the generation as it goes and returns the stream events each step makes, in
Anthropic's order: `message_start` (empty content), then per content block `content_block_start`,
its deltas (`thinking_delta`, `text_delta`, `input_json_delta`) and `content_block_stop`; then
`message_delta` (stop reason, stop sequence, usage) and `message_stop`. Blocks are opened as their
first piece arrives (thinking, text, then tool_use blocks, in the order the model wrote them) and
closed when another begins or the generation ends. The same builder answers a non-streamed request
with `message()`, so both carry the same content. The prompt's token count is known only at the
end: `message_start` says 0 and `message_delta` gives the count (the SDKs take it from there).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import from_json

from trtllm_truss.api.messages import (
    error_body,
    message_object,
    message_usage,
    new_message_id,
    stop_reason,
)


class MessageEvents:
    def __init__(self, model: str, *, emit: bool) -> None:
        self.id = new_message_id()
        self.model = model
        self.emit = emit
        self.content: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._json: dict[int, str] = {}  # tool_use block index -> its arguments so far (JSON text)
        self._calls: dict[int, int] = {}  # tool-call index -> block index
        self.final: dict[str, Any] | None = None

    def _snapshot(self, **fields: Any) -> dict[str, Any]:
        defaults = {"stop_reason_": None, "stop_sequence": None, "input_tokens": 0, "output_tokens": 0}
        return message_object(self.id, self.model, fields.pop("content", []), **{**defaults, **fields})

    def start(self) -> list[dict[str, Any]]:
        return [{"type": "message_start", "message": self._snapshot()}] if self.emit else []

    def _begin(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self.content.append(block)
        self._open = block
        if self.emit:
            start = dict(block, input={}) if block["type"] == "tool_use" else dict(block)
            events.append({"type": "content_block_start", "index": len(self.content) - 1, "content_block": start})
        return events

    def _close(self) -> list[dict[str, Any]]:
        block, self._open = self._open, None
        if block is None:
            return []
        index = self.content.index(block)
        if block["type"] == "tool_use":
            block["input"] = _arguments(self._json.pop(index, ""))
        return [{"type": "content_block_stop", "index": index}] if self.emit else []

    def _delta(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        if not self.emit:
            return []
        return [{"type": "content_block_delta", "index": len(self.content) - 1, "delta": delta}]

    def reasoning(self, delta: str) -> list[dict[str, Any]]:
        if not delta:
            return []
        events = []
        if self._open is None or self._open["type"] != "thinking":
            # No signature: this model's thinking is not signed (clients send it back as it is).
            events = self._begin({"type": "thinking", "thinking": "", "signature": ""})
        self._open["thinking"] += delta
        return events + self._delta({"type": "thinking_delta", "thinking": delta})

    def text(self, delta: str) -> list[dict[str, Any]]:
        if not delta:
            return []
        events = []
        if self._open is None or self._open["type"] != "text":
            events = self._begin({"type": "text", "text": ""})
        self._open["text"] += delta
        return events + self._delta({"type": "text_delta", "text": delta})

    def tool_call(self, index: int, call_id: str, name: str) -> list[dict[str, Any]]:
        events = self._begin({"type": "tool_use", "id": call_id, "name": name, "input": {}})
        self._calls[index] = len(self.content) - 1
        return events

    def tool_arguments(self, index: int, delta: str) -> list[dict[str, Any]]:
        block = self._calls[index]
        self._json[block] = self._json.get(block, "") + delta
        if not self.emit or not delta:
            return []
        return [{"type": "content_block_delta", "index": block, "delta": {"type": "input_json_delta", "partial_json": delta}}]

    def finish(
        self, finish_reason: str | None, prompt_tokens: int, completion_tokens: int, stop_sequence: str | None = None,
        cached_tokens: int = 0,
    ) -> list[dict[str, Any]]:
        events = self._close()
        reason = stop_reason(finish_reason, stop_sequence)
        # Anthropic's input_tokens leave out the tokens read from the cache (cache_read_input_tokens).
        uncached = prompt_tokens - cached_tokens
        self.final = self._snapshot(
            content=self.content, stop_reason_=reason, stop_sequence=stop_sequence if reason == "stop_sequence" else None,
            input_tokens=uncached, output_tokens=completion_tokens, cache_read_input_tokens=cached_tokens,
        )
        if self.emit:
            events.append({
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": self.final["stop_sequence"]},
                "usage": message_usage(uncached, completion_tokens, cached_tokens),
            })
            events.append({"type": "message_stop"})
        return events

    def failed(self, message: str, status: int = 500) -> list[dict[str, Any]]:
        """A generation that failed after the stream began: Anthropic's `error` event."""
        return [error_body(status, message)]

    def message(self) -> dict[str, Any]:
        assert self.final is not None, "finish() first"
        return self.final


def _arguments(text: str) -> dict[str, Any]:
    """A tool call's arguments as the object `tool_use.input` is (the parser gives JSON text). A call
    the token limit cut has the start of an object: its complete members, as the `anthropic` SDK
    reads the streamed `input_json_delta` fragments (jiter's partial mode, which pydantic-core shares)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        try:
            value = from_json(text, allow_partial=True)
        except ValueError:
            return {"_raw": text}
    return value if isinstance(value, dict) else {"_value": value}
