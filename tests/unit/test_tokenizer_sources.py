"""Tokenizers without tokenizer.json (issue 15 item 1): a sentencepiece `tokenizer.model`
(converted to a fast tokenizer by transformers) and a model's own tokenizer code, which runs only
with `runtime.trust_remote_code`; both decode in streams exactly as their whole-sequence decode.
The sentencepiece model is trained here (tests/tokenizer_dirs.py), nothing is downloaded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from edge_case_texts import EDGE_TEXTS
from tokenizer_dirs import EMBEDDED_TOKENIZER_DIR, mistral_dir, remote_code_dir

from trtllm_truss.api.prompt import PromptTokenizer
from trtllm_truss.engine.detokenize import StreamDetokenizer, TokenDecoder, UnsupportedTokenizerError
from trtllm_truss.engine.tokenizer import TRUST_REMOTE_CODE_KEY, TokenizerLoadError, ensure_tokenizer_json, load_tokenizer

TEXTS = [
    "Hello there, how are you today?",
    "café naïve résumé — déjà vu",
    "你好，世界。这是一个测试。",
    "emoji 😀 🎉 and a rare 𓀀 glyph",
    "  leading spaces and\nnew\nlines",
    *EDGE_TEXTS[:20],
]


@pytest.fixture()
def modules_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """transformers copies a model's tokenizer code into its modules cache: keep that in tmp_path."""
    from transformers import dynamic_module_utils

    cache = tmp_path / "hf-modules"
    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(cache))
    monkeypatch.setattr(sys, "path", list(sys.path))
    return cache


def _streamed(decoder: TokenDecoder, ids: list[int], *, continues_prompt: bool) -> str:
    stream = StreamDetokenizer(decoder, continues_prompt=continues_prompt)
    return "".join(stream.feed([token]) for token in ids)


def test_sentencepiece_model_without_tokenizer_json_is_served(tmp_path: Path) -> None:
    import sentencepiece as spm

    directory = mistral_dir(tmp_path)
    assert not (directory / "tokenizer.json").exists()
    loaded = load_tokenizer(directory)
    assert loaded.tokenizer is not None and loaded.slow is None
    assert (loaded.bos_id, loaded.eos_id, loaded.pad_id) == (1, 2, 3)
    assert {1, 2, 3} <= loaded.special_ids
    processor = spm.SentencePieceProcessor(model_file=str(directory / "tokenizer.model"))
    assert loaded.vocab_size == processor.get_piece_size()
    for text in TEXTS[:4]:  # the sentencepiece model's own pieces, and the text back
        ids = loaded.encode(text, add_special_tokens=True)
        assert ids == [1, *processor.encode(text)]
        assert loaded.decode(ids, skip_special_tokens=True) == text


def test_converted_sentencepiece_streams_exactly_its_decode(tmp_path: Path) -> None:
    loaded = load_tokenizer(mistral_dir(tmp_path))
    decoder = TokenDecoder(loaded)
    assert not decoder.windowed
    for text in TEXTS:
        ids = loaded.encode(text, add_special_tokens=False)
        whole = loaded.decode(ids, skip_special_tokens=True)
        assert _streamed(decoder, ids, continues_prompt=False) == whole == decoder.decode(ids)
    assert decoder.max_token_bytes == max(len(b) for b in decoder.token_bytes_table())


def test_remote_code_needs_the_setting(tmp_path: Path, modules_cache: Path) -> None:
    directory = remote_code_dir(tmp_path)
    with pytest.raises(TokenizerLoadError) as caught:
        load_tokenizer(directory)
    assert TRUST_REMOTE_CODE_KEY in str(caught.value) and "tokenization_remote.RemoteSpmTokenizer" in str(caught.value)
    with pytest.raises(TokenizerLoadError, match="trust_remote_code"):
        PromptTokenizer.load(directory)
    assert not modules_cache.exists()  # nothing of the model's code was copied, let alone run


def test_remote_code_tokenizer_without_fast_version_is_served(tmp_path: Path, modules_cache: Path) -> None:
    directory = remote_code_dir(tmp_path)
    loaded = load_tokenizer(directory, trust_remote_code=True)
    assert loaded.tokenizer is None and type(loaded.slow).__name__ == "RemoteSpmTokenizer"
    assert (loaded.bos_id, loaded.eos_id, loaded.pad_id) == (1, 2, 3)
    assert loaded.encode("hello", add_special_tokens=True)[0] == 1
    assert 2 in loaded.encode("a </s>", add_special_tokens=True)
    assert 2 not in loaded.encode("a </s>", add_special_tokens=True, literal_special_tokens=True)
    assert loaded.vocab_size == len(loaded.slow) and loaded.token_to_id("</s>") == 2
    assert loaded.token_to_id("no-such-piece") is None
    assert loaded.encode_batch(["a", "b"], add_special_tokens=False) == [
        loaded.encode("a", add_special_tokens=False),
        loaded.encode("b", add_special_tokens=False),
    ]
    prompt = PromptTokenizer.load(directory, trust_remote_code=True)
    assert prompt.backend is None
    ids = prompt.chat_ids([("user", "Hi </s> there")])
    assert ids.count(1) == 1 and 2 not in ids
    assert 2 not in prompt.prompt_ids("a </s>") and 2 in prompt.prompt_ids("a </s>", literal_special_tokens=False)


