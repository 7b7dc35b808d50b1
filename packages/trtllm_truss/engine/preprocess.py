"""Request preprocessing, free of Triton: prompts -> ids, word lists -> TensorRT-LLM's [2, -1] format.

Used by triton_models/preprocessing/model.py, which only moves tensors in and out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trtllm_truss.engine.tokenizer import LoadedTokenizer


class PreprocessingError(ValueError):
    """A request cannot be preprocessed; the message names the ensemble input."""


def prompt_too_long_message(tokens: int, max_input_len: int) -> str:
    return f"text_input: {tokens} tokens, over max_input_len {max_input_len}"


def as_text(value: object) -> str:
    if isinstance(value, (bytes, bytearray, np.bytes_)):
        return bytes(value).decode("utf-8")
    return str(value)


def word_list_tensor(tokenizer: LoadedTokenizer, words: Sequence[str] | None) -> np.ndarray:
    """[1, 2, N] INT32: row 0 all ids concatenated, row 1 cumulative end offsets (padded with -1).

    Each word is tokenized on its own without special tokens, as NVIDIA's preprocessing does, and
    with NVIDIA's empty encodings: input not sent (None) -> shape [1, 2, 0]; sent but no word gives
    any token -> [[[0], [-1]]] (shape [1, 2, 1]).
    """
    if words is None:
        return np.zeros((1, 2, 0), dtype=np.int32)
    words = [w for w in words if w]
    if not words:
        return np.array([[[0], [-1]]], dtype=np.int32)
    ids: list[int] = []
    offsets: list[int] = []
    for word_ids in tokenizer.encode_batch(list(words), add_special_tokens=False):
        if word_ids:
            ids.extend(word_ids)
            offsets.append(len(ids))
    width = max(1, len(ids), len(offsets))
    out = np.zeros((1, 2, width), dtype=np.int32)
    out[0, 0, : len(ids)] = ids
    out[0, 1, :] = -1
    out[0, 1, : len(offsets)] = offsets
    return out


@dataclass(frozen=True)
class PreprocessedRequest:
    """One request's tensors; N rows when the request has batch size N (the shapes below say 1)."""

    input_ids: np.ndarray  # [1, L] INT32
    input_length: np.ndarray  # [1, 1] INT32
    request_output_len: np.ndarray  # [1, 1] INT32
    bad_words_ids: np.ndarray  # [1, 2, N] INT32
    stop_words_ids: np.ndarray  # [1, 2, N] INT32
    end_id: np.ndarray  # [1, 1] INT32
    pad_id: np.ndarray  # [1, 1] INT32
    # NVIDIA's preprocessing outputs for decoder-only models: [[pad_id]] with length 1 (the engine
    # ignores them), and the embedding bias over the vocabulary ([1, 0] when none was asked for).
    decoder_input_ids: np.ndarray  # [1, 1] INT32
    decoder_input_length: np.ndarray  # [1, 1] INT32
    embedding_bias: np.ndarray  # [1, V] or [1, 0] FP32


@dataclass(frozen=True)
class RawRequest:
    query: str
    request_output_len: int
    bad_words: tuple[str, ...] | None = None  # None: the input was not sent
    stop_words: tuple[str, ...] | None = None
    end_id: int | None = None
    pad_id: int | None = None
    embedding_bias_words: tuple[str, ...] | None = None
    embedding_bias_weights: tuple[float, ...] | None = None


def embedding_bias_tensor(
    tokenizer: LoadedTokenizer, words: Sequence[str] | None, weights: Sequence[float] | None
) -> np.ndarray:
    """NVIDIA's EMBEDDING_BIAS: each word's weight added at every id of the word (encoded as a
    prompt is, special tokens included); [1, 0] when words or weights are missing."""
    if words is None or weights is None:
        return np.zeros((1, 0), dtype=np.float32)
    if len(words) != len(weights):
        raise PreprocessingError(
            f"embedding_bias_words/embedding_bias_weights: {len(words)} words but {len(weights)} weights"
        )
    bias = np.zeros((1, tokenizer.tokenizer.get_vocab_size()), dtype=np.float32)
    for word, weight in zip(words, weights):
        if not word:
            continue
        for token_id in tokenizer.encode(word, add_special_tokens=True):
            if 0 <= token_id < bias.shape[1]:
                bias[0, token_id] += weight
    return bias


def _scalar(value: int) -> np.ndarray:
    return np.array([[value]], dtype=np.int32)


