"""Fetching engines, tokenizers and checkpoints from a real HF-protocol hub (olah) and real S3 (moto).

The hub repos are git repos created here (engine files through git-lfs), so each test controls
exactly which commits, tags and branches exist.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from fixtures_hubs import HubServer, MotoS3, hub_fixture, moto_s3_fixture  # noqa: F401 - session fixtures
from trtllm_truss.artifacts import (
    EngineVerificationError,
    FetchError,
    IncompleteArtifactError,
    fetch_repository,
    prepare_artifacts,
    resolve_revision,
)
from trtllm_truss.artifacts.completeness import MARKER_FILE, read_marker
from trtllm_truss.planning.plan import ServingPlan, engine_cache_key, engine_cache_key_inputs, make_plan
from trtllm_truss.planning.probe import GpuInfo, RuntimeFacts

pytestmark = pytest.mark.timeout(120)

TOKENIZER_FILES = {
    "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}),
    "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}),
    "special_tokens_map.json": json.dumps({"eos_token": "</s>"}),
}


def engine_config(tp: int = 1, pp: int = 1, *, version: str = "0.12.0", max_batch_size: int = 8) -> str:
    return json.dumps(
        {
            "version": version,
            "pretrained_config": {
                "architecture": "LlamaForCausalLM",
                "dtype": "float16",
                "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
                "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
            },
            "build_config": {
                "max_batch_size": max_batch_size,
                "max_input_len": 512,
                "max_seq_len": 768,
                "max_beam_width": 1,
                "max_num_tokens": 4096,
                "plugin_config": {"paged_kv_cache": True},
            },
        }
    )


def engine_files(tp: int = 1, *, max_batch_size: int = 8, rank_bytes: int = 50_000) -> dict[str, bytes | str]:
    files: dict[str, bytes | str] = {"config.json": engine_config(tp, max_batch_size=max_batch_size)}
    for rank in range(tp):
        files[f"rank{rank}.engine"] = bytes([rank + 1]) * rank_bytes
    return files


def repo_files(**engine_kwargs: int) -> dict[str, bytes | str]:
    """An engine repo as people publish them: engine + tokenizer + files nobody should download."""
    return {
        **engine_files(**engine_kwargs),
        **TOKENIZER_FILES,
        "README.md": "# engine\n",
        "benchmarks/results.json": "{}",
        "previous-build/rank0.engine": b"\3" * 1000,
        "hf_checkpoint.safetensors": b"\0" * 1000,
    }


def downloaded(dest: Path) -> set[str]:
    return {
        p.relative_to(dest).as_posix()
        for p in dest.rglob("*")
        if p.is_file() and not p.relative_to(dest).as_posix().startswith(".cache/") and p.name != MARKER_FILE
    }


# --- hub -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_repo(hub: HubServer) -> dict[str, str]:
    """acme/tiny-engine: v1 (tag) -> main (batch 16); branch tp2 with two ranks."""
    first = hub.mirror.create("acme/tiny-engine", repo_files(max_batch_size=8))
    hub.mirror.tag("acme/tiny-engine", "v1")
    second = hub.mirror.commit("acme/tiny-engine", {"config.json": engine_config(max_batch_size=16)})
    tp2 = hub.mirror.commit("acme/tiny-engine", engine_files(tp=2, max_batch_size=4), branch="tp2")
    return {"v1": first, "main": second, "tp2": tp2}


def _batch(dest: Path) -> int:
    return json.loads((dest / "config.json").read_text())["build_config"]["max_batch_size"]


def test_hub_engine_by_branch_tag_and_sha_downloads_only_engine_files(hub, engine_repo, tmp_path):
    env = hub.env
    main = fetch_repository("acme/tiny-engine", tmp_path / "main", kind="engine", environ=env)
    assert main.downloaded and main.resolved_revision == engine_repo["main"]
    assert downloaded(main.path) == {"config.json", "rank0.engine"}  # no README, tokenizer, checkpoint, subdirs
    assert not [path for _, path, _ in hub.requests_seen() if "previous-build" in path]  # not even transferred
    assert _batch(main.path) == 16
    assert (main.path / "rank0.engine").stat().st_size == 50_000  # the LFS object, not its pointer

    tag = fetch_repository("acme/tiny-engine", tmp_path / "tag", revision="v1", kind="engine", environ=env)
    sha = fetch_repository("acme/tiny-engine", tmp_path / "sha", revision=engine_repo["v1"], kind="engine", environ=env)
    assert tag.resolved_revision == sha.resolved_revision == engine_repo["v1"]
    assert _batch(tag.path) == _batch(sha.path) == 8

    branch = fetch_repository("acme/tiny-engine", tmp_path / "tp2", revision="tp2", kind="engine", environ=env)
    assert downloaded(branch.path) == {"config.json", "rank0.engine", "rank1.engine"}

    marker = read_marker(branch.path)
    assert marker is not None and marker.resolved_revision == engine_repo["tp2"] and marker.revision == "tp2"


def test_complete_download_is_reused_and_a_new_revision_replaces_stale_files(hub, engine_repo, tmp_path):
    dest = tmp_path / "engine"
    first = fetch_repository("acme/tiny-engine", dest, revision="tp2", kind="engine", environ=hub.env)
    again = fetch_repository("acme/tiny-engine", dest, revision="tp2", kind="engine", environ=hub.env)
    assert first.downloaded and not again.downloaded and again.files == first.files

    # Switching the same directory to a TP=1 revision must not leave rank1.engine behind.
    switched = fetch_repository("acme/tiny-engine", dest, revision="main", kind="engine", environ=hub.env)
    assert switched.downloaded and downloaded(dest) == {"config.json", "rank0.engine"}


def test_tokenizer_and_checkpoint_kinds_take_only_their_files(hub, engine_repo, tmp_path):
    tok = fetch_repository("acme/tiny-engine", tmp_path / "tok", kind="tokenizer", environ=hub.env)
    assert downloaded(tok.path) == set(TOKENIZER_FILES)

    hub.mirror.create(
        "acme/tiny-ckpt",
        {
            "config.json": json.dumps({"model_type": "llama", "max_position_embeddings": 1024}),
            "model.safetensors": b"\1" * 2000,
            "pytorch_model.bin": b"\2" * 2000,
            "README.md": "x",
            **TOKENIZER_FILES,
        },
    )
    ckpt = fetch_repository("acme/tiny-ckpt", tmp_path / "ckpt", kind="checkpoint", environ=hub.env)
    assert downloaded(ckpt.path) == {"config.json", "model.safetensors", *TOKENIZER_FILES}


def test_corrupted_or_incomplete_hub_repo_is_rejected_then_recovers_on_retry(hub, tmp_path):
    repo = "acme/broken-engine"
    files = engine_files(tp=2)
    del files["rank1.engine"]  # an upload that stopped half way
    hub.mirror.create(repo, files)
    dest = tmp_path / "engine"
    with pytest.raises(IncompleteArtifactError, match=r"missing engine file\(s\) rank1\.engine for world size 2"):
        fetch_repository(repo, dest, kind="engine", environ=hub.env)
    assert not (dest / MARKER_FILE).exists()  # never mistaken for complete

    hub.mirror.commit(repo, {"config.json": engine_config(2)[:60], "rank1.engine": b"\2" * 100})
    with pytest.raises(IncompleteArtifactError, match=r"config\.json: not valid JSON .*truncated"):
        fetch_repository(repo, dest, kind="engine", environ=hub.env)
    assert not (dest / MARKER_FILE).exists()

    hub.mirror.commit(repo, {"config.json": engine_config(2), "rank1.engine": b""})
    with pytest.raises(IncompleteArtifactError, match=r"rank1\.engine are empty \(0 bytes\)"):
        fetch_repository(repo, dest, kind="engine", environ=hub.env)

    fixed = hub.mirror.commit(repo, {"rank1.engine": b"\2" * 100})
    result = fetch_repository(repo, dest, kind="engine", environ=hub.env)
    assert result.resolved_revision == fixed and (dest / MARKER_FILE).exists()
    assert downloaded(dest) == {"config.json", "rank0.engine", "rank1.engine"}


def test_interrupted_or_damaged_download_is_detected_and_repaired(hub, engine_repo, tmp_path):
    dest = tmp_path / "engine"
    fetch_repository("acme/tiny-engine", dest, revision="tp2", kind="engine", environ=hub.env)

    # Damage after completion: the marker's sizes no longer match -> fetched again.
    with open(dest / "rank1.engine", "r+b") as handle:
        handle.truncate(10)
    repaired = fetch_repository("acme/tiny-engine", dest, revision="tp2", kind="engine", environ=hub.env)
    assert repaired.downloaded and (dest / "rank1.engine").stat().st_size == 50_000

    # A killed download: no marker, a half-written temp file, a file missing.
    (dest / MARKER_FILE).unlink()
    (dest / "rank0.engine").unlink()
    (dest / "rank0.engine.part-999").write_bytes(b"\1" * 10)
    resumed = fetch_repository("acme/tiny-engine", dest, revision="tp2", kind="engine", environ=hub.env)
    assert resumed.downloaded and downloaded(dest) == {"config.json", "rank0.engine", "rank1.engine"}
    assert (dest / "rank0.engine").read_bytes() == b"\1" * 50_000


def test_unknown_repo_or_revision_gives_a_clear_error(hub, engine_repo, tmp_path):
    with pytest.raises(FetchError, match=r"hub repo acme/tiny-engine@no-such-branch: .*not found"):
        fetch_repository("acme/tiny-engine", tmp_path / "x", revision="no-such-branch", kind="engine", environ=hub.env)
    with pytest.raises(FetchError, match=r"acme/absent-repo@main"):
        fetch_repository("acme/absent-repo", tmp_path / "y", kind="engine", environ=hub.env)


# --- token handling ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def private_repo(hub: HubServer) -> str:
    return hub.mirror.create("private/gated-engine", {**engine_files(), **TOKENIZER_FILES})


def test_private_repo_needs_the_token_and_it_never_leaks(hub, private_repo, tmp_path, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    token = hub.token
    no_token_env = {k: v for k, v in hub.env.items()}
    with pytest.raises(FetchError) as no_token:
        fetch_repository("private/gated-engine", tmp_path / "a", kind="engine", environ=no_token_env)
    assert "hf_access_token" in str(no_token.value)  # tells the user which secret to set

    with pytest.raises(FetchError) as wrong_token:
        fetch_repository("private/gated-engine", tmp_path / "b", kind="engine", token="hf_wrong", environ=hub.env)

    # Each documented source of the token works: explicit, TRUSS_SECRET_hf_access_token, HF_TOKEN.
    explicit = fetch_repository("private/gated-engine", tmp_path / "c", kind="engine", token=token, environ=hub.env)
    truss_env = {**hub.env, "TRUSS_SECRET_hf_access_token": token}
    via_secret_env = fetch_repository("private/gated-engine", tmp_path / "d", kind="tokenizer", environ=truss_env)
    via_hf_token = fetch_repository(
        "private/gated-engine", tmp_path / "e", kind="engine", environ={**hub.env, "HF_TOKEN": token}
    )
    assert explicit.resolved_revision == via_secret_env.resolved_revision == via_hf_token.resolved_revision
    assert ("GET", "/api/models/private/gated-engine/revision/main", f"Bearer {token}") in hub.requests_seen()

    # A failure *with* the token set: its message must not carry it either.
    with pytest.raises(FetchError) as missing_with_token:
        fetch_repository(
            "private/gated-engine", tmp_path / "f", revision="nope", kind="engine", token=token, environ=hub.env
        )

    captured = capsys.readouterr()
    for text in (
        str(no_token.value),
        str(wrong_token.value),
        str(missing_with_token.value),
        caplog.text,
        captured.out,
        captured.err,
        json.dumps(read_marker(tmp_path / "c").__dict__),
    ):
        assert token not in text

    key_inputs = engine_cache_key_inputs(
        {"base_model_architecture": "llama", "huggingface_ckpt_repository": "private/gated-engine"},
        checkpoint_revision=explicit.resolved_revision,
        facts=RuntimeFacts(),
        checkpoint_repo_id="private/gated-engine",
    )
    key = engine_cache_key(
        {"base_model_architecture": "llama"}, checkpoint_revision=explicit.resolved_revision, facts=RuntimeFacts()
    )
    assert token not in json.dumps(key_inputs) and token not in key


def test_resolve_revision_gives_the_commit_without_downloading(hub, engine_repo, tmp_path):
    assert resolve_revision("acme/tiny-engine", revision="v1", environ=hub.env) == engine_repo["v1"]
    assert resolve_revision("acme/tiny-engine", environ=hub.env) == engine_repo["main"]


# --- S3 ------------------------------------------------------------------------------------------


def _upload(moto: MotoS3, bucket: str, prefix: str, files: dict[str, bytes | str]) -> None:
    client = moto.client()
    existing = [b["Name"] for b in client.list_buckets().get("Buckets", [])]
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)
    for name, content in files.items():
        body = content.encode() if isinstance(content, str) else content
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=body)


def test_s3_engine_and_tokenizer_download_only_needed_files(moto_s3, tmp_path):
    _upload(moto_s3, "engines", "llama/v1", repo_files(tp=2))
    _upload(moto_s3, "engines", "llama/v2", repo_files(tp=1))
    env = moto_s3.env
    v1 = fetch_repository("s3://engines/llama/v1", tmp_path / "v1", kind="engine", environ=env)
    assert downloaded(v1.path) == {"config.json", "rank0.engine", "rank1.engine"}
    assert v1.resolved_revision.startswith("s3-") and v1.downloaded
    v2 = fetch_repository("s3://engines/llama/v2/", tmp_path / "v2", kind="engine", environ=env)
    assert downloaded(v2.path) == {"config.json", "rank0.engine"} and v2.resolved_revision != v1.resolved_revision
    tok = fetch_repository("s3://engines/llama/v1", tmp_path / "tok", kind="tokenizer", environ=env)
    assert downloaded(tok.path) == set(TOKENIZER_FILES)

    again = fetch_repository("s3://engines/llama/v1", tmp_path / "v1", kind="engine", environ=env)
    assert not again.downloaded

    with pytest.raises(FetchError, match=r"S3 sources have no revisions .* put the version in the prefix"):
        fetch_repository("s3://engines/llama", tmp_path / "r", revision="v1", kind="engine", environ=env)
    with pytest.raises(FetchError, match=r"no engine files directly under this prefix"):
        fetch_repository("s3://engines/llama", tmp_path / "n", kind="engine", environ=env)


def test_s3_incomplete_upload_rejected_then_recovers(moto_s3, tmp_path):
    files = engine_files(tp=2)
    late_rank = files.pop("rank1.engine")
    _upload(moto_s3, "engines", "partial", files)
    dest = tmp_path / "engine"
    with pytest.raises(IncompleteArtifactError, match=r"missing engine file\(s\) rank1\.engine"):
        fetch_repository("s3://engines/partial", dest, kind="engine", environ=moto_s3.env)
    assert not (dest / MARKER_FILE).exists()

    _upload(moto_s3, "engines", "partial", {"rank1.engine": late_rank})
    (dest / "rank0.engine").write_bytes(b"\1" * 7)  # a damaged earlier file gets replaced too
    result = fetch_repository("s3://engines/partial", dest, kind="engine", environ=moto_s3.env)
    assert result.downloaded and (dest / "rank0.engine").stat().st_size == 50_000
    assert (dest / MARKER_FILE).exists()


# --- the plan end to end -------------------------------------------------------------------------


def _write_truss(truss_dir: Path, trt_llm_yaml: str) -> Path:
    truss_dir.mkdir(parents=True, exist_ok=True)
    (truss_dir / "config.yaml").write_text(
        "model_name: test\nresources:\n  accelerator: H100:2\n  use_gpu: true\nsecrets:\n  hf_access_token: null\n"
        "model_metadata:\n  trt_llm:\n" + "".join(f"    {line}\n" for line in trt_llm_yaml.strip().splitlines())
    )
    return truss_dir


H100_X2 = RuntimeFacts(
    gpus=(GpuInfo("NVIDIA H100 80GB HBM3", "9.0"),) * 2,
    trtllm_version="0.12.0",
    tensorrt_version="10.3.0",
    trtllm_unavailable_reason=None,
)


def test_serve_plan_fetches_private_engine_with_truss_secret_and_takes_engine_limits(hub, tmp_path):
    from trtllm_truss.config import load_config

    hub.mirror.create("private/tp2-engine", {**engine_files(tp=2, max_batch_size=12), **TOKENIZER_FILES})
    truss = _write_truss(
        tmp_path / "truss",
        """
