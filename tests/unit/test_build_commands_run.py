"""Running a build plan end to end with the TensorRT-LLM builder TEST DOUBLE (tests/fakes).

The plan's real argv is executed: NVIDIA's scripts are replaced by the fake (which writes a
TensorRT-LLM checkpoint, then a new-layout engine), so streaming, failures, redaction, the engine
cache and `prepare_artifacts` integration are exercised for real.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import textwrap
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS_DIR))

from trtllm_truss.artifacts.build import plan_build  # noqa: E402
from trtllm_truss.artifacts.build_runner import BuildStepError, run_build_plan  # noqa: E402
from trtllm_truss.artifacts.engine_builder import EngineBuilder  # noqa: E402
from trtllm_truss.config.build import BuildConfig  # noqa: E402

EMBEDDED = TESTS_DIR.parent / "data" / "embedded-llama"


def _wrapper(step: str) -> str:
    return textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        sys.path.insert(0, {str(TESTS_DIR)!r})
        from fakes.fake_trtllm_build import main
        sys.exit(main({step!r}, sys.argv[1:]))
        """)


@pytest.fixture()
def fake_toolchain(tmp_path: Path) -> tuple[Path, Path]:
    """(examples_dir, trtllm-build executable), both the test double."""
    examples = tmp_path / "examples"
    for relative in ("models/core/llama/convert_checkpoint.py", "quantization/quantize.py"):
        script = examples / relative
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(_wrapper(relative.rsplit("/", 1)[-1].removesuffix(".py")))
    trtllm_build = tmp_path / "bin" / "trtllm-build"
    trtllm_build.parent.mkdir()
    trtllm_build.write_text(_wrapper("trtllm-build"))
    trtllm_build.chmod(trtllm_build.stat().st_mode | stat.S_IXUSR)
    return examples, trtllm_build


def _config(**extra) -> BuildConfig:
    return BuildConfig(base_model_architecture="llama", huggingface_ckpt_repository="owner/m", max_input_len=64,
                       max_output_len=32, max_batch_size=4, **extra)


def _plan(tmp_path: Path, toolchain, **extra):
    examples, trtllm_build = toolchain
    return plan_build(_config(**extra), trtllm_version="0.21.0", checkpoint_dir=tmp_path / "ckpt",
                      output_dir=tmp_path / "engine", work_dir=tmp_path / "work", examples_dir=examples,
                      trtllm_build=str(trtllm_build))


def test_plan_runs_and_streams_prefixed_lines(tmp_path: Path, fake_toolchain) -> None:
    lines: list[str] = []
    plan = _plan(tmp_path, fake_toolchain, tensor_parallel_count=2, pipeline_parallel_count=2)
    run_build_plan(plan, sink=lines.append, log_prefix="[build] ")
    assert all(line.startswith("[build] ") for line in lines)
    assert "[build] convert_checkpoint: [fake convert_checkpoint] working 0" in lines
    assert "[build] trtllm-build: [fake trtllm-build] working 2" in lines
    config = json.loads((tmp_path / "engine" / "config.json").read_text())
    assert config["pretrained_config"]["mapping"] == {"world_size": 4, "tp_size": 2, "pp_size": 2}
    assert config["build_config"]["max_seq_len"] == 96
    assert sorted(p.name for p in (tmp_path / "engine").glob("rank*.engine")) == [f"rank{r}.engine" for r in range(4)]


def test_failed_step_reports_its_log_tail(tmp_path: Path, fake_toolchain) -> None:
    lines: list[str] = []
    env = {**os.environ, "FAKE_TRTLLM_FAIL": "trtllm-build"}
    with pytest.raises(BuildStepError) as failure:
        run_build_plan(_plan(tmp_path, fake_toolchain), env=env, sink=lines.append, tail_lines=3)
    error = failure.value
    assert error.step.name == "trtllm-build" and error.returncode == 3
    assert error.log_tail[-1] == "[fake trtllm-build] error: out of memory while building" and len(error.log_tail) == 3
    assert "exit code 3" in str(error) and "out of memory" in str(error) and "--checkpoint_dir" in str(error)


def test_missing_program_is_a_step_error(tmp_path: Path, fake_toolchain) -> None:
    examples, _ = fake_toolchain
    plan = plan_build(_config(), trtllm_version="0.21.0", checkpoint_dir=tmp_path, output_dir=tmp_path / "e",
                      work_dir=tmp_path / "w", examples_dir=examples, trtllm_build=str(tmp_path / "nope"))
    with pytest.raises(BuildStepError, match="cannot start"):
        run_build_plan(plan, sink=lambda line: None)


