"""Every declared secret's value, whatever its shape, is hidden from what validate/build/serve print or log,
and kept out of child processes' environments (`trtllm_truss.config.child_env`)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import yaml
from trtllm_truss.config.child_env import child_environment
from trtllm_truss.cli import main
from trtllm_truss.config import ConfigError, load_config
from trtllm_truss.config import secrets as config_secrets
from trtllm_truss.config.errors import (
    RedactingFilter,
    forget_secret_values,
    known_secret_values,
    redact,
)
from trtllm_truss.config.secrets import secret_values
from truss.templates.shared.secrets_resolver import (
    Secrets,  # truss's own mapping, as a model receives it
)

EMBEDDED = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"

# None of these looks like an `hf_` token: the old redaction let all of them through.
ENV_SECRET = "plainsecret99"  # TRUSS_SECRET_db_password
FILE_SECRET = "mounted-Value-42"  # /secrets/api_key
INLINE_SECRET = "inline7777"  # a default under config.yaml `secrets:`


@pytest.fixture(autouse=True)
def fresh_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """No remembered values from other tests; /secrets is a directory of this test's."""
    for name in list(os.environ):
        if name.startswith(("TRTLLM_", "OPTION_", "TRUSS_SECRET_")) or name in config_secrets.CREDENTIAL_VARIABLES:
            monkeypatch.delenv(name)
    mount = tmp_path / "mounted-secrets"
    mount.mkdir()
    (mount / "api_key").write_text(FILE_SECRET + "\n")
    monkeypatch.setattr(config_secrets, "SECRETS_MOUNT_DIR", mount)
    monkeypatch.setenv("TRUSS_SECRET_db_password", ENV_SECRET)
    forget_secret_values()
    yield
    forget_secret_values()


def write_truss(root: Path, trt_llm: dict, *, secrets: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    declared = {"db_password": None, "api_key": None, **(secrets or {})}
    config = {"model_name": "t", "secrets": declared, "model_metadata": {"trt_llm": trt_llm}}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    return root


def test_secret_values_come_from_where_truss_finds_them(tmp_path: Path):
    values = secret_values({"db_password": None, "api_key": None, "inline": INLINE_SECRET, "unset": None})
    assert {ENV_SECRET, FILE_SECRET, FILE_SECRET + "\n", INLINE_SECRET} <= values
    # truss's mapping raises SecretNotFound for a secret without a value: that is "no value", not an error
    mapping = Secrets({"from_mapping": "mapped-secret-1", "missing": None})
    assert "mapped-secret-1" in secret_values(["from_mapping", "missing"], secrets=mapping, environ={})
    # credential variables count whatever their name was declared as
    assert "aws-key" in secret_values([], environ={"AWS_SECRET_ACCESS_KEY": "aws-key", "HOME": "/root"})
    assert "/root" not in secret_values([], environ={"HOME": "/root"})


def test_validate_hides_every_declared_secret_value(tmp_path: Path, capsys):
    truss = write_truss(
        tmp_path / "t",
        {
            "serve": {
                "engine_repository": f"org/{ENV_SECRET}",
                "engine_revision": FILE_SECRET,
                "tokenizer_repository": INLINE_SECRET,
            },
            # a CPU deployment (no resources.accelerator) runs the stand-in, which validate's plan requires a model for
            "runtime": {"pytorch": {"model": "org/tiny"}},
        },
        secrets={"inline": INLINE_SECRET},
    )
    assert main(["validate", str(truss)]) == 0
    captured = capsys.readouterr()
    text = captured.out + captured.err
    for value in (ENV_SECRET, FILE_SECRET, INLINE_SECRET):
        assert value not in text, value
    assert "org/***" in text  # the row is still there, its secret part hidden


def test_validate_errors_hide_secret_values(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch):
    truss = write_truss(tmp_path / "t", {"serve": {"engine_repository": "org/engine"}})
    monkeypatch.setenv("TRTLLM_SERVE__TENSOR_PARALLEL_COUNT", ENV_SECRET)
    monkeypatch.setenv("TRTLLM_SERVE__PIPELINE_PARALLEL_COUNT", FILE_SECRET)
    assert main(["validate", str(truss)]) == 1
    err = capsys.readouterr().err
    assert "model_metadata.trt_llm.serve.tensor_parallel_count" in err
    assert "model_metadata.trt_llm.serve.pipeline_parallel_count" in err
    assert ENV_SECRET not in err and FILE_SECRET not in err
    # and the exception itself, for any caller that prints it
    with pytest.raises(ConfigError) as info:
        load_config(truss)
    assert ENV_SECRET not in str(info.value) and FILE_SECRET not in str(info.value)


def test_build_dry_run_hides_secret_values(tmp_path: Path, capsys):
    truss = tmp_path / "t"
    checkpoint = truss / ENV_SECRET  # a local checkpoint whose path contains a secret's value
    shutil.copytree(EMBEDDED, checkpoint, ignore=shutil.ignore_patterns("model.safetensors"))
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 64)
    write_truss(
        truss,
        {
            "build": {
                "base_model_architecture": "llama",
                "huggingface_ckpt_repository": ENV_SECRET,
                "max_input_len": 64,
                "max_output_len": 32,
            }
        },
    )
    assert main(["build", str(truss), "--dry-run", "--trtllm-version", "0.21.0"]) == 0
    captured = capsys.readouterr()
    assert "trtllm-build --checkpoint_dir" in captured.out
    assert ENV_SECRET not in captured.out + captured.err


