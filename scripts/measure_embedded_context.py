"""What a longer context costs the embedded default on the CPU stand-in: per prompt length, the prefill
time of one prompt alone, one decode step at that length (batch of 1), the KV cache it holds, and the
process's peak RSS (cumulative: the largest prompt so far). Best of `--rounds`; docs/performance.md
("The embedded default's context") records a run.

    PYTHONPATH=packages .venv/bin/python scripts/measure_embedded_context.py --threads 1
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch

from trtllm_truss.engine_standin.model_runner import CausalLMRunner

MODEL_DIR = Path(__file__).resolve().parents[1] / "data" / "embedded-llama"
DECODE_STEPS = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the served stand-in runs with 1 in the tests)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1536, 2048, 4096])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runner = CausalLMRunner(MODEL_DIR)
    config = runner.model.config
    kv_bytes_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4  # K and V, float32
    report: dict = {"threads": args.threads, "kv_bytes_per_token": kv_bytes_per_token,
                    "max_position_embeddings": config.max_position_embeddings}
    runner.prefill(list(range(5, 69)))  # warm-up
    for length in args.lengths:
        ids = [(i * 7) % 4000 + 5 for i in range(length)]
        prefill_s, step_s = float("inf"), float("inf")
        for _ in range(args.rounds):
            start = time.perf_counter()
            _, cache, _ = runner.prefill(ids)
            prefill_s = min(prefill_s, time.perf_counter() - start)
            start = time.perf_counter()
            for k in range(DECODE_STEPS):
                runner.decode(cache, [5], [length + k], [0])
            step_s = min(step_s, (time.perf_counter() - start) / DECODE_STEPS)
        report[length] = {
            "prefill_s": round(prefill_s, 3),
            "decode_step_ms": round(step_s * 1000, 2),
            "kv_cache_mib": round(length * kv_bytes_per_token / 2**20, 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        }
        print(length, report[length], flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