@pytest.mark.parametrize("echoed", ["HF_TOKEN", "COPIED_TOKEN", "TOKEN_IN_TEXT"])
def test_token_is_kept_from_build_steps_and_redacted_from_build_logs(tmp_path: Path, fake_toolchain, echoed) -> None:
    token = "hf_abcdefghijklmnopqrstuvwxyz012345"
    lines: list[str] = []
    env = {
        **os.environ,
        "HF_TOKEN": token,
        "COPIED_TOKEN": token,  # a secret's value under another name is stripped too
        "TOKEN_IN_TEXT": f"prefix-{token}",  # kept (not a secret's value), but redacted when printed
        "FAKE_TRTLLM_ECHO_ENV": echoed,
        "FAKE_TRTLLM_FAIL": "trtllm-build",
    }
    with pytest.raises(BuildStepError) as failure:
        run_build_plan(_plan(tmp_path, fake_toolchain), env=env, sink=lines.append, secrets=(token,))
    expected = {"HF_TOKEN": "HF_TOKEN=", "COPIED_TOKEN": "COPIED_TOKEN=", "TOKEN_IN_TEXT": "TOKEN_IN_TEXT=prefix-***"}
    assert any(line.endswith(expected[echoed]) for line in lines), lines
    assert token not in "\n".join(lines) and token not in str(failure.value)


def _truss(tmp_path: Path, *, tp: int = 1) -> Path:
    truss = tmp_path / "truss"
    truss.mkdir()
    checkpoint = truss / "ckpt"
    shutil.copytree(EMBEDDED, checkpoint, ignore=shutil.ignore_patterns("model.safetensors"))
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 64)  # content only matters for the fingerprint
    (truss / "config.yaml").write_text(textwrap.dedent(f"""\
        model_name: t
        resources:
          accelerator: H100:{tp}
        model_metadata:
          trt_llm:
            build:
              base_model_architecture: llama
              huggingface_ckpt_repository: ckpt
              max_input_len: 64
              max_output_len: 32
              max_batch_size: 4
              tensor_parallel_count: {tp}
            runtime:
              backend: tensorrtllm
        """))
    return truss


def _facts(gpus: int):
    from trtllm_truss.planning.probe import GpuInfo, RuntimeFacts

    return RuntimeFacts(gpus=(GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 81559),) * gpus, trtllm_version="0.21.0",
                        tensorrt_version="10.11.0", trtllm_unavailable_reason=None)


def test_engine_builder_builds_once_and_prepare_artifacts_verifies(tmp_path: Path, fake_toolchain) -> None:
    from trtllm_truss.artifacts.prepare import prepare_artifacts
    from trtllm_truss.config import load_config
    from trtllm_truss.planning.plan import make_plan

    examples, trtllm_build = fake_toolchain
    truss = _truss(tmp_path, tp=2)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "TRUSS_SECRET_hf_access_token")}
    plan = make_plan(load_config(truss, environ=env), _facts(2), artifacts_dir=tmp_path / "artifacts", environ=env)
    lines: list[str] = []
    builder = EngineBuilder(environ=env, examples_dir=examples, trtllm_build=str(trtllm_build), sink=lines.append)

    first = builder.acquire(plan)
    assert first.source == "built" and first.file_count == 4 and len(first.key) == 64
    record = json.loads((first.engine_dir / "trtllm_truss_build.json").read_text())
    assert record["gpu"] == {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
    assert record["cache_key"] == first.key and record["trtllm_version"] == "0.21.0"
    assert first.engine_dir == tmp_path / "artifacts" / "engines" / "entries" / first.key / "engine"
    assert first.key_inputs["tensorrt_llm_version"] == "0.21.0" and first.key_inputs["tensor_parallel"] == 2
    assert any(line.startswith("[engine-build] trtllm-build:") for line in lines)

    again = EngineBuilder(environ=env, examples_dir=examples, trtllm_build=str(trtllm_build), sink=lines.append)
    second = again.acquire(plan)
    assert second.source == "local" and second.key == first.key and second.engine_dir == first.engine_dir

    final, _ = prepare_artifacts(plan, environ=env, build_engine=again)
    assert final.engine_dir == first.engine_dir and final.max_input_len == 64 and final.max_batch_size == 4


def test_changed_checkpoint_changes_the_key(tmp_path: Path, fake_toolchain) -> None:
    from trtllm_truss.config import load_config
    from trtllm_truss.planning.plan import make_plan

    examples, trtllm_build = fake_toolchain
    truss = _truss(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "TRUSS_SECRET_hf_access_token")}
    builder = EngineBuilder(environ=env, examples_dir=examples, trtllm_build=str(trtllm_build), sink=lambda line: None)
    plan = lambda: make_plan(load_config(truss, environ=env), _facts(1), artifacts_dir=tmp_path / "a", environ=env)  # noqa: E731
    before = builder.acquire(plan())
    (truss / "ckpt" / "model.safetensors").write_bytes(b"\1" * 64)  # new weights, same path
    after = builder.acquire(plan())
    assert after.key != before.key and after.source == "built"


