"""summary.json of the load sweep (sweep.sh): per trace rate, KV routing and round robin side by side."""

import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

folder = Path(sys.argv[1])
runs: dict[tuple[str, float], list[dict]] = defaultdict(list)
for path in sorted(folder.glob("*-scale-*-run*.json")):
    mode, _, rest = path.stem.partition("-scale-")
    scale = float(rest.partition("-run")[0])
    report = json.loads(path.read_text())
    metrics, reuse = report["metrics"], report["reuse"]
    runs[(mode, scale)].append({
        "file": path.name,
        "ttft_p50_ms": round(metrics["ttft_ms"]["p50"], 1),
        "ttft_p90_ms": round(metrics["ttft_ms"]["p90"], 1),
        "output_tokens_per_s": round(metrics["output_tokens_per_s"], 1),
        "requests_per_s": round(metrics["requests_per_s"], 2),
        "succeeded": metrics["succeeded"],
        "cached_over_bound": round(reuse["cached_over_bound"], 4),
    })

rows = []
for scale in sorted({scale for _, scale in runs}, reverse=True):
    kv, rr = runs.get(("kv", scale), []), runs.get(("round-robin", scale), [])
    if not kv or not rr:
        continue
    row = {"trace_time_scale": scale, "offered_rate_x_trace": round(1 / scale, 1)}
    for name, group in (("kv", kv), ("round_robin", rr)):
        row[name] = {
            "runs": len(group),
            "ttft_p50_ms_mean": round(statistics.mean(r["ttft_p50_ms"] for r in group), 1),
            "output_tokens_per_s_mean": round(statistics.mean(r["output_tokens_per_s"] for r in group), 1),
            "cached_over_bound_mean": round(statistics.mean(r["cached_over_bound"] for r in group), 3),
            "succeeded": [r["succeeded"] for r in group],  # of 600 each; the rest refused (429: the front's bound)
            "per_run": group,
        }
    row["ttft_p50_kv_over_round_robin"] = round(row["kv"]["ttft_p50_ms_mean"] / row["round_robin"]["ttft_p50_ms_mean"], 3)
    row["tokens_per_s_kv_over_round_robin"] = round(
        row["kv"]["output_tokens_per_s_mean"] / row["round_robin"]["output_tokens_per_s_mean"], 3)
    rows.append(row)

summary = {
    "what": "2 replicas of our fleet (embedded default, synthetic engine: prefill per uncached prompt token and step"
            " time as in settings, blocks of 16, 4,096 blocks a replica), Dynamo 1.6.1's KV router at its defaults"
            " against its round robin, on the study's smoke slice (the trace's first 600 requests, outputs cut to 32"
            " tokens) at several trace rates; each rate's runs interleaved kv / round robin.",
    "settings": {"prefill_time_per_token_ms": float(os.environ.get("PREFILL_MS", "0.2")),
                 "step_time_ms": float(os.environ.get("STEP_MS", "10"))},
    "per_rate": rows,
}
(folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
for row in rows:
    print(f"x{row['offered_rate_x_trace']:>5}: TTFT p50 kv {row['kv']['ttft_p50_ms_mean']:7.1f} ms, rr"
          f" {row['round_robin']['ttft_p50_ms_mean']:7.1f} ms, ratio {row['ttft_p50_kv_over_round_robin']:.2f};"
          f" tokens/s ratio {row['tokens_per_s_kv_over_round_robin']:.3f}; cached/bound kv"
          f" {row['kv']['cached_over_bound_mean']:.3f} rr {row['round_robin']['cached_over_bound_mean']:.3f};"
          f" succeeded kv {row['kv']['succeeded']} rr {row['round_robin']['succeeded']}")
