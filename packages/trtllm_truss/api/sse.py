"""OpenAI stream chunks without a pydantic model per chunk.

Each content chunk of a stream differs from the others only in its text, so the chunk's JSON is cut
once, around the text, from a real `ChatCompletionChunk`/`Completion`, and each chunk is then the two
fixed halves around the JSON string of its text: the same JSON as the pydantic model dumps, at a
fraction of the cost (on truss's single event-loop thread, the cost of a chunk is what matters).
"""

from __future__ import annotations

import json

from pydantic import BaseModel

_MARK = "\u0000text\u0000"


class ChunkTemplate:
    __slots__ = ("_head", "_tail")

    def __init__(self, chunk_with_mark: BaseModel) -> None:
        dumped = chunk_with_mark.model_dump_json()
        mark = json.dumps(_MARK)
        head, found, tail = dumped.partition(mark)
        if not found:
            raise ValueError("the chunk does not hold the text mark")
        self._head = b"data: " + head.encode()
        self._tail = tail.encode() + b"\n\n"

    def event(self, text: str) -> bytes:
        return self._head + json.dumps(text, ensure_ascii=False).encode() + self._tail

    @staticmethod
    def mark() -> str:
        return _MARK
