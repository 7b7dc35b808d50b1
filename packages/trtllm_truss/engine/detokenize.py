"""Stateless incremental detokenization (see docs/design.md, last section).

A streamed response carries its new token ids plus a short window of the ids that preceded them
(`prefix_ids`). `TokenDecoder.decode_new(prefix_ids, new_ids)` returns exactly the characters
whose last byte lies in the new tokens:

* Work on bytes, not on per-chunk strings: each token id maps to the bytes it contributes
  (byte-level BPE, sentencepiece with `▁` and `<0xNN>` byte fallback), so a sentencepiece token's
  leading space survives and a multi-byte UTF-8 character split over tokens is never replaced by
  U+FFFD.
* A trailing *incomplete but still valid* UTF-8 sequence is held back (Python's incremental UTF-8
  decoder with `final=False` does exactly that); the response that completes it emits it.
  Invalid bytes become U+FFFD, as `tokenizers` renders them.
* Nothing else is ever held back, so no end-of-stream flush is needed: the last response's output
  completes the text. A sequence that *ends* inside a multi-byte character (e.g. max_tokens hit
  mid-emoji) has no complete character there; the stray bytes are dropped in streamed and
  non-streamed responses alike.

Because the held-back tail is at most 3 bytes and a window is up to 8 tokens, the cut between
"already emitted" and "new" is the same whether computed from the window or from the whole history,
so the concatenation of streamed chunks equals `decode(all_ids)` — with no state kept between
calls, which is what lets several postprocessing instances serve one stream.

A remote-code tokenizer with no fast version (`LoadedTokenizer.slow`) has no decoder description to
build the byte table from. It is decoded by windows instead (`_WindowedText`): the text of the
tokens since the last emitted piece, decoded with the tokens just before them, minus the text of
those tokens alone; a window whose text ends in U+FFFD (an incomplete character) waits for more.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trtllm_truss.engine.tokenizer import LoadedTokenizer

_BYTE_FALLBACK_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class UnsupportedTokenizerError(ValueError):
    """The tokenizer's decoder is of a kind this detokenizer cannot reproduce byte-exactly."""


def _byte_level_alphabet() -> dict[str, int]:
    # GPT-2's reversible byte <-> printable-unicode mapping used by ByteLevel pre-tokenizers/decoders.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    byte_values = printable[:]
    code_points = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in byte_values:
            byte_values.append(byte)
            code_points.append(256 + extra)
            extra += 1
    return {chr(cp): b for b, cp in zip(byte_values, code_points)}


@dataclass(frozen=True)
class _DecoderSpec:
    """What the tokenizer's decoder chain does, reduced to per-token byte rules."""

    byte_level: bool = False
    byte_fallback: bool = False
    replacements: tuple[tuple[str, str], ...] = ()
    strip_leading_space: bool = False  # Strip(start=1) / Metaspace prepend_scheme first|always


def _flatten_decoders(decoder: dict[str, Any] | None) -> list[dict[str, Any]]:
    if decoder is None:
        return []
    if decoder.get("type") == "Sequence":
        return [d for inner in decoder.get("decoders", []) for d in _flatten_decoders(inner)]
    return [decoder]


def _decoder_spec(tokenizer_json: dict[str, Any]) -> _DecoderSpec:
    byte_level = byte_fallback = strip = False
    replacements: list[tuple[str, str]] = []
    for step in _flatten_decoders(tokenizer_json.get("decoder")):
        kind = step.get("type")
        if kind == "ByteLevel":
            byte_level = True
        elif kind == "ByteFallback":
            byte_fallback = True
        elif kind == "Fuse":
            pass  # joins token strings; we join bytes anyway
        elif kind == "Replace":
            pattern = step.get("pattern", {})
            if "String" not in pattern:
                raise UnsupportedTokenizerError(f"decoder.Replace: only string patterns are supported, got {pattern}")
            replacements.append((pattern["String"], step.get("content", "")))
        elif kind == "Strip":
            if step.get("stop", 0) != 0 or step.get("content") != " " or step.get("start", 0) > 1:
                raise UnsupportedTokenizerError(f"decoder.Strip: only content=' ', start<=1, stop=0 is supported, got {step}")
            strip = strip or step.get("start", 0) == 1
        elif kind == "Metaspace":
            replacements.append((step.get("replacement", "▁"), " "))
            scheme = step.get("prepend_scheme")
            if scheme is None:  # older tokenizer.json files
                scheme = "always" if step.get("add_prefix_space", True) else "never"
            strip = strip or scheme != "never"
        else:
            raise UnsupportedTokenizerError(
                f"decoder.type {kind!r} is not supported for streaming detokenization "
                "(supported: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip)"
            )
    return _DecoderSpec(byte_level, byte_fallback, tuple(replacements), strip)


