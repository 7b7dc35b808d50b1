"""NVIDIA's `tensorrt_llm` tensor request, as keyword arguments of TensorRT-LLM's LLM API (1.x).

Our llmapi Triton model (model.py beside this file) reads a request's tensors with the stand-in's reader
(`engine_standin/request_inputs.py`: the same names, defaults and refusals as the tensor stand-in) and
turns each row into one `LLM.generate_async` call built here, keyword arguments only. Every keyword and
field named below is checked against NVIDIA's sources of TensorRT-LLM 1.0.0, 1.1.0, 1.2.0 and 1.2.1
(tests/data/trtllm_flags/<version>/llmapi_generate.json; tests/unit/test_llmapi_model_contract.py reads
this file's calls).

`api` is where the names come from: `tensorrt_llm` itself, or the LLM-API double
(`engine_standin/llmapi_double.py`) where TensorRT-LLM cannot run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from trtllm_truss.engine_standin.types import GenerationRequest, Guide, RequestRejected

LLM_API_REAL, LLM_API_DOUBLE = "tensorrt_llm", "double"
# NVIDIA's SamplingParams._validate refuses n > 1 with greedy decoding unless this is set; NVIDIA's C++
# backend (the tensor interface we serve) returns n sequences either way.
ALLOW_N_GREEDY_ENV = "TLLM_ALLOW_N_GREEDY_DECODING"


def double_settings(parameters: Mapping[str, str]) -> dict[str, Any]:
    """The LLM-API double's own keyword arguments (no LLM() argument of TensorRT-LLM's), from our model's
    parameters, which use the stand-in's names: guided_whitespace, synthetic, synthetic_step_time_ms."""
    settings: dict[str, Any] = {"double_guided_whitespace": parameters.get("guided_whitespace", "").strip() or "compact"}
    if parameters.get("synthetic", "").strip().lower() == "true":
        settings["double_synthetic_step_time_ms"] = float(parameters.get("synthetic_step_time_ms", "").strip() or 0.0)
        prefill = parameters.get("synthetic_prefill_time_per_token_ms", "").strip()
        if prefill:
            settings["double_synthetic_prefill_time_per_token_ms"] = float(prefill)
    return settings


def load_llm_api(kind: str) -> SimpleNamespace:
    """LLM, SamplingParams, GuidedDecodingParams, LoRARequest: TensorRT-LLM's, or the double's."""
    if kind == LLM_API_DOUBLE:
        from trtllm_truss.engine_standin import llmapi_double as double

        return SimpleNamespace(
            LLM=double.LLM, SamplingParams=double.SamplingParams,
            GuidedDecodingParams=double.GuidedDecodingParams, LoRARequest=double.LoRARequest,
        )
    if kind != LLM_API_REAL:
        raise ValueError(f"parameters.llm_api: {kind!r} is not one of {LLM_API_REAL}, {LLM_API_DOUBLE}")
    os.environ.setdefault(ALLOW_N_GREEDY_ENV, "1")
    from tensorrt_llm import LLM
    from tensorrt_llm.executor.request import LoRARequest
    from tensorrt_llm.sampling_params import GuidedDecodingParams, SamplingParams

    return SimpleNamespace(
        LLM=LLM, SamplingParams=SamplingParams, GuidedDecodingParams=GuidedDecodingParams, LoRARequest=LoRARequest
    )


def guided_decoding(api: SimpleNamespace, guide: Guide):
    """NVIDIA's guide types (guided_decoding_guide_type) as GuidedDecodingParams, the inverse of
    SamplingParams._get_guided_decoding_params."""
    kind, text = guide.guide_type, guide.guide
    if kind == "json":
        return api.GuidedDecodingParams(json_object=True)
    if kind == "json_schema":
        return api.GuidedDecodingParams(json=text)
    if kind == "regex":
        return api.GuidedDecodingParams(regex=text)
    if kind == "ebnf_grammar":
        return api.GuidedDecodingParams(grammar=text)
    if kind == "structural_tag":
        return api.GuidedDecodingParams(structural_tag=text)
    raise RequestRejected(f"guided_decoding_guide_type: {kind!r} is not one of json, json_schema, regex, ebnf_grammar, structural_tag")


def split_words(words: list[list[int]], decode: Callable[[list[int]], str]) -> tuple[list[int], list[str]]:
    """Token-id sequences as the LLM API takes them: single ids, and longer sequences as text (the LLM API
    encodes strings back to ids itself, SamplingParams._setup)."""
    ids = [word[0] for word in words if len(word) == 1]
    texts = [decode(word) for word in words if len(word) > 1]
    return ids, texts


def _embedding_bias(values: list[float] | None):
    if values is None:
        return None
    import torch  # SamplingParams.embedding_bias is a torch tensor [vocab_size], float32

    return torch.tensor(values, dtype=torch.float32)


