"""A schema over the guide bound reduced to the part nearest its root (guides.oversized), best effort."""

from __future__ import annotations

import json

import pytest
from trtllm_truss.guides.guide import GuideError, schema_text
from trtllm_truss.guides.oversized import reduce_to_fit


def _filler(size: int) -> dict:
    return {"type": "string", "description": "x" * size}


def test_the_nearest_definitions_are_kept_and_a_reference_to_one_left_out_allows_any_value():
    schema = {
        "type": "object",
        "properties": {"near": {"$ref": "#/definitions/Near"}, "far": {"$ref": "#/definitions/Far"}},
        "definitions": {
            "Near": {"type": "object", "properties": {"next": {"$ref": "#/definitions/Next"}}},
            "Next": _filler(3000),  # two references away: does not fit after Far
            "Far": _filler(1000),
            "Unused": {"type": "integer"},
        },
    }
    reduced, notes = reduce_to_fit(schema, budget=1600)
    assert set(reduced["definitions"]) == {"Near", "Far"}
    assert reduced["definitions"]["Near"]["properties"]["next"] == {}
    assert reduced["properties"] == schema["properties"]
    assert notes == [".: $ref (to 2 of 4 definitions, left out: the schema is over the guide bound, a reference to one allows any value)"]
    assert len(schema_text(reduced)) <= 1600
    assert schema["definitions"]["Near"]["properties"]["next"] == {"$ref": "#/definitions/Next"}  # the input is not changed


def test_an_anyof_of_references_is_kept_whole_or_left_out_whole():
    """One branch left out makes an anyOf constrain nothing, so its other branches are not kept for it."""
    many = {f"R{i}": _filler(200) for i in range(20)}
    schema = {
        "$defs": {**many, "Small": {"type": "boolean"}, "Huge": _filler(5000)},
        "type": "object",
        "properties": {
            "one_of_many": {"anyOf": [{"$ref": f"#/$defs/R{i}"} for i in range(20)]},
            "flag": {"$ref": "#/$defs/Small"},
            "all": {"allOf": [{"$ref": "#/$defs/Huge"}, {"type": "string"}]},
        },
    }
    reduced, notes = reduce_to_fit(schema, budget=1500)
    assert reduced["$defs"] == {"Small": {"type": "boolean"}}
    assert reduced["properties"]["one_of_many"] == {}
    assert reduced["properties"]["all"] == {"allOf": [{"type": "string"}]}  # an allOf only loses the branch
    assert ".properties.one_of_many: anyOf (a branch refers to a definition left out)" in notes


def test_escaped_and_percent_encoded_definition_names_are_followed():
    schema = {
        "properties": {"a": {"$ref": "#/definitions/a~1b"}, "b": {"$ref": "#/definitions/AWS%3A%3AS3"}},
        "definitions": {"a/b": {"type": "integer"}, "AWS::S3": {"type": "string"}, "Big": _filler(5000)},
    }
    reduced, _ = reduce_to_fit(schema, budget=400)
    assert set(reduced["definitions"]) == {"a/b", "AWS::S3"}


def test_a_root_over_the_budget_alone_is_refused():
    with pytest.raises(GuideError, match="root alone"):
        reduce_to_fit({"properties": {"a": _filler(5000)}}, budget=1000)


def test_cloudformation_shaped_input_keeps_what_its_root_reaches_outside_the_anyof():
    """A root reaching a thousand large definitions through one anyOf (CloudFormation's `Resources`) and a
    small one directly (its `Parameters`)."""
    resources = {f"AWS::Service{i}::Resource": {"type": "object", "properties": {"Properties": _filler(1000)}} for i in range(1000)}
    schema = {
        "type": "object",
        "properties": {
            "Parameters": {"patternProperties": {"^[a-zA-Z0-9]+$": {"$ref": "#/definitions/Parameter"}}},
            "Resources": {"patternProperties": {"^[a-zA-Z0-9]+$": {"anyOf": [{"$ref": f"#/definitions/{name}"} for name in resources]}}},
        },
        "definitions": {**resources, "Parameter": {"type": "object", "properties": {"Type": {"type": "string"}}}},
    }
    assert len(json.dumps(schema)) > 1 << 20
    reduced, notes = reduce_to_fit(schema)
    assert list(reduced["definitions"]) == ["Parameter"]
    assert reduced["properties"]["Resources"] == {"patternProperties": {"^[a-zA-Z0-9]+$": {}}}
    assert notes[0].startswith(".: $ref (to 1000 of 1001 definitions")