def test_cli_dry_run_prints_the_commands(tmp_path: Path, capsys) -> None:
    from trtllm_truss.cli import main

    truss = _truss(tmp_path)
    (truss / "config.yaml").write_text((truss / "config.yaml").read_text().replace("backend: tensorrtllm", "backend: auto"))
    assert main(["build", str(truss), "--dry-run", "--trtllm-version", "0.21.0"]) == 0
    out = capsys.readouterr().out
    assert "cache key" in out and "convert_checkpoint.py --model_dir" in out and "trtllm-build --checkpoint_dir" in out
    # 1.x with backend auto: NVIDIA's LLM API loads the checkpoint; the dry run prints the model.yaml.
    assert main(["build", str(truss), "--dry-run", "--trtllm-version", "1.2.0"]) == 0
    out = capsys.readouterr().out
    assert "(llmapi): no engine build" in out and "tensor_parallel_size:" in out and "guided_decoding_backend: xgrammar" in out
    # 1.x with an engine asked for: the LLM API engine build.
    (truss / "config.yaml").write_text((truss / "config.yaml").read_text().replace("backend: auto", "backend: tensorrtllm"))
    assert main(["build", str(truss), "--dry-run", "--trtllm-version", "1.2.0"]) == 0
    assert "trtllm_truss.artifacts.llmapi_build" in capsys.readouterr().out


LLMAPI_DOUBLE = TESTS_DIR / "fakes" / "trtllm_llmapi_double"


def test_llm_api_flow_runs_against_the_api_double(tmp_path: Path) -> None:
    """1.x: `python -m trtllm_truss.artifacts.llmapi_build SPEC` constructs BuildConfig / QuantConfig /
    CalibConfig / LLM with only recorded names (the double rejects any other) and saves an engine."""
    config = _config(quantization_type="weights_kv_int8", tensor_parallel_count=2,
                     plugin_configuration={"use_fused_mlp": True})
    plan = plan_build(config, trtllm_version="1.2.0", checkpoint_dir=tmp_path / "ckpt", output_dir=tmp_path / "engine",
                      work_dir=tmp_path / "work")
    record = tmp_path / "record.json"
    packages = str(TESTS_DIR.parent / "packages")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(LLMAPI_DOUBLE), packages]), "FAKE_TRTLLM_RECORD": str(record)}
    lines: list[str] = []
    run_build_plan(plan, env=env, sink=lines.append)
    assert "[engine-build] llm_api_save: [fake LLM] building engine" in lines
    call = json.loads(record.read_text())
    assert call == {
        "model": str(tmp_path / "ckpt"), "tensor_parallel_size": 2, "kv_cache_type": "PAGED",
        "quant_algo": "W8A16", "kv_cache_quant_algo": "INT8", "calib": {"calib_batches": 512, "calib_batch_size": 1},
        "plugin": {"gemm_plugin": "float16", "gpt_attention_plugin": "float16", "tokens_per_block": 64,
                   "use_fused_mlp": True, "use_paged_context_fmha": True},
    }
    engine = json.loads((tmp_path / "engine" / "config.json").read_text())
    assert engine["version"] == "1.2.0" and engine["pretrained_config"]["mapping"]["tp_size"] == 2


def test_api_double_rejects_unknown_names(tmp_path: Path) -> None:
    """The double is strict, so the test above can fail: a misspelt BuildConfig field is an error."""
    from trtllm_truss.artifacts.build import BuildStep, BuildPlan, LlmApiSpec

    spec = LlmApiSpec(model="m", output_dir=str(tmp_path / "e"), dtype="float16", tensor_parallel_size=1,
                      pipeline_parallel_size=1, build_config={"max_output_len": 8}, plugin_config={}, quant_config={},
                      calib_config=None)
    step = BuildStep("llm_api_save", (sys.executable, "-m", "trtllm_truss.artifacts.llmapi_build", spec.to_json()))
    plan = BuildPlan("1.2.0", "llm_api", tmp_path, tmp_path / "e", (step,), spec)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(LLMAPI_DOUBLE), str(TESTS_DIR.parent / "packages")])}
    with pytest.raises(BuildStepError) as failure:
        run_build_plan(plan, env=env, sink=lambda line: None)
    assert "unexpected argument(s) ['max_output_len']" in "\n".join(failure.value.log_tail)


