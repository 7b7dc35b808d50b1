"""Loading a Hugging Face tokenizer directory for the preprocessing and postprocessing models.

Uses the `tokenizers` library directly (not `transformers`) when the directory has `tokenizer.json`:
every python-backend instance loads its own copy, and `tokenizers` loads in milliseconds where
`transformers` costs seconds of import. Special-token ids come from the files transformers writes
next to `tokenizer.json`.

Without `tokenizer.json`, transformers builds the tokenizer: from a sentencepiece `tokenizer.model`
(converted to a fast tokenizer; needs the `sentencepiece` and `protobuf` packages), or from the
repository's own code (`auto_map.AutoTokenizer` in tokenizer_config.json), which runs only when
`runtime.trust_remote_code` is true. A remote-code tokenizer with no fast version is kept as
transformers' slow tokenizer (`LoadedTokenizer.slow`); detokenize.py decodes it by windows.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class TokenizerLoadError(RuntimeError):
    """The tokenizer directory cannot be used; the message names the file and key."""


# The config key that allows running a tokenizer's own Python code (config/runtime.py RuntimeConfig).
TRUST_REMOTE_CODE_KEY = "model_metadata.trt_llm.runtime.trust_remote_code"


@dataclass(frozen=True)
class LoadedTokenizer:
    # The fast tokenizer; None only for a remote-code tokenizer without a fast version (`slow`).
    tokenizer: Tokenizer | None
    eos_id: int | None
    pad_id: int | None
    bos_id: int | None
    special_ids: frozenset[int]  # skipped when decoding, like skip_special_tokens=True
    source_dir: Path
    slow: Any = None  # transformers' slow tokenizer, when there is no `tokenizer`

    def encode(self, text: str, *, add_special_tokens: bool, literal_special_tokens: bool = False) -> list[int]:
        """`literal_special_tokens`: special-token text in `text` ("</s>") is encoded as plain text
        instead of becoming the control token (the tokenizer's own special tokens, e.g. a BOS that
        `add_special_tokens` adds, are unaffected)."""
        if self.tokenizer is None:
            return list(
                self.slow.encode(text, add_special_tokens=add_special_tokens, split_special_tokens=literal_special_tokens)
            )
        tokenizer = self._literal_tokenizer() if literal_special_tokens else self.tokenizer
        return tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def _literal_tokenizer(self) -> Tokenizer:
        # A copy with `encode_special_tokens` set, built on first use (a setting of the Rust object,
        # so it cannot be a per-call argument on the shared one).
        literal = self.__dict__.get("_literal")
        if literal is None:
            from tokenizers import Tokenizer

            literal = Tokenizer.from_str(self.tokenizer.to_str())
            literal.encode_special_tokens = True
            object.__setattr__(self, "_literal", literal)  # frozen dataclass: a cache, not state
        return literal

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[list[int]]:
        if self.tokenizer is None:
            return [self.encode(text, add_special_tokens=add_special_tokens) for text in texts]
        # One call into the Rust tokenizer for a whole dynamic batch (it parallelises internally).
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids: list[int], *, skip_special_tokens: bool) -> str:
        if self.tokenizer is None:
            return self.slow.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        """Token ids the tokenizer knows, added tokens included (ids are below this)."""
        if self.tokenizer is None:
            return len(self.slow)
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        if self.tokenizer is None:
            return _slow_token_to_id(self.slow, token)
        return self.tokenizer.token_to_id(token)


def _slow_token_to_id(slow: Any, token: str) -> int | None:
    token_id = slow.convert_tokens_to_ids(token)
    if token_id is None or (token_id == slow.unk_token_id and token != slow.unk_token):
        return None  # slow tokenizers answer unknown tokens with the unk id
    return int(token_id)


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


def _special_id(tokenizer: Any, name: str, sources: list[tuple[Path, dict[str, Any]]]) -> int | None:
    """Resolve e.g. `eos` from `<name>_token` in tokenizer_config/special_tokens_map, then
    `<name>_token_id` in generation_config/config (first found wins)."""
    for path, data in sources:
        content = _token_content(data.get(f"{name}_token"))
        if content is not None:
            token_id = tokenizer(content)
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


def remote_code_class(tokenizer_dir: Path) -> str | None:
    """The tokenizer class a directory's tokenizer_config.json names in `auto_map` (code shipped
    with the model), or None when transformers' own classes serve it."""
    auto_map = _read_json(tokenizer_dir / "tokenizer_config.json").get("auto_map")
    if not isinstance(auto_map, dict):
        return None
    entry = auto_map.get("AutoTokenizer")
    if isinstance(entry, str):
        return entry
    if isinstance(entry, list):
        names = [name for name in entry if isinstance(name, str)]
        return " / ".join(names) or None
    return None


