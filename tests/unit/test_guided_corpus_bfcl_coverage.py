"""BFCL's real-world function schemas (tests/bfcl_corpus.py) through the guide checker: the share each
BFCL category has accepted (llguidance 1.9.1, each schema as sent), and every refusal names its cause.
Per engine and with best effort: tests/unit/test_guided_corpus_engines.py.

The counts are exact for the pinned bfcl-eval and llguidance, so a change of either shows here and in
docs/api.md ("Structured output: corpus coverage").
"""

from __future__ import annotations

import pytest
from bfcl_corpus import available, categories, load_corpus
from corpus_check import check_each

pytestmark = pytest.mark.skipif(not available(), reason="bfcl-eval==2026.3.23 (requirements/corpus.txt) is not installed")

# (accepted, schemas) per BFCL category.
EXPECTED_COVERAGE = {
    "irrelevance": (239, 239),
    "live_irrelevance": (916, 917),
    "live_multiple": (654, 654),
    "live_parallel": (14, 14),
    "live_parallel_multiple": (38, 38),
    "live_relevance": (4, 5),
    "live_simple": (117, 118),
    "multiple": (480, 480),
    "parallel": (153, 153),
    "parallel_multiple": (270, 270),
    "simple_java": (100, 100),
    "simple_javascript": (50, 50),
    "simple_python": (220, 220),
}


@pytest.fixture(scope="module")
def checked():
    return check_each(load_corpus(), "llguidance")


def _unsatisfiable(property_schema: dict) -> bool:
    """An `enum` none of whose values is valid against the property's own `type` (BFCL's refused
    functions list string values for an integer, or strings for an array): no value satisfies it."""
    import jsonschema

    type_only = {"type": property_schema["type"]}
    return bool(property_schema.get("enum")) and not any(
        jsonschema.Draft7Validator(type_only).is_valid(value) for value in property_schema["enum"]
    )


def test_coverage_per_bfcl_category(checked):
    table = {
        category: (
            sum(1 for item, error in checked if item.category == category and error is None),
            sum(1 for item, _ in checked if item.category == category),
        )
        for category in categories([item for item, _ in checked])
    }
    assert table == EXPECTED_COVERAGE
    assert sum(total for _, total in table.values()) >= 200


def test_every_refusal_is_a_schema_no_value_satisfies_so_coverage_of_satisfiable_ones_is_total(checked):
    # Refusals name the required property no value can satisfy; each is checked here to be truly
    # unsatisfiable (not just unsupported), so every satisfiable schema of every category is accepted.
    refusals = [(item, error) for item, error in checked if error is not None]
    assert len(refusals) == 3
    for item, error in refusals:
        prefix = "Unsatisfiable schema: required property '"
        assert error.startswith(prefix), (item.url, error)
        name = error[len(prefix):].split("'", 1)[0]
        assert _unsatisfiable(item.schema["properties"][name]), (item.url, name)
    for category in EXPECTED_COVERAGE:
        satisfiable = [i for i, e in checked if i.category == category and e is None]
        refused = [i for i, e in refusals if i.category == category]
        accepted, total = EXPECTED_COVERAGE[category]
        assert len(satisfiable) == accepted and accepted + len(refused) == total