def test_serve_startup_errors_and_log_lines_hide_secret_values(tmp_path: Path):
    from trtllm_truss.commands.serve import _describe

    load_config(write_truss(tmp_path / "t", {"serve": {"engine_repository": "org/engine"}}))
    assert ENV_SECRET in known_secret_values() and FILE_SECRET in known_secret_values()
    assert _describe(RuntimeError(f"cannot fetch s3://bucket/{ENV_SECRET}/x")) == "cannot fetch s3://bucket/***/x"

    record = logging.LogRecord("t", logging.INFO, __file__, 1, "token %s in %r", (FILE_SECRET, "x"), None)
    RedactingFilter().filter(record)
    assert record.getMessage() == "token *** in 'x'"
    try:
        raise ValueError(f"bad {ENV_SECRET}")
    except ValueError:
        import sys

        failed = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    RedactingFilter().filter(failed)
    assert ENV_SECRET not in (failed.exc_text or "") and "bad ***" in (failed.exc_text or "")


def test_redact_hides_a_longer_value_whole():
    assert redact("abc-abcdef", ["abc", "abcdef"]) == "***-***"


def test_child_environment_drops_credentials_and_copies_of_secret_values(tmp_path: Path):
    load_config(write_truss(tmp_path / "t", {"serve": {"engine_repository": "org/engine"}}))
    base = {
        "PATH": "/usr/bin",
        "HF_HOME": "/cache/hf",
        "HF_TOKEN": "hf_tokenvalue123456",
        "HUGGING_FACE_HUB_TOKEN": "x1",
        "HF_HUB_TOKEN": "x2",
        "AWS_ACCESS_KEY_ID": "x3",
        "AWS_SECRET_ACCESS_KEY": "x4",
        "AWS_SESSION_TOKEN": "x5",
        "AWS_REGION": "us-east-1",
        "TRUSS_SECRET_anything": "x6",
        "DB_URL_PASSWORD": ENV_SECRET,  # a declared secret's value under another name
        "MOUNTED_COPY": FILE_SECRET + "\n",  # the same value, whitespace aside
        "EXTRA": "given-by-caller",
    }
    env = child_environment(base, secrets=["given-by-caller"])
    assert env == {"PATH": "/usr/bin", "HF_HOME": "/cache/hf", "AWS_REGION": "us-east-1"}
    # default: the process environment
    assert "TRUSS_SECRET_db_password" in os.environ and "TRUSS_SECRET_db_password" not in child_environment()
    with pytest.raises(TypeError, match="secret values"):
        child_environment(base, secrets=Secrets({"db_password": None}))  # names are not values
