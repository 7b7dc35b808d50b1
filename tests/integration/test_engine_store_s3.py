"""Fleet engine sharing through S3 (a real S3 protocol server: moto_server on loopback).

Eight replicas (processes) with separate cache folders race on one empty S3 store: exactly one
builds (the build is the TensorRT-LLM TEST DOUBLE `fakes.fake_trtllm_build.write_fake_engine`), one
publishes, seven download the published engine. The claim object that makes one replica the builder
is checked on its own: exclusive, released after publishing, taken over once expired.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for the fakes package

from fakes.fake_trtllm_build import write_fake_engine  # noqa: E402
from fixtures_hubs import MotoS3, moto_s3_fixture  # noqa: E402,F401 - session fixture

from trtllm_truss.artifacts.cache import EngineCache  # noqa: E402
from trtllm_truss.artifacts.remote_store import CLAIM_NAME, S3EngineStore  # noqa: E402

KEY = "e" * 64


def _tree_digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def _replica(root: str, url: str, env: dict, builds_log: str, publish_log: str, start_at: float, results) -> None:
    os.environ.update(env)

    class CountingS3EngineStore(S3EngineStore):  # the real store; counts publishes for the test
        def publish(self, key: str, engine_dir: Path) -> None:
            with open(publish_log, "a") as log:
                log.write(f"{os.getpid()}\n")
            super().publish(key, engine_dir)

    def build(dest: Path) -> None:
        with open(builds_log, "a") as log:  # one line per real build, appended atomically
            log.write(f"{os.getpid()}\n")
        time.sleep(1.0)  # a slow build, so the others find the claim taken (not synchronisation)
        write_fake_engine(dest, tp=2, pp=2)

    while time.time() < start_at:  # line everyone up so they hit the empty store together
        time.sleep(0.005)
    store = CountingS3EngineStore(url, environ=env)
    with EngineCache(root, remote_poll_s=0.1, remote_wait_s=120.0) as cache:
        result = cache.get(KEY, build, remote=store)
        results.put((result.source, _tree_digest(result.path)))


@pytest.fixture()
def bucket(moto_s3: MotoS3, request) -> str:
    name = f"engines-{request.node.name.replace('_', '-')[:40].lower()}-{os.getpid()}"
    moto_s3.client().create_bucket(Bucket=name)
    return name


def test_eight_replicas_one_store_build_once_publish_once_download_seven(tmp_path: Path, moto_s3: MotoS3, bucket: str):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    builds_log, publish_log = tmp_path / "builds.log", tmp_path / "publishes.log"
    url = f"s3://{bucket}/fleet/engines"
    start_at = time.time() + 5.0  # spawn start-up takes a moment on 2 cores
    procs = [
        ctx.Process(
            target=_replica,
            args=(str(tmp_path / f"replica{i}"), url, moto_s3.env, str(builds_log), str(publish_log), start_at, results),
        )
        for i in range(8)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=180) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert len(builds_log.read_text().splitlines()) == 1, "more than one replica built the engine"
    assert len(publish_log.read_text().splitlines()) == 1, "more than one replica published the engine"
    assert sorted(source for source, _ in outcomes) == ["built"] + ["remote"] * 7
    digests = [digest for _, digest in outcomes]
    assert all(d == digests[0] for d in digests) and sorted(digests[0]) == ["config.json"] + [f"rank{r}.engine" for r in range(4)]
    listing = moto_s3.client().list_objects_v2(Bucket=bucket, Prefix=f"fleet/engines/{KEY}/")
    names = {item["Key"].rsplit("/", 1)[1] for item in listing.get("Contents", [])}
    assert "manifest.json" in names and CLAIM_NAME not in names  # published, claim released


def test_claim_is_exclusive_and_released(moto_s3: MotoS3, bucket: str):
    first = S3EngineStore(f"s3://{bucket}/p", environ=moto_s3.env)
    second = S3EngineStore(f"s3://{bucket}/p", environ=moto_s3.env)
    assert first.try_claim(KEY) is True
    assert second.try_claim(KEY) is False
    second.release_claim(KEY)  # not its claim: must not remove it
    assert second.try_claim(KEY) is False
    first.release_claim(KEY)
    assert second.try_claim(KEY) is True


def test_expired_claim_of_a_dead_builder_is_taken_over(moto_s3: MotoS3, bucket: str):
    dead = S3EngineStore(f"s3://{bucket}/p", environ=moto_s3.env, claim_ttl_s=0.2)
    assert dead.try_claim(KEY)
    waiter = S3EngineStore(f"s3://{bucket}/p", environ=moto_s3.env)
    deadline = time.monotonic() + 10
    while not waiter.try_claim(KEY):  # poll until the dead builder's claim expires
        assert time.monotonic() < deadline, "an expired claim was never taken over"
        time.sleep(0.1)
    body = json.loads(moto_s3.client().get_object(Bucket=bucket, Key=f"p/{KEY}/{CLAIM_NAME}")["Body"].read())
    assert body["owner"] == waiter.owner


def test_publish_then_download_round_trip(tmp_path: Path, moto_s3: MotoS3, bucket: str):
    store = S3EngineStore(f"s3://{bucket}", environ=moto_s3.env)
    assert store.has(KEY) is False
    entry = tmp_path / "entry"
    write_fake_engine(entry / "engine", tp=1, pp=1)
    (entry / "manifest.json").write_text("{}")
    store.publish(KEY, entry / "engine")
    assert store.has(KEY) is True
    out = tmp_path / "out"
    out.mkdir()
    store.download(KEY, out)
    assert _tree_digest(out) == _tree_digest(entry / "engine")
