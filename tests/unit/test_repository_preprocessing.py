"""Preprocessing logic (trtllm_truss.engine.preprocess) with the embedded model's real tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from trtllm_truss.engine.preprocess import (
    PreprocessingError,
    RawRequest,
    preprocess_batch,
    stack_rows,
    word_list_tensor,
)
from trtllm_truss.engine.tokenizer import LoadedTokenizer, load_tokenizer

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


def test_rows_of_one_request_stack_as_nvidias_batch(tokenizer: LoadedTokenizer) -> None:
    """A request of batch size 2 (NVIDIA's --batch-inputs): INPUT_ID [2, longest] right-padded with
    the pad id, word lists [2, 2, widest] (ids 0, offsets -1), every other output [2, ...]."""
    short, long = preprocess_batch(
        tokenizer,
        [RawRequest("Hi", 4, stop_words=("x",)), RawRequest("A much longer prompt than the first", 6, stop_words=("a b c", "d"))],
        add_special_tokens=True,
        max_input_len=None,
        max_output_len=None,
    )
    stacked = stack_rows([short, long], pad_id=tokenizer.pad_id)
    width = long.input_ids.shape[1]
    assert stacked.input_ids.shape == (2, width) and stacked.input_ids.dtype == np.int32
    assert stacked.input_ids[0, : short.input_ids.shape[1]].tolist() == short.input_ids[0].tolist()
    assert set(stacked.input_ids[0, short.input_ids.shape[1] :].tolist()) == {tokenizer.pad_id}
    assert stacked.input_length.tolist() == [[short.input_ids.shape[1]], [width]]
    assert stacked.request_output_len.tolist() == [[4], [6]]
    for name in ("end_id", "pad_id", "decoder_input_ids", "decoder_input_length"):
        assert getattr(stacked, name).shape == (2, 1), name
    words = stacked.stop_words_ids
    assert words.shape[:2] == (2, 2) and words.shape[2] == long.stop_words_ids.shape[2]
    narrow = short.stop_words_ids.shape[2]
    assert words[0, 0, narrow:].tolist() == [0] * (words.shape[2] - narrow)
    assert words[0, 1, narrow:].tolist() == [-1] * (words.shape[2] - narrow)
    assert stacked.bad_words_ids.shape == (2, 2, 0)  # not sent: NVIDIA's [batch, 2, 0]
    assert stacked.embedding_bias.shape == (2, 0)
    assert stack_rows([short], pad_id=0) is short
