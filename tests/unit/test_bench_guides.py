"""`trtllm-truss bench --guide-schema`: the schemas file, the guided engine target's inputs, the compile
times (the engine's own compiler) and the engine's guide-cache counters read from Triton's /metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trtllm_truss.bench.guides import cache_counters, compile_times, read_schemas
from trtllm_truss.bench.targets import make_target
from trtllm_truss.bench.workload import BenchRequest
from trtllm_truss.cli import main

EMBEDDED = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_one_schema_or_one_per_line(tmp_path: Path):
    one = tmp_path / "one.json"
    one.write_text(json.dumps(SCHEMA, indent=2))
    assert read_schemas(one) == ['{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}']
    lines = tmp_path / "many.jsonl"
    lines.write_text(json.dumps(SCHEMA) + "\n\n" + json.dumps({"type": "string"}) + "\n")
    assert len(read_schemas(lines)) == 2
    lines.write_text(json.dumps(SCHEMA) + "\n[1]\n")
    with pytest.raises(ValueError, match=r"many.jsonl:2: a schema must be a JSON object"):
        read_schemas(lines)


def test_guided_engine_target_sends_nvidias_guide_inputs_per_request():
    target = make_target("engine_guided", "127.0.0.1:1", guides=["S0", "S1"])
    assert target.name == "engine_guided"
    target._triton.batched = True
    inputs = {t.name(): t for t in target.build_inputs(BenchRequest(3, "p", (1, 2), 4))}
    assert inputs["guided_decoding_guide_type"].datatype() == "BYTES"
    assert inputs["guided_decoding_guide"].shape() == [1, 1]
    plain = make_target("engine", "127.0.0.1:1", guides=["S0"])
    plain._triton.batched = True
    assert plain.name == "engine" and "guided_decoding_guide" not in {t.name() for t in plain.build_inputs(BenchRequest(0, "p", (1,), 4))}
    with pytest.raises(ValueError, match="--guide-schema"):
        make_target("engine_guided", "127.0.0.1:1")


def test_compile_times_are_measured_per_distinct_schema_and_refusals_named():
    good = json.dumps(SCHEMA)
    summary = compile_times([good, good, json.dumps({"not": {"type": "string"}})], EMBEDDED)
    assert summary["distinct_schemas"] == 2 and summary["compiled"] == 1
    assert summary["compile_ms_p50"] > 0 and summary["compile_ms_p99"] >= summary["compile_ms_p50"]
    assert summary["refused"] == ['Unimplemented keys: ["not"]']


def test_cache_counters_sum_the_instances(monkeypatch):
    text = (
        "# TYPE trtllm_standin_guide_cache_hits_total counter\n"
        'trtllm_standin_guide_cache_hits_total{model="tensorrt_llm",instance="a"} 3\n'
        'trtllm_standin_guide_cache_hits_total{model="tensorrt_llm",instance="b"} 4\n'
        'trtllm_standin_guide_cache_misses_total{model="tensorrt_llm",instance="a"} 2\n'
    )

    class Response:
        def read(self):
            return text.encode()

    monkeypatch.setattr("urllib.request.urlopen", lambda url, timeout: Response())
    assert cache_counters("http://127.0.0.1:1/metrics") == (7.0, 2.0)
    assert cache_counters(None) is None


def test_guide_schema_excludes_compare(tmp_path: Path, capsys):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    assert main(["bench", ".", "--guide-schema", str(schema), "--compare"]) == 2
    assert "--guide-schema" in capsys.readouterr().err


def test_a_bad_schemas_file_is_named_before_anything_is_sent(tmp_path: Path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    code = main(["bench", ".", "--guide-schema", str(bad), "--url", "127.0.0.1:9", "--tokenizer", str(EMBEDDED),
                 "--num-requests", "2", "--concurrency", "1", "--no-progress"])
    assert code == 2 and "bad.jsonl:1: not JSON" in capsys.readouterr().err.replace("\n", "")
