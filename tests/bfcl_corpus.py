"""Real-world function-calling schemas no one here wrote: the function definitions of the Berkeley
Function Calling Leaderboard (BFCL v4), as the pinned PyPI package `bfcl-eval==2026.3.23` ships them
(`bfcl_eval/data/BFCL_v4_<category>.json`, one JSON object a line, each with its `function` list).
The "live" categories are functions users contributed from their own applications.

BFCL writes parameter types in its own (Gorilla) vocabulary ("dict", "float", "tuple", ...); its
harness maps them to OpenAPI types with `bfcl_eval.constants.type_mappings.GORILLA_TO_OPENAPI` before
it sends them to an OpenAI-compatible server (`_cast_to_openai_type` in bfcl_eval/model_handler/
utils.py, which imports the harness's parsers and so is not importable without its dependencies). The
same mapping is applied here, over the same table, so each schema is what BFCL itself sends as a
tool's `parameters`. Identical function definitions are counted once.

The package is installed without its dependencies (the harness's model clients are not needed to read
data files): scripts/bootstrap.sh installs requirements/corpus.txt with --no-deps.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CorpusSchema:
    url: str  # BFCL's entry id and the function's name
    schema: dict
    category: str  # BFCL's test category


def available() -> bool:
    return importlib.util.find_spec("bfcl_eval") is not None


def _data_dir() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "data"


def _openapi_types(properties: dict, mapping: dict) -> dict:
    """BFCL's `_cast_to_openai_type`: Gorilla types to OpenAPI ones, one level of nested properties or
    items (and items of items) deep, as BFCL maps them; a missing or unknown type is a string."""
    for value in properties.values():
        gorilla = value.get("type")
        if gorilla == "float":
            value["format"] = "float"
        value["type"] = mapping.get(gorilla, "string") if gorilla is not None else "string"
        if value["type"] in ("array", "object"):
            if "properties" in value:
                _openapi_types(value["properties"], mapping)
            elif "items" in value:
                items = value["items"]
                items["type"] = mapping[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    _openapi_types(items["properties"], mapping)
    return properties


def load_corpus() -> list[CorpusSchema]:
    """Every distinct function's parameters schema, by category, in file and line order."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    seen: set[str] = set()
    corpus = []
    for path in sorted(_data_dir().glob("BFCL_v4_*.json")):
        category = path.stem.removeprefix("BFCL_v4_")
        for line in path.read_text().splitlines():
            if not line.startswith("{\""):
                continue  # BFCL_v4_format_sensitivity.json is one indented object, not test entries
            entry = json.loads(line)
            for function in entry.get("function") or []:
                key = json.dumps(function, sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
                schema = copy.deepcopy(function["parameters"])
                schema["type"] = "object"
                schema["properties"] = _openapi_types(schema.get("properties", {}), GORILLA_TO_OPENAPI)
                corpus.append(CorpusSchema(f"{entry['id']}:{function['name']}", schema, category))
    return corpus


def categories(corpus: list[CorpusSchema]) -> list[str]:
    return sorted({item.category for item in corpus})
