"""`structural_tag` guides as TensorRT-LLM enforces them: with xgrammar (`compile_structural_tag`, the
{"structures", "triggers"} form TensorRT-LLM, vLLM and SGLang send, or xgrammar's own {"format"}), free
text whose tagged segments must hold their schema's JSON; with llguidance, TensorRT-LLM has no structural
tags at all ("Unsupported guide type"), so every one is refused.

Changed on purpose (issue 32): structural tags used to be turned into an llguidance grammar of our own;
now the engine the deployment names judges them, and malformed ones are refused in that engine's words.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trtllm_truss.guides.guide import GuideError, check_guide

NEEDS_XGRAMMAR = pytest.mark.torch  # xgrammar imports torch

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
def guides():
    from trtllm_truss.guides.xgrammar_guide import XGrammarGuides

    return XGrammarGuides(str(EMBEDDED))


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(EMBEDDED))


@NEEDS_XGRAMMAR
@pytest.mark.parametrize(
    "text, allowed",
    [
        ("plain text, no call", True),
        ('Checking. <function=get_weather>{"city":"Paris"}</function> then more text', True),
        ("<function=get_time>{}</function>", True),
        ('<function=get_weather>{ "city": "Paris" }</function>', True),  # any whitespace inside the JSON
        ('<function=get_weather>{"town":"Paris"}</function>', False),  # the schema's required key missing
        ('<function=get_weather>{"city":"Paris","x":1}</function>', False),  # strict mode: no unlisted property
        ('<function=get_weather>{"city":"Paris"} </function>', False),  # nothing between the JSON and its end
        ("<function=unknown>{}</function>", False),  # after a trigger only a declared begin may follow
    ],
)
def test_text_and_tagged_segments_with_xgrammar(guides, tokenizer, text: str, allowed: bool):
    """The stand-in's matcher over the model's tokens, as the engine feeds it."""
    matcher = guides.compile("structural_tag", GUIDE)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert all(matcher.consume_token(t) for t in ids) is allowed
    assert matcher.is_error() is not allowed


@NEEDS_XGRAMMAR
@pytest.mark.parametrize(
    "guide, message",
    [
        ("[]", "Structural tag must be an object"),
        ('{"structures": [{"begin": "<f=a>", "schema": {}, "end": ""}]}', "Structural tag must have a format field"),
        ('{"structures": [{"begin": "x", "schema": {}, "end": ""}], "triggers": ["<f"]}', "does not match any trigger"),
        ('{"structures": [{"begin": "<f", "schema": 3, "end": ""}], "triggers": ["<f"]}', "validation error"),
        ('{"type": "structural_tag", "format": {"type": "nope"}}', "Format type not recognized: nope"),
    ],
)
def test_malformed_structural_tags_are_refused_in_xgrammars_words(guide: str, message: str):
    with pytest.raises(GuideError, match=message):
        check_guide("structural_tag", guide, "xgrammar")


@NEEDS_XGRAMMAR
def test_xgrammars_own_format_is_taken():
    check_guide("structural_tag", '{"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}', "xgrammar")


@pytest.mark.parametrize("guide", [GUIDE, '{"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}'])
def test_llguidance_has_no_structural_tags_on_tensorrt_llm(guide: str):
    with pytest.raises(GuideError, match="Unsupported guide type: structural_tag"):
        check_guide("structural_tag", guide, "llguidance")
