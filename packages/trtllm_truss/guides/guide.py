"""Guided decoding guides in NVIDIA's terms, checked with the grammar engine that will enforce them.

One vocabulary on every path: a guide is NVIDIA's `guided_decoding_guide_type` (tensorrtllm_backend
v0.19.0 `tensorrt_llm` input; `GuidedDecodingParams.GuideType` in the executor) with its
`guided_decoding_guide` text. The API dialects turn their own fields (`response_format`,
`tool_choice`, vLLM's and trtllm-serve's extensions) into one; the engine compiles it with the
grammar engine `runtime.guided_decoding_backend` names (`guides.engines.guide_engine`): xgrammar
(`guides.xgrammar_guide`) or llguidance (here), each called as TensorRT-LLM calls it
(`_torch/pyexecutor/grammar_matcher.py`, v1.0-v1.2), so a guide is refused on the CPU exactly when
the GPU engine would refuse it, with the engine's own reason.

llguidance as TensorRT-LLM's `LLGuidanceMatcherFactory` calls it: "json" -> the schema
`{"type": "object"}`, "json_schema" -> `grammar_from_json_schema(guide)` with llguidance's defaults
(flexible whitespace, no `lenient`, no `coerce_one_of`: unimplemented keywords are refused),
"regex" -> `grammar_from_regex`, "ebnf_grammar" -> `grammar_from_lark` (Lark, not GBNF), and no
"structural_tag" ("Unsupported guide type"). Only llguidance's 1.x releases are used (the pin):
NVIDIA's images carry TensorRT-LLM's own, older llguidance (1.0 pins 0.7.29); where no 1.x is
installed (and for xgrammar where it is missing: it needs torch) `check_guide` checks only a guide's
size and type and the engine is the judge of the rest (its refusal reaches the client as a 400).
"""

from __future__ import annotations

import functools
import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import llguidance

# NVIDIA's guide types: "json" is a JSON object (OpenAI's json_object; no guide text), "json_schema" a JSON Schema's
# text, "regex" a regular expression, "ebnf_grammar" an EBNF (GBNF) grammar, "structural_tag"
# xgrammar's structural tag JSON (TensorRT-LLM's executor has it; tensorrtllm_backend v0.19.0 does not).
GUIDE_TYPES: tuple[str, ...] = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")


XGRAMMAR, LLGUIDANCE = "xgrammar", "llguidance"
# Whitespace between JSON tokens (runtime.pytorch.guided_whitespace, the stand-in's only): "flexible" is
# TensorRT-LLM's (any amount, no limit); "compact" allows none, the engine's own option for it (xgrammar
# any_whitespace=False with separators "," ":", llguidance whitespace_flexible: false), because a tiny
# model loops on blanks (and, after ": ", on an integer's digits).
WHITESPACE_FLEXIBLE, WHITESPACE_COMPACT = "flexible", "compact"
_COMPACT_JSON = {"whitespace_flexible": False}  # llguidance's JSON options (x-guidance) for compact
# JSON Schema keywords that constrain nothing: accepted in both modes, and a schema of only these allows any value.
ANNOTATIONS = frozenset(
    {
        "$schema", "$id", "id", "$anchor", "$comment", "title", "description", "default", "examples",
        "readOnly", "writeOnly", "deprecated", "contentEncoding", "contentMediaType", "markdownDescription",
    }
)
# Guide text above this is refused before anything compiles it (a bound on work per request).
MAX_GUIDE_BYTES = 1 << 20


class GuideError(ValueError):
    """The guide cannot be enforced: the message says why (the keyword, the position, the limit)."""


@functools.lru_cache(maxsize=1)
def compiler() -> ModuleType | None:
    """llguidance where this environment has a 1.x release, else None (see the module docstring)."""
    try:
        module = importlib.import_module("llguidance")
        from importlib.metadata import version

        major = int(version("llguidance").split(".")[0])
    except (ImportError, ValueError):
        return None
    return module if major >= 1 else None


def _llguidance() -> ModuleType:
    module = compiler()
    if module is None:
        raise GuideError("guided decoding on this engine path needs llguidance 1.x, which this environment lacks")
    return module


def grammar_of(guide_type: str, guide: str | None, whitespace: str = WHITESPACE_FLEXIBLE) -> str:
    """The llguidance grammar of a guide, as TensorRT-LLM's llguidance matcher builds it (`whitespace`
    compact: JSON without free whitespace, the stand-in's option); raises GuideError for an unknown type
    or malformed text (a grammar that parses here may still fail to compile: `check_guide` compiles it)."""
    if guide_type not in GUIDE_TYPES:
        raise GuideError(f"unknown guide type {guide_type!r}; one of {', '.join(GUIDE_TYPES)}")
    llguidance = _llguidance()
    json_options = _COMPACT_JSON if whitespace == WHITESPACE_COMPACT else None
    if guide_type == "json":
        return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=json_options)
    if not guide:
        raise GuideError(f"guide type {guide_type!r} needs a guide")
    if len(guide) > MAX_GUIDE_BYTES // 4 and len(guide.encode("utf-8")) > MAX_GUIDE_BYTES:
        raise GuideError(f"the guide has more than {MAX_GUIDE_BYTES} bytes")
    try:
        if guide_type == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(guide, defaults=json_options)
        if guide_type == "regex":
            return llguidance.LLMatcher.grammar_from_regex(guide)
        if guide_type == "ebnf_grammar":
            return llguidance.LLMatcher.grammar_from_lark(guide)
    except ValueError as exc:
        raise GuideError(str(exc)) from None
    raise GuideError(f"Unsupported guide type: {guide_type} (TensorRT-LLM's llguidance matcher takes json, json_schema, regex, ebnf_grammar)")


