"""The benchmark's tokenizer: the same loader preprocessing uses (`trtllm_truss.engine.tokenizer`), so the
engine target's prompt ids are exactly what preprocessing produces for the text targets' prompts.
It also avoids importing transformers, which costs seconds on a busy 2-core machine."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from trtllm_truss.engine.tokenizer import LoadedTokenizer, load_tokenizer


class BenchTokenizer:
    """`workload.TokenizerLike` over a `LoadedTokenizer`."""

    def __init__(self, loaded: LoadedTokenizer):
        self._loaded = loaded
        self._tokenizer = loaded.tokenizer

    @classmethod
    def from_dir(cls, tokenizer_dir: Path | str) -> "BenchTokenizer":
        return cls(load_tokenizer(tokenizer_dir))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._loaded.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self._tokenizer.id_to_token(i) or "" for i in ids]

    @property
    def all_special_ids(self) -> list[int]:
        return sorted(self._loaded.special_ids)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size()
