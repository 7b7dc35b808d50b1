"""The guide checker over a corpus of schemas (tests/schemastore_corpus.py, tests/bfcl_corpus.py)."""

from __future__ import annotations

from trtllm_truss.guides.guide import GuideError, check_guide, schema_text


def check_each(items, engine: str) -> list[tuple[object, str | None]]:
    """[(item, None if accepted else the checker's reason)] for items with a `.schema`, each schema
    checked as sent (no best effort) by `engine` ("xgrammar" | "llguidance")."""
    results = []
    for item in items:
        try:
            check_guide("json_schema", schema_text(item.schema), engine)
            results.append((item, None))
        except GuideError as exc:
            results.append((item, str(exc)))
    return results
