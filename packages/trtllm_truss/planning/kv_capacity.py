"""How many tokens of KV cache the engine will hold on the configured GPU: `trtllm-truss validate` prints it.

The arithmetic TensorRT-LLM's KV-cache manager does at startup, done ahead of time from the checkpoint's
`config.json` (or a prebuilt engine's `pretrained_config`): per token, every layer keeps one key and one value
vector per KV head, `2 x layers x kv_heads x head_dim x bytes(KV dtype)`, split over the ranks (layers over
pipeline stages, KV heads over tensor-parallel ranks, at least one head each). The pool is
`kv_cache_free_gpu_mem_fraction` of the GPU memory left after the weights (NVIDIA: of the memory free once
the engine is loaded), capped by `max_tokens_in_paged_kv_cache`, in whole blocks of `tokens_per_block`.

Assumptions, printed with the numbers: the GPU's memory is its datasheet size; weights come from the
checkpoint's safetensors index when it is local, otherwise from the config (attention, gated MLP per expert,
embeddings and an untied LM head), at the quantization's bytes per weight, split evenly over the ranks;
activations, CUDA context and runtime buffers (typically 1-3 GiB) are not subtracted, so the figure is an
upper bound.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1 << 30
_DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "fp32": 4.0, "fp16": 2.0, "bf16": 2.0}
# Bytes per linear-layer weight for each build.quantization_type (embeddings stay in the model dtype).
_WEIGHT_BYTES = {
    "weights_int8": 1.0, "weights_kv_int8": 1.0, "smooth_quant": 1.0, "fp8": 1.0, "fp8_kv": 1.0,
    "weights_int4": 0.5, "weights_kv_int4": 0.5, "awq": 0.5, "fp4": 0.5, "fp4_kv": 0.5, "fp4_fp4_kv": 0.5,
}
# Bytes per KV-cache element where the quantization sets the KV dtype (else the model dtype).
_KV_BYTES = {"weights_kv_int8": 1.0, "weights_kv_int4": 1.0, "fp8_kv": 1.0, "fp4_kv": 1.0, "fp4_fp4_kv": 0.5}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int
    experts: int
    tied_embeddings: bool
    checkpoint_weight_bytes: int | None  # safetensors index total_size, in the checkpoint's dtype
    checkpoint_dtype_bytes: float | None
    # Multi-head latent attention (DeepSeek-V2/V3): one compressed latent of kv_lora_rank + qk_rope_head_dim
    # values per token and layer instead of K and V per head (None for ordinary attention).
    latent_dim: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], weight_bytes: int | None = None) -> ModelShape:
        """From a Hugging Face config.json or an engine config.json (its `pretrained_config`)."""
        config = config.get("pretrained_config", config)
        text = config.get("text_config")
        if isinstance(text, Mapping):  # multimodal wrappers keep the language model's shape here
            config = text
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        head_dim = config.get("head_dim") or config.get("head_size") or hidden // heads
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
        return cls(
            layers=int(config["num_hidden_layers"]),
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            hidden=hidden,
            heads=heads,
            # MoE: every expert's MLP (DeepSeek: routed + shared experts of moe_intermediate_size)
            intermediate=int(config.get("moe_intermediate_size") or config.get("intermediate_size") or 4 * hidden),
            vocab=int(config.get("vocab_size") or 0),
            experts=int(config.get("num_local_experts") or config.get("n_routed_experts") or 1)
            + int(config.get("n_shared_experts") or 0),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            checkpoint_weight_bytes=weight_bytes,
            checkpoint_dtype_bytes=_DTYPE_BYTES.get(dtype),
            latent_dim=(int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim") or 0))
            if config.get("kv_lora_rank") else None,
        )

    def linear_params(self) -> int:
        attention = self.hidden * self.heads * self.head_dim * 2 + 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate * self.experts
        return self.layers * (attention + mlp)

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)


@dataclass(frozen=True)
class KvCapacity:
    gpu: str
    gpu_memory_bytes: int
    weights_bytes_per_gpu: int
    weights_source: str
    kv_bytes_per_token: float  # on one GPU
    kv_dtype: str
    fraction: float
    tokens: int
    capped_by: str | None
    max_seq_len: int | None
    host_tokens: int | None

    def describe(self) -> list[str]:
        gib = lambda n: f"{n / GIB:.1f} GiB"
        lines = [
            f"KV cache on one {self.gpu} ({gib(self.gpu_memory_bytes)}): about {self.tokens:,} tokens"
            + (f" ({self.tokens // self.max_seq_len:,} sequences of max_seq_len {self.max_seq_len:,})"
               if self.max_seq_len else ""),
            (f"  weights {gib(self.weights_bytes_per_gpu)} per GPU ({self.weights_source});"
            f" KV {self.kv_bytes_per_token / 1024:.1f} KiB per token per GPU ({self.kv_dtype});"
            f" runtime.kv_cache_free_gpu_mem_fraction {self.fraction}"),
        ]
        if self.capped_by:
            lines.append(f"  capped by {self.capped_by}")
        if self.host_tokens:
            lines.append(f"  plus about {self.host_tokens:,} tokens offloaded to host memory"
                         " (runtime.kv_cache_host_memory_bytes)")
        lines.append(
            "  assumptions: datasheet GPU memory; activations, CUDA context and runtime buffers (1-3 GiB) not"
            " subtracted, so an upper bound; weights split evenly over tensor x pipeline ranks"
        )
        return lines


def weights_bytes(shape: ModelShape, dtype_bytes: float, quantization: str) -> tuple[int, str]:
    """(bytes of all weights after quantization, where the figure comes from)."""
    linear_bytes = _WEIGHT_BYTES.get(quantization, dtype_bytes)
    if shape.checkpoint_weight_bytes and shape.checkpoint_dtype_bytes:
        params = shape.checkpoint_weight_bytes / shape.checkpoint_dtype_bytes
        embedding = min(shape.embedding_params(), params)
        total = embedding * dtype_bytes + (params - embedding) * linear_bytes
        return int(total), "size of the checkpoint's safetensors"
    total = shape.embedding_params() * dtype_bytes + shape.linear_params() * linear_bytes
    return int(total), "estimated from config.json"


def kv_capacity(
    shape: ModelShape,
    *,
    gpu: str,
    gpu_memory_gib: float,
    dtype: str,
    quantization: str,
    tensor_parallel: int,
    pipeline_parallel: int,
    fraction: float,
    tokens_per_block: int = 64,
    max_tokens: int | None = None,
    host_memory_bytes: int | None = None,
    max_seq_len: int | None = None,
) -> KvCapacity:
    dtype_bytes = _DTYPE_BYTES[dtype]
    kv_element = _KV_BYTES.get(quantization, dtype_bytes)
    kv_dtype = {1.0: "8-bit", 0.5: "FP4"}.get(kv_element, dtype) if quantization in _KV_BYTES else dtype
    total_weights, source = weights_bytes(shape, dtype_bytes, quantization)
    per_gpu_weights = total_weights // (tensor_parallel * pipeline_parallel)
    layers = math.ceil(shape.layers / pipeline_parallel)
    kv_heads = max(1, math.ceil(shape.kv_heads / tensor_parallel))
    if shape.latent_dim:  # MLA: the latent is not split over tensor-parallel ranks
        per_token = layers * shape.latent_dim * kv_element
    else:
        per_token = 2 * layers * kv_heads * shape.head_dim * kv_element
    memory = int(gpu_memory_gib * GIB)
    free = max(0, memory - per_gpu_weights)
    tokens = int(fraction * free // per_token) // tokens_per_block * tokens_per_block
    capped_by = None
    if max_tokens is not None and max_tokens < tokens:
        tokens, capped_by = max_tokens, f"runtime.max_tokens_in_paged_kv_cache {max_tokens:,}"
    host = int(host_memory_bytes // per_token) if host_memory_bytes else None
    return KvCapacity(gpu, memory, per_gpu_weights, source, per_token, kv_dtype, fraction, tokens, capped_by,
                      max_seq_len, host)


def read_model_config(directory: Path) -> tuple[dict[str, Any], int | None]:
    """config.json of a local checkpoint or engine, and the safetensors index's total size when there is one."""
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    weight_bytes = None
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        total = json.loads(index.read_text(encoding="utf-8")).get("metadata", {}).get("total_size")
        weight_bytes = int(total) if isinstance(total, (int, float)) else None
    elif (directory / "model.safetensors").is_file():
        weight_bytes = (directory / "model.safetensors").stat().st_size
    return config, weight_bytes
