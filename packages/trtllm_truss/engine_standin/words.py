"""Stop and bad word lists: TensorRT-LLM's [2, -1] tensor format and the checks made each step.

Format (as produced by NVIDIA's preprocessing): row 0 holds the token ids of all words concatenated
(padded with 0), row 1 the cumulative end offset of each word (padded with -1). No words: shape [2, 0]
(or [1, 2, 0] with the batch dimension).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def parse_word_list(tensor: np.ndarray | None, name: str) -> list[list[int]]:
    if tensor is None:
        return []
    array = np.asarray(tensor)
    if array.ndim == 3:  # batch dimension of one request
        array = array[0]
    if array.size == 0:
        return []
    if array.ndim != 2 or array.shape[0] != 2:
        raise ValueError(f"{name}: expected shape [2, N] (ids row, offsets row), got {list(array.shape)}")
    ids, offsets = array[0].tolist(), array[1].tolist()
    words: list[list[int]] = []
    start = 0
    for end in offsets:
        if end < 0:
            break
        if end < start or end > len(ids):
            raise ValueError(f"{name}: offset {end} out of range (previous {start}, {len(ids)} ids)")
        if end > start:
            words.append([int(t) for t in ids[start:end]])
        start = end
    return words


def ends_with_any(sequence: Sequence[int], words: Sequence[Sequence[int]]) -> bool:
    """True when `sequence` ends with one of `words` (checked right after each new token)."""
    n = len(sequence)
    for word in words:
        k = len(word)
        if k <= n and sequence[n - 1] == word[-1] and (k == 1 or list(sequence[n - k :]) == list(word)):
            return True
    return False


def banned_next_tokens(sequence: Sequence[int], bad_words: Sequence[Sequence[int]]) -> list[int]:
    """Tokens that would complete a bad word if generated next (single-token words are always banned)."""
    banned: list[int] = []
    n = len(sequence)
    for word in bad_words:
        prefix = word[:-1]
        k = len(prefix)
        if k == 0 or (k <= n and list(sequence[n - k :]) == list(prefix)):
            banned.append(word[-1])
    return banned
