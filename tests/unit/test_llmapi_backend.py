"""Backend llmapi (NVIDIA's LLM API / PyTorch backend behind our llmapi Triton model): backend choice (and
the LLM-API double where TensorRT-LLM cannot run), the plan, the rendered repository and model.yaml checked
against the names NVIDIA's sources accept (tests/data/trtllm_flags/1.0.0/llmapi_model.json), and settings
refused where they would do nothing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from trtllm_truss.config import load_config
from trtllm_truss.planning.backend_settings import backend_setting_problems
from trtllm_truss.planning.plan import PlanError, choose_backend
from trtllm_truss.planning.plan import make_plan as _make_plan
from trtllm_truss.planning.probe import GpuInfo, RuntimeFacts
from trtllm_truss.repository.llmapi import llm_args as model_yaml_document
from trtllm_truss.repository.render import render_repository

NAMES = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "trtllm_flags" / "1.0.0" / "llmapi_model.json").read_text()
)


def facts(version: str, gpus: int = 2) -> RuntimeFacts:
    return RuntimeFacts(
        gpus=(GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 81559),) * gpus,
        trtllm_version=version,
        trtllm_unavailable_reason=None,
    )


def truss(tmp_path: Path, trt_llm_yaml: str) -> Path:
    body = "".join(f"    {line}\n" for line in trt_llm_yaml.strip().splitlines())
    (tmp_path / "config.yaml").write_text(
        f"model_name: t\nresources:\n  accelerator: H100:2\n  use_gpu: true\nmodel_metadata:\n  trt_llm:\n{body}"
    )
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(exist_ok=True)
    (ckpt / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
    return tmp_path


BUILD = """
build:
  base_model_architecture: mixtral
  huggingface_ckpt_repository: ckpt
  dtype: bfloat16
  max_input_len: 3000
  max_output_len: 1000
  max_batch_size: 48
  tensor_parallel_count: 2
