"""The stand-in model's request side (engine_standin/request_inputs.py) and response merging
(engine_standin/senders.py), without Triton: `pb_utils` and the request are small fakes."""

from __future__ import annotations

import numpy as np
import pytest
from trtllm_truss.engine_standin import GenerationOutput, RequestRejected
from trtllm_truss.engine_standin.request_inputs import (
    BATCH_NEEDS_DECOUPLED_ERROR,
    SEQUENCES_NEED_DECOUPLED_ERROR,
    STREAMING_NEEDS_DECOUPLED_ERROR,
    read_generation,
    read_rows,
    request_scalar,
)
from trtllm_truss.engine_standin.senders import merged


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class _Request:
    def __init__(self, **arrays: np.ndarray) -> None:
        self._tensors = [_Tensor(name, array) for name, array in arrays.items()]

    def inputs(self) -> list[_Tensor]:
        return self._tensors


class _PbUtils:
    @staticmethod
    def get_input_tensor_by_name(request: _Request, name: str):
        return next((t for t in request.inputs() if t.name() == name), None)


def _ints(*rows: list[int]) -> np.ndarray:
    return np.array(rows, dtype=np.int32)


def _read(request: _Request, *, decoupled: bool = True, default_end_id: int | None = 2):
    rows = read_rows(_PbUtils, request, decoupled=decoupled)
    return rows, [
        read_generation(rows, row, sequence, default_end_id=default_end_id, default_exclude_input=False, validate=lambda g: None)
        for row in range(rows.rows)
        for sequence in range(rows.sequences[row])
    ]


def test_request_scalar_reads_the_first_value_or_the_default() -> None:
    request = _Request(streaming=np.array([[True]]), empty=np.zeros((1, 0), dtype=np.int32))
    assert request_scalar(_PbUtils, request, "streaming", False) is True
    assert request_scalar(_PbUtils, request, "empty", 7) == 7
    assert request_scalar(_PbUtils, request, "missing", None) is None


def test_one_row_becomes_one_engine_request_with_the_checkpoints_end_id() -> None:
    request = _Request(input_ids=_ints([5, 6, 7, 0]), input_lengths=_ints([3]), request_output_len=_ints([4]))
    rows, (parsed,) = _read(request)
    assert rows.rows == 1 and rows.sequences == [1]
    assert parsed.prompt == [5, 6, 7] and parsed.generation.input_ids == [5, 6, 7]
    assert parsed.generation.max_new_tokens == 4 and parsed.generation.end_id == 2
    assert parsed.batch_index is None and parsed.sequence_index is None
    assert not parsed.streaming and not parsed.exclude_input and not parsed.want_perf


def test_rows_and_sequences_are_indexed_and_seeded_sequences_differ() -> None:
    request = _Request(
        input_ids=_ints([1, 2], [3, 4]), request_output_len=_ints([2], [2]),
        num_return_sequences=_ints([2], [2]), random_seed=np.array([[10], [20]], dtype=np.uint64),
    )
    _, parsed = _read(request)
    assert [(p.batch_index, p.sequence_index) for p in parsed] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [p.generation.sampling.random_seed for p in parsed] == [10, 11, 20, 21]
    assert len({p.generation.request_id for p in parsed}) == 4


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"input_ids": _ints([1], [2]), "request_output_len": _ints([1], [1])}, BATCH_NEEDS_DECOUPLED_ERROR),
        ({"input_ids": _ints([1]), "request_output_len": _ints([1]), "streaming": np.array([[True]])}, STREAMING_NEEDS_DECOUPLED_ERROR),
        ({"input_ids": _ints([1]), "request_output_len": _ints([1]), "num_return_sequences": _ints([2])}, SEQUENCES_NEED_DECOUPLED_ERROR),
    ],
)
def test_not_decoupled_refusals_are_nvidias_messages(arrays: dict, message: str) -> None:
    with pytest.raises(RequestRejected) as refused:
        _read(_Request(**arrays), decoupled=False)
    assert str(refused.value) == message


def test_row_refusals_name_the_row() -> None:
    request = _Request(input_ids=_ints([1, 2], [3, 4]), input_lengths=_ints([2], [3]), request_output_len=_ints([1], [1]))
    with pytest.raises(RequestRejected, match=r"input_lengths: 3 does not fit the 2 input_ids sent \(row 1\)"):
        _read(request)
    guide = np.array([[b"a+"]], dtype=object)
    with pytest.raises(RequestRejected, match="guided_decoding_guide: sent without guided_decoding_guide_type$"):
        _read(_Request(input_ids=_ints([1]), request_output_len=_ints([1]), guided_decoding_guide=guide))
    with pytest.raises(RequestRejected, match="input_ids: required"):
        _read(_Request(request_output_len=_ints([1])))
    with pytest.raises(RequestRejected, match="request_output_len: required"):
        _read(_Request(input_ids=_ints([1])))


def test_validation_refusals_name_the_row() -> None:
    def refuse(generation) -> None:
        raise RequestRejected("beam_width: only 1")

    rows = read_rows(_PbUtils, _Request(input_ids=_ints([1], [2]), request_output_len=_ints([1], [1])), decoupled=True)
    with pytest.raises(RequestRejected, match=r"beam_width: only 1 \(row 0\)"):
        read_generation(rows, 0, 0, default_end_id=None, default_exclude_input=True, validate=refuse)


def test_merged_joins_the_waiting_outputs_of_each_request_in_first_seen_order() -> None:
    a, b = object(), object()

    def out(tokens: list[int], finished: bool = False) -> GenerationOutput:
        return GenerationOutput(request_id="x", token_ids=tokens, log_probs=[-0.5] * len(tokens), finished=finished)

    entries = merged([(a, out([1])), (b, out([7])), (a, out([2, 3], finished=True))])
    assert [(e[0], e[1], e[2]) for e in entries] == [(a, [1, 2, 3], [-0.5] * 3), (b, [7], [-0.5])]
    assert entries[0][4] is not None and entries[0][4].finished and entries[1][4] is None