def _token_bytes_table(
    loaded: LoadedTokenizer, spec: _DecoderSpec, *, skip_special_tokens: bool, keep: frozenset[str] = frozenset()
) -> list[bytes]:
    tokenizer = loaded.tokenizer
    alphabet = _byte_level_alphabet() if spec.byte_level else {}
    added = tokenizer.get_added_tokens_decoder()
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    size = max([size, *(i + 1 for i in added)])
    table: list[bytes] = []
    for token_id in range(size):
        kept = token_id in added and added[token_id].content in keep
        if skip_special_tokens and token_id in loaded.special_ids and not kept:
            table.append(b"")
            continue
        piece = tokenizer.id_to_token(token_id)
        if piece is None:
            table.append(b"")
        elif token_id in added:
            table.append(added[token_id].content.encode("utf-8"))  # added tokens decode to their content
        elif spec.byte_level:
            table.append(bytes(alphabet[ch] for ch in piece) if all(ch in alphabet for ch in piece) else piece.encode())
        else:
            match = _BYTE_FALLBACK_TOKEN.match(piece) if spec.byte_fallback else None
            if match:
                table.append(bytes([int(match.group(1), 16)]))
            else:
                for old, new in spec.replacements:
                    piece = piece.replace(old, new)
                table.append(piece.encode("utf-8"))
    return table


