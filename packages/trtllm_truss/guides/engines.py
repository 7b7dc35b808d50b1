"""Which engine path enforces guides, and what NVIDIA's C++ backend needs to do it.

`runtime.guided_decoding_backend` (auto | xgrammar | llguidance | none) against the chosen backend and
the installed TensorRT-LLM (`guide_engine` resolves it):
- pytorch (the stand-in for TensorRT-LLM's PyTorch path, LLM API 1.x): `llm_args.py` (v1.0.0-v1.2.0)
  has `guided_decoding_backend: Optional[Literal["xgrammar", "llguidance"]]`, "llguidance is supported
  in PyTorch backend only"; `_torch/pyexecutor/grammar_matcher.py` builds an xgrammar or an llguidance
  matcher from it. The stand-in enforces guides with the engine named (`engine_standin.guidance`).
  TensorRT-LLM's own default is None (no guided decoding at all), so auto is xgrammar, the engine both
  of TensorRT-LLM's paths implement.
- tensorrtllm (NVIDIA's C++ backend): from tensorrtllm_backend v0.19.0 (`docs/guided_decoding.md`):
  the `tensorrt_llm` model parameters `guided_decoding_backend: xgrammar` and
  `xgrammar_tokenizer_info_path`, a JSON file read by `getGuidedDecodingConfigFromParams`
  (inflight_batcher_llm/src/model_instance_state.cc: keys `encoded_vocab`, `tokenizer_str`,
  `stop_token_ids`; without both parameters guided decoding is off and guided requests fail). NVIDIA
  makes that file with TensorRT-LLM's `examples/generate_xgrammar_tokenizer_info.py`
  (`tensorrt_llm.llmapi.tokenizer._xgrammar_tokenizer_info`); we write the same three keys at load
  time from the tokenizer (`transformers` only: no xgrammar or GPU needed to make it). The C++
  backend ignores `tokenizer_dir` for guided decoding (it says so in its log), so none is rendered.
  Older engines: no guided decoding.
- llmapi (our LLM-API Triton model, triton_models/tensorrt_llm_llmapi): NVIDIA's guide inputs become
  `SamplingParams(guided_decoding=GuidedDecodingParams(...))`, enforced by the LLM API's
  `guided_decoding_backend` (model.yaml: the engine resolved as for pytorch, xgrammar or llguidance, our
  model's LLM API being the PyTorch one); on a machine without TensorRT-LLM its LLM-API double enforces
  them with the stand-in's compiler of that same engine.
A request with a guide on a deployment that cannot enforce it is a 400 naming the field
(`RequestLimits.guided_decoding_off`), never an unconstrained answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GUIDED_DECODING_SINCE = (0, 19)  # tensorrtllm_backend v0.19.0: the first with guided-decoding inputs
XGRAMMAR = "xgrammar"  # the only guided_decoding_backend NVIDIA's C++ backend accepts (v0.19.0)
LLGUIDANCE = "llguidance"  # TensorRT-LLM's PyTorch path only (llm_args.py; guidedDecoder.cpp refuses kLLGUIDANCE)
GUIDE_ENGINES = (XGRAMMAR, LLGUIDANCE)
TOKENIZER_INFO_FILE = "xgrammar_tokenizer_info.json"  # generate_xgrammar_tokenizer_info.py's file name
SETTING = "model_metadata.trt_llm.runtime.guided_decoding_backend"
# The guide types NVIDIA's tensorrtllm backend maps (v0.19.0 utils.cc getGuidedDecodingParamsFromTensors):
# any other type string becomes no guide at all, so the request core refuses it on that path.
TENSORRTLLM_GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")


def engine_guide_types(backend: str) -> tuple[str, ...] | None:
    """The guide types this backend's engine takes (None: every type the stand-in compiles)."""
    return TENSORRTLLM_GUIDE_TYPES if backend == "tensorrtllm" else None


def guide_engine(setting: str, backend: str) -> str | None:
    """The grammar engine that enforces guides on this backend: the setting, or for auto xgrammar (the
    C++ backend's only engine, and the PyTorch path's first); None when guided decoding is off."""
    if setting == "none":
        return None
    return setting if setting in GUIDE_ENGINES else XGRAMMAR


def guided_decoding_off(setting: str, backend: str, version: tuple[int, int], version_text: str | None) -> str | None:
    """None when this deployment enforces guides, else why not (ends a request's 400)."""
    if setting == "none":
        return f"guided decoding is off in this deployment ({SETTING}: none)"
    if backend == "pytorch":
        return None
    if backend == "llmapi":
        return None
    if version < GUIDED_DECODING_SINCE:
        return (
            f"TensorRT-LLM {version_text or '(version unknown)'} has no guided decoding"
            " (NVIDIA's tensorrtllm backend has it from v0.19.0)"
        )
    return None


def guided_decoding_problems(setting: str, backend: str, version: tuple[int, int], version_text: str | None) -> list[str]:
    """Validate-time problems: `xgrammar` or `llguidance` asked for where it cannot run."""
    if setting not in GUIDE_ENGINES:
        return []
    if setting == LLGUIDANCE and backend == "tensorrtllm":
        return [
            f"{SETTING}: llguidance is not available on backend tensorrtllm: NVIDIA's C++ runtime refuses it"
            " (guidedDecoder.cpp: \"LLGuidance is not supported for guided decoding in C++ runtime\"); use xgrammar or auto"
        ]
    reason = guided_decoding_off(setting, backend, version, version_text)
    if reason is None:
        return []
    return [f"{SETTING}: {setting} is not available: {reason}; set auto (guides refused per request) or none"]


def xgrammar_tokenizer_info(tokenizer: Any) -> dict[str, Any]:
    """NVIDIA's tokenizer info for xgrammar (TensorRT-LLM `_xgrammar_tokenizer_info`): the vocabulary's
    tokens in id order, the fast tokenizer's JSON, the end token. The C++ backend needs
    `tokenizer_str`, so a tokenizer without a fast (tokenizers) backend is refused."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"guided decoding on the tensorrtllm backend needs a fast tokenizer (tokenizer.json); {type(tokenizer).__name__} has none"
            f" ({SETTING}: none turns guided decoding off)"
        )
    vocab = tokenizer.get_vocab()
    return {
        "encoded_vocab": [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])],
        "tokenizer_str": backend.to_str(),
        "stop_token_ids": [tokenizer.eos_token_id],
    }


def write_xgrammar_tokenizer_info(tokenizer_dir: Path, path: Path) -> Path:
    """Write NVIDIA's `xgrammar_tokenizer_info.json` for the tokenizer in `tokenizer_dir`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), use_fast=True)
    info = xgrammar_tokenizer_info(tokenizer)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, ensure_ascii=False), encoding="utf-8")
    return path
