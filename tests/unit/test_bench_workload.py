"""Workload generation: lengths from a normal distribution, prompts of exact token length, datasets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trtllm_truss.bench.workload import (
    LengthDistribution,
    WorkloadError,
    WorkloadSpec,
    generate_workload,
)


@pytest.fixture(scope="module")
def tokenizer():
    """A real byte-level BPE (1,500 tokens) trained in well under a second on stdlib text, with a BOS
    added like a Llama tokenizer does."""
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["\n".join(topics.values())[:300_000]], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def test_length_distribution_is_seeded_clipped_and_normal():
    dist = LengthDistribution(mean=100, stddev=20, minimum=1, maximum=130)
    a = dist.sample(np.random.default_rng(1), 5000)
    assert a == dist.sample(np.random.default_rng(1), 5000)
    assert min(a) >= 1 and max(a) == 130
    unclipped = [v for v in a if v < 130]
    assert np.mean(a) == pytest.approx(100, abs=1.5)
    assert np.std(unclipped) > 10  # not a constant


def test_zero_stddev_gives_fixed_lengths():
    assert LengthDistribution(mean=7).sample(np.random.default_rng(0), 4) == [7, 7, 7, 7]


def test_maximum_below_minimum_is_rejected_with_the_field():
    with pytest.raises(ValueError, match="input_length.maximum"):
        WorkloadSpec(num_requests=1, input_length=LengthDistribution(mean=5, minimum=10, maximum=8))


def test_prompts_have_the_requested_token_lengths(tokenizer):
    spec = WorkloadSpec(
        num_requests=40,
        input_length=LengthDistribution(mean=64, stddev=16, maximum=120),
        output_length=LengthDistribution(mean=32, stddev=8),
        seed=5,
    )
    requests = generate_workload(spec, tokenizer)
    assert len(requests) == 40
    for r in requests:
        # ids are exactly what preprocessing produces for the prompt text (BOS included)
        assert list(r.input_ids) == tokenizer.encode(r.prompt)
        assert r.input_ids[0] == tokenizer.bos_token_id
        assert 1 <= r.input_len <= 120
        assert r.output_len >= 1
    # lengths follow the distribution: mean close to 64, and not all equal
    lens = [r.input_len for r in requests]
    assert abs(np.mean(lens) - 64) < 8 and len(set(lens)) > 5


def test_prompt_lengths_hit_the_sampled_length_exactly(tokenizer):
    spec = WorkloadSpec(num_requests=20, input_length=LengthDistribution(mean=50, stddev=10), seed=2)
    rng = np.random.default_rng(2)
    spec.output_length.sample(rng, 20)  # the generator draws output lengths first
    expected = spec.input_length.sample(rng, 20)
    got = [r.input_len for r in generate_workload(spec, tokenizer)]
    assert sum(g == e for g, e in zip(got, expected)) >= 18, (got, expected)


def test_same_seed_same_workload_other_seed_other_workload(tokenizer):
    spec = WorkloadSpec(num_requests=5, input_length=LengthDistribution(mean=20, stddev=4), seed=11)
    assert generate_workload(spec, tokenizer) == generate_workload(spec, tokenizer)
    other = generate_workload(spec.model_copy(update={"seed": 12}), tokenizer)
    assert [r.prompt for r in other] != [r.prompt for r in generate_workload(spec, tokenizer)]


def test_dataset_prompts_and_output_lengths(tokenizer, tmp_path):
    path = tmp_path / "requests.jsonl"
    lines = [
        {"prompt": "What is a generator?", "output_len": 12},
        {"text": "Explain the with statement", "max_tokens": 7},
        {"prompt": "Define a class"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    spec = WorkloadSpec(num_requests=4, dataset=path, output_length=LengthDistribution(mean=30), seed=0)
    requests = generate_workload(spec, tokenizer)
    assert [r.prompt for r in requests] == [
        "What is a generator?", "Explain the with statement", "Define a class", "What is a generator?"
    ]
    assert [r.output_len for r in requests] == [12, 7, 30, 12]
    assert list(requests[1].input_ids) == tokenizer.encode("Explain the with statement")


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "line 2: not JSON"),
        ('["a list"]', "line 2: expected a JSON object"),
        ('{"input": "x"}', "line 2: needs a non-empty string 'prompt' or 'text'"),
        ('{"prompt": "x", "output_len": 0}', "line 2: 'output_len' must be a positive integer"),
        ('{"prompt": "x", "max_tokens": "9"}', "line 2: 'max_tokens' must be a positive integer"),
    ],
)
def test_dataset_errors_name_the_line_and_key(tokenizer, tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(WorkloadError, match=message.replace("[", r"\[")):
        generate_workload(WorkloadSpec(num_requests=1, dataset=path), tokenizer)


def test_dataset_prompt_over_the_input_maximum_is_rejected(tokenizer, tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"prompt": "word " * 50}) + "\n")
    spec = WorkloadSpec(num_requests=1, dataset=path, input_length=LengthDistribution(mean=8, maximum=10))
    with pytest.raises(WorkloadError, match="above the input maximum 10"):
        generate_workload(spec, tokenizer)


def test_missing_dataset_names_the_path(tokenizer, tmp_path):
    with pytest.raises(WorkloadError, match="nope.jsonl"):
        generate_workload(WorkloadSpec(num_requests=1, dataset=tmp_path / "nope.jsonl"), tokenizer)


def test_bench_tokenizer_gives_preprocessings_ids_for_the_embedded_model():
    from pathlib import Path

    from trtllm_truss.bench.tokenizer import BenchTokenizer
    from trtllm_truss.engine.tokenizer import load_tokenizer

    tokenizer_dir = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        pytest.skip("the embedded model is not generated in this checkout")
    bench_tokenizer = BenchTokenizer.from_dir(tokenizer_dir)
    spec = WorkloadSpec(num_requests=10, input_length=LengthDistribution(mean=96, stddev=24), seed=4)
    preprocessing = load_tokenizer(tokenizer_dir)
    for r in generate_workload(spec, bench_tokenizer):
        assert list(r.input_ids) == preprocessing.encode(r.prompt, add_special_tokens=True)
        assert r.prompt and bench_tokenizer.decode(r.input_ids).strip() == r.prompt
