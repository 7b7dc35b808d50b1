"""The GPU path's `tensorrt_llm` inputs against all 60 of NVIDIA's (tensorrtllm_backend v0.19.0), and the
stand-in's handling of every input it declares.

NVIDIA's list: tests/data/tensorrtllm_backend/v0.19.0/tensorrt_llm.inputs.json (read from
all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt at the tag; the file names the commit).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from trtllm_truss.engine_standin import RequestRejected
from trtllm_truss.engine_standin.unsupported_inputs import (
    UNSUPPORTED_INPUTS,
    refuse_unsupported,
)
from trtllm_truss.repository import interface as nv

NVIDIA = json.loads(
    (Path(__file__).parents[1] / "data" / "tensorrtllm_backend" / "v0.19.0" / "tensorrt_llm.inputs.json").read_text()
)
NVIDIA_INPUTS = {entry["name"]: entry for entry in NVIDIA["inputs"]}
# NVIDIA's `${...}` dtypes, as this repository fills them (NVIDIA's examples use TYPE_FP32 for logits).
TEMPLATE_DTYPES = {"${logits_datatype}": "TYPE_FP32"}
# Inputs the stand-in reads and honours (triton_models/tensorrt_llm_pytorch/model.py STANDIN_MODEL_INTERFACE).
STANDIN_HONOURS = {
    "input_ids", "input_lengths", "request_output_len", "end_id", "pad_id", "stop_words_list", "bad_words_list",
    "beam_width", "temperature", "runtime_top_k", "runtime_top_p", "len_penalty", "repetition_penalty",
    "min_length", "presence_penalty", "frequency_penalty", "random_seed", "return_log_probs",
    "return_context_logits", "return_generation_logits", "return_perf_metrics", "num_return_sequences",
    "exclude_input_in_output", "stop", "streaming", "decoder_input_ids", "decoder_input_lengths", "embedding_bias",
    "guided_decoding_guide_type", "guided_decoding_guide",
}


def test_nvidia_record_has_the_60_inputs_of_v0_19_0() -> None:
    assert NVIDIA["source"]["tag"] == "v0.19.0" and NVIDIA["count"] == 60 == len(NVIDIA_INPUTS)


def test_gpu_path_declares_or_refuses_every_nvidia_input_by_name() -> None:
    declared = {t.name for t in nv.engine_inputs(cpp_backend=True)}
    refused = set(nv.REFUSED_ENGINE_INPUTS)
    assert not declared & refused
    assert declared | refused <= set(NVIDIA_INPUTS), "an input NVIDIA does not have"
    assert set(NVIDIA_INPUTS) == declared | refused
    assert all(reason.strip() for reason in nv.REFUSED_ENGINE_INPUTS.values())


def test_gpu_path_inputs_have_nvidias_dtype_dims_and_shape() -> None:
    for tensor in nv.engine_inputs(cpp_backend=True):
        entry = NVIDIA_INPUTS[tensor.name]
        dtype = TEMPLATE_DTYPES.get(entry["data_type"], entry["data_type"])
        assert tensor.data_type.value == dtype, tensor.name
        assert tuple(tensor.dims) == tuple(entry["dims"]), tensor.name
        assert tensor.optional == entry["optional"], tensor.name
        assert (tensor.reshape == ()) == entry["reshape_to_scalar"], tensor.name
        if entry["allow_ragged_batch"] and tensor.name != "input_ids":
            assert tensor.allow_ragged_batch, tensor.name


def test_every_input_the_stand_in_declares_is_honoured_or_refused_by_name() -> None:
    declared = {t.name for t in nv.engine_inputs(cpp_backend=False)}
    assert declared == STANDIN_HONOURS | nv.STANDIN_REFUSED_INPUT_NAMES
    assert set(UNSUPPORTED_INPUTS) == nv.STANDIN_REFUSED_INPUT_NAMES
    assert not STANDIN_HONOURS & set(UNSUPPORTED_INPUTS)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_INPUTS))
def test_stand_in_refuses_each_unsupported_input_naming_it(name: str) -> None:
    with pytest.raises(RequestRejected, match=name):
        refuse_unsupported({"input_ids": np.array([[1, 2]]), name: np.array([[1]])})


def test_stand_in_accepts_an_empty_unsupported_input() -> None:
    refuse_unsupported({"draft_input_ids": np.zeros((1, 0), dtype=np.int32)})