"""


def resolved(tmp_path: Path, extra: str = "", build_extra: str = ""):
    text = BUILD + "".join(f"  {line}\n" for line in build_extra.strip().splitlines()) + extra
    return load_config(truss(tmp_path, text), environ={})


def make_plan(config, facts, *, artifacts_dir, **kwargs):
    return _make_plan(config, facts, artifacts_dir=artifacts_dir, **kwargs)


def test_auto_picks_llmapi_on_trtllm_1x_for_a_checkpoint_it_can_load(tmp_path):
    plan = make_plan(resolved(tmp_path), facts("1.0.0"), artifacts_dir=tmp_path / "a")
    assert plan.backend == "llmapi" and "LLM API" in plan.backend_reason
    assert plan.model_dir == (tmp_path / "ckpt").resolve() == plan.tokenizer_dir
    assert plan.engine_dir is None and plan.build is not None and plan.limits_final
    assert [(f.role, f.kind) for f in plan.fetches] == [("model", "checkpoint")]
    assert (plan.tensor_parallel_count, plan.max_batch_size) == (2, 48)


def test_auto_keeps_the_engine_path_on_0x_and_for_calibrated_quantization(tmp_path):
    assert make_plan(resolved(tmp_path), facts("0.16.0"), artifacts_dir=tmp_path / "a").backend == "tensorrtllm"
    plan = make_plan(resolved(tmp_path, build_extra="quantization_type: fp8"), facts("1.0.0"), artifacts_dir=tmp_path)
    assert plan.backend == "tensorrtllm" and "quantization_type fp8" in plan.backend_reason


def test_llmapi_requested_where_it_cannot_run_is_refused_with_the_setting():
    with pytest.raises(PlanError, match=r"needs TensorRT-LLM >= 1\.0.*runtime\.backend: tensorrtllm"):
        choose_backend("llmapi", facts("0.16.0"), 2)
    with pytest.raises(PlanError, match="prebuilt engine"):
        choose_backend("llmapi", facts("1.0.0"), 2, mode="serve")


def test_llmapi_without_tensorrt_llm_runs_on_the_llm_api_double_and_says_so(tmp_path):
    assert choose_backend("auto", RuntimeFacts(), 2)[0] == "pytorch"  # the double only when asked for
    plan = make_plan(resolved(tmp_path, "runtime:\n  backend: llmapi\n"), RuntimeFacts(), artifacts_dir=tmp_path / "a")
    assert plan.backend == "llmapi" and plan.llm_api_double
    assert "LLM-API double" in plan.backend_reason and "TensorRT-LLM is not installed" in plan.backend_reason
    assert not make_plan(resolved(tmp_path), facts("1.0.0"), artifacts_dir=tmp_path / "b").llm_api_double


@pytest.mark.parametrize(
    "build_extra, extra",
    [
        ("", ""),
        ("quantization_type: fp8_kv\nmax_num_tokens: 8192\nexpert_parallel_count: 2", ""),
        ("", "runtime:\n  enable_kv_cache_reuse: true\n  enable_chunked_context: true\n"
             "  max_tokens_in_paged_kv_cache: 50000\n  batch_scheduler_policy: max_utilization\n"
             "  stream_interval: 4\n"),
    ],
)
def test_model_yaml_uses_only_names_nvidias_llm_api_accepts(tmp_path, build_extra, extra):
    config = resolved(tmp_path, extra, build_extra)
    document = model_yaml_document(config.trt_llm.build, config.trt_llm.runtime, "/models/ckpt", guide_engine="xgrammar")
    assert set(document) <= set(NAMES["llm_args"]), set(document) - set(NAMES["llm_args"])
    assert set(document["kv_cache_config"]) <= set(NAMES["kv_cache_config_fields"])
    assert document["kv_cache_config"].get("dtype", "auto") in NAMES["kv_cache_dtype_values"]
    assert set(document["scheduler_config"]) <= set(NAMES["scheduler_config_fields"])
    assert document["scheduler_config"]["capacity_scheduler_policy"] in NAMES["capacity_scheduler_policy_members"]
    assert document["dtype"] in NAMES["dtype_values"] and document["backend"] in NAMES["backend_values"]
    assert document["max_seq_len"] == 4000 and document["tensor_parallel_size"] == 2


def test_model_yaml_carries_the_typed_settings(tmp_path):
    config = resolved(
        tmp_path,
        "runtime:\n  enable_kv_cache_reuse: true\n  kv_cache_free_gpu_mem_fraction: 0.75\n",
        "quantization_type: fp8_kv\nexpert_parallel_count: 2\nmax_num_tokens: 4096",
    )
    document = model_yaml_document(config.trt_llm.build, config.trt_llm.runtime, "/m")
    assert document["kv_cache_config"] == {"free_gpu_memory_fraction": 0.75, "enable_block_reuse": True, "dtype": "fp8"}
    assert document["stream_interval"] == 1  # said either way: the file shows what runs
    assert (document["moe_expert_parallel_size"], document["max_num_tokens"]) == (2, 4096)


def test_rendered_repository_is_the_ensemble_layout_with_our_llmapi_model_and_model_yaml(tmp_path):
    config = resolved(tmp_path)
    plan = make_plan(config, facts("1.0.0"), artifacts_dir=tmp_path / "a")
    repo = render_repository(plan, tmp_path / "repo")
    assert sorted(p.name for p in repo.iterdir() if not p.name.startswith(".")) == [
        "ensemble", "ensemble_ids", "postprocessing", "preprocessing", "tensorrt_llm"
    ]
    config_pbtxt = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'backend: "python"' in config_pbtxt and '"llm_api"' in config_pbtxt and '"tensorrt_llm"' in config_pbtxt
    assert "tensorrt_llm_llmapi" in (repo / "tensorrt_llm" / "1" / "model.py").read_text() or "llm_request" in (
        repo / "tensorrt_llm" / "1" / "model.py"
    ).read_text()
    rendered = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert rendered["model"] == str((tmp_path / "ckpt").resolve())
    assert rendered == model_yaml_document(
        config.trt_llm.build, config.trt_llm.runtime, plan.model_dir, guide_engine="xgrammar"
    )


def test_settings_that_would_do_nothing_are_refused_per_backend_and_version(tmp_path):
    with pytest.raises(PlanError, match=r"runtime\.max_num_sequences: not used by backend llmapi"):
        make_plan(resolved(tmp_path, "runtime:\n  max_num_sequences: 4\n"), facts("1.0.0"), artifacts_dir=tmp_path)
    # The stand-in's own settings do nothing on llmapi (the LLM-API double reads only the guide whitespace).
    with pytest.raises(PlanError, match=r"runtime\.pytorch\.synthetic: a setting of the CPU stand-in"):
        make_plan(resolved(tmp_path, "runtime:\n  pytorch:\n    synthetic: {step_time_ms: 2}\n"), facts("1.0.0"), artifacts_dir=tmp_path)
    ensemble_side = resolved(tmp_path, "runtime:\n  preprocessing_instance_count: 4\n  pytorch:\n    guided_whitespace: flexible\n")
    assert backend_setting_problems(ensemble_side.trt_llm, "llmapi", "1.0.0") == []  # rendered for llmapi too
    with pytest.raises(PlanError, match=r"plugin_configuration\.tokens_per_block: a TensorRT engine build option"):
        make_plan(
            resolved(tmp_path, build_extra="plugin_configuration:\n  tokens_per_block: 32"), facts("1.0.0"),
            artifacts_dir=tmp_path,
        )
    trt = resolved(tmp_path, "runtime:\n  max_num_sequences: 8\n", "plugin_configuration:\n  multi_block_mode: true\n"
                   "  use_custom_all_reduce: true").trt_llm
    on_016 = backend_setting_problems(trt, "tensorrtllm", "0.16.0")
    assert [p.split(":")[0].rsplit(".", 1)[1] for p in on_016] == [
        "max_num_sequences", "multi_block_mode", "use_custom_all_reduce"
    ]
    on_012 = backend_setting_problems(trt, "tensorrtllm", "0.12.0")  # both were trtllm-build flags then
    assert [p.split(":")[0].rsplit(".", 1)[1] for p in on_012] == ["max_num_sequences"]
    assert backend_setting_problems(trt, "pytorch", "0.16.0") == []  # the stand-in reads max_num_sequences


def test_stream_interval_reaches_llmapi_and_the_stand_in_and_is_refused_by_the_cpp_backend(tmp_path):
    trt = resolved(tmp_path, "runtime:\n  stream_interval: 8\n").trt_llm
    assert model_yaml_document(trt.build, trt.runtime, "/m")["stream_interval"] == 8
    assert backend_setting_problems(trt, "llmapi", "1.0.0") == []
    assert backend_setting_problems(trt, "pytorch", "0.16.0") == []
    (problem,) = backend_setting_problems(trt, "tensorrtllm", "0.21.0")
    assert problem.startswith("model_metadata.trt_llm.runtime.stream_interval: NVIDIA's C++ backend")


def test_llmapi_runs_one_tritonserver_process_whatever_the_world_size(tmp_path):
    plan = make_plan(resolved(tmp_path), facts("1.0.0"), artifacts_dir=tmp_path / "a")
    assert plan.world_size == 2 and plan.tritonserver_ranks == 1
    engine = make_plan(resolved(tmp_path), facts("0.16.0"), artifacts_dir=tmp_path / "a")
    assert engine.tritonserver_ranks == 2


def test_guided_decoding_reaches_the_llm_api_through_model_yaml(tmp_path):
    """Our model passes guides as SamplingParams(guided_decoding=...): model.yaml names the engine the LLM
    API uses for them (auto: xgrammar, the LLM API having no default: llm_args.py's None is off;
    llguidance as set); `none` leaves it out (guided requests are then a 400)."""
    plan = make_plan(resolved(tmp_path), facts("1.0.0"), artifacts_dir=tmp_path / "a")
    assert plan.backend == "llmapi" and plan.guided_decoding_off is None
    from trtllm_truss.repository.llmapi import plan_llm_args

    assert plan_llm_args(plan)["guided_decoding_backend"] == "xgrammar"
    off = make_plan(resolved(tmp_path, "runtime:\n  guided_decoding_backend: none\n"), facts("1.0.0"), artifacts_dir=tmp_path / "b")
    assert "guided_decoding_backend" not in plan_llm_args(off)
    for setting in ("xgrammar", "llguidance"):
        chosen = make_plan(
            resolved(tmp_path, f"runtime:\n  guided_decoding_backend: {setting}\n"), facts("1.0.0"), artifacts_dir=tmp_path / setting
        )
        assert plan_llm_args(chosen)["guided_decoding_backend"] == setting


def test_guided_whitespace_reaches_the_stand_in_and_the_double_never_model_yaml(tmp_path):
    """runtime.pytorch.guided_whitespace is the stand-in's (compact by default): a parameter of the pytorch
    engine model and of the llmapi model where it runs the double, never an LLM() argument in model.yaml."""
    from trtllm_truss.engine_standin.settings import StandinSettings
    from trtllm_truss.repository import repository_configs
    from trtllm_truss.repository.llmapi import plan_llm_args

    flexible = "runtime:\n  backend: {}\n  pytorch:\n    guided_whitespace: flexible\n"
    double = make_plan(resolved(tmp_path, flexible.format("llmapi")), RuntimeFacts(), artifacts_dir=tmp_path / "a")
    assert double.llm_api_double and repository_configs(double)["tensorrt_llm"].parameter_dict["guided_whitespace"] == "flexible"
    assert not any("whitespace" in key for key in plan_llm_args(double))
    real = make_plan(resolved(tmp_path, flexible.format("llmapi")), facts("1.0.0"), artifacts_dir=tmp_path / "b")
    assert "guided_whitespace" not in repository_configs(real)["tensorrt_llm"].parameter_dict
    for extra, expected in ((flexible.format("pytorch"), "flexible"), ("runtime:\n  backend: pytorch\n", "compact")):
        plan = make_plan(resolved(tmp_path, extra), RuntimeFacts(), artifacts_dir=tmp_path / expected)
        params = repository_configs(plan)["tensorrt_llm"].parameter_dict
        assert params["guided_whitespace"] == expected
        assert StandinSettings.from_parameters({**params, "model_dir": "m"}).guided_whitespace == expected
    with pytest.raises(ValueError, match="parameters.guided_whitespace: 'loose'"):
        StandinSettings.from_parameters({"model_dir": "m", "guided_whitespace": "loose"})


@pytest.mark.torch  # the double builds the stand-in's engine (torch is imported with it)
def test_synthetic_engine_reaches_the_double_as_the_stand_ins_parameters_never_model_yaml(tmp_path):
    """runtime.pytorch.synthetic on backend llmapi (to bench the llmapi path, docs/performance.md): allowed
    where the LLM-API double runs, written as the stand-in's own parameter names on our llmapi model, read
    into the double's stand-in settings; refused where TensorRT-LLM runs (it would do nothing there)."""
    from trtllm_truss.engine_standin.llmapi_double import LLM, applied_summary
    from trtllm_truss.repository import repository_configs
    from trtllm_truss.repository.llmapi import plan_llm_args
    from trtllm_truss.triton_models.tensorrt_llm_llmapi.llm_request import double_settings

    extra = "runtime:\n  backend: llmapi\n  pytorch:\n    synthetic: {step_time_ms: 2.5}\n"
    double = make_plan(resolved(tmp_path, extra), RuntimeFacts(), artifacts_dir=tmp_path / "a")
    params = repository_configs(double)["tensorrt_llm"].parameter_dict
    assert (params["synthetic"], params["synthetic_step_time_ms"]) == ("true", "2.5")
    assert not any("synthetic" in key for key in plan_llm_args(double))
    assert double_settings(params)["double_synthetic_step_time_ms"] == 2.5
    plain = make_plan(resolved(tmp_path, "runtime:\n  backend: llmapi\n"), RuntimeFacts(), artifacts_dir=tmp_path / "b")
    plain_params = repository_configs(plain)["tensorrt_llm"].parameter_dict
    assert "synthetic" not in plain_params and "double_synthetic_step_time_ms" not in double_settings(plain_params)
    with pytest.raises(PlanError, match=r"runtime\.pytorch\.synthetic: a setting of the CPU stand-in"):
        make_plan(resolved(tmp_path, extra), facts("1.0.0"), artifacts_dir=tmp_path / "c")
    # The double builds the stand-in's synthetic engine from it and says so in its startup line.
    args = plan_llm_args(double)
    llm = LLM(**args, double_synthetic_step_time_ms=2.5)
    try:
        assert llm.settings.synthetic and llm.settings.synthetic_step_time_ms == 2.5
        assert llm.executor.info["engine"] == "SyntheticEngine"  # built in the executor worker process
        assert "SYNTHETIC engine (2.5 ms steps" in applied_summary(llm, args)
    finally:
        llm.shutdown()


