"""`structural_tag` guides (xgrammar's format, as TensorRT-LLM, vLLM and SGLang take it) turned into an
llguidance grammar: free text whose tagged segments must hold their schema's JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trtllm_truss.guides.guide import (
    GuideError,
    check_guide,
    compile_matcher,
    load_guide_tokenizer,
)

EMBEDDED = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
GUIDE = json.dumps(
    {
        "structures": [
            {"begin": "<function=get_weather>", "schema": WEATHER, "end": "</function>"},
            {"begin": "<function=get_time>", "schema": {"type": "object", "properties": {}}, "end": "</function>"},
        ],
        "triggers": ["<function="],
    }
)


@pytest.fixture(scope="module")
def tokenizer():
    return load_guide_tokenizer(EMBEDDED)


@pytest.mark.parametrize(
    "text, allowed",
    [
        ("plain text, no call", True),
        ('Checking. <function=get_weather>{"city":"Paris"}</function> then more text', True),
        ("<function=get_time>{}</function>", True),
        ('<function=get_weather>{"town":"Paris"}</function>', False),  # the schema's required key missing
        ('<function=get_weather>{"city":"Paris"} </function>', False),  # compact JSON, as for json_schema
        ("<function=unknown>{}</function>", False),  # after a trigger only a declared begin may follow
    ],
)
def test_text_and_tagged_segments(tokenizer, text: str, allowed: bool):
    matcher = compile_matcher("structural_tag", GUIDE, tokenizer)
    ids = tokenizer.tokenize_str(text)
    assert (matcher.try_consume_tokens(ids) == len(ids)) is allowed


@pytest.mark.parametrize(
    "guide, message",
    [
        ("{", "structural_tag: not JSON"),
        ("[]", "structural_tag.structures: a non-empty list"),
        ('{"structures": [{"begin": "<f=a>", "schema": {}, "end": ""}]}', "structural_tag.triggers"),
        ('{"structures": [{"begin": "x", "schema": {}, "end": ""}], "triggers": ["<f"]}', r"structures\[0\].begin: 'x'"),
        ('{"structures": [{"begin": "<f", "schema": 3, "end": ""}], "triggers": ["<f"]}', r"structures\[0\].schema"),
        ('{"structures": [{"begin": "<f", "schema": {"not": {}}, "end": ""}], "triggers": ["<f"]}', '"not"'),
    ],
)
def test_malformed_structural_tags_are_refused_naming_the_field(guide: str, message: str):
    with pytest.raises(GuideError, match=message):
        check_guide("structural_tag", guide)
