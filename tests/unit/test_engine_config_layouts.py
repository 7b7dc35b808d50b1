"""Engine config.json parsing (both layouts) and every verification message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trtllm_truss.artifacts.engine_config import (
    BUILD_INFO_FILE,
    EngineVerificationError,
    expected_rank_files,
    parse_engine_config,
    verify_engine_dir,
)
from trtllm_truss.planning.probe import GpuInfo


def new_layout(tp: int = 1, pp: int = 1, *, version: str = "0.12.0", **build: object) -> dict:
    return {
        "version": version,
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "bfloat16",
            "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
        },
        "build_config": {
            "max_batch_size": 64,
            "max_input_len": 2048,
            "max_seq_len": 4096,
            "max_beam_width": 2,
            "max_num_tokens": 8192,
            "plugin_config": {"gemm_plugin": "auto", "paged_kv_cache": True},
            **build,
        },
    }


def old_layout(tp: int = 1, pp: int = 1, *, quant_mode: int = 0) -> dict:
    return {
        "builder_config": {
            "name": "llama",
            "precision": "float16",
            "tensor_parallel": tp,
            "pipeline_parallel": pp,
            "max_batch_size": 8,
            "max_input_len": 1024,
            "max_output_len": 512,
            "max_beam_width": 1,
            "max_num_tokens": None,
            "quant_mode": quant_mode,
            "int8": False,
        },
        "plugin_config": {"gpt_attention_plugin": "float16", "paged_kv_cache": True},
    }


def write_engine(path: Path, config: dict | str, ranks: list[str] | None = None, rank_bytes: int = 16) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if ranks is None:
        ranks = list(expected_rank_files(parse_engine_config(json.loads((path / "config.json").read_text()))))
    for name in ranks:
        (path / name).write_bytes(b"\x01" * rank_bytes)
    return path


# --- parsing -------------------------------------------------------------------------------------


def test_new_layout_parses_every_field():
    info = parse_engine_config(new_layout(tp=2, pp=2))
    assert info.layout == "new" and info.version == "0.12.0"
    assert (info.architecture, info.dtype) == ("LlamaForCausalLM", "bfloat16")
    assert (info.tensor_parallel, info.pipeline_parallel, info.world_size) == (2, 2, 4)
    assert (info.quant_algo, info.kv_cache_quant_algo) == ("FP8", "FP8")
    assert (info.max_batch_size, info.max_input_len, info.max_seq_len) == (64, 2048, 4096)
    assert info.max_output_len is None and info.output_len_limit == 2048
    assert (info.max_beam_width, info.max_num_tokens) == (2, 8192)
    assert info.plugin_config["gemm_plugin"] == "auto"
    assert expected_rank_files(info) == ("rank0.engine", "rank1.engine", "rank2.engine", "rank3.engine")


def test_new_layout_of_early_versions_with_max_output_len():
    info = parse_engine_config(new_layout(version="0.9.0", max_output_len=300))
    assert info.max_output_len == 300 and info.output_len_limit == 300


def test_old_layout_parses_and_maps_quant_mode():
    # INT8 weights (2) + INT8 KV cache (64), as build.py --use_weight_only --int8_kv_cache wrote it.
    info = parse_engine_config(old_layout(tp=2, quant_mode=2 | 64))
    assert info.layout == "old" and info.version is None
    assert (info.architecture, info.dtype, info.world_size) == ("llama", "float16", 2)
    assert (info.quant_algo, info.kv_cache_quant_algo) == ("W8A16", "INT8")
    assert (info.max_input_len, info.max_output_len, info.output_len_limit) == (1024, 512, 512)
    assert info.plugin_config["gpt_attention_plugin"] == "float16"
    assert expected_rank_files(info) == ("llama_float16_tp2_rank0.engine", "llama_float16_tp2_rank1.engine")
    assert expected_rank_files(parse_engine_config(old_layout(tp=1, pp=2)))[1] == "llama_float16_tp1_pp2_rank1.engine"


@pytest.mark.parametrize(
    ("quant_mode", "algo", "kv"),
    [
        (0, None, None),
        (1, "W4A16", None),
        (1 | 32, "W4A16_AWQ", None),
        (4 | 8 | 16, "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN", None),
        (4, "W8A8_SQ_PER_TENSOR_PER_TENSOR_PLUGIN", None),
        (256 | 128, "FP8", "FP8"),
    ],
)
def test_old_layout_quant_mode_table(quant_mode, algo, kv):
    info = parse_engine_config(old_layout(quant_mode=quant_mode))
    assert (info.quant_algo, info.kv_cache_quant_algo) == (algo, kv)


def test_hf_checkpoint_config_is_not_an_engine():
    with pytest.raises(EngineVerificationError, match="not a TensorRT-LLM engine config.json"):
        parse_engine_config({"model_type": "llama", "hidden_size": 4096})


def test_missing_and_mistyped_keys_name_the_key_path():
    config = new_layout()
    del config["build_config"]["max_input_len"]
    with pytest.raises(EngineVerificationError, match=r"`build_config\.max_input_len` is missing"):
        parse_engine_config(config)
    config = new_layout(max_batch_size="64")
    with pytest.raises(EngineVerificationError, match=r"`build_config\.max_batch_size` is '64', expected int"):
        parse_engine_config(config)


# --- verification: one message per mismatch, each saying what to change ---------------------------


def test_valid_engine_passes_every_check(tmp_path):
    engine = write_engine(tmp_path / "e", new_layout(tp=2))
    info = verify_engine_dir(
        engine,
        expected_tp=2,
        expected_pp=1,
        gpu_count=2,
        runtime_trtllm_version="0.12.0.dev2024073000",
        runtime_gpu=GpuInfo("NVIDIA H100", "9.0"),
    )
    assert info.rank_files == ("rank0.engine", "rank1.engine")


MISMATCHES = [
    # (config, rank files or None for all, verify kwargs, message pattern)
    pytest.param(
        new_layout(tp=2),
        ["rank0.engine"],
        {},
        r"missing engine file\(s\) rank1\.engine for world size 2 \(tp=2, pp=1; found: rank0\.engine\); "
        r"the upload or download is incomplete",
        id="missing-rank-file",
    ),
    pytest.param(
        new_layout(),
        None,
        {"runtime_trtllm_version": "0.13.0"},
        r"built with TensorRT-LLM 0\.12\.0 but the runtime is 0\.13\.0; rebuild the engine with 0\.13\.0",
        id="version-mismatch",
    ),
    pytest.param(
        old_layout(),
        None,
        {"runtime_trtllm_version": "0.10.0"},
        r"pre-0\.9 config\.json layout \(`builder_config`\) but the runtime is TensorRT-LLM 0\.10\.0; "
        r"rebuild",
        id="old-layout-on-new-runtime",
    ),
    pytest.param(
        new_layout(tp=2),
        None,
        {"expected_tp": 4},
        r"built with tensor parallelism 2 but the config asks for 4; set tensor_parallel_count: 2",
        id="tp-mismatch",
    ),
    pytest.param(
        new_layout(pp=2),
        None,
        {"expected_pp": 1},
        r"built with pipeline parallelism 2 but the config asks for 1; set pipeline_parallel_count: 2",
        id="pp-mismatch",
    ),
    pytest.param(
        new_layout(tp=4),
        None,
        {"gpu_count": 2},
        r"engine needs 4 GPUs \(tp=4 x pp=1\) but 2 are visible; set resources\.accelerator to <GPU>:4",
        id="world-size-vs-gpus",
    ),
]


@pytest.mark.parametrize(("config", "ranks", "kwargs", "message"), MISMATCHES)
def test_each_mismatch_is_one_line_saying_what_to_change(tmp_path, config, ranks, kwargs, message):
    engine = write_engine(tmp_path / "e", config, ranks)
    with pytest.raises(EngineVerificationError, match=message) as raised:
        verify_engine_dir(engine, **kwargs)
    assert "\n" not in str(raised.value)


def test_old_layout_is_fine_on_an_old_runtime(tmp_path):
    engine = write_engine(tmp_path / "e", old_layout(tp=2))
    assert verify_engine_dir(engine, runtime_trtllm_version="0.8.0", expected_tp=2).layout == "old"


def test_corrupted_or_incomplete_files(tmp_path):
    with pytest.raises(EngineVerificationError, match="engine directory does not exist"):
        verify_engine_dir(tmp_path / "absent")
    (tmp_path / "no-config").mkdir()
    with pytest.raises(EngineVerificationError, match=r"config\.json: missing"):
        verify_engine_dir(tmp_path / "no-config")
    truncated = write_engine(tmp_path / "t", json.dumps(new_layout())[:80], ranks=["rank0.engine"])
    with pytest.raises(
        EngineVerificationError, match=r"not valid JSON \(.* at line 1 column \d+\); the file is truncated"
    ):
        verify_engine_dir(truncated)
    empty_config = write_engine(tmp_path / "z", "", ranks=["rank0.engine"])
    with pytest.raises(EngineVerificationError, match=r"config\.json: empty \(0 bytes\)"):
        verify_engine_dir(empty_config)
    empty_rank = write_engine(tmp_path / "r", new_layout(tp=2), rank_bytes=0)
    with pytest.raises(EngineVerificationError, match=r"rank0\.engine, rank1\.engine are empty \(0 bytes\)"):
        verify_engine_dir(empty_rank)
    inconsistent = new_layout(tp=2)
    inconsistent["pretrained_config"]["mapping"]["world_size"] = 3
    with pytest.raises(EngineVerificationError, match=r"mapping\.world_size=3 but tp_size\*pp_size=2"):
        verify_engine_dir(write_engine(tmp_path / "i", inconsistent, ranks=["rank0.engine"]))


def test_build_gpu_record_must_match_the_serving_gpu(tmp_path):
    engine = write_engine(tmp_path / "e", new_layout())
    (engine / BUILD_INFO_FILE).write_text(
        json.dumps({"gpu": {"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}})
    )
    with pytest.raises(
        EngineVerificationError,
        match=r"built on NVIDIA A100-SXM4-80GB \(SM 80\) but this machine has NVIDIA H100 \(SM 90\).*rebuild on NVIDIA H100",
    ):
        verify_engine_dir(engine, runtime_gpu=GpuInfo("NVIDIA H100", "9.0"))
    info = verify_engine_dir(engine, runtime_gpu=GpuInfo("NVIDIA A100 80GB PCIe", "8.0"))
    assert info.build_gpu is not None and info.build_gpu.sm == 80
