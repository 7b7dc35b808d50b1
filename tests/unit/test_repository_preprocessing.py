"""Preprocessing logic (trtllm_truss.preprocess) with the embedded model's real tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from trtllm_truss.preprocess import (
    PreprocessingError,
    RawRequest,
    preprocess_batch,
    word_list_tensor,
)
from trtllm_truss.tokenizer import LoadedTokenizer, load_tokenizer

EMBEDDED = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"


@pytest.fixture(scope="module")
def tokenizer() -> LoadedTokenizer:
    if not (EMBEDDED / "tokenizer.json").is_file():
        pytest.skip("data/embedded-llama not generated yet")
    return load_tokenizer(EMBEDDED)


def _words(tensor: np.ndarray) -> list[list[int]]:
    ids, offsets = tensor[0, 0].tolist(), tensor[0, 1].tolist()
    words, start = [], 0
    for end in offsets:
        if end < 0:
            break
        words.append(ids[start:end])
        start = end
    return words


def test_word_list_is_nvidia_format(tokenizer: LoadedTokenizer) -> None:
    tensor = word_list_tensor(tokenizer, [" world", "你好", "😀 ok"])
    assert tensor.dtype == np.int32 and tensor.shape[:2] == (1, 2)
    expected = [tokenizer.encode(w, add_special_tokens=False) for w in [" world", "你好", "😀 ok"]]
    assert _words(tensor) == expected
    total = sum(map(len, expected))
    assert tensor.shape[2] == total
    assert tensor[0, 1].tolist()[:3] == [len(expected[0]), len(expected[0]) + len(expected[1]), total]
    assert all(v == -1 for v in tensor[0, 1].tolist()[3:])


def test_no_words_is_nvidias_empty_list(tokenizer: LoadedTokenizer) -> None:
    # NVIDIA's preprocessing (v0.19.0 _to_word_list_format): input not sent -> [1, 2, 0]; sent
    # without any word that tokenizes -> ids [0], offsets [-1], shape [1, 2, 1].
    assert word_list_tensor(tokenizer, None).shape == (1, 2, 0)
    assert word_list_tensor(tokenizer, []).tolist() == [[[0], [-1]]]
    assert word_list_tensor(tokenizer, ["", ""]).tolist() == [[[0], [-1]]]


def test_batch_defaults_and_per_request_errors(tokenizer: LoadedTokenizer) -> None:
    requests = [
        RawRequest("Hello world", 16, stop_words=(" world",)),
        RawRequest("x" * 5000, 16),  # over max_input_len
        RawRequest("fine", 999),  # over max_output_len
        RawRequest("ids", 4, end_id=7, pad_id=9),
    ]
    results = preprocess_batch(tokenizer, requests, add_special_tokens=True, max_input_len=256, max_output_len=128)
    first, too_long, too_many, explicit = results
    assert not isinstance(first, PreprocessingError)
    ids = first.input_ids[0].tolist()
    assert ids == tokenizer.encode("Hello world", add_special_tokens=True)
    assert ids[0] == tokenizer.bos_id  # add_special_tokens: the model's BOS is prepended
    assert first.input_length.tolist() == [[len(ids)]]
    assert first.end_id.tolist() == [[tokenizer.eos_id]] and first.pad_id.tolist() == [[tokenizer.pad_id]]
    assert _words(first.stop_words_ids) == [tokenizer.encode(" world", add_special_tokens=False)]
    assert first.bad_words_ids.shape == (1, 2, 0)
    assert isinstance(too_long, PreprocessingError) and "text_input" in str(too_long) and "max_input_len 256" in str(too_long)
    assert isinstance(too_many, PreprocessingError) and "max_tokens" in str(too_many)
    assert explicit.end_id.tolist() == [[7]] and explicit.pad_id.tolist() == [[9]]


def test_decoder_ids_and_embedding_bias_as_nvidia_sends_them(tokenizer: LoadedTokenizer) -> None:
    # NVIDIA's preprocessing (v0.19.0): decoder-only -> DECODER_INPUT_ID [[pad_id]] with length 1;
    # EMBEDDING_BIAS [1, 0] unless words and weights are sent, then each word's weight at its ids.
    plain, biased, mismatched = preprocess_batch(
        tokenizer,
        [
            RawRequest("Hello", 4),
            RawRequest("Hello", 4, embedding_bias_words=(" world",), embedding_bias_weights=(2.5,)),
            RawRequest("Hello", 4, embedding_bias_words=("a", "b"), embedding_bias_weights=(1.0,)),
        ],
        add_special_tokens=True,
        max_input_len=None,
        max_output_len=None,
    )
    assert plain.decoder_input_ids.tolist() == plain.pad_id.tolist() and plain.decoder_input_length.tolist() == [[1]]
    assert plain.embedding_bias.shape == (1, 0) and plain.embedding_bias.dtype == np.float32
    vocab = tokenizer.tokenizer.get_vocab_size()
    assert biased.embedding_bias.shape == (1, vocab)
    word_ids = set(tokenizer.encode(" world", add_special_tokens=True))
    assert {int(i) for i in np.nonzero(biased.embedding_bias[0])[0]} == word_ids
    assert isinstance(mismatched, PreprocessingError) and "embedding_bias_weights" in str(mismatched)
