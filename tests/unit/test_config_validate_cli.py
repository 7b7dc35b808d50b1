"""`trtllm-truss validate`: exit codes, the source of every value, error lines, no secret values."""

from __future__ import annotations

import importlib.util

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trtllm_truss.cli import main

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_" + "SeCrEtVaLuE" * 3


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch):
    """The command reads the process environment; keep the developer's own variables out."""
    for name in list(os.environ):
        if name.startswith(("TRTLLM_", "OPTION_", "HF_MODEL_ID", "TENSOR_PARALLEL_DEGREE", "PIPELINE_PARALLEL_DEGREE")):
            monkeypatch.delenv(name)


def write(root: Path, metadata: dict, **top) -> Path:
    (root / "config.yaml").write_text(yaml.safe_dump({"model_name": "cli", "model_metadata": metadata, **top}))
    return root


def test_valid_config_prints_values_and_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.setenv("TRTLLM_RUNTIME__PYTORCH__DEVICE", "cpu")
    monkeypatch.setenv("OPTION_MAX_OUTPUT_LEN", "99")
    root = write(
        tmp_path,
        {
            "trt_llm": {
                "build": {"base_model_architecture": "llama", "huggingface_ckpt_repository": "a/b", "max_input_len": 77}
            }
        },
        secrets={"hf_access_token": TOKEN},
    )
    assert main(["validate", str(root)]) == 0
    captured = capsys.readouterr()
    rows = {line.split("│")[1].strip(): line for line in captured.out.splitlines() if line.count("│") >= 4}
    assert "77" in rows["build.max_input_len"] and "file (config.yaml)" in rows["build.max_input_len"]
    assert "99" in rows["build.max_output_len"] and "OPTION_MAX_OUTPUT_LEN (DJL alias)" in rows["build.max_output_len"]
    assert "TRTLLM_RUNTIME__PYTORCH__DEVICE" in rows["runtime.pytorch.device"]
    assert "default" in rows["runtime.exclude_input_in_output"] and "False" in rows["runtime.exclude_input_in_output"]
    assert not any(key.startswith("build.smoothquant") for key in rows)  # unselected recipe hidden
    assert "secrets declared: hf_access_token" in captured.out
    assert "warning: secrets.hf_access_token" in captured.err
    assert TOKEN not in captured.out + captured.err


def test_invalid_config_exits_nonzero_with_one_line_per_problem(tmp_path: Path, capsys):
    root = write(
        tmp_path,
        {
            "trt_llm": {
                "build": {"base_model_architecture": "lama", "huggingface_ckpt_repository": "a/b", "max_beam_width": 0}
            }
        },
    )
    assert main(["validate", str(root)]) == 1
    err = capsys.readouterr().err
    assert "2 problem(s)" in err
    lines = err.splitlines()
    assert any(
        line.startswith("model_metadata.trt_llm.build.base_model_architecture: 'lama' is not allowed") for line in lines
    )
    assert any(line.startswith("model_metadata.trt_llm.build.max_beam_width:") for line in lines)


def test_console_script_on_the_root_config():
    """The real entry point, in a fresh process, on the shipped embedded default."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRTLLM_", "OPTION_"))}
    result = subprocess.run(
        [sys.executable, "-m", "trtllm_truss.cli", "validate", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "build.huggingface_ckpt_repository" in result.stdout and "data/embedded-llama" in result.stdout


def test_validate_says_which_parsers_the_chat_template_gets_and_refuses_unknown_ones(tmp_path: Path, monkeypatch, capsys):
    """The family found in a local checkpoint's chat template (tests/data/tool_families), the parsers it
    gives and why; a configured parser that does not exist is an error line naming the key (exit 1)."""
    monkeypatch.setenv("TRTLLM_RUNTIME__PYTORCH__DEVICE", "cpu")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "chat_template.jinja").write_text((ROOT / "tests/data/tool_families/qwen3_coder/chat_template_qwen3.5_0.8B.jinja").read_text())
    root = write(tmp_path, {"trt_llm": {"build": {"base_model_architecture": "llama", "huggingface_ckpt_repository": str(checkpoint)}}})
    assert main(["validate", str(root)]) == 0
    out = capsys.readouterr().out
    assert "# runtime.tool_call_parser: auto -> qwen3_coder (Qwen3-Coder / Qwen3.5: the chat template has '<tool_call>'" in out
    assert "# runtime.reasoning_parser: auto -> qwen3 (Qwen3-Coder / Qwen3.5:" in out
    # how a forced call is guided there: the family's own syntax where xgrammar builds its tag (Python 3.11)
    own = "# forced tool calls (tool_choice required / named): in the family's own syntax (xgrammar's 'qwen_3_coder' structural tag)"
    assert (own if importlib.util.find_spec("xgrammar") else "# forced tool calls (tool_choice required / named): JSON guide (xgrammar is not installed") in out

    write(tmp_path, {"trt_llm": {"build": {"base_model_architecture": "llama", "huggingface_ckpt_repository": str(checkpoint)},
                                 "runtime": {"tool_call_parser": "qwen9"}}})
    assert main(["validate", str(root)]) == 1
    err = capsys.readouterr().err
    assert "error: model_metadata.trt_llm.runtime.tool_call_parser: 'qwen9' is no parser; one of auto, none, deepseek_v3" in err

    (checkpoint / "chat_template.jinja").write_text("{% for tool in tools %}{{ tool | tojson }}{% endfor %}")
    write(tmp_path, {"trt_llm": {"build": {"base_model_architecture": "llama", "huggingface_ckpt_repository": str(checkpoint)}}})
    assert main(["validate", str(root)]) == 0
    captured = capsys.readouterr()
    assert "runtime.tool_call_parser: auto -> none" in captured.out and "set runtime.tool_call_parser" in captured.err
