"""Contract tests of what the C++ backend would get for LoRA, against NVIDIA's sources recorded in
tests/data/trtllm_lora/hf_lora_convert.json and tests/data/trtllm_flags/<version>/: the adapter converted
to `lora_weights` / `lora_config` as examples/hf_lora_convert.py does (shapes, module ids, rank, values),
trtllm-build's LoRA flags, and the names of our modules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from trtllm_flags_check import flag_problems, load_flags
from trtllm_truss.artifacts.build import plan_build
from trtllm_truss.config.build import LORA_MODULES, BuildConfig
from trtllm_truss.artifacts.lora_weights import HF_MODULE_IDS, LoraConversionError, convert_adapter

ROOT = Path(__file__).resolve().parents[2]
PIRATE = ROOT / "data" / "embedded-lora" / "pirate"
RECORD = json.loads((ROOT / "tests" / "data" / "trtllm_lora" / "hf_lora_convert.json").read_text())


def test_module_names_and_ids_are_nvidias():
    hf_to_trtllm = RECORD["hf_modules_to_trtllm_modules"]
    for hf, module_id in HF_MODULE_IDS.items():
        assert RECORD["module_ids"][hf_to_trtllm[hf]] == module_id
    assert {hf: hf_to_trtllm[hf] for hf in LORA_MODULES.values()} == {v: k for k, v in LORA_MODULES.items()}


def test_the_embedded_adapter_in_nvidias_layout():
    converted = convert_adapter(PIRATE, "float16")
    config = json.loads((PIRATE / "adapter_config.json").read_text())
    rank, scale = config["r"], config["lora_alpha"] / config["r"]
    hidden = 256
    layers, modules = 4, ("q_proj", "k_proj", "v_proj", "o_proj")
    assert converted.config.dtype == np.int32 and converted.weights.dtype == np.float16
    assert converted.config.shape == (1, layers * len(modules), 3)
    assert converted.weights.shape == (1, layers * len(modules), 2 * rank * hidden)
    rows = {(int(m), int(layer)): i for i, (m, layer, _) in enumerate(converted.config[0])}
    assert set(rows) == {(HF_MODULE_IDS[m], layer) for m in modules for layer in range(layers)}
    assert set(converted.config[0, :, 2].tolist()) == {rank}
    tensors = load_file(str(PIRATE / "adapter_model.safetensors"))
    for module in modules:
        for layer in range(layers):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a, b = tensors[f"{prefix}.lora_A.weight"].astype(np.float32), tensors[f"{prefix}.lora_B.weight"].astype(np.float32)
            row = converted.weights[0, rows[(HF_MODULE_IDS[module], layer)]].astype(np.float32)
            a_out, b_out = row[: rank * hidden].reshape(rank, hidden), row[rank * hidden :].reshape(hidden, rank)
            np.testing.assert_array_equal(a_out, a.astype(np.float16).astype(np.float32))
            np.testing.assert_allclose(b_out, b * scale, rtol=1e-3, atol=1e-6)
            # The engine applies x @ A^T @ B^T: the same update peft makes, delta W = B A x scale.
            np.testing.assert_allclose(b_out @ a_out, (b @ a) * scale, rtol=2e-2, atol=1e-4)


def test_rslora_scale_and_refusals(tmp_path):
    config = json.loads((PIRATE / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, "use_rslora": True}))
    (tmp_path / "adapter_model.safetensors").write_bytes((PIRATE / "adapter_model.safetensors").read_bytes())
    plain, rs = convert_adapter(PIRATE, "float32"), convert_adapter(tmp_path, "float32")
    half = 8 * 256  # A's part of a row is not scaled, B's is: alpha / sqrt(r) instead of alpha / r
    np.testing.assert_array_equal(plain.weights[0, 0, :half], rs.weights[0, 0, :half])
    np.testing.assert_allclose(rs.weights[0, 0, half:], plain.weights[0, 0, half:] * (8 / 8**0.5), rtol=1e-5)
    with pytest.raises(LoraConversionError, match="bfloat16"):
        convert_adapter(PIRATE, "bfloat16")


@pytest.mark.parametrize("version", ["0.16.0", "0.19.0", "0.21.0"])
def test_trtllm_build_lora_flags(version):
    config = BuildConfig(
        base_model_architecture="llama",
        huggingface_ckpt_repository="owner/model",
        lora_adapters={"pirate": "owner/pirate"},
        lora_configuration={"max_lora_rank": 16, "lora_target_modules": ["attn_q", "attn_k", "attn_v", "attn_dense"]},
    )
    plan = plan_build(config, trtllm_version=version, checkpoint_dir=Path("/c"), output_dir=Path("/e"), work_dir=Path("/w"))
    argv = list(plan.steps[-1].argv)
    core, plugins = load_flags(version, "trtllm-build"), load_flags(version, "trtllm-build.plugin_args")
    assert flag_problems(argv[1:], {**core["flags"], **plugins["flags"]}, ["--checkpoint_dir", "--output_dir"]) == []
    start = argv.index("--lora_plugin")
    assert argv[start : start + 9] == [
        "--lora_plugin", "float16", "--max_lora_rank", "16", "--lora_target_modules", "attn_q", "attn_k", "attn_v", "attn_dense"
    ]
    assert set(argv[start + 5 : start + 9]) <= set(RECORD["module_ids"])
    # Without adapters: no LoRA flag at all.
    plain = plan_build(
        BuildConfig(base_model_architecture="llama", huggingface_ckpt_repository="owner/model"),
        trtllm_version=version, checkpoint_dir=Path("/c"), output_dir=Path("/e"), work_dir=Path("/w"),
    )
    assert not any("lora" in token for token in plain.steps[-1].argv)