@pytest.mark.torch  # the double's executor runs the embedded model with its peft adapter
def test_the_doubles_adapters_are_named_by_their_lora_id_so_any_folder_works(tmp_path):
    """TensorRT-LLM keys an adapter by its LoRARequest (lora_int_id), never by its folder: a folder whose path
    holds a dot (`/tmp/tmp.x1/my-truss/...`) once made peft refuse the double's adapter name ("module name
    can't contain '.'"), so a truss at such a path did not start."""
    import asyncio
    import shutil

    from trtllm_truss.engine_standin.llmapi_double import LLM, LoRARequest, SamplingParams

    repo = Path(__file__).resolve().parents[2]
    adapter = tmp_path / "tmp.x1" / "my.truss" / "pirate.v1"
    shutil.copytree(repo / "data" / "embedded-lora" / "pirate", adapter)
    llm = LLM(model=str(repo / "data" / "embedded-llama"), max_batch_size=2, max_seq_len=256,
              lora_config={"lora_dir": [str(adapter)], "max_lora_rank": 8})
    try:
        async def greedy(lora: LoRARequest | None) -> list[int]:
            params = SamplingParams(max_tokens=8, top_k=1, end_id=-1)
            result = await llm.generate_async(inputs=[1, 450, 1996], sampling_params=params, lora_request=lora).aresult()
            return result.outputs[0].token_ids

        base = asyncio.run(greedy(None))
        pirate = asyncio.run(greedy(LoRARequest(lora_name="pirate", lora_int_id=1, lora_path=str(adapter))))
        assert len(base) == len(pirate) == 8 and base != pirate  # the adapter ran
    finally:
        llm.shutdown()


