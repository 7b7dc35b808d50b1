"""Guided decoding through the real tritonserver: the stream workers' EngineClient sends NVIDIA's
`guided_decoding_guide_type` / `guided_decoding_guide` to the stand-in `tensorrt_llm`, which enforces
them (engine_standin/guidance.py); a guide it cannot enforce comes back as the engine's refusal."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from engine_wire import raw_inputs, request_error
from tokenizers import Tokenizer
from trtllm_truss.engine.client import EngineRefusedError, GenerationParams
from trtllm_truss.engine.engine_client import EngineClient
from trtllm_truss.guides.guide import schema_text

pytestmark = [pytest.mark.triton, pytest.mark.torch, pytest.mark.timeout(300)]

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "population": {"type": "integer", "minimum": 0}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


def _generate(server, prompt_ids: list[int], params: GenerationParams) -> list[int]:
    async def run() -> list[int]:
        client = EngineClient(server.grpc_url)
        try:
            ids: list[int] = []
            async for new, _ in client.generate_ids(prompt_ids, params):
                ids += new
            return ids
        finally:
            await client.close()

    return asyncio.run(run())


def _metric(server, name: str) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_json_schema_guide_is_enforced_by_the_stand_in_through_triton(standin_triton, embedded_model_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(embedded_model_dir / "tokenizer.json"))
    guide = schema_text(SCHEMA)
    texts = []
    for prompt in ("The city:", "Data follows.\n"):
        params = GenerationParams(
            text_input="", max_tokens=96, top_k=1, end_id=2,
            guided_decoding_guide_type="json_schema", guided_decoding_guide=guide,
        )
        ids = _generate(standin_triton, tokenizer.encode(prompt).ids, params)
        assert ids and len(ids) < 96, "the guide did not complete"
        texts.append(tokenizer.decode(ids))
        jsonschema.validate(json.loads(texts[-1]), SCHEMA)
    unguided = tokenizer.decode(_generate(standin_triton, tokenizer.encode("The city:").ids, GenerationParams(text_input="", max_tokens=24, top_k=1)))
    assert unguided != texts[0][: len(unguided)]  # the guide, not the model alone, made the JSON
    # one compile, the second request served from the cache
    assert _metric(standin_triton, "trtllm_standin_guide_cache_misses_total") >= 1
    assert _metric(standin_triton, "trtllm_standin_guide_cache_hits_total") >= 1


def test_a_guide_the_stand_in_cannot_enforce_is_the_engines_refusal_naming_the_keyword(standin_triton) -> None:
    params = GenerationParams(
        text_input="", max_tokens=8, guided_decoding_guide_type="json_schema",
        guided_decoding_guide=json.dumps({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}),
    )
    # xgrammar, the stand-in's default engine, in its own words (it ignores `not`, which llguidance refused)
    with pytest.raises(EngineRefusedError, match="guided_decoding_guide.*Cannot find field nope"):
        _generate(standin_triton, [1, 450], params)
    params = GenerationParams(text_input="", max_tokens=8, guided_decoding_guide_type="xml", guided_decoding_guide="<a/>")
    with pytest.raises(EngineRefusedError, match="guided_decoding_guide_type: 'xml'"):
        _generate(standin_triton, [1, 450], params)
    # the engine still serves
    assert len(_generate(standin_triton, [1, 450], GenerationParams(text_input="", max_tokens=4, top_k=1))) == 4


def test_a_guide_without_its_type_is_refused_by_name(standin_triton) -> None:
    inputs = raw_inputs({
        "input_ids": np.array([[1, 450]], dtype=np.int32),
        "input_lengths": np.array([[2]], dtype=np.int32),
        "request_output_len": np.array([[4]], dtype=np.int32),
        "guided_decoding_guide": np.array([[b"a+"]], dtype=object),
    })
    error = request_error(standin_triton.grpc_url, inputs, request_id="guide-without-type", timeout_s=60)
    assert error is not None and "guided_decoding_guide: sent without guided_decoding_guide_type" in str(error)
