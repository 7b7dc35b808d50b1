"""TEST DOUBLE of TensorRT-LLM 1.x's engine-build API: accepts exactly the names recorded in
tests/data/trtllm_flags/1.2.0/llm_api.json (read from NVIDIA's sources) and nothing else."""

import json
from pathlib import Path

NAMES = json.loads((Path(__file__).resolve().parents[3] / "data" / "trtllm_flags" / "1.2.0" / "llm_api.json").read_text())


def check(kind: str, given, allowed_key: str) -> None:
    unknown = set(given) - set(NAMES[allowed_key])
    if unknown:
        raise TypeError(f"{kind}: unexpected argument(s) {sorted(unknown)}")
