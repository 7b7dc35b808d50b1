"""LoRA adapters in the engine stand-in, without Triton: the embedded model and its shipped adapter
(data/embedded-lora/pirate, scripts/make_embedded_lora.py) applied with peft, batches mixing adapters."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from standin_testing import MODEL_DIR, Collected
from trtllm_truss.engine_standin import (
    EngineLimits,
    GenerationRequest,
    RequestRejected,
    StandinEngine,
)
from trtllm_truss.engine_standin.model_runner import CausalLMRunner

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # standin_testing.py

ROOT = Path(__file__).resolve().parents[2]
PIRATE_DIR = ROOT / "data" / "embedded-lora" / "pirate"
TIMEOUT_S = 60.0
PROMPTS = ["The function returns", "Return a list of", "import os\n", "A dictionary maps keys"]
PIRATE, OTHER = 1, 2  # task ids


@pytest.fixture(scope="module")
def other_adapter(tmp_path_factory) -> Path:
    """A second adapter: the pirate one with its B matrices negated (different output, same shapes)."""
    out = tmp_path_factory.mktemp("other")
    (out / "adapter_config.json").write_text((PIRATE_DIR / "adapter_config.json").read_text())
    weights = load_file(str(PIRATE_DIR / "adapter_model.safetensors"))
    save_file({k: (-v if "lora_B" in k else v) for k, v in weights.items()}, str(out / "adapter_model.safetensors"))
    return out


@pytest.fixture(scope="module")
def runner(other_adapter):
    return CausalLMRunner(MODEL_DIR, adapters={"pirate": PIRATE_DIR, "other": other_adapter})


def make_engine(runner, **kwargs) -> StandinEngine:
    limits = EngineLimits(max_batch_size=8, max_input_len=256, max_output_len=64)
    return StandinEngine(runner, limits, adapters={PIRATE: "pirate", OTHER: "other"}, **kwargs).start()


def submit(engine, tokenizer, prompt: str, task: int | None, rid: str, max_new: int = 12) -> Collected:
    run = Collected()
    ids = tokenizer.encode(prompt).ids
    engine.submit(GenerationRequest(rid, ids, max_new, end_id=None, lora_task_id=task), run)
    return run


def finish(*runs: Collected) -> None:
    for run in runs:
        assert run.done.wait(TIMEOUT_S), "request did not finish in time"
        assert run.error is None, run.error


def alone(runner, tokenizer, prompt: str, task: int | None) -> list[int]:
    engine = make_engine(runner)
    try:
        run = submit(engine, tokenizer, prompt, task, "alone")
        finish(run)
        return run.tokens
    finally:
        engine.shutdown()


def test_the_adapter_changes_greedy_output(runner, tokenizer):
    base = alone(runner, tokenizer, PROMPTS[0], None)
    pirate = alone(runner, tokenizer, PROMPTS[0], PIRATE)
    assert base != pirate
    assert tokenizer.decode(pirate).strip().startswith("Arr, matey!")
    assert not tokenizer.decode(base).strip().startswith("Arr")


def test_a_batch_mixing_adapters_gives_each_row_its_own_output(runner, tokenizer):
    tasks = [None, PIRATE, OTHER]
    expected = {(p, t): alone(runner, tokenizer, p, t) for p in PROMPTS[:3] for t in tasks}
    assert len({tuple(v) for v in expected.values()}) > len(PROMPTS[:3])  # adapters do differ
    engine = make_engine(runner)
    try:
        # Submitted together: prefills join a running batch whose rows use different adapters.
        runs = {key: submit(engine, tokenizer, key[0], key[1], f"r{i}") for i, key in enumerate(expected)}
        finish(*runs.values())
    finally:
        engine.shutdown()
    assert {key: run.tokens for key, run in runs.items()} == expected


def test_an_unknown_task_id_is_refused_with_nvidias_message(runner, tokenizer):
    engine = make_engine(runner)
    try:
        with pytest.raises(RequestRejected, match=r"^LoRA task 7 not found in cache. Please send LoRA weights with request$"):
            submit(engine, tokenizer, "x", 7, "unknown")
        finish(submit(engine, tokenizer, "x", None, "base still served"))
    finally:
        engine.shutdown()


def test_max_loras_keeps_other_adapters_waiting_for_a_slot(runner, tokenizer):
    engine = make_engine(runner, max_loras=1)
    try:
        first = submit(engine, tokenizer, PROMPTS[0], PIRATE, "pirate", max_new=20)
        base = submit(engine, tokenizer, PROMPTS[1], None, "base", max_new=20)
        second = submit(engine, tokenizer, PROMPTS[2], OTHER, "other", max_new=5)
        finish(first, base, second)
    finally:
        engine.shutdown()
    # One adapter slot: "other" starts only once "pirate" has finished; the base model needs no slot.
    assert second.arrivals[0] >= first.arrivals[-1]
    assert base.arrivals[0] < first.arrivals[-1]
    assert second.tokens == alone(runner, tokenizer, PROMPTS[2], OTHER)[:5]