class NotASchema(GuideError):
    """The schema is not a JSON Schema: jsonschema's message and `where` (a "/"-joined path, "" for the root)."""

    def __init__(self, message: str, where: str) -> None:
        self.where = where
        super().__init__(message)


def check_meta_schema(schema: object) -> None:
    """Raise NotASchema unless `schema` is a JSON Schema: checked against the meta-schema of the draft
    its `$schema` names (2020-12 by default, jsonschema's). Formats are not checked: a `pattern` is an
    ECMA-262 regex (`(?<name>...)`), which Python's `re` refuses; the grammar engine judges it."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema, format_checker=None)
    except jsonschema.SchemaError as exc:
        raise NotASchema(exc.message, "/".join(str(p) for p in exc.absolute_path)) from None


def check_guide(guide_type: str, guide: str | None, engine: str = XGRAMMAR) -> str | None:
    """Check the guide without a tokenizer, with `engine` ("xgrammar" | "llguidance") and the options
    TensorRT-LLM uses; raises GuideError with the engine's message (which names what it refuses).
    Returns llguidance's grammar (None for xgrammar, and where the engine is not installed: then only
    the type and size are checked, the engine checks the rest)."""
    if guide_type not in GUIDE_TYPES:
        raise GuideError(f"unknown guide type {guide_type!r}; one of {', '.join(GUIDE_TYPES)}")
    if guide is not None and len(guide) > MAX_GUIDE_BYTES // 4 and len(guide.encode("utf-8")) > MAX_GUIDE_BYTES:
        raise GuideError(f"the guide has more than {MAX_GUIDE_BYTES} bytes")
    if engine == XGRAMMAR:
        from trtllm_truss.guides import xgrammar_guide

        if xgrammar_guide.module() is None:
            return None
        if guide_type != "json" and not guide:
            raise GuideError(f"guide type {guide_type!r} needs a guide")
        try:
            xgrammar_guide.check(guide_type, guide)
        except ValueError as exc:
            raise GuideError(str(exc)) from None
        return None
    if compiler() is None:
        return None
    grammar = grammar_of(guide_type, guide)
    error = _llguidance().LLMatcher.validate_grammar(grammar)
    if error:
        raise GuideError(error)
    return grammar


def schema_text(schema: object) -> str:
    """A schema object as guide text (compact, key order kept)."""
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def load_guide_tokenizer(tokenizer_dir: Path | str) -> llguidance.LLTokenizer:
    """The model's tokenizer as llguidance needs it: transformers' fast tokenizer (it adds the tokens of
    tokenizer_config.json that tokenizer.json may lack), else tokenizer.json itself."""
    directory = Path(tokenizer_dir)
    llguidance = _llguidance()
    try:
        import llguidance.hf
        from transformers import AutoTokenizer

        return llguidance.hf.from_tokenizer(AutoTokenizer.from_pretrained(str(directory)))
    except Exception as exc:  # no transformers, or a slow (sentencepiece-only) tokenizer
        if (directory / "tokenizer.json").is_file():
            return llguidance.LLTokenizer(str(directory / "tokenizer.json"))
        raise GuideError(f"guided decoding needs the model's tokenizer (tokenizer.json in {directory.name}): {exc}") from exc


def compile_matcher(
    guide_type: str,
    guide: str | None,
    tokenizer: llguidance.LLTokenizer,
    limits: llguidance.LLParserLimits | None = None,
    whitespace: str = WHITESPACE_FLEXIBLE,
) -> llguidance.LLMatcher:
    """A matcher for the guide over the model's tokenizer, its first mask computed (a guide over the
    per-step limits there is refused now, not mid-generation); raises GuideError with the reason."""
    return matcher_of(grammar_of(guide_type, guide, whitespace), tokenizer, limits)


def matcher_of(grammar: str, tokenizer: llguidance.LLTokenizer, limits: llguidance.LLParserLimits | None = None) -> llguidance.LLMatcher:
    """`compile_matcher` from a grammar `grammar_of` made (whose length sizes the compiled matcher:
    `guides.verdict.llguidance_bytes`)."""
    matcher = _llguidance().LLMatcher(tokenizer, grammar, log_level=0, limits=limits)
    if not matcher.is_error():
        matcher.compute_bitmask()
    if matcher.is_error():
        raise GuideError(matcher.get_error())
    return matcher
