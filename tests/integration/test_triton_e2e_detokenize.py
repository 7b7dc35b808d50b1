"""The rendered repository on the real tritonserver, engine = TEST DOUBLE of TensorRT-LLM (echo).

The echo engine generates the prompt's own tokens, so the exact expected text is known: streamed
chunks (spread over three postprocessing instances) must concatenate to the non-streamed text,
which must equal the prompt, for >= 200 prompts with emoji, CJK and whitespace edge cases.
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request
from pathlib import Path

import pytest
from edge_case_texts import EDGE_TEXTS
from ensemble_stream import ensemble_inputs, run_on_stream
from trtllm_truss.engine.client import EnsembleClient, GenerationParams
from trtllm_truss.engine.detokenize import TokenDecoder
from trtllm_truss.engine.tokenizer import load_tokenizer

pytestmark = [pytest.mark.triton, pytest.mark.timeout(300)]
EMBEDDED_MODEL_DIR = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"

_FRAGMENTS = [
    "the", " quick", " brown", " fox", "  ", "\t", "\n", "😀", "🎉", "👍🏽", "👨‍👩‍👧", "你好", "世界", "。",
    "日本", "語", "한국어", "é", "ß", "∑", "→", "𓀀", " def", " return", "(x)", ":", "   ", "🇯🇵", "Ωmega",
]


def _prompts(count: int) -> list[str]:
    rng = random.Random(20261122)
    prompts = list(EDGE_TEXTS)
    while len(prompts) < count:
        prompts.append("".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(1, 12))))
    return prompts


# A deadlock inside python_backend's stub (nvidia-pytriton 0.7.0 ships r24.10; NVIDIA's main branch has the
# same code) hangs the relay now and then under this file's 420-stream burst: `exec(decoupled=True)` takes the
# stub's response-iterator map mutex while holding the GIL; the stub's message thread holds that mutex while it
# queues a response on an iterator; a thread woken in that iterator's `next` holds the iterator's mutex while
# it takes the GIL back. py-spy showed one relay thread in `exec` on a mutex and one in `next` waiting for the
# GIL, every other thread waiting for the GIL or tritonserver. stub_watch's watchdog then ends the stub after
# 10 s, and Triton does not restart a decoupled model's stub ("Stub process ... is not healthy" afterwards).
# Reproduced here twice in 51 bursts (docs/deploy.md, "The window relay's deadlock").
RELAY_STUB_DEADLOCK = pytest.mark.xfail(
    reason="python_backend's stub can deadlock under concurrent decoupled BLS streams (docs/deploy.md)", strict=False
)
LAYOUTS = pytest.mark.parametrize("layout", ["echo_triton", pytest.param("echo_relay_triton", marks=RELAY_STUB_DEADLOCK)])
RELAY_PROBE_S = 20.0  # one short stream; a healthy relay answers it in well under a second


def _stack(layout: str, request: pytest.FixtureRequest) -> object:
    """The layout's session stack. The relay's is probed first: once its stub has deadlocked (in an earlier test),
    later requests fail ("not healthy") or hang, and a hung one would make each test wait out its own timeout
    (2-5 minutes) to xfail."""
    server = request.getfixturevalue(layout)
    if layout == "echo_relay_triton":
        try:
            run_on_stream(server.grpc_url, {"probe": ensemble_inputs("probe", 4, stream=True)}, timeout_s=RELAY_PROBE_S)
        except (TimeoutError, AssertionError) as exc:
            pytest.xfail(f"the relay's stub no longer answers (deadlocked in an earlier test): {exc}")
    return server


@LAYOUTS
def test_streamed_text_equals_non_streamed_text_for_200_prompts(layout: str, request: pytest.FixtureRequest) -> None:
    echo_triton = _stack(layout, request)
    prompts = _prompts(210)
    requests = {}
    for i, prompt in enumerate(prompts):
        requests[f"s{i}"] = ensemble_inputs(prompt, 200, stream=True)
        requests[f"n{i}"] = ensemble_inputs(prompt, 200, stream=False)
    results = run_on_stream(echo_triton.grpc_url, requests, timeout_s=240)
    mismatches = []
    for i, prompt in enumerate(prompts):
        streamed, whole = results[f"s{i}"], results[f"n{i}"]
        assert len(whole.chunks) == 1, prompt
        if not (streamed.text == whole.text == prompt):
            mismatches.append((prompt, streamed.chunks, whole.text))
    assert not mismatches, mismatches[:5]
    multi = [r for k, r in results.items() if k.startswith("s") and len(r.chunks) > 3]
    assert len(multi) > 100  # the streams really were split into many responses


@LAYOUTS
def test_generation_cut_inside_a_character_stays_consistent(layout: str, request: pytest.FixtureRequest) -> None:
    echo_triton = _stack(layout, request)
    prompt = "ab 👨‍👩‍👧‍👦 𓀀 你好"
    requests = {}
    budgets = [*range(1, 40), 200]
    for max_tokens in budgets:
        requests[f"s{max_tokens}"] = ensemble_inputs(prompt, max_tokens, stream=True)
        requests[f"n{max_tokens}"] = ensemble_inputs(prompt, max_tokens, stream=False)
    results = run_on_stream(echo_triton.grpc_url, requests)
    previous = ""
    for max_tokens in budgets:
        streamed, whole = results[f"s{max_tokens}"].text, results[f"n{max_tokens}"].text
        assert streamed == whole
        assert "\ufffd" not in whole
        assert prompt.startswith(whole) and len(whole) >= len(previous)
        previous = whole
    assert previous == prompt


@LAYOUTS
def test_stop_words_reach_the_engine(layout: str, request: pytest.FixtureRequest) -> None:
    echo_triton = _stack(layout, request)
    prompt = "alpha beta STOP gamma delta"
    results = run_on_stream(
        echo_triton.grpc_url,
        {
            "stream": ensemble_inputs(prompt, 50, stream=True, stop_words=[" STOP"]),
            "whole": ensemble_inputs(prompt, 50, stream=False, stop_words=[" STOP", " never"]),
            "none": ensemble_inputs(prompt, 50, stream=False),
        },
    )
    assert results["stream"].text == "alpha beta STOP"
    assert results["whole"].text == "alpha beta STOP"
    assert results["none"].text == prompt


@LAYOUTS
def test_exclude_input_in_output_false_returns_the_prompt_too(layout: str, request: pytest.FixtureRequest) -> None:
    echo_triton = _stack(layout, request)
    prompt = "echo 😀"
    results = run_on_stream(
        echo_triton.grpc_url, {"r": ensemble_inputs(prompt, 50, stream=False, exclude_input_in_output=False)}
    )
    assert results["r"].text == prompt + prompt


def test_http_generate_stream(echo_triton) -> None:
    prompt = "over HTTP: 你好 😀 world"
    body = json.dumps({"text_input": prompt, "max_tokens": 64, "stream": True}).encode()
    request = urllib.request.Request(
        f"{echo_triton.http_url}/v2/models/ensemble/generate_stream",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    chunks = []
    with urllib.request.urlopen(request, timeout=60) as response:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if line.startswith("data:"):
                event = json.loads(line[len("data:") :])
                assert "error" not in event, event
                if "text_output" in event:
                    chunks.append(event["text_output"])
    assert len(chunks) > 3
    assert "".join(chunks) == prompt


def test_metrics_show_every_model(echo_triton) -> None:
    run_on_stream(echo_triton.grpc_url, {"warm": ensemble_inputs("metrics", 8, stream=False)})
    with urllib.request.urlopen(echo_triton.metrics_url, timeout=30) as response:
        metrics = response.read().decode()
    for model in ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing"):
        assert f'nv_inference_request_success{{model="{model}"' in metrics, model


def test_preprocessing_rejects_over_long_requests_with_the_field_named(echo_triton) -> None:
    with pytest.raises(AssertionError, match="max_tokens"):
        run_on_stream(echo_triton.grpc_url, {"r": ensemble_inputs("too many", 100_000, stream=False)}, timeout_s=30)


async def _proxy_texts(grpc_url: str, prompts: dict[str, tuple[str, int, bool]]) -> dict[str, tuple[list[str], int]]:
    """What the truss proxy reads from `ensemble_ids` (token ids, decoded in the client): chunks and tokens."""
    client = EnsembleClient(grpc_url, model_name="ensemble_ids", decoder=TokenDecoder(load_tokenizer(EMBEDDED_MODEL_DIR)))
    limit = asyncio.Semaphore(32)

    async def one(prompt: str, max_tokens: int, stream: bool) -> tuple[list[str], int]:
        async with limit:
            chunks, tokens = [], 0
            async for delta in client.generate(GenerationParams(text_input=prompt, max_tokens=max_tokens, stream=stream)):
                chunks.append(delta.text)
                tokens += delta.token_count or 0
            return chunks, tokens

    try:
        results = await asyncio.gather(*(one(*spec) for spec in prompts.values()))
    finally:
        await client.close()
    return dict(zip(prompts, results))


@LAYOUTS
async def test_proxy_decoding_token_ids_gives_the_prompt_for_200_prompts(layout: str, request: pytest.FixtureRequest) -> None:
    """`ensemble_ids` skips postprocessing (and the relay): the proxy's own decoding must give the
    exact text, streamed and not, including characters split over responses."""
    echo_triton = _stack(layout, request)
    prompts = _prompts(210)
    specs = {f"{kind}{i}": (p, 200, kind == "s") for i, p in enumerate(prompts) for kind in "sn"}
    results = await _proxy_texts(echo_triton.grpc_url, specs)
    tokenizer = load_tokenizer(EMBEDDED_MODEL_DIR)
    mismatches = []
    for i, prompt in enumerate(prompts):
        (streamed, streamed_tokens), (whole, whole_tokens) = results[f"s{i}"], results[f"n{i}"]
        expected_tokens = len(tokenizer.encode(prompt, add_special_tokens=False))
        if not ("".join(streamed) == "".join(whole) == prompt and streamed_tokens == whole_tokens == expected_tokens):
            mismatches.append((prompt, streamed, whole, streamed_tokens, whole_tokens))
    assert not mismatches, mismatches[:5]
    assert len([k for k, (chunks, _) in results.items() if k.startswith("s") and len(chunks) > 3]) > 100


async def test_proxy_decoding_of_a_generation_cut_inside_a_character(echo_triton) -> None:
    prompt = "ab 👨‍👩‍👧‍👦 𓀀 你好"
    budgets = [*range(1, 40), 200]
    specs = {f"{kind}{n}": (prompt, n, kind == "s") for n in budgets for kind in "sn"}
    results = await _proxy_texts(echo_triton.grpc_url, specs)
    texts = run_on_stream(echo_triton.grpc_url, {f"t{n}": ensemble_inputs(prompt, n, stream=True) for n in budgets})
    for n in budgets:
        streamed, whole = "".join(results[f"s{n}"][0]), "".join(results[f"n{n}"][0])
        assert streamed == whole == texts[f"t{n}"].text  # the same text as the postprocessing model's
        assert "\ufffd" not in whole
