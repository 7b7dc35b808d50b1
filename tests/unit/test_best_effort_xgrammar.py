"""What xgrammar 0.2.8 ignores beside its combinators, and how `guides.best_effort` makes it enforced.

xgrammar converts a node by the first of `$ref`, `const`, `enum`, `anyOf`/`oneOf`, `allOf` it has and
ignores its other keywords (an `allOf` of two or more branches allows anything); it ignores length
beside `pattern`/`format`, `multipleOf` on non-integers, and a pattern's lookaround. Each case is
checked on xgrammar itself: the schema as sent is not enforced, the prepared guide is (or, where no
exact rewrite exists, strict refuses it naming place and keyword and best effort reports it).
"""

from __future__ import annotations

import json

import pytest
from trtllm_truss.guides.best_effort import KeywordRefused, prepare

pytestmark = pytest.mark.torch  # xgrammar imports torch

PROPERTIES = {"a": {"type": "string"}, "b": {"type": "integer"}}


def accepts(schema: dict | str, text: str) -> bool:
    """xgrammar's own verdict, with TensorRT-LLM's compact options (as the stand-in runs it)."""
    import xgrammar
    from xgrammar.testing import _is_grammar_accept_string

    source = schema if isinstance(schema, str) else json.dumps(schema)
    grammar = xgrammar.Grammar.from_json_schema(source, any_whitespace=False, separators=(",", ":"), strict_mode=True)
    return _is_grammar_accept_string(grammar, text)


@pytest.mark.parametrize("strict", [True, False])
def test_required_only_branches_beside_properties_are_merged_and_enforced(strict: bool):
    schema = {"type": "object", "properties": PROPERTIES, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
    assert accepts(schema, '"anything"')  # as sent, xgrammar enforces nothing of it
    prepared = prepare(schema, "xgrammar", strict=strict)
    assert prepared.unenforced == ()
    assert accepts(prepared.text, '{"a":"x"}') and accepts(prepared.text, '{"b":1}')
    assert not accepts(prepared.text, "{}") and not accepts(prepared.text, '"anything"')


def test_an_all_of_is_merged_into_one_schema():
    schema = {"allOf": [{"type": "object", "properties": PROPERTIES}, {"required": ["a"]}]}
    assert accepts(schema, "[]")
    prepared = prepare(schema, "xgrammar", strict=True)
    assert json.loads(prepared.text) == {"type": "object", "properties": PROPERTIES, "required": ["a"]}
    assert not accepts(prepared.text, "{}") and accepts(prepared.text, '{"a":"x"}')


def test_an_all_of_that_does_not_merge_is_refused_strict_and_left_out_best_effort():
    schema = {"type": "object", "properties": PROPERTIES, "allOf": [{"properties": {"a": {"maxLength": 2}}}, {"required": ["b"]}]}
    with pytest.raises(KeywordRefused, match=r"keyword 'allOf' cannot be enforced by xgrammar \(branches that do not merge"):
        prepare(schema, "xgrammar", strict=True)
    prepared = prepare(schema, "xgrammar", strict=False)
    assert prepared.unenforced == (".: allOf (branches that do not merge into one schema)",)
    assert not accepts(prepared.text, "[]") and accepts(prepared.text, '{"a":"xyz"}')  # the siblings hold


def test_an_enum_keeps_the_values_its_siblings_allow():
    prepared = prepare({"type": "integer", "enum": [1, "x"]}, "xgrammar", strict=True)
    assert json.loads(prepared.text) == {"enum": [1]}


def test_a_keyword_beside_a_ref_is_refused_strict_naming_its_place():
    schema = {"$defs": {"n": {"type": "integer"}}, "type": "object", "properties": {"n": {"$ref": "#/$defs/n", "minimum": 3}}}
    with pytest.raises(KeywordRefused, match=r"'minimum' cannot be enforced by xgrammar \(beside \$ref\)") as refused:
        prepare(schema, "xgrammar", strict=True)
    assert refused.value.place == ".properties.n"
    assert prepare(schema, "xgrammar", strict=False).unenforced == (".properties.n: minimum (beside $ref)",)


@pytest.mark.parametrize(
    ("schema", "reported", "kept"),
    [
        ({"type": "string", "pattern": "^a+$", "maxLength": 2}, ".: maxLength (beside pattern)", '"aaaa"'),
        ({"type": "number", "multipleOf": 0.5}, ".: multipleOf (enforced for integers only)", "0.3"),
        ({"type": "string", "pattern": "^(?!b)[a-z]+$"}, ".: pattern (its lookaround is not enforced)", '"bc"'),
    ],
)
def test_what_xgrammar_ignores_beside_other_keywords(schema: dict, reported: str, kept: str):
    assert accepts(schema, kept)  # ignored: xgrammar lets the invalid value through
    with pytest.raises(KeywordRefused):
        prepare(schema, "xgrammar", strict=True)
    assert reported in prepare(schema, "xgrammar", strict=False).unenforced


def test_an_array_that_says_nothing_of_items_stays_open():
    schema = {"type": "array", "minItems": 1}
    with pytest.raises(RuntimeError, match="minItems is greater than the number of prefixItems"):
        accepts(schema, "[1]")  # xgrammar's strict mode refuses it outright
    prepared = prepare(schema, "xgrammar", strict=True)
    assert accepts(prepared.text, '[1,"x"]') and not accepts(prepared.text, "[]")


def test_llguidance_gets_the_schema_as_it_is():
    schema = {"type": "object", "properties": PROPERTIES, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
    assert json.loads(prepare(schema, "llguidance", strict=True).text) == schema
