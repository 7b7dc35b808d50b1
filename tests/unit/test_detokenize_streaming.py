"""Stateless streaming detokenization: streamed chunks telescope to the whole decode.

Three tokenizer styles, all built locally (no hub downloads): a byte-level BPE (GPT-2/Llama-3
style), a sentencepiece-style BPE with `▁` + `<0xNN>` byte fallback and a Strip decoder (Llama-2
style), a Metaspace-decoder variant, and the embedded model's tokenizer when data/embedded-llama exists.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from edge_case_texts import EDGE_TEXTS
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)
from trtllm_truss.engine.detokenize import StreamDetokenizer, TokenDecoder, UnsupportedTokenizerError
from trtllm_truss.engine.tokenizer import LoadedTokenizer, TokenizerLoadError, load_tokenizer
from trtllm_truss.repository.interface import PREFIX_WINDOW_TOKENS

REPO_ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_TOKENIZER_DIR = REPO_ROOT / "data" / "embedded-llama"


_CORPUS_EXTRA = [
    "你好，世界。这是一个测试。日本語のテキストです。",
    "emoji 😀 🎉 café naïve",
    "  double  spaces\tand\ttabs\n\nnewlines",
] * 10


def _corpus() -> list[str]:
    from pydoc_data.topics import topics

    return [text for _, text in sorted(topics.items())][:40] + _CORPUS_EXTRA


def _loaded(tokenizer: Tokenizer, tmp_path: Path, name: str) -> LoadedTokenizer:
    out = tmp_path / name
    out.mkdir()
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return load_tokenizer(out)


def _byte_level(tmp_path: Path) -> LoadedTokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_corpus(), trainer)
    return _loaded(tok, tmp_path, "byte_level")


def _sentencepiece(tmp_path: Path, *, metaspace_decoder: bool) -> LoadedTokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    if metaspace_decoder:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
        tok.decoder = decoders.Sequence(
            [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)]
        )
    else:  # Llama-2's tokenizer.json layout
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    # A small alphabet so that most emoji/CJK go through <0xNN> byte-fallback tokens.
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=100)
    tok.train_from_iterator(_corpus(), trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    base = len(vocab)
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = base + byte
    return _loaded(Tokenizer.from_str(json.dumps(data)), tmp_path, "metaspace" if metaspace_decoder else "sentencepiece")


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece", "metaspace", "embedded"])
def loaded(request, tmp_path_factory) -> LoadedTokenizer:
    tmp_path = tmp_path_factory.mktemp(request.param)
    if request.param == "byte_level":
        return _byte_level(tmp_path)
    if request.param == "sentencepiece":
        return _sentencepiece(tmp_path, metaspace_decoder=False)
    if request.param == "metaspace":
        return _sentencepiece(tmp_path, metaspace_decoder=True)
    if not (EMBEDDED_TOKENIZER_DIR / "tokenizer.json").is_file():
        pytest.skip("data/embedded-llama not generated yet (scripts/make_embedded_model.py)")
    return load_tokenizer(EMBEDDED_TOKENIZER_DIR)


@pytest.fixture(scope="module")
def decoder(loaded: LoadedTokenizer) -> TokenDecoder:
    return TokenDecoder(loaded)


def _stream(decoder: TokenDecoder, context: list[int], ids: list[int], rng: random.Random) -> list[str]:
    """Split `ids` into random chunks, each decoded only from its chunk and an 8-token window."""
    history = list(context)
    chunks: list[str] = []
    pos = 0
    while pos < len(ids):
        step = rng.choice([1, 1, 1, 2, 3, 5])
        new = ids[pos : pos + step]
        chunks.append(decoder.decode_new(history[-PREFIX_WINDOW_TOKENS:], new))
        history.extend(new)
        pos += step
    return chunks


def test_whole_decode_matches_the_tokenizer(loaded: LoadedTokenizer, decoder: TokenDecoder) -> None:
    for text in EDGE_TEXTS:
        ids = loaded.encode(text, add_special_tokens=True)
        expected = loaded.tokenizer.decode(ids, skip_special_tokens=True)
        assert decoder.decode(ids) == expected, text


def test_whole_decode_round_trips_text(loaded: LoadedTokenizer, decoder: TokenDecoder) -> None:
    for text in EDGE_TEXTS:
        ids = loaded.encode(text, add_special_tokens=False)
        if "<unk>" in loaded.tokenizer.encode(text, add_special_tokens=False).tokens:
            continue  # a tokenizer without byte fallback cannot round-trip unseen characters
        roundtrip = decoder.decode(ids)
        # sentencepiece normalisation prepends one space that the decoder strips again
        assert roundtrip == text or roundtrip == text.lstrip(" ")[: len(roundtrip)] or roundtrip.strip() == text.strip()
        assert "\ufffd" not in roundtrip


@pytest.mark.parametrize("seed", range(4))
def test_streamed_chunks_concatenate_to_whole_decode(loaded: LoadedTokenizer, decoder: TokenDecoder, seed: int) -> None:
    rng = random.Random(seed)
    for text in EDGE_TEXTS:
        prompt = loaded.encode("Prompt: ", add_special_tokens=True)
        ids = loaded.encode(text, add_special_tokens=False)
        chunks = _stream(decoder, prompt, ids, rng)
        whole = decoder.decode_new(prompt[-PREFIX_WINDOW_TOKENS:], ids)
        assert "".join(chunks) == whole, (text, chunks)
        assert "\ufffd" not in "".join(chunks)
        # No context at all (prompt excluded and empty): still telescopes.
        assert "".join(_stream(decoder, [], ids, rng)) == decoder.decode(ids)


def _proxy_stream(decoder: TokenDecoder, ids: list[int], rng: random.Random, *, continues_prompt: bool) -> list[str]:
    stream = StreamDetokenizer(decoder, continues_prompt=continues_prompt)
    chunks, pos = [], 0
    while pos < len(ids):
        step = rng.choice([1, 1, 1, 2, 3, 5])
        chunks.append(stream.feed(ids[pos : pos + step]))
        pos += step
    return chunks


@pytest.mark.parametrize("seed", range(2))
def test_the_proxys_stream_decoding_equals_postprocessings(loaded: LoadedTokenizer, decoder: TokenDecoder, seed: int) -> None:
    """The proxy (which sees the whole stream) and stateless postprocessing (an 8-token window per
    response) produce the same text: after a prompt, and at the start of a text."""
    rng = random.Random(seed)
    prompt = loaded.encode("Prompt: ", add_special_tokens=True)
    vocab = [i for i in range(loaded.tokenizer.get_vocab_size(with_added_tokens=True)) if i not in loaded.special_ids]
    samples = [loaded.encode(text, add_special_tokens=False) for text in EDGE_TEXTS]
    samples += [[rng.choice(vocab) for _ in range(rng.randint(1, 40))] for _ in range(50)]  # invalid UTF-8 too
    for ids in samples:
        after_prompt = _proxy_stream(decoder, ids, rng, continues_prompt=True)
        assert "".join(after_prompt) == "".join(_stream(decoder, prompt, ids, rng)), ids
        at_start = _proxy_stream(decoder, ids, rng, continues_prompt=False)
        assert "".join(at_start) == decoder.decode(ids), ids


def test_random_token_sequences_telescope(loaded: LoadedTokenizer, decoder: TokenDecoder) -> None:
    """Arbitrary ids (invalid UTF-8 included): no character is lost, duplicated or changed."""
    rng = random.Random(1234)
    vocab = [i for i in range(loaded.tokenizer.get_vocab_size(with_added_tokens=True)) if i not in loaded.special_ids]
    for _ in range(150):
        ids = [rng.choice(vocab) for _ in range(rng.randint(1, 40))]
        prompt = [rng.choice(vocab) for _ in range(rng.randint(0, 12))]
        chunks = _stream(decoder, prompt, ids, rng)
        assert "".join(chunks) == decoder.decode_new(prompt[-PREFIX_WINDOW_TOKENS:], ids)


def test_multibyte_character_is_emitted_by_the_token_that_completes_it(
    loaded: LoadedTokenizer, decoder: TokenDecoder
) -> None:
    ids = loaded.encode("x 🜂", add_special_tokens=False)
    split = [decoder.decode_new(ids[max(0, i - PREFIX_WINDOW_TOKENS) : i], [ids[i]]) for i in range(len(ids))]
    assert "".join(split).endswith("🜂")
    assert all("\ufffd" not in chunk for chunk in split)
    assert sum("🜂" in chunk for chunk in split) == 1


def test_sequence_ending_inside_a_character_drops_the_stray_bytes(
    loaded: LoadedTokenizer, decoder: TokenDecoder
) -> None:
    ids = loaded.encode("ab 𓀀", add_special_tokens=False)
    full = decoder.decode(ids)
    assert full.endswith("𓀀")
    if len(loaded.tokenizer.encode("𓀀", add_special_tokens=False).ids) < 2:
        pytest.skip("this tokenizer has the whole character as one token")
    truncated = decoder.decode(ids[:-1])
    assert "\ufffd" not in truncated and truncated == full[: len(truncated)]


def test_sentencepiece_leading_space_survives_streaming(tmp_path: Path) -> None:
    loaded = _sentencepiece(tmp_path, metaspace_decoder=False)
    decoder = TokenDecoder(loaded)
    ids = loaded.encode("the quick brown fox", add_special_tokens=True)
    one_by_one = [decoder.decode_new(ids[max(0, i - PREFIX_WINDOW_TOKENS) : i], [ids[i]]) for i in range(len(ids))]
    assert "".join(one_by_one) == "the quick brown fox"
    assert any(chunk.startswith(" ") for chunk in one_by_one)  # a chunk decoded alone would lose this


def test_unsupported_decoder_is_named(tmp_path: Path) -> None:
    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.decoder = decoders.WordPiece()
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(UnsupportedTokenizerError, match="WordPiece"):
        TokenDecoder(load_tokenizer(tmp_path))


def test_missing_tokenizer_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


def test_special_token_ids_come_from_tokenizer_config(loaded: LoadedTokenizer) -> None:
    assert loaded.eos_id is not None and loaded.eos_id in loaded.special_ids
    assert loaded.pad_id is not None


def test_special_tokens_are_kept_when_asked(loaded: LoadedTokenizer) -> None:
    ids = [loaded.bos_id, *loaded.encode("hi", add_special_tokens=False), loaded.eos_id]
    kept = TokenDecoder(loaded, skip_special_tokens=False).decode(ids)
    assert kept == loaded.tokenizer.decode(ids, skip_special_tokens=False)
    assert "</s>" in kept and "</s>" not in TokenDecoder(loaded).decode(ids)


def test_sentencepiece_leading_space_of_a_continuation_is_kept_by_the_proxy(tmp_path: Path) -> None:
    loaded = _sentencepiece(tmp_path, metaspace_decoder=True)
    decoder = TokenDecoder(loaded)
    ids = loaded.encode("there was", add_special_tokens=False)  # "▁there ▁was": a word after the prompt
    continued = "".join(StreamDetokenizer(decoder, continues_prompt=True).feed([i]) for i in ids)
    assert continued == " there was" == decoder.decode_new(loaded.encode("Once upon a time", add_special_tokens=True), ids)
    assert StreamDetokenizer(decoder, continues_prompt=False).feed(ids) == "there was" == decoder.decode(ids)
