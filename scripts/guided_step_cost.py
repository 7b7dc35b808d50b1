"""What guided decoding adds to a decode step of the stand-in engine (no Triton, no client: the engine alone).

    .venv/bin/python scripts/guided_step_cost.py --schemas FILE.jsonl --requests 64 --batch 32 --engine xgrammar

Runs the same requests (bench-style prompts of `--input` tokens, `--output` tokens, greedy, min_length =
output) through the embedded model twice, unguided then guided (request i uses schema i mod n, JSONL one
schema per line), with every guide compiled beforehand so compiles stay out of the figures. Prints the
decode-step time (mean, p99) of each run and, guided, the time of one step's masking of all its guided
rows (the grammar engine's fill + apply, `TokenMasker.apply`).
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = REPO_ROOT / "data" / "embedded-llama"


def _percentiles(values: list[float]) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
    return f"mean {1000 * sum(values) / len(values):.2f} ms, p99 {1000 * p99:.2f} ms ({len(values)} samples)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemas", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--input", type=int, default=32)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--engine", choices=("xgrammar", "llguidance"), default="xgrammar", help="grammar engine")
    args = parser.parse_args()

    import torch

    from trtllm_truss.bench.guides import read_schemas
    from trtllm_truss.bench.tokenizer import BenchTokenizer
    from trtllm_truss.bench.workload import LengthDistribution, WorkloadSpec, generate_workload
    from trtllm_truss.engine_standin import EngineLimits, GenerationRequest, Guide, SamplingParams, StandinEngine
    from trtllm_truss.engine_standin.guidance import GuideCompiler, TokenMasker
    from trtllm_truss.engine_standin.model_runner import CausalLMRunner

    torch.set_num_threads(1)
    schemas = read_schemas(args.schemas)
    spec = WorkloadSpec(
        num_requests=args.requests, input_length=LengthDistribution(mean=args.input),
        output_length=LengthDistribution(mean=args.output),
    )
    workload = generate_workload(spec, BenchTokenizer.from_dir(MODEL_DIR))
    engine = StandinEngine(
        CausalLMRunner(MODEL_DIR), EngineLimits(args.batch, 4 * args.input, args.output),
        guides=GuideCompiler(MODEL_DIR, engine=args.engine),
    ).start()
    mask_s: list[float] = []
    apply = TokenMasker.apply

    def timed_apply(self, logits, rows):
        start = time.perf_counter()
        try:
            return apply(self, logits, rows)
        finally:
            mask_s.append(time.perf_counter() - start)

    TokenMasker.apply = timed_apply
    step_s: list[float] = []
    step = engine._step

    def timed_step() -> None:
        start = time.perf_counter()
        step()
        step_s.append(time.perf_counter() - start)

    engine._step = timed_step

    def run(guided: bool, prefix: str, max_new: int) -> tuple[float, int]:
        done = [threading.Event() for _ in workload]
        tokens = [0] * len(workload)
        begin = time.perf_counter()
        for request, event in zip(workload, done):
            def on_output(output, i=request.index, event=event):
                tokens[i] += len(output.token_ids)
                if output.finished:
                    event.set()

            guide = Guide("json_schema", schemas[request.index % len(schemas)]) if guided else None
            engine.submit(
                GenerationRequest(f"{prefix}{request.index}", list(request.input_ids), max_new, end_id=2,
                                  sampling=SamplingParams(min_length=max_new), guide=guide),
                on_output,
            )
        for event in done:
            assert event.wait(600), "a request did not finish"
        return time.perf_counter() - begin, sum(tokens)

    try:
        run(True, "warm", 1)  # compiles every guide: the runs below hit the cache
        for guided in (False, True):
            step_s.clear()
            mask_s.clear()
            wall, tokens = run(guided, "g" if guided else "u", args.output)
            name = "guided  " if guided else "unguided"
            print(f"{name}: {tokens} tokens in {wall:.2f} s; decode step {_percentiles(step_s)}")
            if guided:
                print(f"          masking one step's guided rows: {_percentiles(mask_s)}")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
