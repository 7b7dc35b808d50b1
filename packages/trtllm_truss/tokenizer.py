"""Loading a Hugging Face tokenizer directory for the preprocessing and postprocessing models.

Uses the `tokenizers` library directly (not `transformers`): every python-backend instance loads
its own copy, and `tokenizers` loads in milliseconds where `transformers` costs seconds of import.
Special-token ids come from the files transformers writes next to `tokenizer.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer


class TokenizerLoadError(RuntimeError):
    """The tokenizer directory cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class LoadedTokenizer:
    tokenizer: Tokenizer
    eos_id: int | None
    pad_id: int | None
    bos_id: int | None
    special_ids: frozenset[int]  # skipped when decoding, like skip_special_tokens=True
    source_dir: Path

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[list[int]]:
        # One call into the Rust tokenizer for a whole dynamic batch (it parallelises internally).
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TokenizerLoadError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path}: expected a JSON object")
    return data


def _token_content(value: Any) -> str | None:
    # transformers writes special tokens either as "</s>" or as {"content": "</s>", ...}.
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _special_id(tokenizer: Tokenizer, name: str, sources: list[tuple[Path, dict[str, Any]]]) -> int | None:
    """Resolve e.g. `eos` from `<name>_token` in tokenizer_config/special_tokens_map, then
    `<name>_token_id` in generation_config/config (first found wins)."""
    for path, data in sources:
        content = _token_content(data.get(f"{name}_token"))
        if content is not None:
            token_id = tokenizer.token_to_id(content)
            if token_id is None:
                raise TokenizerLoadError(f"{path}: {name}_token {content!r} is not in the vocabulary")
            return token_id
    for path, data in sources:
        raw = data.get(f"{name}_token_id")
        if isinstance(raw, list) and raw:  # generation_config may list several eos ids; the first is primary
            raw = raw[0]
        if isinstance(raw, int):
            return raw
    return None


def load_tokenizer(tokenizer_dir: Path | str) -> LoadedTokenizer:
    tokenizer_dir = Path(tokenizer_dir)
    tokenizer_file = tokenizer_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise TokenizerLoadError(
            f"{tokenizer_file}: missing; a fast tokenizer (tokenizer.json) is required "
            "(convert a sentencepiece model with transformers' AutoTokenizer(...).save_pretrained)"
        )
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    sources = [
        (tokenizer_dir / name, _read_json(tokenizer_dir / name))
        for name in ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json", "config.json")
    ]
    eos_id = _special_id(tokenizer, "eos", sources)
    pad_id = _special_id(tokenizer, "pad", sources)
    bos_id = _special_id(tokenizer, "bos", sources)
    if pad_id is None:
        pad_id = eos_id  # the common convention for causal LMs without a pad token
    special_ids = frozenset(
        token_id for token_id, added in tokenizer.get_added_tokens_decoder().items() if added.special
    )
    return LoadedTokenizer(
        tokenizer=tokenizer,
        eos_id=eos_id,
        pad_id=pad_id,
        bos_id=bos_id,
        special_ids=special_ids,
        source_dir=tokenizer_dir,
    )
