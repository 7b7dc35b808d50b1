"""Where the environment has no llguidance 1.x (NVIDIA's images from TensorRT-LLM 0.19 carry
TensorRT-LLM's own older release, which our examples for them do not replace), the request path still
imports and checks what it can without it: the guide's type and size; the engine judges the rest."""

from __future__ import annotations

import sys

import pytest
from trtllm_truss.guides import guide


@pytest.fixture
def no_llguidance(monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance raises ImportError
    guide.compiler.cache_clear()
    yield
    guide.compiler.cache_clear()


def test_only_type_and_size_are_checked_and_the_engine_judges_the_rest(no_llguidance):
    assert guide.compiler() is None
    assert guide.check_guide("json_schema", '{"type": "object", "if": {}}') is None
    with pytest.raises(guide.GuideError, match="unknown guide type 'xml'"):
        guide.check_guide("xml", "<a/>")
    with pytest.raises(guide.GuideError, match="more than"):
        guide.check_guide("regex", "a" * (guide.MAX_GUIDE_BYTES + 1))


def test_the_stand_in_s_compiler_says_what_is_missing(no_llguidance, tmp_path):
    with pytest.raises(guide.GuideError, match="needs llguidance 1.x"):
        guide.load_guide_tokenizer(tmp_path)


def test_with_the_pinned_release_unsupported_keywords_are_named():
    guide.compiler.cache_clear()
    assert guide.compiler() is not None
    with pytest.raises(guide.GuideError, match='Unimplemented keys: \\["if"\\]'):
        guide.check_guide("json_schema", '{"type": "object", "if": {}}', "llguidance")
