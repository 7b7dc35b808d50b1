"""Guided decoding on each engine path, against NVIDIA's sources of named versions (recorded data):
tests/data/tensorrtllm_backend/v0.19.0/guided_decoding.json (the ensemble's inputs and wiring, the
tensorrt_llm parameters, what the C++ backend reads from xgrammar's tokenizer info and the guide
types it maps) and tests/data/trtllm_flags/1.0.0/llmapi_guided_decoding.json (NVIDIA's llmapi Triton
model takes no guide). xgrammar and TensorRT-LLM cannot run here: the tokenizer info is made from
the embedded model's real tokenizer and checked against the C++ reader's keys; the rest is the
rendered configuration."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi import HTTPException
from tokenizers import Tokenizer
from transformers import AutoTokenizer
from trtllm_truss.api.limits import RequestLimits
from trtllm_truss.api.openai import ChatCompletionRequest
from trtllm_truss.config.runtime import RuntimeConfig
from trtllm_truss.guides.engines import (
    TOKENIZER_INFO_FILE,
    guided_decoding_problems,
    xgrammar_tokenizer_info,
)
from trtllm_truss.planning.plan import ServingPlan
from trtllm_truss.planning.probe import RuntimeFacts
from trtllm_truss.repository import render_repository, repository_configs
from trtllm_truss.serving import chat
from trtllm_truss.serving.core import RequestCore

ROOT = Path(__file__).resolve().parents[2]
NVIDIA = json.loads((ROOT / "tests/data/tensorrtllm_backend/v0.19.0/guided_decoding.json").read_text())
LLMAPI = json.loads((ROOT / "tests/data/trtllm_flags/1.0.0/llmapi_guided_decoding.json").read_text())
LLMAPI_MODEL = json.loads((ROOT / "tests/data/trtllm_flags/1.0.0/llmapi_model.json").read_text())
TOKENIZER_DIR = ROOT / "data" / "embedded-llama"


def _plan(backend: str = "tensorrtllm", version: str | None = "0.19.0", **runtime: object) -> ServingPlan:
    return ServingPlan(
        backend=backend,  # type: ignore[arg-type]
        tokenizer_dir=TOKENIZER_DIR,
        engine_dir=Path("/models/engine"),
        model_dir=Path("/models/hf"),
        max_batch_size=8,
        max_input_len=256,
        max_output_len=128,
        runtime=RuntimeConfig(**runtime),
        facts=RuntimeFacts(trtllm_version=version),
    )


@pytest.mark.parametrize("backend", ["tensorrtllm", "pytorch"])
def test_ensemble_declares_and_passes_the_guide_as_nvidia_does(backend: str):
    configs = repository_configs(_plan(backend), xgrammar_tokenizer_info=Path("/x/info.json"))
    for ensemble in (configs["ensemble"], configs["ensemble_ids"]):
        for expected in NVIDIA["ensemble_inputs"]:
            tensor = ensemble.input(expected["name"])
            assert (tensor.data_type.value, list(tensor.dims), tensor.optional, tensor.allow_ragged_batch) == (
                expected["data_type"], expected["dims"], expected["optional"], expected["allow_ragged_batch"]
            )
        engine_step = next(step for step in ensemble.ensemble_steps if step.model_name in ("tensorrt_llm", "tensorrt_llm_window"))
        wiring = dict(engine_step.input_map)
        for engine_input, ensemble_input in NVIDIA["ensemble_tensorrt_llm_step_input_map"].items():
            assert wiring[engine_input] == ensemble_input
            assert configs["tensorrt_llm"].input(engine_input).data_type.value == "TYPE_STRING"
    preprocessing = {t.name for t in configs["preprocessing"].inputs}
    assert not any("guided" in name.lower() for name in preprocessing) and NVIDIA["preprocessing_guided_tensors"] == []


def test_cpp_backend_gets_xgrammar_and_the_tokenizer_info_it_reads(tmp_path: Path):
    repo = render_repository(_plan(), tmp_path / "repo")
    params = repository_configs(_plan(), xgrammar_tokenizer_info=repo / "tensorrt_llm" / TOKENIZER_INFO_FILE)["tensorrt_llm"].parameter_dict
    rendered = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    cpp = NVIDIA["cpp_backend"]
    assert params["guided_decoding_backend"] in cpp["accepted_guided_decoding_backend"]
    path = Path(params["xgrammar_tokenizer_info_path"])
    assert path == repo / "tensorrt_llm" / NVIDIA["tokenizer_info_maker"]["output_file"] and path.is_file()
    assert str(path) in rendered and '"guided_decoding_backend"' in rendered
    assert set(cpp["off_unless_both_set"]) <= set(params) and set(params) & set(NVIDIA["tensorrt_llm_parameters"]) == set(cpp["off_unless_both_set"])
    assert "tokenizer_dir" not in params  # the C++ backend ignores it for guided decoding (and logs so)

    info = json.loads(path.read_text())
    kinds = {"list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
             "str": lambda v: isinstance(v, str), "list[int]": lambda v: isinstance(v, list) and all(isinstance(x, int) for x in v)}
    assert set(info) == set(cpp["tokenizer_info_keys"])
    for key, kind in cpp["tokenizer_info_keys"].items():
        assert kinds[kind](info[key]), key
    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    assert info["encoded_vocab"] == [tokenizer.convert_ids_to_tokens(i) for i in range(len(info["encoded_vocab"]))]
    assert len(info["encoded_vocab"]) == len(tokenizer.get_vocab())
    assert info["stop_token_ids"] == [tokenizer.eos_token_id]
    assert Tokenizer.from_str(info["tokenizer_str"]).encode("Paris, 2025", add_special_tokens=False).ids == tokenizer("Paris, 2025", add_special_tokens=False).input_ids


def test_a_slow_tokenizer_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="runtime.guided_decoding_backend: none"):
        xgrammar_tokenizer_info(SimpleNamespace(get_vocab=dict, eos_token_id=0))


@pytest.mark.parametrize(
    "backend, version, setting, off",
    [
        ("tensorrtllm", "0.19.0", "auto", None),
        ("tensorrtllm", "0.21.0", "xgrammar", None),
        ("tensorrtllm", "0.18.2", "auto", "TensorRT-LLM 0.18.2 has no guided decoding"),
        ("tensorrtllm", "0.19.0", "none", "guided_decoding_backend: none"),
        ("llmapi", "1.0.0", "auto", None),  # our llmapi model passes guides (GuidedDecodingParams)
        ("pytorch", None, "auto", None),
    ],
)
def test_which_paths_enforce_guides(backend, version, setting, off):
    plan = _plan(backend, version, guided_decoding_backend=setting)
    assert (plan.guided_decoding_off is None) if off is None else (off in plan.guided_decoding_off)
    if backend == "tensorrtllm" and off is not None:
        params = repository_configs(plan)["tensorrt_llm"].parameter_dict
        assert "guided_decoding_backend" not in params and "xgrammar_tokenizer_info_path" not in params


def test_xgrammar_where_it_cannot_run_is_a_config_error_naming_key_and_version():
    (problem,) = guided_decoding_problems("xgrammar", "tensorrtllm", (0, 18), "0.18.2")
    assert problem.startswith("model_metadata.trt_llm.runtime.guided_decoding_backend: xgrammar") and "0.18.2" in problem and "v0.19.0" in problem
    assert guided_decoding_problems("xgrammar", "llmapi", (1, 0), "1.0.0") == []  # the LLM API's xgrammar
    assert guided_decoding_problems("auto", "tensorrtllm", (0, 18), "0.18.2") == []


def test_nvidias_llmapi_model_took_no_guide_hence_ours():
    """Why backend llmapi runs our own model (triton_models/tensorrt_llm_llmapi): NVIDIA's passes no guide.
    Rendering and plans: tests/unit/test_llmapi_backend.py (test_guided_decoding_reaches_the_llm_api_...)."""
    assert LLMAPI["guided_decoding_inputs"] == [] and "guided_decoding" not in LLMAPI["sampling_params_from_request"]
    assert not any("guided" in name for name in LLMAPI_MODEL["model_inputs"])
    assert "guided_decoding_backend" in LLMAPI_MODEL["llm_args"]  # an LLM() argument, unreachable per request


# --- per request -----------------------------------------------------------------------------------


def _core(**limits: object) -> RequestCore:
    core = RequestCore()
    pool = SimpleNamespace(info=SimpleNamespace(tool_call_parser="hermes", reasoning_parser=None), max_in_flight=8, open_streams=0)
    core.attach(pool, RequestLimits(max_input_len=256, max_output_len=64, **limits))
    return core


def _refused(core: RequestCore, **body) -> str:
    req = chat.generation_request(ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], **body}))
    with pytest.raises(HTTPException) as caught:
        asyncio.run(core.prepare(req))
    assert caught.value.status_code == 400
    return caught.value.detail


def test_a_guide_where_the_engine_path_has_none_is_400_naming_the_field():
    plan = _plan("tensorrtllm", "0.18.2")
    core = _core(guided_decoding_off=plan.guided_decoding_off, guide_types=plan.guide_types)
    detail = _refused(core, guided_regex="[0-9]+")
    assert detail.startswith("invalid request: guided_regex: cannot be enforced: TensorRT-LLM 0.18.2 has no guided decoding")
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert _refused(core, tools=tools, tool_choice="required").startswith("invalid request: tool_choice: cannot be enforced")


def test_guide_types_nvidias_backend_does_not_map_are_400():
    limits = RequestLimits.from_plan(_plan())
    assert limits.guided_decoding_off is None and limits.guide_types == tuple(NVIDIA["cpp_backend"]["guide_types"])
    core = _core(**{f.name: getattr(limits, f.name) for f in dataclasses.fields(limits) if f.name.startswith("guide")})
    detail = _refused(core, response_format={"type": "structural_tag", "format": {"type": "const_string", "value": "x"}})
    assert detail.startswith("invalid request: response_format: guide type 'structural_tag' is not one this engine takes")
