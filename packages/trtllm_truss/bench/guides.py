"""The structured-output workload of `trtllm-truss bench --guide-schema FILE`: JSON Schemas given to
the engine as NVIDIA's `guided_decoding_guide_type: json_schema`, and what the guides cost to compile.

The file holds one schema (a JSON object) or one schema per line (JSONL); request i uses schema
i mod n. Compile times are measured in the bench process with the engine's own compiler
(`trtllm_truss.guides.guide.compile_matcher`, llguidance over the deployment's tokenizer), one compile per
distinct schema; the engine's cache hit rate comes from the stand-in's counters on Triton's /metrics.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from trtllm_truss.guides.guide import (
    GuideError,
    compile_matcher,
    load_guide_tokenizer,
    schema_text,
)

HIT_METRIC = "trtllm_standin_guide_cache_hits_total"
MISS_METRIC = "trtllm_standin_guide_cache_misses_total"


def read_schemas(path: Path) -> list[str]:
    """The schemas of `path` as guide texts; raises ValueError naming the line."""
    text = path.read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict):
        return [schema_text(whole)]
    schemas = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            schema = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"--guide-schema: {path}:{number}: not JSON ({exc})") from None
        if not isinstance(schema, dict):
            raise ValueError(f"--guide-schema: {path}:{number}: a schema must be a JSON object")  # noqa: TRY004 - bad file content
        schemas.append(schema_text(schema))
    if not schemas:
        raise ValueError(f"--guide-schema: {path} holds no schema")
    return schemas


def compile_times(schemas: list[str], tokenizer_dir: Path) -> dict:
    """Seconds per distinct schema (p50 / p99 / max), and the schemas the compiler refuses."""
    tokenizer = load_guide_tokenizer(tokenizer_dir)
    seconds, refused = [], []
    for guide in dict.fromkeys(schemas):
        start = time.perf_counter()
        try:
            compile_matcher("json_schema", guide, tokenizer)
        except GuideError as exc:
            refused.append(str(exc).splitlines()[0])
            continue
        seconds.append(time.perf_counter() - start)
    seconds.sort()

    def percentile(q: float) -> float | None:
        return None if not seconds else seconds[min(len(seconds) - 1, int(q * len(seconds)))]

    return {
        "distinct_schemas": len(dict.fromkeys(schemas)),
        "compiled": len(seconds),
        "refused": refused[:5],
        "compile_ms_p50": None if not seconds else 1000 * percentile(0.50),
        "compile_ms_p99": None if not seconds else 1000 * percentile(0.99),
        "compile_ms_max": None if not seconds else 1000 * seconds[-1],
    }


def cache_counters(metrics_url: str | None) -> tuple[float, float] | None:
    """(hits, misses) of the stand-in's guide cache, summed over instances; None without them."""
    if not metrics_url:
        return None
    try:
        text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    except OSError:
        return None
    totals = {HIT_METRIC: 0.0, MISS_METRIC: 0.0}
    seen = False
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
            seen = True
    return (totals[HIT_METRIC], totals[MISS_METRIC]) if seen else None
