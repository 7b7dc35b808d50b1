"""NVIDIA's `lora_task_id` through a real tritonserver to the stand-in's `tensorrt_llm`, which applies
the adapters with peft: the task id picks the adapter, concurrent requests of different task ids share
batches and each gets what it gets alone, and an unknown id is NVIDIA's cache-miss error."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file
from trtllm_truss.engine.client import EngineRefusedError, GenerationParams
from trtllm_truss.engine.engine_client import EngineClient
from trtllm_truss.planning.lora import PlannedAdapter
from trtllm_truss.planning.plan import ServingPlan
from trtllm_truss.repository import render_repository

try:
    from trtllm_truss.config import RuntimeConfig
except ImportError:
    from trtllm_truss.config.runtime import RuntimeConfig

pytestmark = [pytest.mark.triton, pytest.mark.torch, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "data" / "embedded-llama"
PIRATE = ROOT / "data" / "embedded-lora" / "pirate"
PROMPTS = ["The function returns", "Return a list of", "import os\n"]


@pytest.fixture(scope="module")
def lora_triton(tmp_path_factory) -> Iterator[str]:
    from trtllm_truss.runtime.supervisor import TritonServer

    other = tmp_path_factory.mktemp("other")  # the pirate adapter with B negated: another adapter
    (other / "adapter_config.json").write_text((PIRATE / "adapter_config.json").read_text())
    weights = load_file(str(PIRATE / "adapter_model.safetensors"))
    save_file({k: (-v if "lora_B" in k else v) for k, v in weights.items()}, str(other / "adapter_model.safetensors"))
    plan = ServingPlan(
        backend="pytorch", tokenizer_dir=MODEL, model_dir=MODEL, max_batch_size=8, max_input_len=256,
        max_output_len=64, runtime=RuntimeConfig(pytorch={"device": "cpu", "num_threads": 1}),
        lora_adapters=(PlannedAdapter("pirate", 1, PIRATE), PlannedAdapter("other", 2, other)),
    )
    repository = render_repository(plan, tmp_path_factory.mktemp("lora") / "model_repository")
    server = TritonServer(repository, startup_timeout_s=180)
    server.start()
    try:
        server.wait_ready(180)
        yield server.grpc_url
    finally:
        server.stop()


def ids_of(prompt: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(MODEL / "tokenizer.json")).encode(prompt).ids


async def generate(client: EngineClient, prompt: str, task: int | None) -> list[int]:
    params = GenerationParams("", max_tokens=12, end_id=-1, temperature=0.0, top_k=1, lora_task_id=task)
    out: list[int] = []
    async for new_ids, _ in client.generate_ids(ids_of(prompt), params):
        out += new_ids
    return out


def test_task_ids_pick_adapters_and_mix_in_batches(lora_triton: str):
    async def scenario():
        client = EngineClient(lora_triton)
        try:
            alone = {(p, t): await generate(client, p, t) for p in PROMPTS for t in (None, 1, 2)}
            together = await asyncio.gather(*(generate(client, p, t) for p, t in alone))
            with pytest.raises(EngineRefusedError, match=r"LoRA task 99 not found in cache\. Please send LoRA weights with request"):
                await generate(client, PROMPTS[0], 99)
            return alone, together
        finally:
            await client.close()

    alone, together = asyncio.run(scenario())
    for prompt in PROMPTS:
        assert len({tuple(alone[(prompt, t)]) for t in (None, 1, 2)}) == 3, prompt  # each adapter its own answer
    assert dict(zip(alone, together)) == alone
