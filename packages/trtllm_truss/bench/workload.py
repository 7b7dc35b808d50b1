"""Benchmark workloads: the requests to send, each with a prompt (as text and as token ids) and an
output length in tokens.

Two sources:
- a normal distribution of input and output lengths in tokens (mean, stddev; clipped to [1, max]),
  with prompts made of whole-word vocabulary tokens so that text and ids describe the same prompt;
- a JSONL dataset: one object per line with `prompt` (or `text`) and optionally an output length
  (`output_len`, `output_tokens` or `max_tokens`); lines without one draw from the output
  distribution.

Every target gets the same requests: the engine target sends `input_ids`, the text targets send
`prompt`; `input_ids` is the tokenization that preprocessing produces for `prompt`.
Everything is drawn from one `numpy.random.Generator(seed)`, so a seed reproduces the workload.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

DATASET_PROMPT_KEYS = ("prompt", "text")
DATASET_OUTPUT_KEYS = ("output_len", "output_tokens", "max_tokens")


class WorkloadError(ValueError):
    """A workload specification or dataset that cannot be used; the message names the field or line."""


class TokenizerLike(Protocol):
    """The slice of a Hugging Face tokenizer the workload needs."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]: ...

    @property
    def all_special_ids(self) -> list[int]: ...

    def __len__(self) -> int: ...


class LengthDistribution(BaseModel):
    """Lengths in tokens drawn from a normal distribution, rounded and clipped to [minimum, maximum]."""

    model_config = ConfigDict(extra="forbid")

    mean: int = Field(gt=0, description="mean length in tokens")
    stddev: float = Field(default=0.0, ge=0, description="standard deviation in tokens; 0 = fixed length")
    minimum: int = Field(default=1, ge=1)
    maximum: int | None = Field(default=None, ge=1, description="upper clip, e.g. the engine's max length")

    def sample(self, rng: np.random.Generator, count: int) -> list[int]:
        raw = rng.normal(self.mean, self.stddev, size=count) if self.stddev > 0 else np.full(count, self.mean)
        upper = self.maximum if self.maximum is not None else np.iinfo(np.int32).max
        return [int(v) for v in np.clip(np.rint(raw), self.minimum, upper)]


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_requests: int = Field(gt=0, description="requests per load level")
    input_length: LengthDistribution = LengthDistribution(mean=128, stddev=0)
    output_length: LengthDistribution = LengthDistribution(mean=128, stddev=0)
    dataset: Path | None = Field(default=None, description="JSONL file with prompt/text and optional output length")
    seed: int = 0
    add_special_tokens: bool = Field(
        default=True, description="as preprocessing tokenizes the prompt (NVIDIA's default adds BOS)"
    )

    @model_validator(mode="after")
    def _lengths_fit(self) -> "WorkloadSpec":
        for name in ("input_length", "output_length"):
            dist: LengthDistribution = getattr(self, name)
            if dist.maximum is not None and dist.maximum < dist.minimum:
                raise ValueError(f"{name}.maximum ({dist.maximum}) is below {name}.minimum ({dist.minimum})")
        return self


@dataclass(frozen=True)
class BenchRequest:
    index: int
    prompt: str
    input_ids: tuple[int, ...]
    output_len: int

    @property
    def input_len(self) -> int:
        return len(self.input_ids)


_WORD = re.compile(r"^[a-z]{2,12}$")


