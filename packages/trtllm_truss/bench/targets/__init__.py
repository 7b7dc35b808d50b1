"""Benchmark targets: the engine model, the ensemble (both Triton gRPC), truss's HTTP endpoint, the LLM
API driven directly in one process (llm), and an OpenAI-compatible server's completions with token ids (openai)."""

from trtllm_truss.bench.targets.base import BenchTarget, IgnoreEos, StreamChunk, TargetError, TargetName

__all__ = ["BenchTarget", "IgnoreEos", "StreamChunk", "TargetError", "TargetName", "make_target"]


def make_target(
    name: TargetName, url: str, ignore_eos: IgnoreEos = "min_length", timeout_s: float = 600.0,
    guides: list[str] | None = None, *, truss_dir=None, environ=None,
):
    if name == "llm":
        from trtllm_truss.bench.targets.llm import LlmTarget

        if truss_dir is None:
            raise ValueError("target llm: needs the truss directory (its plan says what LLM runs)")
        return LlmTarget(truss_dir, ignore_eos, timeout_s, environ)
    if name in ("engine", "engine_guided"):
        from trtllm_truss.bench.targets.engine import EngineTarget

        if name == "engine_guided" and not guides:
            raise ValueError("target engine_guided: needs the schemas (--guide-schema)")
        return EngineTarget(url, ignore_eos, guides=guides if name == "engine_guided" else None)
    if name == "ensemble":
        from trtllm_truss.bench.targets.ensemble import EnsembleTarget

        return EnsembleTarget(url, ignore_eos)
    if name == "openai":
        from trtllm_truss.bench.targets.openai import OpenAiTarget

        return OpenAiTarget(url, ignore_eos, timeout_s)
    if name == "http":
        from trtllm_truss.bench.targets.http import HttpTarget

        return HttpTarget(url, ignore_eos, timeout_s)
    raise ValueError(f"target: expected one of engine, engine_guided, ensemble, http, llm, openai; got {name!r}")