def test_windowed_decoder_streams_exactly_the_slow_decode(tmp_path: Path, modules_cache: Path) -> None:
    loaded = load_tokenizer(remote_code_dir(tmp_path), trust_remote_code=True)
    decoder = TokenDecoder(loaded)
    assert decoder.windowed
    with pytest.raises(UnsupportedTokenizerError):
        decoder.token_bytes_table()
    for text in TEXTS:
        ids = loaded.encode(text, add_special_tokens=False)
        whole = loaded.decode(ids, skip_special_tokens=True)
        if whole.endswith("\ufffd"):
            continue  # a sequence cut inside a character: the stream drops the stray bytes
        streamed = _streamed(decoder, ids, continues_prompt=False)
        assert streamed == whole
        assert "\ufffd" not in streamed or "\ufffd" in text
        # In chunks of 3 as well, and with special tokens among them (skipped).
        stream = StreamDetokenizer(decoder, continues_prompt=False)
        chunks = [stream.feed(ids[i : i + 3] + [2]) for i in range(0, len(ids), 3)]
        assert "".join(chunks) == whole
    # An emoji split over byte-fallback tokens is emitted whole, by the token that completes it.
    ids = loaded.encode("😀", add_special_tokens=False)
    assert len(ids) >= 2
    pieces = [StreamDetokenizer(decoder, continues_prompt=False)]
    outs = [pieces[0].feed([token]) for token in ids]
    assert outs[:-1] == [""] * (len(ids) - 1) and outs[-1].endswith("😀")
    assert decoder.max_token_bytes >= max(len(loaded.decode([i], skip_special_tokens=True).encode()) for i in range(loaded.vocab_size))


def test_windowed_decoder_keeps_the_space_of_a_continued_prompt(tmp_path: Path, modules_cache: Path) -> None:
    loaded = load_tokenizer(remote_code_dir(tmp_path), trust_remote_code=True)
    decoder = TokenDecoder(loaded)
    prompt = loaded.encode("Hello", add_special_tokens=False)
    completion = loaded.encode("Hello there friend", add_special_tokens=False)[len(prompt) :]
    whole = loaded.decode(prompt + completion, skip_special_tokens=True)
    assert whole.startswith("Hello") and loaded.decode(prompt, skip_special_tokens=True) == "Hello"
    assert _streamed(decoder, completion, continues_prompt=True) == whole[len("Hello") :]


def test_tokenizer_json_with_auto_map_is_served_without_running_code(tmp_path: Path, modules_cache: Path) -> None:
    directory = tmp_path / "fast-with-code"
    directory.mkdir()
    (directory / "tokenizer.json").write_bytes((EMBEDDED_TOKENIZER_DIR / "tokenizer.json").read_bytes())
    config = json.loads((EMBEDDED_TOKENIZER_DIR / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_missing.Missing", None]}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    loaded = load_tokenizer(directory)
    assert loaded.tokenizer is not None
    prompt = PromptTokenizer.load(directory)
    assert prompt.prompt_ids("hello") == loaded.encode("hello", add_special_tokens=True)
    assert not modules_cache.exists()


def test_a_directory_with_nothing_to_build_from_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerLoadError, match="no tokenizer.json, no sentencepiece tokenizer.model"):
        load_tokenizer(tmp_path)


def test_a_converted_tokenizer_is_written_once_as_tokenizer_json(tmp_path: Path, modules_cache: Path) -> None:
    directory = mistral_dir(tmp_path)
    converted = load_tokenizer(directory)
    chat_before = PromptTokenizer.load(directory).chat_ids([("user", "Hello there </s>")])
    assert ensure_tokenizer_json(directory)
    assert (directory / "tokenizer.json").is_file()
    reloaded = load_tokenizer(directory)
    for text in TEXTS:
        assert reloaded.encode(text, add_special_tokens=True) == converted.encode(text, add_special_tokens=True)
    assert (reloaded.bos_id, reloaded.eos_id, reloaded.pad_id) == (converted.bos_id, converted.eos_id, converted.pad_id)
    assert PromptTokenizer.load(directory).chat_ids([("user", "Hello there </s>")]) == chat_before
    # A slow-only remote-code tokenizer has nothing to write.
    remote = remote_code_dir(tmp_path)
    assert not ensure_tokenizer_json(remote, trust_remote_code=True)
    assert not (remote / "tokenizer.json").exists()
