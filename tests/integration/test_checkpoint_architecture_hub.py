"""`validate` reads a hub checkpoint's config.json (only that file) from a real HF-protocol hub (olah on loopback),
with the hf_access_token secret for a gated repository, and checks its architecture against the deployment's
TensorRT-LLM (TensorRT-LLM 1.2.1 here: the 26.07 image of examples/llama3.1-8b-fp8-h100)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fixtures_hubs import PRIVATE_ORG, HubServer, hub_fixture  # noqa: F401 - session fixture
from trtllm_truss.cli import main

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama3.1-8b-fp8-h100" / "config.yaml"


def _truss(tmp_path: Path, repo_id: str) -> Path:
    config = yaml.safe_load(EXAMPLE.read_text())
    build = config["model_metadata"]["trt_llm"]["build"]
    build.pop("base_model_architecture")
    build["huggingface_ckpt_repository"] = repo_id
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


@pytest.fixture()
def hub_env(hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> HubServer:
    for name, value in hub.env.items():
        monkeypatch.setenv(name, value)
    for name in ("HF_TOKEN", "TRUSS_SECRET_hf_access_token"):
        monkeypatch.delenv(name, raising=False)
    return hub


def test_a_gated_checkpoint_is_read_with_the_secret_and_checked(hub_env: HubServer, tmp_path: Path, monkeypatch, capsys):
    repo = f"{PRIVATE_ORG}/gpt-oss-mini"
    hub_env.mirror.create(repo, {"config.json": json.dumps({"architectures": ["GptOssForCausalLM"]})})
    root = _truss(tmp_path, repo)

    # without the token: the gated repository is said unread (not a crash, not an error)
    assert main(["validate", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"# architecture: not checked: config.json of {repo} could not be read (HTTP 401" in out
    assert "hf_access_token" in out

    monkeypatch.setenv("TRUSS_SECRET_hf_access_token", hub_env.token)
    assert main(["validate", str(root)]) == 0
    captured = capsys.readouterr()
    assert f"# architecture: GptOssForCausalLM (config.json of {repo}); TensorRT-LLM 1.2.1's PyTorch backend serves it" in captured.out
    assert hub_env.token not in captured.out + captured.err
    fetched = [path for _, path, _ in hub_env.requests_seen() if f"/{repo}/" in path]
    assert any(path.endswith("/config.json") for path in fetched)
    assert not [path for path in fetched if path.endswith((".safetensors", ".bin", ".pt"))]  # never weights


def test_a_hub_checkpoint_the_release_does_not_serve_is_refused(hub_env: HubServer, tmp_path: Path, capsys):
    repo = "public/old-arch"
    hub_env.mirror.create(repo, {"config.json": json.dumps({"architectures": ["GPTJForCausalLM"]})})
    assert main(["validate", str(_truss(tmp_path, repo))]) == 1
    err = capsys.readouterr().err
    assert "the checkpoint's architecture GPTJForCausalLM is not served by TensorRT-LLM 1.2.1's PyTorch backend" in err
