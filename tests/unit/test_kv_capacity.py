"""The KV-cache size `trtllm-truss validate` prints (trtllm_truss.planning.kv_capacity), checked by hand arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest
from trtllm_truss.cli import main
from trtllm_truss.planning.kv_capacity import GIB, ModelShape, kv_capacity

# Meta-Llama-3-8B's config.json (the fields the estimate reads).
LLAMA3_8B = {
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
    "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def _capacity(quantization: str = "no_quant", **overrides):
    args = {"gpu": "H100", "gpu_memory_gib": 80, "dtype": "bfloat16", "quantization": quantization,
            "tensor_parallel": 1, "pipeline_parallel": 1, "fraction": 0.9}
    args.update(overrides)
    return kv_capacity(ModelShape.from_config(LLAMA3_8B), **args)


def test_llama3_8b_bf16_on_h100() -> None:
    capacity = _capacity()
    assert capacity.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, 2 bytes
    params = 128256 * 4096 * 2 + 32 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    assert abs(capacity.weights_bytes_per_gpu - params * 2) <= 1  # ~8.0 B parameters in bf16
    expected = int(0.9 * (80 * GIB - params * 2) // capacity.kv_bytes_per_token) // 64 * 64
    assert capacity.tokens == expected and 470_000 < expected < 490_000


def test_fp8_kv_doubles_the_tokens_and_fp4_kv_quadruples_them() -> None:
    bf16 = _capacity()
    assert _capacity("fp8_kv").kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert _capacity("fp4_fp4_kv").kv_bytes_per_token * 4 == bf16.kv_bytes_per_token
    assert _capacity("fp8_kv").tokens > 2 * bf16.tokens  # and the FP8 weights leave more memory


def test_tensor_parallel_splits_kv_heads_and_weights_cap_and_host_offload() -> None:
    tp2 = _capacity(tensor_parallel=2)
    assert tp2.kv_bytes_per_token == _capacity().kv_bytes_per_token / 2
    assert _capacity(tensor_parallel=16).kv_bytes_per_token == 2 * 32 * 1 * 128 * 2  # at least one KV head
    capped = _capacity(max_tokens=10_000)
    assert capped.tokens == 10_000 and "max_tokens_in_paged_kv_cache" in capped.capped_by
    host = _capacity(host_memory_bytes=64 * GIB)
    assert host.host_tokens == 64 * GIB // host.kv_bytes_per_token
    assert any("host memory" in line for line in host.describe())


def test_latent_attention_keeps_one_latent_per_token_and_layer() -> None:
    deepseek_v3 = {"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "hidden_size": 7168,
                   "kv_lora_rank": 512, "qk_rope_head_dim": 64, "vocab_size": 129280, "torch_dtype": "bfloat16"}
    shape = ModelShape.from_config(deepseek_v3)
    capacity = kv_capacity(shape, gpu="H200", gpu_memory_gib=141, dtype="bfloat16", quantization="no_quant",
                           tensor_parallel=8, pipeline_parallel=1, fraction=0.9)
    assert capacity.kv_bytes_per_token == 61 * (512 + 64) * 2


def test_validate_prints_the_estimate_with_its_assumptions(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    embedded = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"
    (tmp_path / "config.yaml").write_text(
        "resources:\n  accelerator: L4\nmodel_metadata:\n  trt_llm:\n    build:\n"
        f"      base_model_architecture: llama\n      huggingface_ckpt_repository: {embedded}\n"
        "      quantization_type: fp8_kv\n    runtime:\n      backend: tensorrtllm\n"
    )
    assert main(["validate", str(tmp_path), "--trtllm-version", "0.21.0"]) == 0
    out = capsys.readouterr().out
    # embedded-llama: 4 layers, 4 KV heads of 64, FP8 KV: 2 x 4 x 4 x 64 x 1 bytes = 2 KiB per token
    assert "KV cache on one L4 (24.0 GiB): about" in out
    assert "KV 2.0 KiB per token per GPU (8-bit)" in out
    assert "upper bound" in out