class PromptBuilder:
    """Builds prompt texts whose tokenization has a requested length.

    Prompts are sequences of vocabulary tokens that are whole lower-case words with a leading word
    boundary (`Ġword` in byte-level BPE, `▁word` in sentencepiece). Such a sequence re-tokenizes to
    itself in practice; where it does not, words are added or dropped until the length matches.
    """

    def __init__(self, tokenizer: TokenizerLike, rng: np.random.Generator, add_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._rng = rng
        self._add_special_tokens = add_special_tokens
        self._special_count = len(tokenizer.encode("", add_special_tokens=add_special_tokens))
        self._word_ids = self._whole_word_ids(tokenizer)
        if len(self._word_ids) < 16:
            raise WorkloadError(
                "tokenizer: fewer than 16 whole-word vocabulary tokens; use --dataset to give prompts"
            )

    @staticmethod
    def _whole_word_ids(tokenizer: TokenizerLike) -> list[int]:
        special = set(tokenizer.all_special_ids)
        ids = [i for i in range(len(tokenizer)) if i not in special]
        pieces = tokenizer.convert_ids_to_tokens(ids)
        words = []
        for token_id, piece in zip(ids, pieces):
            if piece and piece[0] in ("Ġ", "▁") and _WORD.match(piece[1:]):
                words.append(token_id)
        return words

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=self._add_special_tokens))

    def build(self, length: int) -> tuple[str, list[int]]:
        """A prompt of `length` tokens (special tokens included), or the closest reachable."""
        word_count = max(length - self._special_count, 1)
        words = [int(w) for w in self._rng.choice(self._word_ids, size=word_count)]
        best: tuple[str, list[int]] | None = None
        for _ in range(8):
            text = self._tokenizer.decode(words).strip()
            ids = self._encode(text)
            if best is None or abs(len(ids) - length) < abs(len(best[1]) - length):
                best = (text, ids)
            if len(ids) == length:
                break
            if len(ids) > length and len(words) > 1:
                del words[-min(len(ids) - length, len(words) - 1):]
            elif len(ids) < length:
                words.extend(int(w) for w in self._rng.choice(self._word_ids, size=length - len(ids)))
            else:
                break
        assert best is not None
        return best


def _dataset_rows(path: Path) -> list[tuple[str, int | None]]:
    rows: list[tuple[str, int | None]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise WorkloadError(f"dataset {path}: {exc.strerror or exc}") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"dataset {path} line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise WorkloadError(f"{where}: expected a JSON object with 'prompt' or 'text'")
        prompt_key = next((k for k in DATASET_PROMPT_KEYS if k in obj), None)
        if prompt_key is None or not isinstance(obj[prompt_key], str) or not obj[prompt_key]:
            raise WorkloadError(f"{where}: needs a non-empty string 'prompt' or 'text'")
        output_key = next((k for k in DATASET_OUTPUT_KEYS if k in obj), None)
        output_len = None
        if output_key is not None:
            value = obj[output_key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise WorkloadError(f"{where}: '{output_key}' must be a positive integer, got {value!r}")
            output_len = value
        rows.append((obj[prompt_key], output_len))
    if not rows:
        raise WorkloadError(f"dataset {path}: no requests in it")
    return rows


def generate_workload(spec: WorkloadSpec, tokenizer: TokenizerLike) -> list[BenchRequest]:
    """The requests of one load level; the same spec and tokenizer always give the same list."""
    rng = np.random.default_rng(spec.seed)
    output_lens = spec.output_length.sample(rng, spec.num_requests)
    requests: list[BenchRequest] = []
    if spec.dataset is not None:
        rows = _dataset_rows(spec.dataset)
        max_input = spec.input_length.maximum
        for i in range(spec.num_requests):
            prompt, output_len = rows[i % len(rows)]  # cycle a short dataset
            ids = tokenizer.encode(prompt, add_special_tokens=spec.add_special_tokens)
            if max_input is not None and len(ids) > max_input:
                raise WorkloadError(
                    f"dataset {spec.dataset} request {i % len(rows) + 1}: prompt has {len(ids)} tokens,"
                    f" above the input maximum {max_input}"
                )
            if output_len is not None and spec.output_length.maximum is not None:
                output_len = min(output_len, spec.output_length.maximum)
            requests.append(BenchRequest(i, prompt, tuple(ids), output_len or output_lens[i]))
        return requests
    input_lens = spec.input_length.sample(rng, spec.num_requests)
    builder = PromptBuilder(tokenizer, rng, spec.add_special_tokens)
    for i in range(spec.num_requests):
        prompt, ids = builder.build(input_lens[i])
        requests.append(BenchRequest(i, prompt, tuple(ids), output_lens[i]))
    return requests