def preprocess_batch(
    tokenizer: LoadedTokenizer,
    requests: Sequence[RawRequest],
    *,
    add_special_tokens: bool,
    max_input_len: int | None,
    max_output_len: int | None,
) -> list[PreprocessedRequest | PreprocessingError]:
    """Tokenize a dynamic batch with one tokenizer call; a bad request fails alone."""
    encoded = tokenizer.encode_batch([r.query for r in requests], add_special_tokens=add_special_tokens)
    results: list[PreprocessedRequest | PreprocessingError] = []
    for request, ids in zip(requests, encoded):
        try:
            results.append(_one(tokenizer, request, ids, max_input_len=max_input_len, max_output_len=max_output_len))
        except PreprocessingError as exc:
            results.append(exc)
    return results


def _one(
    tokenizer: LoadedTokenizer,
    request: RawRequest,
    ids: list[int],
    *,
    max_input_len: int | None,
    max_output_len: int | None,
) -> PreprocessedRequest:
    if not ids:
        raise PreprocessingError("text_input: the prompt encodes to no tokens")
    if max_input_len is not None and len(ids) > max_input_len:
        raise PreprocessingError(prompt_too_long_message(len(ids), max_input_len))
    if request.request_output_len < 1:
        raise PreprocessingError(f"max_tokens: must be >= 1, got {request.request_output_len}")
    if max_output_len is not None and request.request_output_len > max_output_len:
        raise PreprocessingError(f"max_tokens: {request.request_output_len} is over max_output_len {max_output_len}")
    end_id = request.end_id if request.end_id is not None else tokenizer.eos_id
    pad_id = request.pad_id if request.pad_id is not None else tokenizer.pad_id
    if end_id is None:
        raise PreprocessingError("end_id: not given and the tokenizer has no eos_token")
    if pad_id is None:
        pad_id = end_id
    return PreprocessedRequest(
        input_ids=np.array([ids], dtype=np.int32),
        input_length=_scalar(len(ids)),
        request_output_len=_scalar(request.request_output_len),
        bad_words_ids=word_list_tensor(tokenizer, request.bad_words),
        stop_words_ids=word_list_tensor(tokenizer, request.stop_words),
        end_id=_scalar(end_id),
        pad_id=_scalar(pad_id),
        decoder_input_ids=_scalar(pad_id),
        decoder_input_length=_scalar(1),
        embedding_bias=embedding_bias_tensor(tokenizer, request.embedding_bias_words, request.embedding_bias_weights),
    )


def stack_rows(rows: Sequence[PreprocessedRequest], pad_id: int) -> PreprocessedRequest:
    """The rows of one request of batch size N as NVIDIA's preprocessing returns them: INPUT_ID
    [N, longest] right-padded with the tokenizer's pad id, word lists [N, 2, widest] (ids padded
    with 0, offsets with -1), every other tensor [N, ...] row by row."""
    if len(rows) == 1:
        return rows[0]

    def right_padded(arrays: list[np.ndarray], fill: int | list[int]) -> np.ndarray:
        width = max(a.shape[-1] for a in arrays)
        padded = []
        for array in arrays:
            extra = width - array.shape[-1]
            if extra:
                if isinstance(fill, list):  # word lists: one fill value per inner row
                    pad = np.stack([np.full(extra, value, dtype=array.dtype) for value in fill])[None]
                else:
                    pad = np.full((*array.shape[:-1], extra), fill, dtype=array.dtype)
                array = np.concatenate([array, pad], axis=-1)
            padded.append(array)
        return np.concatenate(padded, axis=0)

    return PreprocessedRequest(
        input_ids=right_padded([r.input_ids for r in rows], pad_id),
        input_length=np.concatenate([r.input_length for r in rows]),
        request_output_len=np.concatenate([r.request_output_len for r in rows]),
        bad_words_ids=right_padded([r.bad_words_ids for r in rows], [0, -1]),
        stop_words_ids=right_padded([r.stop_words_ids for r in rows], [0, -1]),
        end_id=np.concatenate([r.end_id for r in rows]),
        pad_id=np.concatenate([r.pad_id for r in rows]),
        decoder_input_ids=np.concatenate([r.decoder_input_ids for r in rows]),
        decoder_input_length=np.concatenate([r.decoder_input_length for r in rows]),
        # [N, V] when the request sent bias words, else [N, 0] (all rows alike: one tensor per request)
        embedding_bias=np.concatenate([r.embedding_bias for r in rows]),
    )
