"""`trtllm-truss bench --compare` end to end: the real tritonserver with this truss's repository and
the synthetic stand-in engine, the engine model streamed directly against the ensemble."""

from __future__ import annotations

import json

import pytest

from trtllm_truss.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.torch, pytest.mark.timeout(120)]


def test_bench_compare_engine_and_ensemble(tmp_path, monkeypatch, capsys):
    repo_root = __import__("pathlib").Path(__file__).resolve().parents[2]
    # The synthetic engine: tokens at no model cost, so the run is about the stack (and short).
    monkeypatch.setenv("TRTLLM_RUNTIME__PYTORCH__SYNTHETIC__STEP_TIME_MS", "0")
    report_path = tmp_path / "bench.json"
    code = main([
        "bench", str(repo_root), "--compare", "--full-target", "ensemble",
        "--concurrency", "1,4", "--num-requests", "8", "--warmup", "2",
        "--input-mean", "16", "--input-stddev", "4", "--output-mean", "24", "--output-stddev", "4",
        "--json", str(report_path), "--no-progress",
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(report_path.read_text())
    assert [(r["target"], r["level"]["concurrency"]) for r in report["runs"]] == [
        ("engine", 1), ("ensemble", 1), ("engine", 4), ("ensemble", 4)
    ]
    for run in report["runs"]:
        m = run["metrics"]
        assert m["succeeded"] == 8 and m["failed"] == 0, m["first_errors"]
        assert m["output_tokens_per_s"] > 0 and m["ttft_ms"]["p50"] > 0
        # the tritonserver bench started was read (found by its gRPC port); no truss server here
        cpu = run["server_cpu"]
        assert cpu["serving_path"]["cpu_s"] == 0
        assert cpu["tritonserver"]["cpu_s"] >= 0 and cpu["tritonserver"]["cores_per_10k_tok_s"] >= 0
    # One short run can stay under a clock tick (/proc counts CPU in 10 ms steps); the four cannot.
    for group in ("tritonserver", "python_stubs"):
        assert sum(run["server_cpu"][group]["cpu_s"] for run in report["runs"]) > 0, group
    engine4, ensemble4 = report["runs"][2]["metrics"], report["runs"][3]["metrics"]
    # ignore-EOS requests: both paths produce the requested lengths, so their totals agree
    assert engine4["output_tokens_total"] == ensemble4["output_tokens_total"]
    assert report["ratio"] == pytest.approx(ensemble4["output_tokens_per_s"] / engine4["output_tokens_per_s"])
    assert report["added_ttft_p50_ms"] is not None
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert "ratio" in out


def test_bench_compare_backends_streams_the_llmapi_path_on_the_synthetic_engine(tmp_path, monkeypatch, capsys):
    """--compare-backends pytorch,llmapi: two stacks of this truss, the tensor stand-in and our llmapi model on
    the LLM-API double, both on the synthetic engine (runtime.pytorch.synthetic reaches the double), measured
    in alternating rounds with each stack's own CPU and the llmapi/pytorch CPU-per-token ratios."""
    repo_root = __import__("pathlib").Path(__file__).resolve().parents[2]
    monkeypatch.setenv("TRTLLM_RUNTIME__PYTORCH__SYNTHETIC__STEP_TIME_MS", "0")
    report_path = tmp_path / "backends.json"
    code = main([
        "bench", str(repo_root), "--compare-backends", "pytorch,llmapi", "--target", "engine",
        "--concurrency", "4", "--num-requests", "8", "--warmup", "2", "--rounds", "2",
        "--input-mean", "16", "--output-mean", "24", "--json", str(report_path), "--no-progress",
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(report_path.read_text())
    assert [r["target"] for r in report["runs"]] == ["engine@pytorch", "engine@llmapi"]
    pytorch, llmapi = report["runs"]
    for run in report["runs"]:
        assert run["metrics"]["succeeded"] == 16 and run["metrics"]["failed"] == 0, run["metrics"]["first_errors"]
        assert len(run["rounds"]) == 2
    # token ids streamed by both engines, to the requested lengths
    assert llmapi["metrics"]["output_tokens_total"] == pytorch["metrics"]["output_tokens_total"] == 16 * 24
    (comparison,) = report["comparisons"]
    assert (comparison["direct"], comparison["full"]) == ("engine@pytorch", "engine@llmapi")
    assert comparison["cpu_ratios"]["total"] > 0 and comparison["cpu_ratios"]["triton_and_stubs"] > 0, (
        comparison["cpu_ratios"], report["warnings"], [run["server_cpu"] for run in report["runs"]])
    assert "engine@llmapi / engine@pytorch" in out


def test_bench_with_llm_puts_the_llm_api_driven_directly_beside_the_engine_model_and_http(tmp_path, monkeypatch, capsys):
    """--compare --with-llm on backend llmapi: the LLM API driven directly in one process (its own LLM, the
    double's executor in a worker process) beside our llmapi Triton model and HTTP through the direct front, on
    the same requests; the report's ratio is http / llm and the other pairs are listed beside it."""
    repo_root = __import__("pathlib").Path(__file__).resolve().parents[2]
    monkeypatch.setenv("TRTLLM_RUNTIME__BACKEND", "llmapi")
    monkeypatch.setenv("TRTLLM_RUNTIME__PYTORCH__SYNTHETIC__STEP_TIME_MS", "0")
    monkeypatch.setenv("TRTLLM_RUNTIME__LLMAPI__INSTANCE_COUNT", "2")
    report_path = tmp_path / "with_llm.json"
    code = main([
        "bench", str(repo_root), "--compare", "--with-llm", "--front", "direct",
        "--concurrency", "4", "--num-requests", "8", "--warmup", "2",
        "--input-mean", "16", "--output-mean", "24", "--json", str(report_path), "--no-progress",
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(report_path.read_text())
    assert [r["target"] for r in report["runs"]] == ["llm", "engine", "http"]
    for run in report["runs"]:
        assert run["metrics"]["succeeded"] == 8 and run["metrics"]["failed"] == 0, run["metrics"]["first_errors"]
        assert run["metrics"]["output_tokens_total"] == 8 * 24
    llm = report["runs"][0]
    assert set(llm["server_cpu"]) >= {"serving_path", "truss_process"}  # read from the LLM's own process tree
    assert [(c["direct"], c["full"]) for c in report["comparisons"]] == [("llm", "http"), ("llm", "engine"), ("engine", "http")]
    assert report["ratio"] == report["comparisons"][0]["ratio"]