serve:
  engine_repository: private/tp2-engine
  tensor_parallel_count: 2
""",
    )
    resolved = load_config(truss, environ={})
    plan = make_plan(resolved, H100_X2, artifacts_dir=tmp_path / "artifacts")
    assert plan.backend == "tensorrtllm" and not plan.limits_final
    ready, results = prepare_artifacts(plan, secrets={"hf_access_token": hub.token}, environ=hub.env)
    assert isinstance(ready, ServingPlan) and ready.limits_final
    assert (ready.max_batch_size, ready.max_input_len, ready.max_output_len) == (12, 512, 256)
    assert ready.engine_dir == plan.engine_dir and (ready.engine_dir / "rank1.engine").is_file()
    assert (ready.tokenizer_dir / "tokenizer.json").is_file()
    assert [r.kind for r in results] == ["engine", "tokenizer"]

    # The same engine on a machine with a newer TensorRT-LLM is refused before Triton starts.
    newer = RuntimeFacts(gpus=H100_X2.gpus, trtllm_version="0.13.0", trtllm_unavailable_reason=None)
    with pytest.raises(EngineVerificationError, match=r"built with TensorRT-LLM 0\.12\.0 but the runtime is 0\.13\.0"):
        prepare_artifacts(
            make_plan(resolved, newer, artifacts_dir=tmp_path / "artifacts"),
            secrets={"hf_access_token": hub.token},
            environ=hub.env,
        )


def test_unreachable_hub_reuses_a_complete_download_but_never_papers_over_missing_ones(hub, engine_repo, tmp_path):
    from fixtures_hubs import free_port

    dest = tmp_path / "engine"
    fetch_repository("acme/tiny-engine", dest, revision="v1", kind="engine", environ=hub.env)
    offline = {**hub.env, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    reused = fetch_repository("acme/tiny-engine", dest, revision="v1", kind="engine", environ=offline)
    assert not reused.downloaded and reused.resolved_revision == engine_repo["v1"]
    with pytest.raises(FetchError, match=r"cannot reach the hub at http://127\.0\.0\.1:\d+"):
        fetch_repository("acme/tiny-engine", dest, revision="tp2", kind="engine", environ=offline)


def test_two_replicas_fetching_into_one_directory_download_once(hub, engine_repo, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    dest = tmp_path / "shared"
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(fetch_repository, "acme/tiny-engine", dest, revision="tp2", kind="engine", environ=hub.env)
            for _ in range(2)
        ]
        results = [f.result(timeout=60) for f in futures]
    assert sorted(r.downloaded for r in results) == [False, True]  # the lock holder downloads, the other reuses
    assert results[0].files == results[1].files


# --- local sources: used in place, checked the same way --------------------------------------------


def test_local_sources_are_used_in_place_and_checked(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(IncompleteArtifactError, match=r"checkpoint has no \*\.safetensors weights"):
        fetch_repository(str(ckpt), tmp_path / "unused", kind="checkpoint")
    (ckpt / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 8)
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    with pytest.raises(
        IncompleteArtifactError, match=r"lists shard\(s\) model-00002-of-00002\.safetensors that are missing"
    ):
        fetch_repository(str(ckpt), tmp_path / "unused", kind="checkpoint")
    (ckpt / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 8)
    result = fetch_repository("./ckpt", tmp_path / "unused", kind="checkpoint", base_dir=tmp_path)
    assert result.path == ckpt.resolve() and not (tmp_path / "unused").exists()  # no copy
    assert result.resolved_revision.startswith("local-")
    (ckpt / "model-00002-of-00002.safetensors").write_bytes(b"\1" * 9)
    assert fetch_repository(str(ckpt), tmp_path, kind="checkpoint").resolved_revision != result.resolved_revision

    with pytest.raises(IncompleteArtifactError, match=r"no tokenizer found .* point tokenizer_repository"):
        fetch_repository(str(ckpt), tmp_path, kind="tokenizer")
    with pytest.raises(FetchError, match=r"a local path has no revisions \(got 'main'\)"):
        fetch_repository(str(ckpt), tmp_path, kind="checkpoint", revision="main")

    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text(engine_config(1))
    with pytest.raises(IncompleteArtifactError, match=r"missing engine file\(s\) rank0\.engine"):
        fetch_repository(str(engine), tmp_path, kind="engine")
    with pytest.raises(IncompleteArtifactError, match=r"this is a TensorRT-LLM engine, not a Hugging Face checkpoint"):
        (engine / "w.safetensors").write_bytes(b"\0")
        fetch_repository(str(engine), tmp_path, kind="checkpoint")
