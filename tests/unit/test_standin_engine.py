"""The engine stand-in without Triton, on the embedded model (data/embedded-llama)."""

from __future__ import annotations

import time

import pytest
import torch
from standin_testing import MODEL_DIR, Collected
from trtllm_truss.engine_standin import (
    EngineLimits,
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    RequestRejected,
    SamplingParams,
    StandinEngine,
    SyntheticEngine,
    ordinary_token_ids,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # standin_testing.py

TIMEOUT_S = 30.0

PROMPTS = [
    "The function returns",
    "Return a list of",
    "import os\nimport sys\n",
    "A dictionary maps keys to values. 🦙 你好",
    "x",
]


@pytest.fixture(scope="module")
def eos(runner) -> int:
    return int(runner.model.config.eos_token_id)


@pytest.fixture
def engine(runner):
    engine = StandinEngine(runner, EngineLimits(max_batch_size=8, max_input_len=256, max_output_len=256)).start()
    yield engine
    engine.shutdown()


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text).ids  # the post-processor adds <s>


def run(engine, request: GenerationRequest) -> Collected:
    collected = Collected()
    engine.submit(request, collected)
    collected.finish()
    return collected


def wait_until(predicate, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


@pytest.fixture(scope="module")
def reference_greedy(runner, tokenizer, eos):
    """transformers generate() greedy output (without the end token), per prompt."""
    results = {}
    for text in PROMPTS:
        ids = encode(tokenizer, text)
        with torch.inference_mode():
            out = runner.model.generate(
                torch.tensor([ids]), max_new_tokens=40, do_sample=False, eos_token_id=eos, pad_token_id=eos
            )[0, len(ids) :].tolist()
        if eos in out:
            out = out[: out.index(eos)]
        results[text] = out
    return results


def test_greedy_equals_transformers_generate_alone_and_while_batched(engine, tokenizer, eos, reference_greedy):
    for text in PROMPTS[:2]:
        got = run(engine, GenerationRequest(text, encode(tokenizer, text), 40, end_id=eos))
        assert got.tokens == reference_greedy[text], text
    # All prompts together, arriving while others decode (left padding, rows joining and leaving).
    collected: dict[str, Collected] = {}
    previous = None
    for i, text in enumerate(PROMPTS):
        if previous is not None and i % 2:  # every other request arrives once the previous one decodes
            wait_until(lambda p=previous: len(p.tokens) >= 2 or p.done.is_set())
        collected[text] = previous = Collected()
        engine.submit(GenerationRequest(f"b{i}", encode(tokenizer, text), 40, end_id=eos), collected[text])
    for text, c in collected.items():
        c.finish()
        assert c.tokens == reference_greedy[text], text


def test_requests_arriving_during_decode_join_the_running_batch(engine, tokenizer):
    long = Collected()
    engine.submit(GenerationRequest("long", encode(tokenizer, PROMPTS[0]), 120), long)
    wait_until(lambda: len(long.tokens) >= 5)
    short = Collected()
    engine.submit(GenerationRequest("short", encode(tokenizer, PROMPTS[1]), 10), short)
    assert short.finish().finish_reason is FinishReason.LENGTH
    assert long.finish().generated_count == 120
    # `short` started and ended inside `long`'s lifetime, and `long` kept producing meanwhile:
    # the two decoded in the same steps rather than one after the other.
    assert long.arrivals[0] < short.arrivals[0] and short.arrivals[-1] < long.arrivals[-1]
    interleaved = [t for t in long.arrivals if short.arrivals[0] <= t <= short.arrivals[-1]]
    assert len(interleaved) >= 5
    assert engine.active_requests == 0


def test_request_output_len_and_finish_reason(engine, tokenizer):
    got = run(engine, GenerationRequest("n", encode(tokenizer, PROMPTS[2]), 17))
    assert len(got.tokens) == 17
    assert got.finish().finish_reason is FinishReason.LENGTH
    assert got.finish().generated_count == 17


def test_seeded_sampling_is_reproducible_regardless_of_batch(engine, tokenizer):
    sampling = SamplingParams(temperature=0.9, top_k=50, top_p=0.95, random_seed=1234)
    prompt = encode(tokenizer, PROMPTS[0])
    alone = run(engine, GenerationRequest("s1", prompt, 30, sampling=sampling)).tokens
    neighbours = [Collected() for _ in range(3)]
    for i, c in enumerate(neighbours):
        engine.submit(
            GenerationRequest(f"n{i}", encode(tokenizer, PROMPTS[i + 2]), 30, sampling=SamplingParams(top_k=0, top_p=1.0, random_seed=i)),
            c,
        )
    together = run(engine, GenerationRequest("s2", prompt, 30, sampling=sampling)).tokens
    assert together == alone
    other_seed = run(engine, GenerationRequest("s3", prompt, 30, sampling=SamplingParams(temperature=0.9, top_k=50, top_p=0.95, random_seed=99))).tokens
    assert other_seed != alone
    for c in neighbours:
        c.finish()


def test_presence_penalty_forbids_repeats(engine, tokenizer):
    prompt = encode(tokenizer, "git-git-git-git merge")
    plain = run(engine, GenerationRequest("p0", prompt, 40)).tokens
    penalized = run(engine, GenerationRequest("p1", prompt, 40, sampling=SamplingParams(presence_penalty=1e4))).tokens
    assert len(set(plain)) < len(plain)  # the model repeats itself without the penalty
    assert len(set(penalized)) == len(penalized)  # with it, no token is generated twice...
    assert not set(penalized) & set(prompt)  # ...nor any token of the prompt


def test_min_length_and_end_id(engine, tokenizer):
    prompt = encode(tokenizer, PROMPTS[0])
    greedy = run(engine, GenerationRequest("g", prompt, 10)).tokens
    end_id = greedy[2]
    stopped = run(engine, GenerationRequest("e", prompt, 10, end_id=end_id))
    assert stopped.finish().finish_reason is FinishReason.END_ID
    assert stopped.tokens == greedy[: greedy.index(end_id)]  # the end token itself is not returned
    held = run(engine, GenerationRequest("m", prompt, 10, end_id=end_id, sampling=SamplingParams(min_length=6)))
    assert len(held.tokens) >= 6
    assert end_id not in held.tokens[:6]


def test_stop_words_end_generation_right_after_the_sequence(engine, tokenizer):
    prompt = encode(tokenizer, PROMPTS[1])
    greedy = run(engine, GenerationRequest("g", prompt, 30)).tokens
    stop = greedy[5:7]
    expected_len = next(i + 1 for i in range(len(greedy)) if greedy[: i + 1][-2:] == stop)
    got = run(engine, GenerationRequest("s", prompt, 30, stop_words=[[99999], stop]))
    assert got.finish().finish_reason is FinishReason.STOP_WORDS
    assert got.tokens == greedy[:expected_len]  # stop tokens kept, as TensorRT-LLM does
    assert got.tokens[-2:] == stop


def test_bad_words_are_never_generated(engine, tokenizer):
    prompt = encode(tokenizer, PROMPTS[0])
    greedy = run(engine, GenerationRequest("g", prompt, 30)).tokens
    single = run(engine, GenerationRequest("b1", prompt, 30, bad_words=[[greedy[3]]])).tokens
    assert greedy[3] not in single
    assert single[:3] == greedy[:3]
    pair = [greedy[1], greedy[2]]
    multi = run(engine, GenerationRequest("b2", prompt, 30, bad_words=[pair])).tokens
    assert multi[:2] == greedy[:2] and multi[2] != greedy[2]
    assert all(multi[i : i + 2] != pair for i in range(len(multi) - 1))


def test_cancel_frees_the_slot_for_a_waiting_request(runner, tokenizer):
    engine = StandinEngine(runner, EngineLimits(max_batch_size=1, max_input_len=64, max_output_len=256)).start()
    try:
        first, second = Collected(), Collected()
        engine.submit(GenerationRequest("first", encode(tokenizer, PROMPTS[0]), 250), first)
        wait_until(lambda: len(first.tokens) >= 2)
        engine.submit(GenerationRequest("second", encode(tokenizer, PROMPTS[1]), 5), second)
        seen = len(first.tokens)
        wait_until(lambda: len(first.tokens) >= seen + 3)  # several scheduler steps with `second` queued
        assert not second.tokens, "the batch is full; the second request must wait"
        assert engine.active_requests == 2 and engine.running_requests == 1
        engine.cancel("first")
        assert first.finish().finish_reason is FinishReason.CANCELLED
        assert len(first.tokens) < 250
        assert second.finish().finish_reason is FinishReason.LENGTH and len(second.tokens) == 5
        wait_until(lambda: engine.active_requests == 0)
        # a waiting request can be cancelled before it starts
        third, fourth = Collected(), Collected()
        engine.submit(GenerationRequest("third", encode(tokenizer, PROMPTS[0]), 100), third)
        engine.submit(GenerationRequest("fourth", encode(tokenizer, PROMPTS[1]), 5), fourth)
        engine.cancel("fourth")
        assert fourth.finish().finish_reason is FinishReason.CANCELLED and fourth.tokens == []
        engine.cancel("third")
        assert third.finish().finish_reason is FinishReason.CANCELLED
    finally:
        engine.shutdown()


def test_unsupported_options_fail_the_request_not_the_engine(engine, tokenizer):
    prompt = encode(tokenizer, PROMPTS[0])
    with pytest.raises(RequestRejected, match="beam_width=2"):
        engine.submit(GenerationRequest("beam", prompt, 5, beam_width=2), Collected())
    with pytest.raises(RequestRejected, match="max_input_len=256"):
        engine.submit(GenerationRequest("long", prompt * 100, 5), Collected())
    with pytest.raises(RequestRejected, match="request_output_len: 999 exceeds max_output_len=256"):
        engine.submit(GenerationRequest("out", prompt, 999), Collected())
    with pytest.raises(RequestRejected, match="outside the vocabulary"):
        engine.submit(GenerationRequest("vocab", [10**6], 5), Collected())
    with pytest.raises(RequestRejected, match="runtime_top_p"):
        engine.submit(GenerationRequest("p", prompt, 5, sampling=SamplingParams(top_p=2.0)), Collected())
    assert len(run(engine, GenerationRequest("ok", prompt, 5)).tokens) == 5


def test_a_failing_consumer_only_ends_its_own_request(engine, tokenizer):
    def broken(output: GenerationOutput) -> None:
        raise RuntimeError("consumer went away")

    engine.submit(GenerationRequest("broken", encode(tokenizer, PROMPTS[0]), 50), broken)
    healthy = run(engine, GenerationRequest("healthy", encode(tokenizer, PROMPTS[1]), 20))
    assert len(healthy.tokens) == 20
    wait_until(lambda: engine.active_requests == 0)


def test_synthetic_engine_is_cheap_and_emits_ordinary_words(tokenizer):
    cycle = ordinary_token_ids(MODEL_DIR, tokenizer.get_vocab_size())
    assert len(cycle) > 50
    assert all(tokenizer.decode([t]).strip().isalpha() for t in cycle)
    engine = SyntheticEngine(EngineLimits(64, 4096, 4096), tokenizer.get_vocab_size(), cycle).start()
    try:
        collected = [Collected() for _ in range(64)]
        start = time.monotonic()
        for i, c in enumerate(collected):
            engine.submit(GenerationRequest(f"s{i}", [1, 2, 3 + i], 500), c)
        for c in collected:
            assert c.finish().finish_reason is FinishReason.LENGTH and len(c.tokens) == 500
        elapsed = time.monotonic() - start
        # 32,000 tokens: far cheaper than any model (generous bound for a loaded 2-core CI machine)
        assert elapsed < 10.0
        stopped = run(engine, GenerationRequest("stop", [5], 100, stop_words=[[collected[0].tokens[3]]]))
        assert stopped.finish().finish_reason is FinishReason.STOP_WORDS
    finally:
        engine.shutdown()
    paced = SyntheticEngine(EngineLimits(4, 64, 64), tokenizer.get_vocab_size(), cycle, step_time_ms=5).start()
    try:
        start = time.monotonic()
        run(paced, GenerationRequest("paced", [1], 20))
        assert time.monotonic() - start >= 20 * 0.005 * 0.9
    finally:
        paced.shutdown()


def test_embedded_model_files_size_and_exact_non_ascii_round_trip():
    from transformers import AutoTokenizer

    expected = {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    assert expected <= {p.name for p in MODEL_DIR.iterdir()}
    assert sum(p.stat().st_size for p in MODEL_DIR.iterdir()) < 20 * 1024 * 1024
    tokenizer = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    for text in ["emoji 🦙🚀👩‍👩‍👧 and CJK 你好，世界 / こんにちは / 한국어", "  spaces\tand\nnewlines  ", "é ß ∑ 𝔘"]:
        ids = tokenizer(text)["input_ids"]
        assert ids[0] == tokenizer.bos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.endswith("### assistant:\n")


def test_context_and_generation_logits_are_the_models_raw_logits(engine, runner, tokenizer):
    """return_context_logits / return_generation_logits: the model's logits of every prompt
    position, and of each generated token before sampling (greedy: its argmax is the token)."""
    ids = encode(tokenizer, PROMPTS[0])
    got = run(engine, GenerationRequest("logits", ids, 4, return_context_logits=True, return_generation_logits=True))
    first = got.outputs[0]
    assert first.context_logits.shape == (len(ids), runner.vocab_size) and first.context_logits.dtype.name == "float32"
    with torch.inference_mode():
        expected = runner.model(torch.tensor([ids])).logits[0].float().numpy()
    assert abs(first.context_logits - expected).max() < 1e-3
    rows = [o.generation_logits for o in got.outputs if o.token_ids]
    assert [r.shape for r in rows] == [(1, runner.vocab_size)] * 4
    assert [int(r[0].argmax()) for r in rows] == got.tokens
    assert all(o.context_logits is None for o in got.outputs[1:])
    plain = run(engine, GenerationRequest("plain", ids, 2))
    assert all(o.context_logits is None and o.generation_logits is None for o in plain.outputs)


def test_the_engine_stamps_admission_time(engine, tokenizer):
    request = GenerationRequest("stamp", encode(tokenizer, "x"), 1)
    before = time.monotonic_ns()
    run(engine, request)
    assert request.first_scheduled_ns is not None and before <= request.first_scheduled_ns <= time.monotonic_ns()


def test_synthetic_logits_are_zero_placeholders_of_nvidias_shape():
    engine = SyntheticEngine(EngineLimits(4, 64, 64), 100, [10, 11, 12]).start()
    try:
        got = run(engine, GenerationRequest("s", [1, 2, 3], 3, return_context_logits=True, return_generation_logits=True))
    finally:
        engine.shutdown()
    assert got.outputs[0].context_logits.shape == (3, 100) and not got.outputs[0].context_logits.any()
    assert [o.generation_logits.shape for o in got.outputs] == [(1, 100)] * 3
