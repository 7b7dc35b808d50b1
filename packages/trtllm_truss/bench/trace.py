"""Multi-turn traces in Mooncake's format, and the requests replayed from them.

A trace line (kvcache-ai/Mooncake `FAST25-release/traces/*.jsonl`):
  {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 2354]}
`timestamp`: arrival in ms after the trace's start; lengths in tokens; `hash_ids`: one id per block of
`trace_block_tokens` (512 in Mooncake's traces) prompt tokens, equal ids meaning equal prefix blocks; the
last block may be partial. Raw text is not part of a trace.

A replayed prompt is made of token ids drawn per hash id: the ids of hash id h are always the same
(`block_tokens` whole-word vocabulary tokens from a generator seeded with (seed, h)), so two requests
that share a prefix of hash ids share exactly those token blocks, and an engine's prefix cache sees the
reuse the trace records. `block_tokens` scales the trace down for small models: each hash id becomes
`block_tokens` tokens and every length is scaled by block_tokens / trace_block_tokens. Choose it as a
multiple of the engine's tokens per KV block so that the trace's blocks are the engine's blocks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtllm_truss.bench.workload import BenchRequest, PromptBuilder, TokenizerLike, WorkloadError

MOONCAKE_BLOCK_TOKENS = 512


class TraceRequest(BaseModel):
    """One request of a Mooncake-format trace (other keys on the line are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    timestamp: float = Field(ge=0, description="arrival, ms after the trace's start")
    input_length: int = Field(ge=1, description="prompt tokens")
    output_length: int = Field(ge=0, description="generated tokens")
    hash_ids: tuple[int, ...] = Field(min_length=1, description="one id per prompt block; equal ids: equal prefix blocks")


def read_trace(path: Path, limit: int | None = None) -> list[TraceRequest]:
    """The trace's requests in file order (at most `limit`); errors name the line and the field."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise WorkloadError(f"trace {path}: {exc.strerror or exc}") from exc
    requests: list[TraceRequest] = []
    for number, line in enumerate(lines, start=1):
        if limit is not None and len(requests) >= limit:
            break
        if not line.strip():
            continue
        where = f"trace {path} line {number}"
        try:
            requests.append(TraceRequest.model_validate(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not JSON ({exc.msg})") from exc
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "line"
            raise WorkloadError(f"{where}: {field}: {first['msg']}") from None
    if not requests:
        raise WorkloadError(f"trace {path}: no requests in it")
    return requests


@dataclass(frozen=True)
class TraceSynthesis:
    """How trace requests become token-id prompts."""

    block_tokens: int = MOONCAKE_BLOCK_TOKENS  # tokens per hash id in the replayed prompts
    trace_block_tokens: int = MOONCAKE_BLOCK_TOKENS  # tokens per hash id in the trace
    max_input_tokens: int | None = None  # longer prompts keep their first whole blocks that fit
    max_output_tokens: int | None = None  # caps output_length
    seed: int = 0

    def __post_init__(self) -> None:
        if self.block_tokens < 1 or self.trace_block_tokens < 1:
            raise WorkloadError("trace block tokens: expected a positive number of tokens per block")
        if self.max_input_tokens is not None and self.max_input_tokens < self.block_tokens:
            raise WorkloadError(
                f"trace: the input maximum ({self.max_input_tokens}) is below one block ({self.block_tokens} tokens);"
                " lower --trace-block-tokens"
            )

    def scaled_tokens(self, request: TraceRequest) -> int:
        """The trace's prompt length scaled to `block_tokens`, within the blocks its hash ids describe."""
        scaled = math.ceil(request.input_length * self.block_tokens / self.trace_block_tokens)
        return min(max(scaled, 1), len(request.hash_ids) * self.block_tokens)

    def input_tokens(self, request: TraceRequest) -> int:
        """The replayed prompt's length: scaled, then cut to the whole blocks that fit the input maximum."""
        length = self.scaled_tokens(request)
        if self.max_input_tokens is not None and length > self.max_input_tokens:
            length = (self.max_input_tokens // self.block_tokens) * self.block_tokens
        return length

    def output_tokens(self, request: TraceRequest) -> int:
        length = max(request.output_length, 1)
        return min(length, self.max_output_tokens) if self.max_output_tokens is not None else length


@dataclass(frozen=True)
class TracePrompt:
    """A trace request as replayed: what is sent, when, and which of its hash ids it still covers."""

    request: BenchRequest
    arrival_s: float  # after the replay's start, already time-scaled
    hash_ids: tuple[int, ...]
    truncated: bool  # the input maximum cut whole blocks off the end


class BlockTokens:
    """The token ids of each hash id: `block_tokens` draws from a vocabulary, seeded by (seed, hash id)."""

    def __init__(self, vocabulary: Sequence[int], block_tokens: int, seed: int = 0):
        if len(vocabulary) < 16:
            raise WorkloadError("trace: fewer than 16 usable vocabulary tokens to build prompts from")
        self._vocabulary = np.asarray(vocabulary, dtype=np.int64)
        self._block_tokens = block_tokens
        self._seed = seed
        self._blocks: dict[int, tuple[int, ...]] = {}

    def of(self, hash_id: int) -> tuple[int, ...]:
        block = self._blocks.get(hash_id)
        if block is None:
            rng = np.random.default_rng([self._seed, hash_id & 0xFFFFFFFFFFFFFFFF])
            block = tuple(int(v) for v in rng.choice(self._vocabulary, size=self._block_tokens))
            self._blocks[hash_id] = block
        return block

    def prompt(self, hash_ids: Sequence[int], length: int) -> list[int]:
        """The first `length` tokens of the blocks of `hash_ids`."""
        ids: list[int] = []
        for hash_id in hash_ids:
            if len(ids) >= length:
                break
            ids.extend(self.of(hash_id))
        return ids[:length]


def word_vocabulary(tokenizer: TokenizerLike) -> list[int]:
    """Whole-word vocabulary tokens: their decoded text re-tokenizes to themselves, so text targets
    send the same prompt as the token-id targets."""
    return PromptBuilder._whole_word_ids(tokenizer)


def synthesize(
    trace: Sequence[TraceRequest],
    synthesis: TraceSynthesis,
    vocabulary: Sequence[int],
    *,
    time_scale: float = 1.0,
    tokenizer: TokenizerLike | None = None,
) -> list[TracePrompt]:
    """The requests to replay, in trace order. Arrivals are the trace's timestamps (relative to its
    first) times `time_scale` (0.5: twice as fast). With a tokenizer the prompt text is the ids decoded
    (for text targets); without, the text is empty and only token-id targets can send it."""
    if time_scale <= 0:
        raise WorkloadError(f"trace time scale: expected a positive number, got {time_scale}")
    blocks = BlockTokens(vocabulary, synthesis.block_tokens, synthesis.seed)
    start = min(r.timestamp for r in trace) if trace else 0.0
    prompts = []
    for index, row in enumerate(trace):
        length = synthesis.input_tokens(row)
        kept = tuple(row.hash_ids[: math.ceil(length / synthesis.block_tokens)])
        ids = blocks.prompt(kept, length)
        text = tokenizer.decode(ids) if tokenizer is not None else ""
        prompts.append(TracePrompt(
            request=BenchRequest(index, text, tuple(ids), synthesis.output_tokens(row)),
            arrival_s=(row.timestamp - start) / 1000.0 * time_scale,
            hash_ids=kept,
            truncated=length < synthesis.scaled_tokens(row),
        ))
    return prompts