def test_key_follows_build_fields_and_runtime_version_not_runtime_knobs(tmp_path: Path) -> None:
    import dataclasses

    from trtllm_truss.config import load_config
    from trtllm_truss.planning.plan import make_plan

    truss = _truss(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "TRUSS_SECRET_hf_access_token")}
    builder = EngineBuilder(environ=env, sink=lambda line: None)

    def key(text_edit=None, facts=None) -> str:
        if text_edit:
            path = truss / "config.yaml"
            path.write_text(path.read_text().replace(*text_edit))
        plan = make_plan(load_config(truss, environ=env), facts or _facts(1), artifacts_dir=tmp_path / "a", environ=env)
        return builder.cache_key(plan)[0]

    base = key()
    assert key(("backend: tensorrtllm", "backend: tensorrtllm\n      kv_cache_free_gpu_mem_fraction: 0.5")) == base
    assert key(facts=dataclasses.replace(_facts(1), trtllm_version="0.20.0")) != base
    assert key(("max_batch_size: 4", "max_batch_size: 8")) != base


def test_token_never_enters_the_key(tmp_path: Path) -> None:
    from trtllm_truss.config import load_config
    from trtllm_truss.planning.plan import make_plan

    truss = _truss(tmp_path)
    token = "hf_zyxwvutsrqponmlkjihgfedcba987654"
    clean = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "TRUSS_SECRET_hf_access_token")}
    plan = make_plan(load_config(truss, environ=clean), _facts(1), artifacts_dir=tmp_path / "a", environ=clean)
    without = EngineBuilder(environ=clean).cache_key(plan)
    with_token = EngineBuilder(environ={**clean, "HF_TOKEN": token}).cache_key(plan, token=token)
    assert with_token[0] == without[0] and token not in json.dumps(with_token[1])


def test_cli_builds_then_reuses(tmp_path: Path, fake_toolchain, monkeypatch, capsys) -> None:
    import trtllm_truss.planning.probe
    from trtllm_truss.cli import main

    examples, trtllm_build = fake_toolchain
    truss = _truss(tmp_path)
    monkeypatch.setattr(trtllm_truss.planning.probe, "probe_facts", lambda **kwargs: _facts(1))
    monkeypatch.setenv("PATH", f"{trtllm_build.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TRTLLM_TRUSS_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main(["build", str(truss), "--examples-dir", str(examples)]) == 0
    first = capsys.readouterr().out
    assert "engine built" in first and "cache key : " in first and "in 3 files" in first
    assert main(["build", str(truss), "--examples-dir", str(examples)]) == 0
    second = capsys.readouterr().out
    assert "engine found in the cache" in second
    key = lambda text: next(line for line in text.splitlines() if "cache key" in line)  # noqa: E731
    assert key(first) == key(second)


def test_missing_examples_fail_only_when_a_build_must_run_and_name_the_setting(tmp_path: Path, fake_toolchain) -> None:
    """An image without NVIDIA's examples/ (Triton 24.12, tensorrtllm_backend issue 739) cannot build on
    0.x: the error names TRTLLM_EXAMPLES_DIR. An engine already in the cache starts without them."""
    from trtllm_truss.artifacts.build_recipes import BuildPlanError
    from trtllm_truss.artifacts.engine_builder import EXAMPLES_DIR_CANDIDATES
    from trtllm_truss.config import load_config
    from trtllm_truss.planning.plan import make_plan

    if any(path.is_dir() for path in EXAMPLES_DIR_CANDIDATES):
        pytest.skip("this machine has NVIDIA's examples in a known place")
    examples, trtllm_build = fake_toolchain
    truss = _truss(tmp_path, tp=1)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "TRUSS_SECRET_hf_access_token", "TRTLLM_EXAMPLES_DIR")}
    plan = make_plan(load_config(truss, environ=env), _facts(1), artifacts_dir=tmp_path / "artifacts", environ=env)
    no_examples = EngineBuilder(environ=env, trtllm_build=str(trtllm_build), sink=lambda line: None)
    with pytest.raises(BuildPlanError, match=r"set TRTLLM_EXAMPLES_DIR to the examples directory"):
        no_examples.acquire(plan)
    built = EngineBuilder(environ=env, examples_dir=examples, trtllm_build=str(trtllm_build), sink=lambda line: None)
    assert built.acquire(plan).source == "built"
    cached = EngineBuilder(environ=env, trtllm_build=str(trtllm_build), sink=lambda line: None).acquire(plan)
    assert cached.source == "local"
