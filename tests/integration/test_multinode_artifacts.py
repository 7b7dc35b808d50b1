"""One node of a multi-node world fetches only its own ranks' engine files, from a real hub (olah) and
real S3 (moto); nodes sharing one cache directory end up with the union, nothing fetched twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_hubs import HubServer, MotoS3, hub_fixture, moto_s3_fixture  # noqa: F401 - session fixtures
from trtllm_truss.artifacts import (
    EngineVerificationError,
    fetch_repository,
    verify_engine_dir,
)

pytestmark = pytest.mark.timeout(120)


def _engine(tp: int) -> dict[str, bytes | str]:
    config = {
        "version": "0.16.0",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM", "dtype": "float16",
            "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1},
        },
        "build_config": {"max_batch_size": 8, "max_input_len": 512, "max_seq_len": 768, "max_beam_width": 1},
    }
    files: dict[str, bytes | str] = {"config.json": json.dumps(config), "README.md": "# engine\n"}
    for rank in range(tp):
        files[f"rank{rank}.engine"] = bytes([rank + 1]) * 4096
    return files


def _engine_files(dest: Path) -> set[str]:
    return {p.name for p in dest.iterdir() if p.is_file() and p.name.endswith((".engine", ".json")) and not p.name.startswith(".")}


def _stamps(dest: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in dest.glob("rank*.engine")}


def _check_node_shares(fetch, dest: Path) -> None:
    node1 = fetch(ranks=[2, 3])
    assert node1.downloaded and _engine_files(dest) == {"config.json", "rank2.engine", "rank3.engine"}
    verify_engine_dir(dest, ranks=[2, 3])
    with pytest.raises(EngineVerificationError, match=r"missing engine file\(s\) rank0\.engine, rank1\.engine"):
        verify_engine_dir(dest)
    assert not fetch(ranks=[2, 3]).downloaded  # a restart of node 1 reuses its share
    before = _stamps(dest)
    node0 = fetch(ranks=[0, 1])  # node 0 sharing the directory adds its share, node 1's stays
    assert node0.downloaded and _engine_files(dest) == {"config.json", *(f"rank{r}.engine" for r in range(4))}
    assert _stamps(dest)["rank2.engine"] == before["rank2.engine"]
    verify_engine_dir(dest)
    assert not fetch(ranks=None).downloaded  # a single-node fetch finds everything there


def test_s3_engine_fetch_takes_one_nodes_ranks(moto_s3, tmp_path):
    client = moto_s3.client()
    client.create_bucket(Bucket="multinode")
    for name, content in _engine(4).items():
        client.put_object(Bucket="multinode", Key=f"tp4/{name}", Body=content.encode() if isinstance(content, str) else content)
    dest = tmp_path / "engine"

    def fetch(ranks):
        return fetch_repository("s3://multinode/tp4", dest, kind="engine", environ=moto_s3.env, ranks=ranks)

    _check_node_shares(fetch, dest)


def test_hub_engine_fetch_takes_one_nodes_ranks(hub, tmp_path):
    hub.mirror.create("acme/tp4-engine", _engine(4))
    dest = tmp_path / "engine"

    def fetch(ranks):
        return fetch_repository("acme/tp4-engine", dest, kind="engine", environ=hub.env, ranks=ranks)

    _check_node_shares(fetch, dest)