class TokenDecoder:
    """Turns token ids into text, statelessly and identically for streamed and whole sequences."""

    def __init__(
        self, loaded: LoadedTokenizer, *, skip_special_tokens: bool = True, keep: frozenset[str] = frozenset()
    ) -> None:
        """`keep`: special tokens decoded as their text even when special tokens are skipped (the
        markers an output parser looks for, e.g. Mistral's `[TOOL_CALLS]`)."""
        self._slow = None
        self._skip_special_tokens = skip_special_tokens
        if loaded.tokenizer is None:  # a slow remote-code tokenizer: decoded by windows
            self._slow = loaded.slow
            self._table: list[bytes] = []
            self._strip_leading_space = False
            self._anchor_ids = _anchor_ids(loaded.slow)
            self._max_token_bytes = _slow_max_token_bytes(loaded.slow)
            return
        spec = _decoder_spec(json.loads(loaded.tokenizer.to_str()))
        self._table = _token_bytes_table(loaded, spec, skip_special_tokens=skip_special_tokens, keep=keep)
        self._strip_leading_space = spec.strip_leading_space
        self._max_token_bytes = max((len(b) for b in self._table), default=1)

    @property
    def windowed(self) -> bool:
        """True for a tokenizer without a byte table (decoded by windows of text, see module doc)."""
        return self._slow is not None

    @property
    def max_token_bytes(self) -> int:
        """An upper bound of the UTF-8 bytes any one token stands for (a prompt of more than
        `n * max_token_bytes` bytes has more than `n` tokens)."""
        return max(self._max_token_bytes, 1)

    def token_bytes_table(self) -> list[bytes]:
        """The bytes of every token id, by id (not for a `windowed` decoder)."""
        if self._slow is not None:
            raise UnsupportedTokenizerError("a slow remote-code tokenizer has no byte table; use max_token_bytes")
        return list(self._table)

    @property
    def strips_leading_space(self) -> bool:
        return self._strip_leading_space

    def token_bytes(self, ids: Sequence[int]) -> bytes:
        """The bytes `ids` contribute to the text (special tokens none when skipped)."""
        table = self._table
        size = len(table)
        return b"".join(table[i] if 0 <= i < size else b"" for i in ids)

    def decode_new(self, prefix_ids: Sequence[int], new_ids: Sequence[int]) -> str:
        """The characters whose last byte lies in `new_ids`, given the tokens just before them: what
        a `StreamDetokenizer` that has already been fed `prefix_ids` returns for `new_ids`."""
        stream = StreamDetokenizer(self, continues_prompt=False)
        stream.feed(prefix_ids)
        return stream.feed(new_ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_new((), ids)


class StreamDetokenizer:
    """The text of one request's token stream, response by response, for a reader that sees the
    whole stream (the truss proxy). It gives what stateless postprocessing gives from the engine's
    `prefix_ids`: the characters completed by each response, an incomplete UTF-8 tail held back
    until the response that completes it, and a sentencepiece leading space dropped only at the very
    start of the text, i.e. never when the output continues a prompt (`continues_prompt`)."""

    __slots__ = ("_decoder", "_utf8", "_at_start", "_windowed")

    def __init__(self, decoder: TokenDecoder, *, continues_prompt: bool) -> None:
        self._decoder = decoder
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._at_start = not continues_prompt
        self._windowed = _WindowedText(decoder, continues_prompt) if decoder.windowed else None

    def feed(self, new_ids: Sequence[int]) -> str:
        if self._windowed is not None:
            return self._windowed.feed(new_ids)
        data = self._decoder.token_bytes(new_ids)
        # Sentencepiece decoders drop the prefix space of the first (non-special) piece only.
        if self._at_start and data:
            self._at_start = False
            if self._decoder.strips_leading_space and data.startswith(b" "):
                data = data[1:]
        return self._utf8.decode(data, final=False)


def _anchor_ids(slow: Any) -> list[int]:
    """Ids of a short plain text decoded ahead of a stream that continues a prompt, so that the
    first token keeps the leading space a sentencepiece decoder drops at the start of a text."""
    return list(slow.encode("a", add_special_tokens=False))


def _slow_max_token_bytes(slow: Any) -> int:
    # A token's piece is at least as long in UTF-8 as the text it decodes to ("▁" -> " ",
    # "<0x41>" -> "A"); tiktoken-style tokenizers give bytes.
    longest = 1
    for piece in slow.convert_ids_to_tokens(list(range(len(slow)))):
        if isinstance(piece, bytes):
            longest = max(longest, len(piece))
        elif isinstance(piece, str):
            longest = max(longest, len(piece.encode("utf-8")))
    return longest


class _WindowedText:
    """Incremental text of one stream from a tokenizer that can only decode whole id lists.

    Decodes `ids[prefix:]` and `ids[prefix:read]` (the last emitted window and what came since) and
    emits the difference, so per-token decoding quirks at a window's start cancel out. Text ending
    in U+FFFD (a character split over tokens) is held until a later token completes it; at the end
    of a stream such a tail is dropped, as the byte decoder drops a trailing incomplete character.
    """

    __slots__ = ("_slow", "_skip", "_ids", "_prefix", "_read")

    def __init__(self, decoder: TokenDecoder, continues_prompt: bool) -> None:
        self._slow = decoder._slow
        self._skip = decoder._skip_special_tokens
        self._ids: list[int] = list(decoder._anchor_ids) if continues_prompt else []
        self._prefix = 0
        self._read = len(self._ids)

    def feed(self, new_ids: Sequence[int]) -> str:
        if not new_ids:
            return ""
        self._ids.extend(int(i) for i in new_ids)
        decode = self._slow.decode
        before = decode(self._ids[self._prefix : self._read], skip_special_tokens=self._skip)
        text = decode(self._ids[self._prefix :], skip_special_tokens=self._skip)
        if len(text) <= len(before) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        del self._ids[: self._prefix]  # only the last window is needed from now on
        self._read -= self._prefix
        self._prefix = 0
        return text[len(before) :]