@pytest.mark.torch  # the double's executor worker builds the stand-in's engine
@pytest.mark.parametrize("setting, waiting", [(None, 20000), (5000, 5000), (0, None)])
def test_the_doubles_dispatch_thread_waits_under_the_gen0_gc_threshold_as_tensorrt_llms_proxy(setting, waiting):
    """TensorRT-LLM's proxy waits for each worker message under `customized_gc_thresholds(
    garbage_collection_gen0_threshold)` (an LLM() argument, 20,000 by default; 0 leaves Python's), so the
    LLM's process runs with that gen-0 threshold while its dispatch thread waits: most of the time. The double
    keeps that setting of TensorRT-LLM's process, and its LLM() argument is applied, not ignored."""
    import gc

    from trtllm_truss.engine_standin.llmapi_double import LLM

    repo = Path(__file__).resolve().parents[2]
    default = gc.get_threshold()
    args = {} if setting is None else {"garbage_collection_gen0_threshold": setting}
    llm = LLM(model=str(repo / "data" / "embedded-llama"), max_batch_size=2, max_seq_len=64,
              double_synthetic_step_time_ms=2.0, **args)
    try:
        assert "garbage_collection_gen0_threshold" not in llm.not_applied
        deadline = time.monotonic() + (10 if waiting else 1)  # 0: a second of waits sets nothing
        seen = set()
        while time.monotonic() < deadline and (waiting is None or waiting not in seen):
            seen.add(gc.get_threshold()[0])
            time.sleep(0.005)  # sampling what the dispatch thread set, not a synchronisation
        if waiting is None:
            assert seen == {default[0]}
        else:
            assert waiting in seen
    finally:
        llm.shutdown()
        gc.set_threshold(*default)
