"""LoRA adapters fetched like engines: from a private repo of a real HF-protocol hub (olah, with the
secret the checkpoint uses) and from real S3 (moto), only peft's files, cached and reused, and checked
against build.lora_configuration once fetched."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fixtures_hubs import HubServer, MotoS3, hub_fixture, moto_s3_fixture  # noqa: F401 - session fixtures
from trtllm_truss.artifacts import FetchError, prepare_artifacts
from trtllm_truss.config import load_config
from trtllm_truss.planning.plan import PlanError, make_plan
from trtllm_truss.planning.probe import RuntimeFacts

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
PIRATE = ROOT / "data" / "embedded-lora" / "pirate"
ADAPTER_FILES = {
    "adapter_config.json": (PIRATE / "adapter_config.json").read_text(),
    "adapter_model.safetensors": (PIRATE / "adapter_model.safetensors").read_bytes(),
    "README.md": "# a pirate\n",
    "training_args.bin": b"\0" * 100,
}


def prepared(tmp_path: Path, adapters: dict, environ: dict, *, secrets: dict | None = None, limits: dict | None = None):
    build = {
        "base_model_architecture": "llama",
        "huggingface_ckpt_repository": str(ROOT / "data" / "embedded-llama"),
        "lora_adapters": adapters,
        **({"lora_configuration": limits} if limits else {}),
    }
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"model_name": "t", "secrets": {"hf_access_token": None}, "model_metadata": {"trt_llm": {"build": build}}})
    )
    resolved = load_config(tmp_path, environ=environ)
    plan = make_plan(resolved, RuntimeFacts(), artifacts_dir=tmp_path / "artifacts")
    return prepare_artifacts(plan, secrets=secrets, environ=environ)


def files_in(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if not p.name.startswith(".")}


def test_adapters_from_a_private_hub_repo_and_s3(hub: HubServer, moto_s3: MotoS3, tmp_path):
    sha = hub.mirror.create("private/pirate-lora", ADAPTER_FILES)
    s3 = moto_s3.client()
    s3.create_bucket(Bucket="adapters")
    for name, content in ADAPTER_FILES.items():
        s3.put_object(Bucket="adapters", Key=f"pirate/v1/{name}", Body=content.encode() if isinstance(content, str) else content)
    environ = {**hub.env, **moto_s3.env}
    adapters = {"hub": {"repo": "private/pirate-lora", "revision": sha[:12]}, "s3": "s3://adapters/pirate/v1"}
    plan, results = prepared(tmp_path, adapters, environ, secrets={"hf_access_token": hub.token})
    by_name = {a.name: a for a in plan.lora_adapters}
    assert [(a.name, a.task_id) for a in plan.lora_adapters] == [("hub", 1), ("s3", 2)]
    for adapter in by_name.values():
        assert files_in(adapter.dir) == {"adapter_config.json", "adapter_model.safetensors"}
        assert (adapter.dir / "adapter_model.safetensors").read_bytes() == ADAPTER_FILES["adapter_model.safetensors"]
    fetched = {r.source: r for r in results}
    assert fetched["private/pirate-lora"].resolved_revision == sha and fetched["private/pirate-lora"].downloaded
    assert any(auth == f"Bearer {hub.token}" for _, path, auth in hub.requests_seen() if "pirate-lora" in path)
    # Fetched once: a second load reuses both downloads.
    _, again = prepared(tmp_path, adapters, environ, secrets={"hf_access_token": hub.token})
    assert not any(r.downloaded for r in again if r.kind == "adapter")


def test_a_private_adapter_without_the_token_fails_naming_no_secret(hub: HubServer, tmp_path):
    hub.mirror.create("private/pirate-lora-2", ADAPTER_FILES)
    with pytest.raises(FetchError) as caught:
        prepared(tmp_path, {"p": "private/pirate-lora-2"}, dict(hub.env))
    assert "private/pirate-lora-2" in str(caught.value) and hub.token not in str(caught.value)


def test_a_fetched_adapter_the_limits_cannot_take_is_refused_naming_it(hub: HubServer, tmp_path):
    hub.mirror.create("acme/pirate-lora", ADAPTER_FILES)
    with pytest.raises(PlanError) as caught:
        prepared(tmp_path, {"big": "acme/pirate-lora"}, dict(hub.env), limits={"max_lora_rank": 4})
    assert caught.value.problems == [
        "model_metadata.trt_llm.build.lora_adapters.big: rank 8 is above"
        " model_metadata.trt_llm.build.lora_configuration.max_lora_rank 4; raise max_lora_rank or use a smaller adapter"
    ]
