"""Pure parts of the engine stand-in: word lists (TensorRT-LLM format), penalties, sampling, settings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from trtllm_truss.engine_standin import (
    GenerationRequest,
    SamplingParams,
    SettingsError,
    StandinSettings,
    parse_word_list,
)
from trtllm_truss.engine_standin.sampling import (
    SequenceSamplingState,
    process_logits,
    select_next_tokens,
)
from trtllm_truss.engine_standin.words import banned_next_tokens, ends_with_any

VOCAB = 8


def _state(tokens, **sampling) -> SequenceSamplingState:
    request = GenerationRequest("r", list(tokens), 4, sampling=SamplingParams(**sampling))
    return SequenceSamplingState(request, list(tokens), VOCAB)


def test_parse_word_list_reads_nvidia_format_with_and_without_batch_dim():
    # words [5, 6], [7], [1, 2, 3]: ids concatenated, cumulative end offsets padded with -1
    tensor = np.array([[5, 6, 7, 1, 2, 3], [2, 3, 6, -1, -1, -1]], dtype=np.int32)
    assert parse_word_list(tensor, "stop_words_list") == [[5, 6], [7], [1, 2, 3]]
    assert parse_word_list(tensor[None], "stop_words_list") == [[5, 6], [7], [1, 2, 3]]
    assert parse_word_list(np.zeros((1, 2, 0), dtype=np.int32), "stop_words_list") == []
    assert parse_word_list(None, "stop_words_list") == []


def test_parse_word_list_names_the_tensor_on_bad_shape_or_offsets():
    with pytest.raises(ValueError, match="bad_words_list"):
        parse_word_list(np.zeros((3, 4), dtype=np.int32), "bad_words_list")
    with pytest.raises(ValueError, match="bad_words_list: offset 9"):
        parse_word_list(np.array([[1, 2], [9, -1]], dtype=np.int32), "bad_words_list")


def test_stop_and_bad_word_matching():
    assert ends_with_any([1, 2, 3], [[2, 3]])
    assert not ends_with_any([1, 2, 3], [[1, 2]])
    assert ends_with_any([3], [[3]])
    assert not ends_with_any([3], [[2, 3]])
    # single-token bad words always banned; multi-token ones only after their prefix
    assert banned_next_tokens([4, 1], [[7], [1, 5], [2, 6]]) == [7, 5]


def test_penalties_follow_tensorrt_llm_formula():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0]])
    # token 0 twice, token 1 once in the sequence (prompt included); token 2 absent
    state = _state([0, 1, 0], repetition_penalty=2.0, presence_penalty=0.25, frequency_penalty=0.5, top_k=1)
    out = process_logits(logits, [state])[0]
    assert out[0].item() == pytest.approx(2.0 / 2.0 - 0.25 - 0.5 * 2)
    assert out[1].item() == pytest.approx(-2.0 * 2.0 - 0.25 - 0.5 * 1)
    assert out[2].item() == pytest.approx(1.0)  # absent: untouched


def test_min_length_masks_end_id_and_bad_words_are_never_chosen():
    logits = torch.tensor([[0.0, 0.0, 9.0, 5.0, 1.0, 0.0, 0.0, 0.0]])
    request = GenerationRequest("r", [1], 4, end_id=2, sampling=SamplingParams(min_length=1), bad_words=[[3]])
    state = SequenceSamplingState(request, [1], VOCAB)
    tokens, _, _ = select_next_tokens(logits, [state], want_log_probs=False)
    assert tokens == [4]  # 2 is the end id (masked before min_length), 3 is a bad word


def test_seeded_sampling_is_reproducible_and_independent_of_batch_neighbours():
    torch.manual_seed(0)
    logits = torch.randn(1, VOCAB)
    noise = torch.randn(3, VOCAB)

    def run(batch_with_others: bool, seed: int) -> list[int]:
        me = _state([1], random_seed=seed, top_k=0, top_p=0.9, temperature=0.8)
        others = [_state([1], random_seed=s, top_k=3) for s in (11, 12, 13)] if batch_with_others else []
        chosen = []
        for _ in range(20):
            batch = torch.cat([logits, noise]) if batch_with_others else logits
            tokens, _, _ = select_next_tokens(batch, [me, *others], want_log_probs=False)
            chosen.append(tokens[0])
        return chosen

    alone = run(False, seed=7)
    assert run(True, seed=7) == alone
    assert run(False, seed=8) != alone or run(False, seed=9) != alone


def test_top_k_restricts_choices():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    state = _state([1], top_k=2, random_seed=3)
    seen = {select_next_tokens(logits, [state], want_log_probs=False)[0][0] for _ in range(200)}
    assert seen == {0, 1}


def test_settings_errors_name_the_parameter():
    with pytest.raises(SettingsError) as info:
        StandinSettings.from_parameters({"max_batch_size": "many", "device": "tpu"})
    message = str(info.value)
    assert "parameters.max_batch_size" in message and "parameters.device" in message
    assert "parameters.model_dir" in message
    synthetic = StandinSettings.from_parameters({"synthetic": "true", "max_num_sequences": "4", "max_batch_size": "16"})
    assert synthetic.synthetic and synthetic.synthetic_step_time_ms == 0.0 and synthetic.limits.max_batch_size == 4