def load_transformers_tokenizer(tokenizer_dir: Path | str, *, trust_remote_code: bool = False) -> Any:
    """transformers' tokenizer for a directory (chat templates need it). Remote code runs only when
    `trust_remote_code`; a directory that has `tokenizer.json` is served without its code."""
    tokenizer_dir = Path(tokenizer_dir)
    remote = remote_code_class(tokenizer_dir)
    has_fast_file = (tokenizer_dir / "tokenizer.json").is_file()
    if remote is not None and not trust_remote_code and not has_fast_file:
        raise TokenizerLoadError(
            f"{tokenizer_dir / 'tokenizer_config.json'}: auto_map.AutoTokenizer names the model's own tokenizer "
            f"code ({remote}) and there is no tokenizer.json; set {TRUST_REMOTE_CODE_KEY}: true to run it"
        )
    if remote is None and not has_fast_file and not (tokenizer_dir / "tokenizer.model").is_file():
        raise TokenizerLoadError(
            f"{tokenizer_dir}: no tokenizer.json, no sentencepiece tokenizer.model and no auto_map.AutoTokenizer "
            "in tokenizer_config.json: nothing to build a tokenizer from"
        )
    try:
        if remote is not None and not trust_remote_code:
            from transformers import PreTrainedTokenizerFast  # tokenizer.json, without the model's code

            return PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=trust_remote_code)
    except ImportError as exc:  # e.g. sentencepiece/protobuf missing, or a package the remote code imports
        raise TokenizerLoadError(f"{tokenizer_dir}: transformers cannot build this tokenizer: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"{tokenizer_dir}: transformers cannot load this tokenizer: {exc}") from exc


def ensure_tokenizer_json(tokenizer_dir: Path | str, *, trust_remote_code: bool = False) -> bool:
    """Write `tokenizer.json` into a directory that has none but whose tokenizer transformers can
    build as a fast one (a sentencepiece `tokenizer.model`, or remote code with a fast class), so
    that every later load (each Triton python-backend instance, each stream worker) is a
    millisecond `tokenizers` load instead of a conversion. Returns whether the directory now has
    `tokenizer.json` (False: a slow-only remote-code tokenizer, served through `LoadedTokenizer.slow`)."""
    tokenizer_dir = Path(tokenizer_dir)
    target = tokenizer_dir / "tokenizer.json"
    if target.is_file():
        return True
    built = load_transformers_tokenizer(tokenizer_dir, trust_remote_code=trust_remote_code)
    backend = getattr(built, "backend_tokenizer", None)
    if backend is None:
        return False
    partial = target.with_name(f".tokenizer.json.{os.getpid()}.tmp")
    backend.save(str(partial))
    os.replace(partial, target)  # atomic: a concurrent reader sees no file or the whole file
    return True


def load_tokenizer(tokenizer_dir: Path | str, *, trust_remote_code: bool = False) -> LoadedTokenizer:
    tokenizer_dir = Path(tokenizer_dir)
    tokenizer_file = tokenizer_dir / "tokenizer.json"
    sources = [
        (tokenizer_dir / name, _read_json(tokenizer_dir / name))
        for name in ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json", "config.json")
    ]
    slow = None
    if tokenizer_file.is_file():
        from tokenizers import Tokenizer

        tokenizer: Tokenizer | None = Tokenizer.from_file(str(tokenizer_file))
    else:
        built = load_transformers_tokenizer(tokenizer_dir, trust_remote_code=trust_remote_code)
        tokenizer = getattr(built, "backend_tokenizer", None)
        if tokenizer is None:
            slow = built
    if tokenizer is not None:
        token_to_id = tokenizer.token_to_id
        special_ids = frozenset(
            token_id for token_id, added in tokenizer.get_added_tokens_decoder().items() if added.special
        )
    else:
        def token_to_id(token: str) -> int | None:
            return _slow_token_to_id(slow, token)

        special_ids = frozenset(int(i) for i in slow.all_special_ids)
    eos_id = _special_id(token_to_id, "eos", sources)
    pad_id = _special_id(token_to_id, "pad", sources)
    bos_id = _special_id(token_to_id, "bos", sources)
    if pad_id is None:
        pad_id = eos_id  # the common convention for causal LMs without a pad token
    return LoadedTokenizer(
        tokenizer=tokenizer,
        eos_id=eos_id,
        pad_id=pad_id,
        bos_id=bos_id,
        special_ids=special_ids,
        source_dir=tokenizer_dir,
        slow=slow,
    )


def read_chat_template(tokenizer_dir: Path | str) -> str | None:
    """The chat template's text as transformers finds it (`chat_template.jinja`, else
    tokenizer_config.json's `chat_template`, a string or named templates: all of them joined), or
    None. Read without loading transformers: the workers only look for a family's markers in it."""
    tokenizer_dir = Path(tokenizer_dir)
    jinja = tokenizer_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = (_read_json(tokenizer_dir / "tokenizer_config.json") or {}).get("chat_template")
    if isinstance(template, list):
        return "\n".join(str(item.get("template", "")) for item in template if isinstance(item, dict))
    return template if isinstance(template, str) else None


def read_added_tokens(tokenizer_dir: Path | str) -> frozenset[str]:
    """The added tokens' text (`<tool_call>`, `<|channel|>`...) as tokenizer_config.json's
    `added_tokens_decoder` lists them (else tokenizer.json's `added_tokens`), read without loading
    the tokenizer: what tells a template-less model's family apart."""
    tokenizer_dir = Path(tokenizer_dir)
    decoder = (_read_json(tokenizer_dir / "tokenizer_config.json") or {}).get("added_tokens_decoder")
    if isinstance(decoder, dict) and decoder:
        return frozenset(str(v.get("content")) for v in decoder.values() if isinstance(v, dict) and v.get("content"))
    added = (_read_json(tokenizer_dir / "tokenizer.json") or {}).get("added_tokens")
    if isinstance(added, list):
        return frozenset(str(v.get("content")) for v in added if isinstance(v, dict) and v.get("content"))
    return frozenset()