def sampling_params(
    api: SimpleNamespace, generation: GenerationRequest, *, n: int, decode: Callable[[list[int]], str], perf: bool = False
):
    """SamplingParams for one row. The tensor interface's greedy (top_k 0 or 1 with top_p 0, NVIDIA's C++
    default) is `top_k=1` in the LLM API, whose own default (all None) would sample."""
    sampling = generation.sampling
    greedy = sampling.greedy or sampling.temperature == 0.0
    stop_ids, stop_texts = split_words(generation.stop_words, decode)
    bad_ids, bad_texts = split_words(generation.bad_words, decode)
    return api.SamplingParams(
        max_tokens=generation.max_new_tokens,
        end_id=generation.end_id,
        pad_id=generation.pad_id,
        n=n,
        top_k=1 if greedy else (sampling.top_k or None),
        top_p=None if greedy or sampling.top_p <= 0.0 else sampling.top_p,
        temperature=None if greedy else sampling.temperature,
        seed=sampling.random_seed,
        repetition_penalty=sampling.repetition_penalty if sampling.repetition_penalty != 1.0 else None,
        presence_penalty=sampling.presence_penalty or None,
        frequency_penalty=sampling.frequency_penalty or None,
        min_tokens=sampling.min_length or None,
        stop_token_ids=stop_ids or None,
        stop=stop_texts or None,
        # NVIDIA's C++ backend keeps a matched stop sequence in the output; so does this model.
        include_stop_str_in_output=True,
        bad_token_ids=bad_ids or None,
        bad=bad_texts or None,
        embedding_bias=_embedding_bias(generation.embedding_bias),
        # logprobs=k: each position of CompletionOutput.logprobs holds the k most likely tokens (and the
        # sampled one); our num_top_log_probs is that k (1: the sampled token's log prob only).
        logprobs=max(generation.top_log_probs, 1) if generation.return_log_probs else None,
        guided_decoding=guided_decoding(api, generation.guide) if generation.guide is not None else None,
        # Token ids in, token ids out: the stream workers and postprocessing detokenize.
        detokenize=False,
        # NVIDIA's return_perf_metrics: CompletionOutput.request_perf_metrics (its KV block counts) is filled.
        return_perf_metrics=perf,
    )


def kv_block_counts(completion: Any) -> tuple[int, int] | None:
    """(total, reused) prompt KV blocks of a CompletionOutput whose request_perf_metrics the LLM API filled."""
    metrics = getattr(getattr(completion, "request_perf_metrics", None), "kv_cache_metrics", None)
    if metrics is None:
        return None
    return int(metrics.num_total_allocated_blocks), int(metrics.num_reused_blocks)


def lora_request(api: SimpleNamespace, task_id: int | None, adapters: Mapping[int, tuple[str, Path]]):
    """The LoRARequest of NVIDIA's lora_task_id (build.lora_adapters: task id -> name, peft folder)."""
    if task_id is None:
        return None
    name, directory = adapters[task_id]
    return api.LoRARequest(lora_name=name, lora_int_id=int(task_id), lora_path=str(directory))


def submit(llm: Any, api: SimpleNamespace, generation: GenerationRequest, *, n: int, streaming: bool,
           adapters: Mapping[int, tuple[str, Path]], decode: Callable[[list[int]], str], perf: bool = False):
    """One row of a Triton request as one generate_async call (keyword arguments only: the third
    positional parameter is lora_request in every 1.x release)."""
    return llm.generate_async(
        inputs=list(generation.input_ids),
        sampling_params=sampling_params(api, generation, n=n, decode=decode, perf=perf),
        lora_request=lora_request(api, generation.lora_task_id, adapters),
        streaming=streaming,
    )


def token_log_probs(entries: list, tokens: list[int]) -> list[float]:
    """CompletionOutput.logprobs (one {token id: Logprob} per generated token, or a float) for `tokens`."""
    values = []
    for entry, token in zip(entries, tokens):
        if isinstance(entry, Mapping):
            chosen = entry.get(token)
            if chosen is None and entry:
                chosen = next(iter(entry.values()))
            values.append(float(getattr(chosen, "logprob", chosen)) if chosen is not None else 0.0)
        else:
            values.append(float(entry))
    return values


def token_top_log_probs(entries: list, k: int) -> list[tuple[list[int], list[float]]]:
    """The k most likely (token ids, log probs) of each position of CompletionOutput.logprobs, largest first
    (a position's dict holds SamplingParams.logprobs tokens by rank, plus the sampled one when it ranks lower)."""
    tops = []
    for entry in entries:
        ranked = sorted(
            ((int(t), float(getattr(v, "logprob", v))) for t, v in entry.items()) if isinstance(entry, Mapping) else (),
            key=lambda pair: -pair[1],
        )[:k]
        tops.append(([t for t, _ in ranked], [v for _, v in ranked]))
    return tops
