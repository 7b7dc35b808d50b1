"""What the truss process and a stream worker say to each other over their socket pair.

Frames are a 4-byte little-endian length and a pickled list of messages (both ends are this
package, started by the same interpreter, over a socket pair nobody else holds). Many messages ride
in one frame: a worker flushes everything produced in one event-loop turn together, so under load
the truss process wakes once for many tokens.

truss -> worker: `("start", rid, GenerationSpec)`, `("cancel", rid)`.
worker -> truss: first `("ready", WorkerInfo)`, then updates `(rid, text, log_probs, StreamEnd | None)`,
`log_probs` None or a list of (text the token added, log prob, the token's bytes, the position's most
likely tokens as (text, log prob, bytes), empty unless asked for), one per token whose text is in this
update's `text` (a request's entry texts concatenate to its text).

`text` is a string (the answer's text) for a request without output parsers (the fast path), or, for
one with a reasoning or tool-call parser (`GenerationSpec.reasoning_parser` / `tool_parser`), a list
of parts in order: `("text", s)`, `("reasoning", s)`, `("tool", index, id | None, name | None,
arguments fragment)` (a call's first part carries its id and name, later ones only argument text).
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass

from trtllm_truss.engine.client import GenerationParams
from trtllm_truss.streaming.itl import ItlSummary

_HEADER = struct.Struct("<I")
MAX_FRAME_BYTES = 1 << 30



@dataclass(frozen=True)
class GenerationSpec:
    """One request as the truss process validated it; the worker tokenizes and streams it."""

    params: GenerationParams  # sampling, max_tokens, stop strings, bad words; text_input unused
    prompt: str | None = None  # a completion prompt, or
    # chat turns: (role, text) pairs, or OpenAI-shaped dicts (role, content, tool_calls with
    # arguments as objects, tool_call_id, name) as the chat template takes them, or
    messages: tuple[tuple[str, str] | dict, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None  # a completion prompt as token ids (sent as they are)
    prompt_field: str = "prompt"  # where the prompt came from, for errors about it
    keep_stop_text: bool = False  # native API: the stop string stays in the text (as the engine returns it)
    literal_special_tokens: bool = True  # special-token text in the prompt is plain text, not control tokens
    tools: tuple[dict, ...] | None = None  # function tools (OpenAI's shape) for the chat template's `tools=`
    chat_template_kwargs: tuple[tuple[str, object], ...] = ()  # extra template variables (enable_thinking)
    # Output parsers (trtllm_truss.parsers registry names), run in the worker on the answer's text:
    reasoning_parser: str | None = None
    tool_parser: str | None = None
    tool_parser_arg: str | None = None  # the named function of a guided `tool_choice`
    # A JSON Schema guide as the client sent it: the worker validates a completed answer against it.
    output_schema: str | None = None
    unenforced: tuple[str, ...] = ()  # what of the schema the engine does not enforce (a response header says)
    # A forced call's structural tag for a prompt that opened the model's thinking (guides.tool_syntax):
    # (what such a prompt ends with, the tag); the worker sends it instead of params' guide when it does.
    thinking_guide: tuple[str, str] | None = None
    # Count only: the worker renders and tokenizes the prompt as for generating, and ends the request with
    # its `StreamEnd.prompt_tokens`, sending nothing to the engine (the count routes, serving.token_count).
    count_only: bool = False


@dataclass(frozen=True)
class StreamEnd:
    """How one request ended. `status` is the HTTP status of an error that came before any text."""

    finish_reason: str | None = None  # "stop" | "length" | "tool_calls"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    status: int | None = None
    itl: ItlSummary | None = None  # the gaps between the request's pieces of text, bucketed
    # Speculative decoding (the engine's perf outputs): draft tokens proposed and accepted for this request.
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    stop_sequence: str | None = None  # the stop string that ended the generation, if one did
    # A completed guided JSON answer checked against the request's schema (jsonschema): True valid,
    # False not, None not checked (no schema, or cut by max_tokens or a stop string).
    schema_valid: bool | None = None
    # Prompt tokens whose KV the engine found in its cache (its reused blocks x tokens per block), not computed again.
    cached_tokens: int = 0
    # The error is the engine's being unreachable (a 503 of engine.client.UpstreamError): readiness
    # follows such refusals (serving.availability).
    engine_down: bool = False


@dataclass(frozen=True)
class WorkerInfo:
    pid: int
    vocab_size: int
    max_token_bytes: int  # the longest token's bytes: bounds a prompt's bytes before tokenizing
    # The output parsers this deployment uses (runtime.*_parser, "auto" resolved from the chat template).
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None


def encode_frame(messages: list) -> bytes:
    payload = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


class FrameReader:
    """Splits a byte stream into frames; `feed` returns the messages of every complete frame."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list:
        buffer = self._buffer
        buffer += data
        messages: list = []
        offset = 0
        end = len(buffer)
        while end - offset >= 4:
            (length,) = _HEADER.unpack_from(buffer, offset)
            if length > MAX_FRAME_BYTES:
                raise ValueError(f"frame of {length} bytes: the peer is not a stream worker")
            if end - offset - 4 < length:
                break
            messages += pickle.loads(bytes(buffer[offset + 4 : offset + 4 + length]))
            offset += 4 + length
        if offset:
            del buffer[:offset]
        return messages
